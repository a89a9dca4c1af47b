#!/usr/bin/env bash
# The mount's write path, this checkout against an older roar (ROAR_BEFORE=/path/to/roar, or
# built from BEFORE_REV, default 2c0c9aa: before every change through the mount sealed the
# versions other jobs' open writers left, issue 56): both mounted at once, interleaved round by
# round with native writes (bench/lib/compare.py): a 512 MiB sequential write in 128 KiB
# requests, and 1,000 small files written by a shell loop. Ratios after/before are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
[ "$(id -u)" = 0 ] || { echo "bench/mount_ab.sh needs root (FUSE mounts)" >&2; exit 1; }
bash scripts/build.sh --release -q
ROAR="${CARGO_TARGET_DIR:-$PWD/target}/release/roar"
source "$REPO/bench/lib/builds.sh"
roar_before 2c0c9aa
W="${BENCH_DIR:-/tmp/roar-bench-mount-ab}"
RUNS="${RUNS:-5}"
for m in "$W/after/data" "$W/before/data"; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
rm -rf "$W" && mkdir -p "$W/after/data" "$W/before/data" "$W/native"
(cd "$W/after" && "$ROAR" init > /dev/null && "$ROAR" mount data > /dev/null 2>&1)
(cd "$W/before" && "$ROAR_BEFORE" init > /dev/null && "$ROAR_BEFORE" mount data > /dev/null 2>&1)
trap '"$ROAR" unmount "$W/after/data" > /dev/null 2>&1 || true; "$ROAR_BEFORE" unmount "$W/before/data" > /dev/null 2>&1 || true' EXIT
cat > "$W/small.sh" <<'SH'
#!/bin/sh
d=$1; rm -rf "$d/s"; mkdir "$d/s"; i=0
while [ $i -lt 1000 ]; do echo "$i" > "$d/s/f$i"; i=$((i+1)); done
SH
chmod +x "$W/small.sh"
write() { echo "dd if=/dev/zero of=$1/big bs=128k count=4096 status=none"; }
cd "$W"
python3 "$REPO/bench/lib/compare.py" ab.json "$RUNS" \
    "native write=$(write "$W/native")" "after write=$(write "$W/after/data")" \
    "before write=$(write "$W/before/data")" \
    "native small=$W/small.sh $W/native" "after small=$W/small.sh $W/after/data" \
    "before small=$W/small.sh $W/before/data"
python3 - <<'PY'
import json
r = json.load(open("ab.json"))
for case in ("write", "small"):
    print(f"  {case:6s} after/before {r['after ' + case]['median'] / r['before ' + case]['median']:.3f}"
          f"  (after {r['after ' + case]['median'] / r['native ' + case]['median']:.2f}x native)")
PY
