//! The eBPF backend: `src/bpf/roar.bpf.c` on BTF raw tracepoints (syscall entry/exit, scheduler
//! fork/exec/exit). Sees static and setuid programs, and costs the traced program no context
//! switch per file: records go to a ring buffer this process drains while the command runs.
//!
//! The programs stay loaded between runs in a resident helper ([`helper`]); a run leases a slot
//! from it and reads the slot's ring buffer, skipping records of the slot's earlier runs, so no
//! run reads another's records. Without a helper (disabled, inside another roar, or unreachable) the run loads the
//! programs itself and the kernel unloads them when it exits, even if it crashes. The command adds
//! its own pid to the `tracked` map between fork and exec; from then on fork/exit keep the map
//! in-kernel. Records that could not be written (ring buffer full) are counted, and a job with any
//! is incomplete; so is a job whose helper died while it ran.

mod decode;
pub mod helper;
mod maps;
mod takeover;

use std::ffi::OsString;
use std::io::{self, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::time::Instant;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapHandle, MapType, RingBufferBuilder};
use roar_store::now_ns;

use crate::keep::Keep;
use crate::launch::{self, Status};
use crate::{Tap, TraceError, Traced};
use decode::{clock_offset, decode};
use maps::{Maps, RunKey};

#[allow(clippy::all, non_camel_case_types, dead_code, unsafe_op_in_unsafe_fn)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/roar.skel.rs"));
}

/// Ring buffer size in KiB, unless `ROAR_EBPF_RING_KB` says otherwise (a power of two, ≥ 4).
const RING_KB: u32 = 2 * 1024;
const RING_ENV: &str = "ROAR_EBPF_RING_KB";
/// The kernel wakes the reader only once an eighth of the ring is waiting; otherwise it reads on
/// this timer, so a slow trickle never waits long.
const READ_EVERY_MS: i32 = 20;

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

/// Opens and loads the programs (the verifier checks them here) for runs with `ring_kb` rings.
fn load(
    obj: &mut MaybeUninit<libbpf_rs::OpenObject>,
    ring_kb: u32,
) -> Result<skel::RoarSkel<'_>, TraceError> {
    quiet_libbpf();
    let mut open = skel::RoarSkelBuilder::default()
        .open(obj)
        .map_err(|e| unavailable(format!("cannot open the BPF object: {e}")))?;
    if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
        ro.wake_bytes = u64::from(ring_kb) * 1024 / 8;
    }
    open.load()
        .map_err(|e| unavailable(format!("the kernel refused the BPF programs: {e}")))
}

/// Attaches loaded programs to their tracepoints; they stay attached while the links live.
/// (Not the skeleton's own attach: it keeps its links, and would not attach again after they
/// were dropped.)
fn attach(skel: &skel::RoarSkel<'_>) -> Result<Vec<libbpf_rs::Link>, TraceError> {
    let p = &skel.progs;
    [
        &p.sched_fork,
        &p.sched_exec,
        &p.sched_exit,
        &p.sys_enter,
        &p.sys_exit,
    ]
    .into_iter()
    .map(|prog| prog.attach())
    .collect::<Result<_, _>>()
    .map_err(|e| unavailable(format!("cannot attach to the tracepoints: {e}")))
}

/// Loads and attaches the programs, then detaches them: the real preflight of `roar tracer
/// check ebpf`. Returns how long it took.
pub fn probe() -> Result<std::time::Duration, TraceError> {
    let t = Instant::now();
    let mut obj = MaybeUninit::uninit();
    let skel = load(&mut obj, ring_kb()?)?;
    attach(&skel)?;
    Ok(t.elapsed())
}

/// The maps of loaded programs, as a run or the helper uses them.
fn maps_of(skel: &skel::RoarSkel<'_>) -> io::Result<Maps> {
    Ok(Maps {
        tracked: skel.maps.tracked.as_fd().try_clone_to_owned()?,
        runs: skel.maps.runs.as_fd().try_clone_to_owned()?,
    })
}

/// A run's ring buffer: `ring_kb` KiB the programs write its records to.
fn new_ring(ring_kb: u32) -> Result<MapHandle, TraceError> {
    let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
        ..Default::default()
    };
    MapHandle::create(
        MapType::RingBuf,
        Some("roar_run_ring"),
        0,
        0,
        ring_kb * 1024,
        &opts,
    )
    .map_err(|e| unavailable(format!("cannot create the ring buffer: {e}")))
}

/// Words for the helper, each ended by a NUL (`takeover::Told` reads them).
fn tell(conn: &std::os::unix::net::UnixStream, words: &[&[u8]]) -> io::Result<()> {
    let mut msg = Vec::new();
    for w in words {
        msg.extend_from_slice(w);
        msg.push(0);
    }
    (&*conn).write_all(&msg)
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

pub fn run(
    argv: &[OsString],
    env: &crate::EnvChanges,
    tap: &Tap,
    keep: &Keep,
) -> Result<Traced, TraceError> {
    let ring_kb = ring_kb()?;
    let t_load = Instant::now();
    let mut obj = MaybeUninit::uninit();
    // Loaded and attached here only without a helper; kept until the run ends.
    let mut _local = None;
    let (maps, key, own_ring, helper) = match helper::lease(ring_kb)? {
        Some(l) => (l.maps, l.key, l.ring, Some(l.conn)),
        None => {
            let loaded = load(&mut obj, ring_kb)?;
            let maps = maps_of(&loaded).map_err(|source| TraceError::Socket { source })?;
            let key = RunKey { slot: 0, gen: 1 };
            let ring = new_ring(ring_kb)?;
            maps::put_ring(
                loaded.maps.rings.as_fd().as_raw_fd(),
                key.slot,
                ring.as_fd().as_raw_fd(),
            )
            .and_then(|()| maps.open_run(key))
            .map_err(|e| unavailable(format!("cannot give the run its ring buffer: {e}")))?;
            let links = attach(&loaded)?;
            _local = Some((loaded, links));
            (maps, key, ring, None)
        }
    };
    tracing::debug!(
        "eBPF run ready in {:?} ({})",
        t_load.elapsed(),
        if helper.is_some() {
            "resident helper"
        } else {
            "programs loaded by this run"
        }
    );
    let offset = clock_offset();

    let mut events = Vec::new();
    let mut malformed = 0usize;
    let mut ring = RingBufferBuilder::new();
    ring.add(&own_ring as &dyn MapCore, |rec: &[u8]| {
        match decode(rec, offset, key.gen) {
            Ok(Some(ev)) => {
                tap(&ev);
                // Written before the callback returns and libbpf frees the record: a roar
                // killed at any moment leaves it in the ring or in the journal.
                keep.event_now(&ev);
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
    // What an earlier run of this slot left unread is skipped now, not while the command runs.
    let _ = ring.consume();
    let done = Done::new().map_err(|source| TraceError::Socket { source })?;

    let guard = launch::SignalGuard::install();
    launch::become_subreaper();
    let mut cmd = launch::command(argv, env, &guard);
    let tracked = maps.tracked.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and makes one raw syscall.
    unsafe {
        cmd.pre_exec(move || maps::track_self(tracked, key));
    }
    let ctime_floor_ns = crate::ctime_floor_ns();
    keep.record(&roar_engine::journal::Record::CtimeFloor(ctime_floor_ns));
    keep.commit(None);
    // Where the journal is: should this roar die, the helper follows the command into it.
    if let (Some(conn), Some(journal), Some(config)) =
        (helper.as_ref(), keep.journal_path(), keep.config())
    {
        let _ = tell(
            conn,
            &[
                b"keep",
                journal.as_os_str().as_bytes(),
                config.as_os_str().as_bytes(),
            ],
        );
    }
    let started_ns = now_ns();
    let child = cmd.spawn().map_err(|e| launch::spawn_error(&argv[0], e))?;
    let root = child.id() as i32;
    guard.set_child(root);
    drop(child);

    let mut helper_died = false;
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
            // The helper never writes after its grant: readable means it exited, and with it
            // the programs (a negative fd is not polled).
            libc::pollfd {
                fd: helper.as_ref().map_or(-1, |c| c.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: fds is a valid array of three pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 3, READ_EVERY_MS) };
            if n == 0 {
                // Records below the wake-up mark are read on this timer.
                let _ = ring.consume();
                keep.commit(None);
                continue;
            }
            if n < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
            if fds[0].revents != 0 {
                let _ = ring.consume();
                keep.commit(None);
            }
            if fds[2].revents != 0 {
                helper_died = true;
                fds[2].fd = -1;
            }
            if fds[1].revents != 0 {
                break;
            }
        }
        // Every process has exited, so every record it made is in the ring.
        let _ = ring.consume();
        keep.commit(None);
        waiter.join().expect("the waiter thread does not panic")
    });
    let ended_ns = now_ns();
    if let Some(conn) = helper.as_ref() {
        let _ = tell(conn, &[b"done"]);
    }
    drop(guard);
    drop(ring);
    let lost = maps.lost(key).unwrap_or(0) as usize;
    maps.close_run(key.slot);
    let status: Status = status.map_err(|source| TraceError::Wait { source })?;
    let untraced = crate::untraced_in(None, &events);
    Ok(Traced {
        events,
        status,
        started_ns,
        ctime_floor_ns,
        ended_ns,
        malformed,
        cut_off: 0,
        lost,
        forged: 0,
        untraced,
        unprivileged: Vec::new(),
        cut_short: helper_died
            .then_some("the eBPF helper exited while the command ran: later events are missing"),
    })
}
