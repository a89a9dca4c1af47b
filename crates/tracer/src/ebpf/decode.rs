//! Records from the ring buffer back to [`Event`]s: the layout is `src/bpf/roar.h`.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use roar_store::{now_ns, FileStat};

use super::skel::types::roar_event;
use crate::event::{join_normalize, Event};

const KIND_EXEC: u32 = 1;
const KIND_FORK: u32 = 2;
const KIND_EXIT: u32 = 3;
const KIND_OPEN: u32 = 4;
const KIND_RENAME: u32 = 5;
const KIND_LINK: u32 = 6;
const KIND_UNLINK: u32 = 7;
const KIND_TRUNCATE: u32 = 8;
const KIND_SYMLINK: u32 = 9;
const KIND_EXCHANGE: u32 = 10;
const KIND_IO_URING: u32 = 11;
const KIND_MKDIR: u32 = 12;
const KIND_RMDIR: u32 = 13;
const HAS_STAT: u32 = 1;
const TRUNCATED: u32 = 2;
pub(super) const HEADER: usize = std::mem::size_of::<roar_event>();

/// The difference between the wall clock and CLOCK_MONOTONIC (what bpf_ktime_get_ns reads).
pub(super) fn clock_offset() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime with a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    now_ns() - (ts.tv_sec * 1_000_000_000 + ts.tv_nsec)
}

/// A directory sent as NUL-terminated components from the leaf up, as an absolute path.
fn dir_path(components: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(components.len() + 1);
    for name in components
        .split(|b| *b == 0)
        .rev()
        .filter(|n| !n.is_empty())
    {
        out.push(b'/');
        out.extend_from_slice(name);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    out
}

fn cstr(s: &[u8]) -> &[u8] {
    s.split(|b| *b == 0).next().unwrap_or(s)
}

/// The kernel's dev_t (major << 20 | minor) as stat(2) reports it.
fn user_dev(kdev: u64) -> u64 {
    let (major, minor) = ((kdev >> 20) as u32, (kdev & 0xf_ffff) as u32);
    libc::makedev(major, minor)
}

/// Decodes one ring-buffer record of the run with generation `gen`: `Ok(None)` for a record of
/// an earlier run of the same slot, `Err(())` for one whose paths are unknown.
pub(super) fn decode(rec: &[u8], offset: i64, gen: u32) -> Result<Option<Event>, ()> {
    if rec.len() < HEADER {
        return Err(());
    }
    // SAFETY: the record starts with a roar_event (plain integers); read unaligned.
    let h: roar_event = unsafe { std::ptr::read_unaligned(rec.as_ptr().cast()) };
    if h.run_gen != gen {
        return Ok(None);
    }
    if h.flags & TRUNCATED != 0 {
        tracing::debug!(
            "record of kind {} from pid {} has a path the kernel could not walk",
            h.kind,
            h.pid
        );
        return Err(());
    }
    let mut strs: [&[u8]; 4] = [&[]; 4];
    let mut at = HEADER;
    for (i, len) in h.len.iter().enumerate() {
        let end = at
            .checked_add(*len as usize)
            .filter(|e| *e <= rec.len())
            .ok_or(())?;
        strs[i] = &rec[at..end];
        at = end;
    }
    event_of(&h, &strs, h.ts_ns as i64 + offset).map(Some)
}

/// The event a record of kind `h.kind` reports, from its header and its four strings (paths
/// and the directories they are relative to, or an exec's cwd, exe, argv and stdio).
fn event_of(h: &roar_event, strs: &[&[u8]; 4], ts_ns: i64) -> Result<Event, ()> {
    let pid = h.pid as i32;
    let path = |p: &[u8], base: &[u8]| join_normalize(&dir_path(base), cstr(p));
    Ok(match h.kind {
        KIND_EXEC => {
            let argv = strs[2].strip_suffix(b"\0").unwrap_or(strs[2]);
            let (stdio, pipes) = crate::event::split_stdio(
                roar_wire::decode_stdio(strs[3]).map(|(k, dev, ino)| (k, user_dev(dev), ino)),
            );
            Event::Exec {
                pid,
                ppid: h.ppid as i32,
                cwd: PathBuf::from(OsString::from_vec(dir_path(strs[0]))),
                exe: PathBuf::from(OsString::from_vec(dir_path(strs[1]))),
                argv: roar_store::argv_from_blob(argv),
                stdio,
                pipes,
                ts_ns,
            }
        }
        KIND_FORK => Event::Fork {
            pid,
            ppid: h.ppid as i32,
            ts_ns,
        },
        KIND_EXIT => Event::Exit { pid, ts_ns },
        KIND_OPEN => Event::Open {
            pid,
            path: path(strs[0], strs[1]),
            flags: h.open_flags,
            stat: (h.flags & HAS_STAT != 0).then(|| FileStat {
                dev: user_dev(h.dev),
                ino: h.ino,
                size: h.size,
                mtime_ns: h.mtime_ns,
                ctime_ns: h.ctime_ns,
            }),
            ts_ns,
        },
        KIND_RENAME => Event::Rename {
            pid,
            from: path(strs[0], strs[1]),
            to: path(strs[2], strs[3]),
            ts_ns,
        },
        KIND_LINK => Event::Link {
            pid,
            from: path(strs[0], strs[1]),
            to: path(strs[2], strs[3]),
            ts_ns,
        },
        KIND_UNLINK => Event::Unlink {
            pid,
            path: path(strs[0], strs[1]),
            ts_ns,
        },
        KIND_TRUNCATE => Event::Truncate {
            pid,
            path: path(strs[0], strs[1]),
            ts_ns,
        },
        KIND_EXCHANGE => Event::Exchange {
            pid,
            a: path(strs[0], strs[1]),
            b: path(strs[2], strs[3]),
            ts_ns,
        },
        KIND_SYMLINK => Event::Symlink {
            pid,
            path: path(strs[0], strs[1]),
            ts_ns,
        },
        KIND_MKDIR => Event::Mkdir {
            pid,
            path: path(strs[0], strs[1]),
            ts_ns,
        },
        KIND_RMDIR => Event::Rmdir {
            pid,
            path: path(strs[0], strs[1]),
            ts_ns,
        },
        KIND_IO_URING => Event::Untraced {
            pid,
            path: PathBuf::from(OsString::from_vec(dir_path(strs[0]))),
            why: crate::IO_URING,
            ts_ns,
        },
        _ => return Err(()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32, strs: &[&[u8]]) -> Vec<u8> {
        // SAFETY: roar_event is plain integers; all-zero is valid.
        let mut h: roar_event = unsafe { std::mem::zeroed() };
        h.kind = kind;
        h.pid = 7;
        h.run_gen = 1;
        for (i, s) in strs.iter().enumerate() {
            h.len[i] = s.len() as u32;
        }
        // SAFETY: viewing a plain struct as bytes.
        let mut out = unsafe {
            std::slice::from_raw_parts(std::ptr::addr_of!(h).cast::<u8>(), HEADER).to_vec()
        };
        for s in strs {
            out.extend_from_slice(s);
        }
        out
    }

    #[test]
    fn the_header_matches_the_c_layout() {
        assert_eq!(HEADER, 88);
    }

    #[test]
    fn relative_paths_join_their_directory_walked_leaf_first() {
        let rec = record(KIND_RENAME, &[b"tmp\0", b"w\0home\0", b"/abs/out\0", b""]);
        assert_eq!(
            decode(&rec, 0, 1).unwrap(),
            Some(Event::Rename {
                pid: 7,
                from: PathBuf::from("/home/w/tmp"),
                to: PathBuf::from("/abs/out"),
                ts_ns: 0
            })
        );
        let root = record(KIND_UNLINK, &[b"../x\0", b""]);
        assert_eq!(
            decode(&root, 0, 1).unwrap(),
            Some(Event::Unlink {
                pid: 7,
                path: PathBuf::from("/x"),
                ts_ns: 0
            })
        );
    }

    #[test]
    fn short_or_truncated_records_are_malformed() {
        let mut rec = record(KIND_UNLINK, &[b"a\0", b""]);
        rec.truncate(HEADER + 1);
        assert_eq!(decode(&rec, 0, 1), Err(()));
        assert_eq!(decode(&rec[..10], 0, 1), Err(()));
    }

    #[test]
    fn records_of_an_earlier_run_of_the_slot_are_skipped() {
        let rec = record(KIND_UNLINK, &[b"/a\0", b""]);
        assert_eq!(decode(&rec, 0, 2), Ok(None));
        assert!(decode(&rec, 0, 1).unwrap().is_some());
    }

    #[test]
    fn kernel_device_numbers_are_converted_to_stat_numbers() {
        assert_eq!(user_dev((8 << 20) | 1), libc::makedev(8, 1));
        assert_eq!(user_dev((259 << 20) | 300), libc::makedev(259, 300));
    }
}
