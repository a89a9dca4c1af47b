#!/usr/bin/env bash
# The crash-durable journal (issue 57), before and after in one run: the fixed cost P1 (`roar run
# true`) and the per-file cost P2 (write+read N x 4 KiB, N = 2000) under each `roar run` backend,
# for this checkout's roar (every event kept in the job's journal as it arrives; the preload
# ring a file in /dev/shm) and the roar before journals, interleaved round by round with bare
# execution (bench/lib/compare.py); the same through `roar mount` (each access journaled before it
# is answered, a journal file per job); then what a recovery costs: `roar log` right after a
# `roar run` of N files killed mid-command, against `roar log` with nothing to recover. This
# roar's versions kept (issue 58) are off: they are measured by bench/keep.sh.
# Every figure is a ratio (to bare, or after/before). The older roar is ROAR_BEFORE=/path/to/roar
# (its shim beside it), or built from BEFORE_REV (default: the commit before journals, 8ca353e).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
# ROAR_AFTER=/path/to/roar (its shim beside it) measures a roar built already.
if [ -z "${ROAR_AFTER:-}" ]; then
    bash scripts/build.sh --release -q
    ROAR_AFTER="${CARGO_TARGET_DIR:-$PWD/target}/release/roar"
fi
ROAR="$ROAR_AFTER"
source "$REPO/bench/lib/builds.sh"
roar_before 8ca353e
RUNS="${RUNS:-10}"
N="${N:-2000}"
W="${BENCH_DIR:-/tmp/roar-bench-journal}"
rm -rf "$W" && mkdir -p "$W" && cd "$W"
cc -O2 -o files "$REPO/bench/lib/files.c"
BACKENDS=(preload ptrace)
"$ROAR" tracer check ebpf > /dev/null && BACKENDS+=(ebpf)
CMP="python3 $REPO/bench/lib/compare.py"
mkdir -p "$W/plain/out"
cp files "$W/plain/"
git init -q "$W/after" && git init -q "$W/before"
(cd "$W/after" && "$ROAR" init > /dev/null)
# What the journal costs, not the versions kept since (issue 58, measured by bench/keep.sh).
KEEP_OFF=$'\n[keep]\noutputs = false\ninputs = "none"\n'
printf '%s' "$KEEP_OFF" >> "$W/after/.roar/config.toml"
(cd "$W/before" && "$ROAR_BEFORE" init > /dev/null)

echo "== P1: roar run true in a git repo (after = this checkout, before = $ROAR_BEFORE)"
rows=()
for b in "${BACKENDS[@]}"; do
    rows+=("$b after=sh -c 'cd $W/after && exec $ROAR run --tracer $b -- true'"
           "$b before=sh -c 'cd $W/before && exec $ROAR_BEFORE run --tracer $b -- true'")
done
$CMP p1.json "$RUNS" "bare=sh -c 'cd $W/after && exec true'" "${rows[@]}"

echo "== P2: write+read $N x 4 KiB under roar run (a fresh store every run; each command ends with sync, so its writeback is its own)"
rows=()
for b in "${BACKENDS[@]}"; do
    rows+=("$b after=sh -c 'ROAR_DIR=$W/after/.roar $ROAR run --tracer $b -- ./files $N && sync'"
           "$b before=sh -c 'ROAR_DIR=$W/before/.roar $ROAR_BEFORE run --tracer $b -- ./files $N && sync'")
done
(cd "$W/plain" && $CMP "$W/p2.json" "$RUNS" \
    --prepare "rm -rf out $W/after/.roar $W/before/.roar; mkdir out; $ROAR init $W/after > /dev/null; printf '%s' '$KEEP_OFF' >> $W/after/.roar/config.toml; $ROAR_BEFORE init $W/before > /dev/null; sync" \
    "bare=sh -c './files $N && sync'" "${rows[@]}")

echo "== recovery: roar log after a preload run of $N files killed mid-command, against roar log with nothing to recover"
cat > "$W/slow.sh" <<'SH'
for ((k=1; k<=$1; k++)); do echo "$k" > "out/f_$k"; done
sleep 0.3
SH
$CMP recover.json "$RUNS" \
    --prepare "cd $W/plain && rm -rf out .roar && mkdir out && $ROAR init > /dev/null && { $ROAR run --tracer preload -- bash $W/slow.sh $N > /dev/null 2>&1 & echo \$! > $W/run.pid; sleep 0.15; kill -9 \$(cat $W/run.pid); while pgrep -f \"^bash $W/slow.sh\" > /dev/null; do sleep 0.05; done; }" \
    "log_clean=sh -c 'cd $W/after && $ROAR log > /dev/null 2>&1'" \
    "log_recovering=sh -c 'cd $W/plain && $ROAR log > /dev/null 2>&1'"

echo "== mount: per file (write+read $N x 4 KiB in one job) and per job (100 commands, each its own job, writing one file), through roar mount"
for side in after before; do
    mkdir -p "$W/m$side/data" && git init -q "$W/m$side"
    cp files "$W/m$side/data/"
done
mkdir -p "$W/mplain" && cp files "$W/mplain/"
(cd "$W/mafter" && "$ROAR" init > /dev/null && printf '%s' "$KEEP_OFF" >> .roar/config.toml && "$ROAR" mount data 2> /dev/null)
(cd "$W/mbefore" && "$ROAR_BEFORE" init > /dev/null && "$ROAR_BEFORE" mount data 2> /dev/null)
unmount_all() {
    (cd "$W/mafter" && "$ROAR" unmount data > /dev/null 2>&1) || true
    (cd "$W/mbefore" && "$ROAR_BEFORE" unmount data > /dev/null 2>&1) || true
}
trap unmount_all EXIT
# Each command its own session and process group: one job each on the mount. Every run works in
# a fresh directory (ext4 places each new one afresh): two fixed directories differ by where
# ext4 allocates their inodes (one of them with many inodes recently deleted) by more than roar's
# own cost, whichever roar serves them.
FRESH='d=$(mktemp -d -p . r.XXXXXX) && cd $d && mkdir out'
JOBS='for i in $(seq 100); do setsid -w sh -c "echo $i > out/j_$i"; done'
$CMP mount.json "$RUNS" \
    --prepare "rm -rf $W/mplain/r.* $W/mafter/data/r.* $W/mbefore/data/r.*" \
    "bare_files=sh -c 'cd $W/mplain && $FRESH && ../files $N'" \
    "files after=sh -c 'cd $W/mafter/data && $FRESH && ../files $N'" \
    "files before=sh -c 'cd $W/mbefore/data && $FRESH && ../files $N'" \
    "bare_jobs=bash -c 'cd $W/mplain && $FRESH && $JOBS'" \
    "jobs after=bash -c 'cd $W/mafter/data && $FRESH && $JOBS'" \
    "jobs before=bash -c 'cd $W/mbefore/data && $FRESH && $JOBS'"
unmount_all
trap - EXIT

python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
print("\n== ratios (median; after / before)")
for name in ["p1", "p2"]:
    d = json.load(open(f"{w}/{name}.json"))
    bare = d["bare"]["median"]
    pairs = sorted({k.rsplit(" ", 1)[0] for k in d if k != "bare"})
    for p in pairs:
        a, b = d.get(f"{p} after"), d.get(f"{p} before")
        if a and b:
            print(f"{name:4} {p:8} after {a['median'] / bare:6.3f}x  before {b['median'] / bare:6.3f}x"
                  f"  after/before {a['median'] / b['median']:6.3f}")
d = json.load(open(f"{w}/mount.json"))
for kind in ["files", "jobs"]:
    bare = d[f"bare_{kind}"]["median"]
    a, b = d[f"{kind} after"]["median"], d[f"{kind} before"]["median"]
    print(f"mount {kind:5} after {a / bare:6.3f}x  before {b / bare:6.3f}x  after/before {a / b:6.3f}")
d = json.load(open(f"{w}/recover.json"))
print(f"recovery of a killed job: roar log {d['log_recovering']['median'] / d['log_clean']['median']:.2f}x a roar log with nothing to recover")
PY
