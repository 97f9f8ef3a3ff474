defmodule FusexDefnNormTest do
  # Fusex.Defn's norms (rms_norm, layer_norm, with the residual before them
  # and the gate after them) inside defn (jit under the Evaluator, the
  # default implementations of their blocks): values and the gradient of
  # every input and the weights against the Erlang API on the cpu backend
  # (fusex's kernels) and against central differences in f64; every
  # option, awkward shapes (rows of 1, 37 and 65,537 elements, ranks 1 to
  # 3), 16-bit and f64 inputs, second derivatives, bad input, the blocks.
  # Runs where Nx is present; listed as skipped elsewhere. The shared
  # pieces are Fusex.DefnCase's.
  use ExUnit.Case, async: false
  @moduletag :nx
  @moduletag timeout: 600_000
  @compile {:no_warn_undefined, [Nx, Nx.Defn, Fusex.Defn]}

  import Fusex.NxHelpers
  import Fusex.DefnCase
  # the pure-Nx code; the NIF's runs: fusex_defn_runtime_test.exs
  setup :pure_nx
  alias Fusex.Defn.Block

  @kinds for d <- Fusex.DefnCase.described(:norm, :fwd), do: d.op

  # The positional inputs: x, weight (and layer_norm's bias).
  defp norm_args(kind, shape, type, wtype) do
    hidden = elem(shape, tuple_size(shape) - 1)
    [uniform(shape, type), uniform({hidden}, wtype, 0.5, 1.5)] ++
      if(kind == :layer_norm, do: [uniform({hidden}, wtype)], else: [])
  end

  defp defn_norm(kind, args, tensors, opts), do: apply(Fusex.Defn, kind, args ++ [tensors, opts])

  # {options, tensors}: every option alone and together.
  defp norm_cases(kind, shape, type) do
    hidden = elem(shape, tuple_size(shape) - 1)
    residual = uniform(shape, type)
    gate = uniform(shape, type)
    bias = if kind == :rms_norm, do: %{bias: uniform({hidden}, type)}, else: %{}

    [
      {[], %{}},
      {[eps: 0.1], %{residual: residual}},
      {[], %{gate: gate}},
      {[eps: 1.0e-3], Map.merge(bias, %{residual: residual, gate: gate})},
      {[residual_in_f32: true], %{residual: residual}}
    ]
  end

  defp defn_norm_run(kind, args, tensors, opts, dy, ds) do
    has_residual = Map.has_key?(tensors, :residual)
    fwd = Nx.Defn.jit(fn args, tensors -> defn_norm(kind, Tuple.to_list(args), tensors, opts) end)

    grad =
      Nx.Defn.jit(fn args, tensors, dy, ds ->
        Nx.Defn.grad({args, tensors}, fn {args, tensors} ->
          case defn_norm(kind, Tuple.to_list(args), tensors, opts) do
            {y, s} when has_residual -> Nx.add(dot(y, dy), dot(s, ds))
            y -> dot(y, dy)
          end
        end)
      end)

    {grads, tensor_grads} = grad.(List.to_tuple(args), tensors, dy, ds)
    {fwd.(List.to_tuple(args), tensors), Tuple.to_list(grads), tensor_grads}
  end

  defp erl_norm_run(kind, args, tensors, opts, dy, ds) do
    eopts = erl_opts(tensors, opts) |> Map.put(:save_for_backward, true)

    {y, s, ctx} =
      case apply(:fusex, kind, Enum.map(args, &erl/1) ++ [eopts]) do
        {y, s, ctx} -> {y, s, ctx}
        {y, ctx} -> {y, nil, ctx}
      end

    bopts = if s, do: %{ds: erl(Nx.as_type(ds, :fusex.type(s)))}, else: %{}
    grads = apply(:fusex, :"#{kind}_backward", [erl(dy), ctx, bopts])
    {nx(y), s && nx(s), Map.new(grads, fn {k, v} -> {k, nx(v)} end)}
  end

  defp check_norm(kind, shape, type, {opts, tensors}, wtype \\ nil) do
    label = "#{kind} #{inspect(type)} #{inspect(shape)} #{inspect(opts)} #{inspect(Map.keys(tensors))}"
    args = norm_args(kind, shape, type, wtype || type)
    dy = uniform(shape, type)
    s_type = if opts[:residual_in_f32], do: {:f, 32}, else: type
    ds = uniform(shape, s_type)
    {out, grads, tensor_grads} = defn_norm_run(kind, args, tensors, opts, dy, ds)
    {want_y, want_s, want} = erl_norm_run(kind, args, tensors, opts, dy, ds)
    # An f64 norm whose sum s is kept in f32 carries f32's rounding.
    t = tol(if type == {:f, 64} and opts[:residual_in_f32] && tensors[:residual], do: {:f, 32}, else: type)

    if want_s do
      {y, s} = out
      assert_close(y, want_y, t, "#{label} y")
      assert_close(s, want_s, t, "#{label} s")
    else
      assert_close(out, want_y, t, "#{label} y")
    end

    names = if kind == :layer_norm, do: [:x, :weight, :bias], else: [:x, :weight]
    assert Enum.sort(Map.keys(want)) == Enum.sort(names ++ Map.keys(tensors))
    floor = reduced_floor(args, tensors, dy, type)

    for {name, g} <- Enum.zip(names, grads) ++ Map.to_list(tensor_grads) do
      if name in [:weight, :bias],
        do: assert_reduced_close(g, want[name], t, floor, "#{label} d#{name}"),
        else: assert_close(g, want[name], t, "#{label} d#{name}")
    end
  end

  # dweight and dbias are sums over the rows: a sum that nearly cancels
  # compares within rel-L2 or f32's rounding of its terms (1e-6 of the
  # sum of their sizes, |dy silu(gate)| |xhat| <= |dy silu(gate)| sqrt(hidden)).
  defp reduced_floor([x | _], tensors, dy, type) do
    hidden = elem(x.shape, tuple_size(x.shape) - 1)
    dn = Nx.abs(Nx.as_type(dy, {:f, 64}))
    dn = if g = tensors[:gate], do: Nx.multiply(dn, Nx.abs(silu64(g))), else: dn
    leading = Enum.to_list(0..(Nx.rank(x) - 2)//1)
    scale = if type == {:f, 32}, do: 1.0e-6, else: 0.0
    dn |> Nx.sum(axes: leading) |> Nx.multiply(scale * :math.sqrt(hidden))
  end

  defp silu64(g), do: g |> Nx.as_type({:f, 64}) |> then(&Nx.multiply(&1, Nx.sigmoid(&1)))

  defp assert_reduced_close(got, want, tol, floor, label) do
    assert got.type == want.type, "#{label}: type"
    err = rel_l2(got, want)
    diff = Nx.subtract(Nx.as_type(got, {:f, 64}), Nx.as_type(want, {:f, 64})) |> Nx.abs()
    within_floor = Nx.to_number(Nx.all(Nx.less_equal(diff, floor))) == 1
    assert is_float(err) and (err <= tol or within_floor), "#{label}: rel-L2 #{inspect(err)} > #{tol}"
  end

  test "norms inside defn: values and every gradient as the Erlang API, every option, awkward shapes (f32, f64)" do
    for type <- [{:f, 32}, {:f, 64}], kind <- @kinds do
      for c <- norm_cases(kind, {3, 37}, type), do: check_norm(kind, {3, 37}, type, c)

      for shape <- [{8}, {4, 1}, {2, 3, 16}], c <- Enum.take(norm_cases(kind, shape, type), 4) do
        # (a row of one element curves on the scale of sqrt(eps))
        c = if elem(shape, tuple_size(shape) - 1) == 1, do: {Keyword.put(elem(c, 0), :eps, 0.01), elem(c, 1)}, else: c
        check_norm(kind, shape, type, c)
      end
    end

    # a long row (the Evaluator is slow on it: one case each)
    for kind <- @kinds, do: check_norm(kind, {1, 65_537}, {:f, 32}, Enum.at(norm_cases(kind, {1, 65_537}, {:f, 32}), 3))
  end

  test "norms in 16-bit types: f32 statistics, rounded at the outputs; weights and a residual in f32" do
    for type <- [{:bf, 16}, {:f, 16}], kind <- @kinds, c <- norm_cases(kind, {4, 24}, type), do: check_norm(kind, {4, 24}, type, c)
    for kind <- @kinds, do: check_norm(kind, {2, 3, 8}, {:bf, 16}, {[], %{gate: uniform({2, 3, 8}, {:bf, 16})}}, {:f, 32})

    x = uniform({2, 8}, {:bf, 16})
    {_y, s} = Fusex.Defn.rms_norm(x, uniform({8}), %{residual: uniform({2, 8})})
    assert s.type == {:f, 32}
  end

  test "gradients of every input and the weights against central differences (f64)" do
    f64 = {:f, 64}
    shape = {3, 6}

    for kind <- @kinds do
      [x, weight | rest] = norm_args(kind, shape, f64, f64)
      dy = uniform(shape, f64)
      ds = uniform(shape, f64)
      bias = if kind == :rms_norm, do: [uniform({6}, f64)], else: rest

      loss = fn {x, weight, bias, residual, gate} ->
        tensors = %{residual: residual, gate: gate}

        {y, s} =
          case kind do
            :rms_norm -> Fusex.Defn.rms_norm(x, weight, Map.put(tensors, :bias, bias), eps: 0.01)
            :layer_norm -> Fusex.Defn.layer_norm(x, weight, bias, tensors, eps: 0.01)
          end

        Nx.add(dot(y, dy), dot(s, ds))
      end

      check_central_differences("#{kind}", {x, weight, hd(bias), uniform(shape, f64), uniform(shape, f64)}, loss)
    end
  end

  test "a gradient through y only: the unused s gets no cotangent" do
    {x, w, r} = {uniform({3, 8}), uniform({8}), uniform({3, 8})}
    dy = uniform({3, 8})
    g = Nx.Defn.jit(fn x, dy -> Nx.Defn.grad(x, fn x -> dot(elem(Fusex.Defn.rms_norm(x, w, %{residual: r}), 0), dy) end) end).(x, dy)
    {_y, _s, ctx} = :fusex.rms_norm(erl(x), erl(w), %{residual: erl(r), save_for_backward: true})
    assert_close(g, nx(:fusex.rms_norm_backward(erl(dy), ctx, %{}).x), 1.0e-5, "dx from y alone")
  end

  test "second derivatives through the norms are refused at trace time" do
    f64 = {:f, 64}

    for kind <- @kinds do
      args = List.to_tuple(norm_args(kind, {2, 5}, f64, f64) ++ [uniform({2, 5}, f64)])

      assert_second_order_refused(kind, args, fn args ->
        [x, w | rest] = Tuple.to_list(args)
        {bias, [residual]} = Enum.split(rest, length(rest) - 1)
        Tuple.to_list(defn_norm(kind, [x, w | bias], %{residual: residual}, []))
      end)
    end
  end

  # =====================================================================
  # bad input: the Erlang API's messages, at trace time
  # =====================================================================

  test "bad shapes, types and option values raise the Erlang API's messages, at trace time" do
    t = fn shape, type -> Nx.broadcast(Nx.tensor(0, type: type), shape) end
    f32 = {:f, 32}
    x = t.({2, 8}, f32)
    w = t.({8}, f32)
    half = t.({2, 8}, {:f, 16})

    cases = [
      {:rms_norm, [t.({2, 8}, {:s, 32}), w], %{}, []},
      {:rms_norm, [x, t.({7}, f32)], %{}, []},
      {:rms_norm, [x, w], %{bias: t.({7}, f32)}, []},
      {:layer_norm, [x, w, t.({7}, f32)], %{}, []},
      {:rms_norm, [x, w], %{residual: t.({2, 7}, f32)}, []},
      {:rms_norm, [x, w], %{residual: half}, []},
      {:rms_norm, [t.({2, 8}, {:bf, 16}), w], %{residual: half}, []},
      {:layer_norm, [x, w, w], %{gate: half}, []},
      {:rms_norm, [x, w], %{gate: t.({2, 7}, f32)}, []},
      {:rms_norm, [x, w], %{}, [eps: -1]},
      {:layer_norm, [x, w, w], %{}, [eps: -0.5]},
      {:rms_norm, [x, w], %{residual: x}, [residual_in_f32: 1]}
    ]

    for {kind, args, tensors, opts} <- cases do
      assert_same_message(
        fn -> Nx.Defn.jit(fn args, t -> defn_norm(kind, Tuple.to_list(args), t, opts) end).(List.to_tuple(args), tensors) end,
        fn -> apply(:fusex, kind, Enum.map(args, &erl/1) ++ [erl_opts(tensors, opts)]) end
      )
    end

    assert_raise ArgumentError, "eps: expected a number, got small", fn -> Fusex.Defn.rms_norm(x, w, %{}, eps: :small) end
    assert_raise ArgumentError, "eps: expected a number, got #{Integer.pow(10, 400)}", fn -> Fusex.Defn.rms_norm(x, w, %{}, eps: Integer.pow(10, 400)) end

    assert_raise ArgumentError, "tensors: expected only the tensors residual, gate, got bias", fn ->
      Fusex.Defn.layer_norm(x, w, w, %{bias: w})
    end
  end

  test "eps of every kind: integers and floats taken as their value, zero included; anything else refused" do
    x = uniform({3, 5})
    w = uniform({5})
    base = Fusex.Defn.rms_norm(x, w, %{}, eps: 2.0)
    assert Nx.to_binary(Fusex.Defn.rms_norm(x, w, %{}, eps: 2)) == Nx.to_binary(base)
    zero = Fusex.Defn.layer_norm(x, w, w, %{}, eps: 0)
    assert Nx.to_binary(zero) == Nx.to_binary(Fusex.Defn.layer_norm(x, w, w, %{}, eps: 0.0))

    for bad <- [true, nil, "1.0", :small, [1]] do
      err = assert_raise ArgumentError, fn -> Fusex.Defn.rms_norm(x, w, %{}, eps: bad) end
      assert err.message =~ ~r/^eps: expected a number, got /
      assert err.message == erl_message(fn -> :fusex.rms_norm(erl(x), erl(w), %{eps: bad}) end) |> String.replace("a fusex tensor", "a tensor")
    end
  end

  # =====================================================================
  # the blocks follow the descriptions (docs/XLA.md)
  # =====================================================================

  test "blocks: the targets' names, attributes, operands and results in the descriptions' order" do
    f32 = {:f, 32}
    {x, w, r, g} = {uniform({2, 3, 8}), uniform({8}), uniform({2, 3, 8}), uniform({2, 3, 8})}

    fun = fn x, w, r, g ->
      Nx.Defn.grad({x, w, r, g}, fn {x, w, r, g} ->
        {y, s} = Fusex.Defn.layer_norm(x, w, w, %{residual: r, gate: g}, eps: 0.5)
        Nx.add(Nx.sum(y), Nx.sum(s))
      end)
    end

    [{fb, fops, fres}, {bb, bops, bres}] = blocks_of(fun, [x, w, r, g]) |> Enum.sort_by(fn {b, _, _} -> b.direction == :bwd end)
    seq = {f32, {2, 3, 8}}
    p = [seq, {f32, {8}}, {f32, {8}}, seq, seq]
    assert {Block.target_name(fb), fb.attrs} == {"fusex_layer_norm_fwd", [eps: 0.5, residual_in_f32: 0, has_residual: 1, has_gate: 1, save: 1]}
    assert {fops, fres} == {p, [seq, seq, {f32, {6}}, {f32, {6}}]}
    assert {Block.target_name(bb), bb.attrs} == {"fusex_layer_norm_bwd", [eps: 0.5, residual_in_f32: 0, has_residual: 1, has_gate: 1, has_ds: 1]}
    assert {bops, bres} == {p ++ [seq, {f32, {6}}, {f32, {6}}, seq, seq], p}

    # (traced, a forward keeps its statistics whether or not a gradient is taken)
    [{rb, rops, rres}] = blocks_of(fn x, w -> Fusex.Defn.rms_norm(x, w) end, [x, w])
    assert {Block.target_name(rb), rb.attrs} == {"fusex_rms_norm_fwd", [eps: 1.0e-5, residual_in_f32: 0, has_bias: 0, has_residual: 0, has_gate: 0, save: 1]}
    assert {rops, rres} == {[seq, {f32, {8}}], [seq, {f32, {6}}]}

    for block <- [fb, bb, rb], do: assert_description_attrs(block)
  end
end
