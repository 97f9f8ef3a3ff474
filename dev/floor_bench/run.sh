#!/usr/bin/env bash
# On the GPU machine: the memory floors and the bulk-copy prototype
# (floor_bench), the library's streaming kernels on the same shapes
# (linrec_bench), and ncu counters of both. Logs under $OUT.
#   dev/floor_bench/run.sh [steps...]   steps: build floor linrec ncu
set -uo pipefail
OUT=${OUT:-/tmp/floor-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:/usr/lib/erlang/bin:$PATH
steps=${*:-build floor linrec ncu}
METRICS="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active"
for r in long_scoreboard short_scoreboard wait lg_throttle mio_throttle math_pipe_throttle barrier membar drain \
         no_instruction selected not_selected sleeping branch_resolving dispatch_stall misc; do
    METRICS="$METRICS,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done

for s in $steps; do
    start=$SECONDS
    case $s in
    build)
        timeout 300 make -j16 priv/fusex_cuda.so && timeout 300 make -f dev/Makefile build/linrec_bench > "$OUT/build.log" 2>&1
        echo "== build rc=$? $((SECONDS - start))s"
        timeout 120 make -f dev/Makefile build/floor_bench >> "$OUT/build.log" 2>&1
        echo "== floor_bench build rc=$? $((SECONDS - start))s"
        tail -n 3 "$OUT/build.log" ;;
    floor)
        timeout 200 build/floor_bench ${REPS:-50} > "$OUT/floor.txt" 2>&1
        echo "== floor rc=$? $((SECONDS - start))s"
        cat "$OUT/floor.txt" ;;
    linrec)
        { FUSEX_PRIV=priv timeout 120 build/linrec_bench --cases 0,3,4,8 --add 1 --reps ${REPS:-50}
          echo "-- forced streaming (--tiles -1)"
          FUSEX_PRIV=priv timeout 60 build/linrec_bench --cases 4 --tiles -1 --reps ${REPS:-50}; } > "$OUT/linrec.txt" 2>&1
        echo "== linrec rc=$? $((SECONDS - start))s"
        cat "$OUT/linrec.txt" ;;
    ncu)
        # the first forward of each run is linrec_bench's set-up call, on the
        # kernel the library dispatches (streaming for cases 0 and 3)
        { for c in 0 3; do
              FUSEX_PRIV=priv timeout 100 ncu --clock-control none --metrics "$METRICS" -k regex:forward -c 1 \
                  build/linrec_bench --case $c --reps 1
          done
          timeout 150 ncu --clock-control none --metrics "$METRICS" -k regex:stream_bulk -c 8 build/floor_bench 1
          timeout 60 ncu --clock-control none --metrics "$METRICS" -k regex:elementwise4 -c 5 build/floor_bench 1
        } > "$OUT/ncu.txt" 2>&1
        echo "== ncu rc=$? $((SECONDS - start))s"
        grep -E "stream|forward|elementwise|gpu__time|dram__|inst_executed|issue_active|warps_active|stalled" "$OUT/ncu.txt" \
            | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | cut -c1-140 | head -${NCU_LINES:-200} ;;
    *) echo "unknown step $s" ;;
    esac
done
