defmodule FusexDefnLinrecTest do
  # Fusex.Defn's linear recurrences (linear_scan, mingru, minlstm, liquid)
  # inside defn (jit under the Evaluator, the default implementations of
  # their blocks): values and the gradient of every argument against the
  # Erlang API on the cpu backend (fusex's kernels) and against central
  # differences in f64; every option, awkward shapes, 16-bit and f64
  # inputs, steps, second derivatives, bad input, the blocks. Runs where Nx
  # is present; listed as skipped elsewhere. No Nx macros here (the module
  # compiles without Nx): jit and grad of anonymous functions. The shared
  # pieces are Fusex.DefnCase's (test/ex/support/defn_case.ex).
  use ExUnit.Case, async: false
  @moduletag :nx
  @compile {:no_warn_undefined, [Nx, Nx.Defn, Fusex.Defn, Fusex.Defn.Linrec]}

  import Fusex.NxHelpers
  import Fusex.DefnCase
  # the pure-Nx code; the NIF's runs: fusex_defn_runtime_test.exs
  setup :pure_nx
  alias Fusex.Defn.Block

  # Every op of the family the op layer describes.
  @linrec_ops for d <- Fusex.DefnCase.described(:linrec, :fwd), do: d.op

  # The op's positional inputs (liquid: f_logits, tau, a) for a sequence
  # or a frame shape.
  defp linrec_inputs(op, shape, type) do
    hidden = elem(shape, tuple_size(shape) - 1)

    case op do
      :linear_scan -> [uniform(shape, type, 0.2, 1.0), uniform(shape, type)]
      :mingru -> [uniform(shape, type, -3.0, 3.0), uniform(shape, type)]
      :minlstm -> [uniform(shape, type, -3.0, 3.0), uniform(shape, type, -3.0, 3.0), uniform(shape, type)]
      :liquid -> [uniform(shape, type, -3.0, 3.0), uniform({hidden}, type, 0.5, 2.0), uniform({hidden}, type)]
    end
  end

  defp linrec_names(:liquid), do: [:f_logits, :tau, :a]
  defp linrec_names(op), do: Fusex.Defn.Linrec.seq_names(op)

  defp defn_linrec(op, p, tensors, opts), do: apply(Fusex.Defn, op, p ++ [tensors, opts])
  defp defn_linrec_step(op, state, p, tensors, opts), do: apply(Fusex.Defn, :"#{op}_step", [state | p] ++ [tensors, opts])

  # {options, tensors} cases for an op: every option, h0 in the state type
  # and in the inputs' type, liquid's dt as a number and as a tensor.
  defp linrec_cases(op, {batch, seqlen, hidden}, type) do
    h0 = uniform({batch, hidden}, state_type(type))
    h0_in_type = uniform({batch, hidden}, type)

    common = [
      {[], %{}},
      {[return_state: true], %{h0: h0}},
      {[reverse: true, return_state: true], %{h0: h0_in_type}},
      {[reverse: true], %{}}
    ]

    case op do
      :linear_scan ->
        common

      gated when gated in [:mingru, :minlstm] ->
        common ++
          [{[candidate_activation: :g, return_state: true], %{h0: h0}},
           {[candidate_activation: :g, reverse: true], %{}}]

      :liquid ->
        dt = uniform({batch, seqlen, 1}, type, 0.1, 1.5)

        common ++
          [{[dt: 0.37, return_state: true], %{h0: h0}}, {[reverse: true], %{dt: dt}},
           {[return_state: true, reverse: true], %{dt: dt, h0: h0}}]
    end
  end

  # Fusex.Defn inside jit: the forward's result, and the gradient of
  # sum(h dh) + sum(state ds) with respect to the inputs and the tensors.
  defp defn_linrec_run(op, p, tensors, opts, dh, ds) do
    return_state = Keyword.get(opts, :return_state, false)
    fwd = Nx.Defn.jit(fn p, tensors -> defn_linrec(op, Tuple.to_list(p), tensors, opts) end)

    grad =
      Nx.Defn.jit(fn p, tensors, dh, ds ->
        Nx.Defn.grad({p, tensors}, fn {p, tensors} ->
          case defn_linrec(op, Tuple.to_list(p), tensors, opts) do
            {h, state} when return_state -> Nx.add(dot(h, dh), dot(state, ds))
            h -> dot(h, dh)
          end
        end)
      end)

    {grads, tensor_grads} = grad.(List.to_tuple(p), tensors, dh, ds)
    {fwd.(List.to_tuple(p), tensors), Tuple.to_list(grads), tensor_grads}
  end

  # The same through the Erlang API: {h, state | nil, gradients map}.
  defp erl_linrec_run(op, p, tensors, opts, dh, ds) do
    eopts = erl_opts(tensors, opts) |> Map.put(:save_for_backward, true)

    {h, state, ctx} =
      case apply(:fusex, op, Enum.map(p, &erl/1) ++ [eopts]) do
        {h, state, ctx} -> {h, state, ctx}
        {h, ctx} -> {h, nil, ctx}
      end

    bopts = if state, do: %{dstate: erl(ds)}, else: %{}
    grads = apply(:fusex, :"#{op}_backward", [erl(dh), ctx, bopts])
    {nx(h), state && nx(state), Map.new(grads, fn {k, v} -> {k, nx(v)} end)}
  end

  defp check_linrec(op, shape, type, {opts, tensors}) do
    label = "#{op} #{inspect(type)} #{inspect(shape)} #{inspect(opts)} #{inspect(Map.keys(tensors))}"
    p = linrec_inputs(op, shape, type)
    {batch, _, hidden} = shape
    dh = uniform(shape, type)
    ds = uniform({batch, hidden}, state_type(type))
    {out, grads, tensor_grads} = defn_linrec_run(op, p, tensors, opts, dh, ds)
    {want_h, want_state, want} = erl_linrec_run(op, p, tensors, opts, dh, ds)

    if want_state do
      {h, state} = out
      assert_close(h, want_h, tol(type), "#{label} h")
      assert_close(state, want_state, tol(type), "#{label} state")
    else
      assert_close(out, want_h, tol(type), "#{label} h")
    end

    assert Enum.sort(Map.keys(want)) == Enum.sort(linrec_names(op) ++ Map.keys(tensors))
    # Gradients are sums over the later steps the state carries them to
    # (and the tensors' over batch too), some of terms that nearly cancel
    # (a gate's: dh * (h_prev - candidate)).
    {_, seqlen, _} = shape
    for {name, g} <- Enum.zip(linrec_names(op), grads),
        do: assert_close_sum(g, want[name], tol(type), seqlen, "#{label} d#{name}")
    for {name, g} <- tensor_grads,
        do: assert_close_sum(g, want[name], tol(type), batch * seqlen, "#{label} d#{name}")
  end

  test "linear recurrences inside defn: values and every gradient as the Erlang API, every option (f32, f64)" do
    for type <- [{:f, 32}, {:f, 64}], op <- @linrec_ops do
      # every case on one shape, two on the awkward others
      for c <- linrec_cases(op, {2, 7, 5}, type), do: check_linrec(op, {2, 7, 5}, type, c)

      for shape <- [{1, 1, 1}, {3, 17, 4}, {1, 41, 3}],
          c <- Enum.take(linrec_cases(op, shape, type), 3),
          do: check_linrec(op, shape, type, c)
    end
  end

  test "linear recurrences in 16-bit types: f32 arithmetic rounded at the outputs, f32 states" do
    for type <- [{:bf, 16}, {:f, 16}], op <- @linrec_ops, c <- Enum.take(linrec_cases(op, {2, 9, 6}, type), 3) do
      check_linrec(op, {2, 9, 6}, type, c)
    end

    {h, state} = Fusex.Defn.mingru(uniform({1, 3, 2}, {:bf, 16}), uniform({1, 3, 2}, {:bf, 16}), %{}, return_state: true)
    assert {h.type, state.type} == {{:bf, 16}, {:f, 32}}
  end

  # =====================================================================
  # gradients against central differences (f64), one output only
  # =====================================================================

  test "gradients of every argument against central differences (f64)" do
    f64 = {:f, 64}

    for op <- @linrec_ops do
      shape = {2, 9, 3}
      p = linrec_inputs(op, shape, f64)
      h0 = uniform({2, 3}, f64)
      dh = uniform(shape, f64)
      ds = uniform({2, 3}, f64)

      {tensors, extra} =
        if op == :liquid, do: {%{h0: h0, dt: uniform({2, 9, 1}, f64, 0.2, 1.0)}, []}, else: {%{h0: h0}, []}

      opts = [reverse: true, return_state: true] ++ extra ++ if(op in [:mingru, :minlstm], do: [candidate_activation: :g], else: [])
      names = Map.keys(tensors)

      loss = fn args ->
        {pl, tl} = Enum.split(Tuple.to_list(args), length(p))
        {h, state} = defn_linrec(op, pl, Map.new(Enum.zip(names, tl)), opts)
        Nx.add(dot(h, dh), dot(state, ds))
      end

      check_central_differences("#{op}", List.to_tuple(p ++ Enum.map(names, &tensors[&1])), loss)
    end
  end

  test "a gradient through h only: the unused state's cotangent is zero" do
    z = uniform({2, 6, 4})
    cand = uniform({2, 6, 4})
    dh = uniform({2, 6, 4})
    g = Nx.Defn.jit(fn z, dh -> Nx.Defn.grad(z, fn z -> dot(elem(Fusex.Defn.mingru(z, cand, %{}, return_state: true), 0), dh) end) end).(z, dh)
    {_h, ctx} = :fusex.mingru(erl(z), erl(cand), %{save_for_backward: true})
    assert_close(g, nx(:fusex.mingru_backward(erl(dh), ctx, %{}).z_logits), 1.0e-5, "dz from h alone")
  end

  # =====================================================================
  # steps
  # =====================================================================

  test "steps: {h, new_state} as the Erlang steps (which update the state in place), gradients against central differences" do
    for op <- @linrec_ops, type <- [{:f, 32}, {:f, 64}, {:bf, 16}], state_type <- Enum.uniq([type, state_type(type)]) do
      p = linrec_inputs(op, {3, 5}, type)
      state = uniform({3, 5}, state_type)
      {tensors, opts} = if op == :liquid, do: {%{dt: uniform({3, 1}, type, 0.1, 1.0)}, []}, else: {%{}, []}
      opts = if op in [:mingru, :minlstm], do: [candidate_activation: :g], else: opts
      {h, new_state} = Nx.Defn.jit(fn s, p, t -> defn_linrec_step(op, s, Tuple.to_list(p), t, opts) end).(state, List.to_tuple(p), tensors)
      erl_state = erl(state)
      erl_h = apply(:fusex, :"#{op}_step", [erl_state | Enum.map(p, &erl/1)] ++ [erl_opts(tensors, opts)])
      assert_close(h, nx(erl_h), tol(type), "#{op}_step h")
      assert_close(new_state, nx(erl_state), tol(type), "#{op}_step state")
    end

    f64 = {:f, 64}

    for op <- @linrec_ops do
      p = linrec_inputs(op, {2, 4}, f64)
      w = {uniform({2, 4}, f64), uniform({2, 4}, f64)}
      opts = if op == :liquid, do: [dt: 0.6], else: []

      loss = fn args ->
        [state | p] = Tuple.to_list(args)
        {h, s} = defn_linrec_step(op, state, p, %{}, opts)
        Nx.add(dot(h, elem(w, 0)), dot(s, elem(w, 1)))
      end

      check_central_differences("#{op}_step", List.to_tuple([uniform({2, 4}, f64) | p]), loss)
    end
  end

  # =====================================================================
  # second derivatives
  # =====================================================================

  test "second derivatives: every op refuses them (ArgumentError at trace time), every step has them right" do
    f64 = {:f, 64}

    for op <- @linrec_ops do
      p = linrec_inputs(op, {2, 5, 3}, f64)
      h0 = uniform({2, 3}, f64)

      for opts <- [[], [reverse: true, return_state: true]] do
        assert_second_order_refused(op, List.to_tuple(p ++ [h0]), fn args ->
          {p, [h0]} = Enum.split(Tuple.to_list(args), length(p))
          out = defn_linrec(op, p, %{h0: h0}, opts)
          if opts[:return_state], do: Tuple.to_list(out), else: out
        end)
      end

      # (liquid's dt tensor too)
      if op == :liquid do
        dt = uniform({2, 5, 1}, f64, 0.2, 1.0)

        assert_second_order_refused(op, List.to_tuple(p ++ [dt]), fn {f, tau, a, dt} ->
          defn_linrec(op, [f, tau, a], %{dt: dt}, [])
        end)
      end

      # steps: through their default implementations, right
      frame = linrec_inputs(op, {2, 3}, f64)
      opts = if op in [:mingru, :minlstm], do: [candidate_activation: :g], else: []
      tensors = if op == :liquid, do: %{dt: uniform({2, 1}, f64, 0.2, 1.0)}, else: %{}

      check_second_order("#{op}_step", List.to_tuple([uniform({2, 3}, f64) | frame]), fn args ->
        [state | p] = Tuple.to_list(args)
        Tuple.to_list(defn_linrec_step(op, state, p, tensors, opts))
      end)
    end

    # the issue's reproducer: grad of grad through linear_scan
    a = Nx.tensor([[[0.6, 0.7], [0.8, 0.9], [0.55, 0.65]]], type: :f64)
    b = Nx.tensor([[[0.1, -0.2], [0.3, 0.4], [-0.5, 0.6]]], type: :f64)
    g1 = fn a -> Nx.Defn.grad(a, fn a -> Fusex.Defn.linear_scan(a, b) |> Nx.pow(2) |> Nx.sum() end) |> Nx.pow(2) |> Nx.sum() end

    assert_raise ArgumentError, "linear_scan: second derivatives are not supported (Nx.Defn.grad of a gradient of linear_scan)", fn ->
      Nx.Defn.jit(fn a -> Nx.Defn.grad(a, g1) end).(a)
    end
  end

  # =====================================================================
  # bad input: the Erlang API's messages, at trace time
  # =====================================================================


  defp linrec_bad_cases do
    t = fn shape, type -> Nx.broadcast(Nx.tensor(0, type: type), shape) end
    f32 = {:f, 32}
    seq = t.({2, 5, 3}, f32)

    [
      {:linear_scan, [t.({2, 5, 3}, {:s, 32}), seq], %{}, []},
      {:linear_scan, [t.({2, 5}, f32), t.({2, 5}, f32)], %{}, []},
      {:linear_scan, [seq, t.({2, 5, 3}, {:bf, 16})], %{}, []},
      {:linear_scan, [seq, t.({2, 4, 3}, f32)], %{}, []},
      {:linear_scan, [seq, seq], %{h0: t.({2, 4}, f32)}, []},
      {:linear_scan, [seq, seq], %{h0: t.({2, 3}, {:f, 64})}, []},
      {:mingru, [t.({2, 5, 3}, {:bf, 16}), t.({2, 5, 3}, {:bf, 16})], %{h0: t.({2, 3}, {:f, 16})}, []},
      {:mingru, [seq, seq], %{}, [candidate_activation: :tanh]},
      {:minlstm, [seq, seq, t.({2, 5, 4}, f32)], %{}, []},
      {:minlstm, [seq, seq, seq], %{}, [reverse: "yes"]},
      {:liquid, [seq, t.({4}, f32), t.({3}, f32)], %{}, []},
      {:liquid, [seq, t.({3}, f32), t.({3}, {:f, 64})], %{}, []},
      {:liquid, [seq, t.({3}, f32), t.({3}, f32)], %{dt: t.({2, 5}, f32)}, []},
      {:liquid, [seq, t.({3}, f32), t.({3}, f32)], %{}, [dt: -1]},
      {:liquid, [seq, t.({3}, f32), t.({3}, f32)], %{}, [dt: :fast]}
    ]
  end

  test "bad shapes, types and option values raise the Erlang API's messages, at trace time" do
    for {op, p, tensors, opts} <- linrec_bad_cases() do
      want =
        erl_message(fn -> apply(:fusex, op, Enum.map(p, &erl/1) ++ [erl_opts(tensors, opts)]) end)
        |> String.replace("a fusex tensor", "a tensor")

      err = assert_raise ArgumentError, fn ->
        Nx.Defn.jit(fn p, t -> defn_linrec(op, Tuple.to_list(p), t, opts) end).(List.to_tuple(p), tensors)
      end

      assert err.message == want
    end

    # steps
    state = Nx.broadcast(0.0, {2, 3})
    frame = Nx.broadcast(0.0, {2, 3})
    bad_state = Nx.broadcast(0.0, {2, 4})
    want = erl_message(fn -> :fusex.mingru_step(erl(bad_state), erl(frame), erl(frame), %{}) end)
    assert_raise ArgumentError, want, fn -> Fusex.Defn.mingru_step(bad_state, frame, frame) end
    want = erl_message(fn -> :fusex.liquid_step(erl(state), erl(frame), erl(Nx.broadcast(1.0, {3})), erl(Nx.broadcast(1.0, {3})), %{dt: erl(Nx.broadcast(1.0, {2, 2}))}) end)

    assert_raise ArgumentError, String.replace(want, "a fusex tensor", "a tensor"), fn ->
      Fusex.Defn.liquid_step(state, frame, Nx.broadcast(1.0, {3}), Nx.broadcast(1.0, {3}), %{dt: Nx.broadcast(1.0, {2, 2})})
    end
  end

  test "unknown tensors and options, and both forms of liquid's dt, are refused" do
    seq = Nx.broadcast(0.0, {2, 5, 3})

    assert_raise ArgumentError, "opts: expected only the options reverse, return_state, got save_for_backward", fn ->
      Fusex.Defn.linear_scan(seq, seq, %{}, save_for_backward: true)
    end

    assert_raise ArgumentError, ~r/^dt: expected a number \(opts\) or a tensor \(tensors\), not both/, fn ->
      Fusex.Defn.liquid(seq, Nx.broadcast(1.0, {3}), Nx.broadcast(1.0, {3}), %{dt: Nx.broadcast(1.0, {2, 5, 1})}, dt: 0.5)
    end

    assert_raise ArgumentError, "opts: expected no options, got reverse", fn ->
      Fusex.Defn.linear_scan_step(Nx.broadcast(0.0, {2, 3}), Nx.broadcast(0.0, {2, 3}), Nx.broadcast(0.0, {2, 3}), %{}, reverse: true)
    end
  end

  test "every option value out of range: an ArgumentError naming the option" do
    seq = Nx.broadcast(0.0, {2, 5, 3})
    p3 = [Nx.broadcast(1.0, {3}), Nx.broadcast(1.0, {3})]

    cases = [
      {"dt: expected a positive number or a tensor ([batch, seqlen, 1]), got #{Integer.pow(10, 400)}",
       fn -> Fusex.Defn.liquid(seq, hd(p3), hd(p3), %{}, dt: Integer.pow(10, 400)) end},
      {"dt: expected a positive number or a tensor ([batch, seqlen, 1]), got 0.0", fn -> defn_linrec(:liquid, [seq | p3], %{}, dt: 0.0) end},
      {"dt: expected a positive number or a tensor ([batch, 1]), got <<\"1\">>",
       fn -> Fusex.Defn.liquid_step(Nx.broadcast(0.0, {2, 3}), Nx.broadcast(0.0, {2, 3}), hd(p3), hd(p3), %{}, dt: "1") end},
      {"reverse: expected true or false, got nil", fn -> Fusex.Defn.mingru(seq, seq, %{}, reverse: nil) end},
      {"return_state: expected true or false, got 1", fn -> Fusex.Defn.minlstm(seq, seq, seq, %{}, return_state: 1) end},
      {"candidate_activation: expected identity or g, got <<\"g\">>", fn -> Fusex.Defn.mingru_step(Nx.broadcast(0.0, {2, 3}), Nx.broadcast(0.0, {2, 3}), Nx.broadcast(0.0, {2, 3}), %{}, candidate_activation: "g") end},
      {"opts: expected a keyword list, got [1]", fn -> Fusex.Defn.linear_scan(seq, seq, %{}, [1]) end},
      {"tensors: expected a map of tensors, got 3", fn -> Fusex.Defn.linear_scan(seq, seq, 3) end},
      {"h0: expected a tensor, got 1.0", fn -> Fusex.Defn.linear_scan(seq, seq, %{h0: 1.0}) end}
    ]

    for {message, fun} <- cases, do: assert_raise(ArgumentError, message, fun)
  end

  # =====================================================================
  # the blocks follow the descriptions (docs/XLA.md)
  # =====================================================================

  test "blocks: the targets' names, attributes, operands and results in the descriptions' order" do
    f32 = {:f, 32}
    # liquid with a dt tensor and h0, the state unused by the loss: no dstate
    f = uniform({2, 5, 3})
    tau = uniform({3}, f32, 0.5, 1.0)
    dt = uniform({2, 5, 1}, f32, 0.1, 1.0)
    h0 = uniform({2, 3})

    fun = fn f, tau, a, dt, h0 ->
      Nx.Defn.grad({f, tau, a, dt, h0}, fn {f, tau, a, dt, h0} ->
        Nx.sum(elem(Fusex.Defn.liquid(f, tau, a, %{dt: dt, h0: h0}, reverse: true, return_state: true), 0))
      end)
    end

    [{fb, fops, fres}, {bb, bops, bres}] = blocks_of(fun, [f, tau, tau, dt, h0]) |> Enum.sort_by(fn {b, _, _} -> b.direction == :bwd end)
    hseq = {f32, {2, 5, 3}}
    p = [hseq, {f32, {3}}, {f32, {3}}, {f32, {2, 5, 1}}, {f32, {2, 3}}]
    assert {Block.target_name(fb), fb.attrs} == {"fusex_liquid_fwd", [reverse: 1, has_dt: 1, has_h0: 1, return_state: 1, dt: 1.0]}
    assert {fops, fres} == {p, [hseq, {f32, {2, 3}}]}
    assert {Block.target_name(bb), bb.attrs} == {"fusex_liquid_bwd", [reverse: 1, has_dt: 1, has_h0: 1, has_dstate: 0, dt: 1.0]}
    assert {bops, bres} == {p ++ [hseq, hseq], p}

    # a step: state first, h and the new state out
    [{sb, sops, sres}] =
      blocks_of(fn s, z, c -> Fusex.Defn.mingru_step(s, z, c, %{}, candidate_activation: :g) end,
        [uniform({2, 3}), uniform({2, 3}, {:bf, 16}), uniform({2, 3}, {:bf, 16})])

    assert {Block.target_name(sb), sb.attrs} == {"fusex_mingru_step", [reverse: 0, candidate_g: 1]}
    assert sops == [{f32, {2, 3}}, {{:bf, 16}, {2, 3}}, {{:bf, 16}, {2, 3}}]
    assert sres == [{{:bf, 16}, {2, 3}}, {f32, {2, 3}}]

    for {block, _, _} <- [{fb, fops, fres}, {bb, bops, bres}, {sb, sops, sres}], do: assert_description_attrs(block)
  end
end
