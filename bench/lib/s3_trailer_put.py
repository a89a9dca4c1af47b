#!/usr/bin/env python3
"""PUTs with an aws-chunked CRC32 trailer (what new AWS SDKs send by default), timed per
endpoint in interleaved rounds of random order: bench/s3_forward.sh.

usage: s3_trailer_put.py ROUNDS SIZE_BYTES NAME=URL|ACCESS|SECRET ...
Prints one line per endpoint: the median time, its IQR, and the ratio to the first endpoint.
"""
import base64
import hashlib
import os
import random
import statistics
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/s3"))
from chunked import put_with_trailer  # noqa: E402


def put(url, access, secret, payload, crc):
    status, text, took = put_with_trailer(url, access, secret, payload, crc, timeout=300)
    assert status == 200, (url, status, text)
    return took


def main():
    rounds, size = int(sys.argv[1]), int(sys.argv[2])
    ends = []
    for arg in sys.argv[3:]:
        name, rest = arg.split("=", 1)
        ends.append((name, *rest.split("|")))
    payload = hashlib.shake_256(b"bench").digest(size)
    crc = base64.b64encode(zlib.crc32(payload).to_bytes(4, "big")).decode()
    times = {e[0]: [] for e in ends}
    for r in range(rounds + 1):  # the first round warms up
        order = ends[:]
        random.shuffle(order)
        for name, url, access, secret in order:
            t = put(f"{url}/bench/k{size}", access, secret, payload, crc)
            if r:
                times[name].append(t)
    base = statistics.median(times[ends[0][0]])
    for name, *_ in ends:
        v = sorted(times[name])
        q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0], v[0], v[0]]
        m = statistics.median(v)
        print(f"  {size:>10} B  {name:18s} median {m * 1e3:9.2f} ms  (IQR {q[0] * 1e3:.2f}-{q[2] * 1e3:.2f})  {m / base:.2f}x {ends[0][0]}")


if __name__ == "__main__":
    main()
