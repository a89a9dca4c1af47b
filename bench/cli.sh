#!/usr/bin/env bash
# Install and CLI (issue 30), every figure against bare execution in the same run:
# - the size of what is installed (release binary, shim), and how long the release build took
#   when this script had to build it;
# - the fixed cost of `roar run true` with the shim installed beside the binary, and with the
#   binary alone using its built-in shim (written once to the cache beforehand);
# - what `--trace` (to a file) and `--summary` add to `roar run` on a 1,000-file workload and on
#   `true`: without the flags nothing changes, with them the cost is what is printed;
# - the peers: strace writing every file syscall to a file (what `--trace` is to strace users),
#   and the Python peer roar-cli's `roar run true` (its preload tracer; bench/lib/peer.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
t0=$(date +%s)
bash scripts/build.sh --release -q
built=$(( $(date +%s) - t0 ))
ROAR="$PWD/target/release/roar"
SHIM="$PWD/target/release/libroar_preload.so"
W="${BENCH_DIR:-/tmp/roar-bench-cli}"
rm -rf "$W" && mkdir -p "$W/alone/bin" "$W/work" "$W/cache"
cp "$ROAR" "$W/alone/bin/roar"
echo "== sizes (release build step took ${built} s; a no-op when already built)"
printf '  %-34s %8.1f MB\n' "roar (release, debug info stripped)" "$(stat -c %s "$ROAR" | awk '{print $1/1e6}')"
printf '  %-34s %8.1f MB\n' "libroar_preload.so" "$(stat -c %s "$SHIM" | awk '{print $1/1e6}')"
cd "$W/work"
"$ROAR" init > /dev/null
# The built-in shim is written to the cache by the first run; the timed runs find it there.
XDG_CACHE_HOME="$W/cache" "$W/alone/bin/roar" --version | sed 's/^/  /'
XDG_CACHE_HOME="$W/cache" "$W/alone/bin/roar" run --tracer preload -- true
cp "$REPO/bench/lib/files.c" files.c
cc -O2 -o files files.c
mkdir -p out
RUNS="${RUNS:-20}"
# roar-cli refuses dirty git trees: it runs in a committed scratch repository (as in bench/run.sh).
source "$REPO/bench/lib/peer.sh"
PEER_DIR="$W/peer"
mkdir -p "$PEER_DIR"
(cd "$PEER_DIR" && git init -q && "$PEER_VENV/bin/roar" init > /dev/null 2>&1 &&
    git add -A && git -c user.email=b@b -c user.name=b commit -qm init --allow-empty)
PEER=()
if (cd "$PEER_DIR" && "$PEER_VENV/bin/roar" run -q --tracer preload --no-tracer-fallback true > /dev/null 2>&1); then
    PEER=("roar-cli run true (peer)=sh -c 'cd $PEER_DIR && exec $PEER_VENV/bin/roar run -q --tracer preload --no-tracer-fallback true'")
else
    echo "roar-cli --tracer preload does not work here; left out"
fi
echo "== fixed cost and the live view"
# The binary alone finds its shim written out in this cache (the others do not look there).
export XDG_CACHE_HOME="$W/cache"
python3 "$REPO/bench/lib/compare.py" cli.json "$RUNS" \
    "bare true=true" \
    "roar run true (shim installed beside)=$ROAR run --tracer preload -- true" \
    "roar run true (built-in shim, binary alone)=$W/alone/bin/roar run --tracer preload -- true" \
    "roar run --trace-file true=$ROAR run --tracer preload --trace-file $W/trace.log -- true" \
    "roar run --summary true=$ROAR run --tracer preload --summary -- true" \
    "bare files 1000=./files 1000" \
    "roar run files 1000=$ROAR run --tracer preload -- ./files 1000" \
    "roar run --trace-file files 1000=$ROAR run --tracer preload --trace-file $W/trace.log -- ./files 1000" \
    "roar run --summary files 1000=$ROAR run --tracer preload --summary -- ./files 1000" \
    "strace -f file syscalls to a file, files 1000 (peer)=strace -f -qq -e trace=file -o $W/strace.log ./files 1000" \
    "${PEER[@]}"
python3 - cli.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = {k: v["median"] for k, v in r.items()}
def row(name, base):
    print(f"{name:46s} {m[name]*1e3:8.2f} ms  {m[name]/m[base]:6.2f}x bare  {(m[name]-m[base])*1e3:+8.2f} ms")
print(f"\n{'':46s} {'median':>11s}  {'ratio':>11s}  {'over bare':>11s}")
for name in m:
    base = "bare files 1000" if "files" in name else "bare true"
    row(name, base)
beside = m["roar run true (shim installed beside)"]
alone = m["roar run true (built-in shim, binary alone)"]
print(f"\nbuilt-in shim vs installed: {(alone-beside)*1e3:+.2f} ms per run")
for flag in ["--trace-file", "--summary"]:
    d = m[f"roar run {flag} files 1000"] - m["roar run files 1000"]
    print(f"{flag} on 1000 files: {d*1e3:+.2f} ms ({d/2000*1e6:+.2f} us per event pair)")
PY
