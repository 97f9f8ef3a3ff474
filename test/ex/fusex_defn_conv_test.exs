defmodule FusexDefnConvTest do
  # Fusex.Defn's causal depthwise convolution (causal_conv1d and its step)
  # inside defn (jit under the Evaluator, the default implementations of
  # its blocks): values and the gradient of every argument against the
  # Erlang API on the cpu backend (fusex's kernels) and against central
  # differences in f64; every option, awkward shapes (D 1, 37; W 1, 3, 4,
  # 7; L 1, 2, W - 1), 16-bit and f64 inputs, steps, second derivatives,
  # bad input, the blocks. Runs where Nx is present; listed as skipped
  # elsewhere. The shared pieces are Fusex.DefnCase's.
  use ExUnit.Case, async: false
  @moduletag :nx
  @compile {:no_warn_undefined, [Nx, Nx.Defn, Fusex.Defn]}

  import Fusex.NxHelpers
  import Fusex.DefnCase
  # the pure-Nx code; the NIF's runs: fusex_defn_runtime_test.exs
  setup :pure_nx
  alias Fusex.Defn.Block

  # {options, tensors} for x [batch, seqlen, dim] and width: every option
  # alone and together.
  # (Nx has no empty axes: width 1, whose states are [batch, dim, 0],
  # takes none.)
  defp conv_cases({_batch, _seqlen, dim}, 1, type), do: [{[], %{}}, {[activation: :silu], %{bias: uniform({dim}, type)}}]

  defp conv_cases({batch, _seqlen, dim}, width, type) do
    bias = uniform({dim}, type)
    init = uniform({batch, dim, width - 1}, type)

    [
      {[], %{}},
      {[activation: :silu], %{bias: bias}},
      {[return_state: true], %{initial_state: init}},
      {[activation: :silu, return_state: true], %{bias: bias, initial_state: init}},
      {[activation: :none, return_state: true], %{}}
    ]
  end

  defp defn_conv_run(x, w, tensors, opts, dy, ds) do
    return_state = Keyword.get(opts, :return_state, false)
    fwd = Nx.Defn.jit(fn x, w, tensors -> Fusex.Defn.causal_conv1d(x, w, tensors, opts) end)

    grad =
      Nx.Defn.jit(fn x, w, tensors, dy, ds ->
        Nx.Defn.grad({x, w, tensors}, fn {x, w, tensors} ->
          case Fusex.Defn.causal_conv1d(x, w, tensors, opts) do
            {y, state} when return_state -> Nx.add(dot(y, dy), dot(state, ds))
            y -> dot(y, dy)
          end
        end)
      end)

    ds = ds || Nx.tensor(0.0)
    {fwd.(x, w, tensors), grad.(x, w, tensors, dy, ds)}
  end

  defp erl_conv_run(x, w, tensors, opts, dy, ds) do
    eopts = erl_opts(tensors, opts) |> Map.put(:save_for_backward, true)

    {y, state, ctx} =
      case :fusex.causal_conv1d(erl(x), erl(w), eopts) do
        {y, state, ctx} -> {y, state, ctx}
        {y, ctx} -> {y, nil, ctx}
      end

    bopts = if state, do: %{dfinal_state: erl(ds)}, else: %{}
    grads = :fusex.causal_conv1d_backward(erl(dy), ctx, bopts)
    {nx(y), state && nx(state), Map.new(grads, fn {k, v} -> {k, nx(v)} end)}
  end

  defp check_conv({batch, _, dim} = shape, width, type, {opts, tensors}, wtype \\ nil) do
    label = "causal_conv1d #{inspect(type)} #{inspect(shape)} W#{width} #{inspect(opts)} #{inspect(Map.keys(tensors))}"
    x = uniform(shape, type)
    w = uniform({dim, width}, wtype || type)
    dy = uniform(shape, type)
    ds = if width > 1, do: uniform({batch, dim, width - 1}, type)
    {out, {dx, dw, dtensors}} = defn_conv_run(x, w, tensors, opts, dy, ds)
    {want_y, want_state, want} = erl_conv_run(x, w, tensors, opts, dy, ds)
    t = tol(type)

    if want_state do
      {y, state} = out
      assert_close(y, want_y, t, "#{label} y")
      assert_close(state, want_state, t, "#{label} final_state")
    else
      assert_close(out, want_y, t, "#{label} y")
    end

    assert Enum.sort(Map.keys(want)) == Enum.sort([:x, :w | Map.keys(tensors)])
    assert_close(dx, want.x, t, "#{label} dx")
    {_, seqlen, _} = shape
    assert_close_sum(dw, want.w, t, batch * seqlen, "#{label} dw")

    for {name, g} <- dtensors do
      if name == :bias,
        do: assert_close_sum(g, want[name], t, batch * seqlen, "#{label} d#{name}"),
        else: assert_close(g, want[name], t, "#{label} d#{name}")
    end
  end

  test "causal_conv1d inside defn: values and every gradient as the Erlang API, every option, awkward shapes (f32, f64)" do
    for type <- [{:f, 32}, {:f, 64}] do
      for c <- conv_cases({2, 7, 5}, 4, type), do: check_conv({2, 7, 5}, 4, type, c)

      for {shape, width} <- [{{1, 1, 1}, 1}, {{2, 3, 37}, 3}, {{1, 2, 4}, 7}, {{2, 3, 3}, 4}, {{1, 9, 1}, 2}],
          c <- conv_cases(shape, width, type),
          do: check_conv(shape, width, type, c)
    end
  end

  test "causal_conv1d in 16-bit types: f32 arithmetic rounded at the outputs; weights of another type" do
    for type <- [{:bf, 16}, {:f, 16}], c <- conv_cases({2, 9, 6}, 4, type), do: check_conv({2, 9, 6}, 4, type, c)
    check_conv({2, 5, 3}, 3, {:bf, 16}, {[activation: :silu], %{}}, {:f, 32})
  end

  test "gradients of every argument against central differences (f64)" do
    f64 = {:f, 64}
    {batch, seqlen, dim, width} = {2, 6, 3, 4}
    dy = uniform({batch, seqlen, dim}, f64)
    ds = uniform({batch, dim, width - 1}, f64)

    for act <- [:none, :silu] do
      loss = fn {x, w, bias, init} ->
        {y, s} = Fusex.Defn.causal_conv1d(x, w, %{bias: bias, initial_state: init}, activation: act, return_state: true)
        Nx.add(dot(y, dy), dot(s, ds))
      end

      args = {uniform({batch, seqlen, dim}, f64), uniform({dim, width}, f64), uniform({dim}, f64),
              uniform({batch, dim, width - 1}, f64)}

      check_central_differences("causal_conv1d #{act}", args, loss)
    end
  end

  test "steps: {y, new_state} as the Erlang step (which updates the state in place), gradients and second derivatives" do
    for type <- [{:f, 32}, {:f, 64}, {:bf, 16}], width <- [2, 4, 7], act <- [:none, :silu] do
      state = uniform({3, 5, width - 1}, type)
      x = uniform({3, 5}, type)
      w = uniform({5, width}, type)
      bias = uniform({5}, type)
      {y, new_state} = Nx.Defn.jit(fn s, x, w, b -> Fusex.Defn.causal_conv1d_step(s, x, w, %{bias: b}, activation: act) end).(state, x, w, bias)
      erl_state = erl(state)
      erl_y = :fusex.causal_conv1d_step(erl_state, erl(x), erl(w), %{bias: erl(bias), activation: act})
      assert_close(y, nx(erl_y), tol(type), "step #{inspect(type)} W#{width} #{act} y")
      assert_close(new_state, nx(erl_state), tol(type), "step #{inspect(type)} W#{width} #{act} state")
    end

    f64 = {:f, 64}
    args = {uniform({2, 3, 3}, f64), uniform({2, 3}, f64), uniform({3, 4}, f64), uniform({3}, f64)}
    w = {uniform({2, 3}, f64), uniform({2, 3, 3}, f64)}
    step = fn {s, x, wt, b} -> Fusex.Defn.causal_conv1d_step(s, x, wt, %{bias: b}, activation: :silu) end

    check_central_differences("causal_conv1d_step", args, fn args ->
      {y, s} = step.(args)
      Nx.add(dot(y, elem(w, 0)), dot(s, elem(w, 1)))
    end)

    check_second_order("causal_conv1d_step", args, &Tuple.to_list(step.(&1)))
  end

  test "the forward's final state continues as the steps' state" do
    {x, w, bias} = {uniform({2, 9, 4}), uniform({4, 4}), uniform({4})}
    y_all = Fusex.Defn.causal_conv1d(x, w, %{bias: bias}, activation: :silu)
    {y_head, state} = Fusex.Defn.causal_conv1d(Nx.slice_along_axis(x, 0, 5, axis: 1), w, %{bias: bias}, activation: :silu, return_state: true)

    {ys, _} =
      Enum.map_reduce(5..8, state, fn t, state ->
        x_t = x |> Nx.slice_along_axis(t, 1, axis: 1) |> Nx.squeeze(axes: [1])
        {y, state} = Fusex.Defn.causal_conv1d_step(state, x_t, w, %{bias: bias}, activation: :silu)
        {Nx.new_axis(y, 1), state}
      end)

    assert_close(Nx.concatenate([y_head | ys], axis: 1), y_all, 1.0e-6, "streamed")
  end

  test "second derivatives through causal_conv1d are refused at trace time" do
    f64 = {:f, 64}
    args = {uniform({2, 4, 3}, f64), uniform({3, 3}, f64), uniform({2, 3, 2}, f64)}

    assert_second_order_refused(:causal_conv1d, args, fn {x, w, init} ->
      Tuple.to_list(Fusex.Defn.causal_conv1d(x, w, %{initial_state: init}, activation: :silu, return_state: true))
    end)
  end

  # =====================================================================
  # bad input: the Erlang API's messages, at trace time
  # =====================================================================

  test "bad shapes, types and option values raise the Erlang API's messages, at trace time" do
    t = fn shape, type -> Nx.broadcast(Nx.tensor(0, type: type), shape) end
    f32 = {:f, 32}
    x = t.({2, 3, 4}, f32)
    w = t.({4, 3}, f32)

    cases = [
      {[t.({2, 3, 4}, {:s, 32}), w], %{}, []},
      {[t.({2, 4}, f32), w], %{}, []},
      {[x, t.({5, 3}, f32)], %{}, []},
      {[x, t.({4, 17}, f32)], %{}, []},
      {[x, w], %{bias: t.({3}, f32)}, []},
      {[x, w], %{initial_state: t.({2, 4, 3}, f32)}, []},
      {[x, w], %{initial_state: t.({2, 4, 2}, {:f, 16})}, []},
      {[x, w], %{}, [activation: :relu]},
      {[x, w], %{}, [activation: "silu"]},
      {[x, w], %{}, [return_state: 1]}
    ]

    for {[x, w], tensors, opts} <- cases do
      assert_same_message(
        fn -> Nx.Defn.jit(fn x, w, t -> Fusex.Defn.causal_conv1d(x, w, t, opts) end).(x, w, tensors) end,
        fn -> :fusex.causal_conv1d(erl(x), erl(w), erl_opts(tensors, opts)) end
      )
    end

    frame = t.({2, 4}, f32)
    state = t.({2, 4, 2}, f32)

    for {args, opts} <- [{[frame, frame, w], []}, {[state, x, w], []}, {[t.({2, 4, 2}, {:f, 16}), frame, w], []},
                         {[state, frame, w], [activation: :gelu]}] do
      assert_same_message(
        fn -> apply(Fusex.Defn, :causal_conv1d_step, args ++ [%{}, opts]) end,
        fn -> apply(:fusex, :causal_conv1d_step, Enum.map(args, &erl/1) ++ [Map.new(opts)]) end
      )
    end

    assert_raise ArgumentError, "activation: expected none or silu, got nil", fn ->
      Fusex.Defn.causal_conv1d(x, w, %{}, activation: nil)
    end

    assert_raise ArgumentError, "opts: expected only the options activation, return_state, got save_for_backward", fn ->
      Fusex.Defn.causal_conv1d(x, w, %{}, save_for_backward: true)
    end

    assert_raise ArgumentError, "tensors: expected only the tensors bias, initial_state, got h0", fn ->
      Fusex.Defn.causal_conv1d(x, w, %{h0: state})
    end
  end

  # =====================================================================
  # the blocks follow the descriptions (docs/XLA.md)
  # =====================================================================

  test "blocks: the targets' names, attributes (the activation an index), operands and results in the descriptions' order" do
    f32 = {:f, 32}
    {x, w, bias, init} = {uniform({2, 5, 3}), uniform({3, 4}), uniform({3}), uniform({2, 3, 3})}

    fun = fn x, w, bias, init ->
      Nx.Defn.grad({x, w, bias, init}, fn {x, w, bias, init} ->
        Nx.sum(elem(Fusex.Defn.causal_conv1d(x, w, %{bias: bias, initial_state: init}, activation: :silu, return_state: true), 0))
      end)
    end

    # (the backward reads no result of the forward: the gradient holds it alone)
    [{bb, bops, bres}] = blocks_of(fun, [x, w, bias, init])

    [{fb, fops, fres}] =
      blocks_of(fn x, w, bias, init -> Fusex.Defn.causal_conv1d(x, w, %{bias: bias, initial_state: init}, activation: :silu, return_state: true) end,
        [x, w, bias, init])
    p = [{f32, {2, 5, 3}}, {f32, {3, 4}}, {f32, {3}}, {f32, {2, 3, 3}}]
    assert {Block.target_name(fb), fb.attrs} == {"fusex_causal_conv1d_fwd", [activation: 1, has_bias: 1, has_initial_state: 1, return_state: 1]}
    assert {fops, fres} == {p, [{f32, {2, 5, 3}}, {f32, {2, 3, 3}}]}
    assert {Block.target_name(bb), bb.attrs} == {"fusex_causal_conv1d_bwd", [activation: 1, has_bias: 1, has_initial_state: 1, has_dfinal_state: 0]}
    assert {bops, bres} == {p ++ [{f32, {2, 5, 3}}], p}
    assert Block.mlir_attributes(fb) |> hd() == {"activation", "1 : i64"}

    [{sb, sops, sres}] = blocks_of(fn s, x, w -> Fusex.Defn.causal_conv1d_step(s, x, w) end, [init, uniform({2, 3}), w])
    assert {Block.target_name(sb), sb.attrs} == {"fusex_causal_conv1d_step", [activation: 0, has_bias: 0]}
    assert {sops, sres} == {[{f32, {2, 3, 3}}, {f32, {2, 3}}, {f32, {3, 4}}], [{f32, {2, 3}}, {f32, {2, 3, 3}}]}

    for block <- [fb, bb, sb], do: assert_description_attrs(block)
  end
end
