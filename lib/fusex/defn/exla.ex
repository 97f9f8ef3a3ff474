# fusex's blocks as XLA custom calls under EXLA (>= 0.12, which lowers an
# Nx.block/4 whose tag implements EXLA.CustomCall to a stablehlo.custom_call
# of the returned target, and otherwise compiles the block's default
# function). Compiled only where EXLA is. The decision is
# Fusex.Defn.XLA.lowering/3's, tested without EXLA; this only wraps it.
if Code.ensure_loaded?(EXLA.CustomCall) and Code.ensure_loaded?(EXLA.CustomCall.Spec) do
  defimpl EXLA.CustomCall, for: Fusex.Defn.Block do
    def call(block, _out, args, client) do
      case Fusex.Defn.XLA.lowering(block, args, client.platform) do
        {:ok, target, attributes} ->
          {:ok, %EXLA.CustomCall.Spec{call_target_name: target, attributes: attributes}}

        :skip ->
          :skip
      end
    end
  end
end
