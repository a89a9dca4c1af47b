# Sourced by the forwarding benchmarks (s3_forward.sh, s3_ops.sh), with REPO, ROAR, ROAR_BEFORE,
# VGW and W set: starts versitygw on loopback (a bucket `bench`) and, in front of it, a
# `roar gateway --upstream` of each roar (after, before), each in a project of its own; kills them
# all at exit. Sets UP (versitygw's URL), UP_KEY/UP_SECRET (its key), CK/CS (the clients' key at
# both gateways), PORT_after/PORT_before, and GW[after|before] (their pids);
# `gateways_peak_rss` prints each gateway's VmHWM.
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
gateways_peak_rss() {
    for v in after before; do
        echo "  peak RSS, gateway $v: $(awk '/VmHWM/ {print $2, $3}' "/proc/${GW[$v]}/status")"
    done
}
