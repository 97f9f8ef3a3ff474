# Nx is optional. Where it is absent (Debian's Elixir 1.14 with no hex and
# no kit; see tools/test_ex.sh), the tests tagged :nx are excluded and listed
# by name as skipped; where it is present, the :no_nx tests (what fusex does
# without Nx) are. The :axon tests need Axon (and Polaris) as well.
nx? = Code.ensure_loaded?(Nx)
axon? = nx? and Code.ensure_loaded?(Axon) and Code.ensure_loaded?(Polaris)

{exclude, note} =
  if nx?,
    do: {[:no_nx], "Nx #{Application.spec(:nx, :vsn)} present: running the Nx tests"},
    else: {[:nx], "Nx absent: the tests tagged :nx are skipped (listed below)"}

exclude = if axon?, do: exclude, else: [:axon | exclude]

# CI (.ci/run) runs every test: none may be excluded for a missing library.
if System.get_env("FUSEX_REQUIRE_NX") == "1" and not axon? do
  raise "FUSEX_REQUIRE_NX=1 but Nx, Axon or Polaris does not load (Nx: #{nx?}, Axon and Polaris: #{axon?})"
end

IO.puts("fusex ExUnit on #{inspect(Fusex.default_device())}; #{note}" <>
          if(nx? and not axon?, do: "; Axon absent: the :axon tests are skipped (listed below)", else: ""))

ExUnit.start(exclude: exclude, formatters: [ExUnit.CLIFormatter, Fusex.SkipReporter])
