#!/usr/bin/env bash
# Hashing 1 GiB in 200 files: `roar hash` (fresh store each run, so nothing comes from the cache)
# against `b3sum --num-threads $(nproc)`, page cache warm for both. Prints the throughput ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh --release -q
ROAR="$PWD/target/release/roar"
W="${BENCH_DIR:-/tmp/roar-bench-hash}"
mkdir -p "$W/data"
if [ "$(ls "$W/data" | wc -l)" -ne 200 ]; then
    for i in $(seq 1 200); do head -c $((5368709)) /dev/urandom > "$W/data/f$i.bin"; done
fi
cd "$W"
cat data/* > /dev/null
hyperfine --warmup 1 --runs "${RUNS:-7}" --export-json hash.json \
    -n b3sum "b3sum --num-threads $(nproc) data/* > /dev/null" \
    -n "roar hash" --prepare "rm -rf .roar && $ROAR init > /dev/null" "$ROAR hash data > /dev/null" \
    >/dev/null
python3 - <<'PY'
import json
r = {x["command"]: x for x in json.load(open("hash.json"))["results"]}
b, o = r["b3sum"]["median"], r["roar hash"]["median"]
print(f"hash 1 GiB / 200 files: b3sum {b*1e3:.0f} ms, roar hash {o*1e3:.0f} ms (median)")
print(f"roar throughput / b3sum throughput = {b/o:.2f}x  (target >= 0.90x)")
PY
