#!/usr/bin/env bash
# End-to-end overhead on a realistic pipeline of about 30 s: a Python preprocessing step reading
# 500 shards and writing features, then a training-like step that reads the features and writes
# a checkpoint every few seconds. Run bare, under `roar run` (preload, ptrace, eBPF), with the data
# directory under `roar mount` and no `roar run` (as configured: over io_uring with URING=1;
# and over /dev/fuse), and under the Python peer `roar-cli`, all in the
# same session; overhead in percent of bare, with the noise floor (bare against itself) and the
# CPU each variant adds (the whole process tree: roar, the shim inside the job, the job). Then a
# breakdown per backend from one more run each with ROAR_TIMING: roar's own CPU (all its threads)
# against the CPU the job itself gained, and ptrace's stops per data file opened; then what the
# mount's daemon served per file (requests by kind, its CPU, how many it caught polling). The
# rows "not polling" are this roar with the adaptive poll off (ROAR_PTRACE_POLL_US=0,
# ROAR_MOUNT_POLL_US=0): issue 65's before/after in the same run. ROAR_BEFORE=/path/to/roar adds an older roar's preload
# row (its shim beside it), its ptrace row and its mount row to the comparison. NOT_KEPT=1 adds
# the preload, ptrace and mount rows of this roar with `[keep]` off (issue 58: what keeping every output
# and untracked input costs), in a copy of the project.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
source "$REPO/bench/lib/uring.sh"
trap uring_restore EXIT
bash scripts/build.sh --release -q
ROAR="${CARGO_TARGET_DIR:-$PWD/target}/release/roar"
W="${BENCH_DIR:-/tmp/roar-bench-pipeline}"
RUNS="${RUNS:-3}"
# Training epochs: 40 makes the bare pipeline about 30 s on the 2-core CI machine (preprocessing
# ~4 s, ~0.65 s per epoch); EPOCHS=3 gives a 6 s version for a quick look.
EPOCHS="${EPOCHS:-40}"
mountpoint -q "$W/data" 2>/dev/null && { "$ROAR" unmount "$W/data" 2>/dev/null || umount -l "$W/data"; }
rm -rf "$W" "$W-peer" "$W-nokeep" "$W-before" && mkdir -p "$W/data/shards" && cd "$W"
git init -q . && git config user.email b@b && git config user.name b

python3 - <<'PY'
import random
random.seed(1)
for i in range(500):
    with open(f"data/shards/shard{i:03d}.csv", "w") as f:
        for _ in range(2000):
            f.write(",".join(f"{random.random():.6f}" for _ in range(8)) + "\n")
PY
cat > prep.py <<'PY'
import glob, os, struct
os.makedirs("data/features", exist_ok=True)
for path in sorted(glob.glob("data/shards/*.csv")):
    rows = [list(map(float, l.split(","))) for l in open(path)]
    means = [sum(c) / len(c) for c in zip(*rows)]
    out = os.path.join("data/features", os.path.basename(path) + ".bin")
    with open(out, "wb") as f:
        for r in rows:
            f.write(struct.pack("8d", *[x - m for x, m in zip(r, means)]))
PY
cat > train.py <<PY
import glob, os, struct
EPOCHS = $EPOCHS
w = [0.0] * 8
files = sorted(glob.glob("data/features/*.bin"))
os.makedirs("data/ckpt", exist_ok=True)
for epoch in range(EPOCHS):
    for i, path in enumerate(files):
        data = open(path, "rb").read()
        for j in range(0, len(data), 64 * 4):
            x = struct.unpack_from("8d", data, j)
            err = sum(a * b for a, b in zip(w, x)) - x[0]
            w = [a - 1e-3 * err * b for a, b in zip(w, x)]
        if i % 250 == 249:
            tmp = f"data/ckpt/epoch{epoch}-{i}.tmp"  # written, then renamed into place
            with open(tmp, "wb") as f:
                f.write(struct.pack("8d", *w) * 4096)
            os.rename(tmp, tmp[:-4] + ".ckpt")
PY
printf 'data/\n.roar/\n' > .gitignore
"$ROAR" init > /dev/null
source "$REPO/bench/lib/peer.sh"
cat > steps.sh <<'SH'
#!/bin/sh
# $1: how to run each step ("" for bare). Starts from clean outputs.
set -e
rm -rf data/features data/ckpt
$1 python3 prep.py
$1 python3 train.py
SH
cat > mounted.sh <<'SH'
#!/bin/sh
# $1: the roar binary that mounts.
set -e
rm -rf data/features data/ckpt
"$1" mount data > /dev/null 2>&1
setsid --wait python3 prep.py
setsid --wait python3 train.py
"$1" unmount data > /dev/null 2>&1
SH
chmod +x steps.sh mounted.sh
# The peer refuses to run on a dirty tree: commit everything first.
git add -A && git commit -qm pipeline
# The peer needs a committed tree and its own project; it records into .roar/ too, so it runs in a
# copy of this directory.
cp -r "$W" "$W-peer"
rm -rf "$W-peer/.roar" && (cd "$W-peer" && "$PEER_VENV/bin/roar" init > /dev/null 2>&1 || true)

# The mount's transport: io_uring with URING=1 (bench/lib/uring.sh), and the "over /dev/fuse" row
# either way.
echo "roar mount: requests over $("$ROAR" mount data --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["transport"])') (enable_uring $(cat /sys/module/fuse/parameters/enable_uring 2> /dev/null || echo -))"
"$ROAR" unmount data > /dev/null 2>&1
# eBPF joins where it loads (its resident helper started by the warm-up run).
EBPF=()
if "$ROAR" tracer check ebpf > /dev/null; then
    EBPF=("roar run (ebpf)=sh steps.sh '$ROAR run --tracer ebpf --'")
else
    echo "eBPF left out: $("$ROAR" tracer check ebpf)"
fi
NOT_KEPT_ROWS=()
if [ -n "${NOT_KEPT:-}" ]; then
    rm -rf "$W-nokeep" && cp -r "$W" "$W-nokeep" && rm -rf "$W-nokeep/.roar"
    (cd "$W-nokeep" && "$ROAR" init > /dev/null && printf '\n[keep]\noutputs = false\ninputs = "none"\n' >> .roar/config.toml)
    NOT_KEPT_ROWS=("roar run (preload, not kept)=sh -c 'cd $W-nokeep && sh steps.sh \"$ROAR run --tracer preload --\"'"
                   "roar run (ptrace, not kept)=sh -c 'cd $W-nokeep && sh steps.sh \"$ROAR run --tracer ptrace --\"'"
                   "roar mount (not kept)=sh -c 'cd $W-nokeep && sh mounted.sh $ROAR'")
fi
BEFORE=()
if [ -n "${ROAR_BEFORE:-}" ]; then
    # Its own copy of the project and a store it made: an older roar refuses a newer schema.
    rm -rf "$W-before" && cp -r "$W" "$W-before" && rm -rf "$W-before/.roar"
    (cd "$W-before" && "$ROAR_BEFORE" init > /dev/null)
    BEFORE=("roar run (preload, before)=sh -c 'cd $W-before && sh steps.sh \"$ROAR_BEFORE run --tracer preload --\"'"
            "roar run (ptrace, before)=sh -c 'cd $W-before && sh steps.sh \"$ROAR_BEFORE run --tracer ptrace --\"'"
            "roar mount (before)=sh -c 'cd $W-before && sh mounted.sh $ROAR_BEFORE'")
fi
python3 "$REPO/bench/lib/compare.py" pipeline.json "$RUNS" --cpu \
    "bare=sh steps.sh" \
    "bare2=sh steps.sh" \
    "roar run (preload)=sh steps.sh '$ROAR run --tracer preload --'" \
    "roar run (ptrace)=sh steps.sh '$ROAR run --tracer ptrace --'" \
    "roar run (ptrace), not polling=env ROAR_PTRACE_POLL_US=0 sh steps.sh '$ROAR run --tracer ptrace --'" \
    "${EBPF[@]}" \
    "${BEFORE[@]}" \
    "${NOT_KEPT_ROWS[@]}" \
    "roar mount=sh mounted.sh '$ROAR'" \
    "roar mount over /dev/fuse=env ROAR_MOUNT_URING=0 sh mounted.sh '$ROAR'" \
    "roar mount, not polling=env ROAR_MOUNT_POLL_US=0 sh mounted.sh '$ROAR'" \
    "roar-cli (peer)=sh -c 'cd $W-peer && sh steps.sh \"$PEER_VENV/bin/roar run\"'"
python3 - <<'PY'
import json
r = json.load(open("pipeline.json"))
bare = r.pop("bare")
b, bc = bare["median"], bare["cpu_median"]
noise = 100 * abs(r["bare2"]["median"] - b) / b
# The medians of bare and bare2 can agree while single runs swing: the spread of all bare runs
# says how far one run of a variant may be from its own median.
runs = bare["times"] + r["bare2"]["times"]
spread = 100 * (max(runs) - min(runs)) / b
print(f"\nbare {b:.1f} s wall, {bc:.1f} s CPU; noise floor (bare2 against bare): {noise:.1f} %; bare runs spread over {spread:.1f} %")
print("overhead in percent of bare (medians of interleaved runs), and the CPU each adds:")
for k, v in r.items():
    print(f"  {k:28s} wall {100 * (v['median'] - b) / b:+6.1f} %   CPU {v['cpu_median'] - bc:+7.2f} s ({100 * (v['cpu_median'] - bc) / bc:+5.1f} %)")
PY
echo "== breakdown: one more run per backend with ROAR_TIMING=1 (both steps summed)"
BACKENDS=(preload ptrace)
[ ${#EBPF[@]} -gt 0 ] && BACKENDS+=(ebpf)
for t in "${BACKENDS[@]}"; do
    ROAR_TIMING=1 sh steps.sh "$ROAR run --tracer $t --" 2> "timing-$t.txt" > /dev/null
done
OPENS=$((1000 + EPOCHS * 500)) python3 - "${BACKENDS[@]}" <<'PY'
import json, os, re, sys
OPENS = int(os.environ["OPENS"])
r = json.load(open("pipeline.json"))
bare_cpu = r["bare"]["cpu_median"]
for t in sys.argv[1:]:
    text = open(f"timing-{t}.txt").read()
    own = sum(float(x) for x in re.findall(r"roar's own CPU ([\d.]+) ms", text)) / 1e3
    cmd = sum(float(x) for x in re.findall(r"\(command ([\d.]+) ms\)", text)) / 1e3
    total = r[f"roar run ({t})"]["cpu_median"]
    stops = sum(int(x) for x in re.findall(r"stopped (\d+) times", text))
    said = f"; {stops / OPENS:.2f} stops per data file opened" if stops else ""
    print(f"  {t:8s} roar's own threads {own:6.2f} s CPU; the job and its children {total - own - bare_cpu:+6.2f} s CPU against bare; steps' wall {cmd:.1f} s{said}")
PY
# What the mount's daemon served per file: one more run of each step through it, with and
# without polling (requests and CPU do not depend on how fast this machine wakes up).
echo "== the mount's requests (counted by its daemon): prep.py per shard (read one, write one), train.py per feature file opened"
for poll in "" 0; do
    rm -rf data/features data/ckpt
    env ${poll:+ROAR_MOUNT_POLL_US=$poll} "$ROAR" mount data > /dev/null 2>&1
    python3 "$REPO/bench/lib/served.py" snap "$ROAR" "$W/data" s0.json
    setsid --wait python3 prep.py
    python3 "$REPO/bench/lib/served.py" snap "$ROAR" "$W/data" s1.json
    setsid --wait python3 train.py
    python3 "$REPO/bench/lib/served.py" snap "$ROAR" "$W/data" s2.json
    "$ROAR" unmount data > /dev/null 2>&1
    if [ -n "$poll" ]; then echo "  not polling (ROAR_MOUNT_POLL_US=0):"; else echo "  polling (as configured):"; fi
    echo "    prep.py  $(python3 "$REPO/bench/lib/served.py" per s0.json s1.json 500 shard)"
    echo "    train.py $(python3 "$REPO/bench/lib/served.py" per s1.json s2.json $((EPOCHS * 500)) open)"
done
"$ROAR" log -n 4
