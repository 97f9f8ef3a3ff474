# An Nx.Defn.Evaluator training step of Fusex.Defn ops, forward and
# backward (the gradient of sum(out * w) for every input), with the blocks
# on fusex's NIF (the default) and on their pure-Nx code, against the eager
# NIF's own forward + backward (Fusex.<op> with save_for_backward, then
# Fusex.<op>_backward). Not a test: numbers for docs/DEFN.md.
#
#   source ../shared/elixir-kit/env.sh && MIX_ENV=test mix run dev/defn_evaluator_step.exs
#
# The pure-Nx code of a long sequence is slow under the Evaluator (one
# while-loop iteration of BinaryBackend ops per frame): the MinGRU row of
# L256 runs it only with FUSEX_STEP_LONG_NX=1 (it took over 14 minutes on
# 2 cores); the L32 row shows it.

defmodule DefnEvaluatorStep do
  def time_ms(fun, reps) do
    fun.()
    {us, _} = :timer.tc(fn -> for _ <- 1..reps, do: fun.() end)
    us / reps / 1000
  end

  def uniform(shape, lo \\ -1.0, hi \\ 1.0) do
    {t, _} = Nx.Random.uniform(Nx.Random.key(42), lo, hi, shape: shape, type: {:f, 32})
    t
  end

  def run(label, inputs, defn_fun, eager_fwd, eager_bwd, reps, with_nx \\ true) do
    w = inputs |> Tuple.to_list() |> hd() |> Map.get(:shape) |> uniform()
    loss = fn args -> Nx.sum(Nx.multiply(defn_fun.(args), w)) end
    step = Nx.Defn.jit(fn args -> Nx.Defn.grad(args, loss) end, compiler: Nx.Defn.Evaluator)
    nif = time_ms(fn -> step.(inputs) end, reps)

    pure =
      if not with_nx,
        do: nil,
        else: Fusex.Defn.with_implementation(:nx, fn -> time_ms(fn -> step.(inputs) end, 1) end)

    eager = time_ms(fn -> {_y, ctx} = eager_fwd.(inputs); eager_bwd.(w, ctx) end, reps)
    fmt = fn nil -> "-"; ms -> :erlang.float_to_binary(ms, decimals: 1) end

    IO.puts(
      "| #{label} | #{fmt.(pure)} | #{fmt.(nif)} | #{fmt.(eager)} | " <>
        "#{if pure, do: fmt.(pure / nif) <> "x", else: "-"} | #{fmt.(nif / eager)}x |"
    )
  end
end

IO.puts("| step (Evaluator, CPU, f32) | pure Nx ms | NIF ms | eager NIF fwd+bwd ms | NIF speed-up | NIF / eager |")
IO.puts("|---|---|---|---|---|---|")

for l <- [256, 32] do
  {b, h} = {4, 256}
  mg = {DefnEvaluatorStep.uniform({b, l, h}, -3.0, 3.0), DefnEvaluatorStep.uniform({b, l, h})}

  DefnEvaluatorStep.run(
    "mingru B#{b} L#{l} H#{h}",
    mg,
    fn {z, c} -> Fusex.Defn.mingru(z, c) end,
    fn {z, c} -> Fusex.mingru(z, c, save_for_backward: true) end,
    &Fusex.mingru_backward/2,
    5,
    l < 256 or System.get_env("FUSEX_STEP_LONG_NX") == "1"
  )
end

{b, l, d, n} = {32, 32, 16, 8}

ss =
  {DefnEvaluatorStep.uniform({b, l, d}), DefnEvaluatorStep.uniform({b, l, d}, -1.5, 0.5),
   DefnEvaluatorStep.uniform({d, n}, -2.0, -0.1), DefnEvaluatorStep.uniform({b, l, n}), DefnEvaluatorStep.uniform({b, l, n})}

DefnEvaluatorStep.run(
  "selective_scan B#{b} L#{l} D#{d} N#{n}",
  ss,
  fn {x, dt, a, bb, c} -> Fusex.Defn.selective_scan(x, dt, a, bb, c, %{}, dt_softplus: true) end,
  fn {x, dt, a, bb, c} -> Fusex.selective_scan(x, dt, a, bb, c, dt_softplus: true, save_for_backward: true) end,
  &Fusex.selective_scan_backward/2,
  5
)
