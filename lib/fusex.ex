defmodule Fusex do
  @moduledoc """
  fusex from Elixir: fused kernels for recurrent and state-space models on
  tensors that stay on the GPU, called with Nx tensors on any backend.

  Every function takes Nx tensors (any backend) or `%Fusex.Tensor{}`
  handles and returns:

    * Nx tensors by default, when any tensor argument was an Nx tensor:
      back on the library of the inputs without a copy when they came in as
      zero-copy views (see "Zero copy"), else copied through a binary to
      the backend of the first Nx argument (or `:backend`);
    * `%Fusex.Tensor{}` handles that stay on the device with
      `resident: true`, or when every tensor argument was a handle.

  Common options: `:device` (`:cpu`, `:cuda`, `{:cuda, n}`; default: the
  device of the first handle, else the CUDA device an EXLA argument lives
  on, else `default_device/0`), `:resident`, `:backend`. Types are Nx's
  (`{:f, 32}`, `{:bf, 16}`, `{:f, 16}`, `{:f, 64}` on cpu, `{:s, 32}`,
  `{:s, 64}`, `{:u, 8}`); shapes and option names are those of the Erlang
  API (`:fusex`), whose docs describe each op.

  Errors raise `ArgumentError` with the Erlang API's message (it names the
  argument, what was expected and what came), `Fusex.CudaError` for CUDA
  failures.

  ## Zero copy

  An Nx tensor on EXLA's CUDA client, on the device the op runs on, enters
  fusex as a borrowed view of EXLA's memory (`:fusex.from_pointer/4` with
  `sync: true`: the GPU is synchronized first, so EXLA's pending work on
  its own streams is complete), and results go back to EXLA as views of
  fusex's memory (`Nx.from_pointer/5` over `:fusex.to_pointer/3`, after
  fusex's stream is synchronized). A result view keeps its fusex memory
  alive as long as the Nx tensor lives. Any other tensor is copied through
  a binary. EXLA preallocates most of the GPU by default: give fusex room
  with the client's `:memory_fraction` (or `preallocate: false`).

  ## Arguments and steps

  One convention with `Fusex.Defn`: the positional tensors, then one
  keyword list of the optional tensors and the options, named as in the
  Erlang API: `Fusex.mingru(z, c, h0: h, return_state: true)`, as
  `Fusex.Defn.mingru(z, c, h0: h, return_state: true)` (which also takes
  them apart: `Fusex.Defn.mingru(z, c, %{h0: h}, return_state: true)`).
  Forwards return `y` (or `h`), `{y, state}` with `return_state: true`.

  Steps: given the state as an Nx tensor, a step returns `{y,
  new_state}` and leaves the state as it was, as `Fusex.Defn`'s steps do;
  given a `%Fusex.Tensor{}` handle, it updates the handle in place and
  returns `y` (no copy of the state per frame: the serving loop).

  Nx is optional: without it, everything works on `%Fusex.Tensor{}`
  handles (`Fusex.Tensor.from_binary/4`, `Fusex.Tensor.to_binary/1`).
  """

  alias Fusex.Op

  @typedoc "An Nx tensor or a resident handle."
  @type tensor :: Fusex.Tensor.t() | struct()

  @doc "The devices this node can use, CPU first (see `:fusex.devices/0`)."
  def devices, do: :fusex.devices()

  @doc """
  The device ops use when none is given: `config :fusex, default_device:`,
  else `FUSEX_DEVICE`, else the first CUDA device, else `:cpu`.
  """
  def default_device, do: Fusex.Tensor.normalize_device(:fusex.default_device())

  @doc "Memory held by fusex tensors on `device`: allocated, peak, live tensors."
  def memory(device \\ default_device()), do: Fusex.Erl.call(:memory, [device])

  @doc "Waits for all work fusex queued on a device (or a handle's device)."
  def synchronize(%Fusex.Tensor{ref: ref}), do: Fusex.Erl.call(:synchronize, [ref])
  def synchronize(device), do: Fusex.Erl.call(:synchronize, [device])

  @doc "Elementwise `a + b` (same shape and type)."
  def add(a, b, opts \\ []), do: Op.run(:add, [a: a, b: b], opts)

  @doc "Elementwise `a - b` (same shape and type)."
  def subtract(a, b, opts \\ []), do: Op.run(:subtract, [a: a, b: b], opts)

  @doc "Elementwise `a * b` (same shape and type)."
  def multiply(a, b, opts \\ []), do: Op.run(:multiply, [a: a, b: b], opts)

  @doc "`tensor * factor` for a float tensor (f32 arithmetic; f64 on cpu)."
  def scale(tensor, factor, opts \\ []),
    do: Op.run(:scale, [tensor: tensor, factor: factor], opts)

  @doc "The tensor converted to `type` (round to nearest even; integers saturate)."
  def convert(tensor, type, opts \\ []), do: Op.run(:convert, [tensor: tensor, type: type], opts)

  # ---- linear recurrences: fusex:linear_scan/3, mingru/3, minlstm/4,
  # liquid/4, their _backward/3 and _step/4,5 (docs/LINREC.md) ----

  @doc "Generic linear scan `h_t = a_t * h_{t-1} + b_t`; see `fusex:linear_scan/3`."
  def linear_scan(a, b, opts \\ []),
    do: Op.run(:linear_scan, [a: a, b: b], opts, erl_opts: true)

  @doc "MinGRU over a sequence; see `fusex:mingru/3`."
  def mingru(z_logits, cand, opts \\ []),
    do: Op.run(:mingru, [z_logits: z_logits, cand: cand], opts, erl_opts: true)

  @doc "MinLSTM over a sequence; see `fusex:minlstm/4`."
  def minlstm(f_logits, i_logits, cand, opts \\ []),
    do: Op.run(:minlstm, [f_logits: f_logits, i_logits: i_logits, cand: cand], opts, erl_opts: true)

  @doc "Liquid (LTC) cells over a sequence; see `fusex:liquid/4`."
  def liquid(f_logits, tau, a, opts \\ []),
    do: Op.run(:liquid, [f_logits: f_logits, tau: tau, a: a], opts, erl_opts: true)

  @doc "Gradients of `linear_scan/3` from a saved context; see `fusex:linear_scan_backward/3`."
  def linear_scan_backward(dh, ctx, opts \\ []),
    do: Op.run(:linear_scan_backward, [dh: dh, ctx: ctx], opts, erl_opts: true)

  @doc "Gradients of `mingru/3`; see `fusex:mingru_backward/3`."
  def mingru_backward(dh, ctx, opts \\ []),
    do: Op.run(:mingru_backward, [dh: dh, ctx: ctx], opts, erl_opts: true)

  @doc "Gradients of `minlstm/4`; see `fusex:minlstm_backward/3`."
  def minlstm_backward(dh, ctx, opts \\ []),
    do: Op.run(:minlstm_backward, [dh: dh, ctx: ctx], opts, erl_opts: true)

  @doc "Gradients of `liquid/4`; see `fusex:liquid_backward/3`."
  def liquid_backward(dh, ctx, opts \\ []),
    do: Op.run(:liquid_backward, [dh: dh, ctx: ctx], opts, erl_opts: true)

  @doc "One frame of `linear_scan/3`; a handle is updated in place (returns `y`), an Nx state gives `{y, new_state}` (module doc, \"Arguments and steps\")."
  def linear_scan_step(state, a, b, opts \\ []),
    do: Op.run(:linear_scan_step, [state: state, a: a, b: b], opts, erl_opts: true, in_place: [:state])

  @doc "One frame of `mingru/3`; a handle is updated in place (returns `y`), an Nx state gives `{y, new_state}` (module doc, \"Arguments and steps\")."
  def mingru_step(state, z_logits, cand, opts \\ []),
    do:
      Op.run(:mingru_step, [state: state, z_logits: z_logits, cand: cand], opts,
        erl_opts: true,
        in_place: [:state]
      )

  @doc "One frame of `minlstm/4`; a handle is updated in place (returns `y`), an Nx state gives `{y, new_state}` (module doc, \"Arguments and steps\")."
  def minlstm_step(state, f_logits, i_logits, cand, opts \\ []),
    do:
      Op.run(:minlstm_step, [state: state, f_logits: f_logits, i_logits: i_logits, cand: cand], opts,
        erl_opts: true,
        in_place: [:state]
      )

  @doc "One frame of `liquid/4`; a handle is updated in place (returns `y`), an Nx state gives `{y, new_state}` (module doc, \"Arguments and steps\")."
  def liquid_step(state, f_logits, tau, a, opts \\ []),
    do:
      Op.run(:liquid_step, [state: state, f_logits: f_logits, tau: tau, a: a], opts,
        erl_opts: true,
        in_place: [:state]
      )

  # ---- GRU and LSTM, stacked: fusex:gru/3, lstm/3, their _backward/3 and
  # _step/3 (docs/RNN.md) ----

  @doc """
  A stacked GRU (PyTorch's `nn.GRU`, batch first); see `fusex:gru/3`.
  `layers`: one map `%{w_ih:, w_hh:, b_ih:, b_hh:}` per layer. Options:
  `:h0`, `:return_state`, `:save_for_backward`.
  """
  def gru(x, layers, opts \\ []),
    do: Op.run(:gru, [x: x, layers: layers], opts, erl_opts: true)

  @doc "A stacked LSTM; see `fusex:lstm/3`. Options: `:h0`, `:c0`, `:return_state`, `:save_for_backward`."
  def lstm(x, layers, opts \\ []),
    do: Op.run(:lstm, [x: x, layers: layers], opts, erl_opts: true)

  @doc "Every gradient of `gru/3` from a saved context; see `fusex:gru_backward/3` (option `:dh_n`)."
  def gru_backward(dy, ctx, opts \\ []),
    do: Op.run(:gru_backward, [dy: dy, ctx: ctx], opts, erl_opts: true)

  @doc "Every gradient of `lstm/3`; see `fusex:lstm_backward/3` (options `:dh_n`, `:dc_n`)."
  def lstm_backward(dy, ctx, opts \\ []),
    do: Op.run(:lstm_backward, [dy: dy, ctx: ctx], opts, erl_opts: true)

  @doc """
  One frame of `gru/3` through every layer: `{y_t, h}`, `h` (a handle,
  `[layers, batch, hidden]`) updated in place. Both results are
  `%Fusex.Tensor{}` handles (the state must stay one).
  """
  def gru_step(h, x_t, layers, opts \\ []),
    do: Op.run(:gru_step, [h: h, x_t: x_t, layers: layers], Keyword.put(opts, :resident, true), in_place: [:h])

  @doc "One frame of `lstm/3`: `{y_t, {h, c}}`, both handles updated in place; handles back."
  def lstm_step(state, x_t, layers, opts \\ []),
    do:
      Op.run(:lstm_step, [state: state, x_t: x_t, layers: layers], Keyword.put(opts, :resident, true),
        in_place: [:state]
      )

  # ---- selective scan (Mamba S6): fusex:selective_scan/6, _backward/3,
  # _step/7 (docs/SSM.md) ----

  @doc "Mamba selective scan over a sequence; see `fusex:selective_scan/6`."
  def selective_scan(x, dt, a, b, c, opts \\ []),
    do: Op.run(:selective_scan, [x: x, dt: dt, a: a, b: b, c: c], opts, erl_opts: true)

  @doc "Gradients of `selective_scan/6` from a saved context; see `fusex:selective_scan_backward/3`."
  def selective_scan_backward(dy, ctx, opts \\ []),
    do: Op.run(:selective_scan_backward, [dy: dy, ctx: ctx], opts, erl_opts: true)

  @doc "One frame of the selective scan; a handle is updated in place (returns `y`), an Nx state gives `{y, new_state}` (module doc, \"Arguments and steps\")."
  def selective_scan_step(state, x, dt, a, b, c, opts \\ []),
    do:
      Op.run(:selective_scan_step, [state: state, x: x, dt: dt, a: a, b: b, c: c], opts,
        erl_opts: true,
        in_place: [:state]
      )

  # ---- the layers of a Mamba block: fusex:causal_conv1d/3, rms_norm/3,
  # layer_norm/4, linear/3, their _backward/3, causal_conv1d_step/4
  # (docs/LAYERS.md) ----

  @doc """
  The causal depthwise convolution over time; see `fusex:causal_conv1d/3`.
  Options: `:bias`, `:activation` (`:none` or `:silu`), `:initial_state`,
  `:return_state`, `:save_for_backward`.
  """
  def causal_conv1d(x, w, opts \\ []),
    do: Op.run(:causal_conv1d, [x: x, w: w], opts, erl_opts: true)

  @doc "Gradients of `causal_conv1d/3` from a saved context; see `fusex:causal_conv1d_backward/3`."
  def causal_conv1d_backward(dy, ctx, opts \\ []),
    do: Op.run(:causal_conv1d_backward, [dy: dy, ctx: ctx], opts, erl_opts: true)

  @doc "One frame of `causal_conv1d/3`; a handle is updated in place (returns `y`), an Nx state gives `{y, new_state}` (module doc, \"Arguments and steps\")."
  def causal_conv1d_step(state, x, w, opts \\ []),
    do: Op.run(:causal_conv1d_step, [state: state, x: x, w: w], opts, erl_opts: true, in_place: [:state])

  @doc """
  RMSNorm over the last dimension with residual and gate; see
  `fusex:rms_norm/3`. Options: `:bias`, `:residual`, `:gate`, `:eps`,
  `:residual_in_f32`, `:save_for_backward`.
  """
  def rms_norm(x, weight, opts \\ []),
    do: Op.run(:rms_norm, [x: x, weight: weight], opts, erl_opts: true)

  @doc "Gradients of `rms_norm/3` from a saved context; see `fusex:rms_norm_backward/3`."
  def rms_norm_backward(dy, ctx, opts \\ []),
    do: Op.run(:rms_norm_backward, [dy: dy, ctx: ctx], opts, erl_opts: true)

  @doc "LayerNorm over the last dimension with residual and gate; see `fusex:layer_norm/4`."
  def layer_norm(x, weight, bias, opts \\ []),
    do: Op.run(:layer_norm, [x: x, weight: weight, bias: bias], opts, erl_opts: true)

  @doc "Gradients of `layer_norm/4` from a saved context; see `fusex:layer_norm_backward/3`."
  def layer_norm_backward(dy, ctx, opts \\ []),
    do: Op.run(:layer_norm_backward, [dy: dy, ctx: ctx], opts, erl_opts: true)

  @doc """
  A linear layer `y = act(x W^T + bias)`, `w` `[out, in]`; see
  `fusex:linear/3`. Options: `:bias`, `:activation` (`:none`, `:relu`,
  `:gelu`, `:silu`, `:tanh`, `:sigmoid`), `:allow_tf32`,
  `:save_for_backward`. Eager only (no `Fusex.Defn` function): inside a
  compiled program XLA's own products are the right ones.
  """
  def linear(x, w, opts \\ []),
    do: Op.run(:linear, [x: x, w: w], opts, erl_opts: true)

  @doc "Gradients of `linear/3` from a saved context; see `fusex:linear_backward/3`."
  def linear_backward(dy, ctx, opts \\ []),
    do: Op.run(:linear_backward, [dy: dy, ctx: ctx], opts, erl_opts: true)
end
