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
    * the handler takes the operands: the op layer's check
      (`:fusex.op_check/4`) accepts them on the device the handler runs on
      (`:cpu` for `:host`; for `:cuda` this node's first CUDA device, whose
      limits are the CUDA handlers': types, the selective scan's `dstate`).

  Otherwise the answer is `:skip`, and EXLA compiles the block's default
  implementation (plain Nx) instead.
  """

  require Logger
  alias Fusex.Defn.{Block, Desc}

  @doc """
  `{:ok, target_name, attributes}` (attributes as `EXLA.CustomCall.Spec`
  takes them) where `block` runs as a fusex target on `platform`, else
  `:skip`. `args` are the block's input templates (anything with `:type`
  and `:shape`).
  """
  def lowering(%Block{} = block, args, platform) when is_list(args) do
    device = device(platform)

    if device != nil and handles?(block, args, device) and registered?() do
      {:ok, Block.target_name(block), Block.mlir_attributes(block)}
    else
      :skip
    end
  end

  # ---- what the handlers take: the op layer's check on their device ----

  defp handles?(block, args, device) do
    case Desc.find(block.op, block.direction) do
      nil ->
        false

      # an op that is no XLA target (the linear layers)
      desc when not is_map_key(desc, :target) ->
        false

      desc ->
        desc = Desc.for_attrs(desc, block.attrs)
        names = Desc.operand_names(desc, block.attrs, length(args))
        specs = Map.new(Enum.zip(names, args), fn {name, t} -> {name, {t.type, t.shape}} end)
        length(names) == length(args) and match?({:ok, _}, Desc.check(desc, specs, block.attrs, device))
    end
  end

  defp device(:host), do: :cpu

  defp device(:cuda) do
    Enum.find_value(:fusex.devices(), fn
      %{kind: :cuda, id: id} -> id
      _ -> nil
    end)
  end

  defp device(_other), do: nil

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
