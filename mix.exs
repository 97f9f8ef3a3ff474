defmodule Mix.Tasks.Compile.FusexNif do
  @moduledoc false
  # Builds the NIF (and, where nvcc is found, the CUDA backend) through the
  # Makefile, and makes the app's priv/ in the build path point at them so
  # that code:priv_dir(fusex) finds them.
  use Mix.Task.Compiler

  @impl true
  def run(_args) do
    root = Path.dirname(__ENV__.file)
    {_, status} = System.cmd("make", ["-C", root, "nif"], into: IO.stream(:stdio, :line))

    if status != 0 do
      Mix.raise("fusex: `make nif` failed (exit #{status}); see the output above")
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
      # when fusex is the root project (a parent project sets its own).
      build_path: "_build/mix",
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

  # Nx is optional and never fetched by this project: fusex's Nx integration
  # is resolved at run time (Code.ensure_loaded?(Nx)), so a user's project
  # only needs {:nx, "~> 0.9"} in its own deps. For fusex's own tests with
  # Nx, point FUSEX_NX_PATH at an Nx checkout (see docs/ELIXIR.md).
  defp deps do
    case System.get_env("FUSEX_NX_PATH") do
      nil -> []
      "" -> []
      path -> [{:nx, path: path, optional: true}]
    end
  end
end
