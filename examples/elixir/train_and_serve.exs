# Trains a small recurrent model (a MinGRU between two linear layers) with
# fusex's ops and fusex's fused AdamW, then serves it frame by frame with
# fusex's step, the state resident and updated in place; checks that the
# served frames equal the trained model on the whole sequence.
#
#   mix run examples/elixir/train_and_serve.exs      (in a project with fusex and Nx >= 0.13)
#   make example-ex                                  (here, with the test suites' Nx)
#
# Under Nx.Defn.Evaluator (the default compiler) Fusex.Defn.mingru runs
# fusex's NIF, forward and backward; with EXLA (compiler: EXLA) it is
# fused into the XLA program.

defmodule Example do
  import Nx.Defn

  @batch 16
  @seqlen 24
  @features 2
  @hidden 16

  # The target: a leaky running sum of the inputs' first feature.
  def data(key) do
    {x, key} = Nx.Random.uniform(key, -1.0, 1.0, shape: {@batch, @seqlen, @features}, type: :f32)
    drive = x[[.., .., 0]]
    steps = for t <- 0..(@seqlen - 1), do: drive[[.., t]]

    y =
      steps
      |> Enum.scan(fn d, acc -> Nx.add(Nx.multiply(acc, 0.7), d) end)
      |> Nx.stack(axis: 1)
      |> Nx.new_axis(2)

    {x, Nx.multiply(y, 0.5), key}
  end

  def init(key) do
    shapes = %{wz: {@features, @hidden}, wc: {@features, @hidden}, wo: {@hidden, 1}}

    {params, _key} =
      Enum.reduce(shapes, {%{}, key}, fn {name, shape}, {acc, key} ->
        {w, key} = Nx.Random.normal(key, 0.0, 0.5, shape: shape, type: :f32)
        {Map.put(acc, name, w), key}
      end)

    Map.merge(params, %{bz: Nx.broadcast(0.0, {@hidden}), bc: Nx.broadcast(0.0, {@hidden}), bo: Nx.broadcast(0.0, {1})})
  end

  # The model on a whole sequence: [batch, seqlen, features] -> [batch, seqlen, 1].
  defn predict(p, x) do
    z = Nx.dot(x, p.wz) + p.bz
    c = Nx.dot(x, p.wc) + p.bc
    h = Fusex.Defn.mingru(z, c)
    Nx.dot(h, p.wo) + p.bo
  end

  defn loss(p, x, y), do: Nx.mean((predict(p, x) - y) ** 2)

  def train(params, x, y, steps) do
    {opt_init, opt_update} = Fusex.Optim.adamw(learning_rate: 2.0e-2)

    step =
      Nx.Defn.jit(fn p, opt, x, y ->
        {loss, grads} = Nx.Defn.value_and_grad(p, &loss(&1, x, y))
        {updates, opt} = opt_update.(grads, opt, p)
        {Polaris.Updates.apply_updates(p, updates), opt, loss}
      end)

    Enum.reduce(1..steps, {params, opt_init.(params), []}, fn _, {p, opt, losses} ->
      {p, opt, loss} = step.(p, opt, x, y)
      {p, opt, [Nx.to_number(loss) | losses]}
    end)
    |> then(fn {p, _opt, losses} -> {p, Enum.reverse(losses)} end)
  end

  # Serving: one frame at a time, the MinGRU state a fusex handle updated
  # in place by each step; the frames' outputs stacked.
  def serve(p, x) do
    state = Fusex.Tensor.zeros({:f, 32}, {@batch, @hidden}, device: :cpu)

    for t <- 0..(@seqlen - 1) do
      xt = x[[.., t, ..]]
      z = Nx.add(Nx.dot(xt, p.wz), p.bz)
      c = Nx.add(Nx.dot(xt, p.wc), p.bc)
      h = Fusex.mingru_step(state, z, c)
      Nx.add(Nx.dot(h, p.wo), p.bo)
    end
    |> Nx.stack(axis: 1)
  end
end

key = Nx.Random.key(7)
{x, y, key} = Example.data(key)
params = Example.init(key)
{params, losses} = Example.train(params, x, y, 40)
IO.puts("training loss: #{Float.round(hd(losses), 4)} -> #{Float.round(List.last(losses), 4)} (40 AdamW steps)")

served = Example.serve(params, x)
whole = Example.predict(params, x)
diff = served |> Nx.subtract(whole) |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()
IO.puts("served frame by frame vs the whole sequence: max |diff| = #{diff}")

cond do
  not (List.last(losses) < 0.5 * hd(losses)) -> raise "the loss did not fall: #{inspect(losses)}"
  not (diff <= 1.0e-5) -> raise "the served frames differ from the model: #{diff}"
  true -> IO.puts("ok")
end
