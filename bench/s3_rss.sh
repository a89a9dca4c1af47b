#!/usr/bin/env bash
# Peak memory of `roar gateway` (embedded store) over a 1 GiB PUT and GET with the aws CLI (its
# defaults: 8 MiB parts, 10 requests at once), for this roar and an older one (ROAR_BEFORE,
# default: built from aec66cd), ROUNDS times each, alternating; issue 61's target is 64 MiB.
# Prints each round's PUT and GET seconds and the gateway's VmHWM.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
source "$REPO/bench/lib/builds.sh"
roar_after
roar_before aec66cd
ROUNDS="${ROUNDS:-3}"
W="${BENCH_DIR:-/tmp/roar-bench-s3-rss}"
rm -rf "$W" && mkdir -p "$W"
head -c 1073741824 /dev/urandom > "$W/big.bin"
export AWS_ACCESS_KEY_ID=RSSKEY00000000000001 AWS_SECRET_ACCESS_KEY=rss-secret-rss-secret-rss-secret-rss-sec AWS_DEFAULT_REGION=us-east-1
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null || true' EXIT
echo "== 1 GiB through the embedded store with the aws CLI (multipart PUT, GET to a pipe)"
for round in $(seq 1 "$ROUNDS"); do
    for v in after before; do
        bin="$ROAR"; [ "$v" = before ] && bin="$ROAR_BEFORE"
        d="$W/$v-$round" && mkdir -p "$d" && cd "$d"
        "$bin" init > /dev/null
        printf '%s %s\n' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" > creds
        "$bin" gateway --listen 127.0.0.1:0 --credentials creds > gw.out 2> gw.err &
        pid=$!
        for _ in $(seq 100); do grep -q http gw.out 2> /dev/null && break; sleep 0.05; done
        export AWS_ENDPOINT_URL=$(grep -o 'http://[0-9.:]*' gw.out | head -1)
        aws s3 mb s3://rss > /dev/null
        s=$(date +%s.%N)
        aws s3 cp "$W/big.bin" s3://rss/big > /dev/null
        m=$(date +%s.%N)
        aws s3 cp s3://rss/big - | wc -c > /dev/null
        e=$(date +%s.%N)
        printf '  %-6s round %d: PUT %.2f s, GET %.2f s, peak RSS %s\n' "$v" "$round" \
            "$(echo "$m - $s" | bc)" "$(echo "$e - $m" | bc)" "$(awk '/VmHWM/ {print $2 / 1024 " MiB"}' /proc/$pid/status)"
        kill "$pid"; wait "$pid" 2> /dev/null || true; pid=
        cd "$W" && rm -rf "$d"
    done
done
