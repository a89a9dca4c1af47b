//! `roar_store::job_bytes` (the hand-written format a run hands its job to the recorder in)
//! against postcard, a maintained serde format with a written specification, on what a job's
//! bytes are mostly made of: its file records (issue 64 asks to use such a format or say why not).
//!
//! The model's serde derives are for JSON output and lossy on purpose (paths as UTF-8 text), so
//! postcard goes through mirror types here, written as a switch would need them: borrowed to
//! encode (no copy), owned to decode, moved into the model (no copy). Paths as serde's `OsStr`
//! (raw bytes on unix, lossless). Both sides are checked to give the records back as they went.
//!
//! `cargo run --release -p roar-store --example job_codec [FILES] [ROUNDS]`: per file record,
//! bytes and the median ns to encode and to decode, for jobs of FILES (default 2000) records.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::time::Instant;

use roar_store::job_bytes::Bytes;
use roar_store::{ContentHash, FileRecord, Ops, Role, S3Object};
use serde::{Deserialize, Serialize};

#[derive(Serialize)]
struct HashRef<'a> {
    blake3: &'a str,
    sha256: Option<&'a str>,
    size: u64,
}

#[derive(Serialize)]
struct S3Ref<'a> {
    bucket: &'a str,
    key: &'a str,
    version_id: Option<&'a str>,
    etag: Option<&'a str>,
    size: Option<u64>,
    range: Option<&'a str>,
}

#[derive(Serialize)]
struct FileRef<'a> {
    role: u8,
    path: &'a OsStr,
    hash: Option<HashRef<'a>>,
    before: Option<HashRef<'a>>,
    ops: u8,
    first_ns: Option<i64>,
    last_ns: Option<i64>,
    s3: Option<S3Ref<'a>>,
}

#[derive(Deserialize)]
struct HashOwned {
    blake3: String,
    sha256: Option<String>,
    size: u64,
}

#[derive(Deserialize)]
struct S3Owned {
    bucket: String,
    key: String,
    version_id: Option<String>,
    etag: Option<String>,
    size: Option<u64>,
    range: Option<String>,
}

#[derive(Deserialize)]
struct FileOwned {
    role: u8,
    path: OsString,
    hash: Option<HashOwned>,
    before: Option<HashOwned>,
    ops: u8,
    first_ns: Option<i64>,
    last_ns: Option<i64>,
    s3: Option<S3Owned>,
}

fn hash_ref(h: &ContentHash) -> HashRef<'_> {
    HashRef {
        blake3: &h.blake3,
        sha256: h.sha256.as_deref(),
        size: h.size,
    }
}

fn hash_owned(h: HashOwned) -> ContentHash {
    ContentHash {
        blake3: h.blake3,
        sha256: h.sha256,
        size: h.size,
    }
}

fn file_ref(f: &FileRecord) -> FileRef<'_> {
    FileRef {
        role: match f.role {
            Role::Input => 0,
            Role::Output => 1,
            Role::Temp => 2,
        },
        path: f.path.as_os_str(),
        hash: f.hash.as_ref().map(hash_ref),
        before: f.before.as_ref().map(hash_ref),
        ops: f.ops.bits(),
        first_ns: f.first_ns,
        last_ns: f.last_ns,
        s3: f.s3.as_ref().map(|s| S3Ref {
            bucket: &s.bucket,
            key: &s.key,
            version_id: s.version_id.as_deref(),
            etag: s.etag.as_deref(),
            size: s.size,
            range: s.range.as_deref(),
        }),
    }
}

fn file_owned(f: FileOwned) -> FileRecord {
    FileRecord {
        role: match f.role {
            0 => Role::Input,
            1 => Role::Output,
            _ => Role::Temp,
        },
        path: PathBuf::from(f.path),
        hash: f.hash.map(hash_owned),
        before: f.before.map(hash_owned),
        ops: Ops::from_bits(f.ops),
        first_ns: f.first_ns,
        last_ns: f.last_ns,
        s3: f.s3.map(|s| S3Object {
            bucket: s.bucket,
            key: s.key,
            version_id: s.version_id,
            etag: s.etag,
            size: s.size,
            range: s.range,
        }),
    }
}

/// `n` records as a training job makes them: shards read, checkpoints written, one name that is
/// not UTF-8, an S3 object every 50th.
fn files(n: usize) -> Vec<FileRecord> {
    let hash = |i: usize| ContentHash {
        blake3: format!(
            "{:064x}",
            (i as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c)
        ),
        sha256: None,
        size: 4096 + i as u64 * 17,
    };
    (0..n)
        .map(|i| {
            let output = i % 4 == 0;
            let path = if i == 7 {
                PathBuf::from(OsString::from_vec(
                    b"/work/proj/raw/\xff\xfename.bin".to_vec(),
                ))
            } else if output {
                PathBuf::from(format!("/work/proj/runs/run-0042/ckpt/step-{i:06}.pt"))
            } else {
                PathBuf::from(format!(
                    "/mnt/shared/datasets/corpus-v3/train/shard-{i:06}.parquet"
                ))
            };
            FileRecord {
                role: if output { Role::Output } else { Role::Input },
                path,
                hash: Some(hash(i)),
                before: (output && i % 8 == 0).then(|| hash(i + 1)),
                ops: if output {
                    Ops::WRITE | Ops::CREATE | Ops::TRUNCATE
                } else {
                    Ops::READ
                },
                first_ns: Some(1_764_000_000_000_000_000 + i as i64 * 1_000),
                last_ns: Some(1_764_000_000_000_000_000 + i as i64 * 1_000 + 500),
                s3: (i % 50 == 3).then(|| S3Object {
                    bucket: "team-data".into(),
                    key: format!("corpus/{i}.jsonl"),
                    version_id: None,
                    etag: Some(format!("\"{i:032x}\"")),
                    size: Some(123_456),
                    range: None,
                }),
            }
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median ns per record of `f` over `rounds` calls.
fn time<T>(rounds: usize, n: usize, mut f: impl FnMut() -> T) -> f64 {
    median(
        (0..rounds)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(f());
                t.elapsed().as_nanos() as f64 / n as f64
            })
            .collect(),
    )
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let records = files(n);

    let mut ours = Vec::new();
    records.put(&mut ours);
    let back = Vec::<FileRecord>::get(&mut ours.as_slice()).expect("job_bytes decodes");
    assert_eq!(
        format!("{back:?}"),
        format!("{records:?}"),
        "job_bytes round trip"
    );
    let refs: Vec<FileRef> = records.iter().map(file_ref).collect();
    let theirs = postcard::to_allocvec(&refs).expect("postcard encodes");
    let back: Vec<FileRecord> = postcard::from_bytes::<Vec<FileOwned>>(&theirs)
        .expect("postcard decodes")
        .into_iter()
        .map(file_owned)
        .collect();
    assert_eq!(
        format!("{back:?}"),
        format!("{records:?}"),
        "postcard round trip"
    );

    let encode_ours = time(rounds, n, || {
        let mut out = Vec::with_capacity(n * 128);
        records.put(&mut out);
        out
    });
    let decode_ours = time(rounds, n, || {
        Vec::<FileRecord>::get(&mut ours.as_slice()).expect("decodes")
    });
    let encode_theirs = time(rounds, n, || {
        let refs: Vec<FileRef> = records.iter().map(file_ref).collect();
        postcard::to_allocvec(&refs).expect("encodes")
    });
    let decode_theirs = time(rounds, n, || {
        postcard::from_bytes::<Vec<FileOwned>>(&theirs)
            .expect("decodes")
            .into_iter()
            .map(file_owned)
            .collect::<Vec<_>>()
    });
    println!("{n} file records, {rounds} rounds, median per record:");
    println!("  format      bytes   encode ns   decode ns");
    for (name, bytes, e, d) in [
        ("job_bytes", ours.len(), encode_ours, decode_ours),
        ("postcard", theirs.len(), encode_theirs, decode_theirs),
    ] {
        println!(
            "  {name:<10} {:>6.1} {e:>11.1} {d:>11.1}",
            bytes as f64 / n as f64
        );
    }
    println!(
        "  postcard/job_bytes: bytes {:.2}x, encode {:.2}x, decode {:.2}x",
        theirs.len() as f64 / ours.len() as f64,
        encode_theirs / encode_ours,
        decode_theirs / decode_ours
    );
}
