#!/usr/bin/env bash
# Builds roar and runs a small pipeline in a scratch project: its data directory is mounted with
# `roar mount` (the first two steps run as plain commands and are recorded by the mount), the
# last two run under `roar run --s3`, which gives them an S3 endpoint (the gateway's embedded
# store): training publishes the model to a bucket, the report reads it back from there. Then it
# shows the lineage recorded across files and objects.
# Usage: bash scripts/demo.sh [DIR]   (default: /tmp/roar-demo)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh --release
ROAR="${CARGO_TARGET_DIR:-$PWD/target}/release/roar"
DEMO="${1:-/tmp/roar-demo}"
if mountpoint -q "$DEMO/data" 2>/dev/null; then "$ROAR" unmount "$DEMO/data" 2>/dev/null || umount -l "$DEMO/data"; fi
rm -rf "$DEMO"
mkdir -p "$DEMO"
cd "$DEMO"
git init -q . && git config user.email demo@roar && git config user.name demo

cat > make_raw.py <<'PY'
import random, sys
random.seed(7)
with open("data/raw.csv", "w") as f:
    f.write("x,y\n")
    for _ in range(1000):
        x = random.random()
        f.write(f"{x:.6f},{3 * x + random.gauss(0, 0.1):.6f}\n")
PY
cat > prep.py <<'PY'
import os
rows = [l.strip().split(",") for l in open("data/raw.csv")][1:]
os.makedirs("data/features", exist_ok=True)
for i in range(4):
    with open(f"data/features/shard{i}.csv", "w") as f:
        for x, y in rows[i::4]:
            f.write(f"{x},{y}\n")
PY
cat > train.py <<'PY'
import glob, json, os
xs, ys = [], []
for shard in sorted(glob.glob("data/features/shard*.csv")):
    for line in open(shard):
        x, y = map(float, line.split(","))
        xs.append(x); ys.append(y)
n = len(xs); mx = sum(xs) / n; my = sum(ys) / n
slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
tmp = "model.json.tmp"
json.dump({"slope": slope, "intercept": my - slope * mx}, open(tmp, "w"))
os.rename(tmp, "model.json")  # written atomically: roar follows the rename
# Publish it: boto3 finds the endpoint `roar run --s3` set in AWS_ENDPOINT_URL.
import boto3
s3 = boto3.client("s3")
if "demo-models" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
    s3.create_bucket(Bucket="demo-models")
s3.upload_file("model.json", "demo-models", "linear/model.json")
PY
cat > report.py <<'PY'
import boto3, json
model = json.load(boto3.client("s3").get_object(Bucket="demo-models", Key="linear/model.json")["Body"])
rows = sum(1 for _ in open("data/raw.csv")) - 1
with open("report.txt", "w") as f:
    f.write(f"y = {model['slope']:.3f} x + {model['intercept']:.3f}, fitted on {rows} rows\n")
PY
mkdir data
printf 'data/\n' > .gitignore
git add . && git commit -qm "demo pipeline"

"$ROAR" init
if [ "$(id -u)" = 0 ] && [ -e /dev/fuse ]; then
    # Everything read or written under data/ is recorded, whoever runs it: the first two steps
    # are plain commands (each its own process group, as a terminal runs them).
    "$ROAR" mount data
    setsid --wait python3 make_raw.py
    setsid --wait python3 prep.py
else
    echo "(no FUSE here: running the first two steps under roar run instead of the mount)"
    "$ROAR" run --name make-raw -- python3 make_raw.py
    "$ROAR" run --name prep -- python3 prep.py
fi
"$ROAR" run --s3 --name train -v -- python3 train.py
"$ROAR" run --s3 --name report -- python3 report.py
cat report.txt
if mountpoint -q data; then "$ROAR" unmount data; fi
echo
echo "== roar log"
"$ROAR" log
echo
echo "== roar dag          (every job with its inputs and outputs; --dot for Graphviz)"
"$ROAR" dag
echo
echo "== roar lineage report.txt   (how it was made, through the bucket, down to the root inputs)"
"$ROAR" lineage report.txt
echo
echo "== roar reproduce model.json (the commands that rebuild it; --run re-runs and verifies)"
"$ROAR" reproduce model.json
echo
echo "== after editing train.py: roar status   (what changed, and what is stale downstream, job by job)"
echo "# tweak" >> train.py
"$ROAR" status
