defmodule Fusex.Op do
  @moduledoc """
  The one path every `Fusex` function takes: resolve the device, bring each
  tensor argument onto it (a `%Fusex.Tensor{}` as is, an Nx tensor as a
  zero-copy view where possible, else through a binary), call the Erlang
  API, and hand the results back in the form the caller asked for.

  A wrapper for an Erlang op is one call, e.g. for `fusex:add(A, B)`:

      def add(a, b, opts \\\\ []), do: Fusex.Op.run(:add, [a: a, b: b], opts)

  and for an op with options of its own (passed as the Erlang options
  map), `erl_opts: true`.

  * `args` is a keyword list of the positional arguments, named as in the
    Erlang docs (the names appear in error messages). Tensor-like values
    (Nx tensors, `%Fusex.Tensor{}`) are converted; anything else (numbers,
    saved contexts, maps of tensors) is passed as is, maps and tuples with
    their tensors converted.
  * `opts` holds the wrapper's options (`:resident`, `:device`,
    `:backend`) and, with `erl_opts: true`, the op's own options, passed as
    the Erlang options map (the last argument) with tensor values converted.
  * `in_place: [:state]` names arguments the op updates in place: they must
    be `%Fusex.Tensor{}` handles on the op's device (a converted Nx tensor
    would lose the update), but for a step's `state`: given as an Nx
    tensor, the step works on a copy and returns `{y, new_state}`.

  Results: tensors in the Erlang result (alone, or in a tuple, list or map)
  become `%Fusex.Tensor{}` with `resident: true` or when every tensor
  argument was a `%Fusex.Tensor{}`; otherwise Nx tensors (views back to the
  library of the inputs where they were views, else on `:backend`, default
  the backend of the first Nx argument). Opaque terms (saved contexts) pass
  through untouched.
  """

  @wrapper_opts [:resident, :device, :backend]

  @doc false
  def run(fun, args, opts, spec \\ []) when is_list(args) do
    case functional_state(args, spec) do
      nil -> run_op(fun, args, opts, spec)
      {name, nx} -> run_functional(fun, args, opts, spec, name, nx)
    end
  end

  # A step (its in-place argument `state`, the descriptions' name) given
  # its state as an Nx tensor, not a handle to update in place, is
  # functional, as Fusex.Defn's steps: {y, new_state}, the caller's state
  # untouched.
  defp functional_state(args, spec) do
    value = Keyword.get(args, :state)
    if :state in Keyword.get(spec, :in_place, []) and Fusex.Interop.nx_tensor?(value), do: {:state, value}
  end

  defp run_functional(fun, args, opts, spec, name, nx) do
    device = if is_list(opts), do: Keyword.get(opts, :device), else: nil
    handle = Fusex.Interop.from_nx(nx, Atom.to_string(name), device: device, copy: true)
    y = run_op(fun, Keyword.put(args, name, handle), opts, spec)

    if is_list(opts) and Keyword.get(opts, :resident, false) do
      {y, handle}
    else
      backend = (is_list(opts) && Keyword.get(opts, :backend)) || nx.data.__struct__

      try do
        {y, Fusex.Interop.to_nx_copy(handle, backend)}
      after
        Fusex.Tensor.free(handle)
      end
    end
  end

  defp run_op(fun, args, opts, spec) do
    unless is_list(opts) and Keyword.keyword?(opts) do
      raise ArgumentError, "opts: expected a keyword list, got #{inspect(opts)}"
    end

    {wrapper, op_opts} = Keyword.split(opts, @wrapper_opts)

    if op_opts != [] and not Keyword.get(spec, :erl_opts, false) do
      raise ArgumentError,
            "opts: expected only the options #{inspect(@wrapper_opts)}, got #{inspect(Keyword.keys(op_opts))}"
    end

    check_wrapper!(wrapper)
    in_place = Keyword.get(spec, :in_place, [])
    device = resolve_device(wrapper[:device], args, op_opts)
    state = %{device: device, in_place: in_place, temps: [], origin: nil, all_resident: true, views: false}
    {erl_args, state} = convert_args(args, state)
    {erl_opts, state} = convert_value(Map.new(op_opts), "opts", state)
    erl_args = if Keyword.get(spec, :erl_opts, false), do: erl_args ++ [erl_opts], else: erl_args

    try do
      result = Fusex.Erl.call(fun, erl_args)
      deliver(result, output_mode(wrapper, state))
    after
      # A view of another library's memory must not be read by queued
      # fusex work after we return: that library may free it at any time.
      if state.views, do: :fusex.synchronize(device)
      Enum.each(state.temps, &:fusex.free/1)
    end
  end

  defp check_wrapper!(wrapper) do
    case Keyword.get(wrapper, :resident, false) do
      r when is_boolean(r) -> :ok
      other -> raise ArgumentError, "resident: expected true or false, got #{inspect(other)}"
    end

    backend!(wrapper[:backend])
  end

  @doc false
  # An Nx backend: a module implementing Nx.Backend, or {module, options}.
  def backend!(nil), do: :ok

  def backend!(backend) do
    module =
      case backend do
        {module, opts} when is_atom(module) and is_list(opts) -> module
        module when is_atom(module) -> module
        _ -> nil
      end

    unless module && Code.ensure_loaded?(module) && function_exported?(module, :from_binary, 3) do
      raise ArgumentError,
            "backend: expected an Nx backend (a module implementing Nx.Backend, or {module, options}), " <>
              "got #{inspect(backend)}"
    end

    :ok
  end

  # ---- the device: explicit, else the first resident tensor's, else the
  # device an Nx tensor's memory is on (zero copy), else the default ----

  defp resolve_device(device, _args, _opts) when device != nil,
    do: Fusex.Tensor.normalize_device(device)

  defp resolve_device(nil, args, opts) do
    values = Keyword.values(args) ++ Keyword.values(opts)

    Enum.find_value(values, fn
      %Fusex.Tensor{device: d} -> d
      _ -> nil
    end) ||
      Enum.find_value(values, fn v ->
        with true <- Fusex.Interop.nx_tensor?(v), {d, _} <- Fusex.Interop.pointer_target(v),
             do: d,
             else: (_ -> nil)
      end) ||
      Fusex.default_device()
  end

  # ---- arguments ----

  defp convert_args(args, state) do
    Enum.map_reduce(args, state, fn {name, value}, st ->
      if name in st.in_place,
        do: {in_place_ref(value, name, st.device), st},
        else: convert_value(value, Atom.to_string(name), st)
    end)
  end

  defp in_place_ref(%Fusex.Tensor{ref: ref, device: device}, _name, device), do: ref

  # a list or map of parameters updated in place (optimizers)
  defp in_place_ref(list, name, device) when is_list(list),
    do: list |> Enum.with_index() |> Enum.map(fn {v, i} -> in_place_ref(v, "#{name}[#{i}]", device) end)

  # the states of a step with several ({h, c})
  defp in_place_ref(tuple, name, device) when is_tuple(tuple),
    do: tuple |> Tuple.to_list() |> in_place_ref(name, device) |> List.to_tuple()

  defp in_place_ref(map, name, device) when is_map(map) and not is_struct(map),
    do: Map.new(map, fn {k, v} -> {k, in_place_ref(v, "#{name}.#{k}", device)} end)

  defp in_place_ref(%Fusex.Tensor{device: other}, name, device) do
    raise ArgumentError,
          "#{name}: expected a tensor on #{label(device)} (updated in place), got one on #{label(other)}"
  end

  defp in_place_ref(value, name, _device) do
    raise ArgumentError,
          "#{name}: expected a %Fusex.Tensor{} (it is updated in place), got #{describe(value)}; " <>
            "make one with Fusex.Tensor.from_nx/2"
  end

  defp convert_value(%Fusex.Tensor{ref: ref, device: device}, _name, %{device: device} = st),
    do: {ref, st}

  defp convert_value(%Fusex.Tensor{ref: ref}, _name, st) do
    copy = Fusex.Erl.call(:copy, [ref, st.device])
    {copy, %{st | temps: [copy | st.temps]}}
  end

  defp convert_value(%{__struct__: Nx.Tensor} = t, name, st) do
    {%Fusex.Tensor{ref: ref}, how} = Fusex.Interop.import_nx(t, name, st.device)
    origin = st.origin || origin_of(t, how)
    {ref,
     %{st | temps: [ref | st.temps], origin: origin, all_resident: false, views: st.views or how == :view}}
  end

  defp convert_value(%{__struct__: _} = other, _name, st), do: {other, st}

  defp convert_value(map, name, st) when is_map(map) do
    {pairs, st} =
      Enum.map_reduce(map, st, fn {k, v}, acc ->
        {v2, acc} = convert_value(v, "#{name}.#{k}", acc)
        {{k, v2}, acc}
      end)

    {Map.new(pairs), st}
  end

  defp convert_value(tuple, name, st) when is_tuple(tuple) do
    {items, st} = convert_value(Tuple.to_list(tuple), name, st)
    {List.to_tuple(items), st}
  end

  defp convert_value(list, name, st) when is_list(list) do
    list
    |> Enum.with_index()
    |> Enum.map_reduce(st, fn {v, i}, acc -> convert_value(v, "#{name}[#{i}]", acc) end)
  end

  defp convert_value(other, _name, st), do: {other, st}

  defp origin_of(t, :view), do: {:view, elem(Fusex.Interop.pointer_target(t), 1)}
  defp origin_of(%{data: %{__struct__: backend}}, :copy), do: {:backend, backend}

  # ---- results ----

  defp output_mode(wrapper, state) do
    cond do
      Keyword.get(wrapper, :resident, false) -> :resident
      state.all_resident and wrapper[:backend] == nil -> :resident
      wrapper[:backend] != nil -> {:backend, wrapper[:backend]}
      true -> state.origin
    end
  end

  defp deliver(ref, mode) when is_reference(ref) do
    if :fusex_nif.is_live(ref), do: to_output(Fusex.Tensor.wrap(ref), mode), else: ref
  end

  defp deliver(tuple, mode) when is_tuple(tuple),
    do: tuple |> Tuple.to_list() |> Enum.map(&deliver(&1, mode)) |> List.to_tuple()

  defp deliver(list, mode) when is_list(list), do: Enum.map(list, &deliver(&1, mode))

  defp deliver(map, mode) when is_map(map) and not is_struct(map),
    do: Map.new(map, fn {k, v} -> {k, deliver(v, mode)} end)

  defp deliver(other, _mode), do: other

  defp to_output(t, :resident), do: t
  defp to_output(t, {:view, spec}), do: Fusex.Interop.to_nx_view(t, spec)

  defp to_output(t, {:backend, backend}) do
    nx = Fusex.Interop.to_nx_copy(t, backend)
    Fusex.Tensor.free(t)
    nx
  end

  defp label(:cpu), do: "cpu"
  defp label({:cuda, n}), do: "cuda:#{n}"

  defp describe(value) do
    if Fusex.Interop.nx_tensor?(value), do: "an Nx tensor", else: inspect(value, limit: 5)
  end
end
