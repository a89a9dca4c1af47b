#!/usr/bin/env bash
# The resident recorder (issue 34): `roar run`'s fixed cost with the job handed to the store's
# recorder against the run writing it itself (`ROAR_RECORDER=0`), in a small clean git
# repository, beside bare execution and the Python peer roar-cli. Every command goes through
# `env` so that each pays the same extra exec. Then a job of 1,000 files both ways (what the bytes
# on the socket cost), and the recorder's CPU per job. ROAR_BEFORE_BIN=PATH adds a row for another
# build of roar (the commit before, say), run the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
bash scripts/build.sh --release -q
ROAR="$PWD/target/release/roar"
W="${BENCH_DIR:-/tmp/roar-bench-recorder}"
rm -rf "$W" && mkdir -p "$W/repo" && cd "$W/repo"
git init -q && printf 'out/\n.roar/\n' > .gitignore && echo data > in.txt
git add -A && git -c user.email=b@e -c user.name=bench commit -qm init
"$ROAR" init > /dev/null
RUNS="${RUNS:-200}"
CMP="python3 $REPO/bench/lib/compare.py"
# The first run starts the recorder; later runs find it.
"$ROAR" run -- true 2> /dev/null
for _ in $(seq 50); do
    "$ROAR" run --json -- true 2>&1 | grep -q '"recorded_by":"recorder"' && break
    sleep 0.1
done

BEFORE=()
if [ -n "${ROAR_BEFORE_BIN:-}" ]; then
    # A store of its own: another build may have another schema (an older one refuses a newer).
    cp -a "$W/repo" "$W/before" && rm -rf "$W/before/.roar"
    (cd "$W/before" && "$ROAR_BEFORE_BIN" init > /dev/null && "$ROAR_BEFORE_BIN" run -- true 2> /dev/null)
    BEFORE=("before=env -C $W/before ROAR_RECORDER=1 $ROAR_BEFORE_BIN run -- true")
fi
echo "== fixed cost: roar run true, recorder vs the run's own writer ($RUNS interleaved rounds)"
$CMP "$W/fixed.json" "$RUNS" "bare=env ROAR_RECORDER=1 true" "bare2=env ROAR_RECORDER=0 true" \
    "recorder=env ROAR_RECORDER=1 $ROAR run -- true" \
    "own writer=env ROAR_RECORDER=0 $ROAR run -- true" "${BEFORE[@]}"
python3 - "$W/fixed.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bare = r["bare"]["median"]
floor = abs(r["bare2"]["median"] - bare) * 1e3
for name in [n for n in ("recorder", "own writer", "before") if n in r]:
    print(f"{name:>10}: +{(r[name]['median'] - bare) * 1e3:.2f} ms over bare (noise floor {floor:.2f} ms)")
print(f"recorder saves {(r['own writer']['median'] - r['recorder']['median']) * 1e3:.2f} ms a run")
PY

echo "== a job of 1,000 files (write+read 4 KiB each), both ways"
cc -O2 -o files "$REPO/bench/lib/files.c"
# Past 2,048 files a job goes to the run's own writer; 1,000 is the largest kind the recorder takes.
$CMP "$W/files.json" "${FILE_RUNS:-20}" --prepare "rm -rf out; mkdir out" \
    "bare=env ROAR_RECORDER=1 ./files 1000" \
    "recorder=env ROAR_RECORDER=1 $ROAR run -- ./files 1000" \
    "own writer=env ROAR_RECORDER=0 $ROAR run -- ./files 1000"

echo "== the recorder's CPU per job (100 runs of roar run true)"
pid=$(pgrep -f "roar-recorder __recorder $W/repo/.roar/roar.db" | head -1)
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
before=$(ticks)
for _ in $(seq 100); do "$ROAR" run -- true 2> /dev/null; done
after=$(ticks)
echo "recorder: $(( (after - before) * 1000000 / $(getconf CLK_TCK) / 100 )) us of CPU per job (user + system, /proc/PID/stat)"

# The Python peer, same command, in a repository of its own.
source "$REPO/bench/lib/peer.sh"
PEER_DIR="$W/peer"
mkdir -p "$PEER_DIR"
(cd "$PEER_DIR" && git init -q && "$PEER_VENV/bin/roar" init > /dev/null 2>&1 &&
    git add -A && git -c user.email=b@e -c user.name=bench commit -qm init > /dev/null)
echo "== the Python peer (roar-cli): roar run true"
(cd "$PEER_DIR" && $CMP "$W/peer.json" "${PEER_RUNS:-3}" "bare=env true" \
    "roar-cli=$PEER_VENV/bin/roar run -q true")
