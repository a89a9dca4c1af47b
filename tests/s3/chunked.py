"""An aws-chunked PUT with a CRC32 trailer, signed as the AWS SDKs sign one
(STREAMING-UNSIGNED-PAYLOAD-TRAILER), sent on a connection of its own: what the conformance
checks (tests/s3/conformance.py) and bench/s3_forward.sh send."""

import http.client
import time
import urllib.parse

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def put_with_trailer(url, access, secret, payload, crc32_b64, chunk=65536, timeout=60):
    """PUTs `payload` to `url` in aws-chunked chunks of `chunk` bytes with the trailer
    `x-amz-checksum-crc32: crc32_b64`. Returns (status, response text, seconds)."""
    body = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n"
                    for c in (payload[i:i + chunk] for i in range(0, len(payload), chunk)))
    body += f"0\r\nx-amz-checksum-crc32:{crc32_b64}\r\n\r\n".encode()
    req = AWSRequest(method="PUT", url=url, data=body, headers={
        "Content-Encoding": "aws-chunked",
        "X-Amz-Decoded-Content-Length": str(len(payload)),
        "X-Amz-Trailer": "x-amz-checksum-crc32",
        "Content-Length": str(len(body)),
    })
    req.context["checksum"] = {"request_algorithm": {"in": "trailer"}}
    S3SigV4Auth(Credentials(access, secret), "s3", "us-east-1").add_auth(req)
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    start = time.perf_counter()
    conn.request("PUT", u.path, body=body, headers=dict(req.headers.items()))
    r = conn.getresponse()
    text = r.read().decode(errors="replace")
    took = time.perf_counter() - start
    conn.close()
    return r.status, text, took
