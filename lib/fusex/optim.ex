defmodule Fusex.AdamW do
  @moduledoc """
  Multi-tensor AdamW, updating parameters in place: `:fusex.adamw_init/2`
  and `:fusex.adamw_step/4` (the formulas, options and defaults are in
  their docs and in docs/OPTIMIZERS.md; they are torch.optim.AdamW's).

  Parameters must be `%Fusex.Tensor{}` handles (they are updated in place);
  gradients may be handles or Nx tensors. The state is a map of handles on
  the parameters' device (moments, master copies, the step count) that
  every step updates in place.

      state = Fusex.AdamW.init(params, lr: 3.0e-4, max_grad_norm: 1.0)
      state = Fusex.AdamW.step(state, params, grads, lr: lr)
      %{step: n, grad_norm: norm, skipped: false} = Fusex.AdamW.info(state)

  A step only enqueues GPU work; `info/1` waits for it.
  """

  @doc """
  A new state for `params` (a list of handles on one device). Options
  (keywords or a map): `lr`, `beta1`, `beta2`, `eps`, `weight_decay`,
  `maximize`, `amsgrad`, `max_grad_norm` (a number or `:none`),
  `skip_nonfinite`, `master_weights` — the defaults of every step.
  """
  def init(params, opts \\ []), do: Fusex.Optim.init(:adamw_init, params, opts)

  @doc """
  One step over `params` with `grads` (one per parameter, of its shape);
  `hyper` overrides the state's options for this step. Returns `state`,
  whose tensors changed in place.
  """
  def step(state, params, grads, hyper \\ []),
    do: Fusex.Optim.step(:adamw_step, state, params, grads, hyper)

  @doc "The step count, the last global gradient norm and whether the last step was skipped (waits for the device)."
  def info(state), do: Fusex.Optim.info(state)
end

defmodule Fusex.SGD do
  @moduledoc """
  Multi-tensor SGD with momentum, dampening, Nesterov and weight decay,
  updating parameters in place: `:fusex.sgd_init/2` and `:fusex.sgd_step/4`
  (torch.optim.SGD's formulas; see docs/OPTIMIZERS.md). Used as
  `Fusex.AdamW`, with the options `lr`, `momentum`, `dampening`, `nesterov`,
  `weight_decay`, `maximize`, `max_grad_norm`, `skip_nonfinite`,
  `master_weights`.
  """

  @doc "A new state for `params` (handles); see `Fusex.AdamW.init/2`."
  def init(params, opts \\ []), do: Fusex.Optim.init(:sgd_init, params, opts)

  @doc "One step; see `Fusex.AdamW.step/4`."
  def step(state, params, grads, hyper \\ []),
    do: Fusex.Optim.step(:sgd_step, state, params, grads, hyper)

  @doc "See `Fusex.AdamW.info/1`."
  def info(state), do: Fusex.Optim.info(state)
end

defmodule Fusex.Optim do
  @moduledoc """
  fusex's fused AdamW and SGD as Polaris-style optimizers: `{init_fn,
  update_fn}` pairs for `Axon.Loop.trainer/3` (or any code written for
  `Polaris.Optimizers`), with Polaris's option names and defaults.

      loop = Axon.Loop.trainer(model, :mean_squared_error, Fusex.Optim.adamw(learning_rate: 1.0e-3))

  `init_fn.(params)` gives the state (f32 moments of the parameters'
  shapes and the step count, plain Nx: it works inside `defn`);
  `update_fn.(gradients, state, params)` gives `{updates, new_state}`,
  `updates` to add to the parameters (`Polaris.Updates.apply_updates/2`).
  The update runs fusex's multi-tensor step (`:fusex.adamw_step/4`,
  `:fusex.sgd_step/4`: one kernel over every parameter) through
  `Nx.runtime_call/4` (Nx >= 0.13), inside `defn` (Axon's train step)
  and outside, on the cpu for the tensors' bytes (the `Nx.Defn.Evaluator`
  and Nx.BinaryBackend Axon runs on by default). Parameters and
  gradients are f32.

  `adamw/1` is `Polaris.Optimizers.adamw/1` (with `eps_root` 0: Polaris
  adds its 1.0e-15 default under the square root, fusex as torch adds
  nothing); `sgd/1` is `Polaris.Optimizers.sgd/1`. Both take fusex's
  `:max_grad_norm` (clipping by the global norm of all gradients) too.
  """
  alias Fusex.Op

  @compile {:no_warn_undefined, [Nx, Nx.Defn.Composite]}

  @doc """
  AdamW. Options (Polaris's): `:learning_rate` (1.0e-3), `:b1` (0.9),
  `:b2` (0.999), `:eps` (1.0e-8), `:decay` (0.0, decoupled weight decay);
  fusex's `:max_grad_norm`.
  """
  def adamw(opts \\ []) do
    opts =
      Fusex.Opts.keyword!(opts,
        learning_rate: 1.0e-3,
        b1: 0.9,
        b2: 0.999,
        eps: 1.0e-8,
        decay: 0.0,
        max_grad_norm: :none
      )

    hyper = %{
      lr: opts[:learning_rate],
      beta1: opts[:b1],
      beta2: opts[:b2],
      eps: opts[:eps],
      weight_decay: opts[:decay],
      max_grad_norm: opts[:max_grad_norm]
    }

    pair(:adamw, hyper, [:exp_avg, :exp_avg_sq])
  end

  @doc """
  SGD with momentum. Options (Polaris's): `:learning_rate` (1.0e-2),
  `:momentum` (none), `:nesterov` (false); fusex's `:max_grad_norm`.
  """
  def sgd(opts \\ []) do
    opts =
      Fusex.Opts.keyword!(opts,
        learning_rate: 1.0e-2,
        momentum: nil,
        nesterov: false,
        max_grad_norm: :none
      )

    momentum = opts[:momentum] || 0.0

    hyper = %{
      lr: opts[:learning_rate],
      momentum: momentum,
      nesterov: opts[:nesterov],
      max_grad_norm: opts[:max_grad_norm]
    }

    pair(:sgd, hyper, if(momentum > 0, do: [:momentum_buffer], else: []))
  end

  # {init_fn, update_fn}: the state holds one f32 moment container per
  # name in `moments` (the fusex state's lists of that name) and the count.
  defp pair(kind, hyper, moments) do
    Fusex.Interop.require_nx!("Fusex.Optim.#{kind}")

    init = fn params ->
      zeros = fn t -> Nx.broadcast(Nx.tensor(0.0, type: {:f, 32}), t.shape) end

      Map.new(moments, &{&1, Nx.Defn.Composite.traverse(params, zeros)})
      |> Map.put(:count, Nx.tensor(0, type: {:s, 64}))
    end

    update = fn grads, state, params ->
      unless function_exported?(Nx, :runtime_call, 4),
        do: raise(ArgumentError, "Fusex.Optim.#{kind}: needs Nx.runtime_call/4 (Nx >= 0.13)")

      # Nx.runtime_call's results are a tensor or a flat tuple of them:
      # the updates' and the new state's tensors, in order.
      leaves = Nx.Defn.Composite.flatten_list([params, state])
      out = List.to_tuple(Enum.map(leaves, &Nx.template(&1.shape, &1.type)))
      opts = [kind: kind, hyper: hyper, moments: moments]
      flat = Nx.runtime_call(out, {grads, state, params}, opts, &__MODULE__.__step__/2)
      rebuild({params, state}, Tuple.to_list(flat))
    end

    {init, update}
  end

  @doc false
  # Nx.runtime_call's callback: one fused step on copies of the tensors;
  # the updates' tensors, then the new state's, as one tuple.
  def __step__({grads, state, params}, opts) do
    kind = opts[:kind]
    flat = &Nx.Defn.Composite.flatten_list([&1])
    old = flat.(params)
    refs = Enum.map(old, &to_fusex/1)
    grad_refs = Enum.map(flat.(grads), &to_fusex/1)

    try do
      st = Fusex.Erl.call(:"#{kind}_init", [refs, opts[:hyper]])

      for name <- opts[:moments],
          {src, dst} <- Enum.zip(flat.(state[name]), st[name]),
          do: copy_into(src, dst)

      copy_into(Nx.as_type(state.count, {:s, 64}), st.step)
      Fusex.Erl.call(:"#{kind}_step", [st, refs, grad_refs, opts[:hyper]])
      updates = Enum.zip_with(refs, old, fn ref, p -> Nx.subtract(export(ref, p), p) end)

      new_state =
        Map.new(opts[:moments], fn name ->
          {name, rebuild(state[name], Enum.map(st[name], &export(&1, nil)))}
        end)
        |> Map.put(:count, st.step |> export(nil) |> Nx.as_type(state.count.type))

      List.to_tuple(updates ++ Nx.Defn.Composite.flatten_list([new_state]))
    after
      Enum.each(refs ++ grad_refs, &:fusex.free/1)
    end
  end

  defp to_fusex(t),
    do: Fusex.Erl.call(:tensor, [Nx.to_binary(t), t.type, t.shape, %{device: :cpu}])

  defp export(ref, like) do
    t =
      ref
      |> :fusex.to_binary()
      |> Nx.from_binary(:fusex.type(ref))
      |> Nx.reshape(:fusex.shape(ref))

    if like, do: Nx.as_type(t, like.type), else: t
  end

  defp copy_into(src, dst) do
    ref = to_fusex(src)

    try do
      Fusex.Erl.call(:copy_into, [ref, dst])
    after
      :fusex.free(ref)
    end
  end

  # `container` with its tensors replaced, in order, by `tensors`.
  defp rebuild(container, tensors) do
    {out, []} =
      Nx.Defn.Composite.traverse(container, tensors, fn _t, [next | rest] -> {next, rest} end)

    out
  end

  @doc false
  def init(fun, params, opts),
    do:
      Op.run(fun, [params: params], device_of(params) ++ keywords(opts),
        erl_opts: true,
        in_place: [:params]
      )

  # The Erlang step returns the state it was given (its tensors changed in
  # place), so the result is not delivered again: that would wrap every
  # handle anew, or, with Nx gradients, copy the state off the device.
  @doc false
  def step(fun, state, params, grads, hyper) do
    opts = [resident: true] ++ device_of(params) ++ keywords(hyper)

    _ =
      Op.run(fun, [state: state, params: params, grads: grads], opts,
        erl_opts: true,
        in_place: [:params]
      )

    state
  end

  # Reads the state's own tensors where they are (no conversion, no copy).
  @doc false
  def info(state) when is_map(state),
    do: Fusex.Erl.call(:optimizer_info, [Map.new(state, fn {k, v} -> {k, unwrap(v)} end)])

  def info(other), do: Fusex.Erl.call(:optimizer_info, [other])

  defp unwrap(%Fusex.Tensor{ref: ref}), do: ref
  defp unwrap(list) when is_list(list), do: Enum.map(list, &unwrap/1)
  defp unwrap(other), do: other

  # Op.run finds the device in top-level tensor arguments only; the
  # parameters come as a list.
  defp device_of([%Fusex.Tensor{device: device} | _]), do: [device: device]
  defp device_of(_), do: []

  defp keywords(opts) when is_map(opts), do: Enum.to_list(opts)
  defp keywords(opts), do: opts
end
