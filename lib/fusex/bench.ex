defmodule Fusex.Bench do
  @moduledoc """
  Benchmarks from iex: `Fusex.Bench.run(ops: ["scan"], device: :cuda)`
  prints the table `make bench` prints (op, shape, dtype, device, median
  µs, GB/s, % of copy bandwidth, end-to-end µs; see bench/README.md) and
  returns its rows as maps.

  Options: `:ops` (substrings of op names, strings or atoms), `:device`
  (`:cpu`, `:cuda`, `{:cuda, n}`), `:reps`, `:out` (also write the table to
  this file).
  """

  @doc "Runs the selected cases and prints the table; returns the rows."
  def run(opts \\ []) do
    opts = Fusex.Opts.keyword!(opts, [:ops, :device, :reps, :out])
    name? = &(is_binary(&1) or is_atom(&1))
    Fusex.Opts.value!(opts, :ops, "an op name or a list of them", &(&1 == nil or name?.(&1) or (is_list(&1) and Enum.all?(&1, name?))))
    Fusex.Opts.value!(opts, :device, ":cpu, :cuda or {:cuda, n}", &(&1 in [nil, :cpu, :cuda] or match?({:cuda, n} when is_integer(n) and n >= 0, &1)))
    Fusex.Opts.value!(opts, :reps, "a positive integer", &(&1 == nil or Fusex.Opts.positive_integer?(&1)))
    Fusex.Opts.value!(opts, :out, "a file name", &(&1 == nil or is_binary(&1) or (is_list(&1) and List.ascii_printable?(&1))))
    :fusex_bench.run(opts |> Enum.reject(fn {_k, v} -> v == nil end) |> Map.new(&erl_opt/1))
  end

  defp erl_opt({:ops, ops}) when is_list(ops), do: {:ops, Enum.map(ops, &to_string/1)}
  defp erl_opt({:ops, op}), do: {:ops, [to_string(op)]}
  defp erl_opt({:device, device}), do: {:device, Fusex.Tensor.normalize_device(device)}
  defp erl_opt({:out, file}), do: {:out, to_charlist(file)}
  defp erl_opt(other), do: other
end
