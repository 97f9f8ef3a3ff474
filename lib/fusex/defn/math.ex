if Code.ensure_loaded?(Nx) do
  defmodule Fusex.Defn.Math do
    @moduledoc false
    # Shared pieces of the default implementations: the same formulas as the
    # CPU reference (c_src/cpu), written with Nx ops that every backend and
    # compiler runs (no while differentiated, no backend-specific calls).

    @doc false
    # The arithmetic type of inputs of `type`: f32, or f64 for f64 (the
    # state type; 16-bit inputs are computed in f32 and rounded at the
    # outputs, as the kernels do).
    def compute_type({:f, 64}), do: {:f, 64}
    def compute_type(_), do: {:f, 32}

    @doc false
    def wider({:f, 64}, _), do: {:f, 64}
    def wider(_, {:f, 64}), do: {:f, 64}
    def wider(_, _), do: {:f, 32}

    @doc false
    # softplus with PyTorch's threshold: u above 20. The exp never sees
    # more than 20, so neither branch overflows (nor, differentiated, gives
    # NaN).
    def softplus_thresholded(u),
      do: Nx.select(Nx.greater(u, 20), u, Nx.log1p(Nx.exp(Nx.min(u, 20))))

    @doc false
    def softplus_thresholded_grad(u), do: Nx.select(Nx.greater(u, 20), 1.0, Nx.sigmoid(Nx.min(u, 20)))

    @doc false
    # softplus for any u: max(u, 0) + log1p(exp(-|u|)).
    def softplus(u), do: Nx.add(Nx.max(u, 0), Nx.log1p(Nx.exp(Nx.negate(Nx.abs(u)))))

    @doc false
    def silu(z), do: Nx.multiply(z, Nx.sigmoid(z))

    @doc false
    # silu'(z) = s (1 + z (1 - s)), s = sigmoid(z).
    def silu_grad(z) do
      s = Nx.sigmoid(z)
      Nx.multiply(s, Nx.add(1, Nx.multiply(z, Nx.subtract(1, s))))
    end

    @doc false
    def zeros(shape, type), do: Nx.broadcast(Nx.tensor(0, type: type), shape)

    @doc false
    def ones(shape, type), do: Nx.broadcast(Nx.tensor(1, type: type), shape)

    @doc false
    # Time step t (a scalar tensor or integer) of [batch, seqlen, ...].
    def at_step(seq, t), do: seq |> Nx.slice_along_axis(t, 1, axis: 1) |> Nx.squeeze(axes: [1])

    @doc false
    # seq with its time step t replaced by `value` ([batch, ...]).
    def put_step(seq, t, value) do
      zeros = List.duplicate(0, Nx.rank(seq) - 2)
      Nx.put_slice(seq, [0, t | zeros], Nx.new_axis(value, 1))
    end

    @doc false
    # Time-reversed along axis 1 when `reverse?`.
    def flip(t, true), do: Nx.reverse(t, axes: [1])
    def flip(t, false), do: t
  end
end
