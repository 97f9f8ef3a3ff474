#!/usr/bin/env bash
# Makes sure what building and testing fusex needs is present, installing the
# missing Debian packages with apt-get. Where everything is already there
# (the GPU machine unpacks a prebuilt BEAM), it installs nothing.
set -euo pipefail

packages="build-essential erlang-base erlang-dev erlang-eunit erlang-common-test erlang-tools
          erlang-syntax-tools erlang-runtime-tools erlang-crypto erlang-asn1 erlang-public-key
          erlang-ssl erlang-inets erlang-parsetools erlang-edoc erlang-xmerl elixir rebar3
          check libsubunit-dev python3 python3-venv python3-pip libopenblas0-serial"

missing=()
for cmd in gcc make erl erlc rebar3 elixir mix; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
[ -f /usr/include/check.h ] || missing+=("check.h")
# The CPU fast path's products: the system BLAS, loaded at run time (docs/CPU.md);
# the single-threaded OpenBLAS, so that fusex's own pool splits the products.
ldconfig -p 2>/dev/null | grep -q "libopenblas.so.0 " || missing+=("libopenblas.so.0")
# The XLA targets' headers come from PyPI through pip, and the JAX tests run
# in a venv (docs/XLA.md).
if command -v python3 >/dev/null 2>&1; then
    python3 -m pip --version >/dev/null 2>&1 || missing+=("pip")
    python3 -c "import venv, ensurepip" >/dev/null 2>&1 || missing+=("venv")
else
    missing+=("python3")
fi
if command -v erl >/dev/null 2>&1; then
    for app in eunit common_test edoc; do
        erl -noshell -eval "case code:lib_dir($app) of {error,_} -> halt(1); _ -> halt(0) end." \
            || missing+=("$app")
    done
    inc=$(erl -noshell -eval 'io:format("~s/erts-~s/include", [code:root_dir(), erlang:system_info(version)]), halt().')
    [ -f "$inc/erl_nif.h" ] || missing+=("erl_nif.h")
fi

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

echo "fusex: missing ${missing[*]}; installing Debian packages"
if ! command -v apt-get >/dev/null 2>&1; then
    echo "fusex: no apt-get here; install: $packages" >&2
    exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $packages >/dev/null
echo "fusex: dependencies installed"
