defmodule FusexSurfacesTest do
  # Validate once: the same bad input through the Erlang API, Fusex.Defn
  # (traced with jit) and fusex_jax (under jax.jit, through the JAX test
  # environment: tools/jax_venv.sh, test/python/surfaces.py) raises the
  # same message on all three, the op layer's: wrong types, wrong shapes
  # (of positional tensors, of optional ones, of a step's state) and option
  # values out of range. Needs Nx (Fusex.Defn) and priv/fusex_xla.so.
  use ExUnit.Case, async: false
  @moduletag :nx
  @moduletag timeout: 600_000
  @compile {:no_warn_undefined, [Nx, Nx.Defn, Fusex.Defn]}

  import Fusex.NxHelpers

  @root Path.expand("../..", __DIR__)

  # {function, positional [{name, type, shape}], tensors, options}: the
  # same function name on every surface (:fusex, Fusex.Defn, fusex_jax).
  @cases [
    {:mingru, [z_logits: {:f32, {2, 3, 4}}, cand: {:f16, {2, 3, 4}}], [], []},
    {:selective_scan,
     [x: {:s32, {2, 5, 4}}, dt: {:f32, {2, 5, 4}}, a: {:f32, {4, 3}}, b: {:f32, {2, 5, 3}}, c: {:f32, {2, 5, 3}}], [], []},
    {:linear_scan, [a: {:f32, {2, 3, 4}}, b: {:bf16, {2, 3, 4}}], [], []},
    {:selective_scan,
     [x: {:f32, {2, 5, 4}}, dt: {:f32, {2, 5, 3}}, a: {:f32, {4, 3}}, b: {:f32, {2, 5, 3}}, c: {:f32, {2, 5, 3}}], [], []},
    {:selective_scan,
     [x: {:f32, {2, 5, 4}}, dt: {:f32, {2, 5, 4}}, a: {:f32, {4, 3}}, b: {:f32, {2, 5, 3, 3}}, c: {:f32, {2, 5, 3, 3}}],
     [], []},
    {:selective_scan,
     [x: {:f32, {2, 5, 4}}, dt: {:f32, {2, 5, 4}}, a: {:f32, {4, 3}}, b: {:f32, {2, 5, 3}}, c: {:f32, {2, 5, 3}}],
     [z: {:f16, {2, 5, 4}}], []},
    {:minlstm, [f_logits: {:f32, {2, 3, 4}}, i_logits: {:f32, {2, 3, 4}}, cand: {:f32, {2, 4}}], [], []},
    {:liquid, [f_logits: {:f32, {2, 3, 4}}, tau: {:f32, {5}}, a: {:f32, {4}}], [], []},
    {:linear_scan, [a: {:f32, {2, 3, 4}}, b: {:f32, {2, 3, 4}}], [h0: {:f32, {2, 5}}], []},
    {:mingru, [z_logits: {:f16, {2, 3, 4}}, cand: {:f16, {2, 3, 4}}], [h0: {:bf16, {2, 4}}], []},
    {:liquid, [f_logits: {:f32, {2, 3, 4}}, tau: {:f32, {4}}, a: {:f32, {4}}], [dt: {:f32, {2, 3, 2}}], []},
    {:mingru_step, [state: {:f32, {2, 5}}, z_logits: {:f32, {2, 4}}, cand: {:f32, {2, 4}}], [], []},
    {:selective_scan_step,
     [state: {:bf16, {2, 4, 3}}, x: {:f32, {2, 4}}, dt: {:f32, {2, 4}}, a: {:f32, {4, 3}}, b: {:f32, {2, 3}}, c: {:f32, {2, 3}}],
     [], []},
    {:minlstm, [f_logits: {:f32, {2, 3, 4}}, i_logits: {:f32, {2, 3, 4}}, cand: {:f32, {2, 3, 4}}], [], [reverse: 2]},
    {:selective_scan,
     [x: {:f32, {2, 5, 4}}, dt: {:f32, {2, 5, 4}}, a: {:f32, {4, 3}}, b: {:f32, {2, 5, 3}}, c: {:f32, {2, 5, 3}}], [],
     [return_state: 0]},
    {:liquid_step, [state: {:f32, {2, 4}}, f_logits: {:f32, {2, 4}}, tau: {:f32, {4}}, a: {:f32, {4}}],
     [dt: {:f16, {2, 1}}], []},
    # the causal convolution and the norms
    {:causal_conv1d, [x: {:f32, {2, 3, 4}}, w: {:f32, {5, 3}}], [], []},
    {:causal_conv1d, [x: {:f32, {2, 3, 4}}, w: {:f32, {4, 3}}], [initial_state: {:f16, {2, 4, 2}}], []},
    {:causal_conv1d, [x: {:f32, {2, 3, 4}}, w: {:f32, {4, 3}}], [bias: {:f32, {3}}], [return_state: 0]},
    {:causal_conv1d_step, [state: {:f32, {2, 4}}, x: {:f32, {2, 4}}, w: {:f32, {4, 3}}], [], []},
    {:rms_norm, [x: {:f32, {2, 8}}, weight: {:f32, {7}}], [], []},
    {:rms_norm, [x: {:bf16, {2, 8}}, weight: {:f32, {8}}], [residual: {:f16, {2, 8}}], []},
    {:layer_norm, [x: {:f32, {2, 8}}, weight: {:f32, {8}}, bias: {:f32, {8}}], [gate: {:f16, {2, 8}}], []},
    {:layer_norm, [x: {:f32, {2, 8}}, weight: {:f32, {8}}, bias: {:f32, {8}}], [], [eps: -1]}
  ]

  @types %{f32: {:f, 32}, f64: {:f, 64}, bf16: {:bf, 16}, f16: {:f, 16}, s32: {:s, 32}}

  defp nx_zeros({type, shape}), do: Nx.broadcast(Nx.tensor(0, type: @types[type]), shape)

  defp erlang({fun, positional, tensors, opts}) do
    args = Enum.map(positional, fn {_, spec} -> erl(nx_zeros(spec)) end)
    options = Map.new(Enum.map(tensors, fn {k, spec} -> {k, erl(nx_zeros(spec))} end) ++ opts)
    erl_message(fn -> apply(:fusex, fun, args ++ [options]) end)
  end

  defp defn({fun, positional, tensors, opts}) do
    args = Enum.map(positional, fn {_, spec} -> nx_zeros(spec) end)
    names = Keyword.keys(tensors)
    tensor_args = Enum.map(tensors, fn {_, spec} -> nx_zeros(spec) end)
    n = length(args)

    call = fn all ->
      {p, t} = all |> Tuple.to_list() |> Enum.split(n)
      apply(Fusex.Defn, fun, p ++ [Map.new(Enum.zip(names, t)), opts])
    end

    try do
      Nx.Defn.jit(call).(List.to_tuple(args ++ tensor_args))
      "no error"
    rescue
      e in ArgumentError -> e.message
    end
  end

  # ---- fusex_jax, through test/python/surfaces.py ----

  defp jax(cases) do
    {python, 0} = System.cmd("bash", [Path.join(@root, "tools/jax_venv.sh"), Path.join(@root, "build/jax-venv")],
                    cd: @root)

    file = Path.join(System.tmp_dir!(), "fusex_surfaces_#{System.unique_integer([:positive])}.py")
    File.write!(file, "[" <> Enum.map_join(cases, ",\n", &py_case/1) <> "]\n")

    try do
      {out, status} =
        System.cmd(String.trim(python), [Path.join(@root, "test/python/surfaces.py"), file],
          cd: @root,
          env: [{"PYTHONPATH", Path.join(@root, "python")}, {"JAX_PLATFORMS", "cpu"}],
          stderr_to_stdout: true
        )

      assert status == 0, "test/python/surfaces.py failed:\n#{out}"
      lines = out |> String.split("\n", trim: true) |> Enum.take(-length(cases))
      assert length(lines) == length(cases), out
      lines
    after
      File.rm(file)
    end
  end

  # A case as a Python literal: (function, [(name, type, shape)], [...], [(name, value)]).
  defp py_case({fun, positional, tensors, opts}) do
    "(#{py(Atom.to_string(fun))}, #{py_specs(positional)}, #{py_specs(tensors)}, [" <>
      Enum.map_join(opts, ", ", fn {k, v} -> "(#{py(Atom.to_string(k))}, #{py(v)})" end) <> "])"
  end

  defp py_specs(specs) do
    "[" <>
      Enum.map_join(specs, ", ", fn {name, {type, shape}} ->
        "(#{py(Atom.to_string(name))}, #{py(Atom.to_string(type))}, (#{shape |> Tuple.to_list() |> Enum.map_join(&"#{&1}, ")}))"
      end) <> "]"
  end

  defp py(v) when is_binary(v), do: inspect(v)
  defp py(true), do: "True"
  defp py(false), do: "False"
  defp py(v) when is_integer(v) or is_float(v), do: to_string(v)

  test "the same bad input raises the same message through the Erlang API, Fusex.Defn and fusex_jax" do
    erlang = Enum.map(@cases, &erlang/1)
    defn = Enum.map(@cases, &defn/1)
    jax = jax(@cases)

    for {{c, e}, {d, j}} <- Enum.zip(Enum.zip(@cases, erlang), Enum.zip(defn, jax)) do
      assert {d, j} == {e, e}, "#{inspect(c)}: Erlang #{inspect(e)}, Fusex.Defn #{inspect(d)}, fusex_jax #{inspect(j)}"
    end

    # wrong types, wrong shapes and option values all among them
    assert Enum.any?(erlang, &(&1 =~ "expected type")) and Enum.any?(erlang, &(&1 =~ "expected shape"))
    assert Enum.any?(erlang, &(&1 =~ "expected true or false"))
  end
end
