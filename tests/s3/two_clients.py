#!/usr/bin/env python3
"""Two clients of one S3 endpoint, each with its own identity: neither can read, write, copy,
list or delete in the other's bucket, and each keeps full use of its own. Run against versitygw
directly (two of its users: a check that fails there is a wrong check) and through a
`roar gateway` that maps each client's key to that user (tests/tests/suite/s3_conformance.rs).

usage: two_clients.py ENDPOINT A_ACCESS A_SECRET B_ACCESS B_SECRET SUFFIX [NONE_ACCESS NONE_SECRET]
NONE: a key the endpoint accepts that has no identity upstream: refused, and says why.
"""
import sys

import boto3
import botocore
from botocore.config import Config


def client(endpoint, access, secret):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access,
                        aws_secret_access_key=secret, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def refused(what, fn, says=None):
    try:
        fn()
    except botocore.exceptions.ClientError as e:
        err = e.response.get("Error", {})
        code, status = err.get("Code", ""), e.response["ResponseMetadata"]["HTTPStatusCode"]
        assert code in ("AccessDenied", "403") or status == 403, f"{what}: {code} {status}"
        if says:
            assert says in err.get("Message", ""), f"{what}: {err}"
        print(f"ok refused: {what}")
        return
    raise AssertionError(f"{what}: allowed")


def bulk_delete_refused(b, bucket):
    """DeleteObjects answers per key: refused whole (403) or with every key an AccessDenied."""
    try:
        r = b.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "x"}]})
    except botocore.exceptions.ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 403, e.response
    else:
        assert not r.get("Deleted") and r.get("Errors"), r
        assert all(x["Code"] == "AccessDenied" for x in r["Errors"]), r
    print("ok refused: b deletes a's objects in bulk")


def main():
    endpoint, a_access, a_secret, b_access, b_secret, suffix = sys.argv[1:7]
    a, b = client(endpoint, a_access, a_secret), client(endpoint, b_access, b_secret)
    alpha, beta = f"alpha-{suffix}", f"beta-{suffix}"
    a.create_bucket(Bucket=alpha)
    a.put_object(Bucket=alpha, Key="x", Body=b"a's data")
    b.create_bucket(Bucket=beta)
    b.put_object(Bucket=beta, Key="own", Body=b"b's data")
    refused("b reads a's object", lambda: b.get_object(Bucket=alpha, Key="x")["Body"].read())
    refused("b heads a's object", lambda: b.head_object(Bucket=alpha, Key="x"))
    refused("b writes into a's bucket", lambda: b.put_object(Bucket=alpha, Key="y", Body=b"b"))
    refused("b copies a's object into its own bucket",
            lambda: b.copy_object(Bucket=beta, Key="c", CopySource={"Bucket": alpha, "Key": "x"}))
    refused("b lists a's bucket", lambda: b.list_objects_v2(Bucket=alpha))
    refused("b deletes a's object", lambda: b.delete_object(Bucket=alpha, Key="x"))
    bulk_delete_refused(b, alpha)
    refused("a reads b's object", lambda: a.get_object(Bucket=beta, Key="own")["Body"].read())
    listed = {x["Name"] for x in b.list_buckets()["Buckets"]}
    assert beta in listed and alpha not in listed, listed
    print("ok b lists its own bucket, not a's")
    assert a.get_object(Bucket=alpha, Key="x")["Body"].read() == b"a's data"
    assert b.get_object(Bucket=beta, Key="own")["Body"].read() == b"b's data"
    print("ok each keeps its own")
    if len(sys.argv) > 8:
        none = client(endpoint, sys.argv[7], sys.argv[8])
        refused("a key without an upstream identity",
                lambda: none.get_object(Bucket=alpha, Key="x"), says="no upstream identity")
        refused("a key without an upstream identity, plain operation",
                lambda: none.list_objects_v2(Bucket=alpha), says="no upstream identity")


if __name__ == "__main__":
    main()
