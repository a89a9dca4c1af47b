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
source "$REPO/bench/lib/s3_gateways.sh"
echo "== boto3 direct to versitygw, through the gateway after and before ($ROUNDS rounds)"
python3 "$REPO/bench/lib/s3_ops.py" "$ROUNDS" \
    "direct=$UP|$UP_KEY|$UP_SECRET" \
    "gateway after=http://127.0.0.1:$PORT_after|$CK|$CS" \
    "gateway before=http://127.0.0.1:$PORT_before|$CK|$CS"
gateways_peak_rss
