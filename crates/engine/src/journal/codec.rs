//! The journal's records as bytes ([`Bytes`] for [`Record`], [`Fact`] and [`Event`]): one tag
//! byte per kind, then its fields in order, read back exactly (a record that does not read back
//! whole is malformed, never another record).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use roar_store::job_bytes::{byte, Bytes, Malformed};
use roar_store::{ContentHash, FileStat};

use roar_store::redact::Policy;

use super::{Record, FRAME};
use crate::event::{Event, Stdio};
use crate::Fact;

/// `record` framed into `out` as it is: only through [`frame_redacted_record`] (and the tests),
/// so that nothing reaches a journal unredacted.
pub(super) fn frame(record: &Record, out: &mut Vec<u8>) {
    frame_with(out, |out| record.put(out));
}

pub(super) const EVENT_TAG: u8 = 4;

pub(super) const STEP_TAG: u8 = 11;

/// `ev` framed into `out` as a [`Record::Event`] (or, `step`, a [`Record::Step`]), the argv of an
/// exec redacted by `policy` first: a journal is on disk, and keeps of a command line only what
/// the store would.
pub fn frame_redacted(policy: &Policy, ev: &Event, step: bool, out: &mut Vec<u8>) {
    let redacted = match ev {
        Event::Exec { argv, .. } => {
            let mut argv = argv.clone();
            (policy.argv(&mut argv) > 0).then(|| {
                let mut ev = ev.clone();
                if let Event::Exec { argv: a, .. } = &mut ev {
                    *a = argv;
                }
                ev
            })
        }
        _ => None,
    };
    let ev = redacted.as_ref().unwrap_or(ev);
    frame_with(out, |out| {
        out.push(if step { STEP_TAG } else { EVENT_TAG });
        ev.put(out);
    });
}

/// A record framed into `out`, redacted by `policy` as the store would redact it (a job's
/// header, an exec's argv).
pub fn frame_redacted_record(policy: &Policy, record: &Record, out: &mut Vec<u8>) {
    match record {
        Record::Job(job) => {
            let mut job = job.clone();
            policy.job(&mut job);
            frame(&Record::Job(job), out);
        }
        Record::Event(ev) => frame_redacted(policy, ev, false, out),
        Record::Step(ev) => frame_redacted(policy, ev, true, out),
        other => frame(other, out),
    }
}

pub(super) fn frame_with(out: &mut Vec<u8>, put: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME]);
    put(out);
    let body = &out[start + FRAME..];
    let len = body.len() as u32;
    let sum = checksum(body);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&sum.to_le_bytes());
}

/// A record's checksum, which catches a record torn by a crash or zeroed by a power loss (not
/// an attacker: a journal is the job's own user's, `0600`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sum {
    /// CRC-32 (`crc32fast`): what this roar writes. blake3 cost every `roar run` its CPU-feature
    /// probe (~18 us of `cpuid`s on this VM) for a checksum of a few bytes.
    Crc32,
    /// The first four bytes of the record's blake3 (format 1).
    Blake3,
}

pub(super) fn checksum(body: &[u8]) -> u32 {
    checksum_as(Sum::Crc32, body)
}

pub(super) fn checksum_as(sum: Sum, body: &[u8]) -> u32 {
    match sum {
        Sum::Crc32 => crc32fast::hash(body),
        Sum::Blake3 => {
            let h = blake3::hash(body);
            u32::from_le_bytes(h.as_bytes()[..4].try_into().expect("4 bytes"))
        }
    }
}

type Got<T> = Result<T, Malformed>;

impl Bytes for Record {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Record::Job(job) => {
                out.push(0);
                out.extend_from_slice(&roar_store::job_bytes::encode(job));
            }
            Record::Ring { ring, late } => {
                out.push(1);
                ring.put(out);
                late.put(out);
            }
            Record::RingPos(p) => {
                out.push(2);
                p.put(out);
            }
            Record::CtimeFloor(t) => {
                out.push(3);
                t.put(out);
            }
            Record::Event(e) => {
                out.push(EVENT_TAG);
                e.put(out);
            }
            Record::Found { path, fact, ts } => {
                out.push(5);
                path.put(out);
                fact.put(out);
                ts.put(out);
            }
            Record::FoundIn(fact) => {
                out.push(6);
                fact.put(out);
            }
            Record::FoundNamed {
                path,
                content,
                mark,
                ts,
            } => {
                out.push(7);
                path.put(out);
                content.put(out);
                mark.put(out);
                ts.put(out);
            }
            Record::MovedDir { from, to } => {
                out.push(8);
                from.put(out);
                to.put(out);
            }
            Record::Extra(bytes) => {
                out.push(9);
                bytes.put(out);
            }
            Record::RootGone => out.push(10),
            Record::Step(e) => {
                out.push(STEP_TAG);
                e.put(out);
            }
            Record::Mounted(dir) => {
                out.push(12);
                dir.put(out);
            }
            Record::Holds { path, holds } => {
                out.push(13);
                path.put(out);
                out.push(u8::from(*holds));
            }
        }
    }

    fn get(input: &mut &[u8]) -> Got<Self> {
        Ok(match byte(input)? {
            0 => {
                let job = roar_store::job_bytes::decode(input)?;
                *input = &[];
                Record::Job(Box::new(job))
            }
            1 => Record::Ring {
                ring: PathBuf::get(input)?,
                late: PathBuf::get(input)?,
            },
            2 => Record::RingPos(u64::get(input)?),
            3 => Record::CtimeFloor(i64::get(input)?),
            EVENT_TAG => Record::Event(Event::get(input)?),
            5 => Record::Found {
                path: PathBuf::get(input)?,
                fact: Fact::get(input)?,
                ts: i64::get(input)?,
            },
            6 => Record::FoundIn(Fact::get(input)?),
            7 => Record::FoundNamed {
                path: PathBuf::get(input)?,
                content: ContentHash::get(input)?,
                mark: u64::get(input)?,
                ts: i64::get(input)?,
            },
            8 => Record::MovedDir {
                from: PathBuf::get(input)?,
                to: PathBuf::get(input)?,
            },
            9 => Record::Extra(Vec::<u8>::get(input)?),
            10 => Record::RootGone,
            STEP_TAG => Record::Step(Event::get(input)?),
            12 => Record::Mounted(PathBuf::get(input)?),
            13 => Record::Holds {
                path: PathBuf::get(input)?,
                holds: byte(input)? != 0,
            },
            _ => return Err(Malformed("journal record")),
        })
    }
}

impl Bytes for Fact {
    fn put(&self, out: &mut Vec<u8>) {
        self.file.0.put(out);
        self.file.1.put(out);
        self.content.put(out);
        self.mark.put(out);
    }
    fn get(input: &mut &[u8]) -> Got<Self> {
        Ok(Fact {
            file: (u64::get(input)?, u64::get(input)?),
            content: ContentHash::get(input)?,
            mark: u64::get(input)?,
        })
    }
}

fn put_stdio(s: &Stdio, out: &mut Vec<u8>) {
    for fd in s {
        fd.map(|(dev, ino)| vec![dev, ino]).put(out);
    }
}

fn get_stdio(input: &mut &[u8]) -> Got<Stdio> {
    let mut s: Stdio = [None; 3];
    for fd in &mut s {
        *fd = match Option::<Vec<u64>>::get(input)? {
            Some(v) if v.len() == 2 => Some((v[0], v[1])),
            None => None,
            Some(_) => return Err(Malformed("stdio")),
        };
    }
    Ok(s)
}

/// A reason an observer gave for not following a program, as the `&'static str` events carry:
/// the reasons this build knows are shared, any other is kept (recovery reads few).
fn static_why(why: String) -> &'static str {
    Box::leak(why.into_boxed_str())
}

impl Bytes for Event {
    fn put(&self, out: &mut Vec<u8>) {
        let pid_ts = |tag: u8, pid: i32, ts: i64, out: &mut Vec<u8>| {
            out.push(tag);
            pid.put(out);
            ts.put(out);
        };
        match self {
            Event::Exec {
                pid,
                ppid,
                exe,
                argv,
                cwd,
                stdio,
                pipes,
                ts_ns,
            } => {
                pid_ts(0, *pid, *ts_ns, out);
                ppid.put(out);
                exe.put(out);
                argv.put(out);
                cwd.put(out);
                put_stdio(stdio, out);
                put_stdio(pipes, out);
            }
            Event::Fork { pid, ppid, ts_ns } => {
                pid_ts(1, *pid, *ts_ns, out);
                ppid.put(out);
            }
            Event::Exit { pid, ts_ns } => pid_ts(2, *pid, *ts_ns, out),
            Event::Open {
                pid,
                path,
                flags,
                stat,
                ts_ns,
            } => {
                pid_ts(3, *pid, *ts_ns, out);
                path.put(out);
                flags.put(out);
                stat.put(out);
            }
            Event::Rename {
                pid,
                from,
                to,
                ts_ns,
            } => {
                pid_ts(4, *pid, *ts_ns, out);
                from.put(out);
                to.put(out);
            }
            Event::Link {
                pid,
                from,
                to,
                ts_ns,
            } => {
                pid_ts(5, *pid, *ts_ns, out);
                from.put(out);
                to.put(out);
            }
            Event::Exchange { pid, a, b, ts_ns } => {
                pid_ts(6, *pid, *ts_ns, out);
                a.put(out);
                b.put(out);
            }
            Event::Unlink { pid, path, ts_ns } => path_event(7, *pid, path, *ts_ns, out),
            Event::Truncate { pid, path, ts_ns } => path_event(8, *pid, path, *ts_ns, out),
            Event::Mkdir { pid, path, ts_ns } => path_event(9, *pid, path, *ts_ns, out),
            Event::Rmdir { pid, path, ts_ns } => path_event(10, *pid, path, *ts_ns, out),
            Event::Symlink { pid, path, ts_ns } => path_event(11, *pid, path, *ts_ns, out),
            Event::Untraced {
                pid,
                path,
                why,
                ts_ns,
            } => {
                path_event(12, *pid, path, *ts_ns, out);
                why.to_string().put(out);
            }
        }
    }

    fn get(input: &mut &[u8]) -> Got<Self> {
        let tag = byte(input)?;
        let pid = i32::get(input)?;
        let ts_ns = i64::get(input)?;
        let path = |input: &mut &[u8]| PathBuf::get(input);
        Ok(match tag {
            0 => Event::Exec {
                pid,
                ppid: i32::get(input)?,
                exe: path(input)?,
                argv: Vec::<OsString>::get(input)?,
                cwd: path(input)?,
                stdio: get_stdio(input)?,
                pipes: get_stdio(input)?,
                ts_ns,
            },
            1 => Event::Fork {
                pid,
                ppid: i32::get(input)?,
                ts_ns,
            },
            2 => Event::Exit { pid, ts_ns },
            3 => Event::Open {
                pid,
                path: path(input)?,
                flags: i32::get(input)?,
                stat: Option::<FileStat>::get(input)?,
                ts_ns,
            },
            4 => Event::Rename {
                pid,
                from: path(input)?,
                to: path(input)?,
                ts_ns,
            },
            5 => Event::Link {
                pid,
                from: path(input)?,
                to: path(input)?,
                ts_ns,
            },
            6 => Event::Exchange {
                pid,
                a: path(input)?,
                b: path(input)?,
                ts_ns,
            },
            7 => Event::Unlink {
                pid,
                path: path(input)?,
                ts_ns,
            },
            8 => Event::Truncate {
                pid,
                path: path(input)?,
                ts_ns,
            },
            9 => Event::Mkdir {
                pid,
                path: path(input)?,
                ts_ns,
            },
            10 => Event::Rmdir {
                pid,
                path: path(input)?,
                ts_ns,
            },
            11 => Event::Symlink {
                pid,
                path: path(input)?,
                ts_ns,
            },
            12 => Event::Untraced {
                pid,
                path: path(input)?,
                why: static_why(String::get(input)?),
                ts_ns,
            },
            _ => return Err(Malformed("event")),
        })
    }
}

fn path_event(tag: u8, pid: i32, path: &Path, ts: i64, out: &mut Vec<u8>) {
    out.push(tag);
    pid.put(out);
    ts.put(out);
    path.to_path_buf().put(out);
}
