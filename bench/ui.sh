#!/usr/bin/env bash
# The lineage page (issue 32) on a recorded ML-style pipeline (ROOTS root files, SHARDS
# preprocessing jobs, MODELS training jobs each writing a checkpoint directory, MODELS
# evaluations, one report; about 2 x (SHARDS + MODELS) jobs):
# - writing it: `roar dag --html` against `roar dag --json` (the data it embeds; the floor) and
#   `roar dag --svg` (Graphviz `dot`, the peer a user would reach for), interleaved;
# - showing it in headless Chromium (Debian's), median of LOADS loads: time until the page is drawn
#   and usable (data parsed, laid out, drawn) for the file, for `roar ui` (fetching the same JSON),
#   against the Graphviz SVG opened in the same browser and a blank page (the browser's floor);
#   then a search and a lineage highlight, timed in the page up to the next painted frame;
# - a store of re-runs (tests/ui/reruns.sh: ROUNDS runs of a STAGES-stage pipeline writing FILES
#   files a stage; 200 jobs and 1,000 versions by default): the page opened on the latest runs,
#   then "all runs" drawn; and the width of `roar dag --svg` for both.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
source "$REPO/bench/lib/builds.sh"
roar_after
W="${BENCH_DIR:-/tmp/roar-bench-ui}"
rm -rf "$W" && mkdir -p "$W/p"
RUNS="${RUNS:-10}"
ROOTS="${ROOTS:-60}" SHARDS="${SHARDS:-100}" MODELS="${MODELS:-50}"
CMP="python3 $REPO/bench/lib/compare.py"

cd "$W/p"
"$ROAR" init > /dev/null
echo "== recording the pipeline"
mkdir -p data
for i in $(seq 1 "$ROOTS"); do head -c 4096 /dev/urandom > "data/raw$i.bin"; done
for i in $(seq 1 "$SHARDS"); do
    a=$(( (i * 7) % ROOTS + 1 )) b=$(( (i * 13) % ROOTS + 1 ))
    "$ROAR" run -- sh -c "mkdir -p shards; cat data/raw$a.bin data/raw$b.bin > shards/s$i.bin" 2> /dev/null
done
for m in $(seq 1 "$MODELS"); do
    ins=""
    for k in 1 2 3 4 5; do ins+=" shards/s$(( (m * 11 + k * 17) % SHARDS + 1 )).bin"; done
    "$ROAR" run -- sh -c "mkdir -p ckpt-$m; for e in 1 2 3 4 5 6 7 8; do cat $ins > ckpt-$m/epoch\$e.pt; done" 2> /dev/null
    "$ROAR" run -- sh -c "mkdir -p eval; cat ckpt-$m/epoch8.pt | wc -c > eval/m$m.json" 2> /dev/null
done
"$ROAR" run -- sh -c "cat eval/*.json > report.md" 2> /dev/null
jobs=$("$ROAR" db --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"])')
files=$("$ROAR" db --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["job_files"])')
echo "  $jobs jobs, $files file records"

echo "== writing the view: roar dag --html against --json (the data) and --svg (Graphviz dot), $RUNS rounds"
$CMP "$W/write.json" "$RUNS" \
    "json=sh -c '$ROAR dag --json > $W/dag.json'" \
    "html=$ROAR dag --html $W/dag.html" \
    "svg (graphviz)=$ROAR dag --svg $W/dag.svg"
python3 - "$W" <<'PY'
import json, os, sys
w = sys.argv[1]
r = json.load(open(f"{w}/write.json"))
base = r["json"]["median"]
for k, v in r.items():
    print(f"  {k:16s} {v['median'] * 1e3:8.1f} ms  ({v['median'] / base:.2f}x json)")
for f in ["dag.json", "dag.html", "dag.svg"]:
    print(f"  {f:16s} {os.path.getsize(f'{w}/{f}') / 1024:8.0f} KiB")
PY

echo "== showing it in Chromium ($(chromium --version 2>/dev/null | head -1)), median of ${LOADS:-7} loads"
"$ROAR" ui --port 0 > "$W/ui.out" &
UI=$!
trap 'kill $UI 2> /dev/null || true' EXIT
for _ in $(seq 1 50); do grep -q http "$W/ui.out" 2> /dev/null && break; sleep 0.1; done
URL=$(grep -o 'http://[^ ]*' "$W/ui.out")
python3 "$REPO/bench/lib/ui_bench.py" "$W" "$URL" "${LOADS:-7}"
kill $UI 2> /dev/null || true

ROUNDS="${ROUNDS:-20}" STAGES="${STAGES:-10}" FILES="${FILES:-5}"
echo "== re-runs: $ROUNDS runs of a $STAGES-stage pipeline, $FILES files a stage"
mkdir -p "$W/r" && cd "$W/r"
"$ROAR" init > /dev/null
ROAR="$ROAR" bash "$REPO/tests/ui/reruns.sh" "$ROUNDS" "$STAGES" "$FILES"
for runs in "" --all-runs; do
    "$ROAR" dag $runs --svg "$W/r.svg" > /dev/null
    echo "  roar dag $runs --svg: $(grep -o '<svg width="[0-9]*pt" height="[0-9]*pt"' "$W/r.svg" | cut -c6-)"
done
"$ROAR" ui --port 0 > "$W/ui-r.out" &
UI=$!
for _ in $(seq 1 50); do grep -q http "$W/ui-r.out" 2> /dev/null && break; sleep 0.1; done
URL=$(grep -o 'http://[^ ]*' "$W/ui-r.out")
python3 "$REPO/bench/lib/ui_bench.py" --reruns "$URL" "${LOADS:-7}"
kill $UI 2> /dev/null || true

# The graph's query after/before (every lineage node now carries its job's labels, and the whole
# graph folds re-runs): the same re-runs recorded by each roar in its own store, `roar dag --json`
# of each, interleaved. ROAR_BEFORE=/path/to/older/roar.
if [ -n "${ROAR_BEFORE:-}" ]; then
    echo "== roar dag --json on the re-runs store, after/before ($RUNS rounds)"
    mkdir -p "$W/rb" && cd "$W/rb"
    "$ROAR_BEFORE" init > /dev/null
    ROAR="$ROAR_BEFORE" bash "$REPO/tests/ui/reruns.sh" "$ROUNDS" "$STAGES" "$FILES"
    $CMP "$W/dag-ab.json" "$RUNS" \
        "after=sh -c 'cd $W/r && $ROAR dag --json > /dev/null'" \
        "before=sh -c 'cd $W/rb && $ROAR_BEFORE dag --json > /dev/null'"
    python3 - "$W/dag-ab.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
a, b = r["after"]["median"], r["before"]["median"]
print(f"  roar dag --json: after {a * 1e3:.1f} ms, before {b * 1e3:.1f} ms: {a / b:.2f}x")
PY
fi
