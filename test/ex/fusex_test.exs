defmodule FusexTest do
  # Everything that needs no Nx: handles, ops on handles against the Erlang
  # API, errors, option validation, pointers, bench. Runs everywhere.
  use ExUnit.Case, async: false

  alias Fusex.Tensor, as: FT
  import Fusex.TestHandles

  defp from_f32(bin), do: for(<<v::float-32-native <- bin>>, do: v)

  defp random_f32(n), do: for(_ <- 1..n, do: :rand.normal())

  describe "handles" do
    test "round trip, shape, type and device" do
      xs = random_f32(37)
      t = handle(xs, {37})
      assert %FT{type: {:f, 32}, shape: {37}} = t
      assert t.device == device()
      assert FT.to_binary(t) == f32(xs)
      assert FT.live?(t)
    end

    test "zeros and copy to the cpu" do
      t = FT.zeros({:s, 64}, {2, 3}, device: device())
      assert FT.to_binary(t) == <<0::size(48)-unit(8)>>
      c = FT.copy(t, :cpu)
      assert c.device == :cpu
      assert FT.to_binary(c) == FT.to_binary(t)
    end

    test "inspect shows type, shape and device, never data" do
      t = handle([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], {2, 3})
      label = if device() == :cpu, do: "cpu", else: "cuda:#{elem(device(), 1)}"
      assert inspect(t) == "#Fusex.Tensor<f32[2][3] #{label}>"
      :ok = FT.free(t)
      assert inspect(t) == "#Fusex.Tensor<f32[2][3] #{label} (freed)>"
      refute FT.live?(t)
      b = FT.zeros({:bf, 16}, {}, device: :cpu)
      assert inspect(b) == "#Fusex.Tensor<bf16 cpu>"
    end

    test "a freed handle raises an ArgumentError naming the argument" do
      t = handle([1.0], {1})
      FT.free(t)

      assert_raise ArgumentError,
                   "tensor: expected a live tensor, got one released by fusex:free/1",
                   fn -> FT.to_binary(t) end

      assert_raise ArgumentError, "a: expected a live tensor, got one released by fusex:free/1", fn ->
        Fusex.add(t, t)
      end
    end
  end

  describe "ops on handles match the Erlang API" do
    test "add, subtract, multiply, scale, convert" do
      xs = random_f32(1001)
      ys = random_f32(1001)
      a = handle(xs, {7, 11, 13})
      b = handle(ys, {7, 11, 13})

      for {fun, erl} <- [
            {&Fusex.add/2, &:fusex.add/2},
            {&Fusex.subtract/2, &:fusex.subtract/2},
            {&Fusex.multiply/2, &:fusex.multiply/2}
          ] do
        got = fun.(a, b)
        assert %FT{shape: {7, 11, 13}, type: {:f, 32}} = got
        assert FT.to_binary(got) == :fusex.to_binary(erl.(a.ref, b.ref))
      end

      assert FT.to_binary(Fusex.scale(a, -0.75)) == :fusex.to_binary(:fusex.scale(a.ref, -0.75))
      bf = Fusex.convert(a, {:bf, 16})
      assert bf.type == {:bf, 16}
      assert FT.to_binary(bf) == :fusex.to_binary(:fusex.convert(a.ref, {:bf, 16}))
    end

    test "results are exact where the maths is" do
      a = handle([1.0, 2.0, 3.0], {3})
      assert from_f32(FT.to_binary(Fusex.add(a, a))) == [2.0, 4.0, 6.0]
      assert from_f32(FT.to_binary(Fusex.scale(a, 0.5))) == [0.5, 1.0, 1.5]
    end

    test "an explicit device copies handles there; results stay resident" do
      a = handle([1.0, 2.0], {2})
      got = Fusex.add(a, a, device: :cpu)
      assert got.device == :cpu
      assert from_f32(FT.to_binary(got)) == [2.0, 4.0]
      assert %FT{} = Fusex.scale(a, 2.0, resident: true)
    end
  end

  describe "errors and options" do
    test "op errors carry the Erlang API's message" do
      a = handle([1.0, 2.0, 3.0], {3})
      b = handle([1.0, 2.0], {2})

      assert_raise ArgumentError, "b: expected shape {3} (the shape of a), got {2}", fn ->
        Fusex.add(a, b)
      end

      i = FT.from_binary(<<1::32-native>>, {:s, 32}, {1}, device: device())
      assert_raise ArgumentError, ~r/^tensor: expected a float type/, fn -> Fusex.scale(i, 2) end
      assert_raise ArgumentError, "factor: expected a number, got two", fn -> Fusex.scale(a, :two) end
      assert_raise ArgumentError, ~r/^a: expected a fusex tensor, got 1/, fn -> Fusex.add(1, a) end
    end

    test "wrapper options are validated" do
      a = handle([1.0], {1})

      assert_raise ArgumentError,
                   "opts: expected only the options [:resident, :device, :backend], got [:axis]",
                   fn -> Fusex.add(a, a, axis: 0) end

      assert_raise ArgumentError, "resident: expected true or false, got :yes", fn ->
        Fusex.add(a, a, resident: :yes)
      end

      assert_raise ArgumentError, ~r/^opts: expected a keyword list/, fn -> Fusex.add(a, a, [1]) end

      assert_raise ArgumentError, ~r/^device: expected cpu, cuda or \{cuda, N\}, got tpu/, fn ->
        Fusex.add(a, a, device: :tpu)
      end

      assert_raise ArgumentError, fn -> FT.zeros({:f, 32}, {1}, devise: :cpu) end
      assert_raise ArgumentError, ~r/^type: expected one of/, fn -> FT.zeros({:f, 8}, {1}) end
    end

    test "arguments updated in place must be handles on the op's device" do
      a = handle([1.0], {1})

      assert_raise ArgumentError,
                   "a: expected a %Fusex.Tensor{} (it is updated in place), got 1.0; make one with Fusex.Tensor.from_nx/2",
                   fn -> Fusex.Op.run(:add, [a: 1.0, b: a], [], in_place: [:a]) end

      cpu = FT.zeros({:f, 32}, {1}, device: :cpu)

      if device() != :cpu do
        # the first resident argument names the op's device unless one is given
        assert_raise ArgumentError, ~r/^a: expected a tensor on cuda:0 \(updated in place\), got one on cpu/, fn ->
          Fusex.Op.run(:add, [a: cpu, b: a], [device: device()], in_place: [:a])
        end
      end

      # on its device, the handle itself is passed
      assert %FT{} = Fusex.Op.run(:add, [a: a, b: a], [], in_place: [:a])

      # lists and maps of handles (optimizer parameters) are checked item by item
      assert_raise ArgumentError, ~r/^a\[1\]: expected a %Fusex.Tensor\{\}/, fn ->
        Fusex.Op.run(:add, [a: [a, 2.0], b: a], [], in_place: [:a])
      end
    end

    test "op options become the Erlang options map, tensors converted" do
      a = handle([1.0, 2.0], {2})
      # copy/3 takes an options map last: ipc must be a boolean
      assert_raise ArgumentError, "ipc: expected true or false, got 1", fn ->
        Fusex.Op.run(:copy, [tensor: a, device: :cpu], [ipc: 1], erl_opts: true)
      end

      got = Fusex.Op.run(:copy, [tensor: a, device: :cpu], [ipc: false], erl_opts: true)
      assert %FT{device: :cpu} = got
    end

    test "Erlang error terms become Elixir exceptions" do
      assert %ArgumentError{message: "x: bad"} = Fusex.Erl.translate({:badarg, "x: bad"})
      assert %Fusex.CudaError{code: 2, message: "oom"} = Fusex.Erl.translate({:cuda_error, 2, "oom"})
      assert %RuntimeError{message: "internal: boom"} = Fusex.Erl.translate({:internal, "boom"})
    end
  end

  describe "pointers" do
    test "a local pointer round trip; writes through the view reach the owner" do
      owner = handle([1.0, 2.0, 3.0, 4.0], {4})
      {:local, addr, 16} = FT.to_pointer(owner, :local)
      view = FT.from_pointer({:local, addr, 16}, {:f, 32}, {2, 2}, device: device())
      assert inspect(view) =~ "f32[2][2]"
      :ok = FT.copy_into(Fusex.scale(view, 10.0), view)
      assert from_f32(FT.to_binary(owner)) == [10.0, 20.0, 30.0, 40.0]
    end

    test "a freed owner is refused" do
      owner = handle([1.0, 2.0], {2})
      {:local, addr, _} = FT.to_pointer(owner, :local)
      FT.free(owner)

      assert_raise ArgumentError, ~r/use-after-free of its owner/, fn ->
        FT.from_pointer({:local, addr}, {:f, 32}, {2}, device: device())
      end
    end
  end

  test "Fusex.Bench.run prints the bench table and returns its rows" do
    out =
      ExUnit.CaptureIO.capture_io(fn ->
        rows = Fusex.Bench.run(ops: ["launch+sync"], device: :cpu, reps: 3)
        send(self(), {:rows, rows})
      end)

    assert_received {:rows, [%{op: "launch+sync, scale 1 element", device: :cpu, e2e_us: e2e}]}
    assert is_number(e2e)
    assert out =~ "| op | shape | dtype | device | median us | GB/s |"
    assert out =~ "| launch+sync, scale 1 element | {1} | {f,32} | cpu |"
  end

  @tag :no_nx
  test "without Nx, Nx conversions say what is missing" do
    t = handle([1.0], {1})
    assert_raise ArgumentError, ~r/^to_nx: Nx is not available/, fn -> FT.to_nx(t) end
    assert_raise ArgumentError, ~r/^tensor: Nx is not available/, fn -> FT.from_nx(%{}) end
  end
end
