defmodule FusexDefnSSMTest do
  # Fusex.Defn's selective scan inside defn (jit under the Evaluator, the
  # default implementations of its blocks): values and the gradient of
  # every argument against the Erlang API on the cpu backend (fusex's
  # kernels) and against central differences in f64; every option, awkward
  # shapes, 16-bit and f64 inputs, the step, the saved states, second
  # derivatives, bad input, the blocks. Runs where Nx is present; listed as
  # skipped elsewhere. No Nx macros here (the module compiles without Nx):
  # jit and grad of anonymous functions. The shared pieces are
  # Fusex.DefnCase's (test/ex/support/defn_case.ex).
  use ExUnit.Case, async: false
  @moduletag :nx
  @compile {:no_warn_undefined, [Nx, Nx.Defn, Fusex.Defn, Fusex.Defn.SSM]}

  import Fusex.NxHelpers
  import Fusex.DefnCase
  # the pure-Nx code; the NIF's runs: fusex_defn_runtime_test.exs
  setup :pure_nx
  alias Fusex.Defn.Block


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
      h0: uniform({batch, dim, dstate}, state_type(type))
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
    ds = uniform({batch, dim, dstate}, state_type(type))
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
    # Every gradient is a sum: the parameters' over batch and time, the
    # others' over the later steps the state carries them to (and dstate).
    for {name, g} <- grads do
      terms = if name in [:a, :d, :dt_bias], do: batch * seqlen, else: seqlen * dstate
      assert_close_sum(g, want[name], tol(type), terms, "#{label} d#{name}")
    end
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
        attrs: [dt_softplus: 1, has_d: 1, has_z: 0, has_dt_bias: 1, has_h0: 1, return_state: 1, save: 1]
      }

      {_y, _state, saved} = Fusex.Defn.SSM.forward(fwd, [i.x, i.dt, i.a, i.b, i.c, i.d, i.dt_bias, i.h0])
      assert saved.shape == {batch, nsaved, dim, dstate}
      assert saved.type == state_type(type)

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
        attrs: [dt_softplus: 1, has_d: 1, has_z: 0, has_dt_bias: 1, has_h0: 1, has_dstate: 0]
      }

      saved_in = Nx.as_type(want, state_type(type))
      grads = Fusex.Defn.SSM.backward(bwd, [i.x, i.dt, i.a, i.b, i.c, i.d, i.dt_bias, i.h0, saved_in, dy])

      {_y, ctx} =
        :fusex.selective_scan(erl(i.x), erl(i.dt), erl(i.a), erl(i.b), erl(i.c),
          %{d: erl(i.d), dt_bias: erl(i.dt_bias), h0: erl(i.h0), dt_softplus: true, save_for_backward: true})

      want_grads = :fusex.selective_scan_backward(erl(dy), ctx, %{})

      for {name, g} <- Enum.zip([:x, :dt, :a, :b, :c, :d, :dt_bias, :h0], Tuple.to_list(grads)) do
        label = "#{inspect(dims)} d#{name} from saved states"

        if name in [:a, :d, :dt_bias],
          do: assert_close_sum(g, nx(want_grads[name]), tol(type), batch * seqlen, label),
          else: assert_close(g, nx(want_grads[name]), tol(type), label)
      end
    end
  end

  # =====================================================================
  # gradients against central differences (f64), one output only
  # =====================================================================

  test "gradients of every argument against central differences (f64)" do
    f64 = {:f, 64}
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

  test "a gradient through the state only: the unused output's cotangent is zero" do
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
  end

  # =====================================================================
  # the step
  # =====================================================================

  test "the step: {y, new_state} as the Erlang step (which updates the state in place), gradients against central differences" do
    f64 = {:f, 64}


    for type <- [{:f, 32}, {:f, 64}, {:bf, 16}], groups <- [0, 2] do
      i = ssm_inputs({3, 1, 4, 5, groups}, type)
      frame = fn t -> Nx.squeeze(t, axes: [1]) end
      {x, dt, z, b, c} = {frame.(i.x), frame.(i.dt), frame.(i.z), frame.(i.b), frame.(i.c)}
      state = uniform({3, 4, 5}, state_type(type))
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
  # second derivatives
  # =====================================================================

  test "second derivatives: the scan refuses them (ArgumentError at trace time), the step has them right" do
    f64 = {:f, 64}

    # one chunk (no saved states) and several, every optional tensor
    for dims <- [{2, 7, 3, 2, 0}, {1, 40, 4, 3, 2}], opts <- [[], [dt_softplus: true, return_state: true]] do
      i = ssm_inputs(dims, f64)

      assert_second_order_refused(:selective_scan, {i.x, i.dt, i.a, i.b, i.c, i.d, i.z, i.dt_bias, i.h0}, fn
        {x, dt, a, b, c, d, z, bias, h0} ->
          out = Fusex.Defn.selective_scan(x, dt, a, b, c, %{d: d, z: z, dt_bias: bias, h0: h0}, opts)
          if opts[:return_state], do: Tuple.to_list(out), else: out
      end)
    end

    i = ssm_inputs({2, 1, 4, 3, 2}, f64)
    frame = fn t -> Nx.squeeze(t, axes: [1]) end
    args = {uniform({2, 4, 3}, f64), frame.(i.x), frame.(i.dt), i.a, frame.(i.b), frame.(i.c), i.d, frame.(i.z), i.dt_bias}

    check_second_order("selective_scan_step", args, fn {s, x, dt, a, b, c, d, z, bias} ->
      Tuple.to_list(Fusex.Defn.selective_scan_step(s, x, dt, a, b, c, %{d: d, z: z, dt_bias: bias}, dt_softplus: true))
    end)
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

  test "bad shapes, types and option values raise the Erlang API's messages, at trace time" do
    for {args, tensors, opts} <- ssm_bad_cases() do
      %{x: x, dt: dt, a: a, b: b, c: c} = args
      want = erl_message(fn -> :fusex.selective_scan(erl(x), erl(dt), erl(a), erl(b), erl(c), erl_opts(tensors, opts)) end)

      err = assert_raise ArgumentError, fn ->
        Nx.Defn.jit(fn x, dt, a, b, c, t -> Fusex.Defn.selective_scan(x, dt, a, b, c, t, opts) end).(x, dt, a, b, c, tensors)
      end

      assert err.message == want
    end

    ssm_state = Nx.broadcast(Nx.tensor(0, type: {:bf, 16}), {2, 6, 4})
    x = Nx.broadcast(0.0, {2, 6})
    bc = Nx.broadcast(0.0, {2, 4})
    a = Nx.broadcast(-1.0, {6, 4})
    want = erl_message(fn -> :fusex.selective_scan_step(erl(ssm_state), erl(x), erl(x), erl(a), erl(bc), erl(bc), %{}) end)
    assert_raise ArgumentError, want, fn -> Fusex.Defn.selective_scan_step(ssm_state, x, x, a, bc, bc) end
  end

  test "unknown tensors and options are refused" do
    seq = Nx.broadcast(0.0, {2, 5, 3})

    assert_raise ArgumentError, "tensors: expected only the tensors d, z, dt_bias, h0, got dstate", fn ->
      Fusex.Defn.selective_scan(seq, seq, Nx.broadcast(-1.0, {3, 2}), Nx.broadcast(0.0, {2, 5, 2}), Nx.broadcast(0.0, {2, 5, 2}), %{dstate: seq})
    end

    assert_raise ArgumentError, "x: expected a tensor, got 1.0", fn ->
      Fusex.Defn.selective_scan(1.0, seq, seq, seq, seq)
    end

    assert_raise ArgumentError, "opts: expected only the options dt_softplus, return_state, got reverse", fn ->
      Fusex.Defn.selective_scan(seq, seq, Nx.broadcast(-1.0, {3, 2}), Nx.broadcast(0.0, {2, 5, 2}), Nx.broadcast(0.0, {2, 5, 2}), %{}, reverse: true)
    end
  end

  # =====================================================================
  # the blocks follow the descriptions (docs/XLA.md)
  # =====================================================================

  test "blocks: the targets' names, attributes, operands and results in the descriptions' order" do

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
    assert {%Block{op: :selective_scan} = fb, ^operands, [^seq, ^state, ^saved]} = fwd
    assert every in [8, 16]
    assert Block.target_name(fb) == "fusex_selective_scan_fwd"
    assert fb.attrs == [dt_softplus: 1, has_d: 1, has_z: 0, has_dt_bias: 0, has_h0: 1, return_state: 1, save: 1]
    {bb, bwd_operands, bwd_results} = bwd
    assert Block.target_name(bb) == "fusex_selective_scan_bwd"
    assert bb.attrs == [dt_softplus: 1, has_d: 1, has_z: 0, has_dt_bias: 0, has_h0: 1, has_dstate: 1]
    assert bwd_operands == operands ++ [saved, seq, state]
    assert bwd_results == operands


    for {block, _, _} <- [fwd, bwd], do: assert_description_attrs(block)
  end
end
