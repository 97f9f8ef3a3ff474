defmodule FusexOptimTest do
  # Fusex.AdamW and Fusex.SGD on handles (no Nx): the same steps as the
  # Erlang API on copies of the same inputs give the same bytes.
  use ExUnit.Case, async: false

  alias Fusex.Tensor, as: FT
  import Fusex.TestHandles

  defp random(n), do: for(_ <- 1..n, do: :rand.uniform() - 0.5)

  # The same parameters twice (one set for Elixir, one for Erlang) and grads.
  defp model(sizes) do
    values = Enum.map(sizes, &random/1)
    grads = for _ <- 1..3, do: Enum.map(sizes, &random/1)
    params = Enum.zip(values, sizes) |> Enum.map(fn {v, n} -> handle(v, {n}) end)
    erl_params = Enum.zip(values, sizes) |> Enum.map(fn {v, n} -> handle(v, {n}).ref end)

    {params, erl_params,
     for(gs <- grads, do: Enum.zip(gs, sizes) |> Enum.map(fn {g, n} -> handle(g, {n}) end))}
  end

  for {mod, erl_init, erl_step, opts} <- [
        {Fusex.AdamW, :adamw_init, :adamw_step, [lr: 0.01, amsgrad: true, max_grad_norm: 0.5]},
        {Fusex.SGD, :sgd_init, :sgd_step, [lr: 0.05, momentum: 0.9, nesterov: true]}
      ] do
    test "#{inspect(mod)} matches the Erlang API" do
      {params, erl_params, grads} = model([1, 130, 1025])
      opts = unquote(opts)
      state = unquote(mod).init(params, opts)
      erl_state = :fusex.unquote(erl_init)(erl_params, Map.new(opts))
      assert %FT{type: {:s, 64}} = state.step

      for gs <- grads do
        ^state = unquote(mod).step(state, params, gs, lr: 0.02)
        :fusex.unquote(erl_step)(erl_state, erl_params, Enum.map(gs, & &1.ref), %{lr: 0.02})
      end

      assert Enum.map(params, &FT.to_binary/1) == Enum.map(erl_params, &:fusex.to_binary/1)
      assert %{step: 3, skipped: false, grad_norm: norm} = unquote(mod).info(state)
      assert norm == :fusex.optimizer_info(erl_state).grad_norm
    end
  end

  test "parameters must be handles; bad options raise the Erlang message" do
    {params, _, [grads | _]} = model([3])

    assert_raise ArgumentError, ~r/^params\[0\]: expected a %Fusex.Tensor\{\}/, fn ->
      Fusex.AdamW.init([:not_a_tensor])
    end

    assert_raise ArgumentError, "beta1: expected a number in [0, 1), got 1.5", fn ->
      Fusex.AdamW.init(params, beta1: 1.5)
    end

    state = Fusex.SGD.init(params, %{momentum: 0.5})
    assert %{step: 0, skipped: false, grad_norm: :undefined} = Fusex.SGD.info(state)

    assert_raise ArgumentError,
                 ~r/^state: expected an optimizer state from adamw_init\/2 or sgd_init\/2/,
                 fn ->
                   Fusex.AdamW.info(:nothing)
                 end

    assert_raise ArgumentError, "grads: expected a list of 1 tensor (one per param), got 2", fn ->
      Fusex.SGD.step(state, params, grads ++ grads)
    end
  end
end
