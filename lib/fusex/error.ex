defmodule Fusex.CudaError do
  @moduledoc """
  A CUDA failure reported by fusex: `code` is the `cudaError_t`, `message`
  says what failed (device out-of-memory included).
  """
  defexception [:code, :message]
end

defmodule Fusex.Erl do
  @moduledoc false
  # Calls into the Erlang API and turns its error terms into Elixir
  # exceptions: {badarg, Msg} -> ArgumentError, {cuda_error, Code, Msg} ->
  # Fusex.CudaError, {out_of_memory, Msg} and {internal, Msg} -> RuntimeError.

  @doc false
  def call(module \\ :fusex, fun, args) do
    apply(module, fun, args)
  catch
    # catch, not rescue: the raw term, before Elixir normalizes
    # {badarg, Msg} into an "argument error: ..." message
    :error, reason ->
      case translate(reason) do
        nil -> :erlang.raise(:error, reason, __STACKTRACE__)
        exception -> reraise exception, __STACKTRACE__
      end
  end

  @doc false
  def translate({:badarg, msg}) when is_binary(msg), do: %ArgumentError{message: msg}
  def translate({:cuda_error, code, msg}), do: %Fusex.CudaError{code: code, message: msg}
  def translate({kind, msg}) when kind in [:out_of_memory, :internal] and is_binary(msg),
    do: %RuntimeError{message: "#{kind}: #{msg}"}
  def translate(_other), do: nil
end
