defmodule Fusex.TestHandles do
  @moduledoc false
  # Building and reading %Fusex.Tensor{} handles in the ExUnit suites (no Nx
  # needed): f32 values in, bytes out, on the default device.

  alias Fusex.Tensor, as: FT

  def device, do: Fusex.default_device()

  def f32(values), do: for(v <- values, into: <<>>, do: <<v::float-32-native>>)

  @doc "A {:f, 32} handle holding `values`."
  def handle(values, shape, opts \\ []),
    do: FT.from_binary(f32(values), {:f, 32}, shape, Keyword.put_new(opts, :device, device()))

  @doc "A {:f, 32} handle of `shape`, uniform in [lo, hi]."
  def random_handle(shape, lo \\ -1.0, hi \\ 1.0) do
    n = shape |> Tuple.to_list() |> Enum.product()
    handle(for(_ <- 1..n, do: lo + (hi - lo) * :rand.uniform()), shape)
  end

  @doc "The bytes of a handle or of an Erlang tensor."
  def bytes(%FT{} = t), do: FT.to_binary(t)
  def bytes(ref) when is_reference(ref), do: :fusex.to_binary(ref)
end
