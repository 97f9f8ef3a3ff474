defmodule FusexNxTest do
  # The wrapper on Nx tensors, against the Erlang API on the same inputs.
  # Runs where Nx is present; listed as skipped elsewhere.
  use ExUnit.Case, async: false
  @moduletag :nx
  @compile {:no_warn_undefined, [Nx, Nx.BinaryBackend, Nx.Random]}

  alias Fusex.Tensor, as: FT

  defp device, do: Fusex.default_device()

  defp random(type, shape) do
    key = Nx.Random.key(:rand.uniform(1_000_000))
    {t, _} = Nx.Random.normal(key, shape: shape, type: {:f, 32})
    Nx.as_type(t, type)
  end

  # The Erlang API on the tensor's bytes: the reference for the wrapper.
  defp erl(tensor), do: :fusex.tensor(Nx.to_binary(tensor), tensor.type, tensor.shape, %{device: device()})

  defp erl_binary(ref), do: :fusex.to_binary(ref)

  describe "ops on Nx tensors (binary backend)" do
    test "match the Erlang API for every float type and awkward shapes" do
      types = if device() == :cpu, do: [{:f, 32}, {:bf, 16}, {:f, 16}, {:f, 64}], else: [{:f, 32}, {:bf, 16}, {:f, 16}]

      for type <- types, shape <- [{1}, {7}, {3, 5}, {2, 3, 37}, {4099}] do
        a = random(type, shape)
        b = random(type, shape)

        for {fun, erl_fun} <- [{&Fusex.add/2, &:fusex.add/2}, {&Fusex.multiply/2, &:fusex.multiply/2},
                               {&Fusex.subtract/2, &:fusex.subtract/2}] do
          got = fun.(a, b)
          assert got.type == type and got.shape == shape
          assert got.data.__struct__ == Nx.BinaryBackend
          assert Nx.to_binary(got) == erl_binary(erl_fun.(erl(a), erl(b)))
        end

        got = Fusex.scale(a, 1.75)
        assert Nx.to_binary(got) == erl_binary(:fusex.scale(erl(a), 1.75))
      end
    end

    test "results agree with Nx's own arithmetic in f32" do
      a = random({:f, 32}, {64, 3})
      b = random({:f, 32}, {64, 3})
      assert Nx.to_binary(Fusex.add(a, b)) == Nx.to_binary(Nx.add(a, b))
      assert Nx.to_binary(Fusex.multiply(a, b)) == Nx.to_binary(Nx.multiply(a, b))
    end

    test "integer types and conversion" do
      i = Nx.tensor([1, -2, 3_000_000_000_000], type: {:s, 64})
      assert Nx.to_list(Fusex.add(i, i)) == [2, -4, 6_000_000_000_000]
      f = Nx.tensor([1.5, -2.5, 300.0])
      # toward zero, saturating, as :fusex.convert/2
    assert Nx.to_list(Fusex.convert(f, {:u, 8})) == [1, 0, 255]
      assert Fusex.convert(f, {:bf, 16}).type == {:bf, 16}
    end

    test "names of dimensions do not matter; shapes come back" do
      a = Nx.iota({2, 3}, type: {:f, 32}, names: [:rows, :cols])
      assert Nx.to_list(Fusex.scale(a, 2)) == [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    end

    test "mixed Nx and resident arguments; resident: true keeps results on the device" do
      a = random({:f, 32}, {10})
      h = FT.from_nx(a)
      assert %FT{shape: {10}, type: {:f, 32}} = h
      sum = Fusex.add(a, h)
      assert sum.__struct__ == Nx.Tensor
      assert Nx.to_binary(sum) == Nx.to_binary(Nx.add(a, a))
      r = Fusex.add(a, a, resident: true)
      assert %FT{} = r
      assert Nx.to_binary(FT.to_nx(r)) == Nx.to_binary(sum)
      assert FT.to_nx(r, backend: Nx.BinaryBackend).shape == {10}
    end

    test "an explicit :backend for results" do
      h = FT.from_nx(Nx.tensor([1.0, 2.0]))
      got = Fusex.scale(h, 3.0, backend: Nx.BinaryBackend)
      assert Nx.to_list(got) == [3.0, 6.0]
    end
  end

  describe "errors on Nx input" do
    test "unsupported types and vectorized tensors name the argument" do
      s8 = Nx.tensor([1, 2], type: {:s, 8})

      assert_raise ArgumentError, ~r/^a: expected a tensor of type \{:f, 32\}.*got \{:s, 8\}/, fn ->
        Fusex.add(s8, s8)
      end

      v = Nx.vectorize(Nx.iota({2, 3}, type: {:f, 32}), :rows)

      assert_raise ArgumentError, ~r/^tensor: expected a tensor without vectorized axes/, fn ->
        Fusex.scale(v, 2)
      end
    end

    test "shape mismatches come from the op layer" do
      assert_raise ArgumentError, "b: expected shape {3} (the shape of a), got {2}", fn ->
        Fusex.add(Nx.tensor([1.0, 2.0, 3.0]), Nx.tensor([1.0, 2.0]))
      end
    end

    test "in-place arguments refuse Nx tensors" do
      assert_raise ArgumentError, ~r/^a: expected a %Fusex.Tensor\{\} \(it is updated in place\), got an Nx tensor/, fn ->
        Fusex.Op.run(:add, [a: Nx.tensor([1.0]), b: Nx.tensor([1.0])], [], in_place: [:a])
      end
    end
  end

  describe "zero copy through pointers (a pointer-capable backend on cpu)" do
    @backend Fusex.TestPointerBackend

    test "inputs enter as views and results leave as views" do
      a = Nx.tensor([1.0, 2.0, 3.0, 4.0], backend: @backend)
      b = Nx.tensor([10.0, 20.0, 30.0, 40.0], backend: @backend)

      # the handle made from_nx is the tensor's own memory
      {:ok, %{address: a_addr}} = @backend.to_pointer(a, mode: :local)
      h = FT.from_nx(a)
      assert {:local, ^a_addr, 16} = FT.to_pointer(h, :local)

      sum = Fusex.add(a, b)
      assert %{__struct__: @backend} = sum.data
      assert Nx.to_list(sum) == [11.0, 22.0, 33.0, 44.0]
      # the result is a view of fusex's output, which it keeps alive
      owner = sum.data.fusex_owner
      {:local, owner_addr, 16} = :fusex.to_pointer(owner, :local)
      {:ok, %{address: ^owner_addr}} = @backend.to_pointer(sum, mode: :local)
      :erlang.garbage_collect()
      assert Nx.to_list(sum) == [11.0, 22.0, 33.0, 44.0]
    end

    test "an explicit other device, or copy: true, goes through binaries" do
      a = Nx.tensor([1.0, 2.0], backend: @backend)
      h = FT.from_nx(a, copy: true)
      {:ok, %{address: a_addr}} = @backend.to_pointer(a, mode: :local)
      {:local, h_addr, _} = FT.to_pointer(h, :local)
      assert h_addr != a_addr
    end
  end

  describe "kernel families on Nx tensors" do
    test "mingru and its backward: Nx in, Nx out, as the Erlang API" do
      for type <- [{:f, 32}, {:bf, 16}] do
        z = random(type, {2, 33, 7})
        cand = random(type, {2, 33, 7})
        {h, state} = Fusex.mingru(z, cand, return_state: true, candidate_activation: :g)
        {erl_h, erl_state} = :fusex.mingru(erl(z), erl(cand), %{return_state: true, candidate_activation: :g})
        assert h.type == type and h.shape == {2, 33, 7}
        assert Nx.to_binary(h) == erl_binary(erl_h)
        assert Nx.to_binary(state) == erl_binary(erl_state)
      end

      z = random({:f, 32}, {1, 9, 5})
      cand = random({:f, 32}, {1, 9, 5})
      dh = random({:f, 32}, {1, 9, 5})
      {_h, ctx} = Fusex.mingru(z, cand, save_for_backward: true)
      grads = Fusex.mingru_backward(dh, ctx)
      {_, erl_ctx} = :fusex.mingru(erl(z), erl(cand), %{save_for_backward: true})
      erl_grads = :fusex.mingru_backward(erl(dh), erl_ctx, %{})
      assert Enum.sort(Map.keys(grads)) == [:cand, :z_logits]
      for {k, g} <- grads, do: assert(Nx.to_binary(g) == erl_binary(erl_grads[k]))
    end

    test "selective_scan with every option: Nx in, Nx out, as the Erlang API" do
      x = random({:f, 32}, {2, 17, 6})
      dt = random({:f, 32}, {2, 17, 6})
      a = Nx.negate(Nx.abs(random({:f, 32}, {6, 4})))
      b = random({:f, 32}, {2, 17, 2, 4})
      c = random({:f, 32}, {2, 17, 2, 4})
      d = random({:f, 32}, {6})
      z = random({:f, 32}, {2, 17, 6})
      opts = [d: d, z: z, dt_softplus: true, return_state: true]
      {y, state} = Fusex.selective_scan(x, dt, a, b, c, opts)

      {erl_y, erl_state} =
        :fusex.selective_scan(erl(x), erl(dt), erl(a), erl(b), erl(c),
          %{d: erl(d), z: erl(z), dt_softplus: true, return_state: true})

      assert y.shape == {2, 17, 6} and state.shape == {2, 6, 4}
      assert Nx.to_binary(y) == erl_binary(erl_y)
      assert Nx.to_binary(state) == erl_binary(erl_state)
    end
  end
end
