"""S3 behaviour a data job relies on, checked with real clients (boto3, the aws CLI) against one
endpoint. The cargo suite runs it against roar's embedded store, against `roar gateway` in front
of a real S3 server (versitygw), and against that server directly, so every check is also checked
against an independent implementation.

usage: conformance.py ENDPOINT ACCESS_KEY SECRET_KEY BUCKET [--skip NAME]...
Prints `ok NAME` or `FAIL NAME: why` per check and exits 1 if any failed.
"""

import base64
import concurrent.futures
import hashlib
import os
import subprocess
import sys
import tempfile
import traceback
import zlib

import boto3
import botocore.config
import botocore.exceptions

ENDPOINT, ACCESS, SECRET, BUCKET = sys.argv[1:5]
SKIP = {sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "--skip"}
MIB = 1 << 20


def client():
    return boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        aws_access_key_id=ACCESS,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
        config=botocore.config.Config(
            s3={"addressing_style": "path"}, retries={"max_attempts": 1}
        ),
    )


def data(n, seed):
    return hashlib.shake_256(f"{seed}".encode()).digest(n) if n else b""


def code(e):
    return e.response.get("Error", {}).get("Code") if hasattr(e, "response") else None


def status(e):
    return e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def expect_error(fn, codes):
    try:
        fn()
    except botocore.exceptions.ClientError as e:
        assert code(e) in codes or str(status(e)) in codes, f"got {code(e)}/{status(e)}, want {codes}"
        return e
    raise AssertionError(f"succeeded, want one of {codes}")


def keys(s3, prefix=""):
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return out


def aws(*args, check=True):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS, AWS_SECRET_ACCESS_KEY=SECRET,
               AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=ENDPOINT)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        env.pop(k, None)
    r = subprocess.run(["aws", *args], env=env, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"aws {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def hostile_keys_stay_keys(s3):
    """Keys shaped like paths are only keys: nothing escapes the bucket, nothing panics."""
    hostile = ["../victim/x.txt", "a/../../../tmp/y", ".", "..", "/x", "a//b", "./c", "d/./e",
               "%2e%2e/f", "back\\slash", "sp ace+plus%25", "ü/ß/日本", "trailing.", "x" * 1024]
    before = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    for i, k in enumerate(hostile):
        s3.put_object(Bucket=BUCKET, Key="h/" + k if k.startswith("/") else k, Body=data(100 + i, k))
    for i, k in enumerate(hostile):
        key = "h/" + k if k.startswith("/") else k
        got = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        assert got == data(100 + i, k), f"{key!r} read back other bytes"
    after = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    assert after == before, f"buckets appeared: {after - before}"
    listed = set(keys(s3))
    for k in hostile:
        key = "h/" + k if k.startswith("/") else k
        assert key in listed, f"{key!r} missing from the listing"
    expect_error(lambda: s3.put_object(Bucket=BUCKET, Key="x" * 1025, Body=b"1"),
                 {"KeyTooLongError", "400"})
    for k in hostile:
        s3.delete_object(Bucket=BUCKET, Key="h/" + k if k.startswith("/") else k)


@check
def rejected_puts_leave_nothing(s3):
    body = data(300_000, "rejected")
    expect_error(lambda: s3.put_object(Bucket=BUCKET, Key="rej/md5", Body=body,
                                       ContentMD5=base64.b64encode(b"\0" * 16).decode()),
                 {"BadDigest", "InvalidDigest"})
    expect_error(lambda: s3.put_object(Bucket=BUCKET, Key="rej/crc", Body=body,
                                       ChecksumCRC32="AAAAAA=="),
                 {"BadDigest", "InvalidRequest", "XAmzContentChecksumMismatch"})
    expect_error(lambda: s3.put_object(Bucket=BUCKET, Key="rej/sha", Body=body,
                                       ChecksumSHA256=base64.b64encode(b"\1" * 32).decode()),
                 {"BadDigest", "InvalidRequest", "XAmzContentChecksumMismatch"})
    for k in ("rej/md5", "rej/crc", "rej/sha"):
        expect_error(lambda k=k: s3.head_object(Bucket=BUCKET, Key=k), {"404", "NoSuchKey"})
    # The same body with the right checksums is stored.
    s3.put_object(Bucket=BUCKET, Key="rej/ok", Body=body,
                  ChecksumCRC32=base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode(),
                  ContentMD5=base64.b64encode(hashlib.md5(body).digest()).decode())
    assert s3.get_object(Bucket=BUCKET, Key="rej/ok")["Body"].read() == body


@check
def trailer_checksums_are_verified(s3):
    """An aws-chunked upload whose trailer checksum is wrong is refused and leaves nothing: a
    new key stays absent, an existing object keeps its bytes (an upstream that keeps what it got
    of a dropped body does so only after a while: looked at again 3 s later)."""
    from chunked import put_with_trailer
    payload = data(70_000, "trailer")
    good = base64.b64encode(zlib.crc32(payload).to_bytes(4, "big")).decode()
    for name, value, want in (("bad", "AAAAAA==", 400), ("good", good, 200)):
        key = f"trailer/{name}"
        status, text, _ = put_with_trailer(f"{ENDPOINT}/{BUCKET}/{key}", ACCESS, SECRET,
                                           payload, value, chunk=len(payload))
        assert status == want, f"{name} trailer: {status} {text}"
        if want == 200:
            assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == payload
        else:
            assert "BadDigest" in text or "XAmzContentChecksumMismatch" in text, text
            expect_error(lambda k=key: s3.head_object(Bucket=BUCKET, Key=k), {"404", "NoSuchKey"})
    # The same refusal over an object that exists, of a body sent in several chunks. Nothing
    # signals an upstream's late commit of a dropped body: it is looked for 3 s later.
    s3.put_object(Bucket=BUCKET, Key="trailer/kept", Body=b"the old bytes")
    status, text, _ = put_with_trailer(f"{ENDPOINT}/{BUCKET}/trailer/kept", ACCESS, SECRET,
                                       data(600_000, "trailer kept"), "AAAAAA==")
    assert status == 400, f"{status} {text}"
    import time
    time.sleep(3)
    got = s3.get_object(Bucket=BUCKET, Key="trailer/kept")["Body"].read()
    assert got == b"the old bytes", f"a refused PUT replaced the object: {len(got)} bytes now"


@check
def concurrent_writers_leave_whole_objects(s3):
    """8 writers of distinct keys and 8 of one key: every object is one writer's whole bytes."""
    size = 3 * MIB + 17
    def put(i, key):
        client().put_object(Bucket=BUCKET, Key=key, Body=data(size, f"w{i}"))
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futs = [pool.submit(put, i, f"conc/{i}") for i in range(8)]
        futs += [pool.submit(put, i, "conc/same") for i in range(8)]
        for f in futs:
            f.result()
    for i in range(8):
        got = s3.get_object(Bucket=BUCKET, Key=f"conc/{i}")["Body"].read()
        assert got == data(size, f"w{i}"), f"conc/{i} holds other bytes"
    same = s3.get_object(Bucket=BUCKET, Key="conc/same")["Body"].read()
    assert any(same == data(size, f"w{i}") for i in range(8)), "conc/same is no writer's bytes"


@check
def listings_page_and_roll_up(s3):
    names = [f"list/d{i % 3}/f{i:03}" for i in range(25)] + ["list/top", "list/d1.txt"]
    for n in names:
        s3.put_object(Bucket=BUCKET, Key=n, Body=b"x")
    assert sorted(keys(s3, "list/")) == sorted(names)
    got, token, pages = [], None, 0
    while True:
        kw = {"ContinuationToken": token} if token else {}
        r = s3.list_objects_v2(Bucket=BUCKET, Prefix="list/", MaxKeys=4, **kw)
        got += [o["Key"] for o in r.get("Contents", [])]
        pages += 1
        if not r["IsTruncated"]:
            break
        token = r["NextContinuationToken"]
    assert got == sorted(names) and pages == 7, (pages, got)
    r = s3.list_objects_v2(Bucket=BUCKET, Prefix="list/", Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["list/d0/", "list/d1/", "list/d2/"]
    assert [o["Key"] for o in r["Contents"]] == ["list/d1.txt", "list/top"]
    # Prefixes are counted once across pages.
    seen, marker = [], ""
    while True:
        r = s3.list_objects(Bucket=BUCKET, Prefix="list/", Delimiter="/", MaxKeys=2, Marker=marker)
        seen += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        seen += [o["Key"] for o in r.get("Contents", [])]
        if not r["IsTruncated"]:
            break
        marker = r["NextMarker"]
    assert seen == ["list/d0/", "list/d1.txt", "list/d1/", "list/d2/", "list/top"], seen
    r = s3.list_objects_v2(Bucket=BUCKET, Prefix="list/", StartAfter="list/d2/f023")
    assert [o["Key"] for o in r["Contents"]] == ["list/top"], r.get("Contents")


@check
def odd_keys_round_trip_through_aws_sync_and_rm(s3):
    names = ["a+b.txt", "100%.txt", "x%2Fy.txt", "sp ace.txt", "ü/ß.txt", "semi;colon&amp.txt",
             "tilde~.txt", "q?uery.txt", "hash#.txt", "plus+/in+dir.txt"]
    with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
        for i, n in enumerate(names):
            p = os.path.join(src, n)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data(1000 + i, n))
            # Older than any LastModified (whole seconds on some servers): a second sync that
            # uploads again then means the listing did not give back the keys it was given.
            os.utime(p, (1_000_000_000, 1_000_000_000))
        aws("s3", "sync", src, f"s3://{BUCKET}/sync/")
        assert sorted(keys(s3, "sync/")) == sorted("sync/" + n for n in names), keys(s3, "sync/")
        # A second sync finds nothing to do: the listing gave back the exact keys.
        again = aws("s3", "sync", src, f"s3://{BUCKET}/sync/")
        assert again.stdout.strip() == "", f"second sync uploaded again: {again.stdout}"
        aws("s3", "sync", f"s3://{BUCKET}/sync/", dst)
        for i, n in enumerate(names):
            with open(os.path.join(dst, n), "rb") as f:
                assert f.read() == data(1000 + i, n), f"{n} came back different"
    aws("s3", "rm", "--recursive", f"s3://{BUCKET}/sync/")
    assert keys(s3, "sync/") == [], f"rm --recursive left {keys(s3, 'sync/')}"


@check
def multipart_with_copied_parts(s3):
    src = data(7 * MIB + 5, "mp-src")
    s3.put_object(Bucket=BUCKET, Key="mp/src", Body=src)
    tail = data(MIB + 3, "mp-tail")
    up = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/out")
    uid = up["UploadId"]
    listed = s3.list_multipart_uploads(Bucket=BUCKET, Prefix="mp/")
    assert [u["UploadId"] for u in listed.get("Uploads", [])] == [uid], listed.get("Uploads")
    p1 = s3.upload_part_copy(Bucket=BUCKET, Key="mp/out", UploadId=uid, PartNumber=1,
                             CopySource={"Bucket": BUCKET, "Key": "mp/src"},
                             CopySourceRange=f"bytes=0-{5 * MIB + 99}")
    p2 = s3.upload_part(Bucket=BUCKET, Key="mp/out", UploadId=uid, PartNumber=2, Body=tail)
    parts = s3.list_parts(Bucket=BUCKET, Key="mp/out", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, 5 * MIB + 100), (2, len(tail))]
    done = [{"PartNumber": 1, "ETag": p1["CopyPartResult"]["ETag"]},
            {"PartNumber": 2, "ETag": p2["ETag"]}]
    expect_error(lambda: s3.complete_multipart_upload(
        Bucket=BUCKET, Key="mp/out", UploadId=uid,
        MultipartUpload={"Parts": [done[0], {"PartNumber": 2, "ETag": '"0123456789abcdef0123456789abcdef"'}]}),
        {"InvalidPart"})
    expect_error(lambda: s3.complete_multipart_upload(
        Bucket=BUCKET, Key="mp/out", UploadId=uid, MultipartUpload={"Parts": done[::-1]}),
        {"InvalidPartOrder", "EntityTooSmall"})
    r = s3.complete_multipart_upload(Bucket=BUCKET, Key="mp/out", UploadId=uid,
                                     MultipartUpload={"Parts": done})
    assert r["ETag"].strip('"').endswith("-2"), r["ETag"]
    got = s3.get_object(Bucket=BUCKET, Key="mp/out")["Body"].read()
    assert got == src[: 5 * MIB + 100] + tail
    part2 = s3.get_object(Bucket=BUCKET, Key="mp/out", PartNumber=2)
    assert part2["Body"].read() == tail and part2["PartsCount"] == 2
    assert s3.list_multipart_uploads(Bucket=BUCKET, Prefix="mp/").get("Uploads", []) == []
    expect_error(lambda: s3.list_parts(Bucket=BUCKET, Key="mp/out", UploadId=uid), {"NoSuchUpload", "404"})


@check
def multipart_overwrite_serves_the_new_checksum(s3):
    """boto3 validates a GET's checksum: a stale one from the previous object fails the read."""
    from boto3.s3.transfer import TransferConfig
    cfg = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB)
    for seed in ("first", "second"):
        body = data(11 * MIB, seed)
        with tempfile.NamedTemporaryFile() as f:
            f.write(body)
            f.flush()
            s3.upload_file(f.name, BUCKET, "ck/obj", Config=cfg,
                           ExtraArgs={"ChecksumAlgorithm": "CRC32"})
        got = s3.get_object(Bucket=BUCKET, Key="ck/obj", ChecksumMode="ENABLED")
        assert got["Body"].read() == body


@check
def conditional_requests(s3):
    s3.put_object(Bucket=BUCKET, Key="cond/a", Body=b"one")
    etag = s3.head_object(Bucket=BUCKET, Key="cond/a")["ETag"]
    expect_error(lambda: s3.put_object(Bucket=BUCKET, Key="cond/a", Body=b"two", IfNoneMatch="*"),
                 {"PreconditionFailed", "412"})
    s3.put_object(Bucket=BUCKET, Key="cond/new", Body=b"n", IfNoneMatch="*")
    expect_error(lambda: s3.get_object(Bucket=BUCKET, Key="cond/a", IfMatch='"nope"'),
                 {"PreconditionFailed", "412"})
    expect_error(lambda: s3.get_object(Bucket=BUCKET, Key="cond/a", IfNoneMatch=etag),
                 {"304", "NotModified"})
    assert s3.get_object(Bucket=BUCKET, Key="cond/a", IfMatch=etag)["Body"].read() == b"one"
    r = s3.get_object(Bucket=BUCKET, Key="cond/a", Range="bytes=1-")
    assert r["Body"].read() == b"ne" and r["ContentRange"] == "bytes 1-2/3"
    assert s3.get_object(Bucket=BUCKET, Key="cond/a", Range="bytes=-2")["Body"].read() == b"ne"
    expect_error(lambda: s3.get_object(Bucket=BUCKET, Key="cond/a", Range="bytes=5-9"),
                 {"InvalidRange", "416"})


@check
def copies_metadata_and_tags(s3):
    s3.put_object(Bucket=BUCKET, Key="cp/src", Body=b"payload", ContentType="text/x-roar",
                  Metadata={"origin": "test"}, Tagging="team=ml&stage=raw")
    s3.copy_object(Bucket=BUCKET, Key="cp/dst", CopySource={"Bucket": BUCKET, "Key": "cp/src"})
    h = s3.head_object(Bucket=BUCKET, Key="cp/dst")
    assert h["ContentType"] == "text/x-roar" and h["Metadata"] == {"origin": "test"}, h
    tags = s3.get_object_tagging(Bucket=BUCKET, Key="cp/dst")["TagSet"]
    assert sorted((t["Key"], t["Value"]) for t in tags) == [("stage", "raw"), ("team", "ml")]
    s3.copy_object(Bucket=BUCKET, Key="cp/dst", CopySource={"Bucket": BUCKET, "Key": "cp/src"},
                   MetadataDirective="REPLACE", ContentType="application/x-new", Metadata={"b": "2"})
    h = s3.head_object(Bucket=BUCKET, Key="cp/dst")
    assert h["ContentType"] == "application/x-new" and h["Metadata"] == {"b": "2"}, h
    expect_error(lambda: s3.copy_object(Bucket=BUCKET, Key="cp/src",
                                        CopySource={"Bucket": BUCKET, "Key": "cp/src"}),
                 {"InvalidRequest"})
    s3.put_object_tagging(Bucket=BUCKET, Key="cp/dst", Tagging={"TagSet": [{"Key": "k", "Value": "v"}]})
    assert s3.get_object_tagging(Bucket=BUCKET, Key="cp/dst")["TagSet"] == [{"Key": "k", "Value": "v"}]
    s3.delete_object_tagging(Bucket=BUCKET, Key="cp/dst")
    assert s3.get_object_tagging(Bucket=BUCKET, Key="cp/dst")["TagSet"] == []
    r = s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": "cp/src"}, {"Key": "cp/dst"},
                                                              {"Key": "cp/never"}], "Quiet": True})
    assert r.get("Errors", []) == [], r
    assert keys(s3, "cp/") == []


@check
def versioned_overwrite_and_restore(s3):
    vb = BUCKET + "-ver"
    s3.create_bucket(Bucket=vb)
    s3.put_bucket_versioning(Bucket=vb, VersioningConfiguration={"Status": "Enabled"})
    assert s3.get_bucket_versioning(Bucket=vb)["Status"] == "Enabled"
    v1 = s3.put_object(Bucket=vb, Key="model.bin", Body=b"weights v1")["VersionId"]
    v2 = s3.put_object(Bucket=vb, Key="model.bin", Body=b"weights v2")["VersionId"]
    assert v1 != v2
    assert s3.get_object(Bucket=vb, Key="model.bin")["Body"].read() == b"weights v2"
    assert s3.get_object(Bucket=vb, Key="model.bin", VersionId=v1)["Body"].read() == b"weights v1"
    vs = s3.list_object_versions(Bucket=vb, Prefix="model")
    assert [(v["VersionId"], v["IsLatest"]) for v in vs["Versions"]] == [(v2, True), (v1, False)]
    # Restore: copy the old version over the key.
    s3.copy_object(Bucket=vb, Key="model.bin",
                   CopySource={"Bucket": vb, "Key": "model.bin", "VersionId": v1})
    assert s3.get_object(Bucket=vb, Key="model.bin")["Body"].read() == b"weights v1"
    d = s3.delete_object(Bucket=vb, Key="model.bin")
    assert d.get("DeleteMarker") is True, d
    expect_error(lambda: s3.get_object(Bucket=vb, Key="model.bin"), {"NoSuchKey", "404"})
    assert s3.get_object(Bucket=vb, Key="model.bin", VersionId=v2)["Body"].read() == b"weights v2"
    vs = s3.list_object_versions(Bucket=vb)
    assert len(vs["Versions"]) == 3 and len(vs["DeleteMarkers"]) == 1, vs
    # Removing the marker brings the object back.
    s3.delete_object(Bucket=vb, Key="model.bin", VersionId=d["VersionId"])
    assert s3.get_object(Bucket=vb, Key="model.bin")["Body"].read() == b"weights v1"
    expect_error(lambda: s3.delete_bucket(Bucket=vb), {"BucketNotEmpty", "409"})
    for v in s3.list_object_versions(Bucket=vb).get("Versions", []):
        s3.delete_object(Bucket=vb, Key=v["Key"], VersionId=v["VersionId"])
    s3.delete_bucket(Bucket=vb)


@check
def errors_name_their_request(s3):
    try:
        s3.get_object(Bucket=BUCKET, Key="no/such/key")
    except botocore.exceptions.ClientError as e:
        assert code(e) == "NoSuchKey", code(e)
        h = e.response["ResponseMetadata"]["HTTPHeaders"]
        assert h.get("x-amz-request-id"), f"no x-amz-request-id in {h}"
    else:
        raise AssertionError("a missing key was found")
    expect_error(lambda: s3.head_bucket(Bucket=BUCKET + "-nope"), {"404", "NoSuchBucket"})


@check
def listing_edges_answer_as_s3(s3):
    s3.put_object(Bucket=BUCKET, Key="edge/a", Body=b"x")
    # MaxKeys=0 asks for nothing: nothing is cut short.
    for r in [s3.list_objects_v2(Bucket=BUCKET, Prefix="edge/", MaxKeys=0),
              s3.list_objects(Bucket=BUCKET, Prefix="edge/", MaxKeys=0)]:
        assert r["IsTruncated"] is False and not r.get("Contents"), r
    # An empty delimiter is no delimiter: not echoed.
    for r in [s3.list_objects_v2(Bucket=BUCKET, Prefix="edge/", Delimiter=""),
              s3.list_objects(Bucket=BUCKET, Prefix="edge/", Delimiter="")]:
        assert "Delimiter" not in r and [o["Key"] for o in r["Contents"]] == ["edge/a"], r
    # FetchOwner names each object's owner; without it ListObjectsV2 names none.
    owned = s3.list_objects_v2(Bucket=BUCKET, Prefix="edge/", FetchOwner=True)["Contents"]
    assert all(o.get("Owner", {}).get("ID") for o in owned), owned
    plain = s3.list_objects_v2(Bucket=BUCKET, Prefix="edge/")["Contents"]
    assert all("Owner" not in o for o in plain), plain


@check
def error_bodies_name_the_request_of_their_header(s3):
    import urllib.error
    import urllib.request
    # Unsigned: refused with an error body, as any client's mistake is.
    try:
        urllib.request.urlopen(f"{ENDPOINT}/{BUCKET}/no-such-key-unsigned", timeout=10)
    except urllib.error.HTTPError as e:
        body, header = e.read().decode(), e.headers.get("x-amz-request-id")
    else:
        raise AssertionError("an unsigned GET was served")
    assert header and f"<RequestId>{header}</RequestId>" in body, (header, body)



@check
def operations_with_nothing_to_record_answer_as_the_server(s3):
    """Bucket tags, object attributes and object tags with a body: through a forwarding gateway
    these go upstream as they came, so they answer as the server itself does."""
    s3.put_object(Bucket=BUCKET, Key="attr/x", Body=b"12345")
    attrs = s3.get_object_attributes(Bucket=BUCKET, Key="attr/x",
                                     ObjectAttributes=["ETag", "ObjectSize"])
    assert attrs.get("ObjectSize") == 5, attrs
    assert attrs.get("ETag", "").strip('"') == hashlib.md5(b"12345").hexdigest(), attrs
    tags = {"TagSet": [{"Key": "team", "Value": "a b+=._:/@"}, {"Key": "k2", "Value": "v2"}]}
    s3.put_bucket_tagging(Bucket=BUCKET, Tagging=tags)
    got = s3.get_bucket_tagging(Bucket=BUCKET)["TagSet"]
    assert sorted((t["Key"], t["Value"]) for t in got) == [("k2", "v2"), ("team", "a b+=._:/@")], got
    s3.delete_bucket_tagging(Bucket=BUCKET)
    expect_error(lambda: s3.get_object_attributes(Bucket=BUCKET, Key="attr/missing",
                                                  ObjectAttributes=["ETag"]),
                 {"NoSuchKey", "404"})
    s3.delete_object(Bucket=BUCKET, Key="attr/x")


def main():
    s3 = client()
    try:
        s3.create_bucket(Bucket=BUCKET)
    except botocore.exceptions.ClientError as e:
        if code(e) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
    failed = 0
    for fn in CHECKS:
        if fn.__name__ in SKIP:
            print(f"skip {fn.__name__}", flush=True)
            continue
        try:
            fn(s3)
            print(f"ok {fn.__name__}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the next check runs
            failed += 1
            detail = traceback.format_exc().strip().splitlines()[-3:]
            print(f"FAIL {fn.__name__}: {e!r} | {' / '.join(detail)}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
