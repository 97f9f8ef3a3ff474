#!/usr/bin/env bash
# README.md's Elixir install lines on a brand-new Mix project: `mix new` in a
# temporary folder, the deps README's "Install" block names (fusex by path;
# Nx and Axon at README's version requirements, from the offline kit as
# tools/test_ex.sh takes them; EXLA left out: its build downloads XLA),
# `mix deps.get` and `mix compile` with no network, then README's Elixir
# examples run in the project (tools/fresh_project.exs check). Run by
# `make test-ex`; the NIF is the repository's own build, so the project
# compiles only the Elixir dependencies and fusex's modules.
#
# Needs the kit (FUSEX_KIT_SRC set, or $FUSEX_KIT_DIR / ../shared/elixir-kit);
# without it says so and succeeds, unless FUSEX_REQUIRE_NX=1 (CI).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
kit_dir=${FUSEX_KIT_DIR:-$root/../shared/elixir-kit}

if [ "${FUSEX_NX:-}" = none ]; then
    echo "fresh project: skipped (FUSEX_NX=none)"
    exit 0
fi
if [ -z "${FUSEX_KIT_SRC:-}" ]; then
    if [ -f "$kit_dir/env.sh" ]; then
        # shellcheck disable=SC1091
        source "$kit_dir/env.sh"
    elif [ "${FUSEX_REQUIRE_NX:-}" = 1 ]; then
        echo "fresh project: FAILED: FUSEX_REQUIRE_NX=1 but no kit at $kit_dir" >&2
        exit 1
    else
        echo "fresh project: skipped (no offline kit at $kit_dir)"
        exit 0
    fi
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/fusex-fresh.XXXXXX")
trap 'rm -rf "$dir"' EXIT
# (a user's own environment: none of the suites' project settings)
unset MIX_EXS FUSEX_TEST_DEPS MIX_ENV MIX_BUILD_PATH

echo "fresh project: mix new in $dir, README's install lines"
(cd "$dir" && mix new readme_app >/dev/null)
elixir tools/fresh_project.exs deps "$root" "$dir/readme_app/mix.exs"
cd "$dir/readme_app"
log=$dir/build.log
if ! { mix deps.get && mix compile; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "fresh project: FAILED: mix deps.get / mix compile with README's install lines" >&2
    exit 1
fi
# The README's session was run on a machine without a GPU: its device is cpu.
FUSEX_DEVICE=cpu mix run "$root/tools/fresh_project.exs" check "$root"
