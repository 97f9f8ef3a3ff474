#!/usr/bin/env bash
# Makes the Python environment the JAX tests run in (CPU): a venv with
# jax and jaxlib 0.9.0 (the XLA of EXLA 0.12-0.13, FFI API 0.2) from PyPI,
# made once and kept; prints its python. Fails, saying why, where it cannot
# be made: the JAX tests are part of `make test` and are never skipped.
#
#   tools/jax_venv.sh DIR
set -uo pipefail

dir=${1:?usage: tools/jax_venv.sh DIR}
version=0.9.0
python=$dir/bin/python

ready() {
    "$python" -c "import jax, jaxlib, numpy; assert jax.__version__ == '$version', jax.__version__" \
        >/dev/null 2>&1
}

if ready; then
    echo "$python"
    exit 0
fi

fail() {
    echo "fusex: cannot make the JAX test environment in $dir: $*" >&2
    echo "fusex: it needs python3 (3.11 or newer) with venv and pip, and PyPI (jax==$version, jaxlib==$version)" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || fail "python3 not found"
rm -rf "$dir"
python3 -m venv "$dir" >/dev/null 2>&1 || fail "python3 -m venv failed (on Debian: apt-get install python3-venv)"
# The jaxlib wheel tools/xla_headers.sh downloaded for its headers, if any.
wheels=${XDG_CACHE_HOME:-$HOME/.cache}/fusex/jaxlib-$version
echo "fusex: installing jax==$version and jaxlib==$version into $dir (once)" >&2
if ! log=$("$python" -m pip install --quiet --disable-pip-version-check --find-links "$wheels" \
              "jax==$version" "jaxlib==$version" numpy 2>&1); then
    rm -rf "$dir"
    fail "pip install failed: $(echo "$log" | tail -n 3)"
fi
ready || fail "jax $version does not import after installing it"
echo "$python"
