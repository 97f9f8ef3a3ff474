defmodule Fusex.Defn.Desc do
  @moduledoc false
  # The op layer's descriptions (fusex:op_list/0, c_src/core/op.h) as
  # Fusex.Defn reads them, and its check (fusex:op_check/4): the results'
  # types and shapes of a call on tensor templates, or the message a run of
  # the op would raise. Needs no Nx: specs are {type, shape} pairs.

  @key {__MODULE__, :descriptions}

  @doc false
  # Every description, by name (:<op>_fwd => map), read once per VM.
  def all do
    case :persistent_term.get(@key, nil) do
      nil ->
        descs = Map.new(:fusex.op_list(), &{&1.name, &1})
        :persistent_term.put(@key, descs)
        descs

      descs ->
        descs
    end
  end

  @doc false
  # The description of `op`'s `direction` (:fwd, :bwd, :step), or nil.
  def find(op, direction), do: find(:"#{op}_#{direction}")
  def find(name) when is_atom(name), do: Map.get(all(), name)

  @doc false
  def fetch!(op, direction) do
    find(op, direction) ||
      raise ArgumentError, "op: expected an op fusex describes (fusex:op_list/0), got #{op}_#{direction}"
  end

  @doc false
  # A repeated group (a stacked RNN's layers, c_src/core/op.h): the
  # description with the group written out `repeats` times, one input and
  # result per slot (:"layers[1].w_hh"; a gradient :"dlayers[1].w_hh", "d"
  # + its input's slot), with `repeats` and each slot's {group, r, entry};
  # the description itself (repeats 1) where it has no group.
  def expand(desc, repeats) do
    case repeat_attr(desc) do
      nil ->
        Map.merge(desc, %{repeats: 1, slots: %{}})

      attr ->
        {inputs, in_slots} = slots(desc.inputs, attr.name, repeats)
        {results, out_slots} = slots(desc.results, attr.name, repeats)
        Map.merge(desc, %{inputs: inputs, results: results, repeats: repeats, slots: Map.merge(in_slots, out_slots)})
    end
  end

  @doc false
  # The description of a block's call: expanded by its repeat attribute.
  def for_attrs(desc, attrs) do
    case repeat_attr(desc) do
      nil -> expand(desc, 1)
      attr -> expand(desc, trunc(Keyword.get(attrs, attr.name, 1)))
    end
  end

  @doc false
  def repeat_attr(desc), do: Enum.find(desc.attrs, &(&1.role == :repeat))

  @doc false
  # The group's entries (the inputs given once per repetition).
  def group(desc), do: for(i <- desc.inputs, Map.get(i, :repeated, false), do: i.name)

  defp slots(entries, group, repeats) do
    {fixed, repeated} = Enum.split_with(entries, &(not Map.get(&1, :repeated, false)))

    expanded =
      for r <- 0..(repeats - 1)//1, e <- repeated do
        {slot, entry} =
          case {e.role, Atom.to_string(e.name)} do
            {:grad, "d" <> of} -> {:"d#{group}[#{r}].#{of}", e.name}
            {_, name} -> {:"#{group}[#{r}].#{name}", e.name}
          end

        {%{e | name: slot}, {slot, {group, r, entry}}}
      end

    {fixed ++ Enum.map(expanded, &elem(&1, 0)), Map.new(expanded, &elem(&1, 1))}
  end

  @doc false
  # The inputs present for the block attributes `attrs` (a keyword list)
  # and `count` operands: those always there, those whose flag is 1, and a
  # rule's (the selective scan's saved states) where the count says so.
  def operand_names(desc, attrs, count) do
    fixed =
      for input <- desc.inputs, input.presence != :rule, present?(input, attrs), do: input.name

    rules = Enum.filter(desc.inputs, &(&1.presence == :rule)) |> Enum.take(max(count - length(fixed), 0))

    for input <- desc.inputs, input.presence != :rule and input.name in fixed or input in rules, do: input.name
  end

  defp present?(%{presence: :always}, _attrs), do: true
  defp present?(%{presence: :flag, flag: flag}, attrs), do: Keyword.get(attrs, flag, 0) == 1

  @doc false
  # The op layer's check of a call of `desc` on `device` (default :cpu):
  # `specs` input name => {type, shape}, `attrs` [{name, number}].
  # {:ok, result name => {type, shape}} for the results present, or
  # {:error, message}.
  def check(desc, specs, attrs, device \\ :cpu) do
    case :fusex.op_check(desc.name, nest(desc, specs), Map.new(attrs), device) do
      {:badarg, message} -> {:error, message}
      results when is_map(results) -> {:ok, unnest(desc, results)}
    end
  end

  # Slots as fusex:op_check/4 takes a group: its name => [%{entry => spec}].
  defp nest(desc, specs) do
    slots = Map.get(desc, :slots, %{})

    Enum.reduce(specs, %{}, fn {name, spec}, acc ->
      case slots[name] do
        nil ->
          Map.put(acc, name, spec)

        {group, r, entry} ->
          list = Map.get(acc, group, [])
          list = list ++ List.duplicate(%{}, max(r + 1 - length(list), 0))
          Map.put(acc, group, List.update_at(list, r, &Map.put(&1, entry, spec)))
      end
    end)
  end

  # A group's results back to their slots.
  defp unnest(desc, results) do
    case repeat_attr(desc) do
      nil ->
        results

      attr ->
        {groups, rest} = Map.pop(results, attr.name, [])
        by_entry = Map.new(Map.get(desc, :slots, %{}), fn {slot, key} -> {key, slot} end)

        for {entries, r} <- Enum.with_index(groups), {entry, spec} <- entries, into: rest,
            do: {Map.fetch!(by_entry, {attr.name, r, entry}), spec}
    end
  end

  @doc false
  def check!(desc, specs, attrs) do
    case check(desc, specs, attrs) do
      {:ok, results} -> results
      {:error, message} -> raise ArgumentError, message
    end
  end
end
