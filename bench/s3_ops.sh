#!/usr/bin/env bash
# The S3 operations `roar gateway --upstream` used to forward through the AWS SDK and now forwards
# itself (issue 62: the SDK left the binary): multipart upload (UploadPart, CompleteMultipartUpload),
# CopyObject, DeleteObjects, and two operations with nothing to record that now go through as they
# came (ListObjectsV2, object tagging). boto3 direct to versitygw, through this roar's gateway and
# through the one before (ROAR_BEFORE, default: built from a7b82ac, the last commit with the SDK),
# interleaved in random order, ROUNDS rounds. Peak RSS of each gateway at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
source "$REPO/bench/lib/builds.sh"
roar_after
roar_before a7b82ac
VGW="${ROAR_VERSITYGW:-$HOME/.cache/roar-s3bin/versitygw}"
ROUNDS="${ROUNDS:-15}"
W="${BENCH_DIR:-/tmp/roar-bench-s3-ops}"
rm -rf "$W" && mkdir -p "$W/up/root" "$W/up/versions" "$W/after" "$W/before"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 0.1)" 2>/dev/null && return; sleep 0.05; done; }
UP_KEY=BENCHUPSTREAMKEY0001 UP_SECRET=bench-upstream-secret-bench-upstream-sec
CK=BENCHCLIENTKEY000001 CS=bench-client-secret-bench-client-secret-
UP_PORT=$(port)
"$VGW" --access "$UP_KEY" --secret "$UP_SECRET" --port "127.0.0.1:$UP_PORT" \
    posix --versioning-dir "$W/up/versions" "$W/up/root" > "$W/up.log" 2>&1 &
pids+=($!)
wait_port "$UP_PORT"
UP="http://127.0.0.1:$UP_PORT"
AWS_ACCESS_KEY_ID=$UP_KEY AWS_SECRET_ACCESS_KEY=$UP_SECRET AWS_DEFAULT_REGION=us-east-1 \
    python3 -c "import boto3; boto3.client('s3', endpoint_url='$UP').create_bucket(Bucket='bench')"
declare -A GW
for v in after before; do
    bin="$ROAR"; [ "$v" = before ] && bin="$ROAR_BEFORE"
    (cd "$W/$v" && "$bin" init > /dev/null)
    printf '%s %s\n' "$CK" "$CS" > "$W/$v/keys"
    p=$(port)
    (cd "$W/$v" && AWS_ACCESS_KEY_ID=$UP_KEY AWS_SECRET_ACCESS_KEY=$UP_SECRET \
        exec "$bin" gateway --listen "127.0.0.1:$p" --upstream "$UP" --credentials keys) > "$W/$v.log" 2>&1 &
    pids+=($!)
    GW[$v]=$!
    wait_port "$p"
    eval "PORT_$v=$p"
done
echo "== boto3 direct to versitygw, through the gateway after and before ($ROUNDS rounds)"
python3 "$REPO/bench/lib/s3_ops.py" "$ROUNDS" \
    "direct=$UP|$UP_KEY|$UP_SECRET" \
    "gateway after=http://127.0.0.1:$PORT_after|$CK|$CS" \
    "gateway before=http://127.0.0.1:$PORT_before|$CK|$CS"
for v in after before; do
    echo "  peak RSS, gateway $v: $(awk '/VmHWM/ {print $2, $3}' "/proc/${GW[$v]}/status")"
done
