#!/usr/bin/env bash
# A forwarded PUT whose checksum comes in an aws-chunked trailer (issue 61): `roar gateway
# --upstream` now takes such a body whole (an unnamed temp file) and checks it before the
# upstream gets a byte, so a body it refuses can never replace an upstream object; before, it
# streamed the body up holding back the last chunk. The cost is the overlap of the client's
# upload with the upstream's: PUT latency direct to versitygw, through this roar's gateway and
# through an older one (ROAR_BEFORE, default: built from aec66cd), interleaved in random order,
# at SIZES bytes, ROUNDS rounds each. Peak RSS of each gateway at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
source "$REPO/bench/lib/builds.sh"
roar_after
roar_before aec66cd
VGW="${ROAR_VERSITYGW:-$HOME/.cache/roar-s3bin/versitygw}"
ROUNDS="${ROUNDS:-15}"
SIZES="${SIZES:-65536 8388608 67108864}"
W="${BENCH_DIR:-/tmp/roar-bench-s3-forward}"
source "$REPO/bench/lib/s3_gateways.sh"
echo "== PUT with an aws-chunked CRC32 trailer: direct to versitygw, through the gateway after and before ($ROUNDS rounds)"
for size in $SIZES; do
    python3 "$REPO/bench/lib/s3_trailer_put.py" "$ROUNDS" "$size" \
        "direct=$UP|$UP_KEY|$UP_SECRET" \
        "gateway after=http://127.0.0.1:$PORT_after|$CK|$CS" \
        "gateway before=http://127.0.0.1:$PORT_before|$CK|$CS"
done
gateways_peak_rss
