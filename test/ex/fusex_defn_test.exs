defmodule FusexDefnTest do
  # What Fusex.Defn does the same for every op, over the op layer's
  # descriptions: every described op has its functions and its family its
  # test file (test/ex/fusex_defn_<family>_test.exs, with Fusex.DefnCase's
  # shared pieces), calls outside defn, captured constants, vectorized
  # tensors. Runs where Nx is present; listed as skipped elsewhere.
  use ExUnit.Case, async: false
  @moduletag :nx
  @compile {:no_warn_undefined, [Nx, Nx.Defn, Fusex.Defn]}

  import Fusex.NxHelpers

  # The ops that are XLA targets: those with no target (the linear
  # layers: inside a compiled program XLA's own products are the right
  # ones) are eager only (Fusex.linear/3).
  defp targets, do: for(d <- :fusex.op_list(), Map.has_key?(d, :target), do: d)

  test "every described op has its Fusex.Defn functions, and every family its test file" do
    Code.ensure_loaded!(Fusex.Defn)

    for d <- targets(), d.dir != :bwd do
      name = if d.dir == :step, do: :"#{d.op}_step", else: d.op
      # a repeated group (an RNN's layers) is one argument, and so are a
      # step's states where it has several (the LSTM's {h, c})
      fixed = Enum.reject(d.inputs, &Map.get(&1, :repeated, false))
      states = Enum.count(fixed, &(&1.role == :state))
      group = if Enum.any?(d.inputs, &Map.get(&1, :repeated, false)), do: 1, else: 0
      positional = Enum.count(fixed, &(&1.role == :arg)) + min(states, 1) + group
      assert function_exported?(Fusex.Defn, name, positional + 2), "Fusex.Defn.#{name}/#{positional + 2} missing"
    end

    here = Path.dirname(__ENV__.file)

    for family <- targets() |> Enum.map(& &1.family) |> Enum.uniq() do
      assert File.exists?(Path.join(here, "fusex_defn_#{family}_test.exs")), "no test file for the #{family} family"
    end

    # and an op without a target has no Fusex.Defn function, but its eager one
    for d <- :fusex.op_list(), not Map.has_key?(d, :target), d.dir == :fwd do
      positional = Enum.count(d.inputs, &(&1.role in [:arg, :state]))
      refute function_exported?(Fusex.Defn, d.op, positional + 2), "Fusex.Defn.#{d.op} is no XLA target"
      assert function_exported?(Fusex, d.op, positional + 1), "Fusex.#{d.op}/#{positional + 1} missing"
    end
  end

  # =====================================================================
  # outside defn, constants, vectorized tensors
  # =====================================================================


  test "outside defn on plain tensors: the same results as inside" do
    z = uniform({2, 5, 3})
    cand = uniform({2, 5, 3})
    h0 = uniform({2, 3})
    inside = Nx.Defn.jit(fn z, cand, h0 -> Fusex.Defn.minlstm(z, z, cand, %{h0: h0}, return_state: true) end).(z, cand, h0)
    outside = Fusex.Defn.minlstm(z, z, cand, %{h0: h0}, return_state: true)
    assert Nx.to_binary(elem(inside, 0)) == Nx.to_binary(elem(outside, 0))
    assert Nx.to_binary(elem(inside, 1)) == Nx.to_binary(elem(outside, 1))

    i = %{
      x: uniform({1, 20, 3}),
      dt: uniform({1, 20, 3}, {:f, 32}, 0.0, 0.5),
      a: uniform({3, 2}, {:f, 32}, -2.0, -0.1),
      b: uniform({1, 20, 2}),
      c: uniform({1, 20, 2}),
      d: uniform({3})
    }

    y = Fusex.Defn.selective_scan(i.x, i.dt, i.a, i.b, i.c, %{d: i.d, h0: nil})

    # a misspelled key is refused even with nil
    assert_raise ArgumentError, ~r/^tensors: expected only the tensors .*, got h_0$/, fn ->
      Fusex.Defn.selective_scan(i.x, i.dt, i.a, i.b, i.c, %{h_0: nil})
    end
    y_jit = Nx.Defn.jit(fn x, dt, a, b, c, d -> Fusex.Defn.selective_scan(x, dt, a, b, c, %{d: d}) end).(i.x, i.dt, i.a, i.b, i.c, i.d)
    assert Nx.to_binary(y) == Nx.to_binary(y_jit)
  end

  test "tensors captured by the traced function (constants) are operands like any other" do
    h0 = uniform({2, 3})
    a = uniform({2, 4, 3}, {:f, 32}, 0.0, 1.0)
    b = uniform({2, 4, 3})
    # h0 and a are captured: constants of the traced function
    got = Nx.Defn.jit(fn b -> Fusex.Defn.linear_scan(a, b, %{h0: h0}) end).(b)
    assert_close(got, nx(:fusex.linear_scan(erl(a), erl(b), %{h0: erl(h0)})), 1.0e-5, "captured")
    g = Nx.Defn.jit(fn b -> Nx.Defn.grad(b, fn b -> Nx.sum(Fusex.Defn.linear_scan(a, b, %{h0: h0})) end) end).(b)
    {_h, ctx} = :fusex.linear_scan(erl(a), erl(b), %{h0: erl(h0), save_for_backward: true})
    assert_close(g, nx(:fusex.linear_scan_backward(erl(Nx.broadcast(1.0, {2, 4, 3})), ctx, %{}).b), 1.0e-5, "captured grad")
  end

  test "vectorized tensors are refused, naming the argument" do
    x = Nx.vectorize(uniform({2, 1, 4, 3}), :rows)

    assert_raise ArgumentError, "a: expected a tensor without vectorized axes, got one vectorized over [rows: 2]", fn ->
      Fusex.Defn.linear_scan(x, uniform({1, 4, 3}))
    end

    assert_raise ArgumentError, ~r/^b: expected a tensor without vectorized axes/, fn ->
      Nx.Defn.jit(fn a, b -> Fusex.Defn.linear_scan(a, b) end).(uniform({1, 4, 3}), x)
    end
  end
end
