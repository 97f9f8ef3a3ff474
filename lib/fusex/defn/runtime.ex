if Code.ensure_loaded?(Nx) and Code.ensure_loaded?(Nx.Defn) and function_exported?(Nx, :block, 4) do
  defmodule Fusex.Defn.Runtime do
    @moduledoc """
    Where a `Fusex.Defn` block runs when it is not an XLA custom call:
    fusex's NIF, through `Nx.runtime_call/4`, or the block's pure-Nx code.

    A block's default implementation (what every compiler but EXLA with
    fusex's targets runs) is, for a forward and a backward:

      * on tensors (the `Nx.Defn.Evaluator`, which calls a block's default
        implementation on its operands, and eager calls outside `defn`):
        the op through the NIF (`:fusex.op_run/3`: the description's
        stateless call, as an XLA program makes it), on the operands'
        device: the CUDA device an EXLA tensor lives on where fusex runs
        there, else `:cpu`; results back on the operands' backend;
      * inside a trace (a compiler that compiles the default
        implementation: any but EXLA): an `Nx.runtime_call/4` of that call;
      * under EXLA's compiler (whose custom call failed: EXLA then compiles
        the default implementation into its program), or where the NIF
        cannot run (Nx without `Nx.runtime_call/4`, the implementation set
        to `:nx`): the pure-Nx code.

    A step runs the NIF on tensors, and its pure-Nx code inside a trace:
    a step is differentiated through its default implementation, and a
    runtime call has no derivative.

    The implementation is `:auto` (the above) or `:nx` (always the pure-Nx
    code): `config :fusex, defn_implementation: :nx`, or for the calling
    process `Fusex.Defn.with_implementation/2`.

    Every NIF run emits the telemetry event `[:fusex, :defn, :run]` with
    measurements `%{count: 1}` and metadata `%{op: op, direction:
    direction, device: device}`.
    """

    alias Fusex.Defn.{Block, Desc}

    @compile {:no_warn_undefined, [:telemetry]}
    @key {__MODULE__, :implementation}
    @event [:fusex, :defn, :run]

    @doc "The telemetry event of every NIF run of a block."
    def event, do: @event

    @doc false
    # The calling process's implementation, else the application's.
    def implementation do
      case Process.get(@key) do
        nil -> Application.get_env(:fusex, :defn_implementation, :auto)
        impl -> impl
      end
    end

    @doc false
    # Sets the calling process's implementation (nil: the application's);
    # the previous one.
    def put_implementation(impl) when impl in [nil, :auto, :nx],
      do: if(impl, do: Process.put(@key, impl), else: Process.delete(@key))

    @doc false
    def with_implementation(impl, fun) when impl in [:auto, :nx] and is_function(fun, 0) do
      previous = Process.put(@key, impl)

      try do
        fun.()
      after
        if previous, do: Process.put(@key, previous), else: Process.delete(@key)
      end
    end

    def with_implementation(impl, _fun),
      do: raise(ArgumentError, "implementation: expected :auto or :nx, got #{inspect(impl)}")

    @doc false
    # The default implementation of `block` on its operands `args`, whose
    # results are the templates `output` (a template or a tuple of them);
    # `pure` the pure-Nx code (a function of the operands).
    def default(%Block{} = block, args, output, pure) do
      traced = Enum.any?(args, &match?(%{data: %Nx.Defn.Expr{}}, &1))

      if nif?(block, traced),
        do: Nx.runtime_call(output, List.to_tuple(args), [block: block], &run/2),
        else: pure.(args)
    end

    defp nif?(block, traced) do
      implementation() == :auto and function_exported?(Nx, :runtime_call, 4) and nif_loaded?() and
        not (traced and (block.direction == :step or exla_compiling?())) and by_name?(block)
    end

    # The NIF's op_run takes an op's operands by name: a description with a
    # repeated group (a stacked RNN's layers, one name per slot) or with
    # several states is not run through it yet and keeps the pure-Nx code.
    defp by_name?(block) do
      desc = Desc.fetch!(block.op, block.direction)
      Desc.repeat_attr(desc) == nil and Enum.count(desc.inputs, &(&1.role == :state)) <= 1
    end

    defp nif_loaded? do
      :persistent_term.get({__MODULE__, :nif}, nil) ||
        (
          loaded = match?({:ok, _}, safe_devices())
          :persistent_term.put({__MODULE__, :nif}, loaded)
          loaded
        )
    end

    defp safe_devices do
      {:ok, :fusex.devices()}
    rescue
      _ -> :error
    end

    defp exla_compiling? do
      case Nx.Defn.Compiler.current() do
        nil -> false
        compiler -> String.starts_with?(Atom.to_string(compiler), "Elixir.EXLA")
      end
    end

    @doc false
    # Nx.runtime_call's callback: the block's op through the NIF on the
    # operands (a tuple, in the block's order), its results in the block's
    # order (one tensor, or a tuple).
    def run(operands, opts) do
      block = Keyword.fetch!(opts, :block)
      desc = Desc.fetch!(block.op, block.direction)
      args = Tuple.to_list(operands)
      names = Desc.operand_names(desc, block.attrs, length(args))
      device = device(desc, names, args, block.attrs)
      backend = backend(args)
      held = Enum.zip_with(names, args, fn name, t -> {name, import!(desc, name, t, device)} end)

      try do
        results =
          Fusex.Erl.call(:op_run, [
            desc.name,
            Map.new(held, fn {k, t} -> {k, t.ref} end),
            Map.new(block.attrs)
          ])

        emit(block, device)
        outs = for r <- desc.results, ref = results[r.name], ref != nil, do: export(ref, backend)

        case outs do
          [one] -> one
          many -> List.to_tuple(many)
        end
      after
        Enum.each(held, fn {_k, t} -> Fusex.Tensor.free(t) end)
      end
    end

    # The operands' device: the CUDA device an EXLA tensor lives on where
    # the op layer takes the call there, else the cpu.
    defp device(desc, names, args, attrs) do
      cuda =
        Enum.find_value(args, fn t ->
          case Fusex.Interop.pointer_target(t) do
            {{:cuda, _} = d, _spec} -> d
            _ -> nil
          end
        end)

      specs = Map.new(Enum.zip(names, args), fn {k, t} -> {k, {t.type, t.shape}} end)
      if cuda && match?({:ok, _}, Desc.check(desc, specs, attrs, cuda)), do: cuda, else: :cpu
    end

    defp backend([%{data: %{__struct__: backend}} | _]), do: backend

    # A step's state is updated in place: always a copy, never a view of
    # the caller's memory.
    defp import!(desc, name, tensor, device) do
      copy = Enum.any?(desc.inputs, &(&1.name == name and &1.role == :state))
      Fusex.Interop.from_nx(tensor, Atom.to_string(name), device: device, copy: copy)
    end

    defp export(ref, backend) do
      t = Fusex.Tensor.wrap(ref)

      try do
        Fusex.Interop.to_nx_copy(t, backend)
      after
        Fusex.Tensor.free(t)
      end
    end

    defp emit(block, device) do
      if Code.ensure_loaded?(:telemetry),
        do:
          :telemetry.execute(@event, %{count: 1}, %{
            op: block.op,
            direction: block.direction,
            device: device
          })
    end
  end
end
