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

const RECV_BUF: usize = 256 * 1024;
const SOCK_BUF: libc::c_int = 32 << 20;

struct Socket {
    fd: libc::c_int,
    name: String,
    key: [u8; KEY_LEN],
}

impl Socket {
    /// The `SOCK_ENV` value the shim gets: the name and the key.
    fn env_value(&self) -> String {
        let hex: String = self.key.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}:{hex}", self.name)
    }
}

/// A fresh key from the kernel's random source.
fn random_key() -> std::io::Result<[u8; KEY_LEN]> {
    let mut key = [0u8; KEY_LEN];
    // SAFETY: getrandom writes at most key.len() bytes into our buffer.
    let n = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
    if n != KEY_LEN as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(key)
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: closing the fd we own.
        unsafe { libc::close(self.fd) };
    }
}

fn abstract_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain old data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in name.bytes().enumerate().take(100) {
        addr.sun_path[i + 1] = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len().min(100);
    (addr, len as libc::socklen_t)
}

fn bind() -> Result<Socket, TraceError> {
    let err = |source| TraceError::Socket { source };
    let name = format!("roar-{}-{:x}", std::process::id(), now_ns());
    let key = random_key().map_err(err)?;
    // SAFETY: plain socket calls on values we own.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        let sock = Socket { fd, name, key };
        // Every datagram comes with its sender's pid and uid, as the kernel knows them.
        let on: libc::c_int = 1;
        let sz = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let p = std::ptr::addr_of!(on).cast();
        if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_PASSCRED, p, sz) != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        let (addr, len) = abstract_addr(&sock.name);
        if libc::bind(fd, std::ptr::addr_of!(addr).cast(), len) != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        // A deep queue keeps bursts from blocking the traced program; FORCE needs CAP_NET_ADMIN.
        let size = SOCK_BUF;
        let p = std::ptr::addr_of!(size).cast();
        let sz = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, p, sz) != 0 {
            libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, p, sz);
        }
        Ok(sock)
    }
}

/// Default size of the event ring in KiB (~100k events of typical size); `ROAR_PRELOAD_RING_KB`
/// overrides. Producers wait (never drop) when it is full, so the size only bounds how far roar
/// may lag behind the program.
const RING_KB: u64 = 16 * 1024;
/// How long the receiver sleeps on the ring when no producer wakes it (they do once an eighth of
/// the ring is unread, or it is full): smaller batches reach roar, and early hashing, at most
/// this late. Polling instead (every millisecond, until 2026-11-24) cost ~1,000 wake-ups and
/// ~3 % of a CPU per second of the run.
const RING_TIMER: Duration = Duration::from_millis(20);
/// While datagrams flow (processes without the ring, events too big for it) the socket is watched
/// instead, at this interval for the ring: each datagram wakes the receiver at once.
const SOCKET_POLL: Duration = Duration::from_millis(1);
/// How long a marked slot may stay uncommitted before roar checks whether its producer died.
const STUCK: Duration = Duration::from_millis(100);
/// How long a reserved slot may stay unmarked before roar takes it back (see `drain_ring`): a
/// producer takes a few instructions between reserving and marking.
const STUCK_UNMARKED: Duration = Duration::from_secs(2);

/// The run's ring: a file roar maps and every shim maps again. With a journal it is a file of its
/// own (in /dev/shm, else beside the job's journal), which outlives roar: what the shims wrote into it and roar had not read yet
/// is recovered from it. Without one, a memfd shims reach through /proc/<roar>/fd/<fd>.
struct RingMap {
    fd: libc::c_int,
    base: *mut libc::c_void,
    len: usize,
    ring: Ring,
    /// The ring's file, when it has a name.
    path: Option<PathBuf>,
}

impl RingMap {
    /// What the shim is told (`ROAR_INTERNAL_RING`): the file, or roar's pid and fd.
    fn env_value(&self) -> OsString {
        match &self.path {
            Some(p) => p.clone().into_os_string(),
            None => format!("{}/{}", std::process::id(), self.fd).into(),
        }
    }
}

/// Where the ring of a run whose journal is `journal` lives: in /dev/shm (memory, as a memfd is;
/// it outlives roar, not a reboot) when there is one, else beside the journal. A 16 MiB ring
/// file on ext4 cost `roar run true` ~2.8 ms more than on tmpfs (bench/NOTES.md, "Crash-durable
/// recording"). Its events that reach no ring go to `<ring>.late` (the shim's fallback once roar
/// is gone).
pub fn ring_path(journal: &Path) -> PathBuf {
    let name = journal.file_stem().unwrap_or_default().to_string_lossy();
    // SAFETY: access(2) on a NUL-terminated path.
    let shm = unsafe { libc::access(c"/dev/shm".as_ptr(), libc::W_OK | libc::X_OK) } == 0;
    if shm {
        Path::new("/dev/shm").join(format!("roar-{name}.ring"))
    } else {
        journal.with_extension("ring")
    }
}

/// Creates the (empty) late file, 0600: the shims only ever append to the one roar made.
fn make_late(ring: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(late_path(ring))
        .map(drop)
}

/// The file the shims append to once roar is gone and the ring is full (or never mapped).
pub fn late_path(ring: &Path) -> PathBuf {
    let mut p = ring.as_os_str().to_owned();
    p.push(".late");
    PathBuf::from(p)
}

// SAFETY: the mapping is only touched through `Ring`, whose shared state is atomic, and is
// unmapped only on drop, when the run and the receiver thread have both let go of it.
unsafe impl Send for RingMap {}
// SAFETY: as for Send: shared use goes through `Ring`'s atomics only.
unsafe impl Sync for RingMap {}

impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping and fd, no longer used by anyone in this process.
        unsafe {
            libc::munmap(self.base, self.len);
            libc::close(self.fd);
        }
    }
}

const RING_SIZE_ENV: &str = "ROAR_PRELOAD_RING_KB";

fn ring_capacity() -> Result<u64, TraceError> {
    let Some(v) = std::env::var_os(RING_SIZE_ENV) else {
        return Ok(RING_KB << 10);
    };
    let min = ring::MIN_CAPACITY >> 10;
    v.to_str()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|kb| kb.is_power_of_two() && *kb >= min && *kb <= 1 << 22)
        .map(|kb| kb << 10)
        .ok_or_else(|| TraceError::Unavailable {
            backend: "preload",
            reason: format!(
                "{RING_SIZE_ENV}={v:?} is not a power of two between {min} and {}",
                1u64 << 22
            ),
        })
}

fn map_ring(capacity: u64, path: Option<&Path>) -> std::io::Result<RingMap> {
    use std::os::unix::ffi::OsStrExt;
    let len = ring::HEADER_SIZE + capacity as usize;
    // SAFETY: plain memfd/open/ftruncate/mmap on values we own; the mapping is zeroed by the
    // kernel (a fresh file, or one just made the ring's length).
    unsafe {
        let fd = match path {
            Some(p) => {
                let c = std::ffi::CString::new(p.as_os_str().as_bytes())
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
                libc::open(
                    c.as_ptr(),
                    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                    0o600,
                )
            }
            None => libc::memfd_create(c"roar-events".as_ptr(), libc::MFD_CLOEXEC),
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::ftruncate(fd, len as libc::off_t) != 0 {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        let base = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        if base == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        let ring = Ring::create(base.cast(), capacity, libc::getpid() as i64);
        Ok(RingMap {
            fd,
            base,
            len,
            ring,
            path: path.map(Path::to_owned),
        })
    }
}

/// Reads the ring until it is empty. A slot whose producer is still writing it ends the pass. A
/// producer killed while writing (see `roar_wire::ring`) costs its own event only, counted as cut
/// off: a slot it marked is freed once its pid is gone; one it reserved and never marked is taken
/// back at the `last` pass (every traced process is gone), or once the tail has been stuck on it
/// for `STUCK_UNMARKED` — long enough that its producer must be dead, soon enough that the others
/// do not wait long on a full ring; a producer that was only stopped then sends its event as a
/// datagram.
fn drain_ring(
    ring: &Ring,
    out: &mut Received,
    stuck_since: &mut Option<Instant>,
    last: bool,
    tap: &Tap,
    keep: &Keep,
) {
    loop {
        // Read ahead of the tail; what was read goes to the journal before its slots are freed,
        // so a roar killed at any point leaves each event in one of the two (the journal says up
        // to where: recovery reads the ring on from there).
        let mut pos = ring.tail();
        let stop = loop {
            match ring.at(pos) {
                Next::Event { bytes, len } => {
                    match Header::parse(bytes).and_then(|(h, parts)| decode(&h, parts)) {
                        Some(ev) => {
                            tap(&ev);
                            keep.event(&ev);
                            out.events.push(ev);
                        }
                        None => out.malformed += 1,
                    }
                    pos += len;
                    *stuck_since = None;
                }
                Next::Pad { len } => pos += len,
                other => break other_kind(&other),
            }
        };
        if pos != ring.tail() {
            keep.commit(Some(pos));
            ring.release_to(pos);
        }
        match stop {
            Stop::Empty => return,
            Stop::Pending(0) => {
                let since = *stuck_since.get_or_insert_with(Instant::now);
                if !(last || since.elapsed() > STUCK_UNMARKED) {
                    return;
                }
                if ring.skip_unmarked() > 0 {
                    out.cut_off += 1;
                    *stuck_since = None;
                }
            }
            Stop::Pending(pid) => {
                let since = *stuck_since.get_or_insert_with(Instant::now);
                // SAFETY: a signal-0 probe.
                let dead = since.elapsed() > STUCK
                    && unsafe { libc::kill(pid, 0) } != 0
                    && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
                if !(last || dead) {
                    return;
                }
                *stuck_since = None;
                match ring.pending_len() {
                    Some(len) => {
                        out.cut_off += 1;
                        ring.release(len);
                    }
                    // A slot word no producer writes (a program scribbled on the ring): nothing
                    // after it can be found.
                    None => {
                        out.malformed += 1;
                        return;
                    }
                }
            }
        }
    }
}

/// Where a read-ahead stopped.
enum Stop {
    Empty,
    Pending(i32),
}

fn other_kind(n: &Next<'_>) -> Stop {
    match n {
        Next::Pending { pid } => Stop::Pending(*pid),
        _ => Stop::Empty,
    }
}

/// Sleeps until the futex word at `word` (in the shared ring mapping) no longer holds `seen`, it is
/// woken, or `timeout` passes.
fn futex_wait(word: *const u32, seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a word of our live mapping with a valid relative timeout.
    unsafe { libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAIT, seen, &ts) };
}

fn futex_wake(word: *const u32) {
    // SAFETY: FUTEX_WAKE on a word of our live mapping.
    unsafe { libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAKE, i32::MAX) };
}

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

/// Who may add events to this run through the socket, by what the kernel says of the sender
/// (`SCM_CREDENTIALS`, which a process cannot choose): a process of roar's own user — who could
/// as well ptrace the run or open its ring, so no boundary is crossed — or a process of the run:
/// one the run's trusted reports named (every event from the ring, which only roar's user can
/// write, and the events of senders already placed: a `setpriv --reuid` child was forked, and
/// reported, before it changed user; a placed process's shim vouches for each child it starts,
/// `Kind::Spawned`), or one whose live ancestry reaches roar (roar is its children's subreaper).
/// A datagram from a sender not placed yet is held and looked at again after the next reports;
/// what is still unplaced at the end is refused.
pub(crate) struct Senders {
    uid: u32,
    roar: i32,
    /// Processes of the run, by pid.
    members: std::collections::HashSet<i32>,
}

impl Senders {
    pub(crate) fn new() -> Senders {
        Senders {
            // SAFETY: getuid cannot fail.
            uid: unsafe { libc::getuid() },
            roar: std::process::id() as i32,
            members: Default::default(),
        }
    }

    /// A trusted report (the ring, or a sender already placed) names `ev`'s process, and a
    /// forked child with it.
    pub(crate) fn note(&mut self, ev: &Event) {
        self.members.insert(ev.pid());
        if let Event::Fork { pid, .. } = ev {
            self.members.insert(*pid);
        }
    }

    /// A process of the run started `child` (its own datagram said so).
    pub(crate) fn vouched(&mut self, child: i32) {
        self.members.insert(child);
    }

    /// Whether a datagram from `pid`, running as `uid`, is the run's now.
    pub(crate) fn admit(&mut self, pid: i32, uid: u32) -> bool {
        if uid == self.uid || self.members.contains(&pid) || self.descends_from_roar(pid) {
            self.members.insert(pid);
            return true;
        }
        false
    }

    /// Whether `pid` is alive and its chain of parents reaches roar or a process of the run.
    fn descends_from_roar(&self, pid: i32) -> bool {
        let ppid = |pid: i32| {
            procfs::process::Process::new(pid)
                .and_then(|p| p.stat())
                .ok()
                .map(|s| s.ppid)
        };
        let mut at = pid;
        // A chain of parents ends at pid 1 (or 0 past it); the bound only guards a loop.
        for _ in 0..4096 {
            match ppid(at) {
                Some(parent) if parent == self.roar || self.members.contains(&parent) => {
                    return true
                }
                Some(parent) if parent > 1 => at = parent,
                _ => return false,
            }
        }
        false
    }
}

/// Datagrams from senders not placed yet that are kept waiting; older ones beyond are refused
/// (a flood from outside the run cannot grow roar without bound).
const MAX_HELD: usize = 65_536;

/// One datagram from the socket into `buf`, with the sender's pid and uid; `Ok(None)` when the
/// queue is empty.
fn recv_datagram(fd: libc::c_int, buf: &mut [u8]) -> std::io::Result<Option<(usize, i32, u32)>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixCredentials};
    let mut cmsg = nix::cmsg_space!(UnixCredentials);
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let msg = loop {
        match recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::MSG_DONTWAIT) {
            Ok(m) => break m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    };
    let mut sender = None;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmCredentials(c) = c {
            sender = Some((c.pid(), c.uid()));
        }
    }
    // Without credentials (which SO_PASSCRED always adds) no sender can be placed.
    let (pid, uid) = sender.unwrap_or((0, u32::MAX));
    Ok(Some((msg.bytes, pid, uid)))
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

fn stat_of(s: &WireStat) -> FileStat {
    FileStat {
        dev: s.dev,
        ino: s.ino,
        size: s.size,
        mtime_ns: s.mtime_ns,
        ctime_ns: s.ctime_ns,
    }
}

fn decode(h: &Header, p: [&[u8]; 4]) -> Option<Event> {
    let (pid, ts_ns) = (h.pid, h.ts_ns);
    let path = || join_normalize(p[0], p[1]);
    let path2 = || join_normalize(p[2], p[3]);
    Some(match Kind::from_u16(h.kind)? {
        Kind::Exec => {
            let (stdio, pipes) = crate::event::split_stdio(roar_wire::decode_stdio(p[3]));
            Event::Exec {
                pid,
                ppid: h.arg as i32,
                cwd: PathBuf::from(OsString::from_vec(p[0].to_vec())),
                exe: PathBuf::from(OsString::from_vec(p[1].to_vec())),
                argv: roar_store::argv_from_blob(p[2]),
                stdio,
                pipes,
                ts_ns,
            }
        }
        Kind::Fork => Event::Fork {
            pid,
            ppid: h.arg as i32,
            ts_ns,
        },
        Kind::Exit => Event::Exit { pid, ts_ns },
        Kind::Open => Event::Open {
            pid,
            path: path(),
            flags: h.arg as i32,
            stat: Some(stat_of(&h.stat)),
            ts_ns,
        },
        Kind::Rename => Event::Rename {
            pid,
            from: path(),
            to: path2(),
            ts_ns,
        },
        Kind::Link => Event::Link {
            pid,
            from: path(),
            to: path2(),
            ts_ns,
        },
        Kind::Unlink => Event::Unlink {
            pid,
            path: path(),
            ts_ns,
        },
        Kind::Truncate => Event::Truncate {
            pid,
            path: path(),
            ts_ns,
        },
        Kind::Mkdir => Event::Mkdir {
            pid,
            path: path(),
            ts_ns,
        },
        Kind::Rmdir => Event::Rmdir {
            pid,
            path: path(),
            ts_ns,
        },
        // A parent's word about its child (`Senders`), not an event.
        Kind::Spawned => return None,
        Kind::Exchange => Event::Exchange {
            pid,
            a: path(),
            b: path2(),
            ts_ns,
        },
        Kind::Symlink => Event::Symlink {
            pid,
            path: path(),
            ts_ns,
        },
        Kind::Untraced => Event::Untraced {
            pid,
            path: path(),
            why: match h.arg {
                2 => SETID,
                3 => crate::IO_URING,
                _ => STATIC,
            },
            ts_ns,
        },
    })
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

/// What a run's ring file holds past `from` (where its journal says roar stopped keeping; the
/// ring's own tail if it got further) and its late file: the events a `roar run` killed before
/// reading them left behind, in the order they were written, and how many could not be read.
pub fn left_behind(ring: &Path, from: u64) -> (Vec<Event>, usize) {
    let (mut events, mut malformed) = (Vec::new(), 0);
    if let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(ring)
    {
        read_ring(&file, from, &mut events, &mut malformed);
    }
    if let Ok(bytes) = std::fs::read(late_path(ring)) {
        let mut rest = bytes.as_slice();
        let mut late = Vec::new();
        while rest.len() >= 4 {
            let n = u32::from_le_bytes(rest[..4].try_into().expect("4")) as usize;
            let Some(body) = rest.get(4..4 + n) else {
                malformed += 1;
                break;
            };
            match Header::parse(body).and_then(|(h, parts)| decode(&h, parts)) {
                Some(ev) => late.push(ev),
                None => malformed += 1,
            }
            rest = &rest[4 + n..];
        }
        if !late.is_empty() {
            // Written by each process in its own order once the ring was full: merged by time.
            events.extend(late);
            events.sort_by_key(Event::ts_ns);
        }
    }
    (events, malformed)
}

fn read_ring(file: &std::fs::File, from: u64, events: &mut Vec<Event>, malformed: &mut usize) {
    use std::os::fd::AsRawFd;
    let Ok(meta) = file.metadata() else { return };
    let len = meta.len() as usize;
    if len <= ring::HEADER_SIZE {
        return;
    }
    // SAFETY: a shared mapping of the whole file, unmapped below; the ring is only read.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return;
    }
    // SAFETY: the mapping is `len` bytes; attach checks the header.
    if let Some(r) = unsafe { Ring::attach(base.cast(), len) } {
        let mut pos = from.max(r.tail());
        loop {
            match r.at(pos) {
                Next::Event { bytes, len } => {
                    match Header::parse(bytes).and_then(|(h, parts)| decode(&h, parts)) {
                        Some(ev) => events.push(ev),
                        None => *malformed += 1,
                    }
                    pos += len;
                }
                Next::Pad { len } => pos += len,
                // A slot its producer never finished (killed in it): nothing after it can be
                // found in order.
                Next::Pending { .. } => {
                    *malformed += 1;
                    break;
                }
                Next::Empty => break,
            }
        }
    }
    // SAFETY: our mapping.
    unsafe { libc::munmap(base, len) };
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
