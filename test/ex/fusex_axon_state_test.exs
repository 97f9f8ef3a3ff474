defmodule FusexAxonStateTest do
  # The initial and final states of Fusex.Axon's stateful layers
  # (selective_scan, min_gru, min_lstm, liquid, causal_conv1d, gru, lstm):
  # a sequence run in two halves, the first half's final state fed as the
  # second half's initial state, equals the sequence run whole (outputs
  # and final state, f32, rel-L2 <= 1e-5; reversed layers from the end);
  # a zero initial state equals none; gradients reach the initial state
  # (central differences, f64) and cross the carried state (the halves'
  # gradients of every parameter and of the initial state equal the whole
  # run's); a state of the wrong form or shape is an ArgumentError naming
  # `state`. Awkward sizes; random parameters (no zero bias hides a
  # misplaced term); seeded inputs (ExUnit's seed). The layers run as
  # users get them (fusex's NIF under the Evaluator).
  use ExUnit.Case, async: false
  @moduletag :nx
  @moduletag :axon
  @compile {:no_warn_undefined, [Nx, Nx.Defn, Axon, Axon.ModelState, Fusex.Axon, Fusex.Defn]}

  import Fusex.NxHelpers
  import Fusex.DefnCase, only: [check_central_differences: 3]

  @batch 3
  @seqlen 19
  @features 6
  @units 5

  # Each family: its layer on input `x` from the state layers `state`
  # (nil: none) with options `opts`, the state's parts' shapes, and
  # whether it runs from the end.
  defp families do
    units = @units
    hidden = {@batch, units}

    [
      {"selective_scan", fn x, s, o -> ssm(x, s, [state_size: 4] ++ o) end, [{@batch, @features, 4}], false},
      {"min_gru", fn x, s, o -> rec(&Fusex.Axon.min_gru/3, &Fusex.Axon.min_gru/4, x, s, [candidate_activation: :g] ++ o) end,
       [hidden], false},
      {"min_gru reversed", fn x, s, o -> rec(&Fusex.Axon.min_gru/3, &Fusex.Axon.min_gru/4, x, s, [reverse: true] ++ o) end,
       [hidden], true},
      {"min_lstm", fn x, s, o -> rec(&Fusex.Axon.min_lstm/3, &Fusex.Axon.min_lstm/4, x, s, o) end, [hidden], false},
      {"liquid", fn x, s, o -> rec(&Fusex.Axon.liquid/3, &Fusex.Axon.liquid/4, x, s, [dt: 0.5] ++ o) end, [hidden], false},
      {"liquid reversed", fn x, s, o -> rec(&Fusex.Axon.liquid/3, &Fusex.Axon.liquid/4, x, s, [reverse: true] ++ o) end,
       [hidden], true},
      {"causal_conv1d", fn x, s, o -> conv(x, s, [width: 4, activation: :silu] ++ o) end, [{@batch, @features, 3}], false},
      {"gru", fn x, s, o -> rec(&Fusex.Axon.gru/3, &Fusex.Axon.gru/4, x, s, o) end, [hidden], false},
      {"lstm", fn x, s, o -> rec(&Fusex.Axon.lstm/3, &Fusex.Axon.lstm/4, x, s, o) end, [hidden, hidden], false}
    ]
  end

  defp ssm(x, nil, opts), do: Fusex.Axon.selective_scan(x, opts)
  defp ssm(x, state, opts), do: Fusex.Axon.selective_scan(x, state, opts)
  defp conv(x, nil, opts), do: Fusex.Axon.causal_conv1d(x, opts)
  defp conv(x, state, opts), do: Fusex.Axon.causal_conv1d(x, state, opts)
  defp rec(f3, _f4, x, nil, opts), do: f3.(x, @units, opts)
  defp rec(_f3, f4, x, state, opts), do: f4.(x, state, @units, opts)

  # The family's layer as a model of inputs "x" and "s0", "s1", ... (its
  # state's parts), with outputs {sequence, {final state parts}}; without
  # a state input where `stateful` is false.
  defp model(build, shapes, stateful) do
    x = Axon.input("x", shape: {nil, nil, @features})

    state =
      if stateful,
        do: shapes |> Enum.with_index() |> Enum.map(fn {s, i} -> Axon.input("s#{i}", shape: put_elem(s, 0, nil)) end) |> List.to_tuple()

    {seq, final} = build.(x, state, name: "l", return_state: true)
    Axon.container({seq, final})
  end

  defp inputs(x, states), do: states |> Enum.with_index() |> Map.new(fn {s, i} -> {"s#{i}", s} end) |> Map.put("x", x)

  # The layer's parameters, each moved off its initial value by a random
  # amount (so that a zero bias hides nothing), in `type`; `shapes` the
  # state inputs' (none: a model of "x" alone).
  defp params(model, shapes, type) do
    {init_fn, _} = Axon.build(model)
    templates = inputs(Nx.template({@batch, @seqlen, @features}, {:f, 32}), Enum.map(shapes, &Nx.template(&1, {:f, 32})))
    state = init_fn.(templates, Axon.ModelState.empty())

    %{state | data: perturb(state.data, type)}
  end

  # (GRU and LSTM parameters are maps of tensors)
  defp perturb(%{__struct__: Nx.Tensor} = t, type), do: t |> Nx.add(Nx.multiply(uniform(t.shape), 0.3)) |> Nx.as_type(type)
  defp perturb(%{} = map, type), do: Map.new(map, fn {k, v} -> {k, perturb(v, type)} end)

  defp halves(x, k, reverse) do
    {first, second} = {Nx.slice_along_axis(x, 0, k, axis: 1), Nx.slice_along_axis(x, k, @seqlen - k, axis: 1)}
    if reverse, do: {second, first}, else: {first, second}
  end

  # The outputs in time order from the halves' outputs in run order.
  defp joined(y1, y2, false), do: Nx.concatenate([y1, y2], axis: 1)
  defp joined(y1, y2, true), do: Nx.concatenate([y2, y1], axis: 1)

  test "every stateful layer: two halves, the first's final state the second's initial state, equal the whole sequence" do
    # fusex's NIF (what runs under the Evaluator) and the plain-Nx code
    # (what runs under a compiler without custom calls)
    for impl <- [:auto, :nx], {label, build, shapes, reverse} <- families(), k <- [2, 11] do
      label = "#{label} (#{impl})"
      m = model(build, shapes, true)
      p = params(m, shapes, {:f, 32})
      {_, predict} = Axon.build(m)
      predict = fn p, inputs -> Fusex.Defn.with_implementation(impl, fn -> predict.(p, inputs) end) end
      x = uniform({@batch, @seqlen, @features})
      s0 = Enum.map(shapes, &uniform/1)

      {y, final} = predict.(p, inputs(x, s0))
      {x1, x2} = halves(x, k, reverse)
      {y1, s1} = predict.(p, inputs(x1, s0))
      {y2, s2} = predict.(p, inputs(x2, Tuple.to_list(s1)))

      assert y.shape == {@batch, @seqlen, elem(y.shape, 2)}
      assert_close(joined(y1, y2, reverse), y, 1.0e-5, "#{label} split at #{k}: outputs")

      for {got, want, i} <- Enum.zip([Tuple.to_list(s2), Tuple.to_list(final), Enum.to_list(0..(length(shapes) - 1))]) do
        assert got.shape == Enum.at(shapes, i), "#{label}: final state part #{i} of shape #{inspect(got.shape)}"
        assert_close(got, want, 1.0e-5, "#{label} split at #{k}: final state part #{i}")
      end
    end
  end

  test "every stateful layer: a zero initial state equals no state, and the final state is returned either way" do
    for {label, build, shapes, _reverse} <- families() do
      with_state = model(build, shapes, true)
      without = model(build, shapes, false)
      p = params(with_state, shapes, {:f, 32})
      {_, predict} = Axon.build(with_state)
      {_, predict_none} = Axon.build(without)
      x = uniform({@batch, @seqlen, @features})

      {y, final} = predict.(p, inputs(x, Enum.map(shapes, &Nx.broadcast(0.0, &1))))
      {y0, final0} = predict_none.(p, %{"x" => x})
      assert_close(y0, y, 1.0e-6, "#{label}: outputs")

      for {a, b} <- Enum.zip(Tuple.to_list(final0), Tuple.to_list(final)),
          do: assert_close(a, b, 1.0e-6, "#{label}: final state")

      # and a non-zero state changes the outputs (the state is read)
      {y1, _} = predict.(p, inputs(x, Enum.map(shapes, &uniform/1)))
      assert rel_l2(y1, y) > 1.0e-3, "#{label}: the initial state left the outputs as they were"
    end
  end

  test "the sequence alone without return_state (gru and lstm: with return_state: false)" do
    x = Axon.input("x", shape: {nil, nil, @features})

    for {label, build, _shapes, _reverse} <- families() do
      {seq, _final} = build.(x, nil, name: "l", return_state: true)
      alone = build.(x, nil, name: "l", return_state: false)
      assert is_struct(alone, Axon), "#{label}: #{inspect(alone, limit: 3)}"
      p = params(seq, [], {:f, 32})
      {_, predict_seq} = Axon.build(seq)
      {_, predict_alone} = Axon.build(alone)
      xs = uniform({@batch, @seqlen, @features})
      assert_close(predict_alone.(p, xs), predict_seq.(p, xs), 1.0e-6, label)
    end

    # the layers that pipe return the sequence by default, gru and lstm
    # {sequence, state} as Axon's
    # (map patterns: the suite compiles, and is listed as skipped, without Axon)
    assert %{__struct__: Axon} = Fusex.Axon.min_gru(x, 4)
    assert %{__struct__: Axon} = Fusex.Axon.causal_conv1d(x)
    assert {%{__struct__: Axon}, {%{__struct__: Axon}}} = Fusex.Axon.gru(x, 4)
    assert {%{__struct__: Axon}, {%{__struct__: Axon}, %{__struct__: Axon}}} = Fusex.Axon.lstm(x, 4)
  end

  test "gradients reach the initial state: against central differences (f64)" do
    for {label, build, shapes, _reverse} <- families() do
      m = model(build, shapes, true)
      p = params(m, shapes, {:f, 64})
      {_, predict} = Axon.build(m)
      x = uniform({@batch, 7, @features}, {:f, 64})
      s0 = shapes |> Enum.map(&uniform(&1, {:f, 64})) |> List.to_tuple()
      {y, _} = predict.(p, inputs(x, Tuple.to_list(s0)))
      w = uniform(y.shape, {:f, 64})
      ws = Enum.map(shapes, &uniform(&1, {:f, 64}))

      loss = fn s0 ->
        {y, final} = predict.(p, inputs(x, Tuple.to_list(s0)))
        final |> Tuple.to_list() |> Enum.zip(ws) |> Enum.reduce(dot(y, w), fn {s, v}, acc -> Nx.add(acc, dot(s, v)) end)
      end

      # (a state that were not read would pass the differences: both zero)
      ds = Nx.Defn.jit(fn s0 -> Nx.Defn.grad(s0, loss) end).(s0)
      for g <- Tuple.to_list(ds), do: assert(Nx.to_number(Nx.sum(Nx.abs(g))) > 0, "#{label}: the state got no gradient")
      check_central_differences(label, s0, loss)
    end
  end

  test "gradients cross the carried state: the halves' gradients of every parameter and the initial state equal the whole's (f64)" do
    for {label, build, shapes, reverse} <- families() do
      m = model(build, shapes, true)
      p = params(m, shapes, {:f, 64})
      {_, predict} = Axon.build(m)
      x = uniform({@batch, @seqlen, @features}, {:f, 64})
      {x1, x2} = halves(x, 8, reverse)
      s0 = shapes |> Enum.map(&uniform(&1, {:f, 64})) |> List.to_tuple()
      {y, _} = predict.(p, inputs(x, Tuple.to_list(s0)))
      w = uniform(y.shape, {:f, 64})
      ws = Enum.map(shapes, &uniform(&1, {:f, 64}))

      state_loss = fn final, acc ->
        final |> Tuple.to_list() |> Enum.zip(ws) |> Enum.reduce(acc, fn {s, v}, acc -> Nx.add(acc, dot(s, v)) end)
      end

      whole = fn {data, s0} ->
        {y, final} = predict.(%{p | data: data}, inputs(x, Tuple.to_list(s0)))
        state_loss.(final, dot(y, w))
      end

      split = fn {data, s0} ->
        q = %{p | data: data}
        {y1, s1} = predict.(q, inputs(x1, Tuple.to_list(s0)))
        {y2, final} = predict.(q, inputs(x2, Tuple.to_list(s1)))
        state_loss.(final, dot(joined(y1, y2, reverse), w))
      end

      grad = fn loss -> Nx.Defn.jit(fn args -> Nx.Defn.grad(args, loss) end).({p.data, s0}) end
      {dp_whole, ds_whole} = grad.(whole)
      {dp_split, ds_split} = grad.(split)

      for {{name, g}, {_, g_split}} <- Enum.zip(leaves(dp_whole["l"], ""), leaves(dp_split["l"], "")) do
        assert Nx.to_number(Nx.sum(Nx.abs(g))) > 0, "#{label}: #{name} got no gradient"
        assert_close(g_split, g, 1.0e-9, "#{label}: d#{name}")
      end

      for {a, b} <- Enum.zip(Tuple.to_list(ds_split), Tuple.to_list(ds_whole)),
          do: assert_close(a, b, 1.0e-9, "#{label}: dstate")
    end
  end

  # [{path, tensor}] of a parameter map, in key order.
  defp leaves(%{__struct__: Nx.Tensor} = t, path), do: [{path, t}]
  defp leaves(%{} = map, path), do: map |> Enum.sort() |> Enum.flat_map(fn {k, v} -> leaves(v, path <> "." <> k) end)

  test "a state of the wrong form or shape: an ArgumentError naming state" do
    x = Axon.input("x", shape: {nil, nil, @features})
    s = Axon.input("s", shape: {nil, @units})

    # the form, when the layer is built
    for {f, form} <- [
          {&Fusex.Axon.min_gru(x, &1, 4, []), "{h}"},
          {&Fusex.Axon.min_lstm(x, &1, 4, []), "{h}"},
          {&Fusex.Axon.liquid(x, &1, 4, []), "{h}"},
          {&Fusex.Axon.selective_scan(x, &1, []), "{state}"},
          {&Fusex.Axon.causal_conv1d(x, &1, []), "{state}"}
        ],
        bad <- [s, {s, s}, {:s}, :s, {}] do
      assert_raise ArgumentError, "state: expected #{form} of an %Axon{} layer, got #{inspect(bad, limit: 5, printable_limit: 80)}",
                   fn -> f.(bad) end
    end

    # the shape, when the model runs: Axon reports the layer's
    # ArgumentError in its Axon.CompileError
    for {label, build, shapes, _reverse} <- families(), {part, i} <- Enum.with_index(shapes) do
      m = model(build, shapes, true)
      p = params(m, shapes, {:f, 32})
      {_, predict} = Axon.build(m)
      xs = uniform({@batch, 4, @features})
      bad_shapes = [put_elem(part, tuple_size(part) - 1, elem(part, tuple_size(part) - 1) + 1), put_elem(part, 0, @batch + 1),
                    Tuple.delete_at(part, 0)]

      for bad <- bad_shapes do
        states = shapes |> Enum.map(&Nx.broadcast(0.0, &1)) |> List.replace_at(i, Nx.broadcast(0.0, bad))
        err = assert_raise Axon.CompileError, fn -> predict.(p, inputs(xs, states)) end
        assert %ArgumentError{message: message} = err.exception
        assert message == "state: expected shape #{text(part)} (#{layout(label)}), got #{text(bad)}", "#{label}: #{message}"
      end
    end
  end

  defp text(shape), do: "{" <> Enum.map_join(Tuple.to_list(shape), ",", &Integer.to_string/1) <> "}"

  defp layout("selective_scan"), do: "[batch, dim, dstate]"
  defp layout("causal_conv1d"), do: "[batch, dim, width - 1]"
  defp layout(_), do: "[batch, units]"

  test "return_state out of range: an ArgumentError naming it" do
    x = Axon.input("x", shape: {nil, nil, @features})

    for {_label, build, _shapes, _reverse} <- families(), value <- [1, nil, "true"] do
      assert_raise ArgumentError, "return_state: expected true or false, got #{inspect(value)}", fn ->
        build.(x, nil, return_state: value)
      end
    end
  end
end
