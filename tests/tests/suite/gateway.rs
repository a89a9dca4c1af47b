//! The S3 gateway with real clients: aws-sdk-s3 against `roar gateway` (embedded store, and an
//! s3s-fs upstream on loopback), raw SigV4-signed requests for what the SDK will not do (virtual
//! hosts, a client that vanishes mid-body), boto3 under `roar run --s3`, and upstream faults.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region, RequestChecksumCalculation};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, Delete, ObjectIdentifier};
use aws_sdk_s3::Client;
use common::server::Server;
use common::{stderr, Project};

const BUCKET: &str = "lineage-data";

fn b3(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

/// Deterministic bytes that do not compress or repeat at part boundaries.
fn data(len: usize, seed: u8) -> Vec<u8> {
    let mut x = 0x9e37_79b9_u32 ^ u32::from(seed);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn bin(name: &str) -> PathBuf {
    common::roar_bin().with_file_name(name)
}

fn gateway(p: &Project, args: &[&str], env: &[(&str, &str)]) -> Server {
    let mut cmd = p.cmd(["gateway", "--listen", "127.0.0.1:0"]);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Server::spawn(cmd, p.path().join("gateway.log"))
}

fn upstream(root: &Path, access: &str, secret: &str) -> Server {
    let mut cmd = Command::new(bin("s3-upstream"));
    cmd.arg(root).args([access, secret]);
    Server::spawn(cmd, root.with_extension("log"))
}

fn client(endpoint: &str, access: &str, secret: &str) -> Client {
    client_with(
        endpoint,
        access,
        secret,
        RequestChecksumCalculation::WhenSupported,
    )
}

/// `WhenSupported` (the SDK default) uploads aws-chunked with a CRC trailer and an unsigned
/// payload; `WhenRequired` sends a plain body signed with its SHA-256.
fn client_with(
    endpoint: &str,
    access: &str,
    secret: &str,
    checksums: RequestChecksumCalculation,
) -> Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new(access, secret, None, None, "test"))
        .request_checksum_calculation(checksums)
        // Each test sees the gateway's own answer, not the SDK's retries of it.
        .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
        .build();
    Client::from_conf(conf)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn get(c: &Client, key: &str, range: Option<&str>) -> Vec<u8> {
    let out = c
        .get_object()
        .bucket(BUCKET)
        .key(key)
        .set_range(range.map(str::to_owned))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {key}: {e:?}"));
    out.body.collect().await.unwrap().into_bytes().to_vec()
}

async fn put(c: &Client, key: &str, body: &[u8]) {
    c.put_object()
        .bucket(BUCKET)
        .key(key)
        .body(ByteStream::from(body.to_vec()))
        .send()
        .await
        .unwrap_or_else(|e| panic!("PUT {key}: {e:?}"));
}

async fn multipart(c: &Client, key: &str, parts: &[&[u8]]) {
    let up = c
        .create_multipart_upload()
        .bucket(BUCKET)
        .key(key)
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap();
    let mut done = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let n = i as i32 + 1;
        let r = c
            .upload_part()
            .bucket(BUCKET)
            .key(key)
            .upload_id(id)
            .part_number(n)
            .body(ByteStream::from(part.to_vec()))
            .send()
            .await
            .unwrap();
        done.push(
            CompletedPart::builder()
                .part_number(n)
                .e_tag(r.e_tag().unwrap())
                .build(),
        );
    }
    let listed = c
        .list_parts()
        .bucket(BUCKET)
        .key(key)
        .upload_id(id)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.parts().len(), parts.len());
    c.complete_multipart_upload()
        .bucket(BUCKET)
        .key(key)
        .upload_id(id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(done))
                .build(),
        )
        .send()
        .await
        .unwrap();
}

/// The gateway jobs in the store, oldest first, as `roar show --json` prints them.
fn gateway_jobs(p: &Project) -> Vec<serde_json::Value> {
    let out = p.roar(["log", "--json", "-n", "0"]);
    let log: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut jobs: Vec<serde_json::Value> = log
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["backend"] == "gateway")
        .map(|j| p.job_json(j["id"].as_i64().unwrap()))
        .collect();
    jobs.reverse();
    jobs
}

/// (role, path) → blake3 of the job's files.
fn file_hashes(job: &serde_json::Value) -> Vec<(String, String, Option<String>)> {
    let mut v: Vec<_> = job["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["role"].as_str().unwrap().to_owned(),
                f["path"].as_str().unwrap().to_owned(),
                f["hash"]["blake3"].as_str().map(str::to_owned),
            )
        })
        .collect();
    v.sort();
    v
}

/// The HTTP status and S3 error code of a failed request.
fn failure<E: aws_sdk_s3::error::ProvideErrorMetadata>(
    err: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> (Option<u16>, Option<&str>) {
    (
        err.raw_response().map(|r| r.status().as_u16()),
        err.as_service_error().and_then(|e| e.code()),
    )
}

/// Where the embedded store keeps a body: `.roar/s3/blobs/XY/<blake3>`.
fn blob(p: &Project, body: &[u8]) -> PathBuf {
    let h = b3(body);
    p.path().join(".roar/s3/blobs").join(&h[..2]).join(&h)
}

fn obj(key: &str) -> String {
    format!("s3://{BUCKET}/{key}")
}

#[test]
fn embedded_store_serves_and_records_every_operation_per_access_key() {
    let p = Project::new();
    p.write(
        "keys.txt",
        b"# two clients, two jobs\nALICEKEY0000000000001 alice-secret-alice-secret-alice-secret-0\nBOBKEY00000000000002 bob-secret-bob-secret-bob-secret-bob-sec\n",
    );
    // Bob reads what Alice writes: the bucket is shared (else it would be hers alone).
    let gw = gateway(&p, &["--credentials", "keys.txt", "--share", BUCKET], &[]);
    let endpoint = gw.endpoint();
    let alice = client(
        &endpoint,
        "ALICEKEY0000000000001",
        "alice-secret-alice-secret-alice-secret-0",
    );
    let alice_signed = client_with(
        &endpoint,
        "ALICEKEY0000000000001",
        "alice-secret-alice-secret-alice-secret-0",
        RequestChecksumCalculation::WhenRequired,
    );
    let bob = client(
        &endpoint,
        "BOBKEY00000000000002",
        "bob-secret-bob-secret-bob-secret-bob-sec",
    );
    let raw = data(300 * 1024, 1);
    let signed = data(4096, 2);
    let (part1, part2) = (data(5 * 1024 * 1024, 3), data(1024 * 1024 + 7, 4));
    let whole: Vec<u8> = [part1.as_slice(), part2.as_slice()].concat();

    rt().block_on(async {
        alice.create_bucket().bucket(BUCKET).send().await.unwrap();
        let buckets = alice.list_buckets().send().await.unwrap();
        assert!(buckets.buckets().iter().any(|b| b.name() == Some(BUCKET)));
        alice.head_bucket().bucket(BUCKET).send().await.unwrap();

        put(&alice, "raw/a.bin", &raw).await; // aws-chunked, unsigned payload, CRC trailer
        put(&alice_signed, "raw/signed.bin", &signed).await; // signed payload
        assert_eq!(get(&alice, "raw/a.bin", None).await, raw);
        assert_eq!(
            get(&alice, "raw/a.bin", Some("bytes=10-19")).await,
            &raw[10..20]
        );
        let head = alice
            .head_object()
            .bucket(BUCKET)
            .key("raw/a.bin")
            .send()
            .await
            .unwrap();
        assert_eq!(head.content_length(), Some(raw.len() as i64));
        let v2 = alice
            .list_objects_v2()
            .bucket(BUCKET)
            .prefix("raw/")
            .send()
            .await
            .unwrap();
        let keys: Vec<_> = v2.contents().iter().filter_map(|o| o.key()).collect();
        assert_eq!(keys, ["raw/a.bin", "raw/signed.bin"]);
        let v1 = alice.list_objects().bucket(BUCKET).send().await.unwrap();
        assert_eq!(v1.contents().len(), 2);

        alice
            .copy_object()
            .bucket(BUCKET)
            .key("tmp/copy.bin")
            .copy_source(format!("{BUCKET}/raw/a.bin"))
            .send()
            .await
            .unwrap();
        assert_eq!(get(&alice, "tmp/copy.bin", None).await, raw);
        multipart(&alice, "model/ckpt.bin", &[&part1, &part2]).await;
        let aborted = alice
            .create_multipart_upload()
            .bucket(BUCKET)
            .key("model/aborted.bin")
            .send()
            .await
            .unwrap();
        alice
            .abort_multipart_upload()
            .bucket(BUCKET)
            .key("model/aborted.bin")
            .upload_id(aborted.upload_id().unwrap())
            .send()
            .await
            .unwrap();
        alice
            .delete_object()
            .bucket(BUCKET)
            .key("tmp/copy.bin")
            .send()
            .await
            .unwrap();
        alice
            .delete_objects()
            .bucket(BUCKET)
            .delete(
                Delete::builder()
                    .objects(
                        ObjectIdentifier::builder()
                            .key("raw/signed.bin")
                            .build()
                            .unwrap(),
                    )
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
        // Not part of what the gateway serves: a proper S3 error, not a hang or a 500.
        let err = alice
            .get_bucket_tagging()
            .bucket(BUCKET)
            .send()
            .await
            .expect_err("bucket tagging is not served");
        assert_eq!(
            err.as_service_error()
                .and_then(|e| aws_sdk_s3::error::ProvideErrorMetadata::code(e)),
            Some("NotImplemented"),
            "{err:?}"
        );

        // Bob reads what Alice wrote and part of the checkpoint.
        assert_eq!(get(&bob, "raw/a.bin", None).await, raw);
        assert_eq!(
            get(&bob, "model/ckpt.bin", Some("bytes=100-199")).await,
            &whole[100..200]
        );
    });
    let (status, log) = gw.stop();
    assert!(status.success(), "gateway exit: {status:?}\n{log}");
    // The bytes the clients wrote are in the embedded store, one blob named by their blake3.
    assert_eq!(std::fs::read(blob(&p, &whole)).unwrap(), whole);

    let jobs = gateway_jobs(&p);
    assert_eq!(jobs.len(), 2, "one job per access key: {log}");
    let (a, b) = (&jobs[0], &jobs[1]);
    assert_eq!(a["name"], "s3 client ALICEKEY0000000000001");
    assert_eq!(
        file_hashes(a),
        vec![
            ("output".into(), obj("model/ckpt.bin"), Some(b3(&whole))),
            ("output".into(), obj("raw/a.bin"), Some(b3(&raw))),
            ("temp".into(), obj("raw/signed.bin"), None),
            ("temp".into(), obj("tmp/copy.bin"), None),
        ]
    );
    assert_eq!(
        file_hashes(b),
        vec![
            ("input".into(), obj("model/ckpt.bin"), Some(b3(&whole))),
            ("input".into(), obj("raw/a.bin"), Some(b3(&raw))),
        ]
    );
    let ranged = b["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == obj("model/ckpt.bin"))
        .unwrap();
    assert_eq!(
        ranged["s3"]["range"],
        format!("bytes 100-199/{}", whole.len())
    );
    assert!(ranged["s3"]["etag"].is_string());
    // Lineage crosses clients by content: Bob's input was made by Alice's job.
    let out = p.roar(["lineage", &obj("raw/a.bin")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(common::stdout(&out).contains("s3 client ALICEKEY0000000000001"));
}

#[test]
fn a_bad_signature_is_refused_before_anything_is_stored() {
    let p = Project::new();
    let gw = gateway(&p, &[], &[]);
    let line = gw.line.clone();
    let key = |name: &str| {
        let start = line.find(name).unwrap() + name.len() + 1;
        line[start..].split_whitespace().next().unwrap().to_owned()
    };
    let (access, secret) = (key("AWS_ACCESS_KEY_ID"), key("AWS_SECRET_ACCESS_KEY"));
    let good = client(&gw.endpoint(), &access, &secret);
    let forged = client(
        &gw.endpoint(),
        &access,
        "not-the-secret-not-the-secret-not-the-se",
    );
    let unknown = client(&gw.endpoint(), "NOSUCHKEY00000000000", &secret);
    rt().block_on(async {
        good.create_bucket().bucket(BUCKET).send().await.unwrap();
        for (who, c, code) in [
            ("wrong secret", &forged, "SignatureDoesNotMatch"),
            ("unknown key", &unknown, "InvalidAccessKeyId"),
        ] {
            let err = c
                .put_object()
                .bucket(BUCKET)
                .key("forged.bin")
                .body(ByteStream::from_static(b"x"))
                .send()
                .await
                .expect_err(who);
            assert_eq!(failure(&err), (Some(403), Some(code)), "{who}: {err:?}");
        }
        let head = good
            .head_object()
            .bucket(BUCKET)
            .key("forged.bin")
            .send()
            .await;
        assert!(head.is_err(), "a forged PUT reached the store");
    });
    let (status, _) = gw.stop();
    assert!(status.success());
    assert!(!p
        .path()
        .join(".roar/s3")
        .join(BUCKET)
        .join("forged.bin")
        .exists());
    assert!(
        gateway_jobs(&p).is_empty(),
        "refused requests are not accesses"
    );
}

/// A SigV4-signed request with an unsigned payload, sent on a raw socket: `host` is the Host
/// header (virtual-hosted style when it names a bucket), `body` what is sent of the body.
fn raw_request(
    addr: &str,
    host: &str,
    method: &str,
    path: &str,
    content_length: usize,
    body: &[u8],
    keys: (&str, &str),
) -> TcpStream {
    use aws_sigv4::http_request::{
        sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
        SigningSettings, UriPathNormalizationMode,
    };
    let url = format!("http://{host}{path}");
    let mut headers = vec![
        ("host".to_owned(), host.to_owned()),
        ("content-length".to_owned(), content_length.to_string()),
    ];
    let identity = aws_credential_types::Credentials::new(keys.0, keys.1, None, None, "t").into();
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("s3")
        .time(SystemTime::now())
        .settings(settings)
        .build()
        .unwrap()
        .into();
    let signable = SignableRequest::new(
        method,
        &url,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        SignableBody::UnsignedPayload,
    )
    .unwrap();
    let (instructions, _) = sign(signable, &params).unwrap().into_parts();
    let mut req = http::Request::builder().method(method).uri(&url);
    for (k, v) in &headers {
        req = req.header(k, v);
    }
    let mut req = req.body(()).unwrap();
    instructions.apply_to_request_http1x(&mut req);
    headers = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    let mut text = format!("{method} {path} HTTP/1.1\r\n");
    for (k, v) in &headers {
        text.push_str(&format!("{k}: {v}\r\n"));
    }
    text.push_str("\r\n");
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(text.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    s
}

fn response(mut s: TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    // Until the headers and a short body are in, or the server closes.
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&out);
        if let Some(h) = text.find("\r\n\r\n") {
            let len = text[..h]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if out.len() >= h + 4 + len {
                break;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn virtual_hosted_requests_and_clients_that_vanish_mid_body() {
    let p = Project::new();
    p.write(
        "keys.txt",
        b"RAWKEY00000000000001 raw-secret-raw-secret-raw-secret-raw-sec\n",
    );
    let keys = (
        "RAWKEY00000000000001",
        "raw-secret-raw-secret-raw-secret-raw-sec",
    );
    let gw = gateway(&p, &["--credentials", "keys.txt"], &[]);
    let addr = gw.endpoint().trim_start_matches("http://").to_owned();
    let port = addr.rsplit(':').next().unwrap().to_owned();
    let vhost = format!("{BUCKET}.localhost:{port}");

    let created = response(raw_request(
        &addr,
        &addr,
        "PUT",
        &format!("/{BUCKET}"),
        0,
        b"",
        keys,
    ));
    assert!(created.starts_with("HTTP/1.1 200"), "{created}");
    // Virtual-hosted style: the bucket is in the Host header, the key is the whole path.
    let body = data(1000, 9);
    let put = response(raw_request(
        &addr,
        &vhost,
        "PUT",
        "/vh/object.bin",
        body.len(),
        &body,
        keys,
    ));
    assert!(put.starts_with("HTTP/1.1 200"), "{put}");
    let got = response(raw_request(
        &addr,
        &vhost,
        "GET",
        "/vh/object.bin",
        0,
        b"",
        keys,
    ));
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert_eq!(std::fs::read(blob(&p, &body)).unwrap(), body);

    // A PUT that announces 1 MiB, sends 100 KiB and goes away: nothing is stored or recorded.
    let partial = raw_request(
        &addr,
        &addr,
        "PUT",
        &format!("/{BUCKET}/half.bin"),
        1 << 20,
        &data(100 * 1024, 10),
        keys,
    );
    drop(partial);
    // A GET of a large object abandoned after its first bytes: not recorded as a read.
    let big = data(8 << 20, 11);
    let put = response(raw_request(
        &addr,
        &addr,
        "PUT",
        &format!("/{BUCKET}/big.bin"),
        big.len(),
        &big,
        keys,
    ));
    assert!(put.starts_with("HTTP/1.1 200"), "{put}");
    let mut reader = raw_request(
        &addr,
        &addr,
        "GET",
        &format!("/{BUCKET}/big.bin"),
        0,
        b"",
        keys,
    );
    let mut first = [0u8; 4096];
    reader.read_exact(&mut first).unwrap();
    drop(reader);
    // Stopping waits for every connection, the abandoned one included, to finish.

    let (status, log) = gw.stop();
    assert!(status.success(), "{log}");
    // The body that broke off left nothing: no blob, no temp file.
    assert!(!blob(&p, &data(100 * 1024, 10)).exists());
    assert_eq!(
        std::fs::read_dir(p.path().join(".roar/s3/tmp"))
            .unwrap()
            .count(),
        0
    );
    let jobs = gateway_jobs(&p);
    assert_eq!(jobs.len(), 1, "{log}");
    assert_eq!(
        file_hashes(&jobs[0]),
        vec![
            ("output".into(), obj("big.bin"), Some(b3(&big))),
            ("output".into(), obj("vh/object.bin"), Some(b3(&body))),
        ],
        "the half PUT and the abandoned GET are not accesses"
    );
    let big_file = jobs[0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == obj("big.bin"))
        .unwrap();
    assert_eq!(
        big_file["ops"],
        serde_json::json!(["write", "create"]),
        "no read recorded"
    );
}

#[test]
fn upstream_requests_are_re_signed_and_recorded() {
    let p = Project::new();
    let up_root = p.path().join("upstream");
    let up = upstream(
        &up_root,
        "UPSTREAMKEY000000001",
        "upstream-secret-upstream-secret-upstrea",
    );
    let upstream_env = [
        ("AWS_ACCESS_KEY_ID", "UPSTREAMKEY000000001"),
        (
            "AWS_SECRET_ACCESS_KEY",
            "upstream-secret-upstream-secret-upstrea",
        ),
    ];
    p.write(
        "keys.txt",
        b"CLIENTKEY00000000001 client-secret-client-secret-client-secr\n",
    );
    let gw = gateway(
        &p,
        &["--credentials", "keys.txt", "--upstream", &up.endpoint()],
        &upstream_env,
    );
    let c = client(
        &gw.endpoint(),
        "CLIENTKEY00000000001",
        "client-secret-client-secret-client-secr",
    );
    let small = data(4096, 20);
    let (part1, part2) = (data(5 << 20, 21), data(333_333, 22));
    let whole = [part1.as_slice(), part2.as_slice()].concat();
    rt().block_on(async {
        c.create_bucket().bucket(BUCKET).send().await.unwrap();
        put(&c, "in/small.bin", &small).await;
        assert_eq!(get(&c, "in/small.bin", None).await, small);
        // Keys that need percent-encoding survive re-signing.
        put(&c, "in/a b+(c)=ü&.bin", b"odd").await;
        assert_eq!(get(&c, "in/a b+(c)=ü&.bin", None).await, b"odd");
        multipart(&c, "out/model.bin", &[&part1, &part2]).await;
        assert_eq!(
            get(&c, "out/model.bin", Some("bytes=5-9")).await,
            &whole[5..10]
        );
        let listed = c.list_objects_v2().bucket(BUCKET).send().await.unwrap();
        assert_eq!(listed.key_count(), Some(3));
    });
    let (status, log) = gw.stop();
    assert!(status.success(), "{log}");
    // The objects are in the upstream's store, which verified the gateway's own signatures.
    assert_eq!(
        std::fs::read(up_root.join(BUCKET).join("out/model.bin")).unwrap(),
        whole
    );
    assert!(
        !log.contains("upstream-secret"),
        "upstream credentials leaked into the log"
    );
    let jobs = gateway_jobs(&p);
    assert_eq!(jobs.len(), 1, "{log}");
    assert_eq!(
        file_hashes(&jobs[0]),
        vec![
            ("output".into(), obj("in/a b+(c)=ü&.bin"), Some(b3(b"odd"))),
            ("output".into(), obj("in/small.bin"), Some(b3(&small))),
            ("output".into(), obj("out/model.bin"), Some(b3(&whole))),
        ]
    );
    drop(up);
    // The store never holds the upstream's secret.
    let db = std::fs::read(p.path().join(".roar/roar.db")).unwrap();
    let needle = b"upstream-secret-upstream-secret-upstrea";
    assert!(!db.windows(needle.len()).any(|w| w == needle));
}

/// What the upstream answers reaches the client as the upstream said it: headers, metadata,
/// validators, partial content, conditional and missing-object errors, through the gateway's
/// direct path for object GET/HEAD/PUT.
#[test]
fn upstream_answers_reach_the_client_unchanged() {
    let p = Project::new();
    let (up_key, up_secret) = (
        "UPSTREAMKEY000000001",
        "upstream-secret-upstream-secret-upstrea",
    );
    let up = upstream(&p.path().join("upstream"), up_key, up_secret);
    p.write(
        "keys.txt",
        b"CLIENTKEY00000000001 client-secret-client-secret-client-secr\n",
    );
    let gw = gateway(
        &p,
        &["--credentials", "keys.txt", "--upstream", &up.endpoint()],
        &[
            ("AWS_ACCESS_KEY_ID", up_key),
            ("AWS_SECRET_ACCESS_KEY", up_secret),
        ],
    );
    let via = client(
        &gw.endpoint(),
        "CLIENTKEY00000000001",
        "client-secret-client-secret-client-secr",
    );
    let direct = client(&up.endpoint(), up_key, up_secret);
    let body = data(100_000, 30);
    rt().block_on(async {
        via.create_bucket().bucket(BUCKET).send().await.unwrap();
        via.put_object()
            .bucket(BUCKET)
            .key("shards/0.csv")
            .content_type("text/csv")
            .cache_control("max-age=60")
            .metadata("owner", "ml-team")
            .body(ByteStream::from(body.clone()))
            .send()
            .await
            .unwrap();
        let (g, d) = (
            via.head_object()
                .bucket(BUCKET)
                .key("shards/0.csv")
                .send()
                .await
                .unwrap(),
            direct
                .head_object()
                .bucket(BUCKET)
                .key("shards/0.csv")
                .send()
                .await
                .unwrap(),
        );
        assert_eq!(g.content_type(), Some("text/csv"));
        assert_eq!(
            g.metadata()
                .and_then(|m| m.get("owner"))
                .map(String::as_str),
            Some("ml-team")
        );
        assert_eq!(
            (
                g.content_type(),
                g.cache_control(),
                g.metadata(),
                g.e_tag(),
                g.last_modified(),
                g.content_length()
            ),
            (
                d.content_type(),
                d.cache_control(),
                d.metadata(),
                d.e_tag(),
                d.last_modified(),
                d.content_length()
            )
        );
        let got = via
            .get_object()
            .bucket(BUCKET)
            .key("shards/0.csv")
            .send()
            .await
            .unwrap();
        assert_eq!(
            (
                got.content_type(),
                got.metadata(),
                got.e_tag(),
                got.last_modified()
            ),
            (d.content_type(), d.metadata(), d.e_tag(), d.last_modified())
        );
        assert_eq!(
            got.body.collect().await.unwrap().into_bytes().as_ref(),
            body.as_slice()
        );
        let part = via
            .get_object()
            .bucket(BUCKET)
            .key("shards/0.csv")
            .range("bytes=10-19")
            .send()
            .await
            .unwrap();
        assert_eq!(part.content_range(), Some("bytes 10-19/100000"));
        assert_eq!(
            part.body.collect().await.unwrap().into_bytes().as_ref(),
            &body[10..20]
        );
        // Conditional writes and failed reads keep the upstream's status and code.
        let exists = via
            .put_object()
            .bucket(BUCKET)
            .key("shards/0.csv")
            .if_none_match("*")
            .body(ByteStream::from(b"overwrite".to_vec()))
            .send()
            .await
            .expect_err("the object exists");
        assert_eq!(failure(&exists), (Some(412), Some("PreconditionFailed")));
        let missing = via
            .get_object()
            .bucket(BUCKET)
            .key("shards/none.csv")
            .send()
            .await
            .expect_err("no such key");
        assert_eq!(failure(&missing), (Some(404), Some("NoSuchKey")));
        let missing_head = via
            .head_object()
            .bucket(BUCKET)
            .key("shards/none.csv")
            .send()
            .await
            .expect_err("no such key");
        assert_eq!(failure(&missing_head).0, Some(404));
    });
    let (status, log) = gw.stop();
    assert!(status.success(), "{log}");
    // One write (the refused one is not); the reads of what the job wrote fold into it; the
    // missing key was never an access.
    let jobs = gateway_jobs(&p);
    assert_eq!(jobs.len(), 1, "{log}");
    let files = file_hashes(&jobs[0]);
    assert_eq!(
        files,
        vec![("output".into(), obj("shards/0.csv"), Some(b3(&body)))],
        "{log}"
    );
}

/// A private CA and a server certificate for 127.0.0.1 signed by it, made with the openssl CLI
/// in `dir`: (CA certificate, server certificate, server key).
fn private_ca(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    const SCRIPT: &str = r#"set -e
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 $ec -days 1 -subj "/CN=roar test CA" -keyout "$1.ca.key" -out "$1.ca.pem"
openssl req $ec -subj /CN=127.0.0.1 -keyout "$1.key" -out "$1.csr"
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > "$1.ext"
openssl x509 -req -days 1 -in "$1.csr" -CA "$1.ca.pem" -CAkey "$1.ca.key" -CAcreateserial \
    -extfile "$1.ext" -out "$1.pem"
"#;
    let out = Command::new("sh")
        .args(["-c", SCRIPT, "sh", name])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "openssl: {}", stderr(&out));
    let f = |ext: &str| dir.join(format!("{name}.{ext}"));
    (f("ca.pem"), f("pem"), f("key"))
}

/// Real S3 upstreams speak https: the direct path and the SDK path both verify the upstream's
/// certificate against the trusted roots (`SSL_CERT_FILE` here), and refuse one they cannot.
#[test]
fn an_https_upstream_is_verified_and_served() {
    if !common::require_tool("openssl") {
        return;
    }
    let p = Project::new();
    let (ca, cert, key) = private_ca(p.path(), "upstream");
    let (other_ca, _, _) = private_ca(p.path(), "other");
    let (up_key, up_secret) = (
        "UPSTREAMKEY000000001",
        "upstream-secret-upstream-secret-upstrea",
    );
    let up_root = p.path().join("upstream");
    let mut cmd = Command::new(bin("s3-upstream"));
    cmd.arg(&up_root)
        .args([up_key, up_secret, "0", "--tls"])
        .args([&cert, &key]);
    let up = Server::spawn(cmd, p.path().join("upstream.log"));
    let url = up.line.trim().to_owned();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    p.write(
        "keys.txt",
        b"CLIENTKEY00000000001 client-secret-client-secret-client-secr\n",
    );
    let small = data(4096, 40);
    for (roots, trusted) in [(&ca, true), (&other_ca, false)] {
        let roots = roots.to_str().unwrap();
        let gw = gateway(
            &p,
            &[
                "--credentials",
                "keys.txt",
                "--upstream",
                &url,
                "--upstream-timeout",
                "5",
            ],
            &[
                ("AWS_ACCESS_KEY_ID", up_key),
                ("AWS_SECRET_ACCESS_KEY", up_secret),
                ("SSL_CERT_FILE", roots),
            ],
        );
        let c = client(
            &gw.endpoint(),
            "CLIENTKEY00000000001",
            "client-secret-client-secret-client-secr",
        );
        rt().block_on(async {
            if trusted {
                c.create_bucket().bucket(BUCKET).send().await.unwrap();
                put(&c, "tls/small.bin", &small).await;
                assert_eq!(get(&c, "tls/small.bin", None).await, small);
                let listed = c.list_objects_v2().bucket(BUCKET).send().await.unwrap();
                assert_eq!(listed.key_count(), Some(1));
            } else {
                let err = c
                    .get_object()
                    .bucket(BUCKET)
                    .key("tls/small.bin")
                    .send()
                    .await
                    .expect_err("an upstream certificate from an untrusted CA");
                let status = err.raw_response().map(|r| r.status().as_u16());
                assert_eq!(status, Some(502), "{err:?}");
            }
        });
        let (exit, log) = gw.stop();
        assert!(exit.success(), "{log}");
        if !trusted {
            assert!(
                log.contains("certificate"),
                "the log does not say why: {log}"
            );
        }
    }
    assert_eq!(
        std::fs::read(up_root.join(BUCKET).join("tls/small.bin")).unwrap(),
        small
    );
    let jobs = gateway_jobs(&p);
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        file_hashes(&jobs[0]),
        vec![("output".into(), obj("tls/small.bin"), Some(b3(&small)))]
    );
}

/// A fake upstream that answers every request with 200, a Content-Length of 1 MiB and 1,000
/// bytes of it; then closes the connection (`hang == false`) or holds it silently.
fn half_body_upstream(hang: bool) -> (String, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().take(2) {
            let mut conn = conn.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\nETag: \"half\"\r\n\r\n");
            let _ = conn.write_all(&[7u8; 1000]);
            if hang {
                held.push(conn);
            }
        }
    });
    (url, server)
}

#[test]
fn an_upstream_failing_mid_body_is_a_broken_read_not_a_record() {
    let p = Project::new();
    p.write(
        "keys.txt",
        b"CLIENTKEY00000000001 client-secret-client-secret-client-secr\n",
    );
    let env = [
        ("AWS_ACCESS_KEY_ID", "UPSTREAMKEY000000001"),
        (
            "AWS_SECRET_ACCESS_KEY",
            "upstream-secret-upstream-secret-upstrea",
        ),
    ];
    for (what, hang) in [("closes", false), ("goes silent", true)] {
        let (url, server) = half_body_upstream(hang);
        let gw = gateway(
            &p,
            &[
                "--credentials",
                "keys.txt",
                "--upstream",
                &url,
                "--upstream-timeout",
                "2",
            ],
            &env,
        );
        let c = client(
            &gw.endpoint(),
            "CLIENTKEY00000000001",
            "client-secret-client-secret-client-secr",
        );
        let t = Instant::now();
        let result = rt().block_on(async {
            let out = c.get_object().bucket(BUCKET).key("k").send().await?;
            Ok::<_, Box<dyn std::error::Error>>(out.body.collect().await?.into_bytes().len())
        });
        assert!(
            result.is_err(),
            "upstream {what} mid-body: the client read {result:?} bytes as complete"
        );
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "upstream {what} mid-body: the failure took {:?}",
            t.elapsed()
        );
        let (exit, log) = gw.stop();
        assert!(exit.success(), "{log}");
        drop(server);
    }
    assert!(gateway_jobs(&p).is_empty(), "a broken read was recorded");
}

#[test]
fn upstream_faults_are_s3_errors_not_hangs() {
    let p = Project::new();
    let env = [
        ("AWS_ACCESS_KEY_ID", "UPSTREAMKEY000000001"),
        (
            "AWS_SECRET_ACCESS_KEY",
            "upstream-secret-upstream-secret-upstrea",
        ),
    ];
    // Down: a port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    // Slow: accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let slow = format!("http://{}", silent.local_addr().unwrap());
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in silent.incoming().take(8) {
            conns.push(c);
        }
    });
    p.write(
        "keys.txt",
        b"CLIENTKEY00000000001 client-secret-client-secret-client-secr\n",
    );
    for (what, url, limit) in [("down", &down, 10), ("slow", &slow, 15)] {
        let gw = gateway(
            &p,
            &[
                "--credentials",
                "keys.txt",
                "--upstream",
                url,
                "--upstream-timeout",
                "2",
            ],
            &env,
        );
        let c = client(
            &gw.endpoint(),
            "CLIENTKEY00000000001",
            "client-secret-client-secret-client-secr",
        );
        let t = Instant::now();
        let err = rt()
            .block_on(c.get_object().bucket(BUCKET).key("k").send())
            .expect_err("the upstream cannot answer");
        let status = err.raw_response().map(|r| r.status().as_u16());
        assert!(
            matches!(status, Some(500..=599)),
            "upstream {what}: expected a 5xx S3 error, got {err:?}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(limit),
            "upstream {what}: the error took {:?}",
            t.elapsed()
        );
        let (exit, log) = gw.stop();
        assert!(exit.success(), "{log}");
    }
    drop(held);
    assert!(gateway_jobs(&p).is_empty());
}

#[test]
fn bad_gateway_input_gets_one_line() {
    let p = Project::new();
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 4] = [
        (&["--listen", "0.0.0.0:0"], &[], "--allow-remote"),
        (
            &["--listen", "127.0.0.1:0", "--credentials", "missing.txt"],
            &[],
            "missing.txt",
        ),
        (
            &["--listen", "127.0.0.1:0", "--upstream", "ftp://example"],
            &[("AWS_ACCESS_KEY_ID", "a"), ("AWS_SECRET_ACCESS_KEY", "b")],
            "not an http(s) URL",
        ),
        (
            &[
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "http://127.0.0.1:1",
            ],
            &[
                ("AWS_PROFILE", "no-such-profile"),
                ("AWS_CONFIG_FILE", "/nonexistent"),
                ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"),
            ],
            "no credentials for the upstream",
        ),
    ];
    for (args, env, expect) in cases {
        let mut cmd = p.cmd(["gateway"]);
        cmd.args(args)
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    // A port in use.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = p.roar(["gateway", "--listen", &addr]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!("cannot listen on {addr}")),
        "{}",
        stderr(&out)
    );
}

#[test]
fn roar_run_s3_records_objects_as_inputs_and_outputs() {
    if !common::require_python_modules(&["boto3"]) {
        return;
    }
    let p = Project::new();
    p.write(
        "upload.py",
        br#"import boto3, sys
s3 = boto3.client("s3")
s3.create_bucket(Bucket="lineage-data")
s3.upload_file(sys.argv[1], "lineage-data", "raw/" + sys.argv[1])
"#,
    );
    p.write(
        "train.py",
        br#"import boto3, os, sys
s3 = boto3.client("s3")
assert "ROAR" in os.environ["AWS_ACCESS_KEY_ID"]
body = s3.get_object(Bucket="lineage-data", Key="raw/data.csv")["Body"].read()
model = body.upper()
open("model.txt", "wb").write(model)
s3.put_object(Bucket="lineage-data", Key="models/model.txt", Body=model)
sys.exit(3)
"#,
    );
    p.write("data.csv", b"a,b\n1,2\n");
    let out = p.roar(["run", "--s3", "python3", "upload.py", "data.csv"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let up = p.last_job();
    assert_eq!(p.files(&up, "output"), vec![obj("raw/data.csv")]);
    // The command's exit status and stderr are its own; the gateway adds nothing to them.
    let out = p.roar(["run", "--s3", "python3", "train.py"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "only roar's summary line: {err}");
    let train = p.last_job();
    assert_eq!(
        p.files(&train, "input"),
        vec![obj("raw/data.csv"), "train.py".to_owned()]
    );
    assert_eq!(
        p.files(&train, "output"),
        vec!["model.txt".to_owned(), obj("models/model.txt")]
    );
    let hashes = file_hashes(&train);
    let model = b3(b"A,B\n1,2\n");
    assert!(hashes.contains(&(
        "output".into(),
        obj("models/model.txt"),
        Some(model.clone())
    )));
    assert!(hashes.contains(&("input".into(), obj("raw/data.csv"), Some(b3(b"a,b\n1,2\n")))));
    // The lineage of the local model goes through the bucket back to the local CSV.
    let out = p.roar(["lineage", "model.txt"]);
    let text = common::stdout(&out);
    assert!(text.contains("python3 upload.py data.csv"), "{text}");
    assert!(text.contains(&obj("raw/data.csv")), "{text}");
    // Re-running it needs the gateway again; the bucket's content is as recorded: nothing stale.
    let text = common::stdout(&p.roar(["reproduce", "model.txt"]));
    assert!(text.contains("roar run --s3 -- python3 train.py"), "{text}");
    assert!(
        text.contains("roar run --s3 -- python3 upload.py data.csv"),
        "{text}"
    );
    let text = common::stdout(&p.roar(["status"]));
    assert!(!text.contains("stale"), "{text}");
}

#[test]
fn roar_run_s3_borrows_a_key_from_the_running_gateway() {
    if !common::require_python_modules(&["boto3"]) {
        return;
    }
    let p = Project::new();
    p.write(
        "put.py",
        br#"import boto3, os, signal, sys
s3 = boto3.client("s3")
open(sys.argv[1], "w").write(" ".join(os.environ[k] for k in
    ["AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]))
try:
    s3.create_bucket(Bucket="lineage-data")
except (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
    pass
s3.put_object(Bucket="lineage-data", Key=sys.argv[2], Body=sys.argv[2].encode())
if len(sys.argv) > 3:
    pid = os.getppid()
    while open(f"/proc/{pid}/comm").read().strip() != "roar":
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    os.kill(pid, signal.SIGKILL)
"#,
    );
    let gw = gateway(&p, &["--session-idle", "3600"], &[]);
    let run = |args: &[&str]| {
        let mut argv = vec!["run", "--s3", "python3", "put.py"];
        argv.extend_from_slice(args);
        p.roar(argv)
    };
    let env_of = |file: &str| -> Vec<String> {
        std::fs::read_to_string(p.path().join(file))
            .unwrap()
            .split(' ')
            .map(str::to_owned)
            .collect()
    };

    // The run talks to the running gateway, with a key of its own, and gets its accesses.
    let out = run(&["env1", "a.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    let env = env_of("env1");
    assert_eq!(env[0], gw.endpoint());
    assert!(
        !gw.line.contains(&env[1]),
        "a key of the run's own, not the gateway's"
    );
    let job = p.last_job();
    assert_eq!(
        p.files(&job, "output"),
        vec!["env1".to_owned(), obj("a.txt")]
    );
    assert!(file_hashes(&job).contains(&("output".into(), obj("a.txt"), Some(b3(b"a.txt")))));
    // The key ends with the run.
    let (endpoint, access, secret) = (&env[0], &env[1], &env[2]);
    let stale = client(endpoint, access, secret);
    let err = rt()
        .block_on(stale.get_object().bucket(BUCKET).key("a.txt").send())
        .expect_err("the run's key after the run");
    assert_eq!(failure(&err), (Some(403), Some("InvalidAccessKeyId")));

    // A run killed before it collects its accesses leaves them to the gateway, which records
    // them as the key's own job.
    let out = run(&["env2", "b.txt", "die"]);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9),
        "{}",
        stderr(&out)
    );
    let killed_key = env_of("env2")[1].clone();

    // A run that wants another backend (an upstream) starts a gateway of its own.
    let root = p.path().join("upstream-root");
    std::fs::create_dir_all(&root).unwrap();
    let up = upstream(
        &root,
        "UPSTREAMKEY000000000",
        "upstream-secret-upstream-secret-0000000",
    );
    let out = p
        .cmd([
            "run",
            "--s3-upstream",
            &up.endpoint(),
            "python3",
            "put.py",
            "env3",
            "c.txt",
        ])
        .env("AWS_ACCESS_KEY_ID", "UPSTREAMKEY000000000")
        .env(
            "AWS_SECRET_ACCESS_KEY",
            "upstream-secret-upstream-secret-0000000",
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let own = env_of("env3")[0].clone();
    assert_ne!(own, gw.endpoint());
    assert_eq!(
        p.files(&p.last_job(), "output"),
        vec!["env3".to_owned(), obj("c.txt")]
    );

    let gw_endpoint = gw.endpoint();
    let (status, log) = gw.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains(&killed_key), "{log}");
    let jobs = gateway_jobs(&p);
    let killed: Vec<_> = jobs
        .iter()
        .filter(|j| j["argv"].to_string().contains(&killed_key))
        .collect();
    assert_eq!(killed.len(), 1, "{jobs:?}");
    assert_eq!(
        file_hashes(killed[0]),
        vec![("output".into(), obj("b.txt"), Some(b3(b"b.txt")))]
    );
    // Only the killed run's accesses became a gateway job: the others belong to their runs.
    assert_eq!(jobs.len(), 1, "{jobs:?}");

    // With the gateway gone, its socket is too, and runs start their own.
    assert!(!p.path().join(".roar/gateway.sock").exists());
    let out = run(&["env4", "d.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_ne!(env_of("env4")[0], gw_endpoint);
}

/// `roar gateway` killed with SIGKILL at seeded random moments while a client PUTs objects;
/// started again each time. Every PUT the client saw succeed (the gateway journals an access
/// before it answers) is an output of a recorded job with the hash of what was sent, once a roar
/// command has recovered the killed gateways' journals (docs/SEMANTICS.md, "Crashes").
/// `ROAR_CRASH_KILLS` sets the kills (24 here; RESULTS.md has 200), `ROAR_CRASH_SEED` the seed.
#[test]
fn a_gateway_killed_at_random_loses_no_completed_put() {
    let kills: u64 = std::env::var("ROAR_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let seed: u64 = std::env::var("ROAR_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20261128);
    let mut rng = common::Rng(seed ^ 0x6761_7465);
    let p = Project::new();
    let rt = rt();
    let mut acknowledged: Vec<(String, String)> = Vec::new();
    let mut mid_session = 0;
    for round in 0..kills {
        let gw = gateway(&p, &[], &[]);
        let keys: serde_json::Value = serde_json::from_str(gw.line.trim()).unwrap_or_default();
        let (access, secret) = match (
            keys["access_key_id"].as_str(),
            keys["secret_access_key"].as_str(),
        ) {
            (Some(a), Some(s)) => (a.to_owned(), s.to_owned()),
            _ => {
                // Plain output: `export AWS_ENDPOINT_URL=... AWS_ACCESS_KEY_ID=... ...`.
                let word = |name: &str| {
                    gw.line
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix(name))
                        .unwrap()
                        .to_owned()
                };
                (word("AWS_ACCESS_KEY_ID="), word("AWS_SECRET_ACCESS_KEY="))
            }
        };
        let c = client(&gw.endpoint(), &access, &secret);
        if round == 0 {
            rt.block_on(c.create_bucket().bucket(BUCKET).send())
                .unwrap();
        }
        let done = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let puts = {
            let done = done.clone();
            rt.spawn(async move {
                for k in 0..10_000u32 {
                    let body = data(100 + (k as usize * 37) % 5000, round as u8);
                    let key = format!("r{round}/o{k}");
                    let sent = c
                        .put_object()
                        .bucket(BUCKET)
                        .key(&key)
                        .body(ByteStream::from(body.clone()))
                        .send()
                        .await;
                    match sent {
                        Ok(_) => done.lock().unwrap().push((key, b3(&body))),
                        Err(_) => return,
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_micros(20_000 + rng.below(400_000)));
        // Dropping the server kills it with SIGKILL.
        drop(gw);
        rt.block_on(puts).unwrap();
        let done = std::mem::take(&mut *done.lock().unwrap());
        mid_session += usize::from(!done.is_empty());
        acknowledged.extend(done);
    }
    let jobs = gateway_jobs(&p);
    let mut outputs: std::collections::HashMap<String, String> = Default::default();
    for job in &jobs {
        assert_eq!(job["status"], "killed", "{job}");
        for f in job["files"].as_array().unwrap() {
            if f["role"] == "output" {
                outputs.insert(
                    f["path"].as_str().unwrap().to_owned(),
                    f["hash"]["blake3"].as_str().unwrap_or_default().to_owned(),
                );
            }
        }
    }
    let mut lost = Vec::new();
    for (key, hash) in &acknowledged {
        match outputs.get(&format!("s3://{BUCKET}/{key}")) {
            Some(h) if h == hash => {}
            Some(h) => panic!("{key} recorded with {h}, the client sent {hash}"),
            None => lost.push(key),
        }
    }
    assert!(
        lost.is_empty(),
        "seed {seed}: {} of {} acknowledged PUTs not recorded: {:?}",
        lost.len(),
        acknowledged.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(mid_session > 0, "no kill landed after a PUT");
    let left: Vec<_> = std::fs::read_dir(p.path().join(".roar/journal"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "journals left: {left:?}");
    eprintln!(
        "gateway kills: {kills}, {} PUTs acknowledged, {} jobs, 0 lost",
        acknowledged.len(),
        jobs.len()
    );
}

/// `roar run --s3` killed while its command PUTs through the run's own gateway: the accesses the
/// gateway answered are in the run's journal, and the recovered job has them as outputs.
#[test]
fn a_killed_roar_run_s3_keeps_the_puts_its_gateway_answered() {
    if !common::require_python_modules(&["boto3"]) {
        return;
    }
    let p = Project::new();
    p.write(
        "puts.py",
        br#"import boto3, sys
s3 = boto3.client("s3")
s3.create_bucket(Bucket="lineage-data")
log = open("puts.log", "a")
for k in range(100000):
    try:
        s3.put_object(Bucket="lineage-data", Key=f"o{k}", Body=b"x" * k)
    except Exception:
        break
    log.write(f"o{k}\n")
    log.flush()
"#,
    );
    let mut roar = p
        .cmd(["run", "--s3", "--tracer", "preload", "python3", "puts.py"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Until a few PUTs are answered.
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(p.path().join("puts.log")).map_or(0, |t| t.lines().count()) < 5 {
        assert!(Instant::now() < deadline, "no PUT was answered in 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    roar.kill().unwrap();
    roar.wait().unwrap();
    // The command notices its gateway is gone and ends.
    assert!(
        common::wait_until_gone("python3 puts.py", Duration::from_secs(60)),
        "the command never ended"
    );
    let answered: Vec<String> = std::fs::read_to_string(p.path().join("puts.log"))
        .unwrap()
        .lines()
        .map(obj)
        .collect();
    let job = p.last_job();
    assert_eq!(job["status"], "killed", "{job}");
    let outputs = p.files(&job, "output");
    let missing: Vec<&String> = answered.iter().filter(|k| !outputs.contains(k)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} answered PUTs not in the recovered job: {:?}",
        missing.len(),
        answered.len(),
        &missing[..missing.len().min(5)]
    );
}
