if Code.ensure_loaded?(Nx.Defn) do
  defmodule Fusex.Defn.RNN do
    @moduledoc false
    # The default implementations of the GRU and LSTM blocks in plain Nx,
    # with the targets' operands and results (docs/XLA.md, docs/RNN.md) and
    # the CPU reference's maths (c_src/cpu/rnn.c) in the state type (f32;
    # f64 for f64 inputs), rounded to the input type at the end.
    #
    # The forward keeps what the kernels keep (include/fusex_rnn.h: per
    # layer and step the gates after their nonlinearity and the states,
    # GRU r z n (W_hn h + b_hn) h, LSTM i f g o c h); the backward is the
    # adjoint recurrence written out over those, layer by layer from the
    # top, one reversed loop over time each, the weights' gradients summed
    # over batch and time.

    alias Fusex.Defn.{Block, Loop}
    import Fusex.Defn.Math

    defp cell(%Block{op: op}), do: op
    defp gates(:gru), do: 3
    defp gates(:lstm), do: 4
    defp width(:gru), do: 5
    defp width(:lstm), do: 6
    defp has?(block, name), do: Keyword.get(block.attrs, name, 0) == 1
    defp nlayers(block), do: trunc(Block.attr(block, :layers))

    # x (or a step's h, c, x), h0 and c0 where present, the rest; then the
    # layers' parameters, four each, in the state type.
    defp take(args, true), do: {hd(args), tl(args)}
    defp take(args, false), do: {nil, args}

    defp params(rest, s) do
      rest |> Enum.chunk_every(4) |> Enum.map(fn ps -> ps |> Enum.map(&Nx.as_type(&1, s)) |> List.to_tuple() end)
    end

    defp block_of(t, k, hidden), do: Nx.slice_along_axis(t, k * hidden, hidden, axis: -1)

    # One step of one layer: ax (W_ih x + b_ih, [batch, G*hidden]) and
    # h, c: {h, c, the saved row}.
    defp cell_step(:gru, ax, h, c, wh, bh, hidden) do
      ah = Nx.add(Nx.dot(h, [1], wh, [1]), bh)
      r = Nx.sigmoid(Nx.add(block_of(ax, 0, hidden), block_of(ah, 0, hidden)))
      z = Nx.sigmoid(Nx.add(block_of(ax, 1, hidden), block_of(ah, 1, hidden)))
      hn = block_of(ah, 2, hidden)
      n = Nx.tanh(Nx.add(block_of(ax, 2, hidden), Nx.multiply(r, hn)))
      h2 = Nx.add(Nx.multiply(Nx.subtract(1, z), n), Nx.multiply(z, h))
      {h2, c, Nx.concatenate([r, z, n, hn, h2], axis: 1)}
    end

    defp cell_step(:lstm, ax, h, c, wh, bh, hidden) do
      a = Nx.add(ax, Nx.add(Nx.dot(h, [1], wh, [1]), bh))
      i = Nx.sigmoid(block_of(a, 0, hidden))
      f = Nx.sigmoid(block_of(a, 1, hidden))
      g = Nx.tanh(block_of(a, 2, hidden))
      o = Nx.sigmoid(block_of(a, 3, hidden))
      c2 = Nx.add(Nx.multiply(f, c), Nx.multiply(i, g))
      h2 = Nx.multiply(o, Nx.tanh(c2))
      {h2, c2, Nx.concatenate([i, f, g, o, c2, h2], axis: 1)}
    end

    # One layer over the sequence x_in [batch, seqlen, in]: {its h_t
    # [batch, seqlen, hidden], h_n, c_n, saved [batch, seqlen, width]}.
    defp layer_forward(cell, x_in, {wi, wh, _bi, bh} = p, h0, c0) do
      {batch, len, _} = x_in.shape
      hidden = elem(wh.shape, 1)
      ax = Nx.add(Nx.dot(x_in, [2], wi, [1]), elem(p, 2))

      body = fn {h, c, out, saved}, inp, t ->
        {h2, c2, row} = cell_step(cell, at_step(inp.ax, t), h, c, inp.wh, inp.bh, hidden)
        {h2, c2, put_step(out, t, h2), put_step(saved, t, row)}
      end

      init = {h0, c0, zeros({batch, len, hidden}, h0.type), zeros({batch, len, width(cell) * hidden}, h0.type)}

      # (an empty sequence: no step to trace)
      {h, c, out, saved} = if len == 0, do: init, else: Loop.repeat(init, %{ax: ax, wh: wh, bh: bh}, 0, len, body: body, step: 1)
      {out, h, c, saved}
    end

    defp initial(nil, l, shape, s) when is_integer(l), do: zeros(shape, s)
    defp initial(t, l, _shape, s), do: t |> Nx.slice_along_axis(l, 1, axis: 0) |> Nx.squeeze(axes: [0]) |> Nx.as_type(s)

    # ---- forward: y, h_n, [c_n] (return_state), saved (save) ----

    @doc false
    def forward(block, [x | rest]) do
      cell = cell(block)
      {h0, rest} = take(rest, has?(block, :has_h0))
      {c0, rest} = take(rest, cell == :lstm and has?(block, :has_c0))
      s = compute_type(x.type)
      layers = params(rest, s)
      {batch, _len, _} = x.shape
      hidden = elem(elem(hd(layers), 1).shape, 1)
      state = {batch, hidden}

      {out, hs, cs, saved} =
        layers
        |> Enum.with_index()
        |> Enum.reduce({Nx.as_type(x, s), [], [], []}, fn {p, l}, {x_in, hs, cs, saved} ->
          {out, h, c, sv} = layer_forward(cell, x_in, p, initial(h0, l, state, s), initial(c0, l, state, s))
          {out, [h | hs], [c | cs], [sv | saved]}
        end)

      stack = fn list -> list |> Enum.reverse() |> Nx.stack() end
      states = if has?(block, :return_state), do: [stack.(hs) | if(cell == :lstm, do: [stack.(cs)], else: [])], else: []
      kept = if has?(block, :save), do: [stack.(saved)], else: []

      case [Nx.as_type(out, x.type) | states ++ kept] do
        [y] -> y
        many -> List.to_tuple(many)
      end
    end

    # ---- backward ----

    @doc false
    # Operands: x, [h0], [c0], saved, dy, [dh_n], [dc_n], the layers.
    # Results: dx, [dh0], [dc0], per layer dw_ih, dw_hh, db_ih, db_hh, each
    # of its input's type.
    def backward(block, [x | rest]) do
      cell = cell(block)
      {h0, rest} = take(rest, has?(block, :has_h0))
      {c0, rest} = take(rest, cell == :lstm and has?(block, :has_c0))
      [saved, dy | rest] = rest
      {dh_n, rest} = take(rest, has?(block, :has_dh_n))
      {dc_n, rest} = take(rest, cell == :lstm and has?(block, :has_dc_n))
      s = compute_type(x.type)
      originals = Enum.chunk_every(rest, 4)
      layers = params(rest, s)
      saved = Nx.as_type(saved, s)
      n = nlayers(block)
      {batch, _len, _} = x.shape
      hidden = elem(elem(hd(layers), 1).shape, 1)
      state = {batch, hidden}
      w = width(cell) * hidden
      # layer l's input: x, or the h_t of layer l - 1 (its saved rows' last block)
      input_of = fn
        0 -> Nx.as_type(x, s)
        l -> saved |> Nx.slice_along_axis(l - 1, 1, axis: 0) |> Nx.squeeze(axes: [0]) |> Nx.slice_along_axis(w - hidden, hidden, axis: 2)
      end

      {dx, dh0s, dc0s, grads} =
        Enum.reduce((n - 1)..0//-1, {Nx.as_type(dy, s), [], [], []}, fn l, {d_out, dh0s, dc0s, grads} ->
          saved_l = saved |> Nx.slice_along_axis(l, 1, axis: 0) |> Nx.squeeze(axes: [0])
          x_l = input_of.(l)
          p = Enum.at(layers, l)

          {dx_l, dh0, dc0, g} =
            layer_backward(cell, x_l, p, saved_l, d_out, initial(h0, l, state, s), initial(c0, l, state, s),
              initial(dh_n, l, state, s), initial(dc_n, l, state, s), hidden)

          {dx_l, [dh0 | dh0s], [dc0 | dc0s], [g | grads]}
        end)

      typed = fn ts, like -> Enum.zip_with(ts, like, &Nx.as_type(&1, &2.type)) end

      results =
        [Nx.as_type(dx, x.type)] ++
          if(h0, do: [Nx.as_type(Nx.stack(dh0s), h0.type)], else: []) ++
          if(c0, do: [Nx.as_type(Nx.stack(dc0s), c0.type)], else: []) ++
          Enum.flat_map(Enum.zip(grads, originals), fn {g, orig} -> typed.(Tuple.to_list(g), orig) end)

      List.to_tuple(results)
    end

    # One layer's adjoint: d_out [batch, seqlen, hidden] (the gradient
    # reaching its h_t from above and from y); {dx_l, dh0, dc0, {dw_ih,
    # dw_hh, db_ih, db_hh}}.
    defp layer_backward(cell, x_l, {wi, wh, _bi, _bh}, saved, d_out, h0, c0, dh_n, dc_n, hidden) do
      {batch, len, _} = x_l.shape
      g = gates(cell) * hidden
      s = h0.type
      w = width(cell) * hidden
      hs = Nx.slice_along_axis(saved, w - hidden, hidden, axis: 2)
      cs = if cell == :lstm, do: Nx.slice_along_axis(saved, 4 * hidden, hidden, axis: 2), else: hs

      body = fn {dh, dc, dax, dwh, dbh}, inp, t ->
        row = at_step(inp.saved, t)
        prev = Nx.max(Nx.subtract(t, 1), 0)
        first = Nx.equal(t, 0)
        hp = Nx.select(first, inp.h0, at_step(inp.hs, prev))
        cp = Nx.select(first, inp.c0, at_step(inp.cs, prev))
        dh = Nx.add(dh, at_step(inp.d_out, t))
        {da_x, da_h, dh_direct, dc} = cell_adjoint(cell, row, dh, dc, hp, cp, hidden)
        dhp = Nx.add(dh_direct, Nx.dot(da_h, [1], inp.wh, [0]))
        {dhp, dc, put_step(dax, t, da_x), Nx.add(dwh, Nx.dot(da_h, [0], hp, [0])), Nx.add(dbh, Nx.sum(da_h, axes: [0]))}
      end

      init = {dh_n, dc_n, zeros({batch, len, g}, s), zeros({g, hidden}, s), zeros({g}, s)}
      inputs = %{saved: saved, hs: hs, cs: cs, h0: h0, c0: c0, d_out: d_out, wh: wh}
      {dh0, dc0, dax, dwh, dbh} =
        if len == 0, do: init, else: Loop.repeat(init, inputs, len - 1, len, body: body, step: -1)
      dwi = Nx.dot(dax, [0, 1], x_l, [0, 1])
      dbi = Nx.sum(dax, axes: [0, 1])
      {Nx.dot(dax, [2], wi, [0]), dh0, dc0, {dwi, dwh, dbi, dbh}}
    end

    # One step's adjoint from dh (all that reaches h_t) and dc (c_t's from
    # the step after): {d(W_ih x + b_ih), d(W_hh h + b_hh), h_{t-1}'s
    # gradient but through W_hh, c_{t-1}'s gradient}.
    defp cell_adjoint(:gru, row, dh, dc, hp, _cp, hidden) do
      [r, z, n, hn] = for k <- 0..3, do: block_of(row, k, hidden)
      dn = Nx.multiply(dh, Nx.subtract(1, z))
      dz = Nx.multiply(dh, Nx.subtract(hp, n))
      dan = Nx.multiply(dn, Nx.subtract(1, Nx.multiply(n, n)))
      dar = Nx.multiply(Nx.multiply(dan, hn), Nx.multiply(r, Nx.subtract(1, r)))
      daz = Nx.multiply(dz, Nx.multiply(z, Nx.subtract(1, z)))
      da_x = Nx.concatenate([dar, daz, dan], axis: 1)
      da_h = Nx.concatenate([dar, daz, Nx.multiply(dan, r)], axis: 1)
      {da_x, da_h, Nx.multiply(dh, z), dc}
    end

    defp cell_adjoint(:lstm, row, dh, dc, _hp, cp, hidden) do
      [i, f, g, o, c] = for k <- 0..4, do: block_of(row, k, hidden)
      tc = Nx.tanh(c)
      d_o = Nx.multiply(dh, tc)
      dc = Nx.add(dc, Nx.multiply(Nx.multiply(dh, o), Nx.subtract(1, Nx.multiply(tc, tc))))
      da =
        Nx.concatenate(
          [
            Nx.multiply(Nx.multiply(dc, g), Nx.multiply(i, Nx.subtract(1, i))),
            Nx.multiply(Nx.multiply(dc, cp), Nx.multiply(f, Nx.subtract(1, f))),
            Nx.multiply(Nx.multiply(dc, i), Nx.subtract(1, Nx.multiply(g, g))),
            Nx.multiply(d_o, Nx.multiply(o, Nx.subtract(1, o)))
          ],
          axis: 1
        )

      {da, da, Nx.broadcast(Nx.tensor(0, type: dh.type), dh.shape), Nx.multiply(dc, f)}
    end

    # ---- step: y, new_h, [new_c] ----

    @doc false
    def step(block, [h | rest]) do
      cell = cell(block)
      {c, [x | rest]} = take(rest, cell == :lstm)
      s = compute_type(x.type)
      layers = params(rest, s)
      hidden = elem(h.shape, 2)
      state = {elem(x.shape, 0), hidden}

      {y, hs, cs} =
        layers
        |> Enum.with_index()
        |> Enum.reduce({Nx.as_type(x, s), [], []}, fn {{wi, wh, bi, bh}, l}, {x_in, hs, cs} ->
          ax = Nx.add(Nx.dot(x_in, [1], wi, [1]), bi)
          {h2, c2, _row} = cell_step(cell, ax, initial(h, l, state, s), initial(c, l, state, s), wh, bh, hidden)
          {h2, [h2 | hs], [c2 | cs]}
        end)

      stack = fn list, like -> list |> Enum.reverse() |> Nx.stack() |> Nx.as_type(like.type) end
      y = Nx.as_type(y, x.type)
      if cell == :lstm, do: {y, stack.(hs, h), stack.(cs, c)}, else: {y, stack.(hs, h)}
    end
  end
end
