# The Mix compiler that builds the NIF through the Makefile.
Code.require_file("tools/fusex_nif_compiler.exs", __DIR__)

defmodule Fusex.MixProject do
  use Mix.Project

  def project do
    [
      app: :fusex,
      version: "0.1.0",
      elixir: "~> 1.14",
      # rebar3 owns _build/default and _build/test; mix keeps to its own
      # tree when fusex is the root project (a parent project sets its own).
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

  # Nx, EXLA and Axon are optional: fusex compiles and runs without them
  # (its Nx paths check Code.ensure_loaded?/1 at run time, and the modules
  # that need Nx.Defn, EXLA or Axon at compile time are compiled only where
  # those are present). Declaring them optional makes Mix compile them
  # before fusex in a project that depends on them. Fusex.Defn and
  # Fusex.Axon need Nx >= 0.12 (Nx.block/4); the NIF under the Evaluator
  # and Fusex.Optim need Nx >= 0.13 (Nx.runtime_call/4). The test suites
  # choose their own (test/ex/mix.exs, tools/test_ex.sh). (Polaris comes
  # with Axon.)
  defp deps do
    [{:nx, "~> 0.12", optional: true}, {:axon, "~> 0.7", optional: true}, {:exla, "~> 0.12", optional: true}]
  end
end
