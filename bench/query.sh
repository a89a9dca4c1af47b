#!/usr/bin/env bash
# Lineage queries on a large store: 10,000 jobs and 1,000,000 file edges (500 pipelines of 20
# steps, every step reading a dataset shared by all jobs; crates/store/examples/synth_store.rs).
# Target (issue 7): each query answers in under 200 ms; issue 27 (file versions): lineage
# <= 50 ms, dag TARGET <= 100 ms. Every query is also shown as a ratio to `roar --version`, the
# bare cost of starting the binary, measured in the same run.
# Then `roar status` on a real project of 10,000 recorded files with nothing changed (target
# <= 200 ms), against `git status` on the same committed tree.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
# Two builds: with --example, cargo builds only the example, and a stale roar would be measured.
cargo build --release --locked -q -p roar-cli
cargo build --release --locked -q -p roar-store --example synth_store
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
    "dag TARGET (20 steps)=$ROAR dag $TARGET" \
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

echo "== status of a project of 10,000 recorded files (20 jobs of 250 inputs -> 250 outputs)"
P="$W/status-project"
mkdir -p "$P" && cd "$P"
git init -q . && "$ROAR" init >/dev/null
python3 - <<'PY'
import os
for d in range(20):
    os.makedirs(f"raw/{d:02d}", exist_ok=True)
    for i in range(250):
        with open(f"raw/{d:02d}/{i:04d}.txt", "w") as f:
            f.write(f"{d} {i}\n" * 20)
PY
for d in $(seq -w 0 19); do
    "$ROAR" run -- python3 -c "
import os, sys
d = sys.argv[1]
os.makedirs(f'out/{d}', exist_ok=True)
for n in sorted(os.listdir(f'raw/{d}')):
    open(f'out/{d}/{n}', 'w').write(open(f'raw/{d}/{n}').read().upper())
" "$d" 2>/dev/null
done
git add -A >/dev/null && git -c user.email=b@x -c user.name=b commit -qm tree
"$ROAR" status --exit-code | tail -1
python3 "$REPO/bench/lib/compare.py" status.json "$RUNS" \
    "roar --version (bare start)=$ROAR --version" \
    "git status (same tree)=git status --porcelain" \
    "roar status (10k files, clean)=$ROAR status --exit-code"
python3 - status.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
base = r["roar --version (bare start)"]["median"]
git = r["git status (same tree)"]["median"]
m = r["roar status (10k files, clean)"]["median"]
print(f"\n{'query':40s} {'median':>9s} {'x bare':>8s} {'x git':>7s}  <200 ms")
for name, v in r.items():
    t = v["median"]
    print(f"{name:40s} {t*1e3:7.1f} ms {t/base:7.1f}x {t/git:6.1f}x")
print(f"roar status under 200 ms: {'yes' if m < 0.2 else 'NO'}")
PY
