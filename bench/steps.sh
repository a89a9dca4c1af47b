#!/usr/bin/env bash
# Steps inside a run (issue 28), every figure against bare execution in the same interleaved run:
# - `make -B -j2` of a 200-target Makefile (180 recipes `tr a-z A-Z < src > out`, 20 that join
#   nine of them with `cat`): bare, `roar run` under each backend with steps (the default), under
#   preload with steps off (`[steps] drivers = []`: what the step bookkeeping itself costs), with
#   ROAR_BEFORE (a roar built before steps existed, if given), and the Python peer roar-cli;
# - the fixed cost (`roar run true`) and the per-file cost (a program writing then reading 1,000
#   files) with steps on and off, which steps must leave unchanged (they only look at jobs that
#   exec'd twice), and the same program run by a shell script (`sh -c 'files 1000; true'`: two
#   execs, one step, known before any classification);
# - how many steps the make job recorded, and the recording time ROAR_TIMING reports;
# - the same make in a directory under `roar mount` (run as its own process group, as a shell
#   runs a command line), with steps on and off: what the mount's step log costs (a /proc read
#   per process, an event per access, the rule run when the job ends).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
bash scripts/build.sh --release -q
ROAR="$PWD/target/release/roar"
W="${BENCH_DIR:-/tmp/roar-bench-steps}"
rm -rf "$W" && mkdir -p "$W"
RUNS="${RUNS:-10}"
CMP="python3 $REPO/bench/lib/compare.py"

# One project per configuration, each with the same Makefile and sources.
make_project() {
    local dir="$1"
    mkdir -p "$dir/src" "$dir/out"
    (
        cd "$dir"
        {
            printf 'all:'
            for j in $(seq 0 19); do printf ' out/join%d.txt' "$j"; done
            printf '\n'
            for i in $(seq 0 179); do
                printf 'out/t%d.txt: src/s%d.txt\n\ttr a-z A-Z < src/s%d.txt > out/t%d.txt\n' "$i" "$i" "$i" "$i"
            done
            for j in $(seq 0 19); do
                printf 'out/join%d.txt:' "$j"
                for k in $(seq 0 8); do printf ' out/t%d.txt' $((j * 9 + k)); done
                printf '\n\tcat'
                for k in $(seq 0 8); do printf ' out/t%d.txt' $((j * 9 + k)); done
                printf ' > out/join%d.txt\n' "$j"
            done
        } > Makefile
        for i in $(seq 0 179); do head -c 4096 /dev/urandom | base64 > "src/s$i.txt"; done
        "$ROAR" init > /dev/null 2>&1 || true
    )
}
make_project "$W/on"
make_project "$W/off"
make_project "$W/bare"
printf '\n[steps]\ndrivers = []\n' >> "$W/off/.roar/config.toml"

EBPF=()
if "$ROAR" tracer check ebpf > /dev/null 2>&1; then
    EBPF=("roar run (ebpf)=sh -c 'cd $W/on && exec $ROAR run --tracer ebpf -- make -B -j2 -s'")
fi
BEFORE=()
if [ -n "${ROAR_BEFORE:-}" ]; then
    make_project "$W/before"
    BEFORE=("roar before steps (preload)=sh -c 'cd $W/before && exec $ROAR_BEFORE run --tracer preload -- make -B -j2 -s'")
fi
source "$REPO/bench/lib/peer.sh"
make_project "$W/peer"
(cd "$W/peer" && rm -rf .roar && "$PEER_VENV/bin/roar" init > /dev/null 2>&1 || true)

echo "== make -B -j2 on 200 targets (RUNS=$RUNS, interleaved)"
$CMP "$W/make.json" "$RUNS" --cpu \
    "bare=sh -c 'cd $W/bare && exec make -B -j2 -s'" \
    "bare2=sh -c 'cd $W/bare && exec make -B -j2 -s'" \
    "roar run (preload)=sh -c 'cd $W/on && exec $ROAR run --tracer preload -- make -B -j2 -s'" \
    "roar run (preload, steps off)=sh -c 'cd $W/off && exec $ROAR run --tracer preload -- make -B -j2 -s'" \
    "roar run (ptrace)=sh -c 'cd $W/on && exec $ROAR run --tracer ptrace -- make -B -j2 -s'" \
    "${EBPF[@]}" \
    "${BEFORE[@]}" \
    "roar-cli (peer)=sh -c 'cd $W/peer && exec $PEER_VENV/bin/roar run make -B -j2 -s'"
python3 - "$W/make.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bare = r.pop("bare")
b, bc = bare["median"], bare["cpu_median"]
print(f"\nbare {b * 1e3:.0f} ms wall, {bc * 1e3:.0f} ms CPU; noise floor (bare2 against bare): "
      f"{100 * abs(r['bare2']['median'] - b) / b:.1f} %")
for k, v in r.items():
    print(f"  {k:34s} {v['median'] / b:5.2f}x bare  (+{(v['median'] - b) * 1e3:6.0f} ms wall, "
          f"+{(v['cpu_median'] - bc) * 1e3:6.0f} ms CPU)")
off = r["roar run (preload, steps off)"]
on = r["roar run (preload)"]
print(f"  steps on against steps off (preload): {100 * (on['median'] - off['median']) / off['median']:+.1f} % wall")
PY
echo "== recording time of one make job, ROAR_TIMING=1 (steps on, then off)"
(cd "$W/on" && ROAR_TIMING=1 "$ROAR" run --tracer preload -- make -B -j2 -s 2>&1 >/dev/null | grep -i "roar:.*ms" | head -3)
(cd "$W/off" && ROAR_TIMING=1 "$ROAR" run --tracer preload -- make -B -j2 -s 2>&1 >/dev/null | grep -i "roar:.*ms" | head -3)
# The last job in $W/on is the preload one just timed (ptrace records a fork and an exec per
# process, so its process count is twice preload's).
(cd "$W/on" && "$ROAR" log --json -n 1 > "$W/last.json" &&
    "$ROAR" show "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["id"])' "$W/last.json")" --json > "$W/job.json")
python3 - "$W/job.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"the make job (preload): {len(j.get('steps', []))} steps, {len(j['processes'])} processes, {len(j['files'])} files")
PY

echo "== P1 and P2 with steps on and off: roar run true, and 1,000 files written then read"
cp "$REPO/bench/lib/files.c" "$W/files.c" && cc -O2 -o "$W/files" "$W/files.c"
mkdir -p "$W/on/f/out" "$W/off/f/out"
$CMP "$W/p12.json" "$((RUNS * 3))" \
    "bare true=true" \
    "true, steps on=sh -c 'cd $W/on && exec $ROAR run -- true'" \
    "true, steps off=sh -c 'cd $W/off && exec $ROAR run -- true'" \
    "bare files=sh -c 'cd $W/on/f && exec $W/files 1000'" \
    "files, steps on=sh -c 'cd $W/on/f && exec $ROAR run -- $W/files 1000'" \
    "files, steps off=sh -c 'cd $W/off/f && exec $ROAR run -- $W/files 1000'" \
    "bare script=sh -c 'cd $W/on/f && exec sh -c \"$W/files 1000; true\"'" \
    "script, steps on=sh -c 'cd $W/on/f && exec $ROAR run -- sh -c \"$W/files 1000; true\"'" \
    "script, steps off=sh -c 'cd $W/off/f && exec $ROAR run -- sh -c \"$W/files 1000; true\"'"
python3 - "$W/p12.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = {k: v["median"] * 1e3 for k, v in r.items()}
for what in ("true", "files", "script"):
    bare = m[f"bare {what}"]
    on, off = m[f"{what}, steps on"], m[f"{what}, steps off"]
    print(f"  {what:6s} bare {bare:7.2f} ms; steps on +{on - bare:6.2f} ms, steps off +{off - bare:6.2f} ms "
          f"(on - off {on - off:+.2f} ms)")
PY

echo "== make -B -j2 on 200 targets under roar mount (steps on, then off; RUNS=$RUNS, interleaved)"
if [ "$(id -u)" != 0 ] || [ ! -e /dev/fuse ]; then
    echo "  skipped: roar mount needs root and /dev/fuse"
    exit 0
fi
for c in mon moff; do
    mkdir -p "$W/$c"
    (cd "$W/$c" && "$ROAR" init > /dev/null 2>&1 || true)
    make_project "$W/$c/data"
    rm -rf "$W/$c/data/.roar"
done
printf '\n[steps]\ndrivers = []\n' >> "$W/moff/.roar/config.toml"
(cd "$W/mon" && "$ROAR" mount data > /dev/null)
(cd "$W/moff" && "$ROAR" mount data > /dev/null)
trap '(cd "$W/mon" && "$ROAR" unmount data > /dev/null 2>&1); (cd "$W/moff" && "$ROAR" unmount data > /dev/null 2>&1)' EXIT
$CMP "$W/mount.json" "$RUNS" --cpu \
    "bare=sh -c 'cd $W/bare && exec make -B -j2 -s'" \
    "mount, steps on=sh -c 'cd $W/mon/data && exec setsid -w make -B -j2 -s'" \
    "mount, steps off=sh -c 'cd $W/moff/data && exec setsid -w make -B -j2 -s'"
(cd "$W/mon" && "$ROAR" unmount data > /dev/null && "$ROAR" log --json -n 1 > "$W/mlast.json" &&
    "$ROAR" show "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["id"])' "$W/mlast.json")" --json > "$W/mjob.json")
(cd "$W/moff" && "$ROAR" unmount data > /dev/null)
trap - EXIT
python3 - "$W/mount.json" "$W/mjob.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b = r["bare"]["median"]
for k, v in r.items():
    print(f"  {k:20s} {v['median'] / b:5.2f}x bare  (+{(v['median'] - b) * 1e3:6.0f} ms wall)")
on, off = r["mount, steps on"]["median"], r["mount, steps off"]["median"]
print(f"  steps on against steps off (mount): {100 * (on - off) / off:+.1f} % wall")
j = json.load(open(sys.argv[2]))
print(f"the last make job under the mount: {len(j.get('steps', []))} steps, {len(j['files'])} files")
PY
