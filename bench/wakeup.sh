#!/usr/bin/env bash
# Where a traced or mounted open's time goes (issues 23 and 34): every ptrace stop and every FUSE
# request is a round trip between two tasks, so its cost is the machine's wake-up latency, which
# differs by an order of magnitude between machines and between one CPU and two.
# - the round trip itself: two processes passing one byte back and forth over pipes, placed by
#   the scheduler, both pinned to one CPU, and pinned to two CPUs;
# - N open+close of one file: bare, under `roar run` with preload and ptrace, under strace (the
#   ptrace peer, with its seccomp filter), through `roar mount` and through bindfs (the FUSE
#   peer); ptrace, strace and the mount again with everything on one CPU (taskset -c 0; the
#   mount's daemon started pinned too). roar never pins a traced program: one CPU shows the floor
#   the round trips reach when no wake-up crosses CPUs. Two more rows measure the mechanism a
#   tracer could be built on instead (bench/lib/notif.c: a seccomp user notification per open,
#   answered after reading the path, with and without SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP);
# - the same opens spread out, with 1 ms of computation after each (as a training loop opens its
#   shards): the program never sleeps, but a tracer waits long enough between stops for its CPU
#   to go idle (on a VM: to halt), so every stop pays the wake-up of a sleeping CPU.
# Each added cost is also given in round trips of the first measurement.
# The mount runs twice: as configured (over FUSE's io_uring transport with URING=1,
# bench/lib/uring.sh) and over /dev/fuse (ROAR_MOUNT_URING=0); the first mount's transport is
# printed.
# HALT_POLL_NS=200000 runs it with guest halt-polling on (cpuidle-haltpoll's guest_halt_poll_ns,
# a machine-wide setting put back when the benchmark ends): what the same code costs on a VM
# whose idle vCPUs spin a while before halting.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
bash scripts/build.sh --release -q
ROAR="$PWD/target/release/roar"
W="${BENCH_DIR:-/tmp/roar-bench-wakeup}"
RUNS="${RUNS:-10}"
N="${N:-20000}"
command -v bindfs > /dev/null || { apt-get install -y -qq bindfs > /dev/null || { apt-get update -qq && apt-get install -y -qq bindfs > /dev/null; }; }
command -v strace > /dev/null || apt-get install -y -qq strace > /dev/null
if [ "$(nproc)" -lt 2 ]; then
    echo "bench/wakeup.sh: needs two CPUs (this machine has $(nproc)): the point is one CPU against two" >&2
    exit 1
fi
POLL=/sys/module/haltpoll/parameters/guest_halt_poll_ns
if [ -n "${HALT_POLL_NS:-}" ] && [ ! -w "$POLL" ]; then
    echo "bench/wakeup.sh: HALT_POLL_NS needs $POLL (cpuidle-haltpoll, root)" >&2
    exit 1
fi
POLL_BEFORE=""  # the setting to put back, once this script has changed it
cleanup() {
    if [ -n "$POLL_BEFORE" ]; then echo "$POLL_BEFORE" > "$POLL"; fi
    if declare -F uring_restore > /dev/null; then uring_restore; fi
    cd /
    # roar unmount runs in the project (it stops the daemon); umount -l alone would leave it running.
    for m in "$W/p/mnt" "$W/p/mnt1" "$W/p/mnt2"; do mountpoint -q "$m" && { (cd "$W/p" && "$ROAR" unmount "$m") > /dev/null 2>&1 || umount -l "$m"; }; done
    mountpoint -q "$W/bind" && umount "$W/bind"
    return 0
}
cleanup
trap cleanup EXIT
source "$REPO/bench/lib/uring.sh"
if [ -n "${HALT_POLL_NS:-}" ]; then
    POLL_BEFORE=$(cat "$POLL")
    echo "$HALT_POLL_NS" > "$POLL"
fi
rm -rf "$W" && mkdir -p "$W/p/mnt" "$W/p/mnt1" "$W/p/mnt2" "$W/native" "$W/bind" && cd "$W"

cat > pingpong.c <<'C'
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
/* N round trips of one byte between a parent and its child over two pipes. With two more
 * arguments the parent runs on CPU A and the child on CPU B. */
static void pin(const char *cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(atoi(cpu), &s);
    if (sched_setaffinity(0, sizeof s, &s)) exit(2);
}
int main(int argc, char **argv) {
    int n = atoi(argv[1]), ab[2], ba[2];
    char c = 0;
    if (pipe(ab) || pipe(ba)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        if (argc > 3) pin(argv[3]);
        for (int i = 0; i < n; i++)
            if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1) return 1;
        return 0;
    }
    if (argc > 3) pin(argv[2]);
    for (int i = 0; i < n; i++)
        if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1) return 1;
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
C
cc -O2 -o pingpong pingpong.c
cp "$REPO/bench/lib/opens.c" opens.c
cc -O2 -o opens opens.c
cc -O2 -pthread -o notif "$REPO/bench/lib/notif.c"
(cd p && git init -q . && git config user.email b@b && git config user.name b && "$ROAR" init > /dev/null)
for d in p p/mnt p/mnt1 p/mnt2 native; do echo input > "$d/in"; done
transport() { python3 -c 'import json, sys; print(json.load(sys.stdin)["transport"])'; }
echo "roar mount: requests over $(cd p && "$ROAR" mount mnt --json | transport) (enable_uring $(cat "$URING_PARAM" 2> /dev/null || echo -))"
(cd p && taskset -c 0 "$ROAR" mount mnt1 > /dev/null)
(cd p && ROAR_MOUNT_URING=0 "$ROAR" mount mnt2 > /dev/null)
bindfs "$W/native" "$W/bind"
CMP="python3 $REPO/bench/lib/compare.py"
O="$W/opens"
in_dir() { printf '%s\n' "sh -c 'cd $1 && exec ${*:2}'"; }
NOTIF=()
SPREAD=()
for m in sync async; do
    if why=$(cd p && "$W/notif" "$m" "$O" 1 2>&1); then
        NOTIF+=("seccomp notification, $m=$(in_dir "$W/p" "$W/notif $m $O $N")")
        SPREAD+=("seccomp notification, $m=$(in_dir "$W/p" "$W/notif $m $O $((N / 20)) 1000")")
    else
        echo "seccomp notification, $m: left out ($why)"
    fi
done

# How idle CPUs sleep decides what a wake-up costs: a vCPU that halts leaves the VM and must be
# brought back; guest halt-polling (cpuidle-haltpoll's guest_halt_poll_ns) spins a while first.
idle=/sys/devices/system/cpu/cpuidle
echo "cpuidle: driver $(cat $idle/current_driver 2> /dev/null || echo none), governor $(cat $idle/current_governor_ro $idle/current_governor 2> /dev/null | head -1 || echo none), guest_halt_poll_ns $(cat "$POLL" 2> /dev/null || echo -)"
echo "== one round trip between two processes (pipes, $N round trips a run; $RUNS rounds)"
$CMP pingpong.json "$RUNS" \
    "placed by the scheduler=$W/pingpong $N" \
    "one CPU=taskset -c 0 $W/pingpong $N" \
    "two CPUs=$W/pingpong $N 0 1"

echo "== $N open+close of one file ($RUNS interleaved rounds)"
$CMP opens.json "$RUNS" \
    "bare=$(in_dir "$W/p" "$O $N")" \
    "bare, one CPU=taskset -c 0 $(in_dir "$W/p" "$O $N")" \
    "roar run preload=$(in_dir "$W/p" "$ROAR run --tracer preload -- $O $N")" \
    "roar run ptrace=$(in_dir "$W/p" "$ROAR run --tracer ptrace -- $O $N")" \
    "roar run ptrace, one CPU=taskset -c 0 $(in_dir "$W/p" "$ROAR run --tracer ptrace -- $O $N")" \
    "strace=$(in_dir "$W/p" "strace -f -qq --seccomp-bpf -e trace=open,openat -o /dev/null $O $N")" \
    "strace, one CPU=taskset -c 0 $(in_dir "$W/p" "strace -f -qq --seccomp-bpf -e trace=open,openat -o /dev/null $O $N")" \
    "roar mount=$(in_dir "$W/p/mnt" "$O $N")" \
    "roar mount over /dev/fuse=$(in_dir "$W/p/mnt2" "$O $N")" \
    "roar mount, one CPU=taskset -c 0 $(in_dir "$W/p/mnt1" "$O $N")" \
    "bindfs=$(in_dir "$W/bind" "$O $N")" \
    "${NOTIF[@]}"

python3 - "$N" <<'PY'
import json, sys
n = int(sys.argv[1])
pp = {k: v["median"] / n * 1e6 for k, v in json.load(open("pingpong.json")).items()}
op = {k: v["median"] for k, v in json.load(open("opens.json")).items()}
rtt = pp["two CPUs"]
print("round trip (us):  " + ",  ".join(f"{k} {v:.1f}" for k, v in pp.items()))
bare = op["bare"]
print(f"{'open+close':28s} {'x bare':>8s} {'added us/open':>14s} {'in round trips across CPUs':>28s}")
for k, t in op.items():
    base = op["bare, one CPU"] if k.endswith("one CPU") else bare
    added = (t - base) / n * 1e6
    print(f"{k:28s} {t / bare:8.2f} {added:14.1f} {added / rtt:28.2f}")
PY

S=$((N / 20))
echo "== $S open+close with 1 ms of computation after each ($RUNS interleaved rounds)"
$CMP spread.json "$RUNS" \
    "bare=$(in_dir "$W/p" "$O $S 1000")" \
    "roar run preload=$(in_dir "$W/p" "$ROAR run --tracer preload -- $O $S 1000")" \
    "roar run ptrace=$(in_dir "$W/p" "$ROAR run --tracer ptrace -- $O $S 1000")" \
    "strace=$(in_dir "$W/p" "strace -f -qq --seccomp-bpf -e trace=open,openat -o /dev/null $O $S 1000")" \
    "roar mount=$(in_dir "$W/p/mnt" "$O $S 1000")" \
    "${SPREAD[@]}"
python3 - "$S" <<'PY'
import json, sys
n = int(sys.argv[1])
rtt = json.load(open("pingpong.json"))["two CPUs"]["median"] / 20 / n * 1e6
op = {k: v["median"] for k, v in json.load(open("spread.json")).items()}
print(f"{'open+close, then 1 ms':28s} {'x bare':>8s} {'added us/open':>14s} {'in round trips across CPUs':>28s}")
for k, t in op.items():
    added = (t - op["bare"]) / n * 1e6
    print(f"{k:28s} {t / op['bare']:8.2f} {added:14.1f} {added / rtt:28.2f}")
PY
