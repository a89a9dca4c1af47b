#!/usr/bin/env bash
# The team store at fleet scale (issues 31, 66), on a real PostgreSQL started here on 127.0.0.1
# (its own data directory, default settings, fsync on; stopped at the end, never a system service):
#  - a simulated fleet (crates/fleet): NODES processes each write their own project store, with
#    their own host name, a job stream of pipelines with steps, a shared dataset ingested across
#    nodes, checkpoints overwritten and distributed runs of 8-64 ranks across nodes;
#  - push throughput: the first half of the nodes pushed by 16 concurrent `roar push`, the second
#    half by 64 at once (jobs/s and file records/s);
#  - bytes per file record in PostgreSQL (the whole database over the file records);
#  - from a node's project: the first `--remote` query (builds the mirror), then `--remote lineage`
#    of the checkpoint of the last 64-rank run (a chain of runs over the dataset), `log` and
#    `status`, median and p99 of RUNS each (status: STATUS_RUNS, default 5) (goals: lineage p99 <= 100 ms, >= 5,000 jobs/s pushed,
#    <= 200 B per file record);
#  - `roar run true` in a project with a remote that pushes after every job, against one
#    without a remote and bare `true` (the push runs in the background: P1 unchanged).
# Scale: NODES (default 128) x JOBS per node (default 1000: about 128,000 jobs and 11 million
# file records, ~10 min here); say what was reached, scaled to the disk.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
bash scripts/build.sh --release -q
cargo build --release --locked -q -p roar-fleet
ROAR="$PWD/target/release/roar"
FLEET="$PWD/target/release/roar-fleet"
W="${BENCH_DIR:-/tmp/roar-bench-team}"
RUNS="${RUNS:-30}"
NODES="${NODES:-128}"
JOBS="${JOBS:-1000}"
SEED="${SEED:-66}"
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
    -o "-c listen_addresses=127.0.0.1 -p $PORT -k $W/pg -c max_connections=200" start >/dev/null
trap '"${AS[@]}" "$PGBIN/pg_ctl" -D "$W/pg/data" -m fast -w stop >/dev/null' EXIT
"$PGBIN/createdb" -h 127.0.0.1 -p "$PORT" -U roar team
URL="postgres://roar@127.0.0.1:$PORT/team"
psql_at() { "$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U roar -d team -At -c "$1"; }
echo "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT (default settings: fsync on); $(nproc) cores"

echo "== fleet: $NODES nodes x ~$JOBS jobs (seed $SEED), each node its own project store"
start=$(date +%s.%N)
seq 0 $((NODES - 1)) | xargs -P "$(nproc)" -I{} \
    "$FLEET" node --nodes "$NODES" --jobs "$JOBS" --seed "$SEED" --node {} "$W/node{}" > "$W/written"
end=$(date +%s.%N)
awk -v s="$start" -v e="$end" '{j += $1; f += $2} END {printf "  written: %d jobs, %d file records in %.0f s\n", j, f, e - s}' "$W/written"
for n in $(seq 0 $((NODES - 1))); do
    (cd "$W/node$n" && "$ROAR" remote add origin "$URL" --no-auto-push >/dev/null 2>&1)
done

# push FIRST LAST PARALLEL: nodes FIRST..LAST pushed PARALLEL at a time; prints the rate.
push() {
    local before_j before_f start end
    before_j=$(psql_at "SELECT count(*) FROM jobs" 2>/dev/null || echo 0)
    before_f=$(psql_at "SELECT count(*) FROM job_files" 2>/dev/null || echo 0)
    start=$(date +%s.%N)
    seq "$1" "$2" | xargs -P "$3" -I{} sh -c "cd '$W/node{}' && '$ROAR' push >/dev/null 2>>'$W/push.err'"
    end=$(date +%s.%N)
    local j f
    j=$(( $(psql_at "SELECT count(*) FROM jobs") - before_j ))
    f=$(( $(psql_at "SELECT count(*) FROM job_files") - before_f ))
    python3 -c "import sys; j, f, t = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[4]) - float(sys.argv[3]); print(f'  {sys.argv[5]:>2} concurrent pushers: {j:,} jobs, {f:,} file records in {t:.1f} s: {j / t:,.0f} jobs/s, {f / t:,.0f} file records/s')" \
        "$j" "$f" "$start" "$end" "$3"
}
# The simulator's 2.4 GB of stores are written back before the pushes are timed, so that the
# pushes do not share the disk with that writeback (PostgreSQL flushes its WAL at every commit).
sync
echo "== push (the schema is made by the first pusher)"
HALF=$((NODES / 2))
push 0 $((HALF - 1)) 16
push "$HALF" $((NODES - 1)) 64
JOBS_IN=$(psql_at "SELECT count(*) FROM jobs")
FILES_IN=$(psql_at "SELECT count(*) FROM job_files")
LOCAL_JOBS=$(awk '{j += $1} END {print j}' "$W/written")
echo "  team store: $JOBS_IN jobs (the nodes wrote $LOCAL_JOBS), $FILES_IN file records"
psql_at "VACUUM ANALYZE" >/dev/null
psql_at "SELECT 'bytes per file record: ' || round(pg_database_size('team')::numeric / $FILES_IN) || ' (whole database); the file records themselves (job_file_lists, job_file_s3): ' || round((pg_total_relation_size('job_file_lists') + pg_total_relation_size('job_file_s3'))::numeric / $FILES_IN) || '; database ' || pg_size_pretty(pg_database_size('team'))" | sed 's/^/  /'
psql_at "SELECT relname || ' ' || pg_size_pretty(pg_total_relation_size(oid)) FROM pg_class WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace ORDER BY pg_total_relation_size(oid) DESC LIMIT 6" | sed 's/^/    /'

cd "$W/node0"
TARGET=$("$FLEET" targets --nodes "$NODES" --jobs "$JOBS" --seed "$SEED")
echo "== the first --remote query builds the mirror (node0's project)"
start=$(date +%s.%N)
"$ROAR" --remote origin log -n 1 >/dev/null
end=$(date +%s.%N)
python3 -c "import sys; print(f'  mirror of $JOBS_IN jobs, $FILES_IN file records built in {float(sys.argv[2]) - float(sys.argv[1]):.1f} s; {sys.argv[3]}')" \
    "$start" "$end" "$(du -sh .roar/remotes | cut -f1) on disk"
"$ROAR" --remote origin lineage "$TARGET" --json > "$W/lineage.json"
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); s = d['steps']; print(f'  lineage of {sys.argv[2]}: {len(s)} jobs on {len({x[\"host\"] for x in s})} hosts')" "$W/lineage.json" "$TARGET"
echo "== queries from node0's project, $RUNS runs each (goal: lineage --remote p99 <= 100 ms)"
python3 "$REPO/bench/lib/compare.py" "$W/team.json" "$RUNS" \
    "roar --version (bare start)=$ROAR --version" \
    "lineage --remote (64-rank run)=$ROAR --remote origin lineage $TARGET" \
    "log --remote=$ROAR --remote origin log" >/dev/null
# status walks upstream from the project's locations: seconds at this size, so fewer runs.
python3 "$REPO/bench/lib/compare.py" "$W/status.json" "${STATUS_RUNS:-5}" \
    "status --remote=$ROAR --remote origin status" >/dev/null
python3 - "$W/team.json" "$W/status.json" <<'PY'
import json, statistics, sys
r = json.load(open(sys.argv[1]))
r.update(json.load(open(sys.argv[2])))
print(f"  {'query':34s} {'median':>9s} {'p99':>9s}  (runs)")
for name, v in r.items():
    t = sorted(v["times"])
    p99 = t[min(len(t) - 1, round(0.99 * (len(t) - 1)))]
    print(f"  {name:34s} {v['median']*1e3:6.1f} ms {p99*1e3:6.1f} ms  ({len(t)})")
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
PUSHED=$(psql_at "SELECT count(*) FROM jobs WHERE convert_from(cwd, 'UTF8') = '$W/with-remote'")
LOCAL=$(cd "$W/with-remote" && "$ROAR" log -n 0 --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
echo "  jobs of the remote project in the team store after the runs: $PUSHED of $LOCAL"
