defmodule Fusex.Interop do
  @moduledoc false
  # Moving tensors between Nx and fusex. Nx is optional: nothing here is
  # needed at compile time (no Nx structs or macros), and every path that
  # needs Nx checks for it at run time.
  #
  # Zero copy: an Nx tensor whose backend can hand out a local pointer on a
  # device fusex runs on (EXLA CUDA buffers; any backend module exporting
  # __fusex_pointer__/1) enters fusex as a borrowed view
  # (:fusex.from_pointer) and results leave as views the other way
  # (Nx.from_pointer over :fusex.to_pointer). Everything else goes through
  # binaries.

  @compile {:no_warn_undefined, [Nx, EXLA.Client]}

  @doc false
  def nx_available?, do: Code.ensure_loaded?(Nx)

  @doc false
  def nx_tensor?(%{__struct__: Nx.Tensor}), do: true
  def nx_tensor?(_), do: false

  @doc false
  def require_nx!(what) do
    unless nx_available?() do
      raise ArgumentError,
            "#{what}: Nx is not available; add {:nx, \"~> 0.9\"} to your deps " <>
              "or work with %Fusex.Tensor{} handles"
    end
  end

  # ---- where a tensor's memory is, for zero copy ----

  @doc false
  # {fusex_device, backend_spec_for_Nx.from_pointer} or nil.
  def pointer_target(%{__struct__: Nx.Tensor, data: data} = tensor) do
    case data do
      %{__struct__: EXLA.Backend, buffer: %{__struct__: EXLA.DeviceBuffer} = buffer} ->
        exla_target(buffer)

      %{__struct__: mod} ->
        if Code.ensure_loaded?(mod) and function_exported?(mod, :__fusex_pointer__, 1),
          do: mod.__fusex_pointer__(tensor),
          else: nil
    end
  end

  def pointer_target(_), do: nil

  defp exla_target(%{client_name: client, device_id: id}) do
    platform =
      try do
        EXLA.Client.fetch!(client).platform
      rescue
        _ -> nil
      end

    if platform == :cuda,
      do: {{:cuda, id}, {EXLA.Backend, client: client, device_id: id}},
      else: nil
  end

  # ---- Nx -> fusex ----

  @doc false
  # A %Fusex.Tensor{} on `device` (or the one the tensor points to when no
  # device is given) and how it was made: :view (borrowed memory) or :copy.
  def from_nx(tensor, name, opts) do
    {t, _how} = import_nx(tensor, name, opts[:device], opts)
    t
  end

  @doc false
  def import_nx(tensor, name, device, opts \\ []) do
    require_nx!(name)
    check_nx!(tensor, name)
    target = if opts[:copy] || opts[:ipc], do: nil, else: pointer_target(tensor)
    device = device && Fusex.Tensor.normalize_device(device)

    case target do
      {^device, _spec} -> {view(tensor, device), :view}
      {pdev, _spec} when device == nil -> {view(tensor, pdev), :view}
      _ -> {copy_in(tensor, device || Fusex.default_device(), opts[:ipc] || false), :copy}
    end
  end

  defp check_nx!(%{__struct__: Nx.Tensor, type: type, vectorized_axes: vec}, name) do
    if vec != [] do
      raise ArgumentError,
            "#{name}: expected a tensor without vectorized axes, got one vectorized over #{inspect(vec)}"
    end

    unless type in Fusex.Tensor.types() do
      raise ArgumentError,
            "#{name}: expected a tensor of type #{Enum.map_join(Fusex.Tensor.types(), ", ", &inspect/1)}, " <>
              "got #{inspect(type)}"
    end
  end

  defp check_nx!(other, name) do
    raise ArgumentError, "#{name}: expected an Nx tensor, got #{inspect(other, limit: 5)}"
  end

  defp view(%{type: type, shape: shape} = tensor, device) do
    if Nx.size(tensor) == 0 do
      # An empty buffer may have no address: nothing to share anyway.
      copy_in(tensor, device, false)
    else
      {addr, size} = local_pointer(tensor)
      pointer = {:local, addr, size}
      ref = Fusex.Erl.call(:from_pointer, [pointer, type, shape, %{device: device, sync: true}])
      Fusex.Tensor.wrap(ref)
    end
  end

  # Nx 0.9 returns {:ok, pointer}; Nx 0.10+ returns the pointer. EXLA
  # takes the kind as `mode:`.
  defp local_pointer(tensor) do
    case Nx.to_pointer(tensor, mode: :local) do
      {:ok, %{address: addr, data_size: size}} -> {addr, size}
      %{address: addr, data_size: size} -> {addr, size}
      {:error, reason} -> raise ArgumentError, "Nx.to_pointer/2 failed: #{inspect(reason)}"
    end
  end

  defp copy_in(%{type: type, shape: shape} = tensor, device, ipc) do
    bin = Nx.to_binary(tensor)
    ref = Fusex.Erl.call(:tensor, [bin, type, shape, %{device: device, ipc: ipc}])
    Fusex.Tensor.wrap(ref)
  end

  # ---- fusex -> Nx ----

  @doc false
  def to_nx_copy(%Fusex.Tensor{ref: ref, type: type, shape: shape}, backend) do
    require_nx!("to_nx")
    bin = Fusex.Erl.call(:to_binary, [ref])
    opts = if backend, do: [backend: backend], else: []
    bin |> Nx.from_binary(type, opts) |> Nx.reshape(shape)
  end

  @doc false
  # A view for the library `spec` names over fusex's memory. The Nx tensor
  # keeps the fusex handle (so the memory lives as long as the tensor), and
  # the handle was marked exported by to_pointer, so fusex synchronizes the
  # device before the memory is reused.
  def to_nx_view(%Fusex.Tensor{ref: ref, type: type, shape: shape}, spec) do
    {:local, addr, size} = Fusex.Erl.call(:to_pointer, [ref, :local, %{sync: true}])
    pointer = struct(Nx.Pointer, kind: :local, address: addr, data_size: size)

    tensor =
      case Nx.from_pointer(spec, pointer, type, shape) do
        {:ok, t} -> t
        {:error, reason} -> raise ArgumentError, "Nx.from_pointer/5 failed: #{inspect(reason)}"
        t -> t
      end

    %{tensor | data: Map.put(tensor.data, :fusex_owner, ref)}
  end
end
