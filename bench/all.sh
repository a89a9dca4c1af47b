#!/usr/bin/env bash
# Every benchmark, one after the other, each printing its ratios; then bench/RESULTS.md is written
# from what they printed (bench/lib/report.py), with the machine, the versions and the exact
# command of each. Installs what it needs (scripts/setup.sh, the Python peer in a venv, bindfs,
# boto3). Needs root (mounts, page-cache drops). About 30 minutes on the 2-core CI machine.
#
# usage: bash bench/all.sh [BENCH.sh ...]   (a subset replaces only those benchmarks' sections of
#                                            bench/RESULTS.md; each section says when and at which
#                                            commit it was measured)
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
OUT="${BENCH_OUT:-/tmp/roar-bench-results}"
rm -rf "$OUT" && mkdir -p "$OUT"
ALL=(hash.sh run.sh engine.sh journal.sh blind_spots.sh dist.sh s3_ops.sh recorder.sh ebpf.sh query.sh mount.sh mount_ab.sh archive.sh s3.sh s3_put.sh security.sh cli.sh env.sh ui.sh pipeline.sh steps.sh team.sh wakeup.sh)
if [ $# -gt 0 ]; then SELECTED=("$@"); else SELECTED=("${ALL[@]}"); fi
# The knobs a benchmark reads, recorded with its command when they are set.
KNOBS=(RUNS BEFORE_REV FIND_RUNS FILE_RUNS PEER_RUNS REPS EPOCHS TREE_FILES ROUNDS MEMBERS READ ROAR_BEFORE ROAR_BEFORE_BIN N HALT_POLL_NS URING BUILD)
failed=0
for b in "${SELECTED[@]}"; do
    [ -f "bench/$b" ] || { echo "bench/all.sh: no benchmark bench/$b; choose from ${ALL[*]}" >&2; exit 2; }
    echo "$b" >> "$OUT/order.txt"
    env_set=""
    for k in "${KNOBS[@]}"; do [ -n "${!k:-}" ] && env_set+="$k=${!k} "; done
    echo "${env_set% }" > "$OUT/$b.env"
    echo "################ ${env_set}bash bench/$b"
    start=$(date +%s)
    bash "bench/$b" 2>&1 | tee "$OUT/$b.log"
    rc=${PIPESTATUS[0]}
    echo "$rc" > "$OUT/$b.rc"
    dirty=$(git status --porcelain --untracked-files=no | head -1)
    echo "$(date -u '+%Y-%m-%d %H:%M') $(git rev-parse --short HEAD)${dirty:+ (with uncommitted changes)}" > "$OUT/$b.when"
    echo $(( $(date +%s) - start )) > "$OUT/$b.secs"
    [ "$rc" = 0 ] || { failed=1; echo "bench/all.sh: bench/$b failed (exit $rc); going on with the others" >&2; }
done
python3 bench/lib/report.py "$OUT" bench/RESULTS.md && echo "bench/all.sh: wrote bench/RESULTS.md"
exit "$failed"
