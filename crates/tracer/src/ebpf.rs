//! The eBPF backend: `src/bpf/roar.bpf.c` loaded for the run, on BTF raw tracepoints (syscall
//! entry/exit, scheduler fork/exec/exit). Sees static and setuid programs, and costs the traced
//! program no context switch per file: records go to a ring buffer this process drains while the
//! command runs.
//!
//! The programs are loaded per run and unloaded when it ends (the kernel detaches them when this
//! process exits, even if it crashes), so no run can see another's processes. The command adds its
//! own pid to the `tracked` map between fork and exec; from then on fork/exit keep the map in-kernel.
//! Records that could not be written (ring buffer full) are counted, and a job with any is
//! incomplete.

use std::ffi::OsString;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::Instant;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::RingBufferBuilder;
use roar_store::{now_ns, FileStat};

use crate::event::{join_normalize, Event};
use crate::launch::{self, Status};
use crate::{Tap, TraceError, Traced};

#[allow(clippy::all, non_camel_case_types, dead_code, unsafe_op_in_unsafe_fn)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/roar.skel.rs"));
}

use skel::types::roar_event;

/// Ring buffer size in KiB, unless `ROAR_EBPF_RING_KB` says otherwise (a power of two, ≥ 4).
const RING_KB: u32 = 8 * 1024;
const RING_ENV: &str = "ROAR_EBPF_RING_KB";
/// The kernel wakes the reader only once an eighth of the ring is waiting; otherwise it reads on
/// this timer, so a slow trickle never waits long.
const READ_EVERY_MS: i32 = 20;

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
const HAS_STAT: u32 = 1;
const TRUNCATED: u32 = 2;
const HEADER: usize = std::mem::size_of::<roar_event>();

fn unavailable(reason: String) -> TraceError {
    TraceError::Unavailable {
        backend: "ebpf",
        reason,
    }
}

fn ring_kb() -> Result<u32, TraceError> {
    let Some(v) = std::env::var_os(RING_ENV) else {
        return Ok(RING_KB);
    };
    v.to_str()
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|kb| kb.is_power_of_two() && *kb >= 4 && *kb <= 1 << 20)
        .ok_or_else(|| {
            unavailable(format!(
                "{RING_ENV}={v:?} is not a power of two between 4 and 1048576"
            ))
        })
}

/// libbpf's own messages (verifier logs included) go to roar's debug log, not the terminal.
fn quiet_libbpf() {
    fn to_log(level: libbpf_rs::PrintLevel, msg: String) {
        match level {
            libbpf_rs::PrintLevel::Warn => tracing::debug!("libbpf: {}", msg.trim_end()),
            _ => tracing::trace!("libbpf: {}", msg.trim_end()),
        }
    }
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, to_log)));
}

/// Opens, sizes, loads and attaches the programs; they stay attached while the result lives.
fn load(
    obj: &mut MaybeUninit<libbpf_rs::OpenObject>,
    ring_kb: u32,
) -> Result<skel::RoarSkel<'_>, TraceError> {
    quiet_libbpf();
    let mut open = skel::RoarSkelBuilder::default()
        .open(obj)
        .map_err(|e| unavailable(format!("cannot open the BPF object: {e}")))?;
    open.maps
        .events
        .set_max_entries(ring_kb * 1024)
        .map_err(|e| unavailable(format!("cannot size the ring buffer: {e}")))?;
    if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
        ro.wake_bytes = u64::from(ring_kb) * 1024 / 8;
    }
    let mut loaded = open
        .load()
        .map_err(|e| unavailable(format!("the kernel refused the BPF programs: {e}")))?;
    loaded
        .attach()
        .map_err(|e| unavailable(format!("cannot attach to the tracepoints: {e}")))?;
    Ok(loaded)
}

/// Loads and attaches the programs, then detaches them: the real preflight of `roar tracer
/// check ebpf`. Returns how long the load took.
pub fn probe() -> Result<std::time::Duration, TraceError> {
    let t = Instant::now();
    let mut obj = MaybeUninit::uninit();
    load(&mut obj, ring_kb()?)?;
    Ok(t.elapsed())
}

/// Adds the calling process to the `tracked` map with a raw bpf(2) call: runs between fork and
/// exec, so nothing but syscalls.
fn track_self(map_fd: i32) -> io::Result<()> {
    #[repr(C)]
    struct ElemAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    // SAFETY: getpid has no preconditions.
    let key: u32 = unsafe { libc::getpid() } as u32;
    let value: u32 = 1;
    let attr = ElemAttr {
        map_fd: map_fd as u32,
        _pad: 0,
        key: std::ptr::addr_of!(key) as u64,
        value: std::ptr::addr_of!(value) as u64,
        flags: 0,
    };
    // SAFETY: attr points at live key and value for the duration of the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_ELEM,
            std::ptr::addr_of!(attr),
            std::mem::size_of::<ElemAttr>(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The difference between the wall clock and CLOCK_MONOTONIC (what bpf_ktime_get_ns reads).
fn clock_offset() -> i64 {
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

/// Decodes one ring-buffer record. `Err(())` for a record whose paths are unknown.
fn decode(rec: &[u8], offset: i64) -> Result<Option<Event>, ()> {
    if rec.len() < HEADER {
        return Err(());
    }
    // SAFETY: the record starts with a roar_event (plain integers); read unaligned.
    let h: roar_event = unsafe { std::ptr::read_unaligned(rec.as_ptr().cast()) };
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
    let (pid, ts_ns) = (h.pid as i32, h.ts_ns as i64 + offset);
    let path = |p: &[u8], base: &[u8]| join_normalize(&dir_path(base), cstr(p));
    Ok(Some(match h.kind {
        KIND_EXEC => {
            let argv = strs[2].strip_suffix(b"\0").unwrap_or(strs[2]);
            Event::Exec {
                pid,
                ppid: h.ppid as i32,
                cwd: PathBuf::from(OsString::from_vec(dir_path(strs[0]))),
                exe: PathBuf::from(OsString::from_vec(dir_path(strs[1]))),
                argv: roar_store::argv_from_blob(argv),
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
        _ => return Err(()),
    }))
}

/// An eventfd the waiter thread signals once the command and all its descendants are gone.
struct Done(i32);

impl Done {
    fn new() -> io::Result<Done> {
        // SAFETY: plain eventfd creation.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Done(fd))
    }

    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.0, std::ptr::addr_of!(one).cast(), 8) };
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        // SAFETY: closing the fd we own.
        unsafe { libc::close(self.0) };
    }
}

pub fn run(argv: &[OsString], env: &crate::EnvChanges, tap: &Tap) -> Result<Traced, TraceError> {
    let ring_kb = ring_kb()?;
    let t_load = Instant::now();
    let mut obj = MaybeUninit::uninit();
    let loaded = load(&mut obj, ring_kb)?;
    tracing::debug!("eBPF programs loaded in {:?}", t_load.elapsed());
    let offset = clock_offset();

    let mut events = Vec::new();
    let mut malformed = 0usize;
    let mut ring = RingBufferBuilder::new();
    ring.add(&loaded.maps.events, |rec: &[u8]| {
        match decode(rec, offset) {
            Ok(Some(ev)) => {
                tap(&ev);
                events.push(ev);
            }
            Ok(None) => {}
            Err(()) => malformed += 1,
        }
        0
    })
    .map_err(|e| unavailable(format!("cannot read the ring buffer: {e}")))?;
    let ring = ring
        .build()
        .map_err(|e| unavailable(format!("cannot read the ring buffer: {e}")))?;
    let done = Done::new().map_err(|source| TraceError::Socket { source })?;

    let guard = launch::SignalGuard::install();
    launch::become_subreaper();
    let mut cmd = launch::command(argv, env, &guard);
    let map_fd = loaded.maps.tracked.as_fd().as_raw_fd();
    // SAFETY: the closure runs between fork and exec and makes one raw syscall.
    unsafe {
        cmd.pre_exec(move || track_self(map_fd));
    }
    let ctime_floor_ns = crate::ctime_floor_ns();
    let started_ns = now_ns();
    let child = cmd.spawn().map_err(|e| launch::spawn_error(&argv[0], e))?;
    let root = child.id() as i32;
    guard.set_child(root);
    drop(child);

    let status = std::thread::scope(|scope| {
        let done = &done;
        let waiter = scope.spawn(move || {
            let status = launch::wait_for(root);
            launch::reap_orphans();
            done.signal();
            status
        });
        let mut fds = [
            libc::pollfd {
                fd: ring.epoll_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: done.0,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: fds is a valid array of two pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, READ_EVERY_MS) };
            if n == 0 {
                // Records below the wake-up mark are read on this timer.
                let _ = ring.consume();
                continue;
            }
            if n < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
            if fds[0].revents != 0 {
                let _ = ring.consume();
            }
            if fds[1].revents != 0 {
                break;
            }
        }
        // Every process has exited, so every record it made is in the ring.
        let _ = ring.consume();
        waiter.join().expect("the waiter thread does not panic")
    });
    let ended_ns = now_ns();
    drop(guard);
    drop(ring);
    let lost = loaded.maps.bss_data.as_ref().map_or(0, |b| b.lost);
    let status: Status = status.map_err(|source| TraceError::Wait { source })?;
    Ok(Traced {
        events,
        status,
        started_ns,
        ctime_floor_ns,
        ended_ns,
        malformed,
        lost: lost as usize,
        forged: 0,
        untraced: Vec::new(),
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
            decode(&rec, 0).unwrap(),
            Some(Event::Rename {
                pid: 7,
                from: PathBuf::from("/home/w/tmp"),
                to: PathBuf::from("/abs/out"),
                ts_ns: 0
            })
        );
        let root = record(KIND_UNLINK, &[b"../x\0", b""]);
        assert_eq!(
            decode(&root, 0).unwrap(),
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
        assert_eq!(decode(&rec, 0), Err(()));
        assert_eq!(decode(&rec[..10], 0), Err(()));
    }

    #[test]
    fn kernel_device_numbers_are_converted_to_stat_numbers() {
        assert_eq!(user_dev((8 << 20) | 1), libc::makedev(8, 1));
        assert_eq!(user_dev((259 << 20) | 300), libc::makedev(259, 300));
    }
}
