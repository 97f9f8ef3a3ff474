#!/usr/bin/env bash
# An A/B on the GPU machine: the working tree against an earlier commit,
# both built and benchmarked in the same call (lent machines differ by 1-2 %
# in kernel time, so only rows of one call compare).
#
#   git archive --format=tar.gz -o .gpu/baseline.tgz <commit>    # here, once
#   dev/gpu-ab.sh [steps...]    # on the GPU machine; logs under $OUT
#
# steps: setup (unpack the BEAM and the baseline), build (both trees, in
# parallel), bench (one `make bench` of each, baseline first; repeat the step
# for more rounds: each round's tables are kept), table (the rows of every
# round side by side). BENCH_ARGS passes options to both benches.
set -uo pipefail
OUT=${OUT:-/tmp/fusex-ab}
BASE=${BASE:-/tmp/fusex-base}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:/usr/lib/erlang/bin:$PATH
steps=${*:-setup build bench table}
round=$(ls "$OUT"/bench-new-*.md 2>/dev/null | wc -l)

for s in $steps; do
    start=$SECONDS
    case $s in
    setup)
        tar --keep-directory-symlink -C / -xJf .gpu/beam.txz &&
            tar --keep-directory-symlink -C / -xJf .gpu/beam-extra.txz &&
            rm -rf "$BASE" && mkdir -p "$BASE" && tar -xzf .gpu/baseline.tgz -C "$BASE"
        echo "== setup rc=$? $((SECONDS - start))s" ;;
    build)
        (cd "$BASE" && make -j8 all > "$OUT/build-base.log" 2>&1; echo $? > "$OUT/build-base.rc") &
        make -j8 all build/fusex_check > "$OUT/build-new.log" 2>&1
        echo "== build new rc=$? $((SECONDS - start))s"
        wait
        echo "== build base rc=$(cat "$OUT/build-base.rc") $((SECONDS - start))s" ;;
    bench)
        round=$((round + 1))
        (cd "$BASE" && make bench BENCH_ARGS="--device cuda --out $OUT/bench-base-$round.md ${BENCH_ARGS:-}" \
            > "$OUT/bench-base-$round.log" 2>&1)
        echo "== bench base round $round rc=$? $((SECONDS - start))s"
        make bench BENCH_ARGS="--device cuda --out $OUT/bench-new-$round.md ${BENCH_ARGS:-}" \
            > "$OUT/bench-new-$round.log" 2>&1
        echo "== bench new round $round rc=$? $((SECONDS - start))s" ;;
    table)
        python3 - "$OUT" <<'EOF'
import glob, re, sys
out = sys.argv[1]
def rows(path):
    table = {}
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if len(cells) >= 5 and re.match(r'^[0-9.]+$', cells[4] or ''):
            table[(cells[0], cells[1], cells[2])] = float(cells[4])
    return table
rounds = sorted({re.search(r'-(\d+)\.md$', p).group(1) for p in glob.glob(out + '/bench-new-*.md')}, key=int)
base = [rows(f'{out}/bench-base-{r}.md') for r in rounds]
new = [rows(f'{out}/bench-new-{r}.md') for r in rounds]
print('| op | shape | dtype | base us (rounds) | new us (rounds) | new / base |')
print('|---|---|---|---|---|---:|')
for key in new[0]:
    b = [t[key] for t in base if key in t]
    n = [t[key] for t in new if key in t]
    if not b or not n:
        continue
    ratio = min(n) / min(b)
    print(f"| {key[0]} | {key[1]} | {key[2]} | {' / '.join(f'{v:.1f}' for v in b)} | "
          f"{' / '.join(f'{v:.1f}' for v in n)} | {ratio:.3f} |")
EOF
        ;;
    *) echo "unknown step $s" ;;
    esac
done
