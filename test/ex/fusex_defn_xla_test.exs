defmodule FusexDefnXlaTest do
  # What fusex's EXLA.CustomCall implementation answers for each block
  # (Fusex.Defn.XLA.lowering/3: the target, its attributes, or :skip), and
  # the registration of the targets. Needs neither Nx nor EXLA: operands
  # are templates (type and shape), the platform an atom. What EXLA then
  # emits, and the targets themselves, are tested through JAX (docs/XLA.md).
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog
  alias Fusex.Defn.{Block, XLA}

  defp t(type, shape), do: %{type: type, shape: shape}

  defp ssm_fwd(type \\ {:f, 32}, dstate \\ 16) do
    block = %Block{
      op: :selective_scan,
      direction: :fwd,
      attrs: [dt_softplus: 1, has_d: 1, has_z: 0, has_dt_bias: 0, has_h0: 0, return_state: 1, save: 1]
    }

    seq = t(type, {2, 40, 8})
    bc = t(type, {2, 40, dstate})
    {block, [seq, seq, t({:f, 32}, {8, dstate}), bc, bc, t({:f, 32}, {8})]}
  end

  setup do
    on_exit(fn -> XLA.__put_registration__(nil) end)
  end

  test "every described op's target name, and attributes as MLIR" do
    # (the linear layers are no XLA targets: their descriptions have none)
    {descs, untargeted} = Enum.split_with(:fusex.op_list(), &Map.has_key?(&1, :target))
    assert Enum.map(untargeted, & &1.op) |> Enum.uniq() == [:linear]
    names = for d <- descs, do: Block.target_name(%Block{op: d.op, direction: d.dir})

    assert names == Enum.map(descs, & &1.target)
    assert length(Enum.uniq(names)) == length(descs)
    assert "fusex_minlstm_bwd" in names and "fusex_selective_scan_step" in names

    block = %Block{op: :liquid, direction: :fwd, attrs: [reverse: 1, dt: 0.25, has_dt: 0, has_h0: 1, return_state: 0]}

    assert Block.mlir_attributes(block) == [
             {"reverse", "1 : i64"},
             {"dt", "0.25 : f64"},
             {"has_dt", "0 : i64"},
             {"has_h0", "1 : i64"},
             {"return_state", "0 : i64"}
           ]

    # a float attribute keeps every bit (the shortest text that reads back the same)
    [{"dt", text}] = Block.mlir_attributes(%Block{op: :liquid, direction: :step, attrs: [dt: 0.1 + 0.2]})
    [number, " f64"] = String.split(text, ":")
    assert String.to_float(String.trim(number)) == 0.1 + 0.2
  end

  test "the layers' blocks: an enum attribute as its index (i64); an op with no target is never lowered" do
    XLA.__put_registration__(:ok)
    f32 = {:f, 32}

    conv = %Block{op: :causal_conv1d, direction: :fwd, attrs: [activation: 1, has_bias: 0, has_initial_state: 0, return_state: 0]}
    assert {:ok, "fusex_causal_conv1d_fwd", attrs} = XLA.lowering(conv, [t(f32, {2, 5, 3}), t(f32, {3, 4})], :host)
    assert attrs == [{"activation", "1 : i64"}, {"has_bias", "0 : i64"}, {"has_initial_state", "0 : i64"}, {"return_state", "0 : i64"}]

    norm = %Block{op: :rms_norm, direction: :fwd,
                  attrs: [eps: 1.0e-5, residual_in_f32: 0, has_bias: 0, has_residual: 0, has_gate: 0, save: 0]}
    assert {:ok, "fusex_rms_norm_fwd", _} = XLA.lowering(norm, [t(f32, {4, 8}), t(f32, {8})], :host)
    # the op layer's check refuses an activation out of range: the block is no target then
    assert XLA.lowering(%{conv | attrs: Keyword.put(conv.attrs, :activation, 2)}, [t(f32, {2, 5, 3}), t(f32, {3, 4})], :host) == :skip

    linear = %Block{op: :linear, direction: :fwd, attrs: [activation: 0, allow_tf32: 0, has_bias: 0, save: 0]}
    assert XLA.lowering(linear, [t(f32, {4, 8}), t(f32, {3, 8})], :host) == :skip
  end

  test "with the targets registered: host runs f32, 16-bit and f64 blocks as targets" do
    XLA.__put_registration__(:ok)

    for type <- [{:f, 32}, {:bf, 16}, {:f, 16}, {:f, 64}] do
      {block, args} = ssm_fwd(type)
      assert {:ok, "fusex_selective_scan_fwd", attrs} = XLA.lowering(block, args, :host)
      assert {"save", "1 : i64"} in attrs and {"has_d", "1 : i64"} in attrs
    end

    mingru = %Block{op: :mingru, direction: :step, attrs: [reverse: 0, candidate_g: 1]}
    frame = t({:bf, 16}, {2, 3})
    assert {:ok, "fusex_mingru_step", _} = XLA.lowering(mingru, [t({:f, 32}, {2, 3}), frame, frame], :host)
  end

  test "what the handlers do not take runs the default implementation (:skip)" do
    XLA.__put_registration__(:ok)
    {block, args} = ssm_fwd()

    # other platforms; CUDA without fusex's CUDA backend on this node
    assert XLA.lowering(block, args, :rocm) == :skip
    assert XLA.lowering(block, args, :pjrt_plugin) == :skip

    unless Enum.any?(:fusex.devices(), &(&1.kind == :cuda)),
      do: assert(XLA.lowering(block, args, :cuda) == :skip)

    # integer operands; f64 anywhere on CUDA; dstate above 256 on CUDA
    assert XLA.lowering(block, List.replace_at(args, 5, t({:s, 32}, {8})), :host) == :skip
    {f64_block, f64_args} = ssm_fwd({:f, 64})
    assert XLA.lowering(f64_block, f64_args, :cuda) == :skip
    {wide, wide_args} = ssm_fwd({:f, 32}, 512)
    assert XLA.lowering(wide, wide_args, :cuda) == :skip
    assert {:ok, _, _} = XLA.lowering(wide, wide_args, :host)

    # a backward whose forward saved no states (seqlen <= K) still runs as
    # the target: it takes no saved operand then (docs/XLA.md)
    bwd = %Block{block | direction: :bwd, attrs: Keyword.drop(block.attrs, [:return_state, :save]) ++ [has_dstate: 0]}
    assert {:ok, "fusex_selective_scan_bwd", _} = XLA.lowering(bwd, args ++ [t({:f, 32}, {2, 40, 8})], :host)

    # a selective-scan step: its state {f,32}, or {f,64} on the host (the
    # op layer's check takes it there), never {bf,16}
    step = %Block{op: :selective_scan, direction: :step, attrs: [dt_softplus: 0, has_d: 0, has_z: 0, has_dt_bias: 0]}
    frame = t({:f, 32}, {2, 8})
    rows = t({:f, 32}, {2, 16})
    step_args = [t({:bf, 16}, {2, 8, 16}), frame, frame, t({:f, 32}, {8, 16}), rows, rows]
    assert XLA.lowering(step, step_args, :host) == :skip
    assert {:ok, "fusex_selective_scan_step", _} = XLA.lowering(step, List.replace_at(step_args, 0, t({:f, 32}, {2, 8, 16})), :host)
    assert {:ok, "fusex_selective_scan_step", _} = XLA.lowering(step, List.replace_at(step_args, 0, t({:f, 64}, {2, 8, 16})), :host)

    # a block no description has, or operands its description does not take
    assert XLA.lowering(%Block{op: :nope, direction: :fwd, attrs: []}, args, :host) == :skip
    assert XLA.lowering(block, Enum.drop(args, 1), :host) == :skip
  end

  test "where registration fails every block runs its default, and a warning says why, once" do
    XLA.__put_registration__(nil)
    {block, args} = ssm_fwd()

    log =
      capture_log(fn ->
        assert XLA.lowering(block, args, :host) == :skip
        assert XLA.lowering(block, args, :host) == :skip
      end)

    case XLA.register() do
      :ok ->
        # a build with the handlers, in a VM where EXLA's XLA is loaded
        assert log == ""

      {:error, reason} ->
        assert reason != ""
        assert [_one] = Regex.scan(~r/its XLA custom-call targets are not registered/, log)
        assert log =~ reason
    end
  end
end
