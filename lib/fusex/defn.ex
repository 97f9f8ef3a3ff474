if Code.ensure_loaded?(Nx) and Code.ensure_loaded?(Nx.Defn) and function_exported?(Nx, :block, 4) do
  defmodule Fusex.Defn do
    @moduledoc """
    fusex's recurrences inside `defn`: the selective scan, the linear scan,
    MinGRU, MinLSTM and Liquid, the stacked GRU and LSTM, with their
    gradients and steps, and the other layers of a Mamba block (the causal
    depthwise convolution and its step, RMSNorm and LayerNorm with residual
    and gate), as parts of compiled programs (Nx ≥ 0.12). Linear layers are
    not here: inside a compiled program XLA's own products are the right
    ones (`Fusex.linear/3` is the eager one).

    Each function works inside `defn` (and `Nx.Defn.jit/2`) and on plain
    tensors outside. Semantics, shapes, types and error messages are those
    of the Erlang API (`:fusex`, docs/SSM.md, docs/LINREC.md, docs/LAYERS.md); tensors are
    Nx tensors; the optional tensors and the options come in one keyword
    list, as the eager `Fusex` functions take them (or apart: the tensors
    in a map, then the options):

        defn layer(x, dt, a, b, c, d) do
          Fusex.Defn.selective_scan(x, dt, a, b, c, d: d, dt_softplus: true)
          # the same: Fusex.Defn.selective_scan(x, dt, a, b, c, %{d: d}, dt_softplus: true)
        end

    Each op is an `Nx.block/4` whose tag is a `Fusex.Defn.Block`:

      * under EXLA (≥ 0.12, `compiler: EXLA` or `EXLA.Backend`) the block
        becomes a custom call of fusex's XLA target (`fusex_<op>_fwd`, ...,
        docs/XLA.md), fused into the compiled program, on the host or on
        the GPU, with no copy and no synchronization (see
        `Fusex.Defn.XLA` for when it does);
      * everywhere else the block's default implementation runs
        (`Fusex.Defn.Runtime`): under `Nx.Defn.Evaluator`, on plain tensors
        and under any compiler without custom calls, fusex's kernels
        through its NIF (`Nx.runtime_call/4`), on the operands' device;
        under EXLA without fusex's targets, or with the implementation set
        to `:nx` (`with_implementation/2`), the same maths in plain Nx.

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
    is traced, with the Erlang API's message: the shapes and types are the
    op layer's check on the cpu device (`:fusex.op_check/4`), what a run
    of the op would say (the CUDA backend's limits, where the program runs
    on a GPU, are checked by its handlers). Vectorized tensors are refused
    (vectorize over the batch axis instead).

    Second derivatives (a gradient of a gradient through an op) are not
    supported: they raise `ArgumentError` when traced. Steps, whose
    gradients are their default implementations' (plain Nx), have them.

    A selective scan traced inside `defn` also computes the states its
    backward starts from (`[batch, ceil(seqlen / K) - 1, dim, dstate]` in
    the state type, K = 8 or 16; docs/XLA.md), whether or not a gradient is
    then taken: a compiled program cannot tell.
    """

    import Nx.Defn, only: [deftransform: 2]
    alias Fusex.Defn.{Call, Conv, Linrec, Norm, RNN, SSM}

    # ---- selective scan ----

    @doc """
    Mamba selective scan over a sequence; see `:fusex.selective_scan/6`.

    `x`, `dt`: `[batch, seqlen, dim]`; `a`: `[dim, dstate]`; `b`, `c`:
    `[batch, seqlen, dstate]` or `[batch, seqlen, groups, dstate]`.
    Tensors: `:d`, `:dt_bias` (`[dim]`), `:z` (x's shape), `:h0`
    (`[batch, dim, dstate]`). Options: `:dt_softplus`, `:return_state`.
    """
    deftransform selective_scan(x, dt, a, b, c, tensors \\ %{}, opts \\ []),
      do: Call.forward(:selective_scan, SSM, [x: x, dt: dt, a: a, b: b, c: c], tensors, opts)

    @doc """
    One frame of the selective scan; see `:fusex.selective_scan_step/7`.
    Returns `{y, new_state}`.

    `state`: `[batch, dim, dstate]`, `{f,32}` (or `{f,64}`); `x`, `dt`:
    `[batch, dim]`; `b`, `c`: `[batch, dstate]` or `[batch, groups,
    dstate]`. Tensors: `:d`, `:z`, `:dt_bias`. Options: `:dt_softplus`.
    """
    deftransform selective_scan_step(state, x, dt, a, b, c, tensors \\ %{}, opts \\ []),
      do: Call.step(:selective_scan, SSM, [state: state, x: x, dt: dt, a: a, b: b, c: c], tensors, opts)

    @doc false
    # {K, nsaved} of the selective scan's saved states for x and b, or nil
    # where there are none (Fusex.Defn.SSM.saved_layout/2).
    def saved_layout(x, b), do: SSM.saved_layout(x, b)

    # ---- linear recurrences ----

    @doc """
    The linear scan `h_t = a_t * h_{t-1} + b_t`; see `:fusex.linear_scan/3`.
    `a`, `b`: `[batch, seqlen, hidden]`. Tensors: `:h0` (`[batch,
    hidden]`). Options: `:reverse`, `:return_state`.
    """
    deftransform linear_scan(a, b, tensors \\ %{}, opts \\ []),
      do: Call.forward(:linear_scan, Linrec, [a: a, b: b], tensors, opts)

    @doc """
    MinGRU over a sequence; see `:fusex.mingru/3`. Tensors: `:h0`.
    Options: `:reverse`, `:candidate_activation` (`:identity` or `:g`),
    `:return_state`.
    """
    deftransform mingru(z_logits, cand, tensors \\ %{}, opts \\ []),
      do: Call.forward(:mingru, Linrec, [z_logits: z_logits, cand: cand], tensors, opts)

    @doc """
    MinLSTM over a sequence; see `:fusex.minlstm/4`. Tensors: `:h0`.
    Options: `:reverse`, `:candidate_activation`, `:return_state`.
    """
    deftransform minlstm(f_logits, i_logits, cand, tensors \\ %{}, opts \\ []),
      do: Call.forward(:minlstm, Linrec, [f_logits: f_logits, i_logits: i_logits, cand: cand], tensors, opts)

    @doc """
    Liquid (LTC) cells over a sequence; see `:fusex.liquid/4`. `tau`, `a`:
    `[hidden]`. Tensors: `:h0`, `:dt` (`[batch, seqlen, 1]`). Options:
    `:dt` (a positive number, default 1.0; not with the tensor),
    `:reverse`, `:return_state`.
    """
    deftransform liquid(f_logits, tau, a, tensors \\ %{}, opts \\ []),
      do: Call.forward(:liquid, Linrec, [f_logits: f_logits, tau: tau, a: a], tensors, opts)

    # ---- GRU and LSTM ----

    @doc """
    A stacked GRU over a sequence (PyTorch's `nn.GRU`, batch first); see
    `:fusex.gru/3` and docs/RNN.md.

    `x`: `[batch, seqlen, input]`; `layers`: a list or tuple of layers,
    each a map `%{w_ih: _, w_hh: _, b_ih: _, b_hh: _}` (or a tuple in that
    order): `w_ih` `[3*hidden, input]` (`[3*hidden, hidden]` above layer
    0), `w_hh` `[3*hidden, hidden]`, the biases `[3*hidden]`. Tensors:
    `:h0` (`[layers, batch, hidden]`). Options: `:return_state` (also
    `h_n`, `[layers, batch, hidden]` in the state type).
    """
    deftransform gru(x, layers, tensors \\ %{}, opts \\ []),
      do: Call.forward(:gru, RNN, [x: x, layers: layers], tensors, opts)

    @doc """
    A stacked LSTM (gate blocks i, f, g, o); as `gru/4` with `4*hidden`
    rows. Tensors: `:h0`, `:c0`. Returns `y`, or `{y, {h_n, c_n}}` with
    `return_state: true`.
    """
    deftransform lstm(x, layers, tensors \\ %{}, opts \\ []) do
      case Call.forward(:lstm, RNN, [x: x, layers: layers], tensors, opts) do
        {y, h_n, c_n} -> {y, {h_n, c_n}}
        y -> y
      end
    end

    @doc """
    One frame of `gru/4` through every layer: `h` `[layers, batch,
    hidden]` (the state type), `x` `[batch, input]`. Returns `{y, new_h}`.
    The step has no optional tensors nor options (`tensors`, `opts`: empty).
    """
    deftransform gru_step(h, x, layers, tensors \\ %{}, opts \\ []),
      do: Call.step(:gru, RNN, [h: h, x: x, layers: layers], tensors, opts)

    @doc "One frame of `lstm/4`: `state` `{h, c}`. Returns `{y, {new_h, new_c}}`."
    deftransform lstm_step(state, x, layers, tensors \\ %{}, opts \\ []) do
      {h, c} =
        case state do
          {h, c} -> {h, c}
          other -> Fusex.Defn.Check.fail("state", "a tuple {h, c} of two tensors", inspect(other, limit: 3))
        end

      {y, new_h, new_c} = Call.step(:lstm, RNN, [h: h, c: c, x: x, layers: layers], tensors, opts)
      {y, {new_h, new_c}}
    end

    @doc "One frame of `linear_scan/4`: `{h, new_state}`; `state` `[batch, hidden]`."
    deftransform linear_scan_step(state, a, b, tensors \\ %{}, opts \\ []),
      do: Call.step(:linear_scan, Linrec, [state: state, a: a, b: b], tensors, opts)

    @doc "One frame of `mingru/4`: `{h, new_state}`. Options: `:candidate_activation`."
    deftransform mingru_step(state, z_logits, cand, tensors \\ %{}, opts \\ []),
      do: Call.step(:mingru, Linrec, [state: state, z_logits: z_logits, cand: cand], tensors, opts)

    @doc "One frame of `minlstm/5`: `{h, new_state}`. Options: `:candidate_activation`."
    deftransform minlstm_step(state, f_logits, i_logits, cand, tensors \\ %{}, opts \\ []),
      do:
        Call.step(:minlstm, Linrec, [state: state, f_logits: f_logits, i_logits: i_logits, cand: cand], tensors,
          opts)

    @doc """
    One frame of `liquid/5`: `{h, new_state}`. Tensors: `:dt` (`[batch,
    1]`); options: `:dt` (a number).
    """
    deftransform liquid_step(state, f_logits, tau, a, tensors \\ %{}, opts \\ []),
      do: Call.step(:liquid, Linrec, [state: state, f_logits: f_logits, tau: tau, a: a], tensors, opts)

    # ---- the layers of a Mamba block: causal conv1d, the norms ----
    # (linear layers have no Fusex.Defn function: inside a defn, XLA's own
    # products are the right ones; `Fusex.linear/3` is the eager one.)

    @doc """
    The causal depthwise convolution over time; see
    `:fusex.causal_conv1d/3`. `x`: `[batch, seqlen, dim]`, `w`: `[dim,
    width]` (width 1 to 16; `w[:, width - 1]` multiplies the current
    input). Tensors: `:bias` (`[dim]`), `:initial_state` (`[batch, dim,
    width - 1]`, the inputs before the first, oldest first). Options:
    `:activation` (`:none` or `:silu`), `:return_state` (also the final
    state, the last `width - 1` inputs).
    """
    deftransform causal_conv1d(x, w, tensors \\ %{}, opts \\ []),
      do: Call.forward(:causal_conv1d, Conv, [x: x, w: w], tensors, opts)

    @doc """
    One frame of `causal_conv1d/4`: `{y, new_state}`; `state` `[batch,
    dim, width - 1]` (a forward's final state, or zeros), `x` `[batch,
    dim]`. Tensors: `:bias`. Options: `:activation`.
    """
    deftransform causal_conv1d_step(state, x, w, tensors \\ %{}, opts \\ []),
      do: Call.step(:causal_conv1d, Conv, [state: state, x: x, w: w], tensors, opts)

    @doc """
    RMSNorm over the last axis with the residual add before it and the
    gate after it; see `:fusex.rms_norm/3`. `x`: `[..., hidden]`,
    `weight`: `[hidden]`. Tensors: `:bias` (`[hidden]`), `:residual`
    (then `{y, s}` is returned, `s = x + residual`), `:gate` (`y *
    silu(gate)`). Options: `:eps` (default 1.0e-5), `:residual_in_f32`.
    """
    deftransform rms_norm(x, weight, tensors \\ %{}, opts \\ []),
      do: Call.forward(:rms_norm, Norm, [x: x, weight: weight], tensors, opts)

    @doc """
    LayerNorm over the last axis, fused as `rms_norm/4`; see
    `:fusex.layer_norm/4`. Tensors: `:residual`, `:gate`. Options: `:eps`,
    `:residual_in_f32`.
    """
    deftransform layer_norm(x, weight, bias, tensors \\ %{}, opts \\ []),
      do: Call.forward(:layer_norm, Norm, [x: x, weight: weight, bias: bias], tensors, opts)

    # ---- where the blocks run ----

    @doc """
    Runs `fun` with the blocks' default implementation set to `impl` in
    the calling process: `:auto` (fusex's NIF where it can run, see
    `Fusex.Defn.Runtime`) or `:nx` (the pure-Nx code, everywhere but
    EXLA's custom calls). The application-wide setting is `config :fusex,
    defn_implementation: :nx`.

        Fusex.Defn.with_implementation(:nx, fn -> Nx.Defn.jit(&f/2).(x, y) end)
    """
    def with_implementation(impl, fun), do: Fusex.Defn.Runtime.with_implementation(impl, fun)
  end
end
