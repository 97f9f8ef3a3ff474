defmodule FusexLayersTest do
  # The eager wrappers of the layers of a Mamba block (causal_conv1d and
  # its step, rms_norm, layer_norm, linear, their backwards) on handles
  # (no Nx): each gives the bytes the Erlang API gives on the same inputs.
  use ExUnit.Case, async: false

  alias Fusex.Tensor, as: FT
  import Fusex.TestHandles

  @seq {2, 7, 5}
  @frame {2, 5}

  defp same(a, b), do: assert(bytes(a) == bytes(b))

  defp same_grads(grads, erl_grads) do
    assert Enum.sort(Map.keys(grads)) == Enum.sort(Map.keys(erl_grads))
    for {k, g} <- grads, do: assert(bytes(g) == bytes(erl_grads[k]), "gradient #{k}")
  end

  test "causal_conv1d, its backward and its step as the Erlang API" do
    x = random_handle(@seq)
    w = random_handle({5, 4})
    bias = random_handle({5})
    init = random_handle({2, 5, 3})
    dy = random_handle(@seq)
    ds = random_handle({2, 5, 3})

    same(Fusex.causal_conv1d(x, w), :fusex.causal_conv1d(x.ref, w.ref, %{}))

    {y, final, ctx} =
      Fusex.causal_conv1d(x, w, bias: bias, initial_state: init, activation: :silu, return_state: true, save_for_backward: true)

    {ey, efinal, ectx} =
      :fusex.causal_conv1d(x.ref, w.ref, %{bias: bias.ref, initial_state: init.ref, activation: :silu, return_state: true,
        save_for_backward: true})

    same(y, ey)
    same(final, efinal)
    same_grads(Fusex.causal_conv1d_backward(dy, ctx, dfinal_state: ds), :fusex.causal_conv1d_backward(dy.ref, ectx, %{dfinal_state: ds.ref}))

    state = handle(List.duplicate(0.5, 30), {2, 5, 3})
    erl_state = :fusex.tensor(f32(List.duplicate(0.5, 30)), {:f, 32}, {2, 5, 3}, %{device: device()})

    for _ <- 1..3 do
      x_t = random_handle(@frame)
      same(Fusex.causal_conv1d_step(state, x_t, w, bias: bias, activation: :silu),
        :fusex.causal_conv1d_step(erl_state, x_t.ref, w.ref, %{bias: bias.ref, activation: :silu}))
    end

    same(state, erl_state)

    assert_raise ArgumentError, ~r/^state: expected a %Fusex.Tensor\{\}/, fn -> Fusex.causal_conv1d_step(:none, x, w) end
    assert_raise ArgumentError, "activation: expected none or silu, got relu", fn -> Fusex.causal_conv1d(x, w, activation: :relu) end
  end

  test "rms_norm and layer_norm, with residual and gate, and their backwards as the Erlang API" do
    x = random_handle({3, 8})
    w = random_handle({8})
    b = random_handle({8})
    r = random_handle({3, 8})
    g = random_handle({3, 8})
    dy = random_handle({3, 8})

    same(Fusex.rms_norm(x, w), :fusex.rms_norm(x.ref, w.ref, %{}))
    same(Fusex.layer_norm(x, w, b, eps: 0.1), :fusex.layer_norm(x.ref, w.ref, b.ref, %{eps: 0.1}))

    {y, s, ctx} = Fusex.rms_norm(x, w, bias: b, residual: r, gate: g, save_for_backward: true)
    {ey, es, ectx} = :fusex.rms_norm(x.ref, w.ref, %{bias: b.ref, residual: r.ref, gate: g.ref, save_for_backward: true})
    same(y, ey)
    same(s, es)
    same_grads(Fusex.rms_norm_backward(dy, ctx, ds: dy), :fusex.rms_norm_backward(dy.ref, ectx, %{ds: dy.ref}))

    {y, ctx} = Fusex.layer_norm(x, w, b, gate: g, save_for_backward: true)
    {ey, ectx} = :fusex.layer_norm(x.ref, w.ref, b.ref, %{gate: g.ref, save_for_backward: true})
    same(y, ey)
    same_grads(Fusex.layer_norm_backward(dy, ctx), :fusex.layer_norm_backward(dy.ref, ectx, %{}))

    assert_raise ArgumentError, "eps: expected a finite number >= 0, got -1", fn -> Fusex.rms_norm(x, w, eps: -1) end
  end

  test "linear and its backward as the Erlang API, every activation" do
    x = random_handle({4, 6})
    w = random_handle({3, 6})
    b = random_handle({3})
    dy = random_handle({4, 3})

    for act <- [:none, :relu, :gelu, :silu, :tanh, :sigmoid] do
      {y, ctx} = Fusex.linear(x, w, bias: b, activation: act, save_for_backward: true)
      {ey, ectx} = :fusex.linear(x.ref, w.ref, %{bias: b.ref, activation: act, save_for_backward: true})
      same(y, ey)
      same_grads(Fusex.linear_backward(dy, ctx), :fusex.linear_backward(dy.ref, ectx, %{}))
    end

    same(Fusex.linear(x, w), :fusex.linear(x.ref, w.ref, %{}))
    assert %FT{} = Fusex.linear(x, w)

    assert_raise ArgumentError, "activation: expected none, relu, gelu, silu, tanh or sigmoid, got softmax", fn ->
      Fusex.linear(x, w, activation: :softmax)
    end
  end
end

defmodule FusexLayersNxTest do
  # The same wrappers on Nx tensors: results back as Nx tensors; linear
  # against x W^T + b and its gradients written out in Nx (f64 inputs on
  # the cpu: fusex's f64 path). Runs where Nx is present.
  use ExUnit.Case, async: false
  @moduletag :nx
  @compile {:no_warn_undefined, [Nx, Fusex.Defn]}

  import Fusex.NxHelpers

  defp act(:none, z), do: z
  defp act(:relu, z), do: Nx.max(z, 0)
  defp act(:tanh, z), do: Nx.tanh(z)
  defp act(:sigmoid, z), do: Nx.sigmoid(z)
  defp act(:silu, z), do: Nx.multiply(z, Nx.sigmoid(z))

  defp act_grad(:none, z), do: Nx.broadcast(Nx.tensor(1.0, type: z.type), z.shape)
  defp act_grad(:relu, z), do: Nx.select(Nx.greater(z, 0), 1.0, 0.0) |> Nx.as_type(z.type)
  defp act_grad(:tanh, z), do: Nx.subtract(1, Nx.pow(Nx.tanh(z), 2))
  defp act_grad(:sigmoid, z), do: Nx.multiply(Nx.sigmoid(z), Nx.subtract(1, Nx.sigmoid(z)))

  defp act_grad(:silu, z) do
    s = Nx.sigmoid(z)
    Nx.multiply(s, Nx.add(1, Nx.multiply(z, Nx.subtract(1, s))))
  end

  test "linear on Nx tensors against x W^T + b and its gradients (f64 and f32; K 1 and 1000)" do
    for type <- [{:f, 64}, {:f, 32}], {rows, k, out} <- [{5, 1, 3}, {3, 1000, 4}, {2, 7, 1}], a <- [:none, :relu, :tanh, :sigmoid, :silu] do
      label = "linear #{inspect(type)} #{rows}x#{k}->#{out} #{a}"
      x = uniform({rows, k}, type)
      w = uniform({out, k}, type)
      b = uniform({out}, type)
      dy = uniform({rows, out}, type)
      {y, ctx} = Fusex.linear(x, w, bias: b, activation: a, save_for_backward: true)
      pre = Nx.add(Nx.dot(x, [1], w, [1]), b)
      assert_close(y, act(a, pre), tol(type), "#{label} y")
      grads = Fusex.linear_backward(dy, ctx)
      dpre = Nx.multiply(dy, act_grad(a, pre))
      assert_close(grads.x, Nx.dot(dpre, w), tol(type), "#{label} dx")
      assert_close(grads.w, Nx.dot(dpre, [0], x, [0]), tol(type), "#{label} dw")
      assert_close(grads.bias, Nx.sum(dpre, axes: [0]), tol(type), "#{label} dbias")
    end
  end

  test "causal_conv1d and the norms on Nx tensors: Nx tensors back, the Fusex.Defn values" do
    x = uniform({2, 6, 4})
    w = uniform({4, 3})
    y = Fusex.causal_conv1d(x, w, activation: :silu)
    assert %{__struct__: Nx.Tensor} = y
    assert_close(y, Fusex.Defn.causal_conv1d(x, w, %{}, activation: :silu), 1.0e-5, "conv")
    {yn, s} = Fusex.rms_norm(x, Nx.broadcast(1.0, {4}), residual: x)
    {dn, ds} = Fusex.Defn.rms_norm(x, Nx.broadcast(1.0, {4}), %{residual: x})
    assert_close(yn, dn, 1.0e-5, "rms_norm y")
    assert_close(s, ds, 1.0e-5, "rms_norm s")
    assert_close(Fusex.layer_norm(x, Nx.broadcast(1.0, {4}), Nx.broadcast(0.5, {4})),
      Fusex.Defn.layer_norm(x, Nx.broadcast(1.0, {4}), Nx.broadcast(0.5, {4})), 1.0e-5, "layer_norm")
  end
end
