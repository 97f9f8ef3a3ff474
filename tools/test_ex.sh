#!/usr/bin/env bash
# Runs the Elixir suite (test/ex) with Nx where this machine can have it:
#
#   * FUSEX_NX=none: without Nx (the Nx tests are listed by name as skipped);
#   * FUSEX_KIT_SRC already set (the kit's env.sh sourced): the kit;
#   * hex reachable and Elixir >= 1.17 (what Nx 0.12+ needs): Nx, Axon and
#     EXLA from hex (FUSEX_EXLA=0 leaves EXLA out: it downloads a prebuilt
#     XLA when it compiles);
#   * else the offline kit (Elixir 1.18.4, Nx 0.13.1, Axon, Polaris) where it
#     is: $FUSEX_KIT_DIR, else ../shared/elixir-kit beside the repository;
#   * else without Nx, saying why; with FUSEX_REQUIRE_NX=1 (CI) that is a
#     failure, so the Nx tests never go unrun unnoticed.
#
# Each way builds under its own _build/mix* tree (test/ex/mix.exs), so
# switching between them recompiles nothing needlessly.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
kit_dir=${FUSEX_KIT_DIR:-$root/../shared/elixir-kit}

hex_reachable() { timeout 5 bash -c 'exec 3<>/dev/tcp/repo.hex.pm/443' >/dev/null 2>&1; }
elixir_recent() {
    elixir -e 'System.halt(if Version.match?(System.version(), ">= 1.17.0"), do: 0, else: 1)' 2>/dev/null
}

if [ "${FUSEX_NX:-}" = none ]; then
    mode=none
    why="FUSEX_NX=none"
elif [ -n "${FUSEX_KIT_SRC:-}" ]; then
    mode=kit
elif hex_reachable && elixir_recent; then
    mode=hex
elif [ -f "$kit_dir/env.sh" ]; then
    # shellcheck disable=SC1091
    source "$kit_dir/env.sh"
    mode=kit
else
    mode=none
    why="hex unreachable (or Elixir older than 1.17) and no kit at $kit_dir"
fi

# The product mix.exs has hex's Nx, Axon and EXLA; every other way runs
# through the suites' own project (test/ex/mix.exs).
case $mode in
    none) export MIX_EXS=test/ex/mix.exs FUSEX_TEST_DEPS=none ;;
    kit) export MIX_EXS=test/ex/mix.exs FUSEX_TEST_DEPS=kit ;;
    hex) if [ "${FUSEX_EXLA:-}" = 0 ]; then export MIX_EXS=test/ex/mix.exs FUSEX_TEST_DEPS=hex-noexla; fi ;;
esac

case $mode in
    none)
        if [ "${FUSEX_REQUIRE_NX:-}" = 1 ] && [ "${FUSEX_NX:-}" != none ]; then
            echo "fusex ExUnit: FAILED: FUSEX_REQUIRE_NX=1 but no Nx: $why" >&2
            exit 1
        fi
        echo "fusex ExUnit: without Nx ($why): the Nx tests are skipped, listed below"
        export FUSEX_NX=none
        ;;
    kit)
        echo "fusex ExUnit: Elixir $(elixir --short-version), Nx, Axon, Polaris from the offline kit ($FUSEX_KIT_SRC)"
        MIX_ENV=test mix deps.get >/dev/null
        ;;
    hex)
        exla=", EXLA"
        [ "${FUSEX_EXLA:-}" = 0 ] && exla=" (not EXLA: FUSEX_EXLA=0)"
        echo "fusex ExUnit: Elixir $(elixir --short-version), Nx, Axon$exla from hex"
        MIX_ENV=test mix deps.get
        ;;
esac
# FUSEX_EX_RUN=script: runs the script (an example, a tool) instead of the
# suites, with this script's arguments.
if [ -n "${FUSEX_EX_RUN:-}" ]; then
    if [ "$mode" = none ]; then
        echo "fusex $FUSEX_EX_RUN: skipped without Nx"
        exit 0
    fi
    echo "fusex: mix run $FUSEX_EX_RUN $*"
    MIX_ENV=test exec mix run "$FUSEX_EX_RUN" "$@"
fi
MIX_ENV=test exec mix test "$@"
