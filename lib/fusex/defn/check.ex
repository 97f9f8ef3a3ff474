defmodule Fusex.Defn.Check do
  @moduledoc false
  # The Erlang API's argument checks, made on tensor templates (type and
  # shape) at trace time, with the same messages: what fusex:selective_scan/6
  # and the linear recurrences would say about the same shapes and types on
  # the cpu device (where {f,64} is allowed), so that a Fusex.Defn call
  # fails before anything is compiled, wherever it would later run. The
  # ExUnit suite checks every message here against the Erlang API's.
  #
  # Needs no Nx at compile time: it reads the :type, :shape and
  # :vectorized_axes fields of Nx.Tensor structs.

  @float_types [{:f, 32}, {:bf, 16}, {:f, 16}, {:f, 64}]

  # ---- values ----

  @doc false
  # A tensor argument: an Nx tensor without vectorized axes. Numbers are
  # refused, as the Erlang API refuses anything but a tensor.
  def tensor!(%{__struct__: Nx.Tensor, vectorized_axes: []} = t, _name), do: t

  def tensor!(%{__struct__: Nx.Tensor, vectorized_axes: vec}, name) do
    raise ArgumentError,
          "#{name}: expected a tensor without vectorized axes, got one vectorized over #{inspect(vec)}"
  end

  def tensor!(other, name), do: fail(name, "a tensor", term(other))

  @doc false
  # Options and tensors given under keys the op does not know.
  def known_keys!(given, allowed, what) do
    case Enum.find(Map.keys(given), &(&1 not in allowed)) do
      nil ->
        :ok

      key ->
        raise ArgumentError,
              "#{what}: expected only the #{what_name(what)} #{Enum.join(allowed, ", ")}, got #{term(key)}"
    end
  end

  defp what_name("opts"), do: "options"
  defp what_name(other), do: other

  @doc false
  def opts_map!(opts) when is_list(opts) do
    unless Keyword.keyword?(opts), do: fail("opts", "a keyword list", term(opts))
    Map.new(opts)
  end

  def opts_map!(%{} = opts) when not is_struct(opts), do: opts
  def opts_map!(other), do: fail("opts", "a keyword list", term(other))

  @doc false
  def tensors_map!(%{} = tensors) when not is_struct(tensors), do: tensors
  def tensors_map!(tensors) when is_list(tensors) and tensors != [] do
    if Keyword.keyword?(tensors), do: Map.new(tensors), else: fail("tensors", "a map of tensors", term(tensors))
  end

  def tensors_map!([]), do: %{}
  def tensors_map!(other), do: fail("tensors", "a map of tensors", term(other))

  @doc false
  def bool!(opts, key, default \\ false) do
    case Map.get(opts, key, default) do
      v when is_boolean(v) -> v
      other -> fail(Atom.to_string(key), "true or false", term(other))
    end
  end

  @doc false
  # candidate_activation: identity (default) or g; true for g.
  def candidate_g!(opts) do
    case Map.get(opts, :candidate_activation, :identity) do
      :identity -> false
      :g -> true
      other -> fail("candidate_activation", "identity or g", term(other))
    end
  end

  @doc false
  # liquid's scalar dt: a positive finite number (default 1.0).
  def dt_value!(value, layout) do
    if is_number(value) and value > 0 and value * 1.0 < 1.0e308 do
      value * 1.0
    else
      fail("dt", "a positive number or a tensor (#{layout})", term(value))
    end
  end

  # ---- the ops' checks, in the order of c_src/core/ssm.c and linrec.c ----

  @x_layout "[batch, seqlen, dim]"
  @state_layout "[batch, dim, dstate]"

  @doc false
  # fx_ssm_check_forward: x, dt, a, b, c and the optional d, z, dt_bias,
  # h0 (a map). Returns %{batch, seqlen, dim, dstate, groups}.
  def selective_scan!(x, dt, a, b, c, opt) do
    float!(x, "x")
    rank!(x, "x", 3, @x_layout)
    {batch, seqlen, dim} = x.shape
    like!(dt, "dt", x.type, x.shape, @x_layout)
    dstate = a!(a, dim)
    groups = b!(b, x.type, [batch, seqlen], dim, dstate)
    like!(c, "c", x.type, b.shape, "(the shape of b)")
    ssm_options!(opt, x, dim, @x_layout)
    if h0 = opt[:h0], do: param!(h0, "h0", {batch, dim, dstate}, @state_layout)
    %{batch: batch, seqlen: seqlen, dim: dim, dstate: dstate, groups: groups}
  end

  @doc false
  # fx_ssm_check_step: as the forward with frames ([batch, dim]) and the
  # state ({f,32} or {f,64}, [batch, dim, dstate]).
  def selective_scan_step!(state, x, dt, a, b, c, opt) do
    float!(x, "x")
    rank!(x, "x", 2, "[batch, dim]")
    {batch, dim} = x.shape
    like!(dt, "dt", x.type, x.shape, "[batch, dim]")
    dstate = a!(a, dim)
    b!(b, x.type, [batch], dim, dstate)
    like!(c, "c", x.type, b.shape, "(the shape of b)")
    ssm_options!(opt, x, dim, "[batch, dim]")

    unless state.type in [{:f, 32}, {:f, 64}],
      do: fail("state", "type {f,32} or {f,64}", type_name(state.type))

    shape!(state, "state", {batch, dim, dstate}, @state_layout)
  end

  defp a!(a, dim) do
    float!(a, "a")
    rank!(a, "a", 2, "[dim, dstate]")
    shape!(a, "a", {dim, elem(a.shape, 1)}, "[dim, dstate]")
    elem(a.shape, 1)
  end

  # b: the leading dims, then [groups,] dstate; returns groups.
  defp b!(b, type, lead, dim, dstate) do
    {l3, l4} =
      if length(lead) == 2,
        do: {"[batch, seqlen, dstate]", "[batch, seqlen, groups, dstate]"},
        else: {"[batch, dstate]", "[batch, groups, dstate]"}

    type!(b, "b", type)
    nlead = length(lead)

    case tuple_size(b.shape) do
      r when r == nlead + 1 ->
        shape!(b, "b", List.to_tuple(lead ++ [dstate]), l3)
        1

      r when r == nlead + 2 ->
        groups = elem(b.shape, nlead)
        shape!(b, "b", List.to_tuple(lead ++ [groups, dstate]), l4)

        if rem(dim, groups) != 0,
          do: fail("b", "a number of groups that divides dim #{dim} #{l4}", "#{groups}")

        groups

      r ->
        fail("b", "rank #{nlead + 1} #{l3} or rank #{nlead + 2} #{l4}", "rank #{r} shape #{shape_name(b.shape)}")
    end
  end

  defp ssm_options!(opt, x, dim, z_layout) do
    if d = opt[:d], do: param!(d, "d", {dim}, "[dim]")
    if bias = opt[:dt_bias], do: param!(bias, "dt_bias", {dim}, "[dim]")
    if z = opt[:z], do: like!(z, "z", x.type, x.shape, z_layout)
    :ok
  end

  @doc false
  # check_problem (c_src/core/linrec.c) and the forward's h0: `seqs` the
  # sequence inputs [{name, tensor}] in order, `liquid` nil or
  # %{tau:, a:, dt: tensor | nil}; `frame` true for a step ([batch, hidden]
  # frames). Returns %{batch, seqlen, hidden, type}.
  def linrec!(seqs, liquid, h0, frame) do
    [{first_name, first} | rest] = seqs
    layout = if frame, do: "[batch, hidden]", else: "[batch, seqlen, hidden]"
    rank = if frame, do: 2, else: 3
    float!(first, first_name)
    rank!(first, first_name, rank, layout)

    for {name, t} <- rest do
      type!(t, name, first.type)
      shape!(t, name, first.shape, "(#{layout}, as #{first_name})")
    end

    batch = elem(first.shape, 0)
    hidden = elem(first.shape, rank - 1)
    seqlen = if frame, do: 1, else: elem(first.shape, 1)

    if liquid do
      like!(liquid.tau, "tau", first.type, {hidden}, "([hidden])")
      like!(liquid.a, "a", first.type, {hidden}, "([hidden])")

      if dt = liquid.dt do
        if frame,
          do: like!(dt, "dt", first.type, {batch, 1}, "([batch, 1])"),
          else: like!(dt, "dt", first.type, {batch, seqlen, 1}, "([batch, seqlen, 1])")
      end
    end

    if h0, do: state_tensor!(h0, "h0", first.type, {batch, hidden}, "([batch, hidden])")
    %{batch: batch, seqlen: seqlen, hidden: hidden, type: first.type}
  end

  # ---- types and shapes, as c_src/core/check.c words them ----

  @doc false
  def float!(%{type: type}, name) do
    unless type in @float_types do
      fail(name, "a float type ({f,32}, {bf,16}, {f,16} or {f,64})", type_name(type))
    end

    :ok
  end

  @doc false
  def type!(%{type: type}, name, want) do
    if type != want, do: fail(name, "type #{type_name(want)}", type_name(type))
    :ok
  end

  @doc false
  def rank!(%{shape: shape}, name, rank, layout) do
    if tuple_size(shape) != rank do
      fail(name, "rank #{rank} #{layout}", "rank #{tuple_size(shape)} shape #{shape_name(shape)}")
    end

    :ok
  end

  @doc false
  def shape!(%{shape: shape}, name, want, layout) do
    if shape != want, do: fail(name, "shape #{shape_name(want)} #{layout}", shape_name(shape))
    :ok
  end

  @doc false
  # A tensor of the given type (x's) and shape.
  def like!(t, name, type, shape, layout) do
    type!(t, name, type)
    shape!(t, name, shape, layout)
  end

  @doc false
  # A parameter read once per channel: any float type, the given shape.
  def param!(t, name, shape, layout) do
    float!(t, name)
    shape!(t, name, shape, layout)
  end

  @doc false
  # The state type of the inputs' type: f32, or f64 for f64.
  def state_type({:f, 64}), do: {:f, 64}
  def state_type(_), do: {:f, 32}

  @doc false
  # h0, a step's state: the inputs' type or the state type.
  def state_tensor!(t, name, type, shape, layout) do
    state = state_type(type)

    cond do
      t.type in [type, state] -> :ok
      state == type -> type!(t, name, type)
      true -> fail(name, "type #{type_name(type)} or #{type_name(state)}", type_name(t.type))
    end

    shape!(t, name, shape, layout)
  end

  @doc false
  def fail(name, expected, got) do
    raise ArgumentError, "#{name}: expected #{expected}, got #{got}"
  end

  @doc false
  def type_name({kind, bits}), do: "{#{kind},#{bits}}"

  @doc false
  def shape_name(shape), do: "{" <> (shape |> Tuple.to_list() |> Enum.join(",")) <> "}"

  # Erlang's rendering of a term (the NIF prints terms with enif's %T).
  defp term(%{__struct__: Nx.Tensor}), do: "a tensor"
  defp term(value), do: ~c"~0tp" |> :io_lib.format([value]) |> IO.chardata_to_string()
end
