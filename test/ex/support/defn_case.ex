defmodule Fusex.DefnCase do
  @moduledoc false
  # What the Fusex.Defn suites share (test/ex/fusex_defn_test.exs and one
  # file per family, test/ex/fusex_defn_<family>_test.exs): the ops as the
  # op layer describes them, the Erlang API's options from Fusex.Defn's,
  # gradients against central differences, second derivatives (refused by
  # every op, right through every step), bad input against the Erlang API's
  # message, and the blocks a traced function holds. A family's file uses
  # these on its own inputs. Compiles without Nx (only calls into it).
  @compile {:no_warn_undefined, [Nx, Nx.Defn, Nx.Defn.Expr, Nx.Defn.Composite, Fusex.Defn, Fusex.Defn.Runtime]}

  import ExUnit.Assertions
  import Fusex.NxHelpers
  alias Fusex.Defn.Block

  @doc """
  A setup: the test process's blocks run their pure-Nx code (the family
  suites test it against the Erlang API; test/ex/fusex_defn_runtime_test.exs
  tests the NIF's runs).
  """
  def pure_nx(_context) do
    Fusex.Defn.Runtime.put_implementation(:nx)
    :ok
  end

  @doc "The descriptions (fusex:op_list/0) of `family`'s ops in direction `dir`."
  def described(family, dir), do: for(d <- :fusex.op_list(), d.family == family, d.dir == dir, do: d)

  @doc "The state type of inputs of `type` (docs/XLA.md): f32, f64 for f64."
  def state_type({:f, 64}), do: {:f, 64}
  def state_type(_), do: {:f, 32}

  @doc "Fusex.Defn's tensors and options -> the Erlang API's options map."
  def erl_opts(tensors, opts), do: Map.merge(Map.new(opts), Map.new(tensors, fn {k, v} -> {k, erl(v)} end))

  # =====================================================================
  # gradients
  # =====================================================================

  @doc """
  Directional derivative of the scalar loss along a random direction of
  each argument: (L(p + eps v) - L(p - eps v)) / 2 eps against <grad, v>.
  """
  def check_central_differences(label, args, loss) do
    grads = Nx.Defn.jit(fn args -> Nx.Defn.grad(args, loss) end).(args)
    value = Nx.Defn.jit(loss)
    eps = 1.0e-6

    for {arg, g, pos} <- Enum.zip([Tuple.to_list(args), Tuple.to_list(grads), Enum.to_list(0..(tuple_size(args) - 1))]) do
      v = uniform(arg.shape, {:f, 64})
      moved = fn sign -> put_elem(args, pos, Nx.add(arg, Nx.multiply(sign * eps, v))) end
      numeric = (Nx.to_number(value.(moved.(1.0))) - Nx.to_number(value.(moved.(-1.0)))) / (2 * eps)
      analytic = Nx.to_number(dot(g, v))
      err = abs(numeric - analytic) / max(abs(analytic), 1.0e-3)
      assert err <= 1.0e-6, "#{label} argument #{pos}: central difference #{numeric}, gradient #{analytic}"
    end
  end

  @doc """
  A second derivative through an op (the gradient of a loss of its
  gradient, f64 inputs `args`, `fun.(args)` the op's outputs) raises
  ArgumentError saying so, at trace time: under the Evaluator and in the
  expression alone.
  """
  def assert_second_order_refused(op, args, fun) do
    outer = second_order(fun)

    err = assert_raise ArgumentError, fn -> Nx.Defn.jit(outer).(args) end
    assert err.message =~ ~r/^#{op}: second derivatives are not supported/
    assert_raise ArgumentError, ~r/second derivatives are not supported/, fn -> Nx.Defn.debug_expr(outer).(args) end
  end

  @doc """
  A step's second derivative: the gradient of L2 = |grad L1|^2 (L1 =
  sum(out * w)) against central differences of L2 itself, in f64.
  """
  def check_second_order(label, args, fun) do
    l2 = fn args -> second_order_loss(args, fun) end
    check_central_differences(label <> " (second order)", args, l2)
  end

  defp second_order(fun), do: fn args -> Nx.Defn.grad(args, fn args -> second_order_loss(args, fun) end) end

  defp second_order_loss(args, fun) do
    grads = Nx.Defn.grad(args, fn args -> fun.(args) |> List.wrap() |> Enum.map(&weighted/1) |> sum_all() end)
    grads |> Tuple.to_list() |> Enum.map(&Nx.sum(Nx.pow(&1, 2))) |> sum_all()
  end

  # A fixed, uneven weighting of an output (so that no gradient vanishes
  # by symmetry).
  defp weighted(t) do
    w = Nx.iota(t.shape, type: {:f, 64}) |> Nx.multiply(0.37) |> Nx.sin()
    Nx.sum(Nx.multiply(Nx.as_type(t, {:f, 64}), w))
  end

  defp sum_all([one]), do: one
  defp sum_all([first | rest]), do: Enum.reduce(rest, first, &Nx.add(&2, &1))

  # =====================================================================
  # bad input
  # =====================================================================

  @doc """
  The Fusex.Defn call `defn_fun` (traced with jit) raises ArgumentError
  with the message the Erlang call `erl_fun` raises as {badarg, Msg}
  (`a fusex tensor` read as `a tensor`).
  """
  def assert_same_message(defn_fun, erl_fun) do
    want = erl_fun |> erl_message() |> String.replace("a fusex tensor", "a tensor")
    err = assert_raise ArgumentError, defn_fun
    assert err.message == want
  end

  # =====================================================================
  # the blocks of a traced function
  # =====================================================================

  @doc """
  Every Nx.block in a traced expression: [{block struct, operand {type,
  shape}s, result {type, shape}s}].
  """
  def blocks_of(fun, args) do
    expr = apply(Nx.Defn.debug_expr(fun), args)
    {_, found} = walk(List.wrap(Nx.Defn.Composite.flatten_list([expr])), {MapSet.new(), []})
    Enum.reverse(found)
  end

  defp walk([], acc), do: acc

  # (map patterns: this module compiles without Nx)
  defp walk([%{__struct__: Nx.Tensor, data: %{__struct__: Nx.Defn.Expr, id: id, op: op, args: args}} | rest], {seen, found}) do
    if MapSet.member?(seen, id) do
      walk(rest, {seen, found})
    else
      seen = MapSet.put(seen, id)

      found =
        case {op, args} do
          {:block, [%Block{} = block, in_args, out, _fun]} ->
            results = out |> List.wrap() |> Enum.flat_map(&Nx.Defn.Composite.flatten_list([&1]))
            [{block, Enum.map(in_args, &{&1.type, &1.shape}), Enum.map(results, &{&1.type, &1.shape})} | found]

          _ ->
            found
        end

      children = Enum.flat_map(args, &tensors_in/1)
      walk(children ++ rest, {seen, found})
    end
  end

  defp walk([_ | rest], acc), do: walk(rest, acc)

  defp tensors_in(%{__struct__: Nx.Tensor} = t), do: [t]
  defp tensors_in(list) when is_list(list), do: Enum.flat_map(list, &tensors_in/1)
  defp tensors_in(tuple) when is_tuple(tuple), do: tuple |> Tuple.to_list() |> Enum.flat_map(&tensors_in/1)
  defp tensors_in(%{custom_grad: {inputs, fun}}) when is_function(fun), do: tensors_in(inputs)
  defp tensors_in(_), do: []

  @doc "A block's attributes are its description's, in the description's order."
  def assert_description_attrs(%Block{} = block) do
    desc = Enum.find(:fusex.op_list(), &(&1.name == :"#{block.op}_#{block.direction}"))
    assert desc, "no description of #{Block.target_name(block)}"
    assert Keyword.keys(block.attrs) == Enum.map(desc.attrs, & &1.name)
  end
end
