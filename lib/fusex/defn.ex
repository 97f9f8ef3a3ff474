if Code.ensure_loaded?(Nx) and Code.ensure_loaded?(Nx.Defn) and function_exported?(Nx, :block, 4) do
  defmodule Fusex.Defn do
    @moduledoc """
    fusex's recurrences inside `defn`: the selective scan, the linear scan,
    MinGRU, MinLSTM and Liquid, with their gradients and steps, as parts of
    compiled programs (Nx ≥ 0.12).

    Each function works inside `defn` (and `Nx.Defn.jit/2`) and on plain
    tensors outside. Semantics, shapes, types and error messages are those
    of the Erlang API (`:fusex`, docs/SSM.md, docs/LINREC.md); tensors are
    Nx tensors, optional tensors come in a map and options in a keyword
    list:

        defn layer(x, dt, a, b, c, d) do
          Fusex.Defn.selective_scan(x, dt, a, b, c, %{d: d}, dt_softplus: true)
        end

    Each op is an `Nx.block/4` whose tag is a `Fusex.Defn.Block`:

      * under EXLA (≥ 0.12, `compiler: EXLA` or `EXLA.Backend`) the block
        becomes a custom call of fusex's XLA target (`fusex_<op>_fwd`, ...,
        docs/XLA.md), fused into the compiled program, on the host or on
        the GPU, with no copy and no synchronization (see
        `Fusex.Defn.XLA` for when it does);
      * everywhere else (the Evaluator, EXLA without fusex's targets, any
        other compiler or backend) the block's default implementation runs:
        the same maths in plain Nx.

    `Nx.Defn.grad/2` reaches every tensor argument: the forward is wrapped
    in `custom_grad/3`, whose gradient is a second block, the backward
    (`fusex_<op>_bwd`), fed by what the forward saved. The default
    backward is the adjoint recurrence written out, never the derivative
    of a loop. The steps (`*_step`) are single frames, differentiated
    through their default implementation.

    Optional tensors given as `nil` count as not given. Results: `y` (or
    `h`), or `{y, state}` with `return_state: true`; steps return `{y,
    new_state}`. States are f32 whatever the input type (f64
    for f64 inputs), as in the Erlang API.

    Bad shapes, types and options raise `ArgumentError` when the function
    is traced, with the Erlang API's message. Vectorized tensors are
    refused (vectorize over the batch axis instead).

    A selective scan traced inside `defn` also computes the states its
    backward starts from (`[batch, ceil(seqlen / K) - 1, dim, dstate]` in
    the state type, K = 8 or 16; docs/XLA.md), whether or not a gradient is
    then taken: a compiled program cannot tell.
    """

    import Nx.Defn, only: [deftransform: 2]
    alias Fusex.Defn.{Block, Check, Linrec, SSM}

    # ---- selective scan ----

    @doc """
    Mamba selective scan over a sequence; see `:fusex.selective_scan/6`.

    `x`, `dt`: `[batch, seqlen, dim]`; `a`: `[dim, dstate]`; `b`, `c`:
    `[batch, seqlen, dstate]` or `[batch, seqlen, groups, dstate]`.
    Tensors: `:d`, `:dt_bias` (`[dim]`), `:z` (x's shape), `:h0`
    (`[batch, dim, dstate]`). Options: `:dt_softplus`, `:return_state`.
    """
    deftransform selective_scan(x, dt, a, b, c, tensors \\ %{}, opts \\ []) do
      {tensors, opts} = maps!(tensors, opts, [:d, :z, :dt_bias, :h0], [:dt_softplus, :return_state])
      [x, dt, a, b, c] = tensors!(x: x, dt: dt, a: a, b: b, c: c)
      given = given!(tensors)
      flags = ssm_flags(opts, given)
      return_state = Check.bool!(opts, :return_state)
      n = Check.selective_scan!(x, dt, a, b, c, given)

      operands = [x, dt, a, b, c | Enum.flat_map([:d, :z, :dt_bias, :h0], &List.wrap(given[&1]))]
      traced = traced?(operands)
      inputs = as_operands(operands, traced)
      # {K, nsaved}: the states the backward starts from, whenever traced (a
      # compiled program cannot tell whether a gradient follows)
      saved = if traced, do: saved_layout(x, b), else: nil
      every = saved && elem(saved, 0)

      fwd = %Block{
        op: :selective_scan,
        direction: :fwd,
        attrs: flags ++ [return_state: Block.flag(return_state), save: Block.flag(every != nil)],
        save_every: every
      }

      ctx = %{inputs: inputs, flags: flags, every: every, x: x, n: n, return_state: return_state}

      fwd
      |> block(inputs, ssm_results(ctx, saved), &SSM.forward/2)
      |> with_gradient(inputs, traced, &ssm_backward(&1, &2, ctx))
      |> result(return_state)
    end

    # The forward's results: y, then state, then saved states.
    defp ssm_results(%{x: x, n: n, return_state: return_state}, saved) do
      state_type = Check.state_type(x.type)

      [Nx.template(x.shape, x.type)] ++
        if(return_state, do: [Nx.template({n.batch, n.dim, n.dstate}, state_type)], else: []) ++
        if(saved, do: [Nx.template({n.batch, elem(saved, 1), n.dim, n.dstate}, state_type)], else: [])
    end

    # The gradients of the inputs: the backward block given the forward's
    # operands, its saved states, dy and (where the loss uses the final
    # state) dstate.
    defp ssm_backward([dy | rest], outputs, ctx) do
      %{inputs: inputs, x: x, n: n} = ctx
      dstate = if ctx.return_state, do: nonzero(hd(rest)), else: nil
      saved_states = if ctx.every, do: [List.last(outputs)], else: []

      bwd = %Block{
        op: :selective_scan,
        direction: :bwd,
        attrs: ctx.flags ++ [has_dstate: Block.flag(dstate != nil)],
        save_every: ctx.every
      }

      dy = dy |> Nx.broadcast(x.shape) |> Nx.as_type(x.type)
      dstate = dstate && dstate |> Nx.broadcast({n.batch, n.dim, n.dstate}) |> Nx.as_type(Check.state_type(x.type))
      bwd_inputs = inputs ++ saved_states ++ [dy] ++ List.wrap(dstate)
      bwd |> block(bwd_inputs, templates_of(inputs), &SSM.backward/2) |> out_list() |> List.wrap()
    end

    defp ssm_flags(opts, given) do
      [
        dt_softplus: Block.flag(Check.bool!(opts, :dt_softplus)),
        has_d: has(given, :d),
        has_z: has(given, :z),
        has_dt_bias: has(given, :dt_bias),
        has_h0: has(given, :h0)
      ]
    end

    @doc """
    One frame of the selective scan; see `:fusex.selective_scan_step/7`.
    Returns `{y, new_state}`.

    `state`: `[batch, dim, dstate]`, `{f,32}` (or `{f,64}`); `x`, `dt`:
    `[batch, dim]`; `b`, `c`: `[batch, dstate]` or `[batch, groups,
    dstate]`. Tensors: `:d`, `:z`, `:dt_bias`. Options: `:dt_softplus`.
    """
    deftransform selective_scan_step(state, x, dt, a, b, c, tensors \\ %{}, opts \\ []) do
      {tensors, opts} = maps!(tensors, opts, [:d, :z, :dt_bias], [:dt_softplus])
      [state, x, dt, a, b, c] = tensors!(state: state, x: x, dt: dt, a: a, b: b, c: c)
      given = given!(tensors)
      flags = ssm_flags(opts, given)
      Check.selective_scan_step!(state, x, dt, a, b, c, given)
      block = %Block{op: :selective_scan, direction: :step, attrs: Keyword.delete(flags, :has_h0)}
      optional = Enum.flat_map([:d, :z, :dt_bias], &List.wrap(given[&1]))
      templates = [Nx.template(x.shape, x.type), Nx.template(state.shape, state.type)]
      block(block, [state, x, dt, a, b, c | optional], templates, &SSM.step/2)
    end

    # ---- linear recurrences ----

    @doc """
    The linear scan `h_t = a_t * h_{t-1} + b_t`; see `:fusex.linear_scan/3`.
    `a`, `b`: `[batch, seqlen, hidden]`. Tensors: `:h0` (`[batch,
    hidden]`). Options: `:reverse`, `:return_state`.
    """
    deftransform linear_scan(a, b, tensors \\ %{}, opts \\ []),
      do: recurrence(:linear_scan, [a: a, b: b], tensors, opts)

    @doc """
    MinGRU over a sequence; see `:fusex.mingru/3`. Tensors: `:h0`.
    Options: `:reverse`, `:candidate_activation` (`:identity` or `:g`),
    `:return_state`.
    """
    deftransform mingru(z_logits, cand, tensors \\ %{}, opts \\ []),
      do: recurrence(:mingru, [z_logits: z_logits, cand: cand], tensors, opts)

    @doc """
    MinLSTM over a sequence; see `:fusex.minlstm/4`. Tensors: `:h0`.
    Options: `:reverse`, `:candidate_activation`, `:return_state`.
    """
    deftransform minlstm(f_logits, i_logits, cand, tensors \\ %{}, opts \\ []),
      do: recurrence(:minlstm, [f_logits: f_logits, i_logits: i_logits, cand: cand], tensors, opts)

    @doc """
    Liquid (LTC) cells over a sequence; see `:fusex.liquid/4`. `tau`, `a`:
    `[hidden]`. Tensors: `:h0`, `:dt` (`[batch, seqlen, 1]`). Options:
    `:dt` (a positive number, default 1.0; not with the tensor),
    `:reverse`, `:return_state`.
    """
    deftransform liquid(f_logits, tau, a, tensors \\ %{}, opts \\ []),
      do: recurrence(:liquid, [f_logits: f_logits, tau: tau, a: a], tensors, opts)

    @doc "One frame of `linear_scan/4`: `{h, new_state}`; `state` `[batch, hidden]`."
    deftransform linear_scan_step(state, a, b, tensors \\ %{}, opts \\ []),
      do: recurrence_step(:linear_scan, state, [a: a, b: b], tensors, opts)

    @doc "One frame of `mingru/4`: `{h, new_state}`. Options: `:candidate_activation`."
    deftransform mingru_step(state, z_logits, cand, tensors \\ %{}, opts \\ []),
      do: recurrence_step(:mingru, state, [z_logits: z_logits, cand: cand], tensors, opts)

    @doc "One frame of `minlstm/5`: `{h, new_state}`. Options: `:candidate_activation`."
    deftransform minlstm_step(state, f_logits, i_logits, cand, tensors \\ %{}, opts \\ []),
      do: recurrence_step(:minlstm, state, [f_logits: f_logits, i_logits: i_logits, cand: cand], tensors, opts)

    @doc """
    One frame of `liquid/5`: `{h, new_state}`. Tensors: `:dt` (`[batch,
    1]`); options: `:dt` (a number).
    """
    deftransform liquid_step(state, f_logits, tau, a, tensors \\ %{}, opts \\ []),
      do: recurrence_step(:liquid, state, [f_logits: f_logits, tau: tau, a: a], tensors, opts)

    defp recurrence(op, args, tensors, opts) do
      known_tensors = if op == :liquid, do: [:h0, :dt], else: [:h0]
      {tensors, opts} = maps!(tensors, opts, known_tensors, forward_opts(op))
      args = Enum.zip(Keyword.keys(args), tensors!(args))
      given = given!(tensors)
      return_state = Check.bool!(opts, :return_state)
      reverse = Check.bool!(opts, :reverse)
      {kind_attrs, dt_tensor} = kind_attrs(op, opts, given, "[batch, seqlen, 1]")
      n = Check.linrec!(seq_args(op, args), liquid_args(op, args, dt_tensor), given[:h0], false)

      operands = Keyword.values(args) ++ List.wrap(dt_tensor) ++ List.wrap(given[:h0])
      traced = traced?(operands)
      inputs = as_operands(operands, traced)
      # the attributes forward and backward share
      shared = [reverse: Block.flag(reverse)] ++ kind_attrs ++ [has_h0: has(given, :h0)]
      fwd = %Block{op: op, direction: :fwd, attrs: shared ++ [return_state: Block.flag(return_state)]}
      ctx = %{op: op, inputs: inputs, attrs: shared, n: n, return_state: return_state}

      results =
        [Nx.template({n.batch, n.seqlen, n.hidden}, n.type)] ++
          if return_state, do: [Nx.template({n.batch, n.hidden}, Check.state_type(n.type))], else: []

      fwd
      |> block(inputs, results, &Linrec.forward/2)
      |> with_gradient(inputs, traced, &recurrence_backward(&1, &2, ctx))
      |> result(return_state)
    end

    # The gradients of the inputs: the backward block given the forward's
    # operands, its output h, dh and (where the loss uses the final state)
    # dstate.
    defp recurrence_backward([dh | rest], [h | _], ctx) do
      %{inputs: inputs, n: n} = ctx
      dstate = if ctx.return_state, do: nonzero(hd(rest)), else: nil
      bwd = %Block{op: ctx.op, direction: :bwd, attrs: ctx.attrs ++ [has_dstate: Block.flag(dstate != nil)]}
      dh = dh |> Nx.broadcast(h.shape) |> Nx.as_type(n.type)
      dstate = dstate && dstate |> Nx.broadcast({n.batch, n.hidden}) |> Nx.as_type(Check.state_type(n.type))
      bwd_inputs = inputs ++ [h, dh] ++ List.wrap(dstate)
      bwd |> block(bwd_inputs, templates_of(inputs), &Linrec.backward/2) |> out_list() |> List.wrap()
    end

    defp recurrence_step(op, state, args, tensors, opts) do
      known_tensors = if op == :liquid, do: [:dt], else: []
      {tensors, opts} = maps!(tensors, opts, known_tensors, step_opts(op))
      [state | p] = tensors!([{:state, state} | args])
      args = Enum.zip(Keyword.keys(args), p)
      given = given!(tensors)
      {kind_attrs, dt_tensor} = kind_attrs(op, opts, given, "[batch, 1]")
      n = Check.linrec!(seq_args(op, args), liquid_args(op, args, dt_tensor), nil, true)
      Check.state_tensor!(state, "state", n.type, {n.batch, n.hidden}, "([batch, hidden])")

      block = %Block{op: op, direction: :step, attrs: [reverse: 0] ++ kind_attrs}
      templates = [Nx.template({n.batch, n.hidden}, n.type), Nx.template(state.shape, state.type)]
      block(block, [state | p] ++ List.wrap(dt_tensor), templates, &Linrec.step/2)
    end

    defp forward_opts(:linear_scan), do: [:reverse, :return_state]
    defp forward_opts(:liquid), do: [:dt, :reverse, :return_state]
    defp forward_opts(_gated), do: [:reverse, :candidate_activation, :return_state]

    defp step_opts(:linear_scan), do: []
    defp step_opts(:liquid), do: [:dt]
    defp step_opts(_gated), do: [:candidate_activation]

    # The op's own attributes (candidate_g; liquid's dt, has_dt) and liquid's
    # dt tensor, if given.
    defp kind_attrs(op, opts, _given, _layout) when op in [:mingru, :minlstm],
      do: {[candidate_g: Block.flag(Check.candidate_g!(opts))], nil}

    defp kind_attrs(:liquid, opts, given, layout) do
      case {given[:dt], Map.fetch(opts, :dt)} do
        {nil, :error} ->
          {[dt: 1.0, has_dt: 0], nil}

        {nil, {:ok, value}} ->
          {[dt: Check.dt_value!(value, layout), has_dt: 0], nil}

        {dt, :error} ->
          {[dt: 1.0, has_dt: 1], dt}

        {_dt, {:ok, _value}} ->
          Check.fail("dt", "a number (opts) or a tensor (tensors), not both", "both")
      end
    end

    defp kind_attrs(:linear_scan, _opts, _given, _layout), do: {[], nil}

    defp seq_args(op, args) do
      for name <- Linrec.seq_names(op), do: {Atom.to_string(name), Keyword.fetch!(args, name)}
    end

    defp liquid_args(:liquid, args, dt), do: %{tau: args[:tau], a: args[:a], dt: dt}
    defp liquid_args(_op, _args, _dt), do: nil

    # ---- shared ----

    # The options and the optional tensors as maps, their keys checked; then
    # a tensor given as nil is not given.
    defp maps!(tensors, opts, known_tensors, known_opts) do
      opts = Check.opts_map!(opts)
      tensors = Check.tensors_map!(tensors)
      Check.known_keys!(opts, known_opts, "opts")
      Check.known_keys!(tensors, known_tensors, "tensors")
      {Map.reject(tensors, fn {_k, v} -> is_nil(v) end), opts}
    end

    defp tensors!(args), do: Enum.map(args, fn {name, t} -> Check.tensor!(t, Atom.to_string(name)) end)

    defp given!(tensors), do: Map.new(tensors, fn {k, v} -> {k, Check.tensor!(v, Atom.to_string(k))} end)

    defp templates_of(tensors), do: Enum.map(tensors, &Nx.template(&1.shape, &1.type))

    # Inside a trace, the forward's results with a custom gradient:
    # `backward.(cotangents, outputs)` gives the gradients of `inputs`, one
    # cotangent per output (an output the loss does not use gets a scalar
    # zero).
    defp with_gradient(out, _inputs, false, _backward), do: out

    defp with_gradient(out, inputs, true, backward) do
      outputs = List.wrap(out_list(out))
      Nx.Defn.Kernel.custom_grad(out, inputs, fn grads -> backward.(grad_list(grads, outputs), outputs) end)
    end

    defp has(given, name), do: Block.flag(Map.has_key?(given, name))

    # Inside defn (or grad) the arguments are expressions: the block gets a
    # custom gradient. Outside, the block runs on the tensors' backend.
    defp traced?(tensors), do: Enum.any?(tensors, &match?(%{data: %Nx.Defn.Expr{}}, &1))

    # Inside a trace every operand is made an expression, so that a tensor
    # captured from outside (a constant) is one too: Nx.block and
    # custom_grad take expressions only.
    defp as_operands(tensors, true), do: Enum.map(tensors, &Nx.Defn.Expr.tensor/1)
    defp as_operands(tensors, false), do: tensors

    # An Nx.block of `block` whose default implementation is `impl.(block,
    # operands)`.
    defp block(block, inputs, templates, impl) do
      inputs = as_operands(inputs, traced?(inputs))
      output = if match?([_], templates), do: hd(templates), else: List.to_tuple(templates)
      Nx.block(block, inputs, output, default_fun(length(inputs), impl))
    end

    for arity <- 1..12 do
      args = Macro.generate_arguments(arity, __MODULE__)

      defp default_fun(unquote(arity), impl),
        do: fn block, unquote_splicing(args) -> impl.(block, unquote(args)) end
    end

    defp out_list(out) when is_tuple(out), do: Tuple.to_list(out)
    defp out_list(out), do: out

    defp grad_list(grads, outputs) when is_tuple(grads), do: Tuple.to_list(grads) |> check_count(outputs)
    defp grad_list(grad, outputs), do: check_count([grad], outputs)

    defp check_count(list, outputs) when length(list) == length(outputs), do: list

    # A gradient known to be zero (an unused output) is left out.
    defp nonzero(%{data: %Nx.Defn.Expr{op: :constant, args: [zero]}}) when zero == 0, do: nil
    defp nonzero(grad), do: grad

    defp result(out, true) when is_tuple(out), do: {elem(out, 0), elem(out, 1)}
    defp result(out, false) when is_tuple(out), do: elem(out, 0)
    defp result(out, false), do: out

    # ---- saved states of the selective scan ----

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
  end
end
