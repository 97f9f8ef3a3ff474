#!/usr/bin/env bash
# Finds the XLA FFI API headers (xla/ffi/api/{c_api.h,api.h,ffi.h}) the XLA
# handlers (c_src/xla) are built against, and prints their include directory.
#
#   tools/xla_headers.sh DEST
#
# - XLA_FFI_INCLUDE, when set, is used as it is (a user with EXLA has the
#   headers of EXLA's own XLA under deps/exla/cache/xla_extension/include).
# - Otherwise the headers of jaxlib 0.9.0 (FFI API 0.2: the XLA of EXLA
#   0.12-0.13; newer XLAs take 0.2 handlers, older ones refuse newer
#   handlers) are copied into DEST/include once, from the jaxlib 0.9.0 wheel
#   on PyPI, downloaded with pip into a cache that `make clean` keeps
#   (${XDG_CACHE_HOME:-~/.cache}/fusex). Only the three headers are used.
#
# Exit status 0: the include directory on stdout. Otherwise the reason on
# stdout (one line) and status 1; the Makefile prints it and builds the rest.
set -uo pipefail

dest=${1:?usage: tools/xla_headers.sh DEST}
version=0.9.0
headers="c_api.h api.h ffi.h"

have_headers() {
    local dir=$1 h
    for h in $headers; do
        [ -f "$dir/xla/ffi/api/$h" ] || return 1
    done
}

if [ -n "${XLA_FFI_INCLUDE:-}" ]; then
    if have_headers "$XLA_FFI_INCLUDE"; then
        echo "$XLA_FFI_INCLUDE"
        exit 0
    fi
    echo "XLA_FFI_INCLUDE=$XLA_FFI_INCLUDE has no xla/ffi/api/{c_api.h,api.h,ffi.h}"
    exit 1
fi

inc=$dest/include
if have_headers "$inc"; then
    echo "$inc"
    exit 0
fi

if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 not found to download jaxlib $version's headers (or set XLA_FFI_INCLUDE)"
    exit 1
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "python3 -m pip not found to download jaxlib $version's headers (install python3-pip, or set XLA_FFI_INCLUDE)"
    exit 1
fi

cache=${XDG_CACHE_HOME:-$HOME/.cache}/fusex/jaxlib-$version
mkdir -p "$cache" || { echo "cannot create $cache"; exit 1; }
wheel=$(ls "$cache"/jaxlib-$version-*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ]; then
    # Headers only: any platform's wheel has the same ones.
    log=$(python3 -m pip download --quiet --no-deps --only-binary=:all: --timeout 15 --retries 1 \
              --platform manylinux_2_27_x86_64 --python-version 3.11 -d "$cache" "jaxlib==$version" 2>&1)
    wheel=$(ls "$cache"/jaxlib-$version-*.whl 2>/dev/null | head -n 1)
    if [ -z "$wheel" ]; then
        echo "pip could not download jaxlib==$version from PyPI for its XLA FFI headers (set XLA_FFI_INCLUDE to build without network): $(echo "$log" | tail -n 1)"
        exit 1
    fi
fi

tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
if ! python3 - "$wheel" "$tmp" <<'EOF'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in ("c_api.h", "api.h", "ffi.h"):
        z.extract("jaxlib/include/xla/ffi/api/" + name, out)
EOF
then
    echo "could not unpack the XLA FFI headers from $wheel"
    exit 1
fi
if ! grep -q '#define XLA_FFI_API_MINOR 2' "$tmp/jaxlib/include/xla/ffi/api/c_api.h"; then
    echo "$wheel does not hold XLA FFI API 0.2 headers"
    exit 1
fi
mkdir -p "$inc/xla/ffi" && rm -rf "$inc/xla/ffi/api" && cp -r "$tmp/jaxlib/include/xla/ffi/api" "$inc/xla/ffi/api" ||
    { echo "cannot copy the XLA FFI headers into $inc"; exit 1; }
echo "$inc"
