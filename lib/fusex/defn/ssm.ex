if Code.ensure_loaded?(Nx.Defn) do
  defmodule Fusex.Defn.SSM do
    @moduledoc false
    # The default implementations of the selective-scan blocks in plain Nx:
    # what runs wherever fusex's XLA targets do not (the Evaluator, EXLA
    # without them, any backend), and the reference the blocks are tested
    # against. Operands and results are the targets' (docs/XLA.md), the
    # maths the CPU reference's (c_src/cpu/ssm.c, docs/SSM.md) in the state
    # type (f32; f64 for f64 inputs), rounded to the input type at the end.
    #
    # The forward walks the sequence once, keeping the state entering every
    # chunk of K steps after the first (`saved`). The backward is the
    # adjoint recurrence of docs/SSM.md, written out (never the derivative
    # of a loop): chunks last to first, each chunk's states recomputed from
    # the saved state entering it, then walked back.

    alias Fusex.Defn.{Block, Loop}
    import Fusex.Defn.Math

    # ---- operands ----

    # The operands of a forward (and the leading ones of a backward), by
    # name: x, dt, a, b, c, then d, z, dt_bias, h0 where given.
    defp take_inputs(block, [x, dt, a, b, c | rest]) do
      {optional, rest} =
        Enum.reduce([d: :has_d, z: :has_z, dt_bias: :has_dt_bias, h0: :has_h0], {%{}, rest}, fn
          {name, flag}, {acc, [t | more]} = state ->
            if Keyword.get(block.attrs, flag, 0) == 1, do: {Map.put(acc, name, t), more}, else: state

          {_name, _flag}, state ->
            state
        end)

      {Map.merge(%{x: x, dt: dt, a: a, b: b, c: c}, optional), rest}
    end

    defp flag?(block, name), do: Block.flag?(block, name)

    # ---- shared pieces ----

    defp dims(x, a, b) do
      {batch, seqlen, dim} = x.shape
      groups = if Nx.rank(b) == 4, do: elem(b.shape, 2), else: 1
      %{batch: batch, seqlen: seqlen, dim: dim, dstate: elem(a.shape, 1), groups: groups}
    end

    # u = dt (+ bias), delta = softplus(u) or u, in type s.
    defp deltas(block, inputs, s) do
      u = Nx.as_type(inputs.dt, s)
      u = if bias = inputs[:dt_bias], do: Nx.add(u, Nx.as_type(bias, s)), else: u
      delta = if flag?(block, :dt_softplus), do: softplus_thresholded(u), else: u
      {u, delta}
    end

    # b or c as [batch, seqlen, groups, 1, dstate] of type s.
    defp group_rows(t, n, s) do
      %{batch: bsz, seqlen: len, groups: g, dstate: ns} = n
      t |> Nx.as_type(s) |> Nx.reshape({bsz, len, g, 1, ns})
    end

    # Step t of rows from group_rows/3, for every channel: [batch, dim, dstate].
    defp channel_rows(rows, t, n) do
      %{batch: bsz, groups: g, dim: dim, dstate: ns} = n

      rows
      |> at_step(t)
      |> Nx.broadcast({bsz, g, div(dim, g), ns})
      |> Nx.reshape({bsz, dim, ns})
    end

    # [batch, dim, dstate] summed over each group's channels: [batch, groups, dstate].
    defp group_sum(v, n) do
      %{batch: bsz, groups: g, dim: dim, dstate: ns} = n
      v |> Nx.reshape({bsz, g, div(dim, g), ns}) |> Nx.sum(axes: [2])
    end

    defp initial_state(inputs, n, s) do
      case inputs[:h0] do
        nil -> zeros({n.batch, n.dim, n.dstate}, s)
        h0 -> Nx.as_type(h0, s)
      end
    end

    # One step of the recurrence for every channel: the state after step t.
    defp advance(h, t, inp, n) do
      decay = Nx.exp(Nx.multiply(Nx.new_axis(at_step(inp.delta, t), 2), inp.a))
      drive = Nx.multiply(Nx.new_axis(at_step(inp.delta_x, t), 2), channel_rows(inp.b, t, n))
      Nx.add(Nx.multiply(decay, h), drive)
    end

    # ---- forward: y, then state (return_state), then saved (save) ----

    @doc false
    def forward(block, args) do
      {inputs, []} = take_inputs(block, args)
      n = dims(inputs.x, inputs.a, inputs.b)
      s = compute_type(inputs.x.type)
      {_u, delta} = deltas(block, inputs, s)
      x = Nx.as_type(inputs.x, s)

      loop_inputs = %{
        delta: delta,
        delta_x: Nx.multiply(delta, x),
        a: Nx.as_type(inputs.a, s),
        b: group_rows(inputs.b, n, s),
        c: group_rows(inputs.c, n, s)
      }

      save = if flag?(block, :save), do: saved_layout(inputs.x, inputs.b), else: nil
      {state, ysum, saved} = forward_loop(initial_state(inputs, n, s), loop_inputs, n, s, save)

      y = if d = inputs[:d], do: Nx.add(ysum, Nx.multiply(Nx.as_type(d, s), x)), else: ysum
      y = if z = inputs[:z], do: Nx.multiply(y, silu(Nx.as_type(z, s))), else: y

      results =
        [Nx.as_type(y, inputs.x.type)] ++
          if(flag?(block, :return_state), do: [state], else: []) ++
          if save, do: [saved], else: []

      tuple_or_single(results)
    end

    @doc false
    # {K, nsaved} for the forward of x and b (the steps between saved
    # states and their number), or nil when the forward saves none (one
    # chunk: docs/XLA.md leaves the operand out then). The rule is fusex's,
    # one C function (fusex:selective_scan_saved_shape/3, _save_every/3).
    def saved_layout(x, b) do
      args = [x.shape, b.shape, x.type]
      {_, nsaved, _, _} = Fusex.Erl.call(:selective_scan_saved_shape, args)
      if nsaved == 0, do: nil, else: {Fusex.Erl.call(:selective_scan_save_every, args), nsaved}
    end

    # The walk over time: the final state, y's sums over states
    # [batch, seqlen, dim], and the saved states where `save` is {K, nsaved}.
    defp forward_loop(h0, loop_inputs, n, s, save) do
      ysum = zeros({n.batch, n.seqlen, n.dim}, s)

      case save do
        {_every, nsaved} ->
          saved = zeros({n.batch, nsaved, n.dim, n.dstate}, s)
          body = fn {h, y, sv}, inp, t -> forward_step(h, y, sv, inp, t, n, save) end
          Loop.repeat({h0, ysum, saved}, loop_inputs, 0, n.seqlen, body: body, step: 1)

        nil ->
          body = fn {h, y}, inp, t ->
            {h, y, nil} = forward_step(h, y, nil, inp, t, n, nil)
            {h, y}
          end

          {h, y} = Loop.repeat({h0, ysum}, loop_inputs, 0, n.seqlen, body: body, step: 1)
          {h, y, nil}
      end
    end

    defp forward_step(h, ysum, saved, inp, t, n, save) do
      h = advance(h, t, inp, n)
      y_t = Nx.sum(Nx.multiply(channel_rows(inp.c, t, n), h), axes: [2])
      {h, put_step(ysum, t, y_t), save_state(saved, h, t, save)}
    end

    # saved[:, k] = the state after step (k + 1) K - 1.
    defp save_state(nil, _h, _t, nil), do: nil

    defp save_state(saved, h, t, {every, nsaved}) do
      next = Nx.add(t, 1)
      slot = Nx.subtract(Nx.quotient(next, every), 1)
      at_end = Nx.logical_and(Nx.equal(Nx.remainder(next, every), 0), Nx.less(slot, nsaved))
      slot = Nx.clip(slot, 0, nsaved - 1)
      old = Nx.slice_along_axis(saved, slot, 1, axis: 1)
      new = Nx.select(at_end, Nx.new_axis(h, 1), old)
      Nx.put_slice(saved, [0, slot, 0, 0], new)
    end

    # ---- backward ----

    @doc false
    # Operands: the forward's, then saved (where the forward saved), dy,
    # then dstate (has_dstate). Results: dx, ddt, da, db, dc, then dd, dz,
    # ddt_bias, dh0 by the flags, each of its input's type.
    def backward(block, args) do
      {inputs, rest} = take_inputs(block, args)

      # The saved states are there where the forward saved some (more
      # than one chunk).
      {saved, dy, dstate} =
        case {flag?(block, :has_dstate), rest} do
          {false, [dy]} -> {nil, dy, nil}
          {true, [dy, ds]} -> {nil, dy, ds}
          {false, [sv, dy]} -> {sv, dy, nil}
          {true, [sv, dy, ds]} -> {sv, dy, ds}
        end

      n = dims(inputs.x, inputs.a, inputs.b)
      s = compute_type(inputs.x.type)
      loop_inputs = backward_inputs(block, inputs, saved, Nx.as_type(dy, s), n, s)
      grads0 = initial_grads(inputs, dstate, n, s)

      every = if saved, do: elem(saved_layout(inputs.x, inputs.b), 0), else: n.seqlen
      chunks = div(n.seqlen + every - 1, every)
      ctx = %{n: n, every: every, z?: inputs[:z] != nil, saved?: saved != nil}
      body = fn grads, inp, chunk -> backward_chunk(grads, inp, chunk, ctx) end
      grads = Loop.repeat(grads0, loop_inputs, chunks - 1, chunks, body: body, step: -1)

      like = fn t, ref -> Nx.as_type(t, ref.type) end
      to_b_shape = fn t -> Nx.reshape(t, inputs.b.shape) end

      results =
        [
          like.(grads.dx, inputs.x),
          like.(grads.ddt, inputs.dt),
          like.(grads.da, inputs.a),
          like.(to_b_shape.(grads.db), inputs.b),
          like.(to_b_shape.(grads.dc), inputs.c)
        ] ++
          optional_grad(inputs, :d, grads.dd) ++
          optional_grad(inputs, :z, grads.dz) ++
          optional_grad(inputs, :dt_bias, grads.ddt_bias) ++ optional_grad(inputs, :h0, grads.g)

      List.to_tuple(results)
    end

    # What every step of the backward reads, in type s.
    defp backward_inputs(block, inputs, saved, dy, n, s) do
      {u, delta} = deltas(block, inputs, s)
      x = Nx.as_type(inputs.x, s)

      # dyp = dy silu(z); dz = dy ypre silu'(z), ypre recomputed per step
      {dyp, dz_factor} =
        case inputs[:z] do
          nil -> {dy, zeros({1, 1, 1}, s)}
          z -> {Nx.multiply(dy, silu(Nx.as_type(z, s))), Nx.multiply(dy, silu_grad(Nx.as_type(z, s)))}
        end

      %{
        delta: delta,
        delta_x: Nx.multiply(delta, x),
        x: x,
        a: Nx.as_type(inputs.a, s),
        b: group_rows(inputs.b, n, s),
        c: group_rows(inputs.c, n, s),
        dyp: dyp,
        dz_factor: dz_factor,
        softplus_grad: if(flag?(block, :dt_softplus), do: softplus_thresholded_grad(u), else: ones(u.shape, s)),
        dskip: if(d = inputs[:d], do: Nx.as_type(d, s), else: zeros({n.dim}, s)),
        h0: initial_state(inputs, n, s),
        # Without saved states a one-element zero tensor stands in, never
        # read (ctx.saved? is false): a while loop's state cannot hold nil.
        saved: saved || zeros({1, 1, 1, 1}, s)
      }
    end

    # The backward's carry: g (dL/dh of the step after, dstate at the end),
    # the per-step gradients and the sums.
    defp initial_grads(inputs, dstate, n, s) do
      seq = {n.batch, n.seqlen, n.dim}
      rows = {n.batch, n.seqlen, n.groups, n.dstate}

      %{
        g: if(dstate, do: Nx.as_type(dstate, s), else: zeros({n.batch, n.dim, n.dstate}, s)),
        dx: zeros(seq, s),
        ddt: zeros(seq, s),
        dz: if(inputs[:z], do: zeros(seq, s), else: zeros({1, 1, 1}, s)),
        db: zeros(rows, s),
        dc: zeros(rows, s),
        da: zeros({n.dim, n.dstate}, s),
        dd: zeros({n.dim}, s),
        ddt_bias: zeros({n.dim}, s)
      }
    end

    defp optional_grad(inputs, name, grad) do
      case inputs[name] do
        nil -> []
        input -> [Nx.as_type(grad, input.type)]
      end
    end

    # Chunk `chunk` (steps t0 .. t0 + len - 1): its states recomputed from
    # the state entering it, then the adjoint walked back through them.
    defp backward_chunk(grads, inp, chunk, ctx) do
      %{n: n, every: every} = ctx
      t0 = Nx.multiply(chunk, every)
      len = Nx.min(every, Nx.subtract(n.seqlen, t0))

      start =
        if ctx.saved? do
          prev = inp.saved |> Nx.slice_along_axis(Nx.max(Nx.subtract(chunk, 1), 0), 1, axis: 1) |> Nx.squeeze(axes: [1])
          Nx.select(Nx.equal(chunk, 0), inp.h0, prev)
        else
          inp.h0
        end

      # states[i] = the state after step t0 + i - 1 (states[0] enters the chunk)
      states = zeros({every + 1, n.batch, n.dim, n.dstate}, start.type)
      states = Nx.put_slice(states, [0, 0, 0, 0], Nx.new_axis(start, 0))

      recompute = fn sts, inp, i ->
        h = sts |> Nx.slice_along_axis(i, 1, axis: 0) |> Nx.squeeze(axes: [0])
        h = advance(h, Nx.add(inp.t0, i), inp.chunk, n)
        Nx.put_slice(sts, [Nx.add(i, 1), 0, 0, 0], Nx.new_axis(h, 0))
      end

      chunk_inp = %{chunk: inp, t0: t0}
      states = Loop.repeat(states, chunk_inp, 0, len, body: recompute, step: 1)

      adjoint = fn grads, ci, i -> adjoint_step(grads, ci, i, ctx) end
      Loop.repeat(grads, Map.put(chunk_inp, :states, states), Nx.subtract(len, 1), len, body: adjoint, step: -1)
    end

    # One step of docs/SSM.md's adjoint, at step t0 + i.
    defp adjoint_step(grads, ci, i, ctx) do
      %{n: n} = ctx
      inp = ci.chunk
      t = Nx.add(ci.t0, i)
      prev = ci.states |> Nx.slice_along_axis(i, 1, axis: 0) |> Nx.squeeze(axes: [0])
      cur = ci.states |> Nx.slice_along_axis(Nx.add(i, 1), 1, axis: 0) |> Nx.squeeze(axes: [0])

      delta = at_step(inp.delta, t)
      x = at_step(inp.x, t)
      dyp = at_step(inp.dyp, t)
      b = channel_rows(inp.b, t, n)
      c = channel_rows(inp.c, t, n)
      decay = Nx.exp(Nx.multiply(Nx.new_axis(delta, 2), inp.a))

      # g_t = c_t dyp_t + exp(delta_{t+1} a) g_{t+1}: everything reaching h_t
      g = Nx.add(Nx.multiply(c, Nx.new_axis(dyp, 2)), grads.g)
      ddelta = Nx.sum(Nx.multiply(g, Nx.add(Nx.multiply(Nx.multiply(inp.a, decay), prev), Nx.multiply(b, Nx.new_axis(x, 2)))), axes: [2])
      ddt = Nx.multiply(ddelta, at_step(inp.softplus_grad, t))
      dx = Nx.add(Nx.multiply(delta, Nx.sum(Nx.multiply(g, b), axes: [2])), Nx.multiply(inp.dskip, dyp))
      db = group_sum(Nx.multiply(g, Nx.new_axis(at_step(inp.delta_x, t), 2)), n)
      dc = group_sum(Nx.multiply(Nx.new_axis(dyp, 2), cur), n)
      da = Nx.sum(Nx.multiply(Nx.multiply(g, Nx.new_axis(delta, 2)), Nx.multiply(decay, prev)), axes: [0])

      dz =
        if ctx.z? do
          ypre = Nx.add(Nx.sum(Nx.multiply(c, cur), axes: [2]), Nx.multiply(inp.dskip, x))
          put_step(grads.dz, t, Nx.multiply(at_step(inp.dz_factor, t), ypre))
        else
          grads.dz
        end

      %{
        g: Nx.multiply(decay, g),
        dx: put_step(grads.dx, t, dx),
        ddt: put_step(grads.ddt, t, ddt),
        dz: dz,
        db: put_step(grads.db, t, db),
        dc: put_step(grads.dc, t, dc),
        da: Nx.add(grads.da, da),
        dd: Nx.add(grads.dd, Nx.sum(Nx.multiply(dyp, x), axes: [0])),
        ddt_bias: Nx.add(grads.ddt_bias, Nx.sum(ddt, axes: [0]))
      }
    end

    # ---- step: y, new_state ----

    @doc false
    # Operands: state, x, dt, a, b, c, then d, z, dt_bias by the flags.
    def step(block, [state | args]) do
      {inputs, []} = take_inputs(block, args)
      {bsz, dim} = inputs.x.shape
      ns = elem(inputs.a.shape, 1)
      g = if Nx.rank(inputs.b) == 3, do: elem(inputs.b.shape, 1), else: 1
      n = %{batch: bsz, seqlen: 1, dim: dim, dstate: ns, groups: g}
      s = wider(compute_type(inputs.x.type), state.type)
      {_u, delta} = deltas(block, inputs, s)
      x = Nx.as_type(inputs.x, s)
      rows = fn t -> t |> Nx.as_type(s) |> Nx.reshape({bsz, 1, g, 1, ns}) |> channel_rows(0, n) end
      decay = Nx.exp(Nx.multiply(Nx.new_axis(delta, 2), Nx.as_type(inputs.a, s)))
      drive = Nx.multiply(Nx.new_axis(Nx.multiply(delta, x), 2), rows.(inputs.b))
      h = Nx.add(Nx.multiply(decay, Nx.as_type(state, s)), drive)
      y = Nx.sum(Nx.multiply(rows.(inputs.c), h), axes: [2])
      y = if d = inputs[:d], do: Nx.add(y, Nx.multiply(Nx.as_type(d, s), x)), else: y
      y = if z = inputs[:z], do: Nx.multiply(y, silu(Nx.as_type(z, s))), else: y
      {Nx.as_type(y, inputs.x.type), Nx.as_type(h, state.type)}
    end

    defp tuple_or_single([one]), do: one
    defp tuple_or_single(many), do: List.to_tuple(many)
  end
end
