if Code.ensure_loaded?(Nx.Defn) do
  defmodule Fusex.Defn.Loop do
    @moduledoc false
    # The one loop the default implementations of the Fusex.Defn blocks use:
    # an Nx `while` over an index range whose bounds may be tensors.
    # Everything the body reads goes through the loop's state (`inputs`),
    # never through a closure, as while loops under every compiler need.
    import Nx.Defn

    @doc false
    # body.(carry, inputs, i) for i = first, first + step, ... (count
    # times; step is 1 or -1, count may be 0); returns the final carry.
    defn repeat(carry, inputs, first, count, opts \\ []) do
      body = opts[:body]
      step = opts[:step]

      {carry, _inputs, _first, _count, _k} =
        while {carry, inputs, first, count, k = 0}, k < count do
          {body.(carry, inputs, first + k * step), inputs, first, count, k + 1}
        end

      carry
    end
  end
end
