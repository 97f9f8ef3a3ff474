defmodule Fusex.Defn.XLA do
  @moduledoc """
  Whether a `Fusex.Defn` block runs as fusex's XLA custom-call target under
  EXLA, and the registration of those targets in EXLA's XLA.

  `lowering/3` is what fusex's `EXLA.CustomCall` implementation asks (it
  only wraps the answer into an `EXLA.CustomCall.Spec`); it needs no EXLA,
  so its decisions are tested where EXLA cannot be built. A block runs as
  its target when

    * the client's platform is `:host` (fusex's CPU handlers) or `:cuda`
      (its CUDA handlers, which need fusex's CUDA backend on this node);
    * fusex's targets are registered in the XLA that EXLA loaded
      (`:fusex.xla_register/0`, called here once per VM before the first
      compilation that needs it: if it fails, every block runs its default
      implementation and a warning says why, once);
    * the handler takes the operands' types: `{f,32}`, `{bf,16}`, `{f,16}`
      (and `{f,64}` on `:host`); on `:cuda` the selective scan's `dstate`
      is at most 256.

  Otherwise the answer is `:skip`, and EXLA compiles the block's default
  implementation (plain Nx) instead.
  """

  require Logger
  alias Fusex.Defn.Block

  @types [{:f, 32}, {:bf, 16}, {:f, 16}]
  @cuda_max_dstate 256

  @doc """
  `{:ok, target_name, attributes}` (attributes as `EXLA.CustomCall.Spec`
  takes them) where `block` runs as a fusex target on `platform`, else
  `:skip`. `args` are the block's input templates (anything with `:type`
  and `:shape`).
  """
  def lowering(%Block{} = block, args, platform) when is_list(args) do
    if platform in [:host, :cuda] and handles?(block, args, platform) and
         registered?() and platform_ready?(platform) do
      {:ok, Block.target_name(block), Block.mlir_attributes(block)}
    else
      :skip
    end
  end

  # ---- what the handlers take ----

  defp handles?(block, args, platform) do
    types = if platform == :host, do: [{:f, 64} | @types], else: @types
    main = main_operand(block, args)

    Enum.all?(args, &(&1.type in types)) and state_type?(block, args, main) and dstate_ok?(block, args, platform)
  end

  # The operand whose type is the op's input type (a step's first operand
  # is its state).
  defp main_operand(%Block{direction: :step}, [_state, main | _]), do: main
  defp main_operand(_block, [main | _]), do: main

  # The selective scan step's state is the state type of its input type.
  defp state_type?(%Block{op: :selective_scan, direction: :step}, [state | _], main),
    do: state.type == Fusex.Defn.Check.state_type(main.type)

  defp state_type?(_block, _args, _main), do: true

  defp dstate_ok?(%Block{op: :selective_scan, direction: dir}, args, :cuda) do
    a = if dir == :step, do: Enum.at(args, 3), else: Enum.at(args, 2)
    elem(a.shape, 1) <= @cuda_max_dstate
  end

  defp dstate_ok?(_block, _args, _platform), do: true

  defp platform_ready?(:host), do: true
  defp platform_ready?(:cuda), do: Enum.any?(:fusex.devices(), &(&1.kind == :cuda))

  # ---- registration ----

  @doc """
  Registers fusex's targets in the XLA that EXLA loaded, once per VM:
  `:ok`, or `{:error, reason}` (then with a warning, once).
  """
  def register do
    key = {__MODULE__, :registration}

    case :persistent_term.get(key, nil) do
      nil ->
        :global.trans({key, self()}, fn ->
          case :persistent_term.get(key, nil) do
            nil ->
              result = try_register()
              warn(result)
              :persistent_term.put(key, result)
              result

            result ->
              result
          end
        end, [node()])

      result ->
        result
    end
  end

  defp registered?, do: register() == :ok

  @doc false
  # Tests: forget the registration (nil: the next lowering registers and
  # warns again) or set its result.
  def __put_registration__(nil), do: :persistent_term.erase({__MODULE__, :registration})
  def __put_registration__(result), do: :persistent_term.put({__MODULE__, :registration}, result)

  defp try_register do
    # apply/3: fusex:xla_register/0 exists only where the XLA handlers are
    # built into this fusex.
    case apply(:fusex, :xla_register, []) do
      :ok -> :ok
      {:error, reason} -> {:error, to_string(reason)}
      other -> {:error, "fusex:xla_register/0 returned #{inspect(other)}"}
    end
  rescue
    e in UndefinedFunctionError ->
      {:error, "this build of fusex has no XLA handlers (#{Exception.message(e)})"}

    e ->
      {:error, Exception.message(e)}
  end

  defp warn(:ok), do: :ok

  defp warn({:error, reason}) do
    Logger.warning(
      "fusex: its XLA custom-call targets are not registered (#{reason}); " <>
        "Fusex.Defn blocks run their default Nx implementations under EXLA"
    )
  end
end
