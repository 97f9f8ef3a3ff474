defmodule FusexAxonTest do
  # Axon models with fusex layers (Fusex.Axon): build, init, predict, and
  # 20 training steps with Polaris's Adam in which the loss decreases; the
  # layers' outputs against Fusex.Defn on the same parameters. Runs where
  # Nx, Axon and Polaris are present; listed as skipped elsewhere.
  use ExUnit.Case, async: false
  @moduletag :nx
  @moduletag :axon
  @compile {:no_warn_undefined,
            [Nx, Nx.Defn, Axon, Axon.ModelState, Polaris.Optimizers, Polaris.Updates, Fusex.Axon, Fusex.Defn]}

  import Fusex.NxHelpers

  @batch 4
  @seqlen 12
  @features 3

  # A stack with every fusex layer, and a target each step of which
  # depends on the past (a leaky running sum of the inputs).
  defp model do
    Axon.input("x", shape: {nil, @seqlen, @features})
    |> Axon.dense(8)
    |> Fusex.Axon.selective_scan(state_size: 4, name: "ssm")
    |> Fusex.Axon.min_gru(8, candidate_activation: :g, name: "mingru")
    |> Fusex.Axon.min_lstm(8, reverse: true, name: "minlstm")
    |> Fusex.Axon.liquid(8, dt: 0.5, name: "liquid")
    |> Axon.dense(1)
  end

  defp data do
    x = uniform({@batch, @seqlen, @features})
    drive = Nx.sum(x, axes: [2])

    y =
      Enum.reduce(0..(@seqlen - 1), {Nx.broadcast(0.0, {@batch}), []}, fn t, {acc, out} ->
        acc = Nx.add(Nx.multiply(acc, 0.8), Nx.slice_along_axis(drive, t, 1, axis: 1) |> Nx.squeeze(axes: [1]))
        {acc, [Nx.divide(acc, 4) | out]}
      end)
      |> elem(1)
      |> Enum.reverse()
      |> Nx.stack(axis: 1)
      |> Nx.new_axis(2)

    {x, y}
  end

  test "an Axon model with every fusex layer builds, predicts and trains: 20 Adam steps, the loss decreases" do
    {init_fn, predict_fn} = Axon.build(model())
    {x, y} = data()
    state = init_fn.(Nx.template({@batch, @seqlen, @features}, {:f, 32}), Axon.ModelState.empty())

    for {layer, names} <- [
          {"ssm", ["x_proj", "dt_proj", "dt_bias", "a_log", "d"]},
          {"mingru", ["z_kernel", "z_bias", "h_kernel", "h_bias"]},
          {"minlstm", ["f_kernel", "f_bias", "i_kernel", "i_bias", "h_kernel", "h_bias"]},
          {"liquid", ["kernel", "bias", "log_tau", "a"]}
        ],
        do: assert(Enum.sort(Map.keys(state.data[layer])) == Enum.sort(names), layer)

    assert state.data["ssm"]["a_log"].shape == {8, 4}
    assert state.data["ssm"]["x_proj"].shape == {8, 1 + 2 * 4}

    pred = predict_fn.(state, x)
    assert pred.shape == {@batch, @seqlen, 1}

    {opt_init, opt_update} = Polaris.Optimizers.adam(learning_rate: 1.0e-2)

    step =
      Nx.Defn.jit(fn data, opt_state, x, y ->
        {loss, grads} =
          Nx.Defn.value_and_grad(data, fn data ->
            pred = predict_fn.(Map.put(state, :data, data), x)
            Nx.mean(Nx.pow(Nx.subtract(pred, y), 2))
          end)

        {updates, opt_state} = opt_update.(grads, opt_state, data)
        {Polaris.Updates.apply_updates(data, updates), opt_state, loss, grads}
      end)

    {data, losses, grads} =
      Enum.reduce(1..20, {state.data, opt_init.(state.data), [], nil}, fn _, {data, opt, losses, _} ->
        {data, opt, loss, grads} = step.(data, opt, x, y)
        {data, opt, [Nx.to_number(loss) | losses], grads}
      end)
      |> then(fn {data, _opt, losses, grads} -> {data, Enum.reverse(losses), grads} end)

    IO.puts("\nfusex Axon training losses: #{Enum.map_join(losses, " ", &Float.round(&1, 4))}")
    assert Enum.all?(losses, &is_float/1)
    assert List.last(losses) < 0.9 * hd(losses), "loss #{hd(losses)} -> #{List.last(losses)}"

    # every fusex parameter received a gradient and moved
    for layer <- ["ssm", "mingru", "minlstm", "liquid"], {name, g} <- grads[layer] do
      assert Nx.to_number(Nx.sum(Nx.abs(g))) > 0, "#{layer}.#{name} got no gradient"
      refute data[layer][name] == state.data[layer][name], "#{layer}.#{name} did not move"
    end
  end

  test "each layer computes its op of Fusex.Defn on its parameters" do
    x = uniform({2, 7, 5})
    input = Axon.input("x", shape: {nil, 7, 5})

    for {layer, check} <- [
          {Fusex.Axon.min_gru(input, 3, name: "l"),
           fn p -> Fusex.Defn.mingru(dense(x, p["z_kernel"], p["z_bias"]), dense(x, p["h_kernel"], p["h_bias"])) end},
          {Fusex.Axon.min_lstm(input, 3, name: "l", candidate_activation: :g),
           fn p ->
             Fusex.Defn.minlstm(dense(x, p["f_kernel"], p["f_bias"]), dense(x, p["i_kernel"], p["i_bias"]),
               dense(x, p["h_kernel"], p["h_bias"]), %{}, candidate_activation: :g)
           end},
          {Fusex.Axon.liquid(input, 3, name: "l", dt: 0.25),
           fn p -> Fusex.Defn.liquid(dense(x, p["kernel"], p["bias"]), Nx.exp(p["log_tau"]), p["a"], %{}, dt: 0.25) end},
          {Fusex.Axon.selective_scan(input, name: "l", state_size: 3),
           fn p ->
             proj = Nx.dot(x, [2], p["x_proj"], [0])
             dt = proj |> Nx.slice_along_axis(0, 1, axis: 2) |> Nx.dot([2], p["dt_proj"], [0])
             b = Nx.slice_along_axis(proj, 1, 3, axis: 2)
             c = Nx.slice_along_axis(proj, 4, 3, axis: 2)
             a = Nx.negate(Nx.exp(p["a_log"]))
             Fusex.Defn.selective_scan(x, dt, a, b, c, %{d: p["d"], dt_bias: p["dt_bias"]}, dt_softplus: true)
           end}
        ] do
      {init_fn, predict_fn} = Axon.build(layer)
      state = init_fn.(Nx.template({2, 7, 5}, {:f, 32}), Axon.ModelState.empty())
      assert_close(predict_fn.(state, x), check.(state.data["l"]), 1.0e-6, inspect(Map.keys(state.data["l"])))
    end

    # bf16 inputs with f32 parameters: the projections follow the input's
    # type, and the values the f32 model's within bf16's rounding
    {init_fn, predict_fn} = Axon.build(Fusex.Axon.selective_scan(input, name: "l", state_size: 3))
    state = init_fn.(Nx.template({2, 7, 5}, {:f, 32}), Axon.ModelState.empty())
    y16 = predict_fn.(state, Nx.as_type(x, {:bf, 16}))
    assert y16.type == {:bf, 16}
    assert_close(Nx.as_type(y16, {:f, 32}), predict_fn.(state, x), 1.0e-2, "bf16 input")

    # Mamba's initialization: A = -(1 .. dstate), D = 1, dt = softplus(dt_bias) in [dt_min, dt_max]
    {init_fn, _} = Axon.build(Fusex.Axon.selective_scan(input, name: "l", state_size: 3))
    p = init_fn.(Nx.template({2, 7, 5}, {:f, 32}), Axon.ModelState.empty()).data["l"]
    assert_close(Nx.exp(p["a_log"]), Nx.tile(Nx.tensor([[1.0, 2.0, 3.0]]), [5, 1]), 1.0e-6, "a")
    assert Nx.to_flat_list(p["d"]) == List.duplicate(1.0, 5)
    dt = Nx.to_flat_list(Nx.log1p(Nx.exp(p["dt_bias"])))
    assert Enum.all?(dt, &(&1 >= 0.00099 and &1 <= 0.10001)), inspect(dt)
  end

  defp dense(x, k, b), do: x |> Nx.dot([2], k, [0]) |> Nx.add(b)

  # =====================================================================
  # every option out of range: an ArgumentError naming it
  # =====================================================================

  # Each layer's options and, for each, values it refuses with the message
  # they get (the layer's own checks, before Axon sees anything).
  @positive_integer "a positive integer"
  @boolean "true or false"
  @initializer "an Axon initializer (a function of Axon.Initializers by name, or a function of arity 2 or 3)"
  @name "nil, a string or a function of arity 2"

  defp layers do
    [
      {"selective_scan", &Fusex.Axon.selective_scan(&1, &2),
       [
         state_size: {@positive_integer, [0, -3, 1.5, nil, :many]},
         dt_rank: {"nil or a positive integer", [0, -1, 2.0, "2"]},
         dt_min: {"a positive number", [0, -1.0, :small, nil, Integer.pow(10, 400)]},
         dt_max: {"a number at least dt_min (0.001)", [0.0001, -1, :big]},
         kernel_initializer: {@initializer, [:bogus, nil, fn -> 0 end, 3]},
         name: {@name, [3, :ssm, fn x -> x end]}
       ]},
      {"min_gru", &Fusex.Axon.min_gru(&1, 4, &2),
       [
         reverse: {@boolean, [1, nil, "true"]},
         candidate_activation: {":identity or :g", [:tanh, "g", nil]},
         kernel_initializer: {@initializer, [:bogus]},
         bias_initializer: {@initializer, [:module_info, 0]},
         name: {@name, [3]}
       ]},
      {"min_lstm", &Fusex.Axon.min_lstm(&1, 4, &2),
       [
         reverse: {@boolean, [0]},
         candidate_activation: {":identity or :g", [:relu]},
         kernel_initializer: {@initializer, ["glorot_uniform"]},
         bias_initializer: {@initializer, [:bogus]}
       ]},
      {"liquid", &Fusex.Axon.liquid(&1, 4, &2),
       [
         reverse: {@boolean, [:yes]},
         dt: {"a positive number", [0, -0.5, nil, :fast, Integer.pow(10, 400)]},
         kernel_initializer: {@initializer, [:bogus]},
         bias_initializer: {@initializer, [:bogus]},
         a_initializer: {@initializer, [:bogus, 1.0]},
         name: {@name, [1]}
       ]}
    ]
  end

  test "every option of every layer out of range: an ArgumentError naming the option" do
    input = Axon.input("x", shape: {nil, @seqlen, @features})

    tried =
      for {layer, build, options} <- layers(), {option, {expected, values}} <- options, value <- values do
      message = "#{option}: expected #{expected}, got #{inspect(value, limit: 5, printable_limit: 80)}"

      err = assert_raise ArgumentError, fn -> build.(input, [{option, value}]) end
      assert err.message == message, "#{layer} #{option}: #{err.message}"
    end

    assert length(tried) > 40

    # an unknown option, options that are not a keyword list, units and
    # inputs that are not
    assert_raise ArgumentError, ~r/^opts: expected only the options name, reverse, candidate_activation, .*, got :units$/, fn ->
      Fusex.Axon.min_gru(input, 4, units: 3)
    end

    assert_raise ArgumentError, "opts: expected a keyword list, got %{}", fn -> Fusex.Axon.liquid(input, 4, %{}) end

    for units <- [0, -1, 2.0, nil, :four] do
      for build <- [&Fusex.Axon.min_gru/2, &Fusex.Axon.min_lstm/2, &Fusex.Axon.liquid/2] do
        assert_raise ArgumentError, "units: expected a positive integer, got #{inspect(units)}", fn -> build.(input, units) end
      end
    end

    assert_raise ArgumentError, "input: expected an %Axon{} layer, got :x", fn -> Fusex.Axon.selective_scan(:x) end
  end
end
