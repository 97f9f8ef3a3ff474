defmodule FusexSsmTest do
  # The selective-scan wrappers on handles (no Nx): each gives the bytes the
  # Erlang API gives on the same inputs.
  use ExUnit.Case, async: false

  alias Fusex.Tensor, as: FT

  defp device, do: Fusex.default_device()
  defp f32(values), do: for(v <- values, into: <<>>, do: <<v::float-32-native>>)

  defp handle(shape, lo \\ -1.0, hi \\ 1.0) do
    n = shape |> Tuple.to_list() |> Enum.product()
    FT.from_binary(f32(for _ <- 1..n, do: lo + (hi - lo) * :rand.uniform()), {:f, 32}, shape, device: device())
  end

  defp bytes(%FT{} = t), do: FT.to_binary(t)
  defp bytes(ref) when is_reference(ref), do: :fusex.to_binary(ref)

  # batch 2, seqlen 9, dim 6, dstate 4
  defp inputs do
    %{x: handle({2, 9, 6}), dt: handle({2, 9, 6}, -2.0, 0.5), a: handle({6, 4}, -2.0, -0.1),
      b: handle({2, 9, 4}), c: handle({2, 9, 4}), d: handle({6}), z: handle({2, 9, 6}),
      dt_bias: handle({6}, -0.5, 0.5), h0: handle({2, 6, 4})}
  end

  test "forward and backward match the Erlang API" do
    i = inputs()
    opts = [d: i.d, z: i.z, dt_bias: i.dt_bias, dt_softplus: true, h0: i.h0, return_state: true, save_for_backward: true]
    erl_opts = %{d: i.d.ref, z: i.z.ref, dt_bias: i.dt_bias.ref, dt_softplus: true, h0: i.h0.ref,
                 return_state: true, save_for_backward: true}
    {y, state, ctx} = Fusex.selective_scan(i.x, i.dt, i.a, i.b, i.c, opts)
    {erl_y, erl_state, erl_ctx} = :fusex.selective_scan(i.x.ref, i.dt.ref, i.a.ref, i.b.ref, i.c.ref, erl_opts)
    assert {bytes(y), bytes(state)} == {bytes(erl_y), bytes(erl_state)}

    dy = handle({2, 9, 6})
    grads = Fusex.selective_scan_backward(dy, ctx)
    erl_grads = :fusex.selective_scan_backward(dy.ref, erl_ctx, %{})
    assert Map.keys(grads) == Map.keys(erl_grads)
    assert Enum.sort(Map.keys(grads)) == [:a, :b, :c, :d, :dt, :dt_bias, :h0, :x, :z]
    for {k, g} <- grads, do: assert(bytes(g) == bytes(erl_grads[k]), "gradient #{k}")
  end

  test "step updates the state handle in place, like the Erlang API" do
    state = FT.from_binary(f32(List.duplicate(0.5, 48)), {:f, 32}, {2, 6, 4}, device: device())
    erl_state = :fusex.tensor(f32(List.duplicate(0.5, 48)), {:f, 32}, {2, 6, 4}, %{device: device()})
    a = handle({6, 4}, -2.0, -0.1)

    for _ <- 1..3 do
      x = handle({2, 6})
      dt = handle({2, 6}, 0.0, 0.5)
      b = handle({2, 4})
      c = handle({2, 4})
      y = Fusex.selective_scan_step(state, x, dt, a, b, c)
      erl_y = :fusex.selective_scan_step(erl_state, x.ref, dt.ref, a.ref, b.ref, c.ref, %{})
      assert bytes(y) == bytes(erl_y)
    end

    assert bytes(state) == bytes(erl_state)
  end

  test "errors carry the op layer's message" do
    i = inputs()

    assert_raise ArgumentError, ~r/^b: expected shape/, fn ->
      Fusex.selective_scan(i.x, i.dt, i.a, handle({2, 9, 5}), i.c)
    end
  end
end
