# Nx is optional. Where it is absent (the CI machine: Elixir 1.14, no hex),
# the tests tagged :nx are excluded and listed by name as skipped; where it
# is present, the :no_nx tests (what fusex does without Nx) are.
nx? = Code.ensure_loaded?(Nx)

{exclude, note} =
  if nx?,
    do: {[:no_nx], "Nx #{Application.spec(:nx, :vsn)} present: running the Nx tests"},
    else: {[:nx], "Nx absent: the tests tagged :nx are skipped (listed below)"}

IO.puts("fusex ExUnit on #{inspect(Fusex.default_device())}; #{note}")

ExUnit.start(exclude: exclude, formatters: [ExUnit.CLIFormatter, Fusex.SkipReporter])
