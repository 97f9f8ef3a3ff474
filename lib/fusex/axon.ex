if Code.ensure_loaded?(Axon) and Code.ensure_loaded?(Nx) and function_exported?(Nx, :block, 4) do
  defmodule Fusex.Axon do
    @moduledoc """
    Axon layers whose recurrences are fusex's (`Fusex.Defn`): under EXLA
    with fusex's XLA targets they run as fused kernels inside the compiled
    model, forward and backward; elsewhere as their default Nx
    implementations.

    Every layer takes a sequence `[batch, seqlen, features]` and returns a
    sequence `[batch, seqlen, units]` (the selective scan and the causal
    convolution keep its width), or `{sequence, state}` (see "Initial and
    final states" below).

        model =
          Axon.input("x", shape: {nil, 32, 4})
          |> Fusex.Axon.min_gru(16)
          |> Axon.dense(1)

    Layers and their parameters (kernels `[features, units]`, biases
    `[units]`):

      * `selective_scan/2` - Mamba's S6 core on `x` itself: `x_proj`
        (to dt's low rank, B, C), `dt_proj`, `dt_bias`, `a_log`, `d`;
      * `min_gru/3` - `z_kernel`, `z_bias`, `h_kernel`, `h_bias`;
      * `min_lstm/3` - `f_kernel`, `f_bias`, `i_kernel`, `i_bias`,
        `h_kernel`, `h_bias`;
      * `liquid/3` - `kernel`, `bias` (the gate's logits), `log_tau`
        (tau = exp(log_tau), so that it stays positive), `a`;
      * `causal_conv1d/2` - `kernel` `[dim, width]`, `bias` `[dim]` (the
        sequence keeps its width);
      * `rms_norm/2`, `layer_norm/2` - `weight`, `bias` `[hidden]` (any
        shape `[..., hidden]`, kept), with an optional gate input.
      * `gru/3`, `lstm/3` - Axon's own GRU and LSTM parameters
        (`input_kernel`, `hidden_kernel`, `bias`), so that they drop in
        where `Axon.gru/3` and `Axon.lstm/3` stood.

    Kernels take `:kernel_initializer` (default `:glorot_uniform`), biases
    `:bias_initializer` (default `:zeros`).

    ## Initial and final states

    Every layer that carries a state over time (the selective scan,
    `min_gru`, `min_lstm`, `liquid`, `causal_conv1d`, `gru`, `lstm`) takes
    its initial state and gives its final one as `Axon.gru/4` does: the
    state is a tuple of `%Axon{}` layers, given after the input
    (`min_gru(x, {h}, units, opts)`), and comes out in the same form
    beside the sequence, `{sequence, state}`, so that one layer's final
    state is the initial state of another, or of the same layer on the
    next window:

        x = Axon.input("x", shape: {nil, nil, 4})
        h = Axon.input("h", shape: {nil, 16})
        {seq, {h_n}} = Fusex.Axon.min_gru(x, {h}, 16, return_state: true)
        model = Axon.container({Axon.dense(seq, 1), h_n})

    | layer | state | shape |
    |---|---|---|
    | `selective_scan` | `{state}` | `[batch, dim, dstate]` |
    | `min_gru`, `min_lstm`, `liquid` | `{h}` | `[batch, units]` |
    | `causal_conv1d` | `{state}` | `[batch, dim, width - 1]`, the last `width - 1` inputs, oldest first |
    | `gru` | `{hidden}` | `[batch, units]` |
    | `lstm` | `{cell, hidden}` | `[batch, units]` each |

    Without a state the layer starts from zeros. The final state is
    returned with `return_state: true`; `gru` and `lstm` return it by
    default (`return_state: false` gives the sequence alone), as Axon's own
    layers always do, the other layers not (they return the sequence, to
    pipe into the next layer). A reversed layer (`reverse: true`) runs
    from the end: its initial state is the state after the last step, its
    final state the one after the first. States are in the state type of
    the recurrence (f32, f64 for f64 inputs; the causal convolution's in
    its input's type), and a given state is cast to it. A state not of
    the form above raises an `ArgumentError` naming `state` when the layer
    is built; one whose shape is not the one above
    when the model runs (Axon reports it in an `Axon.CompileError`).
    Gradients reach the initial state, and cross a state carried from one
    call into the next, as every other input.
    """

    @doc """
    Mamba's selective scan (S6) over `x` `[batch, seqlen, dim]`:
    `dt = softplus(x_dt dt_proj + dt_bias)`, `B`, `C` projected from `x`,
    `A = -exp(a_log)`, skip `D`, as in Mamba's `selective_scan_fn` with
    `delta_softplus`.

    Options: `:name`, `:state_size` (`dstate`, default 16), `:dt_rank`
    (default `ceil(dim / 16)`), `:dt_min`, `:dt_max` (the range of the
    initial step, default 0.001 and 0.1), `:kernel_initializer`,
    `:return_state` (default false: the sequence; true: `{sequence,
    {state}}`, the final state `[batch, dim, dstate]`).
    Parameters are initialized as in Mamba: `a_log[d, n] = log(n + 1)`,
    `d = 1`, `dt_bias` the inverse softplus of a log-uniform step.

    `selective_scan(x, {state}, opts)` starts from the state `state`
    (`[batch, dim, dstate]`) instead of zeros; see "Initial and final
    states" above.
    """
    def selective_scan(x, opts \\ [])
    def selective_scan(x, {%Axon{}} = state), do: selective_scan(x, state, [])
    def selective_scan(x, opts), do: ssm(x, nil, opts)

    @doc "As `selective_scan/2`, from the initial state `{state}` (`[batch, dim, dstate]`)."
    def selective_scan(x, state, opts), do: ssm(x, state!(state, "{state}"), opts)

    defp ssm(x, state, opts) do
      input!(x)

      opts =
        Fusex.Opts.keyword!(opts, [:name, :dt_rank, state_size: 16, dt_min: 0.001, dt_max: 0.1,
          kernel_initializer: :glorot_uniform, return_state: false])

      name!(opts)
      Fusex.Opts.value!(opts, :state_size, "a positive integer", &Fusex.Opts.positive_integer?/1)
      Fusex.Opts.value!(opts, :dt_rank, "nil or a positive integer", &(&1 == nil or Fusex.Opts.positive_integer?(&1)))
      dt_min = Fusex.Opts.value!(opts, :dt_min, "a positive number", &Fusex.Opts.positive_number?/1)
      Fusex.Opts.value!(opts, :dt_max, "a number at least dt_min (#{dt_min})", &(Fusex.Opts.positive_number?(&1) and &1 >= dt_min))
      initializer!(opts, :kernel_initializer)
      Fusex.Opts.boolean!(opts, :return_state)

      n = opts[:state_size]
      rank = fn dim -> opts[:dt_rank] || div(dim + 15, 16) end
      dim = fn shape -> elem(shape, tuple_size(shape) - 1) end
      shape = fn f -> of_input(state, f) end

      x_proj = Axon.param("x_proj", shape.(fn s -> {dim.(s), rank.(dim.(s)) + 2 * n} end), initializer: opts[:kernel_initializer])
      dt_proj = Axon.param("dt_proj", shape.(fn s -> {rank.(dim.(s)), dim.(s)} end), initializer: opts[:kernel_initializer])
      dt_bias = Axon.param("dt_bias", shape.(fn s -> {dim.(s)} end), initializer: dt_bias_initializer(opts[:dt_min], opts[:dt_max]))
      a_log = Axon.param("a_log", shape.(fn s -> {dim.(s), n} end), initializer: &a_log_init/2)
      d = Axon.param("d", shape.(fn s -> {dim.(s)} end), initializer: :ones)

      stateful_layer(&selective_scan_layer/4, x, state, [x_proj, dt_proj, dt_bias, a_log, d], opts,
        op_name: :fusex_selective_scan,
        state_size: n
      )
    end

    @doc false
    def selective_scan_layer(x, h0, [x_proj, dt_proj, dt_bias, a_log, d], opts) do
      n = opts[:state_size]
      rank = elem(dt_proj.shape, 0)
      proj = Nx.dot(x, [2], x_proj, [0])
      # dt, b, c in x's type (the op's rule), whatever the parameters' type
      dt = proj |> Nx.slice_along_axis(0, rank, axis: 2) |> Nx.dot([2], dt_proj, [0]) |> Nx.as_type(x.type)
      b = proj |> Nx.slice_along_axis(rank, n, axis: 2) |> Nx.as_type(x.type)
      c = proj |> Nx.slice_along_axis(rank + n, n, axis: 2) |> Nx.as_type(x.type)
      a = Nx.negate(Nx.exp(a_log))
      {batch, _, dim} = x.shape
      h0 = initial!(h0, {batch, dim, n}, "[batch, dim, dstate]", state_type(x.type))
      tensors = with_state(%{d: d, dt_bias: dt_bias}, :h0, h0)
      Fusex.Defn.selective_scan(x, dt, a, b, c, tensors, dt_softplus: true, return_state: opts[:return_state])
    end

    # a_log[d, n] = log(n + 1): A = -(1, 2, ..., dstate) on every channel
    # (S4D-real, Mamba's initialization).
    defp a_log_init({dim, n}, type) do
      Nx.iota({dim, n}, axis: 1, type: type) |> Nx.add(1) |> Nx.log()
    end

    # dt_bias = softplus^-1(dt), dt log-uniform in [dt_min, dt_max].
    defp dt_bias_initializer(dt_min, dt_max) do
      fn {dim}, type, key ->
        {u, _key} = Nx.Random.uniform(key, shape: {dim}, type: type)
        dt = Nx.exp(Nx.add(Nx.multiply(u, :math.log(dt_max) - :math.log(dt_min)), :math.log(dt_min)))
        # softplus^-1(dt) = dt + log(-expm1(-dt))
        Nx.add(dt, Nx.log(Nx.negate(Nx.expm1(Nx.negate(dt)))))
      end
    end

    @doc """
    MinGRU: `z = sigmoid(x W_z + b_z)`, `h_t = (1 - z) h_{t-1} + z c(x W_h +
    b_h)` (`Fusex.Defn.mingru/4`). Options: `:name`, `:reverse`,
    `:candidate_activation` (`:identity` or `:g`), initializers,
    `:return_state` (default false: the sequence; true: `{sequence, {h}}`,
    the final `h` `[batch, units]`).

    `min_gru(x, {h}, units, opts)` starts from `h` (`[batch, units]`)
    instead of zeros; see "Initial and final states" above.
    """
    def min_gru(x, units, opts \\ [])
    def min_gru(x, {%Axon{}} = state, units), do: min_gru(x, state, units, [])
    def min_gru(x, units, opts), do: gated(:min_gru, x, nil, units, opts)

    @doc "As `min_gru/3`, from the initial state `{h}` (`[batch, units]`)."
    def min_gru(x, state, units, opts), do: gated(:min_gru, x, state!(state, "{h}"), units, opts)

    @doc false
    def min_gru_layer(x, h0, [zk, zb, hk, hb], opts) do
      z = dense(x, zk, zb)
      tensors = with_state(%{}, :h0, initial!(h0, hidden_shape(z), "[batch, units]", state_type(z.type)))
      Fusex.Defn.mingru(z, dense(x, hk, hb), tensors, gated_opts(opts))
    end

    @doc """
    MinLSTM: forget and input gates from `x`, normalised (`Fusex.Defn.minlstm/5`).
    Options as `min_gru/3`; `min_lstm(x, {h}, units, opts)` starts from `h`.
    """
    def min_lstm(x, units, opts \\ [])
    def min_lstm(x, {%Axon{}} = state, units), do: min_lstm(x, state, units, [])
    def min_lstm(x, units, opts), do: gated(:min_lstm, x, nil, units, opts)

    @doc "As `min_lstm/3`, from the initial state `{h}` (`[batch, units]`)."
    def min_lstm(x, state, units, opts), do: gated(:min_lstm, x, state!(state, "{h}"), units, opts)

    @doc false
    def min_lstm_layer(x, h0, [fk, fb, ik, ib, hk, hb], opts) do
      f = dense(x, fk, fb)
      tensors = with_state(%{}, :h0, initial!(h0, hidden_shape(f), "[batch, units]", state_type(f.type)))
      Fusex.Defn.minlstm(f, dense(x, ik, ib), dense(x, hk, hb), tensors, gated_opts(opts))
    end

    defp gated(kind, x, state, units, opts) do
      input!(x)
      units!(units)
      opts = validate_gated(opts)
      {prefixes, impl} = if kind == :min_gru, do: {["z", "h"], &min_gru_layer/4}, else: {["f", "i", "h"], &min_lstm_layer/4}

      stateful_layer(impl, x, state, projections(prefixes, units, state, opts), opts,
        op_name: :"fusex_#{kind}",
        reverse: opts[:reverse],
        candidate_activation: opts[:candidate_activation]
      )
    end

    @doc """
    Liquid (LTC) cells: `h_t = (h_{t-1} + dt f A) / (1 + dt (1/tau + f))`,
    `f = sigmoid(x W + b)` (`Fusex.Defn.liquid/5`). Options: `:name`,
    `:reverse`, `:dt` (a positive number, default 1.0), initializers,
    `:a_initializer` (default `:ones`), `:return_state` (as `min_gru/3`).

    `liquid(x, {h}, units, opts)` starts from `h` (`[batch, units]`)
    instead of zeros; see "Initial and final states" above.
    """
    def liquid(x, units, opts \\ [])
    def liquid(x, {%Axon{}} = state, units), do: liquid(x, state, units, [])
    def liquid(x, units, opts), do: liquid_cells(x, nil, units, opts)

    @doc "As `liquid/3`, from the initial state `{h}` (`[batch, units]`)."
    def liquid(x, state, units, opts), do: liquid_cells(x, state!(state, "{h}"), units, opts)

    defp liquid_cells(x, state, units, opts) do
      input!(x)
      units!(units)

      opts =
        Fusex.Opts.keyword!(opts, [:name, reverse: false, dt: 1.0, kernel_initializer: :glorot_uniform,
          bias_initializer: :zeros, a_initializer: :ones, return_state: false])

      name!(opts)
      Fusex.Opts.boolean!(opts, :reverse)
      Fusex.Opts.value!(opts, :dt, "a positive number", &Fusex.Opts.positive_number?/1)
      Enum.each([:kernel_initializer, :bias_initializer, :a_initializer], &initializer!(opts, &1))
      Fusex.Opts.boolean!(opts, :return_state)

      [kernel, bias] = projections([""], units, state, opts)
      log_tau = Axon.param("log_tau", {units}, initializer: :zeros)
      a = Axon.param("a", {units}, initializer: opts[:a_initializer])

      stateful_layer(&liquid_layer/4, x, state, [kernel, bias, log_tau, a], opts,
        op_name: :fusex_liquid,
        reverse: opts[:reverse],
        dt: opts[:dt]
      )
    end

    @doc false
    def liquid_layer(x, h0, [kernel, bias, log_tau, a], opts) do
      f = dense(x, kernel, bias)
      tensors = with_state(%{}, :h0, initial!(h0, hidden_shape(f), "[batch, units]", state_type(f.type)))
      Fusex.Defn.liquid(f, Nx.exp(log_tau), a, tensors, reverse: opts[:reverse], dt: opts[:dt], return_state: opts[:return_state])
    end

    # ---- the other layers of a Mamba block: causal conv1d, the norms ----

    @doc """
    The causal depthwise convolution over time (`Fusex.Defn.causal_conv1d/4`):
    `x` `[batch, seqlen, dim]` to the same shape, `y_t = act(bias + sum_k
    kernel[:, k] x_{t - (width - 1) + k})`, the inputs before the first
    zeros. Parameters: `kernel` `[dim, width]`, `bias` `[dim]` (with
    `use_bias: true`, the default). Options: `:name`, `:width` (1 to 16,
    default 4), `:activation` (`:none` or `:silu`, default `:none`),
    `:use_bias`, `:kernel_initializer` (default `:glorot_uniform`),
    `:bias_initializer` (default `:zeros`), `:return_state` (default
    false: the sequence; true: `{sequence, {state}}`, the final state
    `[batch, dim, width - 1]`: the last `width - 1` inputs, oldest first).

    `causal_conv1d(x, {state}, opts)` takes the inputs before the first
    from `state` (`[batch, dim, width - 1]`, in `x`'s type) instead of
    zeros; see "Initial and final states" above.
    """
    def causal_conv1d(x, opts \\ [])
    def causal_conv1d(x, {%Axon{}} = state), do: causal_conv1d(x, state, [])
    def causal_conv1d(x, opts), do: conv(x, nil, opts)

    @doc "As `causal_conv1d/2`, from the initial state `{state}` (`[batch, dim, width - 1]`)."
    def causal_conv1d(x, state, opts), do: conv(x, state!(state, "{state}"), opts)

    defp conv(x, state, opts) do
      input!(x)

      opts =
        Fusex.Opts.keyword!(opts, [:name, width: 4, activation: :none, use_bias: true,
          kernel_initializer: :glorot_uniform, bias_initializer: :zeros, return_state: false])

      name!(opts)
      Fusex.Opts.value!(opts, :width, "an integer 1 to 16", &(is_integer(&1) and &1 in 1..16))
      Fusex.Opts.value!(opts, :activation, ":none or :silu", &(&1 in [:none, :silu]))
      Fusex.Opts.boolean!(opts, :use_bias)
      Enum.each([:kernel_initializer, :bias_initializer], &initializer!(opts, &1))
      Fusex.Opts.boolean!(opts, :return_state)

      width = opts[:width]
      kernel = Axon.param("kernel", of_input(state, fn s -> {last(s), width} end), initializer: opts[:kernel_initializer])

      bias =
        if opts[:use_bias],
          do: [Axon.param("bias", of_input(state, fn s -> {last(s)} end), initializer: opts[:bias_initializer])],
          else: []

      stateful_layer(&causal_conv1d_layer/4, x, state, [kernel | bias], opts,
        op_name: :fusex_causal_conv1d,
        activation: opts[:activation],
        width: width
      )
    end

    @doc false
    def causal_conv1d_layer(x, state, [kernel | bias], opts) do
      {batch, _, dim} = x.shape
      state = initial!(state, {batch, dim, opts[:width] - 1}, "[batch, dim, width - 1]", x.type)
      tensors = %{} |> with_state(:bias, List.first(bias)) |> with_state(:initial_state, state)
      Fusex.Defn.causal_conv1d(x, kernel, tensors, activation: opts[:activation], return_state: opts[:return_state])
    end

    @doc """
    RMSNorm over the last axis (`Fusex.Defn.rms_norm/4`): `y = x /
    sqrt(mean(x^2) + eps) * weight + bias`, times `silu(gate)` with a
    `:gate` (Mamba-2's gated norm). Parameters: `weight` `[hidden]`, and
    `bias` with `use_bias: true` (default false). Options: `:name`, `:eps`
    (default 1.0e-5), `:gate` (an `%Axon{}` of the input's shape),
    `:use_bias`, `:weight_initializer` (default `:ones`),
    `:bias_initializer` (default `:zeros`). The fused residual add (which
    also returns `x + residual`) is `Fusex.Defn.rms_norm/4`'s.
    """
    def rms_norm(x, opts \\ []), do: norm(:rms_norm, x, opts, false)

    @doc """
    LayerNorm over the last axis (`Fusex.Defn.layer_norm/5`), with the
    options of `rms_norm/2`; `bias` is a parameter unless `use_bias: false`
    (then zeros).
    """
    def layer_norm(x, opts \\ []), do: norm(:layer_norm, x, opts, true)

    defp norm(kind, x, opts, use_bias) do
      input!(x)

      opts =
        Fusex.Opts.keyword!(opts, [:name, :gate, eps: 1.0e-5, use_bias: use_bias, weight_initializer: :ones,
          bias_initializer: :zeros])

      name!(opts)
      eps = "a finite number >= 0"
      Fusex.Opts.value!(opts, :eps, eps, &((is_float(&1) or is_integer(&1)) and &1 >= 0 and &1 <= 1.7976931348623157e308))
      Fusex.Opts.value!(opts, :gate, "nil or an %Axon{} layer", &(&1 == nil or is_struct(&1, Axon)))
      Fusex.Opts.boolean!(opts, :use_bias)
      Enum.each([:weight_initializer, :bias_initializer], &initializer!(opts, &1))

      gate = if opts[:gate], do: [opts[:gate]], else: []
      # (a parameter's shape is a function of every input layer's shape)
      hidden = if gate == [], do: fn s -> {last(s)} end, else: fn s, _gate -> {last(s)} end
      weight = Axon.param("weight", hidden, initializer: opts[:weight_initializer])
      bias = if opts[:use_bias], do: [Axon.param("bias", hidden, initializer: opts[:bias_initializer])], else: []
      inputs = [x | gate] ++ [weight | bias]
      fun = Enum.at([nil, nil, &norm_layer/3, &norm_layer/4, &norm_layer/5], length(inputs))

      Axon.layer(fun, inputs, name: opts[:name], op_name: :"fusex_#{kind}", kind: kind, eps: opts[:eps] * 1.0,
        gate: gate != [], use_bias: opts[:use_bias])
    end

    @doc false
    def norm_layer(x, a, opts), do: norm_call([x, a], opts)
    @doc false
    def norm_layer(x, a, b, opts), do: norm_call([x, a, b], opts)
    @doc false
    def norm_layer(x, a, b, c, opts), do: norm_call([x, a, b, c], opts)

    # [x, gate?, weight, bias?] as the layer's inputs came.
    defp norm_call([x | rest], opts) do
      {gate, [weight | bias]} = if opts[:gate], do: {hd(rest), tl(rest)}, else: {nil, rest}
      tensors = if gate, do: %{gate: gate}, else: %{}
      eps = [eps: opts[:eps]]

      case {opts[:kind], bias} do
        {:rms_norm, []} -> Fusex.Defn.rms_norm(x, weight, tensors, eps)
        {:rms_norm, [b]} -> Fusex.Defn.rms_norm(x, weight, Map.put(tensors, :bias, b), eps)
        {:layer_norm, []} -> Fusex.Defn.layer_norm(x, weight, Nx.broadcast(Nx.tensor(0, type: weight.type), weight.shape), tensors, eps)
        {:layer_norm, [b]} -> Fusex.Defn.layer_norm(x, weight, b, tensors, eps)
      end
    end

    defp last(shape), do: elem(shape, tuple_size(shape) - 1)

    # ---- shared ----

    defp validate_gated(opts) do
      opts =
        Fusex.Opts.keyword!(opts, [:name, reverse: false, candidate_activation: :identity,
          kernel_initializer: :glorot_uniform, bias_initializer: :zeros, return_state: false])

      name!(opts)
      Fusex.Opts.boolean!(opts, :reverse)
      Fusex.Opts.value!(opts, :candidate_activation, ":identity or :g", &(&1 in [:identity, :g]))
      Enum.each([:kernel_initializer, :bias_initializer], &initializer!(opts, &1))
      Fusex.Opts.boolean!(opts, :return_state)
      opts
    end

    # ---- initial and final states (every stateful layer) ----

    # The layer of a stateful family: its inputs x, the initial state
    # where one is given, then the parameters; `impl.(x, state or nil,
    # params, opts)` gives y, or {y, final state} with return_state. The
    # result: the sequence, or {sequence, {state}} with return_state.
    defp stateful_layer(impl, x, state, params, opts, layer_opts) do
      inputs = [x | List.wrap(state)] ++ params

      fun =
        layer_fun(length(inputs), fn [x | rest], o ->
          {h0, params} = if o[:initial_state], do: {hd(rest), tl(rest)}, else: {nil, rest}

          out = impl.(x, h0, params, o)
          if o[:return_state], do: {elem(out, 0), {elem(out, 1)}}, else: out
        end)

      layer_opts = [name: opts[:name], initial_state: state != nil, return_state: opts[:return_state]] ++ layer_opts
      out = Axon.layer(fun, inputs, layer_opts)
      if opts[:return_state], do: parts(out, 1), else: out
    end

    # A layer function of arity n + 1 (n inputs and the options) over the
    # list of its inputs: Axon calls a layer's function with each input
    # as an argument, and how many there are depends on the state.
    for n <- 1..10 do
      args = Macro.generate_arguments(n, __MODULE__)
      defp layer_fun(unquote(n), impl), do: fn unquote_splicing(args), opts -> impl.(unquote(args), opts) end
    end

    # {sequence, {state parts}} of a layer whose output is {y, {s0, ...}}.
    # (fusex_part says which part each takes: Fusex.Model.from_axon reads it.)
    defp parts(out, n) do
      seq = Axon.layer(fn o, _ -> elem(o, 0) end, [out], op_name: :elem, fusex_part: :sequence)
      states = for i <- 0..(n - 1), do: Axon.layer(fn o, _ -> elem(elem(o, 1), i) end, [out], op_name: :elem, fusex_part: {:state, i})
      {seq, List.to_tuple(states)}
    end

    # The initial state's layer, given as a one-tuple {%Axon{}}.
    defp state!({%Axon{} = state}, _form), do: state
    defp state!(other, form), do: Fusex.Opts.fail("state", "#{form} of an %Axon{} layer", other)

    # A parameter's shape as a function of the layer's input shapes: x's,
    # and the state's where there is one (Axon passes every input's).
    defp of_input(nil, f), do: f
    defp of_input(_state, f), do: fn s, _state -> f.(s) end

    # The initial state as the op takes it: nil where none was given, else
    # of `shape` (checked here, so that the message names the layer's
    # argument) cast to the recurrence's state type.
    defp initial!(nil, _shape, _layout, _type), do: nil

    defp initial!(state, shape, layout, type) do
      if Nx.shape(state) != shape,
        do: raise(ArgumentError, "state: expected shape #{shape_text(shape)} (#{layout}), got #{shape_text(Nx.shape(state))}")

      Nx.as_type(state, type)
    end

    defp with_state(tensors, _key, nil), do: tensors
    defp with_state(tensors, key, t), do: Map.put(tensors, key, t)

    # The shapes as the op layer writes them: {2,3}.
    defp shape_text(shape), do: "{" <> Enum.map_join(Tuple.to_list(shape), ",", &Integer.to_string/1) <> "}"

    # The type a recurrence keeps its state in (the op layer's rule): f64
    # for f64 inputs, else f32.
    defp state_type({:f, 64}), do: {:f, 64}
    defp state_type(_), do: {:f, 32}

    # [batch, units] of a projection [batch, seqlen, units].
    defp hidden_shape(t), do: {elem(t.shape, 0), elem(t.shape, 2)}

    # ---- GRU and LSTM: Axon's layers, fusex's kernels ----

    @doc """
    A GRU layer that drops in where `Axon.gru/3` stood: the same
    parameters (`"input_kernel"` `%{"wir", "wiz", "win"}` `[features,
    units]` each, `"hidden_kernel"` `%{"whr", "whz", "whn"}` `[units,
    units]`, `"bias"` `%{"br", "bz", "bin", "bhn"}` `[units]`), the same
    result `{output_sequence, {new_h}}`, run as one fusex GRU layer
    (`Fusex.Defn.gru/4`; docs/RNN.md maps these onto PyTorch's `w_ih`,
    `w_hh`, `b_ih`, `b_hh`). The initial state is zeros, or `{hidden}`
    (`[batch, units]`) as `gru/4` takes it; see "Initial and final states"
    above.

    Options: `:name`, `:kernel_initializer` (default `:glorot_uniform`),
    `:bias_initializer` (default `:zeros`), `:return_state` (default true,
    as Axon's; false: the output sequence alone); `:activation` and
    `:gate` only as their defaults (`:tanh`, `:sigmoid`), `:unroll` is
    taken and has no effect (the kernel is the loop).
    """
    def gru(x, units, opts \\ [])
    def gru(x, {%Axon{}} = state, units), do: rnn(:gru, x, state, units, [])
    def gru(x, units, opts), do: rnn(:gru, x, nil, units, opts)

    @doc "As `gru/3`, from the initial state `{hidden}` (`[batch, units]`)."
    def gru(x, {%Axon{} = hidden}, units, opts), do: rnn(:gru, x, {hidden}, units, opts)
    def gru(_x, state, _units, _opts), do: Fusex.Opts.fail("state", "{hidden} of %Axon{} layers", state)

    @doc """
    An LSTM layer in place of `Axon.lstm/3`: parameters `"input_kernel"`
    `%{"wii", "wif", "wig", "wio"}`, `"hidden_kernel"` `%{"whi", "whf",
    "whg", "who"}`, `"bias"` `%{"bi", "bf", "bg", "bo"}`; result
    `{output_sequence, {new_c, new_h}}`. Initial states zeros, or `{cell,
    hidden}` (`[batch, units]` each) as `lstm/4` takes them. Options as
    `gru/3`.
    """
    def lstm(x, units, opts \\ [])
    def lstm(x, {%Axon{}, %Axon{}} = state, units), do: rnn(:lstm, x, state, units, [])
    def lstm(x, units, opts), do: rnn(:lstm, x, nil, units, opts)

    @doc "As `lstm/3`, from the initial states `{cell, hidden}`."
    def lstm(x, {%Axon{}, %Axon{}} = state, units, opts), do: rnn(:lstm, x, state, units, opts)
    def lstm(_x, state, _units, _opts), do: Fusex.Opts.fail("state", "{cell, hidden} of %Axon{} layers", state)

    @rnn_gates %{gru: ~w(r z n), lstm: ~w(i f g o)}

    defp rnn(cell, x, state, units, opts) do
      input!(x)
      units!(units)

      opts =
        Fusex.Opts.keyword!(opts, [:name, :meta, :recurrent_initializer, :seed, activation: :tanh, gate: :sigmoid,
          unroll: :dynamic, use_bias: true, kernel_initializer: :glorot_uniform, bias_initializer: :zeros,
          return_state: true])

      name!(opts)
      initializer!(opts, :kernel_initializer)
      initializer!(opts, :bias_initializer)
      Fusex.Opts.value!(opts, :activation, ":tanh (fusex's cells)", &(&1 == :tanh))
      Fusex.Opts.value!(opts, :gate, ":sigmoid (fusex's cells)", &(&1 == :sigmoid))
      Fusex.Opts.value!(opts, :use_bias, "true or false", &is_boolean/1)
      Fusex.Opts.boolean!(opts, :return_state)
      gates = @rnn_gates[cell]
      bias_keys = if cell == :gru, do: ~w(br bz bin bhn), else: Enum.map(gates, &"b#{&1}")
      # the parameters' templates from the layer's inputs: x (and the states)
      template = fn shape_of ->
        if state,
          do: fn inp, _states -> Nx.template(shape_of.(Nx.shape(inp)), {:f, 32}) end,
          else: fn inp -> Nx.template(shape_of.(Nx.shape(inp)), {:f, 32}) end
      end

      input_kernel =
        Axon.parameter("input_kernel", template.(fn s -> {elem(s, tuple_size(s) - 1), units} end),
          initializer: split_initializer(Enum.map(gates, &"wi#{&1}"), opts[:kernel_initializer])
        )

      hidden_kernel =
        Axon.parameter("hidden_kernel", template.(fn _ -> {units, units} end),
          initializer: split_initializer(Enum.map(gates, &"wh#{&1}"), opts[:kernel_initializer])
        )

      # (without a bias no input stands for it: every input layer would
      # count in the parameters' templates)
      bias =
        if opts[:use_bias],
          do: [Axon.parameter("bias", template.(fn _ -> {units} end), initializer: split_initializer(bias_keys, opts[:bias_initializer]))],
          else: []

      states = if state, do: [Axon.container(state)], else: []
      inputs = [x | states] ++ [input_kernel, hidden_kernel | bias]

      fun =
        layer_fun(length(inputs), fn [x | rest], o ->
          {states, rest} = if state, do: {hd(rest), tl(rest)}, else: {{}, rest}
          [wi, wh | bias] = rest
          rnn_layer(x, states, wi, wh, List.first(bias), o)
        end)

      out =
        Axon.layer(fun, inputs,
          name: opts[:name],
          op_name: :"fusex_#{cell}",
          cell: cell,
          units: units,
          use_bias: opts[:use_bias],
          initial_state: state != nil
        )

      {seq, states} = parts(out, if(cell == :gru, do: 1, else: 2))
      if opts[:return_state], do: {seq, states}, else: seq
    end

    # A map parameter of `keys`, each initialized alone (as Axon's own).
    defp split_initializer(keys, init) do
      fn shape, type, key ->
        init = if is_atom(init), do: apply(Axon.Initializers, init, []), else: init
        keys_rng = Nx.Random.split(key, parts: length(keys))

        for {k, i} <- Enum.with_index(keys), into: %{} do
          value = if is_function(init, 2), do: init.(shape, type), else: init.(shape, type, keys_rng[i])
          {k, value}
        end
      end
    end

    @doc false
    # Axon's parameters in PyTorch's layout (docs/RNN.md): the gate kernels
    # [features, units] side by side and transposed, b_hh zero but for the
    # GRU's n gate (Axon's bhn), b_ih the rest.
    def rnn_layer(x, states, wi, wh, bias, opts) do
      cell = opts[:cell]
      units = opts[:units]
      gates = @rnn_gates[cell]
      cat = fn map, prefix -> gates |> Enum.map(&map["#{prefix}#{&1}"]) |> Nx.concatenate(axis: 1) |> Nx.transpose() |> Nx.as_type(x.type) end
      zeros = Nx.broadcast(Nx.tensor(0, type: {:f, 32}), {units})

      {b_ih, b_hh} =
        case {cell, bias} do
          {:gru, %{} = b} -> {Nx.concatenate([b["br"], b["bz"], b["bin"]]), Nx.concatenate([zeros, zeros, b["bhn"]])}
          {:lstm, %{} = b} -> {Nx.concatenate(Enum.map(gates, &b["b#{&1}"])), Nx.concatenate([zeros, zeros, zeros, zeros])}
          {_, nil} -> {Nx.broadcast(0.0, {length(gates) * units}), Nx.broadcast(0.0, {length(gates) * units})}
        end

      layer = %{w_ih: cat.(wi, "wi"), w_hh: cat.(wh, "wh"), b_ih: b_ih, b_hh: b_hh}
      shape = {elem(x.shape, 0), units}
      initial = fn t -> t |> initial!(shape, "[batch, units]", state_type(x.type)) |> Nx.new_axis(0) end

      case {cell, states} do
        {:gru, {}} ->
          {y, h} = Fusex.Defn.gru(x, [layer], %{}, return_state: true)
          {y, {h[0]}}

        {:gru, {h0}} ->
          {y, h} = Fusex.Defn.gru(x, [layer], %{h0: initial.(h0)}, return_state: true)
          {y, {h[0]}}

        {:lstm, st} ->
          tensors = case st do {c0, h0} -> %{h0: initial.(h0), c0: initial.(c0)}; {} -> %{} end
          {y, {h, c}} = Fusex.Defn.lstm(x, [layer], tensors, return_state: true)
          {y, {c[0], h[0]}}
      end
    end

    # ---- the arguments, checked with the house message ----

    defp input!(%Axon{}), do: :ok
    defp input!(other), do: Fusex.Opts.fail("input", "an %Axon{} layer", other)

    defp units!(units) do
      unless Fusex.Opts.positive_integer?(units), do: Fusex.Opts.fail("units", "a positive integer", units)
    end

    # A layer name as Axon takes it: nil, a string, or a function of the op
    # and the op counts.
    defp name!(opts),
      do: Fusex.Opts.value!(opts, :name, "nil, a string or a function of arity 2", &(&1 == nil or is_binary(&1) or is_function(&1, 2)))

    # An initializer as Axon takes it: one of Axon.Initializers' names or a
    # function of arity 2 or 3.
    defp initializer!(opts, key) do
      Code.ensure_loaded(Axon.Initializers)

      Fusex.Opts.value!(opts, key, "an Axon initializer (a function of Axon.Initializers by name, or a function of arity 2 or 3)", fn
        v when is_atom(v) and v not in [nil, true, false, :module_info] -> function_exported?(Axon.Initializers, v, 0)
        v -> is_function(v, 2) or is_function(v, 3)
      end)
    end

    defp gated_opts(opts),
      do: [reverse: opts[:reverse], candidate_activation: opts[:candidate_activation], return_state: opts[:return_state]]

    # A kernel [features, units] and a bias [units] for each prefix.
    defp projections(prefixes, units, state, opts) do
      Enum.flat_map(prefixes, fn prefix ->
        name = fn part -> if prefix == "", do: part, else: "#{prefix}_#{part}" end

        [
          Axon.param(name.("kernel"), of_input(state, fn s -> {elem(s, tuple_size(s) - 1), units} end),
            initializer: opts[:kernel_initializer]
          ),
          Axon.param(name.("bias"), {units}, initializer: opts[:bias_initializer])
        ]
      end)
    end

    defp dense(x, kernel, bias), do: x |> Nx.dot([Nx.rank(x) - 1], kernel, [0]) |> Nx.add(bias)
  end
end
