defmodule FusexOptionsTest do
  # Every option of the Elixir wrappers (Fusex's ops, Fusex.Tensor,
  # Fusex.Bench) that does not fit raises an ArgumentError naming it:
  # what the wrapper checks itself, and what the Erlang API checks (its
  # message). Handles only: no Nx needed. (Fusex.Defn's options are in
  # its family suites, Fusex.Axon's in FusexAxonTest.)
  use ExUnit.Case, async: false
  @compile {:no_warn_undefined, [Nx, Nx.BinaryBackend]}

  import Fusex.TestHandles
  alias Fusex.Tensor, as: FT

  defp scan_inputs do
    x = random_handle({2, 5, 4})
    {x, random_handle({2, 5, 4}, 0.0, 0.5), random_handle({4, 3}, -1.0, -0.1), random_handle({2, 5, 3}), random_handle({2, 5, 3})}
  end

  test "an op's options: a keyword list, the wrapper's own checked, the op's by the Erlang API" do
    {x, dt, a, b, c} = scan_inputs()

    cases = [
      {"opts: expected a keyword list, got %{}", fn -> Fusex.selective_scan(x, dt, a, b, c, %{}) end},
      {"opts: expected a keyword list, got 3", fn -> Fusex.mingru(x, x, 3) end},
      {"opts: expected a keyword list, got [1, 2]", fn -> Fusex.add(x, x, [1, 2]) end},
      {"backend: expected an Nx backend (a module implementing Nx.Backend, or {module, options}), got :nope",
       fn -> Fusex.selective_scan(x, dt, a, b, c, backend: :nope) end},
      {"backend: expected an Nx backend (a module implementing Nx.Backend, or {module, options}), got {Enum, 1}",
       fn -> Fusex.linear_scan(x, x, backend: {Enum, 1}) end},
      {"resident: expected true or false, got 1", fn -> Fusex.add(x, x, resident: 1) end},
      {"device: expected cpu, cuda or {cuda, N}, got nope", fn -> Fusex.selective_scan(x, dt, a, b, c, device: :nope) end},
      {"dt_softplus: expected true or false, got 1", fn -> Fusex.selective_scan(x, dt, a, b, c, dt_softplus: 1) end},
      {"reverse: expected true or false, got 3", fn -> Fusex.mingru(x, x, reverse: 3) end},
      {"candidate_activation: expected identity or g, got tanh", fn -> Fusex.minlstm(x, x, x, candidate_activation: :tanh) end}
    ]

    for {message, fun} <- cases, do: assert_raise(ArgumentError, message, fun)
  end

  test "Fusex.Tensor's and Fusex.Bench's options" do
    t = random_handle({2, 3})

    cases = [
      {"opts: expected only the options device, ipc, got :bogus", fn -> FT.zeros({:f, 32}, {2}, bogus: 1) end},
      {"opts: expected a keyword list, got %{device: :cpu}", fn -> FT.zeros({:f, 32}, {2}, %{device: :cpu}) end},
      {"device: expected cpu, cuda or {cuda, N}, got <<\"cpu\">>", fn -> FT.zeros({:f, 32}, {2}, device: "cpu") end},
      {"opts: expected only the options ipc, got :device", fn -> FT.copy(t, :cpu, device: :cpu) end},
      {"opts: expected only the options sync, got :async", fn -> FT.to_pointer(t, :local, async: true) end},
      {"opts: expected only the options backend, got :device", fn -> FT.to_nx(t, device: :cpu) end},
      {"reps: expected a positive integer, got 0", fn -> Fusex.Bench.run(reps: 0) end},
      {"device: expected :cpu, :cuda or {:cuda, n}, got :gpu", fn -> Fusex.Bench.run(device: :gpu) end},
      {"ops: expected an op name or a list of them, got 3", fn -> Fusex.Bench.run(ops: 3) end},
      {"opts: expected only the options ops, device, reps, out, got :rep", fn -> Fusex.Bench.run(rep: 3) end}
    ]

    for {message, fun} <- cases, do: assert_raise(ArgumentError, message, fun)
  end

  @tag :nx
  test "an Nx backend is one, and Fusex.Tensor.from_nx's flags are booleans" do
    x = Nx.broadcast(0.5, {2, 3})
    b = "backend: expected an Nx backend (a module implementing Nx.Backend, or {module, options}), got Enum"
    assert_raise ArgumentError, b, fn -> Fusex.add(x, x, backend: Enum) end
    assert_raise ArgumentError, b, fn -> FT.to_nx(FT.from_nx(x), backend: Enum) end
    assert_raise ArgumentError, "copy: expected true or false, got 1", fn -> FT.from_nx(x, copy: 1) end
    assert_raise ArgumentError, "ipc: expected true or false, got :yes", fn -> FT.from_nx(x, ipc: :yes) end
    assert Nx.to_flat_list(Fusex.add(x, x, backend: Nx.BinaryBackend)) == List.duplicate(1.0, 6)
  end
end
