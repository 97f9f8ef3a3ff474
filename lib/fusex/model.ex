if Code.ensure_loaded?(Axon) and Code.ensure_loaded?(Nx) and function_exported?(Nx, :block, 4) do
  defmodule Fusex.Model do
    @moduledoc """
    A trained Axon model served by fusex's resident model (`:fusex.model/3`,
    docs/MODELS.md): its weights resident on one device, answered one frame
    at a time with the recurrent state carried between calls.

        {seq, _state} = Axon.input("x", shape: {nil, nil, 3}) |> Fusex.Axon.gru(8)
        axon = Axon.dense(seq, 4)
        # ... train it: params = Axon.Loop.run(...)
        model = Fusex.Model.from_axon(axon, params)
        state = Fusex.Model.init_state(model, 1)
        {out, state} = Fusex.Model.step(model, state, frame)   # frame [1, 3], out [1, 4]

    `from_axon/3` takes a plain chain from one `Axon.input` of:

      * `Fusex.Axon.gru/3`, `Fusex.Axon.lstm/3` (their output sequence),
        `Fusex.Axon.min_gru/3`, `Fusex.Axon.min_lstm/3`
        (not `:reverse`, candidate `:identity`; with `return_state: true`
        their output sequence), each without an initial state input (the
        resident model's states start at zeros, `init_state/2`, and
        `step/3` carries them);
      * `Axon.dense/3` with or without bias, and with no activation or one
        of `:relu`, `:tanh`, `:sigmoid`, `:silu` (`:gelu` is erf's in Axon,
        the tanh form in the model: refused);
      * `Fusex.Axon.rms_norm/2` (no bias, no gate), `Fusex.Axon.layer_norm/2`
        (no gate).

    A dense layer after a sequence layer acts on every time step, as the
    model's linear does on every frame. Anything else raises an
    `ArgumentError` naming the layer and what is not supported.
    """

    @enforce_keys [:ref, :device, :spec]
    defstruct [:ref, :device, :spec]

    @typedoc "A resident model: its handle, device and spec (`:fusex.model_spec()`)."
    @type t :: %__MODULE__{ref: reference(), device: term(), spec: map()}

    @activations [:relu, :tanh, :sigmoid, :silu]
    # The recurrent layers the resident model has.
    @stateful [:fusex_gru, :fusex_lstm, :fusex_min_gru, :fusex_min_lstm]

    @doc """
    The resident model of a trained Axon `model` with parameters `params`
    (an `%Axon.ModelState{}` or its data map), on `:device` (default
    `Fusex.default_device/0`). Every parameter is converted to the model's
    layout ({f,32}; dense kernels `[in, out]` become `w` `[out, in]`, GRU and
    LSTM gate kernels are stacked as PyTorch's `w_ih`, `w_hh`).
    """
    @spec from_axon(Axon.t(), Axon.ModelState.t() | map(), keyword()) :: t()
    def from_axon(model, params, opts \\ [])

    def from_axon(%Axon{output: output, nodes: nodes}, params, opts) do
      opts = Fusex.Opts.keyword!(opts, [:device])
      device = Fusex.Tensor.normalize_device(opts[:device] || Fusex.default_device())
      data = params_data!(params)
      names = node_names(output, nodes)
      {input, layers} = chain(output, nodes, names, [])
      {specs, weights} = layers |> fold_activations() |> Enum.map(&convert(&1, data)) |> Enum.unzip()
      spec = %{input: input, layers: specs}
      weights = Enum.map(weights, &to_fusex/1)
      ref = Fusex.Erl.call(:model, [device, spec, weights])
      %__MODULE__{ref: ref, device: device, spec: spec}
    end

    def from_axon(other, _params, _opts), do: Fusex.Opts.fail("model", "an %Axon{} model", other)

    @doc """
    A state for `batch` rows: every recurrence at zero (`:fusex.model_init_state/2`).
    The state is updated in place by `step/3` and `forward/3`.
    """
    @spec init_state(t(), pos_integer()) :: reference()
    def init_state(%__MODULE__{ref: ref}, batch), do: Fusex.Erl.call(:model_init_state, [ref, batch])

    @doc "Zeros the state again (a new episode)."
    @spec reset_state(t(), reference()) :: :ok
    def reset_state(%__MODULE__{ref: ref}, state), do: Fusex.Erl.call(:model_reset_state, [ref, state])

    @doc """
    One frame `[batch, input]` through every layer: `{out, state}`, `out`
    `[batch, output]` (an Nx tensor on the default backend), `state` the
    state after the frame.
    """
    @spec step(t(), reference(), Nx.Tensor.t()) :: {Nx.Tensor.t(), reference()}
    def step(%__MODULE__{} = model, state, frame) do
      {out, state} = Fusex.Erl.call(:model_step, [model.ref, state, import!(model, frame, "frame")])
      {export(out), state}
    end

    @doc """
    A window `[batch, seqlen, input]` from zero states: `{outputs, state}`,
    outputs `[batch, seqlen, output]`, state holding the final states.
    """
    @spec forward(t(), Nx.Tensor.t()) :: {Nx.Tensor.t(), reference()}
    def forward(%__MODULE__{} = model, window) do
      {out, state} = Fusex.Erl.call(:model_forward, [model.ref, import!(model, window, "window")])
      {export(out), state}
    end

    @doc "As `forward/2`, from `state` (left at the state after the window)."
    @spec forward(t(), Nx.Tensor.t(), reference()) :: {Nx.Tensor.t(), reference()}
    def forward(%__MODULE__{} = model, window, state) do
      {out, state} = Fusex.Erl.call(:model_forward, [model.ref, import!(model, window, "window"), state])
      {export(out), state}
    end

    @doc "The model's description (`:fusex.model_info/1`)."
    @spec info(t()) :: map()
    def info(%__MODULE__{ref: ref}), do: Fusex.Erl.call(:model_info, [ref])

    # ---- Nx <-> fusex ----

    defp import!(model, %Nx.Tensor{} = t, name) do
      t |> Nx.as_type({:f, 32}) |> Fusex.Interop.from_nx(name, device: model.device) |> Map.fetch!(:ref)
    end

    defp import!(_model, other, name), do: Fusex.Opts.fail(name, "an Nx tensor", other)

    defp export(ref), do: ref |> Fusex.Tensor.wrap() |> Fusex.Interop.to_nx_copy(nil)

    # As binaries of the model's type in native byte order (what Nx's
    # binaries are): no tensor handle per weight.
    defp to_fusex(weights) do
      Map.new(weights, fn {k, t} -> {k, t |> Nx.as_type({:f, 32}) |> Nx.to_binary()} end)
    end

    # ---- the Axon graph ----

    defp params_data!(%Axon.ModelState{data: data}), do: data
    defp params_data!(%{} = data) when not is_struct(data), do: data
    defp params_data!(other), do: Fusex.Opts.fail("params", "an %Axon.ModelState{} or a map of layer parameters", other)

    # Each node's name as Axon's compiler gives it (parents first, counted
    # per op name), so that the parameters can be found by layer name.
    defp node_names(output, nodes) do
      {names, _counts} = name_node(output, nodes, {%{}, %{}})
      names
    end

    defp name_node(id, nodes, {names, _counts} = acc) do
      if Map.has_key?(names, id) do
        acc
      else
        %Axon.Node{parent: parents, name: name_fn, op_name: op_name} = nodes[id]
        {names, counts} = Enum.reduce(parents, acc, &name_node(&1, nodes, &2))
        name = name_fn.(op_name, counts)
        {Map.put(names, id, name), Map.update(counts, op_name, 1, &(&1 + 1))}
      end
    end

    # From the output back to the input: {input width, [layer]} in order,
    # a layer {kind, name, node}.
    defp chain(id, nodes, names, acc) do
      node = nodes[id]
      name = names[id]

      case {node.op_name, node.parent} do
        {:input, []} ->
          {input_width!(node, name), acc}

        {:elem, [parent]} ->
          layer = nodes[parent]

          unless node.opts[:fusex_part] == :sequence and layer.op_name in @stateful do
            unsupported!(name, node.op_name,
              "only the output sequence of a Fusex.Axon gru, lstm, min_gru or min_lstm layer is taken (not its state)")
          end

          case layer.parent do
            [x] -> chain(x, nodes, names, [{layer.op_name, names[parent], layer} | acc])
            _ -> initial_state!(names[parent], layer)
          end

        {op, [x]} when op in [:dense, :fusex_min_gru, :fusex_min_lstm, :fusex_rms_norm, :fusex_layer_norm] ->
          chain(x, nodes, names, [{op, name, node} | acc])

        {op, [_, _ | _]} when op in @stateful ->
          initial_state!(name, node)

        {op, [x]} when op in @activations ->
          chain(x, nodes, names, [{:activation, name, node} | acc])

        {:gelu, [_]} ->
          unsupported!(name, :gelu, "Axon's gelu is erf's, the resident model's the tanh form")

        {op, [_]} ->
          unsupported!(name, op, "not a layer the resident model has")

        {op, parents} ->
          unsupported!(name, op, "#{length(parents)} inputs: only a plain chain from one Axon.input")
      end
    end

    # A recurrent layer's input besides its sequence is its initial state.
    defp initial_state!(name, node) do
      unsupported!(name, node.op_name, "an initial state input (the resident model's states start at zeros, " <>
        "Fusex.Model.init_state/2, and step/3 carries them)")
    end

    defp input_width!(node, name) do
      case node.opts[:shape] do
        shape when is_tuple(shape) and tuple_size(shape) >= 2 and is_integer(elem(shape, tuple_size(shape) - 1)) ->
          elem(shape, tuple_size(shape) - 1)

        shape ->
          unsupported!(name, :input, "shape #{inspect(shape)}: the feature width must be known")
      end
    end

    # An activation joins the dense layer before it.
    defp fold_activations(layers) do
      layers
      |> Enum.reduce([], fn
        {:activation, _name, node}, [{:dense, dname, dnode, :none} | rest] ->
          [{:dense, dname, dnode, node.op_name} | rest]

        {:activation, name, node}, _ ->
          unsupported!(name, node.op_name, "an activation is taken only right after Axon.dense")

        {kind, name, node}, rest ->
          [{kind, name, node, :none} | rest]
      end)
      |> Enum.reverse()
    end

    # {layer spec, weights} of one layer.
    defp convert({:dense, name, _node, act}, data) do
      p = layer_params!(data, name, :dense)
      kernel = param!(p, name, :dense, "kernel")
      {_in, out} = Nx.shape(kernel)
      bias = Map.get(p, "bias")
      spec = %{out: out, activation: act, bias: bias != nil}
      weights = %{w: Nx.transpose(kernel)}
      weights = if bias, do: Map.put(weights, :b, bias), else: weights
      {{:linear, spec}, weights}
    end

    defp convert({op, name, node, :none}, data) when op in [:fusex_min_gru, :fusex_min_lstm] do
      if node.opts[:reverse], do: unsupported!(name, op, "reverse: true (a frame runs forward in time)")

      if node.opts[:candidate_activation] != :identity,
        do: unsupported!(name, op, "candidate_activation: #{inspect(node.opts[:candidate_activation])}")

      p = layer_params!(data, name, op)
      {kind, gates} = if op == :fusex_min_gru, do: {:mingru, ~w(z h)}, else: {:minlstm, ~w(f i h)}
      kernel = param!(p, name, op, "#{hd(gates)}_kernel")

      weights =
        for g <- gates, {part, key} <- [{"kernel", :w}, {"bias", :b}], into: %{} do
          t = param!(p, name, op, "#{g}_#{part}")
          {:"#{key}_#{g}", if(part == "kernel", do: Nx.transpose(t), else: t)}
        end

      {{kind, %{hidden: elem(Nx.shape(kernel), 1)}}, weights}
    end

    defp convert({op, name, node, :none}, data) when op in [:fusex_gru, :fusex_lstm] do
      p = layer_params!(data, name, op)
      {kind, gates} = if op == :fusex_gru, do: {:gru, ~w(r z n)}, else: {:lstm, ~w(i f g o)}
      units = node.opts[:units]
      stack = fn map, prefix ->
        gates |> Enum.map(&param!(map, name, op, "#{prefix}#{&1}")) |> Nx.concatenate(axis: 1) |> Nx.transpose()
      end

      input_kernel = param!(p, name, op, "input_kernel")
      hidden_kernel = param!(p, name, op, "hidden_kernel")
      zeros = Nx.broadcast(Nx.tensor(0.0, type: {:f, 32}), {units})
      no_bias = Nx.concatenate(List.duplicate(zeros, length(gates)))

      # Axon's biases: one per gate on the input side, but for the GRU's
      # n gate, whose hidden-side bias (bhn) sits inside r * (.)
      {b_ih, b_hh} =
        case {kind, node.opts[:use_bias]} do
          {_, false} ->
            {no_bias, no_bias}

          {:gru, _} ->
            bias = param!(p, name, op, "bias")
            {Nx.concatenate(Enum.map(~w(br bz bin), &param!(bias, name, op, &1))),
             Nx.concatenate([zeros, zeros, param!(bias, name, op, "bhn")])}

          {:lstm, _} ->
            bias = param!(p, name, op, "bias")
            {Nx.concatenate(Enum.map(gates, &param!(bias, name, op, "b#{&1}"))), no_bias}
        end

      weights = %{w_ih: stack.(input_kernel, "wi"), w_hh: stack.(hidden_kernel, "wh"), b_ih: b_ih, b_hh: b_hh}
      {{kind, %{hidden: units}}, weights}
    end

    defp convert({op, name, node, :none}, data) when op in [:fusex_rms_norm, :fusex_layer_norm] do
      if node.opts[:gate], do: unsupported!(name, op, "a gate input")
      p = layer_params!(data, name, op)
      weight = param!(p, name, op, "weight")
      eps = node.opts[:eps]

      case {op, node.opts[:use_bias]} do
        {:fusex_rms_norm, true} -> unsupported!(name, op, "use_bias: true (the model's rms_norm has no bias)")
        {:fusex_rms_norm, _} -> {{:rms_norm, %{eps: eps}}, %{weight: weight}}
        {:fusex_layer_norm, true} -> {{:layer_norm, %{eps: eps}}, %{weight: weight, bias: param!(p, name, op, "bias")}}
        {:fusex_layer_norm, _} -> {{:layer_norm, %{eps: eps, bias: false}}, %{weight: weight}}
      end
    end

    defp convert({op, name, _node, act}, _data),
      do: unsupported!(name, op, "activation #{inspect(act)} (expected one of #{inspect(@activations)})")

    defp layer_params!(data, name, op) do
      case Map.fetch(data, name) do
        {:ok, %{} = p} -> p
        _ -> unsupported!(name, op, "no parameters for it in params")
      end
    end

    defp param!(p, name, op, key) do
      case Map.fetch(p, key) do
        {:ok, value} -> value
        :error -> unsupported!(name, op, "parameter #{inspect(key)} missing from params")
      end
    end

    defp unsupported!(name, op, what) do
      raise ArgumentError, "Fusex.Model.from_axon: layer #{inspect(name)} (#{op}): #{what}"
    end
  end
end
