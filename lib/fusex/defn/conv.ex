if Code.ensure_loaded?(Nx.Defn) do
  defmodule Fusex.Defn.Conv do
    @moduledoc false
    # The default implementations of the causal depthwise convolution's
    # blocks (causal_conv1d fwd, bwd, step) in plain Nx, with the targets'
    # operands and results (docs/XLA.md) and the CPU reference's maths
    # (c_src/cpu/conv.c, docs/LAYERS.md) in f32 (f64 for f64 inputs),
    # rounded to each result's type at the end.
    #
    # The inputs before the first are the initial state's, oldest first:
    # with them in front, x padded is [batch, width - 1 + seqlen, dim] and
    # y_t = act(bias + sum_k w[:, k] padded_{t + k}). The width is at most
    # 16, so the sum over k is written out. Its backward spreads dpre back
    # over the same windows; dw and dbias are sums over batch and time.

    alias Fusex.Defn.Block
    import Fusex.Defn.Math

    defp has?(block, name), do: Keyword.get(block.attrs, name, 0) == 1
    defp silu?(block), do: Block.attr(block, :activation) == 1

    # [x, w, bias?, initial_state?] and the rest.
    defp take_inputs(block, [x, w | rest]) do
      {bias, rest} = take_if(rest, has?(block, :has_bias))
      {init, rest} = take_if(rest, has?(block, :has_initial_state))
      {%{x: x, w: w, bias: bias, initial_state: init}, rest}
    end

    defp take_if([t | rest], true), do: {t, rest}
    defp take_if(rest, false), do: {nil, rest}

    # x with the state's inputs in front: [batch, width - 1 + seqlen, dim].
    defp padded(x, w, init, s) do
      {batch, _len, dim} = x.shape
      width = elem(w.shape, 1)
      x = Nx.as_type(x, s)

      case width do
        1 -> x
        _ ->
          state = if init, do: Nx.as_type(init, s), else: zeros({batch, dim, width - 1}, s)
          Nx.concatenate([Nx.transpose(state, axes: [0, 2, 1]), x], axis: 1)
      end
    end

    # Tap k of w as [dim] in type s.
    defp tap(w, k, s), do: w |> Nx.slice_along_axis(k, 1, axis: 1) |> Nx.squeeze(axes: [1]) |> Nx.as_type(s)

    # The pre-activation of every step: bias + sum_k w[:, k] padded_{t + k}.
    defp pre_activation(padded, w, bias, len, s) do
      width = elem(w.shape, 1)

      sum =
        Enum.reduce(0..(width - 1), nil, fn k, acc ->
          term = Nx.multiply(Nx.slice_along_axis(padded, k, len, axis: 1), tap(w, k, s))
          if acc, do: Nx.add(acc, term), else: term
        end)

      if bias, do: Nx.add(sum, Nx.as_type(bias, s)), else: sum
    end

    defp activate(pre, true), do: silu(pre)
    defp activate(pre, false), do: pre

    # The last width - 1 inputs, oldest first: [batch, dim, width - 1].
    defp final_state(padded, len, width) do
      padded |> Nx.slice_along_axis(len, width - 1, axis: 1) |> Nx.transpose(axes: [0, 2, 1])
    end

    # ---- forward: y, then final_state (return_state) ----

    @doc false
    def forward(block, args) do
      {inp, []} = take_inputs(block, args)
      type = inp.x.type
      s = compute_type(type)
      {_batch, len, _dim} = inp.x.shape
      width = elem(inp.w.shape, 1)
      p = padded(inp.x, inp.w, inp.initial_state, s)
      y = p |> pre_activation(inp.w, inp.bias, len, s) |> activate(silu?(block)) |> Nx.as_type(type)

      if has?(block, :return_state) do
        {y, final_state(p, len, width) |> Nx.as_type(type)}
      else
        y
      end
    end

    # ---- backward ----

    @doc false
    # Operands: the forward's, dy, then dfinal_state (has_dfinal_state).
    # Results: dx, dw, then dbias and dinitial_state where given, each of
    # its input's type.
    def backward(block, args) do
      {inp, rest} = take_inputs(block, args)

      {dy, dfinal} =
        case {has?(block, :has_dfinal_state), rest} do
          {false, [dy]} -> {dy, nil}
          {true, [dy, df]} -> {dy, df}
        end

      s = compute_type(inp.x.type)
      {_batch, len, _dim} = inp.x.shape
      width = elem(inp.w.shape, 1)
      p = padded(inp.x, inp.w, inp.initial_state, s)
      pre = pre_activation(p, inp.w, inp.bias, len, s)
      dy = Nx.as_type(dy, s)
      dpre = if silu?(block), do: Nx.multiply(dy, silu_grad(pre)), else: dy

      # dpadded_j = sum_k dpre_{j - k} w[:, k], and the final state's
      # cotangent on the last width - 1 inputs.
      dpadded =
        Enum.reduce(0..(width - 1), nil, fn k, acc ->
          term = Nx.pad(Nx.multiply(dpre, tap(inp.w, k, s)), 0.0, [{0, 0, 0}, {k, width - 1 - k, 0}, {0, 0, 0}])
          if acc, do: Nx.add(acc, term), else: term
        end)

      dpadded =
        if dfinal do
          tail = dfinal |> Nx.as_type(s) |> Nx.transpose(axes: [0, 2, 1])
          Nx.add(dpadded, Nx.pad(tail, 0.0, [{0, 0, 0}, {len, 0, 0}, {0, 0, 0}]))
        else
          dpadded
        end

      dx = Nx.slice_along_axis(dpadded, width - 1, len, axis: 1)

      dw =
        for k <- 0..(width - 1) do
          Nx.sum(Nx.multiply(dpre, Nx.slice_along_axis(p, k, len, axis: 1)), axes: [0, 1])
        end
        |> Nx.stack(axis: 1)

      grads =
        [Nx.as_type(dx, inp.x.type), Nx.as_type(dw, inp.w.type)] ++
          if(inp.bias, do: [Nx.as_type(Nx.sum(dpre, axes: [0, 1]), inp.bias.type)], else: []) ++
          if(inp.initial_state,
            do: [dpadded |> Nx.slice_along_axis(0, width - 1, axis: 1) |> Nx.transpose(axes: [0, 2, 1]) |> Nx.as_type(inp.initial_state.type)],
            else: []
          )

      List.to_tuple(grads)
    end

    # ---- step: y, new_state ----

    @doc false
    # Operands: state [batch, dim, width - 1], x [batch, dim], w, bias
    # (has_bias). Results: y (x's type), the new state (state's type): the
    # oldest input leaves, x enters.
    def step(block, [state, x, w | rest]) do
      {bias, []} = take_if(rest, has?(block, :has_bias))
      s = compute_type(x.type)
      window = Nx.concatenate([Nx.as_type(state, s), Nx.new_axis(Nx.as_type(x, s), 2)], axis: 2)
      pre = Nx.sum(Nx.multiply(window, Nx.as_type(w, s)), axes: [2])
      pre = if bias, do: Nx.add(pre, Nx.as_type(bias, s)), else: pre
      width = elem(w.shape, 1)
      y = pre |> activate(silu?(block)) |> Nx.as_type(x.type)
      {y, window |> Nx.slice_along_axis(1, width - 1, axis: 2) |> Nx.as_type(state.type)}
    end
  end
end
