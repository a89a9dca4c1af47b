#!/usr/bin/env bash
# The recording engine (issue 56), before and after in one run: the per-file cost P2 (write+read
# N x 4 KiB, N = 2000) under each `roar run` backend and through `roar mount` (which now feeds the
# engine every access and counts every write against the content generations), and the fixed cost
# P1 (`roar run true`), for this checkout's roar and an older one, interleaved round by round with
# bare execution (bench/lib/compare.py). Every figure is printed as a ratio to bare; the older
# roar is ROAR_BEFORE=/path/to/roar (its shim beside it), or built from BEFORE_REV (default: the
# commit before the engine, d77f60e) into a worktree under /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
bash scripts/build.sh --release -q
ROAR="${CARGO_TARGET_DIR:-$PWD/target}/release/roar"
source "$REPO/bench/lib/builds.sh"
roar_before d77f60e
RUNS="${RUNS:-10}"
N="${N:-2000}"
W="${BENCH_DIR:-/tmp/roar-bench-engine}"
for m in "$W/after/data" "$W/before/data"; do
    mountpoint -q "$m" 2>/dev/null && { umount -l "$m" || true; }
done
rm -rf "$W" && mkdir -p "$W" && cd "$W"
cc -O2 -o files "$REPO/bench/lib/files.c"
BACKENDS=(preload ptrace)
"$ROAR" tracer check ebpf > /dev/null && BACKENDS+=(ebpf)
CMP="python3 $REPO/bench/lib/compare.py"
for v in after before; do
    mkdir -p "$W/$v/data/out" "$W/$v/plain/out"
    cp files "$W/$v/data/" && cp files "$W/$v/plain/"
done
(cd "$W/after" && "$ROAR" init > /dev/null)
(cd "$W/before" && "$ROAR_BEFORE" init > /dev/null)

echo "== P1: roar run true (after = this checkout, before = $ROAR_BEFORE)"
rows=()
for b in "${BACKENDS[@]}"; do
    rows+=("$b after=env ROAR_DIR=$W/after/.roar $ROAR run --tracer $b -- true"
           "$b before=env ROAR_DIR=$W/before/.roar $ROAR_BEFORE run --tracer $b -- true")
done
$CMP p1.json "$RUNS" bare=true "${rows[@]}"

echo "== P2: write+read $N x 4 KiB under roar run (a fresh store every run)"
rows=()
for b in "${BACKENDS[@]}"; do
    rows+=("$b after=env ROAR_DIR=$W/after/.roar $ROAR run --tracer $b -- ./files $N"
           "$b before=env ROAR_DIR=$W/before/.roar $ROAR_BEFORE run --tracer $b -- ./files $N")
done
(cd "$W/after/plain" && $CMP "$W/p2.json" "$RUNS" \
    --prepare "rm -rf out $W/after/.roar $W/before/.roar; mkdir out; $ROAR init $W/after > /dev/null; $ROAR_BEFORE init $W/before > /dev/null" \
    "bare=./files $N" "${rows[@]}")

echo "== P2 through roar mount: the same program in a mounted directory, each run a job of its own"
(cd "$W/after" && "$ROAR" mount data > /dev/null)
(cd "$W/before" && "$ROAR_BEFORE" mount data > /dev/null)
trap '(cd "$W/after" && "$ROAR" unmount data > /dev/null 2>&1); (cd "$W/before" && "$ROAR_BEFORE" unmount data > /dev/null 2>&1)' EXIT
$CMP p2mount.json "$RUNS" \
    --prepare "rm -rf $W/after/plain/out $W/after/data/out $W/before/data/out; mkdir $W/after/plain/out $W/after/data/out $W/before/data/out" \
    "bare=sh -c 'cd $W/after/plain && ./files $N'" \
    "mount after=setsid sh -c 'cd $W/after/data && ./files $N'" \
    "mount before=setsid sh -c 'cd $W/before/data && ./files $N'"

python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
print("\n== ratios to bare (median; after / before)")
for name in ["p1", "p2", "p2mount"]:
    d = json.load(open(f"{w}/{name}.json"))
    bare = d["bare"]["median"]
    rows = sorted(k for k in d if k != "bare")
    pairs = sorted({k.rsplit(" ", 1)[0] for k in rows})
    for p in pairs:
        a, b = d.get(f"{p} after"), d.get(f"{p} before")
        if a and b:
            print(f"{name:8} {p:8} after {a['median'] / bare:6.3f}x  before {b['median'] / bare:6.3f}x"
                  f"  after/before {a['median'] / b['median']:6.3f}")
PY
