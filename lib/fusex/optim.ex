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
  @moduledoc false
  alias Fusex.Op

  def init(fun, params, opts),
    do:
      Op.run(fun, [params: params], device_of(params) ++ keywords(opts),
        erl_opts: true,
        in_place: [:params]
      )

  # The Erlang step returns the state it was given (its tensors changed in
  # place), so the result is not delivered again: that would wrap every
  # handle anew, or, with Nx gradients, copy the state off the device.
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
