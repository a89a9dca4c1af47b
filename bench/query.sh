#!/usr/bin/env bash
# Lineage queries on a large store: 10,000 jobs and 1,000,000 file edges (500 pipelines of 20
# steps, every step reading a dataset shared by all jobs; crates/store/examples/synth_store.rs).
# Target (issue 7): each query answers in under 200 ms. Every query is also shown as a ratio to
# `roar --version`, the bare cost of starting the binary, measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
cargo build --release --locked -q -p roar-cli -p roar-store --example synth_store
ROAR="$PWD/target/release/roar"
W="${BENCH_DIR:-/tmp/roar-bench-query}"
JOBS="${JOBS:-10000}"
RUNS="${RUNS:-15}"
rm -rf "$W"
echo "== building a store of $JOBS jobs (100 file edges each)"
TARGET=$("$PWD/target/release/examples/synth_store" "$W" "$JOBS" 100)
OTHER="${TARGET/step19/step18}"
cd "$W"
"$ROAR" db | sed 's/^/  /'
HASH=$("$ROAR" show "$TARGET" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["history"][0]["hash"]["blake3"][:10])')
echo "== queries (target: under 200 ms each)"
python3 "$REPO/bench/lib/compare.py" query.json "$RUNS" \
    "roar --version (bare start)=$ROAR --version" \
    "log (20 newest)=$ROAR log" \
    "show job=$ROAR show $((JOBS / 2))" \
    "show artifact by hash=$ROAR show $HASH" \
    "show path=$ROAR show $TARGET" \
    "lineage (20 steps)=$ROAR lineage $TARGET" \
    "inputs=$ROAR inputs $TARGET" \
    "reproduce=$ROAR reproduce $TARGET" \
    "diff two artifacts=$ROAR diff $TARGET $OTHER" \
    "export prov-json (lineage)=$ROAR export $TARGET" \
    "export openlineage (lineage)=$ROAR export --format openlineage $TARGET" \
    "show a dataset read by every job=$ROAR show data/shared-0.parquet"
python3 - query.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
base = r.pop("roar --version (bare start)")["median"]
print(f"\n{'query':40s} {'median':>9s} {'x bare start':>13s}  <200 ms")
for name, v in r.items():
    m = v["median"]
    print(f"{name:40s} {m*1e3:7.1f} ms {m/base:12.1f}x  {'yes' if m < 0.2 else 'NO'}")
PY
