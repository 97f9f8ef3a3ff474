defmodule FusexDefnTest do
  # Fusex.Defn inside defn (jit under the Evaluator, the default
  # implementations of its blocks): values and the gradient of every
  # argument against the Erlang API on the cpu backend (fusex's kernels)
  # and against central differences in f64; every option, awkward shapes,
  # 16-bit and f64 inputs, steps, saved states, bad input. Runs where Nx is
  # present; listed as skipped elsewhere. No Nx macros here (the module
  # compiles without Nx): jit and grad of anonymous functions.
  use ExUnit.Case, async: false
  @moduletag :nx
  @compile {:no_warn_undefined,
            [Nx, Nx.Defn, Nx.Defn.Expr, Nx.Defn.Composite, Fusex.Defn, Fusex.Defn.SSM, Fusex.Defn.Linrec, Fusex.Defn.Check]}

  import Fusex.NxHelpers
  alias Fusex.Defn.Block

  # =====================================================================
  # the linear recurrences
  # =====================================================================

  @linrec_ops [:linear_scan, :mingru, :minlstm, :liquid]

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

  # Fusex.Defn's tensors and options -> the Erlang API's options map.
  defp erl_opts(tensors, opts), do: Map.merge(Map.new(opts), Map.new(tensors, fn {k, v} -> {k, erl(v)} end))

  # {options, tensors} cases for an op: every option, h0 in the state type
  # and in the inputs' type, liquid's dt as a number and as a tensor.
  defp linrec_cases(op, {batch, seqlen, hidden}, type) do
    h0 = uniform({batch, hidden}, Fusex.Defn.Check.state_type(type))
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
    ds = uniform({batch, hidden}, Fusex.Defn.Check.state_type(type))
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
    for {name, g} <- Enum.zip(linrec_names(op), grads), do: assert_close(g, want[name], tol(type), "#{label} d#{name}")
    for {name, g} <- tensor_grads, do: assert_close(g, want[name], tol(type), "#{label} d#{name}")
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
  # the selective scan
  # =====================================================================

  # Inputs of {batch, seqlen, dim, dstate, groups} (groups 0: b, c of rank 3).
  defp ssm_inputs({batch, seqlen, dim, dstate, groups}, type) do
    bc = if groups == 0, do: {batch, seqlen, dstate}, else: {batch, seqlen, groups, dstate}

    %{
      x: uniform({batch, seqlen, dim}, type),
      dt: uniform({batch, seqlen, dim}, type, -1.5, 0.5),
      a: uniform({dim, dstate}, type, -2.0, -0.1),
      b: uniform(bc, type),
      c: uniform(bc, type),
      d: uniform({dim}, type),
      z: uniform({batch, seqlen, dim}, type),
      dt_bias: uniform({dim}, type, -0.5, 0.5),
      h0: uniform({batch, dim, dstate}, Fusex.Defn.Check.state_type(type))
    }
  end

  @ssm_optional [:d, :z, :dt_bias, :h0]

  defp ssm_run(i, given, opts, dy, ds) do
    return_state = Keyword.get(opts, :return_state, false)
    tensors = Map.take(i, given)
    p = {i.x, i.dt, i.a, i.b, i.c}
    call = fn {x, dt, a, b, c}, tensors -> Fusex.Defn.selective_scan(x, dt, a, b, c, tensors, opts) end
    out = Nx.Defn.jit(call).(p, tensors)

    {grads, tensor_grads} =
      Nx.Defn.jit(fn p, tensors, dy, ds ->
        Nx.Defn.grad({p, tensors}, fn {p, tensors} ->
          case call.(p, tensors) do
            {y, state} when return_state -> Nx.add(dot(y, dy), dot(state, ds))
            y -> dot(y, dy)
          end
        end)
      end).(p, tensors, dy, ds)

    {out, Map.merge(Map.new(Enum.zip([:x, :dt, :a, :b, :c], Tuple.to_list(grads))), tensor_grads)}
  end

  defp erl_ssm_run(i, given, opts, dy, ds) do
    eopts = erl_opts(Map.take(i, given), opts) |> Map.put(:save_for_backward, true)

    {y, state, ctx} =
      case :fusex.selective_scan(erl(i.x), erl(i.dt), erl(i.a), erl(i.b), erl(i.c), eopts) do
        {y, state, ctx} -> {y, state, ctx}
        {y, ctx} -> {y, nil, ctx}
      end

    bopts = if state, do: %{dstate: erl(ds)}, else: %{}
    grads = :fusex.selective_scan_backward(erl(dy), ctx, bopts)
    {nx(y), state && nx(state), Map.new(grads, fn {k, v} -> {k, nx(v)} end)}
  end

  defp check_ssm(dims, type, given, opts) do
    label = "selective_scan #{inspect(type)} #{inspect(dims)} #{inspect(given)} #{inspect(opts)}"
    i = ssm_inputs(dims, type)
    {batch, seqlen, dim, dstate, _} = dims
    dy = uniform({batch, seqlen, dim}, type)
    ds = uniform({batch, dim, dstate}, Fusex.Defn.Check.state_type(type))
    {out, grads} = ssm_run(i, given, opts, dy, ds)
    {want_y, want_state, want} = erl_ssm_run(i, given, opts, dy, ds)

    if want_state do
      {y, state} = out
      assert_close(y, want_y, tol(type), "#{label} y")
      assert_close(state, want_state, tol(type), "#{label} state")
    else
      assert_close(out, want_y, tol(type), "#{label} y")
    end

    assert Enum.sort(Map.keys(grads)) == Enum.sort(Map.keys(want))
    for {name, g} <- grads, do: assert_close(g, want[name], tol(type), "#{label} d#{name}")
  end

  # seqlens around the interval K of the saved states (16; 8 for dstates
  # above 32 but multiples of 16 over whole 32-channel groups): none saved,
  # one, several, a partial last chunk.
  @ssm_dims [{1, 1, 1, 1, 0}, {2, 16, 6, 4, 2}, {2, 17, 6, 4, 3}, {1, 33, 5, 3, 0}, {2, 29, 4, 40, 1},
             {3, 9, 7, 2, 7}, {1, 50, 2, 16, 2}]

  test "selective scan inside defn: values and every gradient as the Erlang API, every option (f32, f64)" do
    for type <- [{:f, 32}, {:f, 64}], dims <- @ssm_dims do
      check_ssm(dims, type, [], [])
      check_ssm(dims, type, @ssm_optional, dt_softplus: true, return_state: true)
    end

    # a large dstate saved every 16 steps (whole 32-channel groups), and
    # dstate 40 every 8
    i48 = ssm_inputs({1, 20, 32, 48, 1}, {:f, 32})
    assert Fusex.Defn.saved_layout(i48.x, i48.b) == {16, 1}
    i40 = ssm_inputs({2, 29, 4, 40, 1}, {:f, 32})
    assert Fusex.Defn.saved_layout(i40.x, i40.b) == {8, 3}
    check_ssm({1, 20, 32, 48, 1}, {:f, 32}, @ssm_optional, dt_softplus: true, return_state: true)

    # each option alone and in pairs
    for given <- [[:d], [:z], [:dt_bias], [:h0], [:d, :z], [:z, :h0], [:dt_bias, :h0]],
        opts <- [[], [dt_softplus: true], [return_state: true]] do
      check_ssm({2, 21, 6, 4, 2}, {:f, 32}, given, opts)
    end
  end

  test "selective scan in 16-bit types: f32 arithmetic rounded at the outputs, f32 states" do
    for type <- [{:bf, 16}, {:f, 16}] do
      check_ssm({2, 19, 6, 4, 2}, type, @ssm_optional, dt_softplus: true, return_state: true)
      check_ssm({1, 5, 3, 2, 0}, type, [:z], [])
    end
  end

  test "the forward's saved states are the states entering each chunk of K steps, as fusex saves them" do
    for {dims, type} <- [{{2, 37, 5, 3, 0}, {:f, 32}}, {{1, 29, 4, 40, 2}, {:f, 64}}, {{2, 40, 3, 4, 1}, {:bf, 16}}] do
      i = ssm_inputs(dims, type)
      {batch, seqlen, dim, dstate, _} = dims
      {every, nsaved} = Fusex.Defn.saved_layout(i.x, i.b)
      assert nsaved == div(seqlen + every - 1, every) - 1 and nsaved > 0

      fwd = %Block{
        op: :selective_scan,
        direction: :fwd,
        attrs: [dt_softplus: 1, has_d: 1, has_z: 0, has_dt_bias: 1, has_h0: 1, return_state: 1, save: 1],
        save_every: every
      }

      {_y, _state, saved} = Fusex.Defn.SSM.forward(fwd, [i.x, i.dt, i.a, i.b, i.c, i.d, i.dt_bias, i.h0])
      assert saved.shape == {batch, nsaved, dim, dstate}
      assert saved.type == Fusex.Defn.Check.state_type(type)

      # saved[:, k] = the state after step (k + 1) K - 1: the final state of
      # the prefix of (k + 1) K steps, through the Erlang API
      prefix_states =
        for k <- 0..(nsaved - 1) do
          steps = (k + 1) * every
          cut = fn t -> erl(Nx.slice_along_axis(t, 0, steps, axis: 1)) end

          {_y, state} =
            :fusex.selective_scan(cut.(i.x), cut.(i.dt), erl(i.a), cut.(i.b), cut.(i.c),
              %{d: erl(i.d), dt_bias: erl(i.dt_bias), h0: erl(i.h0), dt_softplus: true, return_state: true})

          Nx.new_axis(nx(state), 1)
        end

      want = Nx.concatenate(prefix_states, axis: 1)
      assert_close(saved, want, if(type == {:f, 64}, do: 1.0e-10, else: 1.0e-5), "saved #{inspect(dims)}")

      # and the default backward started from those (the kernels') states
      # gives the Erlang API's gradients
      dy = uniform({batch, seqlen, dim}, type)

      bwd = %Block{
        op: :selective_scan,
        direction: :bwd,
        attrs: [dt_softplus: 1, has_d: 1, has_z: 0, has_dt_bias: 1, has_h0: 1, has_dstate: 0],
        save_every: every
      }

      saved_in = Nx.as_type(want, Fusex.Defn.Check.state_type(type))
      grads = Fusex.Defn.SSM.backward(bwd, [i.x, i.dt, i.a, i.b, i.c, i.d, i.dt_bias, i.h0, saved_in, dy])

      {_y, ctx} =
        :fusex.selective_scan(erl(i.x), erl(i.dt), erl(i.a), erl(i.b), erl(i.c),
          %{d: erl(i.d), dt_bias: erl(i.dt_bias), h0: erl(i.h0), dt_softplus: true, save_for_backward: true})

      want_grads = :fusex.selective_scan_backward(erl(dy), ctx, %{})

      for {name, g} <- Enum.zip([:x, :dt, :a, :b, :c, :d, :dt_bias, :h0], Tuple.to_list(grads)),
          do: assert_close(g, nx(want_grads[name]), tol(type), "#{inspect(dims)} d#{name} from saved states")
    end
  end

  # =====================================================================
  # gradients against central differences (f64)
  # =====================================================================

  # Directional derivative of the scalar loss along a random direction of
  # each argument: (L(p + eps v) - L(p - eps v)) / 2 eps against <grad, v>.
  defp check_central_differences(label, args, loss) do
    grads = Nx.Defn.jit(fn args -> Nx.Defn.grad(args, loss) end).(args)
    value = Nx.Defn.jit(loss)
    eps = 1.0e-6

    for {arg, g, pos} <- Enum.zip([Tuple.to_list(args), Tuple.to_list(grads), Enum.to_list(0..(tuple_size(args) - 1))]) do
      v = uniform(arg.shape, {:f, 64})
      moved = fn sign -> put_elem(args, pos, Nx.add(arg, Nx.multiply(sign * eps, v))) end
      numeric = (Nx.to_number(value.(moved.(1.0))) - Nx.to_number(value.(moved.(-1.0)))) / (2 * eps)
      analytic = Nx.to_number(dot(g, v))
      err = abs(numeric - analytic) / max(abs(analytic), 1.0e-3)
      assert err <= 1.0e-6, "#{label} argument #{pos}: central difference #{numeric}, gradient #{analytic}"
    end
  end

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

    i = ssm_inputs({2, 21, 4, 3, 2}, f64)
    dy = uniform({2, 21, 4}, f64)
    ds = uniform({2, 4, 3}, f64)

    loss = fn {x, dt, a, b, c, d, z, bias, h0} ->
      {y, state} =
        Fusex.Defn.selective_scan(x, dt, a, b, c, %{d: d, z: z, dt_bias: bias, h0: h0}, dt_softplus: true, return_state: true)

      Nx.add(dot(y, dy), dot(state, ds))
    end

    check_central_differences("selective_scan", {i.x, i.dt, i.a, i.b, i.c, i.d, i.z, i.dt_bias, i.h0}, loss)
  end

  test "a gradient through one output only: the unused one's cotangent is zero" do
    i = ssm_inputs({2, 19, 3, 2, 0}, {:f, 32})
    ds = uniform({2, 3, 2})

    grads =
      Nx.Defn.jit(fn x, ds ->
        Nx.Defn.grad(x, fn x ->
          {_y, state} = Fusex.Defn.selective_scan(x, i.dt, i.a, i.b, i.c, %{}, return_state: true)
          dot(state, ds)
        end)
      end).(i.x, ds)

    {_y, ctx} = :fusex.selective_scan(erl(i.x), erl(i.dt), erl(i.a), erl(i.b), erl(i.c), %{save_for_backward: true})
    want = :fusex.selective_scan_backward(erl(Nx.broadcast(0.0, i.x.shape)), ctx, %{dstate: erl(ds)})
    assert_close(grads, nx(want.x), 1.0e-5, "dx from the state alone")

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

  test "steps: {y, new_state} as the Erlang steps (which update the state in place), gradients against central differences" do
    for op <- @linrec_ops, type <- [{:f, 32}, {:f, 64}, {:bf, 16}], state_type <- Enum.uniq([type, Fusex.Defn.Check.state_type(type)]) do
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

    # the selective scan step
    for type <- [{:f, 32}, {:f, 64}, {:bf, 16}], groups <- [0, 2] do
      i = ssm_inputs({3, 1, 4, 5, groups}, type)
      frame = fn t -> Nx.squeeze(t, axes: [1]) end
      {x, dt, z, b, c} = {frame.(i.x), frame.(i.dt), frame.(i.z), frame.(i.b), frame.(i.c)}
      state = uniform({3, 4, 5}, Fusex.Defn.Check.state_type(type))
      tensors = %{d: i.d, z: z, dt_bias: i.dt_bias}

      {y, new_state} =
        Nx.Defn.jit(fn s, x, dt, a, b, c, t -> Fusex.Defn.selective_scan_step(s, x, dt, a, b, c, t, dt_softplus: true) end).(
          state, x, dt, i.a, b, c, tensors)

      erl_state = erl(state)
      erl_y = :fusex.selective_scan_step(erl_state, erl(x), erl(dt), erl(i.a), erl(b), erl(c),
        Map.put(erl_opts(tensors, []), :dt_softplus, true))

      assert_close(y, nx(erl_y), tol(type), "selective_scan_step y #{inspect(type)}")
      assert_close(new_state, nx(erl_state), if(type == {:bf, 16}, do: 1.0e-5, else: tol(type)), "selective_scan_step state")
    end

    i = ssm_inputs({2, 1, 3, 4, 0}, f64)
    frame = fn t -> Nx.squeeze(t, axes: [1]) end
    w = {uniform({2, 3}, f64), uniform({2, 3, 4}, f64)}

    loss = fn {s, x, dt, a, b, c, d, z} ->
      {y, s} = Fusex.Defn.selective_scan_step(s, x, dt, a, b, c, %{d: d, z: z}, dt_softplus: true)
      Nx.add(dot(y, elem(w, 0)), dot(s, elem(w, 1)))
    end

    args = {uniform({2, 3, 4}, f64), frame.(i.x), frame.(i.dt), i.a, frame.(i.b), frame.(i.c), i.d, frame.(i.z)}
    check_central_differences("selective_scan_step", args, loss)
  end

  # =====================================================================
  # outside defn, constants, vectorized tensors
  # =====================================================================

  test "outside defn on plain tensors: the same results as inside" do
    z = uniform({2, 5, 3})
    cand = uniform({2, 5, 3})
    h0 = uniform({2, 3})
    inside = Nx.Defn.jit(fn z, cand, h0 -> Fusex.Defn.minlstm(z, z, cand, %{h0: h0}, return_state: true) end).(z, cand, h0)
    outside = Fusex.Defn.minlstm(z, z, cand, %{h0: h0}, return_state: true)
    assert Nx.to_binary(elem(inside, 0)) == Nx.to_binary(elem(outside, 0))
    assert Nx.to_binary(elem(inside, 1)) == Nx.to_binary(elem(outside, 1))

    i = ssm_inputs({1, 20, 3, 2, 0}, {:f, 32})
    y = Fusex.Defn.selective_scan(i.x, i.dt, i.a, i.b, i.c, %{d: i.d, h0: nil})

    # a misspelled key is refused even with nil
    assert_raise ArgumentError, ~r/^tensors: expected only the tensors .*, got h_0$/, fn ->
      Fusex.Defn.selective_scan(i.x, i.dt, i.a, i.b, i.c, %{h_0: nil})
    end
    y_jit = Nx.Defn.jit(fn x, dt, a, b, c, d -> Fusex.Defn.selective_scan(x, dt, a, b, c, %{d: d}) end).(i.x, i.dt, i.a, i.b, i.c, i.d)
    assert Nx.to_binary(y) == Nx.to_binary(y_jit)
  end

  test "tensors captured by the traced function (constants) are operands like any other" do
    h0 = uniform({2, 3})
    a = uniform({2, 4, 3}, {:f, 32}, 0.0, 1.0)
    b = uniform({2, 4, 3})
    # h0 and a are captured: constants of the traced function
    got = Nx.Defn.jit(fn b -> Fusex.Defn.linear_scan(a, b, %{h0: h0}) end).(b)
    assert_close(got, nx(:fusex.linear_scan(erl(a), erl(b), %{h0: erl(h0)})), 1.0e-5, "captured")
    g = Nx.Defn.jit(fn b -> Nx.Defn.grad(b, fn b -> Nx.sum(Fusex.Defn.linear_scan(a, b, %{h0: h0})) end) end).(b)
    {_h, ctx} = :fusex.linear_scan(erl(a), erl(b), %{h0: erl(h0), save_for_backward: true})
    assert_close(g, nx(:fusex.linear_scan_backward(erl(Nx.broadcast(1.0, {2, 4, 3})), ctx, %{}).b), 1.0e-5, "captured grad")
  end

  test "vectorized tensors are refused, naming the argument" do
    x = Nx.vectorize(uniform({2, 1, 4, 3}), :rows)

    assert_raise ArgumentError, "a: expected a tensor without vectorized axes, got one vectorized over [rows: 2]", fn ->
      Fusex.Defn.linear_scan(x, uniform({1, 4, 3}))
    end

    assert_raise ArgumentError, ~r/^b: expected a tensor without vectorized axes/, fn ->
      Nx.Defn.jit(fn a, b -> Fusex.Defn.linear_scan(a, b) end).(uniform({1, 4, 3}), x)
    end
  end

  # =====================================================================
  # bad input: the Erlang API's messages, at trace time
  # =====================================================================

  # Each case: {the Fusex.Defn call on templates' tensors, the Erlang call}.
  defp ssm_bad_cases do
    t = fn shape, type -> Nx.broadcast(Nx.tensor(0, type: type), shape) end
    f32 = {:f, 32}
    ok = %{x: t.({2, 5, 6}, f32), dt: t.({2, 5, 6}, f32), a: t.({6, 4}, f32), b: t.({2, 5, 4}, f32), c: t.({2, 5, 4}, f32)}

    [
      {%{x: t.({2, 5, 6}, {:s, 32})}, %{}, []},
      {%{x: t.({2, 5}, f32)}, %{}, []},
      {%{dt: t.({2, 5, 6}, {:bf, 16})}, %{}, []},
      {%{dt: t.({2, 4, 6}, f32)}, %{}, []},
      {%{a: t.({6}, f32)}, %{}, []},
      {%{a: t.({5, 4}, f32)}, %{}, []},
      {%{a: t.({6, 4}, {:s, 32})}, %{}, []},
      {%{b: t.({2, 5, 3}, f32)}, %{}, []},
      {%{b: t.({2, 5, 4}, {:f, 64})}, %{}, []},
      {%{b: t.({2, 5, 1, 1, 4}, f32)}, %{}, []},
      {%{b: t.({2, 5, 4, 4}, f32), c: t.({2, 5, 4, 4}, f32)}, %{}, []},
      {%{c: t.({2, 5, 2, 2}, f32)}, %{}, []},
      {%{}, %{d: t.({5}, f32)}, []},
      {%{}, %{d: t.({6}, {:u, 8})}, []},
      {%{}, %{dt_bias: t.({6, 1}, f32)}, []},
      {%{}, %{z: t.({2, 5, 6}, {:f, 16})}, []},
      {%{}, %{h0: t.({2, 6, 3}, f32)}, []},
      {%{}, %{}, [dt_softplus: 1]},
      {%{}, %{}, [return_state: :yes]}
    ]
    |> Enum.map(fn {args, tensors, opts} -> {Map.merge(ok, args), tensors, opts} end)
  end

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
    for {args, tensors, opts} <- ssm_bad_cases() do
      %{x: x, dt: dt, a: a, b: b, c: c} = args
      want = erl_message(fn -> :fusex.selective_scan(erl(x), erl(dt), erl(a), erl(b), erl(c), erl_opts(tensors, opts)) end)

      err = assert_raise ArgumentError, fn ->
        Nx.Defn.jit(fn x, dt, a, b, c, t -> Fusex.Defn.selective_scan(x, dt, a, b, c, t, opts) end).(x, dt, a, b, c, tensors)
      end

      assert err.message == want
    end

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

    ssm_state = Nx.broadcast(Nx.tensor(0, type: {:bf, 16}), {2, 6, 4})
    x = Nx.broadcast(0.0, {2, 6})
    bc = Nx.broadcast(0.0, {2, 4})
    a = Nx.broadcast(-1.0, {6, 4})
    want = erl_message(fn -> :fusex.selective_scan_step(erl(ssm_state), erl(x), erl(x), erl(a), erl(bc), erl(bc), %{}) end)
    assert_raise ArgumentError, want, fn -> Fusex.Defn.selective_scan_step(ssm_state, x, x, a, bc, bc) end
  end

  test "unknown tensors and options, and both forms of liquid's dt, are refused" do
    seq = Nx.broadcast(0.0, {2, 5, 3})

    assert_raise ArgumentError, "opts: expected only the options reverse, return_state, got save_for_backward", fn ->
      Fusex.Defn.linear_scan(seq, seq, %{}, save_for_backward: true)
    end

    assert_raise ArgumentError, "tensors: expected only the tensors d, z, dt_bias, h0, got dstate", fn ->
      Fusex.Defn.selective_scan(seq, seq, Nx.broadcast(-1.0, {3, 2}), Nx.broadcast(0.0, {2, 5, 2}), Nx.broadcast(0.0, {2, 5, 2}), %{dstate: seq})
    end

    assert_raise ArgumentError, "x: expected a tensor, got 1.0", fn ->
      Fusex.Defn.selective_scan(1.0, seq, seq, seq, seq)
    end

    assert_raise ArgumentError, ~r/^dt: expected a number \(opts\) or a tensor \(tensors\), not both/, fn ->
      Fusex.Defn.liquid(seq, Nx.broadcast(1.0, {3}), Nx.broadcast(1.0, {3}), %{dt: Nx.broadcast(1.0, {2, 5, 1})}, dt: 0.5)
    end
  end

  # =====================================================================
  # the blocks follow docs/XLA.md
  # =====================================================================

  # Every Nx.block in a traced expression: [{block struct, operand
  # {type, shape}s, result {type, shape}s}].
  defp blocks_of(fun, args) do
    expr = apply(Nx.Defn.debug_expr(fun), args)
    {_, found} = walk(List.wrap(Nx.Defn.Composite.flatten_list([expr])), {MapSet.new(), []})
    Enum.reverse(found)
  end

  defp walk([], acc), do: acc

  # (map patterns: this module compiles without Nx)
  defp walk([%{__struct__: Nx.Tensor, data: %{__struct__: Nx.Defn.Expr, id: id, op: op, args: args}} | rest], {seen, found}) do
    if MapSet.member?(seen, id) do
      walk(rest, {seen, found})
    else
      seen = MapSet.put(seen, id)

      found =
        case {op, args} do
          {:block, [%Block{} = block, in_args, out, _fun]} ->
            results = out |> List.wrap() |> Enum.flat_map(&Nx.Defn.Composite.flatten_list([&1]))
            [{block, Enum.map(in_args, &{&1.type, &1.shape}), Enum.map(results, &{&1.type, &1.shape})} | found]

          _ ->
            found
        end

      children = Enum.flat_map(args, &tensors_in/1)
      walk(children ++ rest, {seen, found})
    end
  end

  defp walk([_ | rest], acc), do: walk(rest, acc)

  defp tensors_in(%{__struct__: Nx.Tensor} = t), do: [t]
  defp tensors_in(list) when is_list(list), do: Enum.flat_map(list, &tensors_in/1)
  defp tensors_in(tuple) when is_tuple(tuple), do: tuple |> Tuple.to_list() |> Enum.flat_map(&tensors_in/1)
  defp tensors_in(%{custom_grad: {inputs, fun}}) when is_function(fun), do: tensors_in(inputs)
  defp tensors_in(_), do: []

  test "blocks: the targets' names, attributes, operands and results in docs/XLA.md's order" do
    f32 = {:f, 32}
    i = ssm_inputs({2, 37, 6, 4, 2}, f32)
    ds = uniform({2, 6, 4})
    {every, nsaved} = Fusex.Defn.saved_layout(i.x, i.b)

    fun = fn x, dt, a, b, c, d, h0, ds ->
      Nx.Defn.value_and_grad({x, dt, a, b, c, d, h0}, fn {x, dt, a, b, c, d, h0} ->
        {y, state} = Fusex.Defn.selective_scan(x, dt, a, b, c, %{d: d, h0: h0}, dt_softplus: true, return_state: true)
        Nx.add(Nx.sum(y), dot(state, ds))
      end)
    end

    seq = {f32, {2, 37, 6}}
    bc = {f32, {2, 37, 2, 4}}
    state = {f32, {2, 6, 4}}
    saved = {f32, {2, nsaved, 6, 4}}
    operands = [seq, seq, {f32, {6, 4}}, bc, bc, {f32, {6}}, state]
    blocks = blocks_of(fun, [i.x, i.dt, i.a, i.b, i.c, i.d, i.h0, ds])

    fwd = Enum.find(blocks, fn {b, _, _} -> b.direction == :fwd end)
    bwd = Enum.find(blocks, fn {b, _, _} -> b.direction == :bwd end)
    assert {%Block{op: :selective_scan, save_every: ^every} = fb, ^operands, [^seq, ^state, ^saved]} = fwd
    assert Block.target_name(fb) == "fusex_selective_scan_fwd"
    assert fb.attrs == [dt_softplus: 1, has_d: 1, has_z: 0, has_dt_bias: 0, has_h0: 1, return_state: 1, save: 1]
    {bb, bwd_operands, bwd_results} = bwd
    assert Block.target_name(bb) == "fusex_selective_scan_bwd"
    assert bb.attrs == [dt_softplus: 1, has_d: 1, has_z: 0, has_dt_bias: 0, has_h0: 1, has_dstate: 1]
    assert bwd_operands == operands ++ [saved, seq, state]
    assert bwd_results == operands

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
    assert {Block.target_name(fb), fb.attrs} == {"fusex_liquid_fwd", [reverse: 1, dt: 1.0, has_dt: 1, has_h0: 1, return_state: 1]}
    assert {fops, fres} == {p, [hseq, {f32, {2, 3}}]}
    assert {Block.target_name(bb), bb.attrs} == {"fusex_liquid_bwd", [reverse: 1, dt: 1.0, has_dt: 1, has_h0: 1, has_dstate: 0]}
    assert {bops, bres} == {p ++ [hseq, hseq], p}

    # a step: state first, h and the new state out
    [{sb, sops, sres}] =
      blocks_of(fn s, z, c -> Fusex.Defn.mingru_step(s, z, c, %{}, candidate_activation: :g) end,
        [uniform({2, 3}), uniform({2, 3}, {:bf, 16}), uniform({2, 3}, {:bf, 16})])

    assert {Block.target_name(sb), sb.attrs} == {"fusex_mingru_step", [reverse: 0, candidate_g: 1]}
    assert sops == [{f32, {2, 3}}, {{:bf, 16}, {2, 3}}, {{:bf, 16}, {2, 3}}]
    assert sres == [{{:bf, 16}, {2, 3}}, {f32, {2, 3}}]
  end
end
