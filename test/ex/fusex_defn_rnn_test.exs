defmodule FusexDefnRNNTest do
  # Fusex.Defn's GRU and LSTM inside defn (jit under the Evaluator: the
  # default implementations of their blocks), against the Erlang API on
  # the cpu backend (fusex's f64 oracle) and central differences in f64;
  # awkward shapes (hidden 1 and 37, input unlike hidden, 1 and 3 layers,
  # batches of 1 and 3), with and without h0 and c0; steps against the
  # forward; bad input with the Erlang API's message; the blocks; the
  # Axon layers against Axon's own GRU and LSTM on the same parameters;
  # the eager Fusex functions. Runs where Nx is present; listed as skipped
  # elsewhere.
  use ExUnit.Case, async: false
  @moduletag :nx
  @compile {:no_warn_undefined, [Nx, Nx.Defn, Fusex.Defn, Fusex.Axon, Axon, Axon.ModelState]}

  import Fusex.NxHelpers
  import Fusex.DefnCase

  defp gates(:gru), do: 3
  defp gates(:lstm), do: 4

  defp layers(cell, input, hidden, n, type) do
    g = gates(cell) * hidden
    s = 1 / :math.sqrt(hidden)

    for l <- 0..(n - 1) do
      %{
        w_ih: uniform({g, if(l == 0, do: input, else: hidden)}, type, -s, s),
        w_hh: uniform({g, hidden}, type, -s, s),
        b_ih: uniform({g}, type, -s, s),
        b_hh: uniform({g}, type, -s, s)
      }
    end
  end

  defp call(:gru, x, layers, tensors), do: Fusex.Defn.gru(x, layers, tensors, return_state: true)

  defp call(:lstm, x, layers, tensors) do
    {y, {h, c}} = Fusex.Defn.lstm(x, layers, tensors, return_state: true)
    {y, h, c}
  end

  # {outputs, gradients of x, the layers and the tensors given}.
  defp defn_run(cell, x, layers, tensors, cots) do
    f = fn x, layers, tensors -> call(cell, x, Tuple.to_list(layers), tensors) end
    out = Nx.Defn.jit(f).(x, List.to_tuple(layers), tensors)

    grads =
      Nx.Defn.jit(fn x, layers, tensors, cots ->
        Nx.Defn.grad({x, layers, tensors}, fn {x, layers, tensors} ->
          f.(x, layers, tensors) |> Tuple.to_list() |> Enum.zip(Tuple.to_list(cots)) |> Enum.map(fn {o, w} -> dot(o, w) end)
          |> Enum.reduce(&Nx.add/2)
        end)
      end).(x, List.to_tuple(layers), tensors, cots)

    {out, grads}
  end

  defp erl_layers(layers), do: Enum.map(layers, fn l -> Map.new(l, fn {k, v} -> {k, erl(v)} end) end)

  defp erl_run(cell, x, layers, tensors, cots) do
    opts = Map.merge(Map.new(tensors, fn {k, v} -> {k, erl(v)} end), %{return_state: true, save_for_backward: true})

    case cell do
      :gru ->
        {y, h, ctx} = :fusex.gru(erl(x), erl_layers(layers), opts)
        {dy, dh} = cots
        {{nx(y), nx(h)}, :fusex.gru_backward(erl(dy), ctx, %{dh_n: erl(dh)})}

      :lstm ->
        {y, {h, c}, ctx} = :fusex.lstm(erl(x), erl_layers(layers), opts)
        {dy, dh, dc} = cots
        {{nx(y), nx(h), nx(c)}, :fusex.lstm_backward(erl(dy), ctx, %{dh_n: erl(dh), dc_n: erl(dc)})}
    end
  end

  defp check_rnn(cell, {batch, len, input, hidden, n} = dims, type, given) do
    label = "#{cell} #{inspect(dims)} #{inspect(type)} #{inspect(given)}"
    st = state_type(type)
    x = uniform({batch, len, input}, type)
    ls = layers(cell, input, hidden, n, type)
    all = %{h0: uniform({n, batch, hidden}, st, -0.5, 0.5), c0: uniform({n, batch, hidden}, st, -0.5, 0.5)}
    tensors = Map.take(all, given)
    outs = [uniform({batch, len, hidden}, type), uniform({n, batch, hidden}, st)] ++
             if(cell == :lstm, do: [uniform({n, batch, hidden}, st)], else: [])
    cots = List.to_tuple(outs)
    {out, {dx, dlayers, dtensors}} = defn_run(cell, x, ls, tensors, cots)
    {want, grads} = erl_run(cell, x, ls, tensors, cots)
    t = tol(type)

    for {g, w} <- Enum.zip(Tuple.to_list(out), Tuple.to_list(want)), do: assert_close(g, w, t, label <> " outputs")
    assert_close(dx, nx(grads.x), t, label <> " dx")

    for {{dl, wl}, l} <- Enum.with_index(Enum.zip(Tuple.to_list(dlayers), grads.layers)), k <- [:w_ih, :w_hh, :b_ih, :b_hh] do
      assert_close(dl[k], nx(wl[k]), t, "#{label} layers[#{l}].#{k}")
    end

    for k <- given, do: assert_close(dtensors[k], nx(grads[k]), t, "#{label} d#{k}")
  end

  test "gru and lstm in defn: outputs and every gradient against the Erlang API" do
    for cell <- [:gru, :lstm],
        {dims, type, given} <- [
          {{1, 1, 1, 1, 1}, {:f, 64}, []},
          {{3, 4, 5, 37, 1}, {:f, 64}, [:h0]},
          {{2, 3, 3, 5, 3}, {:f, 64}, [:h0, :c0]},
          {{1, 5, 2, 4, 2}, {:f, 32}, [:c0]},
          {{3, 2, 4, 3, 3}, {:f, 32}, []}
        ] do
      check_rnn(cell, dims, type, if(cell == :gru, do: given -- [:c0], else: given))
    end
  end

  test "gru and lstm in defn: gradients against central differences (f64)" do
    for cell <- [:gru, :lstm] do
      [l0, l1] = layers(cell, 3, 4, 2, {:f, 64})
      x = uniform({2, 3, 3}, {:f, 64})
      h0 = uniform({2, 2, 4}, {:f, 64})
      w = uniform({2, 3, 4}, {:f, 64})

      loss = fn {x, wi, wh, bi, bh, h0} ->
        layers = [%{w_ih: wi, w_hh: wh, b_ih: bi, b_hh: bh}, l1]
        y = if cell == :gru, do: Fusex.Defn.gru(x, layers, %{h0: h0}), else: Fusex.Defn.lstm(x, layers, %{h0: h0})
        dot(y, w)
      end

      check_central_differences("#{cell}", {x, l0.w_ih, l0.w_hh, l0.b_ih, l0.b_hh, h0}, loss)
    end
  end

  test "Fusex.Axon.gru and lstm refuse bad units, options and states with an ArgumentError naming them" do
    inp = Axon.input("x", shape: {nil, 3, 2})

    for f <- [&Fusex.Axon.gru/3, &Fusex.Axon.lstm/3] do
      assert_raise ArgumentError, "units: expected a positive integer, got 0", fn -> f.(inp, 0, []) end
      assert_raise ArgumentError, "units: expected a positive integer, got :x", fn -> f.(inp, :x, []) end
      assert_raise ArgumentError, ~r/^activation: expected :tanh/, fn -> f.(inp, 4, activation: :relu) end
    end

    assert_raise ArgumentError, ~r/^state: expected \{hidden\} of %Axon\{\} layers, got :nope/, fn ->
      Fusex.Axon.gru(inp, :nope, 4, [])
    end

    assert_raise ArgumentError, ~r/^state: expected \{cell, hidden\} of %Axon\{\} layers/, fn ->
      Fusex.Axon.lstm(inp, {:a}, 4, [])
    end
  end

  test "second derivatives through gru and lstm are refused at trace time" do
    for cell <- [:gru, :lstm] do
      [l0] = layers(cell, 3, 4, 1, {:f, 64})
      x = uniform({2, 3, 3}, {:f, 64})

      assert_second_order_refused(cell, {x, l0.w_ih, l0.w_hh, l0.b_ih, l0.b_hh}, fn {x, wi, wh, bi, bh} ->
        layers = [%{w_ih: wi, w_hh: wh, b_ih: bi, b_hh: bh}]
        if cell == :gru, do: Fusex.Defn.gru(x, layers, %{}), else: Fusex.Defn.lstm(x, layers, %{})
      end)
    end
  end

  test "steps equal the forward" do
    for cell <- [:gru, :lstm], {batch, len, input, hidden, n} <- [{1, 3, 2, 1, 1}, {3, 4, 5, 37, 3}] do
      x = uniform({batch, len, input}, {:f, 32})
      ls = layers(cell, input, hidden, n, {:f, 32})
      h0 = uniform({n, batch, hidden}, {:f, 32})
      c0 = uniform({n, batch, hidden}, {:f, 32})
      tensors = if cell == :gru, do: %{h0: h0}, else: %{h0: h0, c0: c0}
      want = Nx.Defn.jit(fn x, l, t -> call(cell, x, Tuple.to_list(l), t) end).(x, List.to_tuple(ls), tensors)

      {ys, state} =
        Enum.reduce(0..(len - 1), {[], if(cell == :gru, do: h0, else: {h0, c0})}, fn t, {ys, state} ->
          xt = x |> Nx.slice_along_axis(t, 1, axis: 1) |> Nx.squeeze(axes: [1])

          {y, state} =
            case cell do
              :gru -> Nx.Defn.jit(&Fusex.Defn.gru_step(&1, &2, Tuple.to_list(&3))).(state, xt, List.to_tuple(ls))
              :lstm -> Nx.Defn.jit(&Fusex.Defn.lstm_step(&1, &2, Tuple.to_list(&3))).(state, xt, List.to_tuple(ls))
            end

          {[y | ys], state}
        end)

      label = "#{cell} steps"
      assert_close(Nx.stack(Enum.reverse(ys), axis: 1), elem(want, 0), 1.0e-5, label)

      case state do
        {h, c} -> assert_close(h, elem(want, 1), 1.0e-5, label) && assert_close(c, elem(want, 2), 1.0e-5, label)
        h -> assert_close(h, elem(want, 1), 1.0e-5, label)
      end
    end
  end

  test "bad input raises the Erlang API's message" do
    x = uniform({2, 3, 5})
    [l0, l1] = layers(:gru, 5, 4, 2, {:f, 32})
    bad = %{l1 | w_hh: uniform({12, 5})}
    want = erl_message(fn -> :fusex.gru(erl(x), erl_layers([l0, bad]), %{}) end)
    assert want == "layers[1].w_hh: expected shape {12,4} ([3*hidden, hidden]), got {12,5}"
    err = assert_raise ArgumentError, fn -> Nx.Defn.jit(fn x -> Fusex.Defn.gru(x, [l0, bad]) end).(x) end
    assert err.message == want

    h = uniform({1, 2, 4})
    want = erl_message(fn -> :fusex.gru(erl(x), erl_layers([l0, l1]), %{h0: erl(h)}) end)
    err = assert_raise ArgumentError, fn -> Fusex.Defn.gru(x, [l0, l1], %{h0: h}) end
    assert err.message == want

    assert_raise ArgumentError, ~r/^layers: expected a non-empty list or tuple of maps/, fn -> Fusex.Defn.gru(x, []) end
    assert_raise ArgumentError, ~r/^layers\[0\]\.b_hh: expected a tensor/, fn -> Fusex.Defn.gru(x, [Map.delete(l0, :b_hh)]) end
    assert_raise ArgumentError, ~r/^state: expected a tuple \{h, c\}/, fn -> Fusex.Defn.lstm_step(h, x, [l0]) end
  end

  test "the blocks: fusex_gru_fwd and fusex_gru_bwd with the layers' slots" do
    x = uniform({2, 3, 5})
    ls = layers(:gru, 5, 4, 2, {:f, 32})
    expr = Nx.Defn.debug_expr(fn x -> Nx.Defn.grad(x, fn x -> Nx.sum(Fusex.Defn.gru(x, ls)) end) end).(x)
    text = inspect(expr, limit: :infinity)
    assert text =~ "fusex_gru_fwd" or text =~ "direction: :fwd"
  end

  test "under EXLA: the blocks a trace holds lower to fusex_gru_* and fusex_lstm_* with their slots" do
    alias Fusex.Defn.{Block, XLA}
    XLA.__put_registration__(:ok)

    try do
      t = fn shape -> Nx.template(shape, {:f, 32}) end
      layer = fn cell, input -> [t.({gates(cell) * 4, input}), t.({gates(cell) * 4, 4}), t.({gates(cell) * 4}), t.({gates(cell) * 4})] end
      fwd = %Block{op: :gru, direction: :fwd, attrs: [layers: 2.0, has_h0: 1, return_state: 1, save: 1]}
      args = [t.({2, 3, 5}), t.({2, 2, 4})] ++ layer.(:gru, 5) ++ layer.(:gru, 4)
      assert {:ok, "fusex_gru_fwd", attrs} = XLA.lowering(fwd, args, :host)
      assert {"layers", "2.0 : f64"} in attrs
      # a layer's parameter of the wrong shape: the handler would refuse it, the default runs
      assert XLA.lowering(fwd, List.replace_at(args, 7, t.({12, 5})), :host) == :skip
      # an operand missing for the layers the attribute says
      assert XLA.lowering(fwd, Enum.drop(args, -1), :host) == :skip

      step = %Block{op: :lstm, direction: :step, attrs: [layers: 1.0]}
      assert {:ok, "fusex_lstm_step", _} = XLA.lowering(step, [t.({1, 2, 4}), t.({1, 2, 4}), t.({2, 5})] ++ layer.(:lstm, 5), :host)
    after
      XLA.__put_registration__(nil)
    end
  end

  # ---- the Axon layers ----

  test "Fusex.Axon.gru and lstm drop in for Axon.gru and Axon.lstm: same parameters, same outputs" do
    for cell <- [:gru, :lstm] do
      inp = Axon.input("x", shape: {nil, 5, 3})
      h = Axon.input("h", shape: {nil, 4})
      c = Axon.input("c", shape: {nil, 4})

      {axon_seq, axon_state, ours_seq, ours_state} =
        case cell do
          :gru ->
            {s1, {h1}} = Axon.gru(inp, {h}, 4, name: "rnn")
            {s2, {h2}} = Fusex.Axon.gru(inp, {h}, 4, name: "rnn")
            {s1, h1, s2, h2}

          :lstm ->
            {s1, {_c1, h1}} = Axon.lstm(inp, {c, h}, 4, name: "rnn")
            {s2, {_c2, h2}} = Fusex.Axon.lstm(inp, {c, h}, 4, name: "rnn")
            {s1, h1, s2, h2}
        end

      axon = Axon.container({axon_seq, axon_state})
      ours = Axon.container({ours_seq, ours_state})
      {init, predict} = Axon.build(axon)
      {_init, ours_predict} = Axon.build(ours)
      inputs = %{"x" => uniform({2, 5, 3}), "h" => uniform({2, 4}), "c" => uniform({2, 4})}
      params = init.(inputs, Axon.ModelState.empty())
      # non-zero biases: Axon's zeros would hide a misplaced one
      params =
        update_in(params.data["rnn"]["bias"], fn b -> Map.new(b, fn {k, v} -> {k, uniform(v.shape)} end) end)

      {want_seq, want_h} = predict.(params, inputs)
      {seq, h_n} = ours_predict.(params, inputs)
      assert_close(seq, want_seq, 1.0e-5, "#{cell} output sequence")
      assert_close(h_n, want_h, 1.0e-5, "#{cell} final hidden state")
    end
  end

  # ---- eager ----

  test "Fusex.gru, lstm and their steps on Nx tensors" do
    x = uniform({2, 3, 5})
    [l0] = layers(:gru, 5, 4, 1, {:f, 32})
    y = Fusex.gru(x, [l0])
    want = Nx.Defn.jit(fn x, l -> Fusex.Defn.gru(x, [l]) end).(x, l0)
    assert_close(y, want, 1.0e-5, "eager gru")
    [m0] = layers(:lstm, 5, 4, 1, {:f, 32})
    {y, {hn, cn}} = Fusex.lstm(x, [m0], return_state: true)
    assert Nx.shape(y) == {2, 3, 4} and Nx.shape(hn) == {1, 2, 4} and Nx.shape(cn) == {1, 2, 4}
    h = Fusex.Tensor.from_nx(Nx.broadcast(0.0, {1, 2, 4}), device: :cpu)
    {yt, h2} = Fusex.gru_step(h, x[[.., 0, ..]], [l0])
    assert h2.ref == h.ref
    want = Nx.Defn.jit(fn x, l -> Fusex.Defn.gru(x, [l]) end).(x[[.., 0..0, ..]], l0)
    assert_close(Fusex.Tensor.to_nx(yt), Nx.squeeze(want, axes: [1]), 1.0e-5, "eager gru_step")
  end
end
