if Code.ensure_loaded?(Nx.Defn) do
  defmodule Fusex.Defn.Linrec do
    @moduledoc false
    # The default implementations of the linear-recurrence blocks
    # (linear_scan, mingru, minlstm, liquid) in plain Nx, with the targets'
    # operands and results (docs/XLA.md) and the CPU reference's maths
    # (c_src/cpu/linrec.c, docs/LINREC.md) in the state type (f32; f64 for
    # f64 inputs), rounded to the input type at the end.
    #
    # Every op is h_t = a_t h_{t-1} + b_t with (a_t, b_t) elementwise in the
    # inputs: the forward is one loop over time. The backward is the adjoint
    # of docs/LINREC.md written out: g_t = dh_t + a_{t+1} g_{t+1} (g after
    # the last step: dstate) is one more such loop, run on the time-reversed
    # sequences; every input's gradient then follows elementwise from g_t
    # and h_{t-1}, read from the forward's output h as the kernels read it.

    alias Fusex.Defn.{Block, Loop}
    import Fusex.Defn.Math

    @doc false
    # The sequence inputs of each op, in operand order.
    def seq_names(:linear_scan), do: [:a, :b]
    def seq_names(:mingru), do: [:z_logits, :cand]
    def seq_names(:minlstm), do: [:f_logits, :i_logits, :cand]
    def seq_names(:liquid), do: [:f_logits]

    # ---- operands ----

    # P (by name; liquid's tau and a as :tau and :lam), then the dt tensor
    # where has_dt, then h0 where has_h0 (fwd and bwd); the rest.
    defp take_inputs(block, args, with_h0) do
      names = seq_names(block.op) ++ if(block.op == :liquid, do: [:tau, :lam], else: [])
      {p, rest} = Enum.split(args, length(names))
      inputs = Map.new(Enum.zip(names, p))
      {inputs, rest} = take_if(inputs, rest, :dt, has?(block, :has_dt))
      take_if(inputs, rest, :h0, with_h0 and has?(block, :has_h0))
    end

    defp take_if(inputs, [t | rest], name, true), do: {Map.put(inputs, name, t), rest}
    defp take_if(inputs, rest, _name, false), do: {inputs, rest}

    defp has?(block, name), do: Keyword.get(block.attrs, name, 0) == 1

    defp first(block, inputs), do: inputs[hd(seq_names(block.op))]

    # liquid's dt: the tensor ([batch, seqlen, 1] or [batch, 1]) or the
    # attribute.
    defp dt_of(block, inputs, s) do
      case inputs[:dt] do
        nil -> Nx.tensor(Block.attr(block, :dt), type: s)
        dt -> Nx.as_type(dt, s)
      end
    end

    # ---- the per-op maths (sequences or frames: everything elementwise) ----

    # g(x) = x + 1/2 for x >= 0, sigmoid(x) below.
    defp cand_value(x, false), do: x
    defp cand_value(x, true), do: Nx.select(Nx.greater_equal(x, 0), Nx.add(x, 0.5), Nx.sigmoid(x))

    defp cand_slope(x, false), do: Nx.broadcast(Nx.tensor(1, type: x.type), x.shape)

    defp cand_slope(x, true) do
      s = Nx.sigmoid(x)
      Nx.select(Nx.greater_equal(x, 0), 1.0, Nx.multiply(s, Nx.subtract(1, s)))
    end

    # MinLSTM's gates: f' = sigmoid(d), i' = sigmoid(-d) with
    # d = softplus(-i_logits) - softplus(-f_logits) (finite for any logits).
    defp minlstm_d(fl, il), do: Nx.subtract(softplus(Nx.negate(il)), softplus(Nx.negate(fl)))

    # The inputs (as type s) and (a_t, b_t).
    defp coefficients(block, inputs, s) do
      x = Map.new(inputs, fn {k, v} -> {k, if(k in [:h0], do: v, else: Nx.as_type(v, s))} end)
      g? = has?(block, :candidate_g)

      case block.op do
        :linear_scan ->
          {x, x.a, x.b}

        :mingru ->
          z = Nx.sigmoid(x.z_logits)
          {x, Nx.sigmoid(Nx.negate(x.z_logits)), Nx.multiply(z, cand_value(x.cand, g?))}

        :minlstm ->
          d = minlstm_d(x.f_logits, x.i_logits)
          {x, Nx.sigmoid(d), Nx.multiply(Nx.sigmoid(Nx.negate(d)), cand_value(x.cand, g?))}

        :liquid ->
          dt = dt_of(block, inputs, s)
          f = Nx.sigmoid(x.f_logits)
          den = Nx.add(1, Nx.multiply(dt, Nx.add(Nx.divide(1, x.tau), f)))
          {x, Nx.divide(1, den), Nx.divide(Nx.multiply(Nx.multiply(dt, f), x.lam), den)}
      end
    end

    # ---- the scan: h_t = a_t h_{t-1} + b_t over axis 1 ----

    defp scan(a, b, h0) do
      {_bsz, len, _hidden} = a.shape
      body = fn {h, out}, inp, t ->
        h = Nx.add(Nx.multiply(at_step(inp.a, t), h), at_step(inp.b, t))
        {h, put_step(out, t, h)}
      end

      {state, out} = Loop.repeat({h0, zeros(a.shape, a.type)}, %{a: a, b: b}, 0, len, body: body, step: 1)
      {out, state}
    end

    # ---- forward: h, then state (return_state) ----

    @doc false
    def forward(block, args) do
      {inputs, []} = take_inputs(block, args, true)
      type = first(block, inputs).type
      s = compute_type(type)
      {_x, a, b} = coefficients(block, inputs, s)
      reverse = has?(block, :reverse)
      {bsz, _len, hidden} = a.shape
      h0 = if h0 = inputs[:h0], do: Nx.as_type(h0, s), else: zeros({bsz, hidden}, s)
      {h, state} = scan(flip(a, reverse), flip(b, reverse), h0)
      h = Nx.as_type(flip(h, reverse), type)
      if has?(block, :return_state), do: {h, state}, else: h
    end

    # ---- backward ----

    @doc false
    # Operands: the forward's, then h, dh, then dstate (has_dstate).
    # Results: one gradient per input of P, then dt's (has_dt), then dh0
    # (has_h0), each of its input's type.
    def backward(block, args) do
      {inputs, rest} = take_inputs(block, args, true)

      {h, dh, dstate} =
        case {has?(block, :has_dstate), rest} do
          {false, [h, dh]} -> {h, dh, nil}
          {true, [h, dh, ds]} -> {h, dh, ds}
        end

      type = first(block, inputs).type
      s = compute_type(type)
      reverse = has?(block, :reverse)

      # Everything in scan order (time reversed for reverse): step k of the
      # scan reads h_{k-1}, the forward's output at the step before (h0 or
      # zeros at the first).
      scan_inputs = Map.new(inputs, fn {k, v} -> {k, if(k in [:tau, :lam, :h0], do: v, else: flip(v, reverse))} end)
      {x, a, _b} = coefficients(block, scan_inputs, s)
      {bsz, _len, hidden} = a.shape
      h0 = if h0 = inputs[:h0], do: Nx.as_type(h0, s), else: zeros({bsz, hidden}, s)
      h = flip(Nx.as_type(h, s), reverse)
      hprev = shift_in(Nx.new_axis(h0, 1), h)

      # g_k = dh_k + a_{k+1} g_{k+1}, g_{L-1} = dh_{L-1} + dstate: a scan
      # over the reversed steps whose coefficient at step r is a_{k+1}.
      dh = flip(Nx.as_type(dh, s), reverse)
      a_next = shift_in(ones({bsz, 1, hidden}, s), Nx.reverse(a, axes: [1]))
      g_end = if dstate, do: Nx.as_type(dstate, s), else: zeros({bsz, hidden}, s)
      {g_rev, _} = scan(a_next, Nx.reverse(dh, axes: [1]), g_end)
      g = Nx.reverse(g_rev, axes: [1])

      {seq_grads, extra} = step_grads(block, x, scan_inputs, g, hprev, s)
      dh0 = Nx.multiply(Nx.slice_along_axis(a, 0, 1, axis: 1) |> Nx.squeeze(axes: [1]), g |> Nx.slice_along_axis(0, 1, axis: 1) |> Nx.squeeze(axes: [1]))

      grads =
        Enum.map(seq_names(block.op), fn name -> Nx.as_type(flip(seq_grads[name], reverse), inputs[name].type) end) ++
          liquid_grads(block, inputs, extra, reverse) ++
          if(inputs[:h0], do: [Nx.as_type(dh0, inputs.h0.type)], else: [])

      List.to_tuple(grads)
    end

    # [head, seq_0, ..., seq_{L-2}] along axis 1: seq delayed by one step.
    defp shift_in(head, seq) do
      case elem(seq.shape, 1) do
        1 -> head
        len -> Nx.concatenate([head, Nx.slice_along_axis(seq, 0, len - 1, axis: 1)], axis: 1)
      end
    end

    defp liquid_grads(%Block{op: :liquid}, inputs, extra, reverse) do
      [Nx.as_type(extra.tau, inputs.tau.type), Nx.as_type(extra.lam, inputs.lam.type)] ++
        case inputs[:dt] do
          nil -> []
          dt -> [Nx.as_type(flip(extra.dt, reverse), dt.type)]
        end
    end

    defp liquid_grads(_block, _inputs, _extra, _reverse), do: []

    # The gradients of one step's inputs from g (everything reaching h_t)
    # and h_{t-1}, for every step at once (c_src/cpu/linrec.c, step_grad).
    defp step_grads(block, x, inputs, g, hprev, s) do
      g? = has?(block, :candidate_g)

      case block.op do
        :linear_scan ->
          {%{a: Nx.multiply(g, hprev), b: g}, nil}

        :mingru ->
          z = Nx.sigmoid(x.z_logits)
          c = cand_value(x.cand, g?)
          dz = Nx.multiply(Nx.multiply(g, Nx.subtract(c, hprev)), Nx.multiply(z, Nx.subtract(1, z)))
          {%{z_logits: dz, cand: Nx.multiply(Nx.multiply(g, z), cand_slope(x.cand, g?))}, nil}

        :minlstm ->
          d = minlstm_d(x.f_logits, x.i_logits)
          fp = Nx.sigmoid(d)
          ip = Nx.sigmoid(Nx.negate(d))
          c = cand_value(x.cand, g?)
          dd = Nx.multiply(Nx.multiply(g, Nx.subtract(hprev, c)), Nx.multiply(fp, ip))

          {%{
             f_logits: Nx.multiply(dd, Nx.sigmoid(Nx.negate(x.f_logits))),
             i_logits: Nx.negate(Nx.multiply(dd, Nx.sigmoid(Nx.negate(x.i_logits)))),
             cand: Nx.multiply(Nx.multiply(g, ip), cand_slope(x.cand, g?))
           }, nil}

        :liquid ->
          dt = dt_of(block, inputs, s)
          f = Nx.sigmoid(x.f_logits)
          inv_tau = Nx.divide(1, x.tau)
          den = Nx.add(1, Nx.multiply(dt, Nx.add(inv_tau, f)))
          h = Nx.divide(Nx.add(hprev, Nx.multiply(Nx.multiply(dt, f), x.lam)), den)
          gd = Nx.divide(g, den)
          dfl = Nx.multiply(Nx.multiply(Nx.multiply(gd, dt), Nx.subtract(x.lam, h)), Nx.multiply(f, Nx.subtract(1, f)))
          dtau = Nx.sum(Nx.multiply(Nx.multiply(Nx.multiply(gd, h), dt), Nx.multiply(inv_tau, inv_tau)), axes: [0, 1])
          dlam = Nx.sum(Nx.multiply(Nx.multiply(gd, dt), f), axes: [0, 1])
          ddt = Nx.multiply(gd, Nx.subtract(Nx.multiply(f, x.lam), Nx.multiply(h, Nx.add(inv_tau, f))))
          {%{f_logits: dfl}, %{tau: dtau, lam: dlam, dt: Nx.sum(ddt, axes: [2], keep_axes: true)}}
      end
    end

    # ---- step: h, new_state ----

    @doc false
    # Operands: state, P (frames [batch, hidden]), then the dt tensor
    # ([batch, 1]) where has_dt. Results: h (the inputs' type), the new
    # state (state's type).
    def step(block, [state | args]) do
      {inputs, []} = take_inputs(block, args, false)
      type = first(block, inputs).type
      s = compute_type(type)
      {_x, a, b} = coefficients(block, inputs, s)
      h = Nx.add(Nx.multiply(a, Nx.as_type(state, s)), b)
      {Nx.as_type(h, type), Nx.as_type(h, state.type)}
    end
  end
end
