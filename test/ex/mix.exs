# The test suites' Mix project: fusex as the product mix.exs builds it,
# with the dependencies the suites run with. tools/test_ex.sh selects it
# (MIX_EXS=test/ex/mix.exs, from the repository root) for:
#
#   * FUSEX_TEST_DEPS=kit: the offline kit's sources as path dependencies
#     (FUSEX_KIT_SRC, from ../shared/elixir-kit/env.sh; FUSEX_KIT_NX=nx-main
#     takes the kit's Nx main instead of 0.13.1), overriding hex
#     requirements;
#   * FUSEX_TEST_DEPS=none: no Nx at all (what fusex does without it);
#   * FUSEX_TEST_DEPS=hex-noexla: Nx and Axon from hex, not EXLA (whose
#     build downloads a prebuilt XLA).
#
# Hex with EXLA is the product mix.exs itself. Each way builds under its
# own _build/mix* tree, so switching recompiles nothing needlessly.
Code.require_file("../../tools/fusex_nif_compiler.exs", __DIR__)

defmodule Fusex.TestMixProject do
  use Mix.Project

  def project do
    [
      app: :fusex,
      version: "0.1.0",
      elixir: "~> 1.14",
      build_path: "_build/mix-" <> variant(),
      compilers: [:fusex_nif] ++ Mix.compilers(),
      erlc_paths: ["src"],
      erlc_options: [:debug_info],
      elixirc_paths: ["lib", "test/ex/support"],
      test_paths: ["test/ex"],
      lockfile: "_build/mix-#{variant()}.lock",
      deps: deps(System.fetch_env!("FUSEX_TEST_DEPS"))
    ]
  end

  def application do
    [extra_applications: [:logger]]
  end

  defp deps("none"), do: []

  defp deps("hex-noexla"), do: [{:nx, "~> 0.12", optional: true}, {:axon, "~> 0.7", optional: true}]

  defp deps("kit") do
    src = System.fetch_env!("FUSEX_KIT_SRC")

    [
      {:nx, path: Path.join(src, kit_nx()), override: true},
      {:complex, path: Path.join(src, "complex"), override: true},
      {:telemetry, path: Path.join(src, "telemetry"), override: true},
      {:axon, path: Path.join(src, "axon"), override: true, optional: true},
      {:polaris, path: Path.join(src, "polaris"), override: true, optional: true}
    ]
  end

  # The kit's Nx: "nx" (0.13.1, the release) or "nx-main".
  defp kit_nx do
    case System.get_env("FUSEX_KIT_NX") do
      nil -> "nx"
      "" -> "nx"
      other -> other
    end
  end

  defp variant do
    case System.fetch_env!("FUSEX_TEST_DEPS") do
      "kit" -> "kit-" <> kit_nx()
      "none" -> "nonx"
      other -> other
    end
  end
end
