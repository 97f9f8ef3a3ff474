defmodule Fusex.Opts do
  @moduledoc false
  # The options of fusex's Elixir functions (Fusex.Tensor, Fusex.Axon,
  # Fusex.Bench, the wrappers' own), checked with the house message: an
  # ArgumentError naming the option, what was expected and what came
  # ("state_size: expected a positive integer, got -3").

  @doc false
  # `opts` as a keyword list of the `allowed` keys (atoms, or {key,
  # default} pairs whose defaults fill in what is left out).
  def keyword!(opts, allowed) do
    unless is_list(opts) and Keyword.keyword?(opts), do: fail("opts", "a keyword list", opts)
    keys = Enum.map(allowed, fn {k, _} -> k; k -> k end)

    case Enum.find(Keyword.keys(opts), &(&1 not in keys)) do
      nil -> :ok
      key -> raise ArgumentError, "opts: expected only the options #{Enum.join(keys, ", ")}, got #{inspect(key)}"
    end

    defaults = for {k, v} <- allowed, not Keyword.has_key?(opts, k), do: {k, v}
    defaults ++ opts
  end

  @doc false
  # The option's value where `valid?` holds for it, else an ArgumentError.
  def value!(opts, key, expected, valid?) do
    value = opts[key]
    if valid?.(value), do: value, else: fail(Atom.to_string(key), expected, value)
  end

  @doc false
  def boolean!(opts, key), do: value!(opts, key, "true or false", &is_boolean/1)

  @doc false
  def positive_integer?(v), do: is_integer(v) and v > 0

  @doc false
  # A positive number a float can hold.
  def positive_number?(v), do: (is_float(v) or (is_integer(v) and v <= 1.7976931348623157e308)) and v > 0

  @doc false
  def fail(name, expected, got) do
    raise ArgumentError, "#{name}: expected #{expected}, got #{inspect(got, limit: 5, printable_limit: 80)}"
  end
end
