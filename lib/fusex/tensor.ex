defmodule Fusex.Tensor do
  @moduledoc """
  A tensor resident on a fusex device: a handle to device memory that stays
  there between calls (`resident: true` results, and inputs that are already
  on the device).

  The struct caches the type, shape and device so that inspecting a handle
  never touches the device; `Inspect` shows them and never the data:

      #Fusex.Tensor<f32[2][3] cuda:0>

  Memory goes back to the device when the handle is garbage-collected or
  `free/1` is called.
  """

  @enforce_keys [:ref, :type, :shape, :device]
  defstruct [:ref, :type, :shape, :device]

  @type t :: %__MODULE__{
          ref: reference(),
          type: {atom(), pos_integer()},
          shape: tuple(),
          device: :cpu | {:cuda, non_neg_integer()}
        }

  @types [{:f, 32}, {:f, 64}, {:bf, 16}, {:f, 16}, {:s, 32}, {:s, 64}, {:u, 8}]

  @doc "The element types fusex stores, spelled as Nx spells them."
  def types, do: @types

  @doc false
  def wrap(ref) when is_reference(ref) do
    %__MODULE__{
      ref: ref,
      type: :fusex.type(ref),
      shape: :fusex.shape(ref),
      device: normalize_device(:fusex.device(ref))
    }
  end

  @doc false
  def normalize_device(:cuda), do: {:cuda, 0}
  def normalize_device(device), do: device

  @doc """
  A tensor holding `binary` (row-major, native-endian) of `type` and
  `shape`. Options: `:device` (default `Fusex.default_device/0`), `:ipc`
  (allocate memory that `to_pointer/3` can export as a CUDA IPC handle).
  """
  def from_binary(binary, type, shape, opts \\ []) do
    opts = Fusex.Opts.keyword!(opts, [:device, :ipc])
    wrap(Fusex.Erl.call(:tensor, [binary, type, shape, erl_alloc_opts(opts)]))
  end

  @doc "A zero-filled tensor; options as in `from_binary/4`."
  def zeros(type, shape, opts \\ []) do
    opts = Fusex.Opts.keyword!(opts, [:device, :ipc])
    wrap(Fusex.Erl.call(:zeros, [type, shape, erl_alloc_opts(opts)]))
  end

  defp erl_alloc_opts(opts) do
    opts |> Keyword.take([:device, :ipc]) |> Map.new()
  end

  @doc "The tensor's bytes (waits for pending device work)."
  def to_binary(%__MODULE__{ref: ref}), do: Fusex.Erl.call(:to_binary, [ref])

  @doc """
  An Nx tensor to a resident tensor on `:device` (default: the device the
  tensor already lives on when it is an EXLA CUDA tensor, else
  `Fusex.default_device/0`). An EXLA tensor on the same CUDA device is
  wrapped without a copy (a borrowed view, see `Fusex` "Zero copy"); any
  other tensor is copied through a binary. Options: `:device`, `:ipc`,
  `:copy` (`true` forces a copy even where a view is possible).
  """
  def from_nx(tensor, opts \\ []) do
    opts = Fusex.Opts.keyword!(opts, [:device, :ipc, :copy])
    Fusex.Opts.value!(opts, :copy, "true or false", &(&1 in [nil, true, false]))
    Fusex.Opts.value!(opts, :ipc, "true or false", &(&1 in [nil, true, false]))
    Fusex.Interop.from_nx(tensor, "tensor", opts)
  end

  @doc """
  The resident tensor as an Nx tensor, copied through a binary to
  `:backend` (default `Nx.default_backend/0`). Requires Nx.
  """
  def to_nx(%__MODULE__{} = t, opts \\ []) do
    opts = Fusex.Opts.keyword!(opts, [:backend])
    Fusex.Op.backend!(opts[:backend])
    Fusex.Interop.to_nx_copy(t, opts[:backend])
  end

  @doc "A copy on `device`; `ipc: true` makes it exportable by IPC."
  def copy(%__MODULE__{ref: ref}, device, opts \\ []) do
    opts = Fusex.Opts.keyword!(opts, [:ipc])
    wrap(Fusex.Erl.call(:copy, [ref, device, Map.new(opts)]))
  end

  @doc "Releases the device memory now (idempotent)."
  def free(%__MODULE__{ref: ref}), do: :fusex.free(ref)

  @doc "Whether the handle still holds memory (false once freed)."
  def live?(%__MODULE__{ref: ref}), do: :fusex_nif.is_live(ref)

  @doc """
  The tensor's memory for another library or process:
  `{:local, address, byte_size}` or `{:ipc, handle, byte_size}`; see
  `:fusex.to_pointer/3`. Option `:sync` (default `true`).
  """
  def to_pointer(%__MODULE__{ref: ref}, kind, opts \\ []) do
    opts = Fusex.Opts.keyword!(opts, sync: true)
    Fusex.Erl.call(:to_pointer, [ref, kind, Map.new(opts)])
  end

  @doc """
  A borrowed view of memory another library owns; see
  `:fusex.from_pointer/4`. Options: `:device`, `:sync` (default `true`),
  `:offset` (IPC only).
  """
  def from_pointer(pointer, type, shape, opts \\ []) do
    opts = Fusex.Opts.keyword!(opts, [:device, :sync, :offset])
    wrap(Fusex.Erl.call(:from_pointer, [pointer, type, shape, Map.new(opts)]))
  end

  @doc "Writes `src`'s elements into `dst` in place (same device, type, shape)."
  def copy_into(%__MODULE__{ref: src}, %__MODULE__{ref: dst}),
    do: Fusex.Erl.call(:copy_into, [src, dst])

  @doc "The Nx-style type name: `f32`, `bf16`, ..."
  def type_name({kind, bits}), do: "#{kind}#{bits}"

  defimpl Inspect do
    def inspect(%Fusex.Tensor{ref: ref, type: type, shape: shape, device: device}, _opts) do
      dims = shape |> Tuple.to_list() |> Enum.map_join(&"[#{&1}]")
      freed = if :fusex_nif.is_live(ref), do: "", else: " (freed)"
      "#Fusex.Tensor<#{Fusex.Tensor.type_name(type)}#{dims} #{device_label(device)}#{freed}>"
    end

    defp device_label(:cpu), do: "cpu"
    defp device_label({:cuda, n}), do: "cuda:#{n}"
  end
end
