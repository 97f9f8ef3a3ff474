defmodule FusexLinrecTest do
  # The linear-recurrence wrappers on handles (no Nx): each gives the bytes
  # the Erlang API gives on the same inputs.
  use ExUnit.Case, async: false

  alias Fusex.Tensor, as: FT
  import Fusex.TestHandles

  @seq {2, 7, 5}
  @frame {2, 5}

  test "forward ops match the Erlang API, with every result shape" do
    a = random_handle(@seq, 0.0, 1.0)
    b = random_handle(@seq)
    c = random_handle(@seq)
    tau = random_handle({5}, 0.5, 2.0)
    drive = random_handle({5})
    h0 = random_handle(@frame)

    cases = [
      {fn o -> Fusex.linear_scan(a, b, o) end, fn o -> :fusex.linear_scan(a.ref, b.ref, o) end},
      {fn o -> Fusex.mingru(a, b, o) end, fn o -> :fusex.mingru(a.ref, b.ref, o) end},
      {fn o -> Fusex.minlstm(a, b, c, o) end, fn o -> :fusex.minlstm(a.ref, b.ref, c.ref, o) end},
      {fn o -> Fusex.liquid(a, tau, drive, o) end, fn o -> :fusex.liquid(a.ref, tau.ref, drive.ref, o) end}
    ]

    for {ex, erl} <- cases do
      assert bytes(ex.([])) == bytes(erl.(%{}))
      {h, state} = ex.(h0: h0, return_state: true, reverse: true)
      {erl_h, erl_state} = erl.(%{h0: h0.ref, return_state: true, reverse: true})
      assert {bytes(h), bytes(state)} == {bytes(erl_h), bytes(erl_state)}
    end
  end

  test "backward through a saved context matches the Erlang API" do
    z = random_handle(@seq)
    cand = random_handle(@seq)
    dh = random_handle(@seq)
    {_h, ctx} = Fusex.mingru(z, cand, save_for_backward: true, candidate_activation: :g)
    {_erl_h, erl_ctx} = :fusex.mingru(z.ref, cand.ref, %{save_for_backward: true, candidate_activation: :g})
    grads = Fusex.mingru_backward(dh, ctx)
    erl_grads = :fusex.mingru_backward(dh.ref, erl_ctx, %{})
    assert Map.keys(grads) == Map.keys(erl_grads)
    for {k, g} <- grads, do: assert(bytes(g) == bytes(erl_grads[k]), "gradient #{k}")
  end

  test "steps update the state handle in place, like the Erlang API" do
    state = FT.from_binary(f32(List.duplicate(0.25, 10)), {:f, 32}, @frame, device: device())
    erl_state = :fusex.tensor(f32(List.duplicate(0.25, 10)), {:f, 32}, @frame, %{device: device()})
    f = random_handle(@frame)
    i = random_handle(@frame)
    cand = random_handle(@frame)

    for _ <- 1..3 do
      h = Fusex.minlstm_step(state, f, i, cand)
      erl_h = :fusex.minlstm_step(erl_state, f.ref, i.ref, cand.ref, %{})
      assert bytes(h) == bytes(erl_h)
    end

    assert bytes(state) == bytes(erl_state)

    assert_raise ArgumentError, ~r/^state: expected a %Fusex.Tensor\{\}/, fn ->
      Fusex.mingru_step(:not_a_state, f, cand)
    end
  end

  test "bad options raise the Erlang message" do
    a = random_handle(@seq)
    assert_raise ArgumentError, ~r/^opts: expected only the options/, fn -> Fusex.linear_scan(a, a, bogus: 1) end
  end
end
