defmodule FusexSsmTest do
  # The selective-scan wrappers on handles (no Nx): each gives the bytes the
  # Erlang API gives on the same inputs.
  use ExUnit.Case, async: false

  alias Fusex.Tensor, as: FT
  import Fusex.TestHandles

  # batch 2, seqlen 9, dim 6, dstate 4
  defp inputs do
    %{x: random_handle({2, 9, 6}), dt: random_handle({2, 9, 6}, -2.0, 0.5), a: random_handle({6, 4}, -2.0, -0.1),
      b: random_handle({2, 9, 4}), c: random_handle({2, 9, 4}), d: random_handle({6}), z: random_handle({2, 9, 6}),
      dt_bias: random_handle({6}, -0.5, 0.5), h0: random_handle({2, 6, 4})}
  end

  test "forward and backward match the Erlang API" do
    i = inputs()
    opts = [d: i.d, z: i.z, dt_bias: i.dt_bias, dt_softplus: true, h0: i.h0, return_state: true, save_for_backward: true]
    erl_opts = %{d: i.d.ref, z: i.z.ref, dt_bias: i.dt_bias.ref, dt_softplus: true, h0: i.h0.ref,
                 return_state: true, save_for_backward: true}
    {y, state, ctx} = Fusex.selective_scan(i.x, i.dt, i.a, i.b, i.c, opts)
    {erl_y, erl_state, erl_ctx} = :fusex.selective_scan(i.x.ref, i.dt.ref, i.a.ref, i.b.ref, i.c.ref, erl_opts)
    assert {bytes(y), bytes(state)} == {bytes(erl_y), bytes(erl_state)}

    dy = random_handle({2, 9, 6})
    grads = Fusex.selective_scan_backward(dy, ctx)
    erl_grads = :fusex.selective_scan_backward(dy.ref, erl_ctx, %{})
    assert Map.keys(grads) == Map.keys(erl_grads)
    assert Enum.sort(Map.keys(grads)) == [:a, :b, :c, :d, :dt, :dt_bias, :h0, :x, :z]
    for {k, g} <- grads, do: assert(bytes(g) == bytes(erl_grads[k]), "gradient #{k}")
  end

  test "step updates the state handle in place, like the Erlang API" do
    state = FT.from_binary(f32(List.duplicate(0.5, 48)), {:f, 32}, {2, 6, 4}, device: device())
    erl_state = :fusex.tensor(f32(List.duplicate(0.5, 48)), {:f, 32}, {2, 6, 4}, %{device: device()})
    a = random_handle({6, 4}, -2.0, -0.1)

    for _ <- 1..3 do
      x = random_handle({2, 6})
      dt = random_handle({2, 6}, 0.0, 0.5)
      b = random_handle({2, 4})
      c = random_handle({2, 4})
      y = Fusex.selective_scan_step(state, x, dt, a, b, c)
      erl_y = :fusex.selective_scan_step(erl_state, x.ref, dt.ref, a.ref, b.ref, c.ref, %{})
      assert bytes(y) == bytes(erl_y)
    end

    assert bytes(state) == bytes(erl_state)
  end

  test "errors carry the op layer's message" do
    i = inputs()

    assert_raise ArgumentError, ~r/^b: expected shape/, fn ->
      Fusex.selective_scan(i.x, i.dt, i.a, random_handle({2, 9, 5}), i.c)
    end
  end
end
