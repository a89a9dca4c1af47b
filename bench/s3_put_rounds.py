#!/usr/bin/env python3
"""1 GiB single PUTs, interleaved rounds, against two or more endpoints (boto3, payload signed
with its SHA-256 as in s3_bench.py); prints each endpoint's times, medians and each one's ratio
to the first.

usage: s3_put_rounds.py ROUNDS FILE NAME=URL|ACCESS|SECRET NAME=URL|ACCESS|SECRET [NAME=...]
FILE is read as the body (make it 1 GiB, on the disk or tmpfs you want measured); each object is
deleted after its PUT so a tmpfs does not fill.
"""
import os
import random
import statistics
import sys
import time

import boto3
from botocore.config import Config

rounds, body_path = int(sys.argv[1]), sys.argv[2]
eps = {}
for arg in sys.argv[3:]:
    name, spec = arg.split("=", 1)
    url, access, secret = spec.split("|")
    eps[name] = boto3.client(
        "s3", endpoint_url=url, aws_access_key_id=access, aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, request_checksum_calculation="when_required",
                      response_checksum_validation="when_required"))
for c in eps.values():
    try:
        c.create_bucket(Bucket="put-rounds")
    except (c.exceptions.BucketAlreadyOwnedByYou, c.exceptions.BucketAlreadyExists):
        pass
times = {name: [] for name in eps}
for r in range(rounds):
    order = list(eps.items())
    random.shuffle(order)
    for name, c in order:
        os.sync()
        t = time.perf_counter()
        with open(body_path, "rb") as body:
            c.put_object(Bucket="put-rounds", Key=f"big{r}", Body=body)
        times[name].append(time.perf_counter() - t)
        c.delete_object(Bucket="put-rounds", Key=f"big{r}")
for name, ts in times.items():
    print(f"{name:<12} {' '.join(f'{t:.2f}' for t in ts)}  median {statistics.median(ts):.2f} s")
names = list(times)
first = statistics.median(times[names[0]])
for name in names[1:]:
    print(f"ratio {name}/{names[0]}: {statistics.median(times[name]) / first:.2f}x")
