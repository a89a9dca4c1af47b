#!/usr/bin/env python3
"""S3 latency and throughput through each endpoint, side by side, with boto3 (a real client).

usage: s3_bench.py REPS NAME=URL|ACCESS|SECRET[|PID] ...

The first endpoint is the reference (direct to the upstream); a second client of it gives the
noise floor. For each object size, every round does one PUT and one GET per endpoint in a
shuffled order; medians and quartiles per endpoint, and the added median latency against the
reference. Then 1 GiB is streamed up and down through each endpoint that names a PID, and that
process's peak RSS (VmHWM) is read from /proc.
"""
import json
import os
import random
import statistics
import sys
import tempfile
import time

import boto3
from botocore.config import Config

SIZES = [("4 KiB", 4 << 10), ("64 KiB", 64 << 10), ("1 MiB", 1 << 20), ("8 MiB", 8 << 20)]
BUCKET = "bench-bucket"


def client(url, access, secret):
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=access,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1},
            # Same request shape on every endpoint: a plain body, signed with its SHA-256.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            max_pool_connections=4,
        ),
    )


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


def slug(name):
    # Plain keys: the peer's proxy fails signatures of keys with spaces or parentheses.
    return "".join(ch if ch.isalnum() else "-" for ch in name)


def quartiles(ts):
    q = statistics.quantiles(ts, n=4)
    return q[0], statistics.median(ts), q[2]


def main():
    reps = int(sys.argv[1])
    endpoints = []
    for arg in sys.argv[2:]:
        name, spec = arg.split("=", 1)
        parts = spec.split("|")
        url, access, secret = parts[:3]
        pid = int(parts[3]) if len(parts) > 3 and parts[3] else None
        endpoints.append((name, client(url, access, secret), pid))
    ref_name = endpoints[0][0]
    # The noise floor: a second, independent client of the reference endpoint.
    ref_url = sys.argv[2].split("=", 1)[1].split("|")
    endpoints.insert(1, (ref_name + " again", client(*ref_url[:3]), None))

    # Every endpoint that is a store of its own (the upstream, the embedded store) gets the bucket.
    for _, c, _ in endpoints:
        try:
            c.create_bucket(Bucket=BUCKET)
        except (c.exceptions.BucketAlreadyOwnedByYou, c.exceptions.BucketAlreadyExists):
            pass

    results = {}
    for label, size in SIZES:
        body = os.urandom(size)
        n = reps if size <= (1 << 20) else max(10, reps // 5)
        times = {(name, op): [] for name, _, _ in endpoints for op in ("PUT", "GET")}
        for name, c, _ in endpoints:  # warm-up: connections, credentials
            c.put_object(Bucket=BUCKET, Key=f"warm/{slug(name)}", Body=body)
            c.get_object(Bucket=BUCKET, Key=f"warm/{slug(name)}")["Body"].read()
        for i in range(n):
            order = list(endpoints)
            random.shuffle(order)
            for name, c, _ in order:
                key = f"lat/{slug(label)}/{slug(name)}/{i}"
                t = time.perf_counter()
                c.put_object(Bucket=BUCKET, Key=key, Body=body)
                times[(name, "PUT")].append(time.perf_counter() - t)
                t = time.perf_counter()
                got = c.get_object(Bucket=BUCKET, Key=key)["Body"].read()
                times[(name, "GET")].append(time.perf_counter() - t)
                assert len(got) == size
        for op in ("PUT", "GET"):
            ref = statistics.median(times[(ref_name, op)])
            print(f"{label:>7} {op}  (median over {n}, interquartile range)")
            for name, _, _ in endpoints:
                q1, med, q3 = quartiles(times[(name, op)])
                print(
                    f"    {name:<22} {med * 1e3:8.2f} ms  [{q1 * 1e3:.2f}-{q3 * 1e3:.2f}]"
                    f"  {med / ref:5.2f}x  {(med - ref) * 1e3:+7.2f} ms"
                )
                results[f"{label} {op} {name}"] = {"median_s": med, "q1_s": q1, "q3_s": q3}

    # 1 GiB streamed through each process we can watch.
    with tempfile.NamedTemporaryFile(dir=os.environ.get("BENCH_DIR", "/tmp")) as f:
        chunk = os.urandom(1 << 20)
        for _ in range(1024):
            f.write(chunk)
        f.flush()
        for name, c, pid in endpoints:
            if pid is None:
                continue
            before = peak_rss_mib(pid)
            t = time.perf_counter()
            with open(f.name, "rb") as body:
                c.put_object(Bucket=BUCKET, Key=f"big/{slug(name)}", Body=body)
            put_s = time.perf_counter() - t
            t = time.perf_counter()
            stream = c.get_object(Bucket=BUCKET, Key=f"big/{slug(name)}")["Body"]
            total = sum(len(b) for b in stream.iter_chunks(1 << 20))
            get_s = time.perf_counter() - t
            assert total == 1 << 30
            peak = peak_rss_mib(pid)
            print(
                f"1 GiB through {name}: PUT {put_s:.2f} s, GET {get_s:.2f} s, "
                f"peak RSS {peak:.1f} MiB (before {before:.1f} MiB)"
            )
            results[f"1GiB {name}"] = {"put_s": put_s, "get_s": get_s, "peak_rss_mib": peak}
        # 1 GiB as a multipart upload of 8 MiB parts (what the aws CLI and boto3 do by default).
        from boto3.s3.transfer import TransferConfig
        cfg = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20,
                             max_concurrency=4)
        ref_mp = None
        for name, c, pid in endpoints:
            if pid is None:
                continue
            t = time.perf_counter()
            c.upload_file(f.name, BUCKET, f"mp/{slug(name)}", Config=cfg)
            mp_s = time.perf_counter() - t
            ref_mp = ref_mp or mp_s
            print(f"1 GiB multipart (8 MiB parts) through {name}: {mp_s:.2f} s, {mp_s / ref_mp:.2f}x")
            results[f"1GiB multipart {name}"] = {"s": mp_s}
    json.dump(results, open(os.environ.get("BENCH_JSON", "/dev/null"), "w"), indent=1)


if __name__ == "__main__":
    main()
