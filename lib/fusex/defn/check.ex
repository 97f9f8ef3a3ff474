defmodule Fusex.Defn.Check do
  @moduledoc false
  # What Fusex.Defn parses itself before it asks the op layer
  # (Fusex.Defn.Desc.check/4, fusex:op_check/4) about shapes and types:
  # its arguments' forms (tensors, the map of optional tensors, the options)
  # and the options' values, in the Erlang API's words for the same
  # values (the NIF parses them there, on real tensors).
  #
  # Needs no Nx at compile time: it reads the :vectorized_axes field of
  # Nx.Tensor structs.

  # Erlang's largest double: a number beyond it has no float.
  @max_float 1.7976931348623157e308

  @doc false
  # A tensor argument: an Nx tensor without vectorized axes. Numbers are
  # refused, as the Erlang API refuses anything but a tensor.
  def tensor!(%{__struct__: Nx.Tensor, vectorized_axes: []} = t, _name), do: t

  def tensor!(%{__struct__: Nx.Tensor, vectorized_axes: vec}, name) do
    raise ArgumentError,
          "#{name}: expected a tensor without vectorized axes, got one vectorized over #{inspect(vec)}"
  end

  def tensor!(other, name), do: fail(name, "a tensor", term(other))

  @doc false
  # Options and tensors given under keys the op does not know.
  def known_keys!(given, allowed, what) do
    case Enum.find(Map.keys(given), &(&1 not in allowed)) do
      nil ->
        :ok

      key when allowed == [] ->
        fail(what, "no #{what_name(what)}", term(key))

      key ->
        raise ArgumentError,
              "#{what}: expected only the #{what_name(what)} #{Enum.join(allowed, ", ")}, got #{term(key)}"
    end
  end

  defp what_name("opts"), do: "options"
  defp what_name(other), do: other

  @doc false
  def opts_map!(opts) when is_list(opts) do
    unless Keyword.keyword?(opts), do: fail("opts", "a keyword list", term(opts))
    Map.new(opts)
  end

  def opts_map!(%{} = opts) when not is_struct(opts), do: opts
  def opts_map!(other), do: fail("opts", "a keyword list", term(other))

  @doc false
  def tensors_map!(%{} = tensors) when not is_struct(tensors), do: tensors

  def tensors_map!(tensors) when is_list(tensors) and tensors != [] do
    if Keyword.keyword?(tensors), do: Map.new(tensors), else: fail("tensors", "a map of tensors", term(tensors))
  end

  def tensors_map!([]), do: %{}
  def tensors_map!(other), do: fail("tensors", "a map of tensors", term(other))

  @doc false
  # A flag option: true or false.
  def bool!(opts, key, default \\ false) do
    case Map.get(opts, key, default) do
      v when is_boolean(v) -> v
      other -> fail(Atom.to_string(key), "true or false", term(other))
    end
  end

  @doc false
  # A flag given as one of two atoms (candidate_activation: identity or
  # g): its index, 0 or 1.
  def choice!(opts, key, [first, second], default) do
    case Map.get(opts, key, default) do
      ^first -> 0
      ^second -> 1
      other -> fail(Atom.to_string(key), "#{first} or #{second}", term(other))
    end
  end

  @doc false
  # An enum option (an activation): one of its atoms, as the Erlang API
  # takes it; its index. Refused in the op layer's words ("none or silu",
  # "none, relu, gelu, silu, tanh or sigmoid").
  def enum!(opts, key, choices, default) do
    value = Map.get(opts, key, default)

    case Enum.find_index(choices, &(&1 == value)) do
      nil -> fail(Atom.to_string(key), choice_list(choices), term(value))
      index -> index
    end
  end

  defp choice_list([one]), do: "#{one}"
  defp choice_list(choices), do: Enum.join(Enum.drop(choices, -1), ", ") <> " or #{List.last(choices)}"

  @doc false
  # A number option as a float: `expected` says what it may be ("a
  # positive number or a tensor ([batch, seqlen, 1])"); `positive` refuses
  # zero and below. Integers beyond a double's range are refused too.
  def number!(value, key, expected, positive) do
    ok =
      (is_float(value) or (is_integer(value) and value >= -@max_float and value <= @max_float)) and
        (not positive or value > 0)

    if ok, do: value * 1.0, else: fail(Atom.to_string(key), expected, term(value))
  end

  @doc false
  def fail(name, expected, got) do
    raise ArgumentError, "#{name}: expected #{expected}, got #{got}"
  end

  # Erlang's rendering of a term (the NIF prints terms with enif's %T).
  defp term(%{__struct__: Nx.Tensor}), do: "a tensor"
  defp term(value), do: ~c"~0tp" |> :io_lib.format([value]) |> IO.chardata_to_string()
end
