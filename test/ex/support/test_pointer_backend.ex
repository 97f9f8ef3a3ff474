defmodule Fusex.TestPointerBackend do
  @moduledoc false
  # A minimal Nx backend whose tensors live in fusex cpu memory and which
  # hands out local pointers, as EXLA's CUDA client does: it lets the
  # zero-copy path of the wrapper (Nx.to_pointer -> fusex view -> op ->
  # Nx.from_pointer) run and be checked on a machine without a GPU or EXLA.
  # Only the callbacks that path and the tests use are implemented.
  @compile {:no_warn_undefined, [Nx, Nx.Pointer]}

  defstruct [:ref]

  # The hook Fusex.Interop looks for: {fusex device, Nx.from_pointer backend}.
  def __fusex_pointer__(_tensor), do: {:cpu, __MODULE__}

  def init(opts), do: opts

  def from_binary(%{type: type, shape: shape} = out, binary, _opts) do
    %{out | data: %__MODULE__{ref: :fusex.tensor(binary, type, shape, %{device: :cpu})}}
  end

  def to_binary(%{data: %__MODULE__{ref: ref}}, _limit), do: :fusex.to_binary(ref)

  def inspect(%{data: %__MODULE__{ref: ref}}, _opts),
    do: Inspect.Algebra.string("fusex cpu #{Kernel.inspect(ref)}")

  def backend_copy(tensor, backend, opts),
    do: Nx.from_binary(to_binary(tensor, nil), tensor.type, backend: {backend, opts}) |> Nx.reshape(tensor.shape)

  def backend_transfer(tensor, backend, opts), do: backend_copy(tensor, backend, opts)

  def backend_deallocate(%{data: %__MODULE__{ref: ref}}), do: :fusex.free(ref)

  def to_pointer(%{data: %__MODULE__{ref: ref}}, opts) do
    :local = Keyword.get(opts, :mode, :local)
    {:local, addr, size} = :fusex.to_pointer(ref, :local)
    {:ok, struct(Nx.Pointer, kind: :local, address: addr, data_size: size)}
  end

  def from_pointer(%{kind: :local, address: addr, data_size: size}, type, shape, _backend_opts, opts) do
    ref = :fusex.from_pointer({:local, addr, size}, type, shape, %{device: :cpu})
    names = Keyword.get(opts, :names, List.duplicate(nil, tuple_size(shape)))
    {:ok, %{Nx.template(shape, type, names: names) | data: %__MODULE__{ref: ref}}}
  end
end
