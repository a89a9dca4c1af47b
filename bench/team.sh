#!/usr/bin/env bash
# The team store (issue 31) on a real PostgreSQL started here on 127.0.0.1 (its own data
# directory, default settings, stopped at the end; never a system service):
#  - push throughput: 16 projects of 640 jobs x 100 file edges (crates/store/examples/
#    synth_store.rs) pushed by 16 concurrent `roar push`, then one more such project alone;
#  - queries over the resulting team store of 10,880 jobs and 1,088,000 file edges (all 17
#    projects): the first `--remote` query builds the local mirror; then `roar lineage --remote` (target <= 200 ms)
#    and others against the same query on the project's own store and `roar --version`;
#  - `roar run true` in a project with a remote that pushes after every job, against one
#    without a remote and bare `true` (the push runs in the background: P1 unchanged).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
cargo build --release --locked -q -p roar-cli
cargo build --release --locked -q -p roar-store --example synth_store
ROAR="$PWD/target/release/roar"
SYNTH="$PWD/target/release/examples/synth_store"
W="${BENCH_DIR:-/tmp/roar-bench-team}"
RUNS="${RUNS:-15}"
NODES=16
PER="${PER:-640}"
rm -rf "$W" && mkdir -p "$W"
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir "$W/pg"
AS=()
if [ "$(id -u)" = 0 ]; then
    chown postgres "$W/pg"
    AS=(runuser -u postgres --)
fi
"${AS[@]}" "$PGBIN/initdb" -D "$W/pg/data" -A trust -U roar -E UTF8 >/dev/null
"${AS[@]}" "$PGBIN/pg_ctl" -D "$W/pg/data" -l "$W/pg/log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $PORT -k $W/pg" start >/dev/null
trap '"${AS[@]}" "$PGBIN/pg_ctl" -D "$W/pg/data" -m fast -w stop >/dev/null' EXIT
"$PGBIN/createdb" -h 127.0.0.1 -p "$PORT" -U roar team
URL="postgres://roar@127.0.0.1:$PORT/team"
echo "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT (default settings: fsync on)"

echo "== $NODES projects of $PER jobs x 100 file edges"
for i in $(seq 1 $((NODES + 1))); do
    "$SYNTH" "$W/node$i" "$PER" 100 > "$W/node$i.target" 2>/dev/null
    (cd "$W/node$i" && "$ROAR" remote add origin "$URL" --no-auto-push 2>/dev/null)
done
echo "== push: $NODES concurrent pushers"
start=$(date +%s.%N)
for i in $(seq 1 $NODES); do
    (cd "$W/node$i" && "$ROAR" push 2>/dev/null) &
done
wait
end=$(date +%s.%N)
python3 - "$start" "$end" "$((NODES * PER))" <<'PY'
import sys
s, e, jobs = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
t = e - s
print(f"  {jobs} jobs, {jobs * 100} file records in {t:.2f} s: {jobs / t:,.0f} jobs/s, {jobs * 100 / t:,.0f} file records/s")
PY
echo "== push: one pusher alone ($PER jobs)"
start=$(date +%s.%N)
(cd "$W/node$((NODES + 1))" && "$ROAR" push 2>/dev/null)
end=$(date +%s.%N)
python3 - "$start" "$end" "$PER" <<'PY'
import sys
s, e, jobs = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
t = e - s
print(f"  {jobs} jobs, {jobs * 100} file records in {t:.2f} s: {jobs / t:,.0f} jobs/s, {jobs * 100 / t:,.0f} file records/s")
PY
JOBS=$("$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U roar -d team -At -c "SELECT count(*) FROM jobs")
EDGES=$("$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U roar -d team -At -c "SELECT count(*) FROM job_files")
echo "  team store: $JOBS jobs, $EDGES file edges"

cd "$W/node1"
TARGET=$(cat "$W/node1.target")
echo "== the first --remote query builds the mirror"
start=$(date +%s.%N)
"$ROAR" --remote origin log -n 1 >/dev/null
end=$(date +%s.%N)
python3 -c "import sys; print(f'  mirror of $JOBS jobs built in {float(sys.argv[2]) - float(sys.argv[1]):.1f} s')" "$start" "$end"
echo "== queries (target: lineage --remote under 200 ms)"
python3 "$REPO/bench/lib/compare.py" "$W/team.json" "$RUNS" \
    "roar --version (bare start)=$ROAR --version" \
    "lineage, own store ($PER jobs)=$ROAR lineage $TARGET" \
    "lineage --remote ($JOBS jobs)=$ROAR --remote origin lineage $TARGET" \
    "log --remote=$ROAR --remote origin log" \
    "show path --remote=$ROAR --remote origin show $TARGET"
python3 - "$W/team.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
base = r.pop("roar --version (bare start)")["median"]
print(f"\n{'query':40s} {'median':>9s} {'x bare start':>13s}  <200 ms")
for name, v in r.items():
    m = v["median"]
    print(f"{name:40s} {m*1e3:7.1f} ms {m/base:12.1f}x  {'yes' if m < 0.2 else 'NO'}")
PY

echo "== roar run true with a remote that pushes after every job (the push is in the background)"
for p in with-remote without-remote; do
    mkdir -p "$W/$p" && (cd "$W/$p" && git init -q . && "$ROAR" init >/dev/null)
done
(cd "$W/with-remote" && "$ROAR" remote add origin "$URL" 2>/dev/null)
RUNS_P1=$((RUNS * 2))
python3 - "$W" "$ROAR" "$RUNS_P1" <<'PY'
import json, os, random, statistics, subprocess, sys, time
w, roar, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
cmds = {
    "bare": (["true"], w),
    "roar run true, no remote": ([roar, "run", "--", "true"], f"{w}/without-remote"),
    "roar run true, remote (background push)": ([roar, "run", "--", "true"], f"{w}/with-remote"),
}
times = {k: [] for k in cmds}
for name, (argv, cwd) in cmds.items():
    subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(runs):
    order = list(cmds.items())
    random.shuffle(order)
    for name, (argv, cwd) in order:
        t = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times[name].append(time.perf_counter() - t)
        # Let a background push finish before the next command is timed.
        time.sleep(0.05)
bare = statistics.median(times["bare"])
for name, t in times.items():
    m = statistics.median(t)
    q = statistics.quantiles(t, n=4)
    print(f"  {name:42s} median {m*1e3:8.2f} ms  (IQR {q[0]*1e3:.2f}-{q[2]*1e3:.2f})  +{(m-bare)*1e3:.2f} ms over bare")
PY
PUSHED=$("$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U roar -d team -At \
    -c "SELECT count(*) FROM jobs WHERE convert_from(cwd, 'UTF8') = '$W/with-remote'")
LOCAL=$(cd "$W/with-remote" && "$ROAR" log -n 0 --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
echo "  jobs of the remote project in the team store after the runs: $PUSHED of $LOCAL"
