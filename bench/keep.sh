#!/usr/bin/env bash
# Versions kept (issue 58): what keeping every output costs `roar run`.
#  1. P2 — write+read N x 4 KiB (N = 2000) under `roar run`, every output kept, against the same
#     roar with `[keep]` off and bare execution, interleaved round by round (bench/lib/compare.py);
#     each command ends with `sync`, so the copies' writeback is charged to the run that made
#     them, not to whichever command follows;
#  2. bytes roar reads from the files it keeps per byte kept, for big outputs hashed while the job
#     runs (each written, then the job sleeps) and at its end (written just before it exits):
#     every read(2)/pread64(2) on those files under `strace -f -y`, against the bytes kept;
#  3. the object store's size on disk against the bytes it keeps;
#  4. the same bytes ratio through `roar mount` (the daemon under strace, a job writing the files
#     through the mount), and for untracked inputs a job reads through the mount.
# Every figure is a ratio. ROAR=/path/to/roar measures a roar built already.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
source "$REPO/bench/lib/builds.sh"
roar_after
RUNS="${RUNS:-10}"
N="${N:-2000}"
BIG_FILES="${BIG_FILES:-8}"
BIG_MIB="${BIG_MIB:-16}"
W="${BENCH_DIR:-/tmp/roar-bench-keep}"
rm -rf "$W" && mkdir -p "$W/plain/out" && cd "$W"
cc -O2 -o files "$REPO/bench/lib/files.c"
cp files plain/
CMP="python3 $REPO/bench/lib/compare.py"
BACKENDS=(preload ptrace)
"$ROAR" tracer check ebpf > /dev/null && BACKENDS+=(ebpf)
OFF=$'\n[keep]\noutputs = false\ninputs = "none"\n'

echo "== P2: write+read $N x 4 KiB under roar run, outputs kept (on) or not (off)"
rows=()
for b in "${BACKENDS[@]}"; do
    rows+=("$b on=sh -c 'ROAR_DIR=$W/on/.roar $ROAR run --tracer $b -- ./files $N && sync'"
           "$b off=sh -c 'ROAR_DIR=$W/off/.roar $ROAR run --tracer $b -- ./files $N && sync'")
done
(cd "$W/plain" && $CMP "$W/p2.json" "$RUNS" \
    --prepare "rm -rf out $W/on $W/off; mkdir -p out $W/on $W/off; $ROAR init $W/on > /dev/null; $ROAR init $W/off > /dev/null; printf '%s' '$OFF' >> $W/off/.roar/config.toml; sync" \
    "bare=sh -c './files $N && sync'" "${rows[@]}")

# ratio LABEL DIR TRACE PATHPART: bytes read from files whose path holds PATHPART (every
# read/pread64/copy_file_range in DIR/TRACE.*) per byte in DIR's object store.
ratio() {
    python3 - "$@" <<'PY'
import glob, os, re, sys
label, w, trace, part = sys.argv[1:5]
read = 0
for name in glob.glob(f"{w}/{trace}.*"):
    for line in open(name, errors="replace"):
        m = re.match(r"(?:read|pread64|copy_file_range)\(\d+<([^>]*)>.*= (\d+)$", line.strip())
        if m and part in m.group(1):
            read += int(m.group(2))
kept = 0
for root, _, files in os.walk(f"{w}/.roar/s3/blobs"):
    kept += sum(os.path.getsize(os.path.join(root, f)) for f in files)
print(f"  {label:12}: {read / max(kept, 1):.3f} bytes read per byte kept "
      f"({read >> 20} MiB read, {kept >> 20} MiB kept)")
PY
}

echo "== bytes read per byte kept: $BIG_FILES x $BIG_MIB MiB outputs"
mkdir -p "$W/big" && cd "$W/big"
git init -q . && "$ROAR" init > /dev/null
for mode in early end; do
    rm -rf out .roar/s3 && mkdir out
    pause=$([ "$mode" = early ] && echo 0.2 || echo 0)
    rm -f trace.$mode.*
    # One file per thread (-ff): a call is never split across lines by another thread's.
    strace -ff -qq -y -e trace=read,pread64,copy_file_range -e signal=none -o "trace.$mode" \
        "$ROAR" run --tracer preload -- sh -c \
        "for i in \$(seq $BIG_FILES); do head -c $((BIG_MIB << 20)) /dev/urandom > out/b\$i; sleep $pause; done" \
        > /dev/null 2>&1
    ratio "hashed $mode" "$W/big" "trace.$mode" /out/b
done
# through_mount LABEL DIR JOB: a project in DIR (made by the caller, its files in DIR/data), the
# daemon mounting DIR/data under strace, JOB run in data/ as one job of its own; then the ratio.
through_mount() {
    local label=$1 dir=$2 job=$3
    cd "$dir"
    rm -f trace.mount.*
    strace -ff -qq -y -e trace=read,pread64,copy_file_range -e signal=none -o trace.mount \
        "$ROAR" mount --foreground data > /dev/null 2>&1 &
    for _ in $(seq 100); do mountpoint -q data && break; sleep 0.1; done
    (cd data && setsid -w sh -c "$job")
    "$ROAR" unmount data > /dev/null 2>&1
    wait
    ratio "$label" "$dir" trace.mount /data/b
}
echo "== the same through roar mount: $BIG_FILES x $BIG_MIB MiB written through the mount"
mkdir -p "$W/mnt/data" && (cd "$W/mnt" && git init -q . && "$ROAR" init > /dev/null)
through_mount mount "$W/mnt" \
    "for i in \$(seq $BIG_FILES); do head -c $((BIG_MIB << 20)) /dev/urandom > b\$i; done"
echo "== inputs read through roar mount: $BIG_FILES x $BIG_MIB MiB untracked files a job reads"
mkdir -p "$W/mnt-in/data" && (cd "$W/mnt-in" && git init -q . && "$ROAR" init > /dev/null)
for i in $(seq "$BIG_FILES"); do head -c $((BIG_MIB << 20)) /dev/urandom > "$W/mnt-in/data/b$i"; done
through_mount "mount input" "$W/mnt-in" 'cat b* > /dev/null'
cd "$W/big"
disk=$(du -sk .roar/s3/blobs | cut -f1)
kept=$(find .roar/s3/blobs -type f -printf '%s\n' | awk '{s += $1} END {print s}')
echo "  object store on disk: $(python3 -c "print(f'{$disk * 1024 / max($kept, 1):.3f}')") x the bytes it keeps"

python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
d = json.load(open(f"{w}/p2.json"))
bare = d["bare"]["median"]
print("\n== P2 ratios (median)")
for b in sorted({k.rsplit(" ", 1)[0] for k in d if k != "bare"}):
    on, off = d[f"{b} on"]["median"], d[f"{b} off"]["median"]
    print(f"  {b:8} kept {on / bare:6.3f}x bare  not kept {off / bare:6.3f}x bare  kept/not {on / off:6.3f}")
PY
