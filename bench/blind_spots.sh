#!/usr/bin/env bash
# The blind spots said (issue 56): what seeing them costs, before and after in one run.
# - The preload shim hooks libc's `syscall` to see io_uring_setup: a program making N system calls
#   through that symbol (bench/lib/syscalls.c, N = 1,000,000 getppid) under preload, this roar
#   against the roar before, beside bare.
# - The mount keeps a double-forked daemon in its parent's job by reading the kernel's fork events:
#   100 jobs, each a Python program whose daemonized grandchild writes one file and which writes
#   one itself once the daemon is done, through this roar's mount and the one before (which
#   records most daemons as jobs of their own: counted after the timing).
# Ratios only. ROAR_AFTER / ROAR_BEFORE: roars built already (shims beside them), else this
# checkout's and BEFORE_REV's (default 472c4f0, the commit before), built --release.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
source "$REPO/bench/lib/builds.sh"
ROAR="${ROAR_AFTER:-}"
roar_after
roar_before 472c4f0
RUNS="${RUNS:-10}"
N="${N:-1000000}"
W="${BENCH_DIR:-/tmp/roar-bench-blind}"
rm -rf "$W" && mkdir -p "$W" && cd "$W"
cc -O2 -o syscalls "$REPO/bench/lib/syscalls.c"
git init -q "$W/after" && git init -q "$W/before"
(cd "$W/after" && "$ROAR" init > /dev/null)
(cd "$W/before" && "$ROAR_BEFORE" init > /dev/null)
CMP="python3 $REPO/bench/lib/compare.py"

echo "== $N x syscall(SYS_getppid) through libc's symbol, under preload"
$CMP sys.json "$RUNS" \
    "bare=sh -c 'cd $W/after && exec $W/syscalls $N'" \
    "preload after=sh -c 'cd $W/after && exec $ROAR run --tracer preload -- $W/syscalls $N'" \
    "preload before=sh -c 'cd $W/before && exec $ROAR_BEFORE run --tracer preload -- $W/syscalls $N'"
python3 - "$W/sys.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = {k: v["median"] for k, v in r.items()}
print(f"  after/before {m['preload after'] / m['preload before']:.3f}; "
      f"after over bare {(m['preload after'] - m['bare']) * 1e3:.1f} ms, "
      f"before over bare {(m['preload before'] - m['bare']) * 1e3:.1f} ms")
PY

echo "== 100 jobs through roar mount, each a program whose double-forked daemon writes one file"
cat > "$W/daemon.py" <<'PY'
import os, sys
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(sys.argv[1], "w") as f:
            f.write("d\n")
        os.write(w, b"x")
    os._exit(0)
os.close(w)
os.wait()
os.read(r, 1)
with open(sys.argv[1] + ".p", "w") as f:
    f.write("p\n")
PY
for side in after before; do
    mkdir -p "$W/m$side/data" && git init -q "$W/m$side"
done
mkdir -p "$W/mplain/data"
(cd "$W/mafter" && "$ROAR" init > /dev/null && "$ROAR" mount data 2> /dev/null)
(cd "$W/mbefore" && "$ROAR_BEFORE" init > /dev/null && "$ROAR_BEFORE" mount data 2> /dev/null)
unmount_all() {
    (cd "$W/mafter" && "$ROAR" unmount data > /dev/null 2>&1) || true
    (cd "$W/mbefore" && "$ROAR_BEFORE" unmount data > /dev/null 2>&1) || true
}
trap unmount_all EXIT
daemon_jobs() { echo "cd $1/data && for i in \$(seq 100); do setsid -w python3 $W/daemon.py d\$i.txt; done"; }
$CMP mount.json "$RUNS" \
    --prepare "rm -f $W/mafter/data/d*.txt $W/mbefore/data/d*.txt $W/mplain/data/d*.txt" \
    "bare=sh -c '$(daemon_jobs "$W/mplain")'" \
    "mount after=sh -c '$(daemon_jobs "$W/mafter")'" \
    "mount before=sh -c '$(daemon_jobs "$W/mbefore")'"
python3 - "$W/mount.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = {k: v["median"] for k, v in r.items()}
print(f"  after/before {m['mount after'] / m['mount before']:.3f}; over bare: after {m['mount after'] / m['bare']:.2f}x, before {m['mount before'] / m['bare']:.2f}x")
PY
unmount_all
trap - EXIT
for side in after before; do
    r="$ROAR"; [ "$side" = before ] && r="$ROAR_BEFORE"
    n=$(cd "$W/m$side" && "$r" log --json --limit 0 2> /dev/null | python3 -c "import json,sys; print(len([j for j in json.load(sys.stdin) if 'daemon.py' in ' '.join(j.get('argv', []))]))")
    echo "  $side: $n jobs recorded for the programs run (one round more than RUNS: compare.py's warm-up)"
done
