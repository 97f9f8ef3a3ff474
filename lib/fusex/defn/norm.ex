if Code.ensure_loaded?(Nx.Defn) do
  defmodule Fusex.Defn.Norm do
    @moduledoc false
    # The default implementations of the norms' blocks (rms_norm and
    # layer_norm, fwd and bwd) in plain Nx, with the targets' operands and
    # results (docs/XLA.md) and the CPU reference's maths (c_src/cpu/norm.c,
    # docs/LAYERS.md): statistics over the last axis in f32 (f64 for f64
    # inputs) from s = x + residual before it is rounded, each result
    # rounded to its type at the end.
    #
    #   xhat = s * rstd (rms_norm) or (s - mean) * rstd (layer_norm),
    #   n = xhat * weight + bias, y = n * silu(gate) (n without a gate);
    #
    # the backward: dn = dy * silu(gate), g = dn * weight, and
    # ds = rstd (g - xhat mean(g xhat)) (rms_norm), rstd (g - mean(g) -
    # xhat mean(g xhat)) (layer_norm), plus the cotangent of s; x and the
    # residual both get ds. The backward reads s and the statistics the
    # forward saved, as the kernels do.

    alias Fusex.Defn.Block
    import Fusex.Defn.Math

    defp has?(block, name), do: Keyword.get(block.attrs, name, 0) == 1
    defp rms?(block), do: block.op == :rms_norm

    # [x, weight, bias?, residual?, gate?] (layer_norm's bias always) and
    # the rest.
    defp take_inputs(block, [x, weight | rest]) do
      {bias, rest} = take_if(rest, not rms?(block) or has?(block, :has_bias))
      {residual, rest} = take_if(rest, has?(block, :has_residual))
      {gate, rest} = take_if(rest, has?(block, :has_gate))
      {%{x: x, weight: weight, bias: bias, residual: residual, gate: gate}, rest}
    end

    defp take_if([t | rest], true), do: {t, rest}
    defp take_if(rest, false), do: {nil, rest}

    defp rows(x), do: x.shape |> Tuple.delete_at(tuple_size(x.shape) - 1) |> Tuple.product()

    # s = x + residual in type c.
    defp sum_in(inp, c) do
      x = Nx.as_type(inp.x, c)
      if inp.residual, do: Nx.add(x, Nx.as_type(inp.residual, c)), else: x
    end

    # {xhat, mean (layer_norm; nil for rms_norm), rstd}, the statistics
    # with a trailing axis of 1.
    defp normalise(block, s) do
      # (a bare float would enter as an f32 constant: eps in s's type)
      eps = Nx.tensor(Block.attr(block, :eps), type: s.type)
      axis = Nx.rank(s) - 1

      if rms?(block) do
        rstd = s |> Nx.pow(2) |> Nx.mean(axes: [axis], keep_axes: true) |> Nx.add(eps) |> Nx.rsqrt()
        {Nx.multiply(s, rstd), nil, rstd}
      else
        mean = Nx.mean(s, axes: [axis], keep_axes: true)
        centred = Nx.subtract(s, mean)
        rstd = centred |> Nx.pow(2) |> Nx.mean(axes: [axis], keep_axes: true) |> Nx.add(eps) |> Nx.rsqrt()
        {Nx.multiply(centred, rstd), mean, rstd}
      end
    end

    defp affine(xhat, inp, c) do
      n = Nx.multiply(xhat, Nx.as_type(inp.weight, c))
      if inp.bias, do: Nx.add(n, Nx.as_type(inp.bias, c)), else: n
    end

    # s's type: f32 with residual_in_f32, else the residual's.
    defp s_type(block, inp), do: if(has?(block, :residual_in_f32), do: {:f, 32}, else: inp.residual.type)

    # ---- forward: y, s (a residual), then what save keeps: (mean,) rstd ----

    @doc false
    def forward(block, args) do
      {inp, []} = take_inputs(block, args)
      type = inp.x.type
      c = compute_type(type)
      s = sum_in(inp, c)
      {xhat, mean, rstd} = normalise(block, s)
      n = affine(xhat, inp, c)
      y = if inp.gate, do: Nx.multiply(n, silu(Nx.as_type(inp.gate, c))), else: n
      rows = rows(inp.x)

      stats =
        if has?(block, :save) do
          for(t <- [mean, rstd], t != nil, do: Nx.reshape(t, {rows}))
        else
          []
        end

      s_out = if inp.residual, do: [Nx.as_type(s, s_type(block, inp))], else: []

      case [Nx.as_type(y, type) | s_out ++ stats] do
        [y] -> y
        outs -> List.to_tuple(outs)
      end
    end

    # ---- backward ----

    @doc false
    # Operands: the forward's, s (a residual), (mean,) rstd, dy, then ds
    # (has_ds). Results: dx, dweight, then dbias, dresidual, dgate where
    # given, each of its input's type. As the kernels: xhat from s as the
    # forward wrote it (x without a residual) and the saved statistics.
    def backward(block, args) do
      {inp, rest} = take_inputs(block, args)
      {xs, rest} = if inp.residual, do: {hd(rest), tl(rest)}, else: {inp.x, rest}
      {mean, rest} = if rms?(block), do: {nil, rest}, else: {hd(rest), tl(rest)}
      [rstd, dy | ds] = rest
      c = compute_type(inp.x.type)
      axis = Nx.rank(inp.x) - 1
      stat = fn t -> t |> Nx.as_type(c) |> Nx.reshape(put_elem(inp.x.shape, axis, 1)) end
      rstd = stat.(rstd)
      centred = if mean, do: Nx.subtract(Nx.as_type(xs, c), stat.(mean)), else: Nx.as_type(xs, c)
      xhat = Nx.multiply(centred, rstd)
      dy = Nx.as_type(dy, c)

      {dn, dgate} =
        case inp.gate do
          nil ->
            {dy, nil}

          gate ->
            g = Nx.as_type(gate, c)
            {Nx.multiply(dy, silu(g)), Nx.multiply(Nx.multiply(dy, affine(xhat, inp, c)), silu_grad(g))}
        end

      leading = Enum.to_list(0..(axis - 1)//1)
      dweight = Nx.sum(Nx.multiply(dn, xhat), axes: leading)
      dbias = Nx.sum(dn, axes: leading)
      g = Nx.multiply(dn, Nx.as_type(inp.weight, c))
      mean_gx = Nx.mean(Nx.multiply(g, xhat), axes: [axis], keep_axes: true)
      centred_g = if rms?(block), do: g, else: Nx.subtract(g, Nx.mean(g, axes: [axis], keep_axes: true))
      dsum = Nx.multiply(rstd, Nx.subtract(centred_g, Nx.multiply(xhat, mean_gx)))

      dsum =
        case ds do
          [ds] -> Nx.add(dsum, Nx.as_type(ds, c))
          [] -> dsum
        end

      grads =
        [Nx.as_type(dsum, inp.x.type), Nx.as_type(dweight, inp.weight.type)] ++
          if(inp.bias, do: [Nx.as_type(dbias, inp.bias.type)], else: []) ++
          if(inp.residual, do: [Nx.as_type(dsum, inp.residual.type)], else: []) ++
          if(inp.gate, do: [Nx.as_type(dgate, inp.gate.type)], else: [])

      List.to_tuple(grads)
    end
  end
end
