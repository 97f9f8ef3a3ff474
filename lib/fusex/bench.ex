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
    opts = Keyword.validate!(opts, [:ops, :device, :reps, :out])
    :fusex_bench.run(Map.new(opts, &erl_opt/1))
  end

  defp erl_opt({:ops, ops}) when is_list(ops), do: {:ops, Enum.map(ops, &to_string/1)}
  defp erl_opt({:ops, op}), do: {:ops, [to_string(op)]}
  defp erl_opt({:device, device}), do: {:device, Fusex.Tensor.normalize_device(device)}
  defp erl_opt({:out, file}), do: {:out, to_charlist(file)}
  defp erl_opt(other), do: other
end
