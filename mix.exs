defmodule Mix.Tasks.Compile.FusexNif do
  @moduledoc false
  # Builds the NIF (and, where nvcc is found, the CUDA backend) through the
  # Makefile, and makes the app's priv/ in the build path point at them so
  # that code:priv_dir(fusex) finds them.
  use Mix.Task.Compiler

  @impl true
  def run(_args) do
    root = Path.dirname(__ENV__.file)
    make = ["--no-print-directory", "-C", root]

    # Quiet where there is nothing to do, one line where there is work, the
    # make output only where it fails; as many jobs as the machine has
    # cores (the CUDA units build in parallel).
    {_, up_to_date} = System.cmd("make", make ++ ["-q", "nif"], stderr_to_stdout: true)

    if up_to_date != 0 do
      jobs = System.schedulers_online()
      Mix.shell().info("fusex: building the NIF (make -j#{jobs} nif)")
      {out, status} = System.cmd("make", make ++ ["-s", "-j#{jobs}", "nif"], stderr_to_stdout: true)

      if status != 0 do
        IO.write(out)
        Mix.raise("fusex: `make nif` failed (exit #{status}); see the output above")
      end
    end

    priv = Path.join(root, "priv")
    target = Path.join(Mix.Project.app_path(), "priv")

    unless File.exists?(Path.join(target, "fusex_nif.so")) do
      File.rm_rf!(target)
      File.mkdir_p!(Path.dirname(target))
      Mix.Utils.symlink_or_copy(priv, target)
    end

    {:ok, []}
  end
end

defmodule Fusex.MixProject do
  use Mix.Project

  def project do
    [
      app: :fusex,
      version: "0.1.0",
      elixir: "~> 1.14",
      # rebar3 owns _build/default and _build/test; mix keeps to its own tree
      # when fusex is the root project (a parent project sets its own), one
      # for each way of getting its optional deps (see deps/0).
      build_path: "_build/mix" <> build_variant(),
      compilers: [:fusex_nif] ++ Mix.compilers(),
      erlc_paths: ["src"],
      erlc_options: [:debug_info],
      elixirc_paths: elixirc_paths(Mix.env()),
      test_paths: ["test/ex"],
      deps: deps(),
      description: "Fused CUDA kernels for recurrent and state-space models, from Nx",
      package: [licenses: ["Apache-2.0"], files: ~w(mix.exs Makefile include c_src src lib tools)]
    ]
  end

  def application do
    [extra_applications: [:logger]]
  end

  defp elixirc_paths(:test), do: ["lib", "test/ex/support"]
  defp elixirc_paths(_), do: ["lib"]

  # Nx, EXLA and Axon are optional: fusex compiles and runs without them
  # (its Nx paths check Code.ensure_loaded?/1 at run time, and the modules
  # that need Nx.Defn, EXLA or Axon at compile time are compiled only where
  # those are present). Declaring them optional makes Mix compile them
  # before fusex in a project that depends on them.
  #
  # Where they come from (see docs/ELIXIR.md):
  #   * FUSEX_KIT_SRC set (the offline kit, `source ../shared/elixir-kit/env.sh`):
  #     path dependencies on the kit's sources, overriding hex requirements
  #     (FUSEX_KIT_NX=nx-main takes the kit's Nx main instead of 0.13.1);
  #   * FUSEX_NX=none: none at all (the Nx-free build and tests);
  #   * otherwise hex. FUSEX_EXLA=0 leaves EXLA out (it downloads a
  #     prebuilt XLA when compiled).
  defp deps do
    cond do
      System.get_env("FUSEX_NX") == "none" -> []
      kit = non_empty_env("FUSEX_KIT_SRC") -> kit_deps(kit)
      true -> hex_deps()
    end
  end

  defp kit_deps(src) do
    [
      {:nx, path: Path.join(src, kit_nx()), override: true},
      {:complex, path: Path.join(src, "complex"), override: true},
      {:telemetry, path: Path.join(src, "telemetry"), override: true},
      {:axon, path: Path.join(src, "axon"), override: true, optional: true},
      {:polaris, path: Path.join(src, "polaris"), override: true, optional: true}
    ]
  end

  # The kit's Nx: "nx" (0.13.1, the release) or "nx-main" (FUSEX_KIT_NX).
  defp kit_nx, do: non_empty_env("FUSEX_KIT_NX") || "nx"

  defp hex_deps do
    exla = if System.get_env("FUSEX_EXLA") == "0", do: [], else: [{:exla, "~> 0.12", optional: true}]

    # (Polaris, which the tests use, comes with Axon.)
    [{:nx, "~> 0.12", optional: true}, {:axon, "~> 0.7", optional: true}] ++ exla
  end

  # Builds with different dependencies (or Elixirs) keep apart.
  defp build_variant do
    cond do
      System.get_env("FUSEX_NX") == "none" -> "-nonx"
      non_empty_env("FUSEX_KIT_SRC") -> "-kit-" <> kit_nx()
      true -> ""
    end
  end

  defp non_empty_env(name) do
    case System.get_env(name) do
      nil -> nil
      "" -> nil
      value -> value
    end
  end
end
