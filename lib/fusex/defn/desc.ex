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
    case :fusex.op_check(desc.name, specs, Map.new(attrs), device) do
      {:badarg, message} -> {:error, message}
      results when is_map(results) -> {:ok, results}
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
