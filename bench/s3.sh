#!/usr/bin/env bash
# S3 through the gateway vs direct to the upstream, in the same run, with boto3: added median
# latency for PUT/GET of 4 KiB to 8 MiB objects, and peak RSS while streaming 1 GiB each way;
# then the fixed cost of `roar run --s3` with a gateway of its own vs a key borrowed from the
# project's running `roar gateway`.
# The upstream is a real S3 server on loopback (versitygw's posix backend, as scripts/setup.sh
# builds it); `roar gateway --upstream` verifies the client's SigV4, re-signs and forwards; roar's
# embedded store (blobs + SQLite index) is measured against the same server on the same clients;
# the Python peer's roar-proxy (from roar-cli) is measured the same way when its binary is there.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
bash scripts/setup.sh
bash scripts/build.sh --release -q
ROAR="$PWD/target/release/roar"
VGW="${ROAR_VERSITYGW:-$HOME/.cache/roar-s3bin/versitygw}"
W="${BENCH_DIR:-/tmp/roar-bench-s3}"
REPS="${REPS:-200}"
rm -rf "$W" && mkdir -p "$W/project" && cd "$W/project"
"$ROAR" init > /dev/null
source "$REPO/bench/lib/peer.sh"

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
UP_KEY=BENCHUPSTREAMKEY0001 UP_SECRET=bench-upstream-secret-bench-upstream-sec
UP_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$W/upstream/root" "$W/upstream/versions"
"$VGW" --access "$UP_KEY" --secret "$UP_SECRET" --port "127.0.0.1:$UP_PORT" \
    posix --versioning-dir "$W/upstream/versions" "$W/upstream/root" > "$W/upstream.log" 2>&1 &
pids+=($!); UP_PID=$!
UP_URL="http://127.0.0.1:$UP_PORT"
for _ in $(seq 200); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $UP_PORT), 0.1)" 2>/dev/null && break
    sleep 0.05
done

printf 'BENCHCLIENTKEY000001 bench-client-secret-bench-client-secret-\n' > "$W/keys.txt"
AWS_ACCESS_KEY_ID=$UP_KEY AWS_SECRET_ACCESS_KEY=$UP_SECRET ROAR_LOG=roar_gateway=info \
    "$ROAR" gateway --listen 127.0.0.1:0 --upstream "$UP_URL" --credentials "$W/keys.txt" \
    > "$W/gateway.env" 2> "$W/gateway.log" &
pids+=($!); GW_PID=$!
for _ in $(seq 100); do [ -s "$W/gateway.env" ] && break; sleep 0.05; done
GW_URL=$(sed -n 's/.*AWS_ENDPOINT_URL=\([^ ]*\).*/\1/p' "$W/gateway.env")

# The embedded store: roar's own (content-addressed blobs, SQLite index), with the gateway's
# verification and recording in front and no second hop.
"$ROAR" gateway --listen 127.0.0.1:0 --credentials "$W/keys.txt" \
    > "$W/embedded.env" 2> "$W/embedded.log" &
pids+=($!); EMB_PID=$!
for _ in $(seq 100); do [ -s "$W/embedded.env" ] && break; sleep 0.05; done
EMB_URL=$(sed -n 's/.*AWS_ENDPOINT_URL=\([^ ]*\).*/\1/p' "$W/embedded.env")

endpoints=("direct (versitygw)=$UP_URL|$UP_KEY|$UP_SECRET|$UP_PID"
           "roar gateway=$GW_URL|BENCHCLIENTKEY000001|bench-client-secret-bench-client-secret-|$GW_PID"
           "roar gateway embedded=$EMB_URL|BENCHCLIENTKEY000001|bench-client-secret-bench-client-secret-|$EMB_PID")
PEER_PROXY="$(peer_site_packages)/roar/bin/roar-proxy"
if [ -x "$PEER_PROXY" ]; then
    PEER_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    AWS_ACCESS_KEY_ID=$UP_KEY AWS_SECRET_ACCESS_KEY=$UP_SECRET AWS_REGION=us-east-1 \
        "$PEER_PROXY" --port "$PEER_PORT" --upstream "$UP_URL" > "$W/peer.log" 2>&1 &
    pids+=($!); PEER_PID=$!
    for _ in $(seq 100); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $PEER_PORT), 0.1)" 2>/dev/null && break
        sleep 0.05
    done
    # The peer forwards with its own credentials: clients sign with the upstream's.
    endpoints+=("roar-cli roar-proxy=http://127.0.0.1:$PEER_PORT|$UP_KEY|$UP_SECRET|$PEER_PID")
else
    echo "s3: roar-cli's roar-proxy binary not found in $PEER_VENV; peer not measured" >&2
fi

echo "== S3 latency and streaming (boto3, $REPS rounds for objects up to 1 MiB)"
BENCH_DIR="$W" BENCH_JSON="$W/s3.json" python3 "$REPO/bench/s3_bench.py" "$REPS" "${endpoints[@]}"
kill -TERM "$GW_PID"; wait "$GW_PID" 2>/dev/null || true
# Multipart objects are hashed from their parts: none should have been read back.
echo "objects the forwarding gateway read back from the upstream to hash: $(grep -c 'reading it back' "$W/gateway.log" || true)"
echo "gateway jobs recorded: $("$ROAR" log --json -n 1000 | python3 -c 'import json,sys; print(sum(1 for j in json.load(sys.stdin) if j["backend"] == "gateway"))')"

echo "== roar run --s3 true: fixed cost, a gateway of the run's own vs a key borrowed from a running one"
# A gateway in $W/project offers keys on .roar/gateway.sock (the one above that did has
# stopped); $W/solo has none, so its runs start their own. `env -C` on every command keeps them
# comparable.
"$ROAR" gateway --listen 127.0.0.1:0 > "$W/lender.env" 2> "$W/lender.log" &
pids+=($!)
for _ in $(seq 100); do [ -S .roar/gateway.sock ] && break; sleep 0.05; done
[ -S .roar/gateway.sock ] || { echo "s3: the gateway did not offer keys: $(cat "$W/lender.log")" >&2; exit 1; }
mkdir -p "$W/solo" && env -C "$W/solo" "$ROAR" init > /dev/null
python3 "$REPO/bench/lib/compare.py" "$W/runs3.json" "${RUNS:-20}" \
    "bare=env -C $W/solo true" \
    "roar run=env -C $W/solo $ROAR run true" \
    "roar run --s3 (own gateway)=env -C $W/solo $ROAR run --s3 true" \
    "roar run --s3 (borrowed key)=env -C $W/project $ROAR run --s3 true"
python3 - "$W/runs3.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bare = r["bare"]["median"]
for name, v in r.items():
    if name != "bare":
        print(f"  {name:<30} +{(v['median'] - bare) * 1e3:6.2f} ms over bare")
own, lent = r["roar run --s3 (own gateway)"]["median"], r["roar run --s3 (borrowed key)"]["median"]
print(f"  borrowing saves {(own - lent) * 1e3:.2f} ms per run")
PY
