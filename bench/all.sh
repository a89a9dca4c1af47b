#!/usr/bin/env bash
# Every benchmark, one after the other, each printing its ratios; figures go into
# bench/RESULTS.md by hand with the command that produced them. Needs root (mount, bindfs).
set -euo pipefail
cd "$(dirname "$0")"
bash ../scripts/setup.sh
for b in hash.sh run.sh query.sh mount.sh s3.sh pipeline.sh; do
    echo "################ bench/$b"
    bash "$b"
done
