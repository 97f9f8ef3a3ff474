if Code.ensure_loaded?(Nx) and Code.ensure_loaded?(Nx.Defn) and function_exported?(Nx, :block, 4) do
  defmodule Fusex.Defn.Call do
    @moduledoc false
    # The one path every Fusex.Defn function takes, over the op layer's
    # description of its op (Fusex.Defn.Desc):
    #
    #   * its tensors and options parsed by the description: the optional
    #     tensors are its inputs of role option, the options its option
    #     attributes (a flag true or false, or one of its choices; an enum
    #     one of its atoms, its index in the block; a number, which may
    #     instead be given as the tensor of that name);
    #   * the op layer's check on the cpu device (fusex:op_check/4) on the
    #     tensors' templates: the results' types and shapes, or the message
    #     a run of the op would raise, raised at trace time;
    #   * one Nx.block whose tag (Fusex.Defn.Block) is the target's name and
    #     attributes, its operands and results the description's, present,
    #     in its order; the default implementation the family's pure-Nx
    #     module's forward/2, backward/2 or step/2;
    #   * inside a trace, a forward's gradient: custom_grad/3 whose gradient
    #     is the backward block, fed by role (the forward's inputs, its kept
    #     results, the cotangents "d" + a result) and giving "d" + each
    #     input. The backward refuses to be differentiated in turn: second
    #     derivatives raise. A step is differentiated through its default
    #     implementation.

    alias Fusex.Defn.{Block, Check, Desc}

    @doc false
    # Op `op`'s forward on the positional tensors `args` ([name: tensor],
    # the description's order) with the optional tensors and options given:
    # its output, or a tuple of its outputs.
    def forward(op, impl, args, tensors, opts) do
      {desc, args} = group!(Desc.fetch!(op, :fwd), args)
      given = parse!(desc, args, tensors, opts)
      traced = traced?(Map.values(given.tensors))
      tensors = as_operands(given.tensors, traced)
      attrs = attrs(desc, given.values, tensors, traced)
      results = Desc.check!(desc, specs(tensors), attrs)
      block = %Block{op: op, direction: :fwd, attrs: attrs}
      inputs = operands(desc, tensors)
      out = block(block, inputs, templates(desc, results), impl)
      names = present(desc.results, results)
      outs = List.wrap(out_list(out))

      out =
        if traced do
          Nx.Defn.Kernel.custom_grad(out, inputs, fn grads ->
            backward(desc, impl, tensors, attrs, results, Map.new(Enum.zip(names, outs)), grad_list(grads, outs))
          end)
        else
          out
        end

      public(desc, names, out)
    end

    @doc false
    # Op `op`'s step: {output, new_state}.
    def step(op, impl, args, tensors, opts) do
      {desc, args} = group!(Desc.fetch!(op, :step), args)
      given = parse!(desc, args, tensors, opts)
      tensors = as_operands(given.tensors, traced?(Map.values(given.tensors)))
      attrs = attrs(desc, given.values, tensors, false)
      results = Desc.check!(desc, specs(tensors), attrs)
      block = %Block{op: op, direction: :step, attrs: attrs}
      out = block(block, operands(desc, tensors), templates(desc, results), impl)
      public(desc, present(desc.results, results), out)
    end

    # ---- the arguments, by the description ----

    # A repeated group (an RNN's layers): its argument (a list or tuple of
    # maps, or tuples in the group's order) written out by slot, and the
    # description expanded to them (Desc.expand/2).
    defp group!(desc, args) do
      case Desc.repeat_attr(desc) do
        nil ->
          {Desc.expand(desc, 1), args}

        attr ->
          entries = Desc.group(desc)
          keys = "{" <> Enum.map_join(entries, ", ", &Atom.to_string/1) <> "}"
          layers = Keyword.get(args, attr.name)
          layers = if is_tuple(layers), do: Tuple.to_list(layers), else: layers

          unless is_list(layers) and layers != [],
            do: Check.fail(Atom.to_string(attr.name), "a non-empty list or tuple of maps %#{keys}", "#{inspect_term(layers)}")

          slots =
            for {layer, r} <- Enum.with_index(layers), {entry, k} <- Enum.with_index(entries) do
              {:"#{attr.name}[#{r}].#{entry}", layer_entry!(layer, entry, {k, length(entries)}, "#{attr.name}[#{r}]", keys)}
            end

          {Desc.expand(desc, length(layers)), Keyword.delete(args, attr.name) ++ slots}
      end
    end

    defp layer_entry!(%{} = layer, entry, _k, name, keys) when not is_struct(layer) do
      case Map.fetch(layer, entry) do
        {:ok, t} -> t
        :error -> Check.fail("#{name}.#{entry}", "a tensor", "none (the map has no key #{entry}; keys: %#{keys})")
      end
    end

    defp layer_entry!(layer, _entry, {k, n}, _name, _keys) when is_tuple(layer) and tuple_size(layer) == n,
      do: elem(layer, k)

    defp layer_entry!(other, _entry, _k, name, keys),
      do: Check.fail(name, "a map %#{keys} or a tuple of those four", inspect_term(other))

    defp inspect_term(%{__struct__: Nx.Tensor}), do: "a tensor"
    defp inspect_term(other), do: inspect(other, limit: 5)

    # %{tensors: name => tensor, values: option attribute => number}.
    defp parse!(desc, args, tensors, opts) do
      positional = for i <- desc.inputs, i.role in [:arg, :state], do: i.name

      if Keyword.keys(args) != positional,
        do: raise(ArgumentError, "#{desc.name}: takes the tensors #{inspect(positional)}, got #{inspect(Keyword.keys(args))}")

      {tensors, opts} = one_list(desc, tensors, opts)
      opts = Check.opts_map!(opts)
      tensors = Check.tensors_map!(tensors)
      options = options(desc)
      Check.known_keys!(opts, Enum.map(options, &elem(&1, 0)), "opts")
      Check.known_keys!(tensors, for(i <- desc.inputs, i.role == :option, do: i.name), "tensors")
      tensors = Map.reject(tensors, fn {_k, v} -> is_nil(v) end)
      given = Map.new(args ++ Map.to_list(tensors), fn {k, t} -> {k, Check.tensor!(t, Atom.to_string(k))} end)
      values = Map.new(options, fn {key, attr} -> {attr.name, value!(desc, key, attr, opts, given)} end)
      %{tensors: given, values: values}
    end

    # The eager API's convention, one keyword list for the optional
    # tensors and the options (`mingru(z, c, h0: h, return_state: true)`):
    # its keys naming an optional tensor with a tensor (or nil) value are
    # the tensors, the others the options.
    defp one_list(desc, tensors, []) when is_list(tensors) and tensors != [] do
      if Keyword.keyword?(tensors) do
        names = for i <- desc.inputs, i.role == :option, do: i.name
        {given, opts} = Enum.split_with(tensors, fn {k, v} -> k in names and (is_nil(v) or tensor?(v)) end)
        {Map.new(given), opts}
      else
        {tensors, []}
      end
    end

    defp one_list(_desc, tensors, opts), do: {tensors, opts}

    defp tensor?(%Nx.Tensor{}), do: true
    defp tensor?(_), do: false

    # The options: {public name, attribute} for each option attribute the
    # public functions take, in the description's order.
    defp options(desc) do
      for a <- desc.attrs, a.role == :option, key = Map.get(a, :option, a.name), key in desc.options, do: {key, a}
    end

    defp value!(_desc, key, %{kind: :flag} = a, opts, _given) do
      case Map.get(a, :choices) do
        nil -> Block.flag(Check.bool!(opts, key, a.default == 1))
        choices -> Check.choice!(opts, key, choices, Enum.at(choices, trunc(a.default)))
      end
    end

    defp value!(_desc, key, %{kind: :enum} = a, opts, _given),
      do: Check.enum!(opts, key, a.choices, Enum.at(a.choices, trunc(a.default)))

    defp value!(desc, key, %{kind: :number} = a, opts, given) do
      tensor = Enum.find(desc.inputs, &(&1.name == key))

      case {tensor && Map.has_key?(given, key), Map.fetch(opts, key)} do
        {true, {:ok, _}} ->
          Check.fail(Atom.to_string(key), "a number (opts) or a tensor (tensors), not both", "both")

        {_, {:ok, value}} ->
          number = if a.positive, do: "a positive number", else: "a number"
          expected = if tensor, do: "#{number} or a tensor (#{tensor.layout})", else: number
          Check.number!(value, key, expected, a.positive)

        {_, :error} ->
          a.default * 1.0
      end
    end

    # Every attribute in the description's order: the options' values,
    # presence flags from the tensors given, `save` for a traced forward.
    defp attrs(desc, values, tensors, save) do
      flags = for i <- desc.inputs, i.presence == :flag, into: %{}, do: {i.flag, Map.has_key?(tensors, i.name)}

      for a <- desc.attrs do
        value =
          case a.role do
            :option -> Map.get(values, a.name, a.default)
            :presence -> Block.flag(Map.get(flags, a.name, false))
            :save -> Block.flag(save)
            :repeat -> desc.repeats
          end

        {a.name, if(a.kind == :number, do: value * 1.0, else: trunc(value))}
      end
    end

    defp specs(tensors), do: Map.new(tensors, fn {k, t} -> {k, {t.type, t.shape}} end)

    # The tensors given, in the description's order.
    defp operands(desc, tensors), do: for(i <- desc.inputs, Map.has_key?(tensors, i.name), do: tensors[i.name])

    defp present(items, results), do: for(r <- items, Map.has_key?(results, r.name), do: r.name)

    defp templates(desc, results) do
      for name <- present(desc.results, results) do
        {type, shape} = results[name]
        Nx.template(shape, type)
      end
    end

    # What the public function returns: its outputs (and a step's new
    # state) in order, one alone or a tuple.
    defp public(desc, names, out) do
      roles = Map.new(desc.results, &{&1.name, &1.role})
      outs = List.wrap(out_list(out))
      shown = for {name, t} <- Enum.zip(names, outs), roles[name] in [:output, :state], do: t

      case shown do
        [one] -> one
        many -> List.to_tuple(many)
      end
    end

    # ---- the backward ----

    # The gradients of the forward's `inputs` (a list in its order): the
    # backward block given the forward's tensors, its results `outs` (by
    # name) and the cotangents `grads` of its results (in order).
    defp backward(fwd, impl, tensors, fwd_attrs, results, outs, grads) do
      bwd = fwd.backward |> Desc.find() |> Desc.expand(fwd.repeats)
      cotangents = Map.new(Enum.zip(present(fwd.results, results), grads))

      given =
        for i <- bwd.inputs, t = bwd_input(i, tensors, outs, cotangents, results), t != nil, into: %{},
          do: {i.name, t}

      values = for a <- bwd.attrs, a.role == :option, into: %{}, do: {a.name, Keyword.get(fwd_attrs, a.name, a.default)}
      attrs = attrs(bwd, values, given, false)
      bwd_results = Desc.check!(bwd, specs(given), attrs)
      block = %Block{op: fwd.op, direction: :bwd, attrs: attrs}
      inputs = operands(bwd, given)
      out = block |> block(inputs, templates(bwd, bwd_results), impl) |> first_order_only(inputs, fwd.op)
      by_name = Map.new(Enum.zip(present(bwd.results, bwd_results), List.wrap(out_list(out))))
      for i <- fwd.inputs, Map.has_key?(tensors, i.name), do: Map.fetch!(by_name, :"d#{i.name}")
    end

    defp bwd_input(%{role: :forward, name: name}, tensors, _outs, _cotangents, _results), do: tensors[name]
    defp bwd_input(%{role: :saved, name: name}, _tensors, outs, _cotangents, _results), do: outs[name]

    defp bwd_input(%{role: :cotangent} = i, _tensors, _outs, cotangents, results) do
      "d" <> of = Atom.to_string(i.name)
      of = String.to_existing_atom(of)
      grad = cotangents[of]
      # An optional cotangent known to be zero (an output the loss does not
      # use) is left out.
      grad = if i.presence == :flag, do: nonzero(grad), else: grad

      case {grad, results[of]} do
        {nil, _} -> nil
        {_, nil} -> nil
        {grad, {type, shape}} -> grad |> Nx.broadcast(shape) |> Nx.as_type(type)
      end
    end

    # The backward's gradients refuse to be differentiated again: Nx would
    # differentiate the default implementation's loops, and a wrong second
    # derivative is worse than none.
    defp first_order_only(out, inputs, op) do
      Nx.Defn.Kernel.custom_grad(out, inputs, fn _grads ->
        raise ArgumentError, "#{op}: second derivatives are not supported (Nx.Defn.grad of a gradient of #{op})"
      end)
    end

    # ---- blocks ----

    # Inside defn (or grad) the arguments are expressions: the block gets a
    # custom gradient. Outside, the block runs on the tensors' backend.
    defp traced?(tensors), do: Enum.any?(tensors, &match?(%{data: %Nx.Defn.Expr{}}, &1))

    # Inside a trace every operand is made an expression, so that a tensor
    # captured from outside (a constant) is one too: Nx.block and
    # custom_grad take expressions only.
    defp as_operands(tensors, true), do: Map.new(tensors, fn {k, t} -> {k, Nx.Defn.Expr.tensor(t)} end)
    defp as_operands(tensors, false), do: tensors

    # An Nx.block of `block` whose default implementation is fusex's NIF
    # or the pure-Nx module's forward/2, backward/2 or step/2 on the block
    # and its operands (Fusex.Defn.Runtime decides).
    defp block(block, inputs, templates, impl) do
      inputs = if traced?(inputs), do: Enum.map(inputs, &Nx.Defn.Expr.tensor/1), else: inputs
      output = if match?([_], templates), do: hd(templates), else: List.to_tuple(templates)
      fun = %{fwd: :forward, bwd: :backward, step: :step}[block.direction]

      default = fn b, args ->
        Fusex.Defn.Runtime.default(b, args, output, fn args -> apply(impl, fun, [b, args]) end)
      end

      Nx.block(block, inputs, output, default_fun(length(inputs), default))
    end

    # Nx.block's default implementation takes the operands as arguments.
    for arity <- 1..64 do
      args = Macro.generate_arguments(arity, __MODULE__)

      defp default_fun(unquote(arity), impl),
        do: fn block, unquote_splicing(args) -> impl.(block, unquote(args)) end
    end

    defp out_list(out) when is_tuple(out), do: Tuple.to_list(out)
    defp out_list(out), do: out

    defp grad_list(grads, outputs) when is_tuple(grads), do: Tuple.to_list(grads) |> check_count(outputs)
    defp grad_list(grad, outputs), do: check_count([grad], outputs)

    defp check_count(list, outputs) when length(list) == length(outputs), do: list

    defp nonzero(%{data: %Nx.Defn.Expr{op: :constant, args: [zero]}}) when zero == 0, do: nil
    defp nonzero(grad), do: grad
  end
end
