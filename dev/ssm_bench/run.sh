#!/usr/bin/env bash
# Builds and runs dev/ssm_bench on the GPU machine; logs under $OUT.
#   dev/ssm_bench/run.sh [steps...]   steps: build check bench variants ncu sanitize erl-bench
#   (default: build check bench ncu); QUICK=0 for the whole ssm suite
#   build: the library and the Check binary (TARGETS), and build/ssm_bench
#   unless it is there already (e.g. built elsewhere with the variants:
#   BENCH_DEFS="-DSSM_BASELINE -DSSM_VARIANTS", see ssm_bench.cu)
#   variants: the forward variants compiled into build/ssm_bench, one table
#   NCU_SECTIONS="..." overrides the profiled sections; NCU_KERNELS a regex;
#   NCU_MODE the bench mode profiled (ncu: the main kernels, ncu-variants).
set -uo pipefail
OUT=${OUT:-/tmp/ssm-bench-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:/usr/lib/erlang/bin:$PATH
steps=${*:-build check bench ncu}

for s in $steps; do
    start=$SECONDS
    case $s in
    build)
        timeout 200 make -j16 ${TARGETS:-all build/fusex_check} > "$OUT/build.log" 2>&1
        echo "== build rc=$? $((SECONDS - start))s"
        if [ ! -x build/ssm_bench ]; then
            timeout 100 make -f dev/Makefile build/ssm_bench BENCH_DEFS="${BENCH_DEFS:-}" >> "$OUT/build.log" 2>&1
            echo "== bench build rc=$? $((SECONDS - start))s"
        fi
        tail -n 3 "$OUT/build.log" ;;
    variants)
        timeout 120 build/ssm_bench variants > "$OUT/variants.txt" 2>&1
        echo "== variants rc=$? $((SECONDS - start))s"
        cat "$OUT/variants.txt" ;;
    check)
        FUSEX_PRIV=priv CK_RUN_SUITE=ssm FUSEX_DEVICE=cuda FUSEX_REQUIRE_CUDA=1 FUSEX_QUICK=${QUICK:-1} \
            timeout ${CHECK_TIMEOUT:-90} build/fusex_check > "$OUT/check.log" 2>&1
        echo "== check rc=$? $((SECONDS - start))s"
        tail -n 4 "$OUT/check.log" ;;
    bench)
        timeout 120 build/ssm_bench all > "$OUT/bench.txt" 2>&1
        echo "== bench rc=$? $((SECONDS - start))s"
        cat "$OUT/bench.txt" ;;
    ncu)
        sections=${NCU_SECTIONS:-"--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats --section WarpStateStats --section InstructionStats --section LaunchStats"}
        stalls=""
        for r in long_scoreboard short_scoreboard mio_throttle math_pipe_throttle barrier wait not_selected \
                 selected dispatch_stall lg_throttle no_instruction branch_resolving membar drain misc; do
            stalls="$stalls,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
        done
        metrics="sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum$stalls"
        timeout ${NCU_TIMEOUT:-120} ncu --clock-control none $sections --metrics "$metrics" -k "regex:${NCU_KERNELS:-ssm}" -c ${NCU_COUNT:-8} \
            build/ssm_bench ${NCU_MODE:-ncu} > "$OUT/ncu.txt" 2>&1
        echo "== ncu rc=$? $((SECONDS - start))s"
        grep -E "ssm_|stalled|pipe_|wavefronts|inst_executed.sum|bank_conflicts|Duration|Issue Slots Busy|Executed Ipc Active|No Eligible|Achieved Occupancy|Registers Per|Theoretical Occ|Memory Throughput|DRAM Throughput|Compute \(SM\)" "$OUT/ncu.txt" | cut -c1-150 | head -${NCU_LINES:-150} ;;
    sanitize) # the ssm suite only (quick), memcheck then racecheck
        for tool in memcheck racecheck; do
            FUSEX_DEVICE=cuda FUSEX_REQUIRE_CUDA=1 FUSEX_PRIV=priv CK_FORK=no FUSEX_QUICK=1 CK_RUN_SUITE=ssm \
                timeout ${SAN_TIMEOUT:-100} compute-sanitizer --tool $tool --error-exitcode 1 build/fusex_check \
                > "$OUT/sanitize-$tool.log" 2>&1
            echo "== sanitize $tool rc=$? $((SECONDS - start))s"
            tail -n 4 "$OUT/sanitize-$tool.log"
        done ;;
    erl-bench)
        timeout ${ERL_BENCH_TIMEOUT:-120} make bench BENCH_ARGS="--device cuda --ops ${OPS:-selective_scan} --out $OUT/erl-bench.md" \
            > "$OUT/erl-bench.log" 2>&1
        echo "== erl-bench rc=$? $((SECONDS - start))s"
        cat "$OUT/erl-bench.md" 2>/dev/null || tail -n 20 "$OUT/erl-bench.log" ;;
    *) echo "unknown step $s" ;;
    esac
done
