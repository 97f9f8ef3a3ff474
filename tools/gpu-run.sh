#!/usr/bin/env bash
# One call on the GPU machine does a whole pass: build, the test suites
# forced onto CUDA, compute-sanitizer, benchmarks. Logs go under $OUT (at
# most 8 files come back). Steps can be picked: tools/gpu-run.sh build test-c bench
# Steps replay (the bit-equal suite, three times), kbench (dev/mamba_bench,
# dev/rnn_bench and its forced paths), peers (PyTorch's side of those rows),
# model (bench/model_frame.c and the model rows of make bench) and model-peers
# (bench/peers_model.py), and eunit-layers (the EUnit modules of this wave's
# families alone) are not in the default pass.
# Carry .gpu (the BEAM, the Elixir kit) and build/xla_ffi (the XLA FFI
# headers: the GPU machine cannot fetch them); `setup` unpacks the BEAM.
set -uo pipefail
OUT=${OUT:-/tmp/fusex-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:/usr/lib/erlang/bin:$PATH
export FUSEX_DEVICE=cuda FUSEX_REQUIRE_CUDA=1
steps=${*:-setup build test-c test-erl test-ex test-xla sanitize bench jax-bench}
export FUSEX_KIT_DIR=${FUSEX_KIT_DIR:-$PWD/.gpu}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem \
    --format=csv > "$OUT/gpu.txt" 2>&1
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(date -u +%FT%TZ)" >> "$OUT/gpu.txt"
cat "$OUT/gpu.txt"

failed=0
step() {
    local name=$1; shift
    local start=$SECONDS
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - start))s"
    tail -n "${TAIL:-12}" "$OUT/$name.log"
    [ $rc -eq 0 ] || failed=1
}

for s in $steps; do
    case $s in
    setup) step setup bash -c 'tar --keep-directory-symlink -C / -xJf .gpu/beam.txz &&
                                 tar --keep-directory-symlink -C / -xJf .gpu/beam-extra.txz' ;;
    build) step build make -j16 all build/fusex_check ;;
    test-c) step test-c make test-c ;;
    test-erl) step test-erl make test-erl
              [ -f rebar3.crashdump ] && cp rebar3.crashdump "$OUT/rebar3.crashdump" ;;
    test-ex) step test-ex make test-ex ;;
    eunit-layers) step eunit-layers rebar3 eunit --module=fusex_model_tests,fusex_rnn_tests,fusex_conv_tests,fusex_norm_tests,fusex_linear_tests ;;
    test-xla) step test-xla make test-xla-c-gpu test-jax-gpu ;;
    sanitize) step sanitize make sanitize ;;
    jax-bench) step jax-bench env PYTHONPATH=python python3 bench/jax_bench.py --out "$OUT/jax.md" ;;
    replay) step replay bash -c 'for i in 1 2 3; do CK_RUN_SUITE=replay CK_FORK=no FUSEX_PRIV=priv build/fusex_check || exit 1; done' ;;
    kbench) step kbench bash -c 'make -f dev/Makefile build/mamba_bench build/rnn_bench &&
                                 FUSEX_PRIV=priv build/mamba_bench && FUSEX_PRIV=priv build/rnn_bench --markdown 1 &&
                                 for p in 1 2 18 3 19; do FUSEX_PRIV=priv build/rnn_bench --markdown 1 --path $p; done' ;;
    model) step model bash -c 'cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Ic_src bench/model_frame.c \
                                 build/libfusex_core.a -fopenmp -ldl -lpthread -lm -lmvec -o build/model_frame &&
                                 FUSEX_PRIV=priv FUSEX_DEVICE=cuda build/model_frame &&
                                 make bench BENCH_ARGS="--device cuda --ops model_ --out $OUT/bench-model.md"' ;;
    model-peers) step model-peers env PYTHONPATH=python python3 bench/peers_model.py ;;
    peers) step peers bash -c 'python3 bench/peers_mamba.py && python3 bench/peers_rnn.py' ;;
    bench) step bench make bench BENCH_ARGS="--device cuda --out $OUT/bench.md ${BENCH_ARGS:-}" ;;
    *) echo "unknown step $s"; failed=1 ;;
    esac
done
exit $failed
