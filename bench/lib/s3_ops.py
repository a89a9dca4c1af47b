#!/usr/bin/env python3
"""The S3 operations whose forwarding the gateway now does itself (it used the AWS SDK for them),
timed with boto3 per endpoint in interleaved rounds of random order: bench/s3_ops.sh.

usage: s3_ops.py ROUNDS NAME=URL|ACCESS|SECRET ...
Prints, per operation, one line per endpoint: median, IQR, ratio to the first endpoint.
"""
import random
import statistics
import sys
import time

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

PART = 8 << 20


def client(url, access, secret):
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=access,
                        aws_secret_access_key=secret, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def multipart(s3, body):
    up = s3.create_multipart_upload(Bucket="bench", Key="mp")["UploadId"]
    parts = []
    for i in range(0, len(body), PART):
        n = i // PART + 1
        e = s3.upload_part(Bucket="bench", Key="mp", UploadId=up, PartNumber=n, Body=body[i:i + PART])
        parts.append({"PartNumber": n, "ETag": e["ETag"]})
    s3.complete_multipart_upload(Bucket="bench", Key="mp", UploadId=up,
                                 MultipartUpload={"Parts": parts})


def main():
    rounds = int(sys.argv[1])
    ends = []
    for arg in sys.argv[2:]:
        name, rest = arg.split("=", 1)
        ends.append((name, client(*rest.split("|"))))
    body = random.randbytes(32 << 20)
    small = random.randbytes(4096)
    for _, s3 in ends:
        s3.put_object(Bucket="bench", Key="src", Body=small)
        for i in range(100):
            s3.put_object(Bucket="bench", Key=f"many/{i:03}", Body=b"x")
    ops = {
        "multipart 32 MiB (4 parts)": lambda s3: multipart(s3, body),
        "CopyObject 4 KiB": lambda s3: s3.copy_object(Bucket="bench", Key="dst",
                                                      CopySource={"Bucket": "bench", "Key": "src"}),
        "DeleteObjects 20 keys": lambda s3: s3.delete_objects(
            Bucket="bench", Delete={"Objects": [{"Key": f"gone/{i}"} for i in range(20)]}),
        "ListObjectsV2 100 keys": lambda s3: s3.list_objects_v2(Bucket="bench", Prefix="many/"),
        "Put+GetObjectTagging": lambda s3: (
            s3.put_object_tagging(Bucket="bench", Key="src",
                                  Tagging={"TagSet": [{"Key": "k", "Value": "v"}]}),
            s3.get_object_tagging(Bucket="bench", Key="src")),
    }
    for op, fn in ops.items():
        times = {name: [] for name, _ in ends}
        for r in range(rounds + 1):  # the first round warms up
            order = ends[:]
            random.shuffle(order)
            for name, s3 in order:
                t = time.perf_counter()
                fn(s3)
                if r:
                    times[name].append(time.perf_counter() - t)
        print(f"== {op}")
        base = statistics.median(times[ends[0][0]])
        for name, _ in ends:
            v = sorted(times[name])
            q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0], v[0], v[0]]
            m = statistics.median(v)
            print(f"  {name:18s} median {m * 1e3:9.2f} ms  (IQR {q[0] * 1e3:.2f}-{q[2] * 1e3:.2f})  {m / base:.2f}x {ends[0][0]}")


if __name__ == "__main__":
    main()
