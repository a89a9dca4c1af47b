//! The preload backend: runs the command with the shim in LD_PRELOAD and reads its events from a
//! shared-memory ring owned by this run (see `roar_wire::ring`), plus datagrams on an abstract
//! unix socket from processes that could not map the ring.
//!
//! Who may report: the ring is a memfd reached through `/proc/<roar>/fd/N` or a 0600 file, which
//! only processes of roar's user (and root) can open. The socket is reachable by anyone, so every
//! datagram must end with the run's random key, which the shim reads from its environment; and
//! since a process of the run that became another user can read that key from its own environ
//! and hand it on, a datagram is taken only from a sender the kernel places in the run
//! ([`Senders`]: its credentials, then its ancestry). Anything else is dropped unparsed and
//! counted, and the job says so.
#![allow(unsafe_code)]

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roar_store::{now_ns, FileStat};
use roar_wire::ring::{self, Next, Ring, RING_ENV};
use roar_wire::{strip_key, Header, Kind, WireStat, KEY_LEN, LIB_ENV, SOCK_ENV};

use crate::event::{join_normalize, Event};
use crate::keep::Keep;
use crate::launch;
use crate::{Tap, TraceError, Traced};

mod socket;

use decode::*;
use shm::*;
pub use shm::{late_path, left_behind, ring_path};
use socket::*;
mod decode;
mod shm;

/// What was received: from one source while the command runs, from both merged at the end.
#[derive(Default)]
struct Received {
    events: Vec<Event>,
    malformed: usize,
    /// Events whose process was killed while writing them into the ring.
    cut_off: usize,
    /// Datagrams without the run's key, or from a sender the kernel does not place in the run.
    forged: usize,
}

/// What the receiver thread and, at the end, the run itself read the ring and the socket into.
struct Inbox {
    from_ring: Received,
    from_sock: Received,
    stuck_since: Option<Instant>,
    buf: Vec<u8>,
    /// The top command if the shim cannot follow it: `None` until someone looked.
    top: Option<Option<(PathBuf, &'static str)>>,
    /// The run has taken the last pass: the receiver thread stops.
    finished: bool,
    /// recv(2) failed other than for an empty queue: the socket is not read again (counted once
    /// as malformed), the ring still is.
    sock_failed: bool,
    senders: Senders,
    /// How many of `from_ring.events` the senders have been told of.
    noted: usize,
    /// Keyed datagrams whose senders are not placed yet: (pid, uid, body).
    held: Vec<(i32, u32, Vec<u8>)>,
}

/// The receiver thread's side: what it reads from, and the inbox it shares with the run.
struct Receiver {
    /// The command as given, whose program the shim may not be able to follow.
    argv0: OsString,
    sock: Arc<Socket>,
    map: Arc<RingMap>,
    inbox: Arc<Mutex<Inbox>>,
    tap: Tap,
    keep: Arc<Keep>,
}

impl Inbox {
    /// Reads the ring (until empty or a slot still being written) and every queued datagram;
    /// returns whether any datagram came. On the `last` pass, every traced process is gone.
    fn pass(&mut self, r: &Receiver, last: bool) -> bool {
        let mut came = false;
        self.drain(r, false);
        while !self.sock_failed {
            let (n, pid, uid) = match recv_datagram(r.sock.fd, &mut self.buf) {
                Ok(Some(got)) => got,
                Ok(None) => break,
                Err(_) => {
                    self.from_sock.malformed += 1;
                    self.sock_failed = true;
                    break;
                }
            };
            came = true;
            match strip_key(&self.buf[..n], &r.sock.key) {
                Some(body) => {
                    let body = body.to_vec();
                    self.held.push((pid, uid, body));
                }
                None => self.from_sock.forged += 1,
            }
        }
        if last {
            self.drain(r, true);
        }
        self.settle_held(r, last);
        r.keep.commit(None);
        // A datagram held for its sender counts too: datagrams are flowing.
        came
    }

    /// Reads the ring; every process it names is the run's.
    fn drain(&mut self, r: &Receiver, last: bool) {
        drain_ring(
            &r.map.ring,
            &mut self.from_ring,
            &mut self.stuck_since,
            last,
            &r.tap,
            &r.keep,
        );
        for ev in &self.from_ring.events[self.noted..] {
            self.senders.note(ev);
        }
        self.noted = self.from_ring.events.len();
    }

    /// Takes the held datagrams whose senders are placed now, in the order they came (a
    /// sender's own events place the ones it forked); on the `last` pass refuses the rest.
    fn settle_held(&mut self, r: &Receiver, last: bool) {
        loop {
            let mut progressed = false;
            let mut waiting = Vec::new();
            for (pid, uid, body) in std::mem::take(&mut self.held) {
                if !self.senders.admit(pid, uid) {
                    waiting.push((pid, uid, body));
                    continue;
                }
                progressed = true;
                let parsed = Header::parse(&body);
                if let Some((h, _)) = parsed
                    .as_ref()
                    .filter(|(h, _)| h.kind == Kind::Spawned as u16)
                {
                    self.senders.vouched(h.arg as i32);
                    continue;
                }
                match parsed.and_then(|(h, parts)| decode(&h, parts)) {
                    Some(ev) => {
                        self.senders.note(&ev);
                        (r.tap)(&ev);
                        r.keep.event(&ev);
                        self.from_sock.events.push(ev);
                    }
                    None => self.from_sock.malformed += 1,
                }
            }
            self.held = waiting;
            if !progressed || self.held.is_empty() {
                break;
            }
        }
        // Nothing more will place them (at the end), or too many wait: refused, oldest first.
        let refused = if last {
            self.held.len()
        } else {
            self.held.len().saturating_sub(MAX_HELD)
        };
        for (pid, uid, body) in &self.held[..refused] {
            let kind = Header::parse(body).map(|(h, _)| h.kind);
            tracing::debug!("refused a datagram from pid {pid} uid {uid} (kind {kind:?})");
        }
        self.held.drain(..refused);
        self.from_sock.forged += refused;
    }
}

/// The receiver thread: reads the ring and the socket while the command runs. Sleeps on the
/// ring's futex (see `roar_wire::ring`) for at most `RING_TIMER`, or, while datagrams flow, in
/// poll(2) on the socket for at most `SOCKET_POLL`; then takes a pass. It stops once the run has
/// taken the last pass itself ([`finish`]).
fn receive(r: &Receiver) {
    let (mut datagrams_flow, mut sock_failed) = (false, false);
    let sock_readable = |timeout: Duration| {
        let mut pfd = libc::pollfd {
            fd: r.sock.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; an error or EINTR just means another pass.
        unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) > 0 }
    };
    loop {
        if datagrams_flow {
            sock_readable(SOCKET_POLL);
        } else if let Some(seen) = r.map.ring.sleep_begin() {
            // A failed socket reads as readable: then only the ring's wake-ups and timer count.
            // A datagram sent before we announced the sleep would not wake us.
            if sock_failed || !sock_readable(Duration::ZERO) {
                futex_wait(r.map.ring.wake_word(), seen, RING_TIMER);
            }
            r.map.ring.sleep_end();
        }
        let mut inbox = r.inbox.lock().unwrap_or_else(|p| p.into_inner());
        if inbox.finished {
            return;
        }
        datagrams_flow = inbox.pass(r, false);
        sock_failed = inbox.sock_failed;
    }
}

/// The last pass, taken by the run once every traced process is gone: waiting for a pass of the
/// receiver thread's in progress, not for the thread to wake and exit (two cross-CPU wake-ups,
/// a tenth of a millisecond of a short run). Then the thread is told to stop, and left to.
fn finish(r: &Receiver) -> (Received, Option<(PathBuf, &'static str)>) {
    let mut inbox = r.inbox.lock().unwrap_or_else(|p| p.into_inner());
    inbox.pass(r, true);
    inbox.finished = true;
    // The command could not be started: nobody looked.
    let top = inbox.top.take().unwrap_or_else(|| top_untraced(&r.argv0));
    let from_ring = std::mem::take(&mut inbox.from_ring);
    let from_sock = std::mem::take(&mut inbox.from_sock);
    drop(inbox);
    r.map.ring.wake_always();
    futex_wake(r.map.ring.wake_word());
    let mut events = from_ring.events;
    if !from_sock.events.is_empty() {
        // Processes without the ring (another user, no /proc) and events too big for it: the two
        // streams are merged by time, each keeping its own order.
        events.extend(from_sock.events);
        events.sort_by_key(Event::ts_ns);
    }
    let received = Received {
        events,
        malformed: from_ring.malformed + from_sock.malformed,
        cut_off: from_ring.cut_off,
        forged: from_sock.forged,
    };
    (received, top)
}

const STATIC: &str = "statically linked: the preload shim cannot load into it";
const SETID: &str = "setuid/setgid: the loader drops LD_PRELOAD";

/// The top command, if the shim cannot follow it (roar starts it, so no shim reports it). Found
/// by the receiver thread while the command runs, not after it: a PATH search and an ELF header
/// read the user would otherwise wait for.
fn top_untraced(argv0: &OsStr) -> Option<(PathBuf, &'static str)> {
    let exe = crate::check::resolve(argv0)?;
    match crate::check::linkage(&exe) {
        crate::check::Linkage::Static => Some((exe, STATIC)),
        crate::check::Linkage::SetId => Some((exe, SETID)),
        _ => None,
    }
}

/// Waits for the command, started at `started_ns`. The events wait in the ring (16 MiB) and the
/// socket meanwhile: the receiver thread, and the caller's work that would slow a short command
/// down, start only once the command has run [`crate::BESIDE_AFTER`], so a short command's run
/// starts no thread at all. If the thread cannot start, this thread reads the ring between waits
/// (a producer waits while it is full).
fn wait(
    pid: i32,
    started_ns: i64,
    receiver: &Arc<Receiver>,
    beside: &mut dyn crate::Beside,
) -> std::io::Result<launch::Status> {
    // While the child execs on the other CPU: the caller's first work, then the PATH search and
    // ELF read for the top command.
    beside.started(started_ns);
    let top = top_untraced(&receiver.argv0);
    receiver.inbox.lock().unwrap_or_else(|p| p.into_inner()).top = Some(top);
    let waiter = launch::Waiter::new(pid);
    if let Some(status) = waiter.within(crate::BESIDE_AFTER)? {
        return Ok(status);
    }
    beside.running_on();
    // Not joined: `finish` takes the last pass and the thread then returns on its own.
    let thread = {
        let receiver = receiver.clone();
        std::thread::Builder::new()
            .name("roar-preload-recv".into())
            .spawn(move || receive(&receiver))
    };
    if let Err(e) = thread {
        tracing::warn!("no thread to read the command's events ({e}): reading them between waits");
        loop {
            let ended = if waiter.can_wait() {
                waiter.within(SOCKET_POLL)?
            } else {
                std::thread::sleep(SOCKET_POLL);
                waiter.now()?
            };
            if let Some(status) = ended {
                return Ok(status);
            }
            let mut inbox = receiver.inbox.lock().unwrap_or_else(|p| p.into_inner());
            inbox.pass(receiver, false);
        }
    }
    launch::wait_for(pid)
}

pub fn run(
    argv: &[OsString],
    env: &crate::EnvChanges,
    lib: &Path,
    tap: Tap,
    keep: Arc<Keep>,
    beside: &mut dyn crate::Beside,
) -> Result<Traced, TraceError> {
    let capacity = ring_capacity()?;
    let sock = Arc::new(bind()?);
    let ring_file = keep.journal_path().map(ring_path);
    let map = Arc::new(
        map_ring(capacity, ring_file.as_deref()).map_err(|source| TraceError::Socket { source })?,
    );
    if let Some(ring) = &ring_file {
        make_late(ring).map_err(|source| TraceError::Socket { source })?;
        keep.record(&roar_engine::journal::Record::Ring {
            ring: ring.clone(),
            late: late_path(ring),
        });
    }
    let receiver = Arc::new(Receiver {
        argv0: argv[0].clone(),
        sock: sock.clone(),
        map: map.clone(),
        inbox: Arc::new(Mutex::new(Inbox {
            from_ring: Received::default(),
            from_sock: Received::default(),
            senders: Senders::new(),
            noted: 0,
            held: Vec::new(),
            stuck_since: None,
            buf: vec![0u8; RECV_BUF],
            top: None,
            finished: false,
            sock_failed: false,
        })),
        tap,
        keep: keep.clone(),
    });

    let guard = launch::SignalGuard::install();
    launch::become_subreaper();
    let mut preload = lib.as_os_str().to_owned();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let set = |name: &str, value: OsString| (OsString::from(name), Some(value));
    let env: Vec<(OsString, Option<OsString>)> = env
        .iter()
        .cloned()
        .chain([
            set("LD_PRELOAD", preload),
            set(SOCK_ENV, sock.env_value().into()),
            set(RING_ENV, map.env_value()),
            set(LIB_ENV, lib.into()),
        ])
        .collect();
    let ctime_floor_ns = crate::ctime_floor_ns();
    keep.record(&roar_engine::journal::Record::CtimeFloor(ctime_floor_ns));
    keep.commit(None);
    let started_ns = now_ns();
    let status = match launch::spawn(argv, &env, &guard) {
        Ok(pid) => {
            guard.set_child(pid);
            let status = wait(pid, started_ns, &receiver, beside)
                .map_err(|source| TraceError::Wait { source });
            launch::reap_orphans();
            status
        }
        Err(e) => Err(launch::spawn_error(&argv[0], e)),
    };
    let ended_ns = now_ns();
    drop(guard);
    let (received, top) = finish(&receiver);
    if let Some(ring) = &ring_file {
        // Every event is in the journal now.
        let _ = std::fs::remove_file(ring);
        let _ = std::fs::remove_file(late_path(ring));
    }
    let untraced = crate::untraced_in(top, &received.events);
    let status = status?;
    Ok(Traced {
        events: received.events,
        status,
        started_ns,
        ctime_floor_ns,
        ended_ns,
        malformed: received.malformed,
        cut_off: received.cut_off,
        lost: 0,
        forged: received.forged,
        untraced,
        unprivileged: Vec::new(),
        cut_short: None,
        stops: 0,
    })
}

/// Decoding is exercised on real datagrams by the integration tests; this pins the join of base
/// and path for the kinds that carry two paths.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_rename() {
        let h = Header {
            kind: Kind::Rename as u16,
            pid: 9,
            ..Header::default()
        };
        let ev = decode(&h, [b"/w", b"tmp", b"/w/sub", b"../out"]).unwrap();
        assert_eq!(
            ev,
            Event::Rename {
                pid: 9,
                from: PathBuf::from("/w/tmp"),
                to: PathBuf::from("/w/out"),
                ts_ns: 0
            }
        );
    }
}
