defmodule FusexModelAxonTest do
  # Fusex.Model.from_axon: small Axon models of Fusex.Axon layers, dense
  # layers and norms, trained a few steps in Axon.Loop.trainer with
  # Fusex.Optim.adamw, converted to fusex's resident model and served frame
  # by frame: every frame's output against the Axon model's output at that
  # time step over the whole sequence (rel-L2 <= 1e-5), and the window
  # (model_forward) likewise. Layers the model has not are ArgumentErrors
  # naming the layer. Seeded inputs (ExUnit's seed).
  use ExUnit.Case, async: false
  @moduletag :nx
  @moduletag :axon
  # (Axon.Loop logs its compiler options)
  @moduletag :capture_log
  @compile {:no_warn_undefined, [Nx, Nx.Defn, Nx.Defn.Composite, Axon, Axon.Loop, Axon.ModelState, Fusex.Axon, Fusex.Model, Fusex.Optim]}

  import Fusex.NxHelpers

  @batch 2
  @seqlen 6
  @features 3

  defp input, do: Axon.input("x", shape: {nil, @seqlen, @features})

  defp gru_dense do
    {seq, _state} = Fusex.Axon.gru(input(), 8, name: "gru")
    Axon.dense(seq, 4, name: "out")
  end

  defp min_gru_norm_dense do
    input()
    |> Fusex.Axon.min_gru(8, name: "mingru")
    |> Fusex.Axon.rms_norm(name: "norm")
    |> Axon.dense(4, activation: :silu, name: "out")
  end

  # The state layers' sequences taken from {sequence, state}.
  defp returned_states do
    {seq, _state} = Fusex.Axon.min_lstm(input(), 6, return_state: true, name: "minlstm")
    {seq, _state} = Fusex.Axon.min_gru(seq, 5, return_state: true, name: "mingru")
    seq = Fusex.Axon.gru(seq, 4, return_state: false, name: "gru")
    {seq, _state} = Fusex.Axon.lstm(seq, 3, use_bias: false, name: "lstm")
    Axon.dense(seq, 2, name: "out")
  end

  defp lstm_chain do
    {seq, _state} = input() |> Axon.dense(6, activation: :tanh) |> Fusex.Axon.lstm(8)

    seq
    |> Fusex.Axon.layer_norm()
    |> Axon.dense(5, activation: :relu)
    |> Axon.dense(2, activation: :sigmoid, use_bias: false)
  end

  # A few AdamW steps (fusex's fused step) toward a leaky running sum.
  defp train(model) do
    x = uniform({@batch, @seqlen, @features})
    out = model |> Axon.get_output_shape(Nx.template(x.shape, {:f, 32})) |> Nx.shape() |> elem(2)
    y = x |> Nx.sum(axes: [2], keep_axes: true) |> Nx.cumulative_sum(axis: 1) |> Nx.divide(@seqlen)
    y = Nx.broadcast(y, {@batch, @seqlen, out})
    {init_fn, _} = Axon.build(model)
    init = init_fn.(Nx.template(x.shape, {:f, 32}), Axon.ModelState.empty())

    trained =
      model
      |> Axon.Loop.trainer(:mean_squared_error, Fusex.Optim.adamw(learning_rate: 1.0e-2), log: 0)
      |> Axon.Loop.run(List.duplicate({x, y}, 4), init, epochs: 1, compiler: Nx.Defn.Evaluator)

    refute params_equal?(trained.data, init.data), "training left the parameters as they were"
    trained
  end

  defp params_equal?(a, b) do
    Nx.Defn.Composite.flatten_list([a])
    |> Enum.zip(Nx.Defn.Composite.flatten_list([b]))
    |> Enum.all?(fn {p, q} -> Nx.to_number(Nx.all(Nx.equal(p, q))) == 1 end)
  end

  defp check_served(label, model) do
    params = train(model)
    {_, predict} = Axon.build(model)
    x = uniform({@batch, @seqlen, @features})
    want = predict.(params, x)
    served = Fusex.Model.from_axon(model, params, device: :cpu)
    state = Fusex.Model.init_state(served, @batch)

    Enum.reduce(0..(@seqlen - 1), state, fn t, state ->
      frame = x |> Nx.slice_along_axis(t, 1, axis: 1) |> Nx.squeeze(axes: [1])
      {out, state} = Fusex.Model.step(served, state, frame)
      want_t = want |> Nx.slice_along_axis(t, 1, axis: 1) |> Nx.squeeze(axes: [1])
      assert_close(out, want_t, 1.0e-5, "#{label}: frame #{t}")
      state
    end)

    {window, _state} = Fusex.Model.forward(served, x)
    assert_close(window, want, 1.0e-5, "#{label}: window")
    served
  end

  test "input 3 -> Fusex.Axon.gru 8 -> dense 4: served frames equal the Axon model's time steps" do
    served = check_served("gru-dense", gru_dense())
    assert served.spec == %{input: 3, layers: [{:gru, %{hidden: 8}}, {:linear, %{out: 4, activation: :none, bias: true}}]}
  end

  test "min_gru -> rms_norm -> dense (silu): served frames equal the Axon model's" do
    served = check_served("mingru-norm-dense", min_gru_norm_dense())
    assert [{:mingru, %{hidden: 8}}, {:rms_norm, _}, {:linear, %{out: 4, activation: :silu}}] = served.spec.layers
  end

  test "min_lstm, min_gru with return_state: true, gru with return_state: false, lstm without bias: served" do
    served = check_served("returned-states", returned_states())

    assert [{:minlstm, %{hidden: 6}}, {:mingru, %{hidden: 5}}, {:gru, %{hidden: 4}}, {:lstm, %{hidden: 3}}, {:linear, %{out: 2}}] =
             served.spec.layers
  end

  test "dense (tanh) -> lstm -> layer_norm -> dense (relu) -> dense (sigmoid, no bias)" do
    served = check_served("lstm-chain", lstm_chain())

    assert [{:linear, %{activation: :tanh}}, {:lstm, %{hidden: 8}}, {:layer_norm, _}, {:linear, %{activation: :relu}},
            {:linear, %{activation: :sigmoid, bias: false}}] = served.spec.layers
  end

  defp init(model) do
    {init_fn, _} = Axon.build(model)
    init_fn.(Nx.template({@batch, @seqlen, @features}, {:f, 32}), Axon.ModelState.empty())
  end

  defp assert_refused(model, message) do
    params = init(model)
    error = assert_raise ArgumentError, fn -> Fusex.Model.from_axon(model, params, device: :cpu) end
    assert error.message =~ message
  end

  test "layers the resident model has not are ArgumentErrors naming the layer" do
    {seq, _} = Axon.gru(input(), 8, name: "axon_gru")
    assert_refused(Axon.dense(seq, 2), ~s|layer "axon_gru_output_sequence" (elem)|)

    assert_refused(input() |> Fusex.Axon.min_gru(4, reverse: true, name: "back") |> Axon.dense(1),
      ~s|layer "back" (fusex_min_gru): reverse: true|)

    assert_refused(input() |> Fusex.Axon.min_gru(4, candidate_activation: :g, name: "g") |> Axon.dense(1),
      ~s|layer "g" (fusex_min_gru): candidate_activation: :g|)

    assert_refused(input() |> Axon.dense(4, activation: :gelu, name: "d"), ~s|layer "gelu_0" (gelu)|)
    assert_refused(input() |> Axon.dense(4) |> Axon.softmax(name: "sm"), ~s|layer "sm" (softmax)|)
    assert_refused(input() |> Fusex.Axon.rms_norm(use_bias: true, name: "n"), ~s|layer "n" (fusex_rms_norm): use_bias|)

    x = input()
    assert_refused(Axon.add(Axon.dense(x, 3), Axon.dense(x, 3), name: "sum"), ~s|layer "sum" (add)|)

    {_seq, {h}} = Fusex.Axon.gru(input(), 4, name: "g2")
    assert_refused(h, "only the output sequence of a Fusex.Axon gru, lstm, min_gru or min_lstm layer is taken (not its state)")
    {_seq, {h}} = Fusex.Axon.min_gru(input(), 4, return_state: true)
    assert_refused(Axon.dense(h, 2), "(not its state)")

    # an initial state input: the resident model's states start at zeros
    h0 = Axon.input("h0", shape: {nil, 4})
    initial = ~s|an initial state input (the resident model's states start at zeros|

    for {name, model} <- [
          {"mg", input() |> Fusex.Axon.min_gru({h0}, 4, name: "mg") |> Axon.dense(1)},
          {"ml", input() |> Fusex.Axon.min_lstm({h0}, 4, name: "ml", return_state: true) |> elem(0) |> Axon.dense(1)},
          {"gs", input() |> Fusex.Axon.gru({h0}, 4, name: "gs") |> elem(0)}
        ] do
      {init_fn, _} = Axon.build(model)
      params = init_fn.(%{"x" => Nx.template({@batch, @seqlen, @features}, {:f, 32}), "h0" => Nx.template({@batch, 4}, {:f, 32})},
        Axon.ModelState.empty())

      error = assert_raise ArgumentError, fn -> Fusex.Model.from_axon(model, params, device: :cpu) end
      assert error.message =~ ~s|layer "#{name}"| and error.message =~ initial, error.message
    end


    assert_raise ArgumentError, ~r/model: expected an %Axon\{\} model/, fn -> Fusex.Model.from_axon(:nope, %{}) end
  end
end
