//! A [`JobRecord`] as bytes and back, losslessly: how `roar run` hands a job to the resident
//! recorder (crates/recorder), which writes it with its long-lived [`crate::Writer`].
//!
//! Both ends are the same build of roar (the recorder's address names the binary), so the format
//! has no versions: fields in declaration order, integers little-endian, strings and paths as
//! length-prefixed bytes (paths and argv are not always UTF-8), `Option` and enums as a tag byte.
//! The serde derives of the model are for JSON output and are lossy on purpose (`to_string_lossy`);
//! this is not. Every struct is destructured whole, so a field added to the model and not here is
//! a compile error, not a field silently dropped on the way to the store.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use crate::environment::{Environment, Gpu, Package, Runtime};
use crate::model::{
    CacheEntry, ContentHash, Distributed, FileRecord, FileStat, GitState, JobRecord, Ops, Outcome,
    ProcessRecord, Redirect, Role, S3Object, StepContent, StepFile, StepRecord,
};

/// Bytes that are not a job of this build's format.
#[derive(Debug, thiserror::Error)]
#[error("malformed job record: {0}")]
pub struct Malformed(pub &'static str);

type Got<T> = Result<T, Malformed>;

/// `job` as bytes ([`decode`] gives it back).
pub fn encode(job: &JobRecord) -> Vec<u8> {
    encode_with_cache(job, &[])
}

/// `job` and the hash-cache entries its hashing made, as bytes ([`decode_with_cache`]).
pub fn encode_with_cache(job: &JobRecord, cache: &[CacheEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + job.files.len() * 128 + cache.len() * 120);
    job.put(&mut out);
    put_len(cache.len(), &mut out);
    for e in cache {
        e.put(&mut out);
    }
    out
}

/// The job [`encode`] made these bytes of; every byte must belong to it.
pub fn decode(bytes: &[u8]) -> Got<JobRecord> {
    decode_with_cache(bytes).map(|(job, _)| job)
}

/// The job and cache entries [`encode_with_cache`] made these bytes of.
pub fn decode_with_cache(mut bytes: &[u8]) -> Got<(JobRecord, Vec<CacheEntry>)> {
    let job = JobRecord::get(&mut bytes)?;
    let cache = Vec::<CacheEntry>::get(&mut bytes)?;
    if !bytes.is_empty() {
        return Err(Malformed("trailing bytes"));
    }
    Ok((job, cache))
}

/// A value that can be written to and read back from the byte format.
pub trait Bytes: Sized {
    fn put(&self, out: &mut Vec<u8>);
    fn get(input: &mut &[u8]) -> Got<Self>;
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Got<&'a [u8]> {
    if input.len() < n {
        return Err(Malformed("truncated"));
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

macro_rules! int {
    ($($t:ty),*) => {$(
        impl Bytes for $t {
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(input: &mut &[u8]) -> Got<Self> {
                let raw = take(input, std::mem::size_of::<$t>())?;
                Ok(<$t>::from_le_bytes(raw.try_into().expect("sized")))
            }
        }
    )*};
}
int!(u32, i32, u64, i64);

/// A tag or a small set: one byte. (`u8` is not `Bytes`, so that `Vec<u8>` can be raw bytes.)
pub fn byte(input: &mut &[u8]) -> Got<u8> {
    Ok(take(input, 1)?[0])
}

impl Bytes for bool {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        match byte(input)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Malformed("bool")),
        }
    }
}

/// A length as the format writes it; reading one checks it against what is left, so a corrupt
/// length fails instead of allocating.
fn put_len(n: usize, out: &mut Vec<u8>) {
    (n as u64).put(out);
}

fn get_len(input: &mut &[u8]) -> Got<usize> {
    let n = u64::get(input)?;
    if n > input.len() as u64 {
        return Err(Malformed("length past the end"));
    }
    Ok(n as usize)
}

impl Bytes for Vec<u8> {
    fn put(&self, out: &mut Vec<u8>) {
        put_len(self.len(), out);
        out.extend_from_slice(self);
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        let n = get_len(input)?;
        Ok(take(input, n)?.to_vec())
    }
}

impl Bytes for String {
    fn put(&self, out: &mut Vec<u8>) {
        put_len(self.len(), out);
        out.extend_from_slice(self.as_bytes());
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        String::from_utf8(Vec::<u8>::get(input)?).map_err(|_| Malformed("string"))
    }
}

impl Bytes for OsString {
    fn put(&self, out: &mut Vec<u8>) {
        put_len(self.len(), out);
        out.extend_from_slice(self.as_bytes());
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        Ok(OsString::from_vec(Vec::<u8>::get(input)?))
    }
}

impl Bytes for PathBuf {
    fn put(&self, out: &mut Vec<u8>) {
        self.as_os_str().to_owned().put(out);
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        Ok(PathBuf::from(OsString::get(input)?))
    }
}

impl<T: Bytes> Bytes for Option<T> {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.put(out);
            }
        }
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        match byte(input)? {
            0 => Ok(None),
            1 => Ok(Some(T::get(input)?)),
            _ => Err(Malformed("option")),
        }
    }
}

impl<T: Bytes> Bytes for Vec<T> {
    fn put(&self, out: &mut Vec<u8>) {
        put_len(self.len(), out);
        for v in self {
            v.put(out);
        }
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        // Every element takes at least a byte: a count past what is left is corrupt.
        let n = get_len(input)?;
        (0..n).map(|_| T::get(input)).collect()
    }
}

impl Bytes for BTreeMap<String, String> {
    fn put(&self, out: &mut Vec<u8>) {
        put_len(self.len(), out);
        for (k, v) in self {
            k.put(out);
            v.put(out);
        }
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        let n = get_len(input)?;
        (0..n)
            .map(|_| Ok((String::get(input)?, String::get(input)?)))
            .collect()
    }
}

impl Bytes for [Option<Redirect>; 3] {
    fn put(&self, out: &mut Vec<u8>) {
        for r in self {
            r.put(out);
        }
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        Ok([
            Option::get(input)?,
            Option::get(input)?,
            Option::get(input)?,
        ])
    }
}

/// `Bytes` for a struct: each field in turn. The `let` destructures the whole struct, so the
/// list must name every field.
macro_rules! record {
    ($t:ident { $($f:ident),* $(,)? }) => {
        impl Bytes for $t {
            fn put(&self, out: &mut Vec<u8>) {
                let $t { $($f),* } = self;
                $( $f.put(out); )*
            }
            fn get(input: &mut &[u8]) -> Got<Self> {
                Ok($t { $($f: Bytes::get(input)?),* })
            }
        }
    };
}

record!(JobRecord {
    name,
    argv,
    cwd,
    started_ns,
    ended_ns,
    outcome,
    incomplete,
    backend,
    git,
    env,
    host,
    processes,
    steps,
    files,
    environment,
    uid,
    dist,
});
record!(GitState {
    commit,
    branch,
    dirty,
    remote,
    diff
});
record!(ProcessRecord {
    pid,
    parent_pid,
    exe,
    argv,
    started_ns,
    ended_ns
});
record!(StepRecord {
    seq,
    parent,
    pid,
    exe,
    argv,
    cwd,
    started_ns,
    ended_ns,
    streams,
    files
});
record!(Redirect { path, append });
record!(StepFile {
    path,
    role,
    ops,
    from_step,
    content,
    first_ns,
    last_ns
});
record!(FileRecord {
    role,
    path,
    hash,
    before,
    ops,
    first_ns,
    last_ns,
    s3
});
record!(ContentHash {
    blake3,
    sha256,
    size
});
record!(S3Object {
    bucket,
    key,
    version_id,
    etag,
    size,
    range
});
record!(CacheEntry {
    stat,
    hash,
    hashed_ns
});
record!(FileStat {
    dev,
    ino,
    size,
    mtime_ns,
    ctime_ns
});
record!(Environment {
    packages,
    runtime,
    diff
});
record!(Package {
    kind,
    name,
    version,
    installer,
    location,
    commit
});
record!(Runtime {
    hostname,
    cpu_model,
    cpus,
    memory_bytes,
    kernel,
    os,
    arch,
    container,
    virtualization,
    gpus
});
record!(Gpu {
    model,
    driver,
    cuda,
    bus
});
record!(Distributed {
    group,
    rank,
    world_size,
    local_rank,
    node_rank
});

impl Bytes for Ops {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(self.bits());
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        Ok(Ops::from_bits(byte(input)?))
    }
}

impl Bytes for Role {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(match self {
            Role::Input => 0,
            Role::Output => 1,
            Role::Temp => 2,
        });
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        match byte(input)? {
            0 => Ok(Role::Input),
            1 => Ok(Role::Output),
            2 => Ok(Role::Temp),
            _ => Err(Malformed("role")),
        }
    }
}

impl Bytes for StepContent {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(match self {
            StepContent::Prior => 0,
            StepContent::Final => 1,
            StepContent::Unknown => 2,
        });
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        match byte(input)? {
            0 => Ok(StepContent::Prior),
            1 => Ok(StepContent::Final),
            2 => Ok(StepContent::Unknown),
            _ => Err(Malformed("step content")),
        }
    }
}

impl Bytes for Outcome {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Outcome::Running => out.push(0),
            Outcome::Exited(c) => {
                out.push(1);
                c.put(out);
            }
            Outcome::Signaled(s) => {
                out.push(2);
                s.put(out);
            }
            Outcome::FailedToStart(why) => {
                out.push(3);
                why.put(out);
            }
            Outcome::Ended => out.push(4),
            Outcome::Killed => out.push(5),
        }
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        Ok(match byte(input)? {
            0 => Outcome::Running,
            1 => Outcome::Exited(i32::get(input)?),
            2 => Outcome::Signaled(i32::get(input)?),
            3 => Outcome::FailedToStart(String::get(input)?),
            4 => Outcome::Ended,
            5 => Outcome::Killed,
            _ => return Err(Malformed("outcome")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job with every field set, and every enum variant somewhere, in awkward values: bytes
    /// that are not UTF-8, empty strings, extremes.
    fn full_job() -> JobRecord {
        let odd = || OsString::from_vec(vec![b'a', 0xff, b'\n', 0xc3]);
        let hash = |b: &str| ContentHash {
            blake3: b.repeat(64),
            sha256: Some("e".repeat(64)),
            size: u64::MAX,
        };
        let redirect = |p: &str, append| {
            Some(Redirect {
                path: PathBuf::from(p),
                append,
            })
        };
        JobRecord {
            name: Some("train".into()),
            argv: vec!["python".into(), odd(), OsString::new()],
            cwd: PathBuf::from(odd()),
            started_ns: i64::MIN,
            ended_ns: Some(i64::MAX),
            outcome: Outcome::FailedToStart("exit 127: ü".into()),
            incomplete: true,
            backend: "ptrace".into(),
            git: Some(GitState {
                commit: Some("abc".into()),
                branch: None,
                dirty: true,
                remote: Some("https://x/y.git".into()),
                diff: Some("d".into()),
            }),
            env: [
                ("A".to_owned(), "1".to_owned()),
                ("B".into(), String::new()),
            ]
            .into(),
            host: Some("h".into()),
            processes: vec![ProcessRecord {
                pid: 7,
                parent_pid: Some(-1),
                exe: Some(PathBuf::from(odd())),
                argv: vec![odd()],
                started_ns: Some(1),
                ended_ns: None,
            }],
            steps: vec![StepRecord {
                seq: 2,
                parent: Some(1),
                pid: 9,
                exe: None,
                argv: vec!["sort".into()],
                cwd: "/w".into(),
                started_ns: None,
                ended_ns: Some(3),
                streams: [redirect("in", false), None, redirect("log", true)],
                files: vec![
                    StepFile {
                        path: "a".into(),
                        role: Role::Temp,
                        ops: Ops::READ | Ops::UNLINK,
                        from_step: Some(1),
                        content: StepContent::Final,
                        first_ns: Some(4),
                        last_ns: Some(5),
                    },
                    StepFile {
                        path: "b".into(),
                        role: Role::Input,
                        ops: Ops::default(),
                        from_step: None,
                        content: StepContent::Unknown,
                        first_ns: None,
                        last_ns: None,
                    },
                ],
            }],
            files: vec![
                FileRecord {
                    role: Role::Output,
                    path: PathBuf::from(odd()),
                    hash: Some(hash("a")),
                    before: Some(hash("b")),
                    ops: Ops::WRITE | Ops::CREATE | Ops::TRUNCATE | Ops::RENAME,
                    first_ns: Some(0),
                    last_ns: Some(-5),
                    s3: Some(S3Object {
                        bucket: "bk".into(),
                        key: "k/ü".into(),
                        version_id: None,
                        etag: Some("\"e\"".into()),
                        size: Some(0),
                        range: Some("bytes 0-1/2".into()),
                    }),
                },
                FileRecord {
                    role: Role::Input,
                    path: "in".into(),
                    hash: None,
                    before: None,
                    ops: Ops::READ,
                    first_ns: None,
                    last_ns: None,
                    s3: None,
                },
            ],
            environment: Some(Environment {
                packages: vec![Package {
                    kind: "python".into(),
                    name: "numpy".into(),
                    version: "2.1".into(),
                    installer: Some("pip".into()),
                    location: None,
                    commit: Some("c".into()),
                }],
                runtime: Some(Runtime {
                    hostname: Some("h".into()),
                    cpu_model: None,
                    cpus: 2,
                    memory_bytes: Some(1 << 40),
                    kernel: Some("6.18".into()),
                    os: None,
                    arch: Some("x86_64".into()),
                    container: None,
                    virtualization: Some("kvm".into()),
                    gpus: vec![Gpu {
                        model: "A100".into(),
                        driver: None,
                        cuda: Some("12".into()),
                        bus: Some("0000:01".into()),
                    }],
                }),
                diff: Some(vec![0, 1, 255]),
            }),
            uid: Some("f".repeat(32)),
            dist: Some(Distributed {
                group: "torchelastic:1".into(),
                rank: Some(0),
                world_size: Some(u32::MAX),
                local_rank: None,
                node_rank: Some(3),
            }),
        }
    }

    #[test]
    fn a_job_comes_back_as_it_went() {
        let mut job = full_job();
        // Debug prints every field of every record: equal output, equal jobs.
        assert_eq!(
            format!("{:?}", decode(&encode(&job)).unwrap()),
            format!("{job:?}")
        );
        for outcome in [
            Outcome::Running,
            Outcome::Exited(-3),
            Outcome::Signaled(9),
            Outcome::Ended,
        ] {
            job.outcome = outcome;
            job.environment = None;
            assert_eq!(
                format!("{:?}", decode(&encode(&job)).unwrap()),
                format!("{job:?}")
            );
        }
    }

    #[test]
    fn cache_entries_come_back_with_their_job() {
        let job = full_job();
        let entry = CacheEntry {
            stat: FileStat {
                dev: u64::MAX,
                ino: 1,
                size: 2,
                mtime_ns: -3,
                ctime_ns: i64::MAX,
            },
            hash: ContentHash {
                blake3: "0".repeat(64),
                sha256: None,
                size: 2,
            },
            hashed_ns: 5,
        };
        let bytes = encode_with_cache(&job, &[entry.clone(), entry.clone()]);
        let (back, cache) = decode_with_cache(&bytes).unwrap();
        assert_eq!(format!("{back:?}"), format!("{job:?}"));
        assert_eq!(
            format!("{cache:?}"),
            format!("{:?}", [entry.clone(), entry])
        );
    }

    #[test]
    fn cut_or_padded_bytes_are_refused_not_misread() {
        let bytes = encode(&full_job());
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "cut at {n}");
        }
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(decode(&padded).is_err());
        // A length blown up past the end (the name's, after its Some tag) fails without
        // allocating it.
        let mut huge = bytes;
        huge[1..9].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge).is_err());
    }
}
