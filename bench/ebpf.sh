#!/usr/bin/env bash
# The eBPF backend's fixed cost with the resident helper (issue 34), every figure against bare
# execution in the same run, in a git repository:
# - `roar run --tracer ebpf true` warm (the helper running), with the programs loaded by the run
#   itself (ROAR_EBPF_HELPER=0, what every run paid before the helper), against bare, preload and
#   ptrace; then against the Python peer roar-cli's eBPF tracer (its own resident daemon, roard)
#   where it works, in a comparison of its own (roard slows every syscall while it lives);
# - the first run (no helper yet: it starts one and waits for the load), over several rounds;
# - what the machine pays while the programs are attached: the time of a syscall made by a
#   process outside any run, with no helper, during a run, and with the helper idle.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
bash scripts/build.sh --release -q
ROAR="$PWD/target/release/roar"
W="${BENCH_DIR:-/tmp/roar-bench-ebpf}"
rm -rf "$W" && mkdir -p "$W/project" && cd "$W/project"
git init -q . && git config user.email b@b && git config user.name b
"$ROAR" init > /dev/null
git add -A && git commit -qm init
RUNS="${RUNS:-30}"
CMP="python3 $REPO/bench/lib/compare.py"
if ! "$ROAR" tracer check ebpf > /dev/null; then
    echo "bench/ebpf.sh: the eBPF tracer does not work here: $("$ROAR" tracer check ebpf)" >&2
    exit 1
fi
helpers() { pgrep -f -- '__ebpf-helper' || true; }
stop_helpers() {
    local p
    for p in $(helpers); do kill "$p" 2> /dev/null || true; done
    while [ -n "$(helpers)" ]; do sleep 0.05; done
}

# The peer, with its eBPF tracer if it works here (it starts its own daemon on first use).
source "$REPO/bench/lib/peer.sh"
PEER_DIR="$W/peer"
mkdir -p "$PEER_DIR"
(cd "$PEER_DIR" && git init -q && "$PEER_VENV/bin/roar" init > /dev/null 2>&1 &&
    git add -A && git -c user.email=b@b -c user.name=b commit -qm init)
# The peer's daemon (roard) keeps its programs attached while it lives, which slows every
# syscall on the machine: it is stopped before and after its own comparison.
stop_peer() { pkill -f 'roar/bin/roard' 2> /dev/null || true; sleep 0.2; }
stop_peer

echo "== fixed cost: roar run true (the helper started by the warm-up run)"
# Every traced row goes through env(1) so that none pays an exec the others do not.
$CMP "$W/fixed.json" "$RUNS" bare=true bare2=true \
    "preload=env ROAR_EBPF_HELPER=1 $ROAR run --tracer preload -- true" \
    "ptrace=env ROAR_EBPF_HELPER=1 $ROAR run --tracer ptrace -- true" \
    "ebpf, resident helper=env ROAR_EBPF_HELPER=1 $ROAR run --tracer ebpf -- true" \
    "ebpf, loaded by the run=env ROAR_EBPF_HELPER=0 $ROAR run --tracer ebpf -- true"

if (cd "$PEER_DIR" && "$PEER_VENV/bin/roar" run -q --tracer ebpf --no-tracer-fallback true > /dev/null 2>&1); then
    echo "== against the peer: roar-cli's eBPF tracer (its daemon running) and roar's, both cd'ing into their project"
    $CMP "$W/peer.json" "${PEER_RUNS:-5}" \
        "cd=sh -c 'cd $PEER_DIR && exec true'" \
        "roar-cli ebpf=sh -c 'cd $PEER_DIR && exec $PEER_VENV/bin/roar run -q --tracer ebpf --no-tracer-fallback true'" \
        "roar ebpf=sh -c 'cd $W/project && exec $ROAR run --tracer ebpf -- true'"
    stop_peer
else
    echo "roar-cli --tracer ebpf does not work here; left out"
fi

echo "== first run: no helper yet (it is started and loads the programs), 5 rounds"
for i in 1 2 3 4 5; do
    stop_helpers
    s=$(date +%s%N); "$ROAR" run --tracer ebpf -- true 2> /dev/null; e=$(date +%s%N)
    s2=$(date +%s%N); "$ROAR" run --tracer ebpf -- true 2> /dev/null; e2=$(date +%s%N)
    echo "first $(( (e - s) / 1000 )) us, next $(( (e2 - s2) / 1000 )) us"
done | tee "$W/first.txt"

echo "== the machine while the programs are attached: one syscall by a process outside any run"
cat > "$W/syscalls.py" <<'PY'
import os, time
fd = os.open("/dev/null", os.O_WRONLY)
best = float("inf")
for _ in range(7):
    t = time.perf_counter()
    for _ in range(100000):
        os.write(fd, b"x")
    best = min(best, (time.perf_counter() - t) / 100000)
print(f"{best * 1e9:.0f}")
PY
stop_helpers
none=$(python3 "$W/syscalls.py")
"$ROAR" run --tracer ebpf -- sleep 30 2> /dev/null &
RUN=$!
sleep 2
during=$(python3 "$W/syscalls.py")
kill -TERM "$RUN" 2> /dev/null || true
wait "$RUN" 2> /dev/null || true
sleep 2 # past the second the programs stay attached after a run
idle=$(python3 "$W/syscalls.py")
echo "  no helper: $none ns; during a run: $during ns; helper idle: $idle ns" | tee "$W/machine.txt"

python3 - "$W" <<'PY'
import json, re, statistics, sys
w = sys.argv[1]
r = json.load(open(f"{w}/fixed.json"))
bare = r["bare"]["median"]
print("== summary (added to bare `true`, medians; ratio = traced / bare)")
noise = abs(r["bare2"]["median"] - bare) * 1e3
print(f"  noise floor (bare2 - bare): {noise:.2f} ms")
for name, v in r.items():
    if not name.startswith("bare"):
        print(f"  {name:28s} +{(v['median'] - bare) * 1e3:7.2f} ms  ({v['median'] / bare:5.2f}x)")
try:
    p = json.load(open(f"{w}/peer.json"))
    base = p["cd"]["median"]
    for name in ("roar-cli ebpf", "roar ebpf"):
        print(f"  {name:28s} +{(p[name]['median'] - base) * 1e3:7.2f} ms  ({p[name]['median'] / base:5.2f}x)  [peer comparison]")
except FileNotFoundError:
    pass
first = [int(m.group(1)) / 1e3 for m in re.finditer(r"first (\d+) us", open(f"{w}/first.txt").read())]
nxt = [int(m.group(1)) / 1e3 for m in re.finditer(r"next (\d+) us", open(f"{w}/first.txt").read())]
print(f"  first run (starts the helper): median {statistics.median(first):.1f} ms; the run after it {statistics.median(nxt):.1f} ms")
m = dict(re.findall(r"(no helper|during a run|helper idle): (\d+) ns", open(f"{w}/machine.txt").read()))
none, during, idle = (int(m[k]) for k in ("no helper", "during a run", "helper idle"))
print(f"  a syscall elsewhere on the machine: {during / none:.2f}x during a run, {idle / none:.2f}x with the helper idle")
print("  target: warm `roar run --tracer ebpf true` <= 10 ms over bare")
PY
stop_helpers
