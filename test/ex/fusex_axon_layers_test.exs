defmodule FusexAxonLayersTest do
  # Axon layers for the rest of a Mamba block (Fusex.Axon.causal_conv1d,
  # rms_norm, layer_norm): parameters and their initializers, each layer's
  # output against Fusex.Defn on its parameters, a model that trains (20
  # Adam steps, the loss decreases, every parameter gets a gradient), and
  # every option out of range refused in the house message. Runs where Nx,
  # Axon and Polaris are present; listed as skipped elsewhere.
  use ExUnit.Case, async: false
  @moduletag :nx
  @moduletag :axon
  @compile {:no_warn_undefined,
            [Nx, Nx.Defn, Axon, Axon.ModelState, Polaris.Optimizers, Polaris.Updates, Fusex.Axon, Fusex.Defn]}

  import Fusex.NxHelpers

  defp params(layer, shape) do
    {init_fn, predict_fn} = Axon.build(layer)
    state = init_fn.(Nx.template(shape, {:f, 32}), Axon.ModelState.empty())
    {state, predict_fn}
  end

  test "each layer computes its op of Fusex.Defn on its parameters, initialized as asked" do
    x = uniform({2, 7, 5})
    input = Axon.input("x", shape: {nil, 7, 5})
    gate = Axon.input("g", shape: {nil, 7, 5})
    g = uniform({2, 7, 5})

    {state, predict} = params(Fusex.Axon.causal_conv1d(input, width: 3, activation: :silu, name: "l", bias_initializer: :ones), {2, 7, 5})
    p = state.data["l"]
    assert {p["kernel"].shape, p["bias"].shape} == {{5, 3}, {5}}
    assert Nx.to_flat_list(p["bias"]) == List.duplicate(1.0, 5)
    assert_close(predict.(state, x), Fusex.Defn.causal_conv1d(x, p["kernel"], %{bias: p["bias"]}, activation: :silu), 1.0e-6, "conv")

    {state, predict} = params(Fusex.Axon.causal_conv1d(input, use_bias: false, name: "l"), {2, 7, 5})
    assert Map.keys(state.data["l"]) == ["kernel"]
    assert_close(predict.(state, x), Fusex.Defn.causal_conv1d(x, state.data["l"]["kernel"]), 1.0e-6, "conv, no bias")

    {state, predict} = params(Fusex.Axon.rms_norm(input, eps: 0.01, name: "l"), {2, 7, 5})
    assert Nx.to_flat_list(state.data["l"]["weight"]) == List.duplicate(1.0, 5)
    assert_close(predict.(state, x), Fusex.Defn.rms_norm(x, state.data["l"]["weight"], %{}, eps: 0.01), 1.0e-6, "rms_norm")

    model = Fusex.Axon.rms_norm(input, gate: gate, use_bias: true, name: "l", weight_initializer: :glorot_uniform)
    {init_fn, predict} = Axon.build(model)
    state = init_fn.(%{"x" => Nx.template({2, 7, 5}, {:f, 32}), "g" => Nx.template({2, 7, 5}, {:f, 32})}, Axon.ModelState.empty())
    p = state.data["l"]
    assert_close(predict.(state, %{"x" => x, "g" => g}), Fusex.Defn.rms_norm(x, p["weight"], %{bias: p["bias"], gate: g}), 1.0e-6, "gated rms_norm")

    {state, predict} = params(Fusex.Axon.layer_norm(input, name: "l"), {2, 7, 5})
    p = state.data["l"]
    assert Nx.to_flat_list(p["bias"]) == List.duplicate(0.0, 5)
    assert_close(predict.(state, x), Fusex.Defn.layer_norm(x, p["weight"], p["bias"]), 1.0e-6, "layer_norm")

    {state, predict} = params(Fusex.Axon.layer_norm(input, use_bias: false, name: "l"), {2, 7, 5})
    assert Map.keys(state.data["l"]) == ["weight"]
    zeros = Nx.broadcast(0.0, {5})
    assert_close(predict.(state, x), Fusex.Defn.layer_norm(x, state.data["l"]["weight"], zeros), 1.0e-6, "layer_norm, no bias")
  end

  test "a Mamba-like block of fusex layers trains: 20 Adam steps, the loss decreases, every parameter moves" do
    {batch, seqlen, features} = {4, 12, 3}
    input = Axon.input("x", shape: {nil, seqlen, features})
    h = Axon.dense(input, 8)
    z = Axon.dense(h, 8)

    model =
      h
      |> Fusex.Axon.rms_norm(name: "norm")
      |> Fusex.Axon.causal_conv1d(width: 4, activation: :silu, name: "conv")
      |> Fusex.Axon.layer_norm(gate: z, name: "gated")
      |> Axon.dense(1)

    x = uniform({batch, seqlen, features})
    # a target that depends on the last few inputs
    y = x |> Nx.sum(axes: [2], keep_axes: true) |> Nx.window_mean({1, 3, 1}, padding: [{0, 0}, {2, 0}, {0, 0}])
    {init_fn, predict_fn} = Axon.build(model)
    state = init_fn.(Nx.template({batch, seqlen, features}, {:f, 32}), Axon.ModelState.empty())
    {opt_init, opt_update} = Polaris.Optimizers.adam(learning_rate: 1.0e-2)

    step =
      Nx.Defn.jit(fn data, opt_state, x, y ->
        {loss, grads} =
          Nx.Defn.value_and_grad(data, fn data ->
            Nx.mean(Nx.pow(Nx.subtract(predict_fn.(Map.put(state, :data, data), x), y), 2))
          end)

        {updates, opt_state} = opt_update.(grads, opt_state, data)
        {Polaris.Updates.apply_updates(data, updates), opt_state, loss, grads}
      end)

    {data, _opt, losses, grads} =
      Enum.reduce(1..20, {state.data, opt_init.(state.data), [], nil}, fn _, {data, opt, losses, _} ->
        {data, opt, loss, grads} = step.(data, opt, x, y)
        {data, opt, [Nx.to_number(loss) | losses], grads}
      end)

    losses = Enum.reverse(losses)
    assert List.last(losses) < 0.9 * hd(losses), "loss #{hd(losses)} -> #{List.last(losses)}"

    for layer <- ["norm", "conv", "gated"], {name, g} <- grads[layer] do
      assert Nx.to_number(Nx.sum(Nx.abs(g))) > 0, "#{layer}.#{name} got no gradient"
      refute data[layer][name] == state.data[layer][name], "#{layer}.#{name} did not move"
    end
  end

  @initializer "an Axon initializer (a function of Axon.Initializers by name, or a function of arity 2 or 3)"

  test "every option out of range: an ArgumentError naming the option" do
    input = Axon.input("x", shape: {nil, 7, 5})

    cases = [
      {&Fusex.Axon.causal_conv1d/2,
       [width: {"an integer 1 to 16", [0, 17, 4.0, nil]}, activation: {":none or :silu", [:relu, "silu", nil]},
        use_bias: {"true or false", [1, nil]}, kernel_initializer: {@initializer, [:bogus]},
        bias_initializer: {@initializer, [3]}, name: {"nil, a string or a function of arity 2", [:conv]}]},
      {&Fusex.Axon.rms_norm/2,
       [eps: {"a finite number >= 0", [-1, :small, nil, Integer.pow(10, 400)]}, gate: {"nil or an %Axon{} layer", [:g, 1]},
        use_bias: {"true or false", ["yes"]}, weight_initializer: {@initializer, [:bogus]}]},
      {&Fusex.Axon.layer_norm/2,
       [eps: {"a finite number >= 0", [-0.5]}, bias_initializer: {@initializer, [:nope]}]}
    ]

    for {build, options} <- cases, {option, {expected, values}} <- options, value <- values do
      message = "#{option}: expected #{expected}, got #{inspect(value, limit: 5, printable_limit: 80)}"
      err = assert_raise ArgumentError, fn -> build.(input, [{option, value}]) end
      assert err.message == message
    end

    assert_raise ArgumentError, ~r/^opts: expected only the options name, width, activation, .*, got :units$/, fn ->
      Fusex.Axon.causal_conv1d(input, units: 3)
    end

    assert_raise ArgumentError, "input: expected an %Axon{} layer, got :x", fn -> Fusex.Axon.rms_norm(:x) end
  end
end
