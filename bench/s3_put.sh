#!/usr/bin/env bash
# The 1 GiB single PUT (issue 24's target: the embedded store within 1.1x of a real S3 server):
# boto3 PUTs one 1 GiB body, its payload signed with its SHA-256, to versitygw (posix backend)
# and to `roar gateway` with the embedded store (verify SigV4 and SHA-256, hash blake3 + MD5 +
# checksums, write the blob, record), in ROUNDS interleaved rounds of random order, `sync` before
# each PUT. Both servers' data and the body are first on the disk (the bench directory), then on
# tmpfs (/dev/shm), which shows the CPU side without the disk's noise. Ratios are medians against
# versitygw in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
cargo build --release --locked -q -p roar-cli
ROAR="$PWD/target/release/roar"
VGW="${ROAR_VERSITYGW:-$HOME/.cache/roar-s3bin/versitygw}"
ROUNDS="${ROUNDS:-5}"
[ -x "$VGW" ] || { echo "s3_put: versitygw not built (bash scripts/setup.sh builds it)" >&2; exit 1; }
python3 -c 'import boto3' 2> /dev/null || { echo "s3_put: boto3 missing (bash scripts/setup.sh installs it)" >&2; exit 1; }

pids=()
dirs=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "${dirs[@]}"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP_KEY=BENCHUPSTREAMKEY0001 UP_SECRET=bench-upstream-secret-bench-upstream-sec
CLIENT="BENCHCLIENTKEY000001|bench-client-secret-bench-client-secret-"

put_rounds() {
    local where="$1" W="$2"
    rm -rf "$W" && mkdir -p "$W/vgw/root" "$W/vgw/versions" "$W/project"
    dirs+=("$W")
    head -c 1073741824 /dev/urandom > "$W/body"
    local up_port; up_port=$(port)
    "$VGW" --access "$UP_KEY" --secret "$UP_SECRET" --port "127.0.0.1:$up_port" \
        posix --versioning-dir "$W/vgw/versions" "$W/vgw/root" > "$W/vgw.log" 2>&1 &
    pids+=($!)
    printf 'BENCHCLIENTKEY000001 bench-client-secret-bench-client-secret-\n' > "$W/keys.txt"
    (cd "$W/project" && "$ROAR" init > /dev/null)
    (cd "$W/project" && exec "$ROAR" gateway --listen 127.0.0.1:0 --credentials "$W/keys.txt" \
        > "$W/embedded.env" 2> "$W/embedded.log") &
    pids+=($!)
    for _ in $(seq 200); do
        [ -s "$W/embedded.env" ] &&
            python3 -c "import socket; socket.create_connection(('127.0.0.1', $up_port), 0.1)" 2> /dev/null && break
        sleep 0.05
    done
    local emb_url; emb_url=$(sed -n 's/.*AWS_ENDPOINT_URL=\([^ ]*\).*/\1/p' "$W/embedded.env")
    echo "== 1 GiB single PUT, data on $where ($ROUNDS interleaved rounds)"
    python3 "$REPO/bench/s3_put_rounds.py" "$ROUNDS" "$W/body" \
        "versitygw=http://127.0.0.1:$up_port|$UP_KEY|$UP_SECRET" \
        "roar embedded=$emb_url|$CLIENT"
    kill "${pids[@]}" 2> /dev/null || true
    wait 2> /dev/null || true
    pids=()
    rm -rf "$W"
}

put_rounds "the disk ($(findmnt -no FSTYPE -T "${BENCH_DIR:-/tmp}"))" "${BENCH_DIR:-/tmp}/roar-bench-s3put"
put_rounds "tmpfs" /dev/shm/roar-bench-s3put
