//! The run's shared-memory event ring on roar's side: mapped (a file in /dev/shm beside the
//! journal, or a memfd), drained while the command runs with the receiver asleep on the ring's
//! futex word, and read back after a crash from the ring file and its late file.

use super::*;

/// Default size of the event ring in KiB (~100k events of typical size); `ROAR_PRELOAD_RING_KB`
/// overrides. Producers wait (never drop) when it is full, so the size only bounds how far roar
/// may lag behind the program.
pub(super) const RING_KB: u64 = 16 * 1024;
/// How long the receiver sleeps on the ring when no producer wakes it (they do once an eighth of
/// the ring is unread, or it is full): smaller batches reach roar, and early hashing, at most
/// this late. Polling instead (every millisecond, until 2026-11-24) cost ~1,000 wake-ups and
/// ~3 % of a CPU per second of the run.
pub(super) const RING_TIMER: Duration = Duration::from_millis(20);
/// While datagrams flow (processes without the ring, events too big for it) the socket is watched
/// instead, at this interval for the ring: each datagram wakes the receiver at once.
pub(super) const SOCKET_POLL: Duration = Duration::from_millis(1);
/// How long a marked slot may stay uncommitted before roar checks whether its producer died.
pub(super) const STUCK: Duration = Duration::from_millis(100);
/// How long a reserved slot may stay unmarked before roar takes it back (see `drain_ring`): a
/// producer takes a few instructions between reserving and marking.
pub(super) const STUCK_UNMARKED: Duration = Duration::from_secs(2);

/// The run's ring: a file roar maps and every shim maps again. With a journal it is a file of its
/// own (in /dev/shm, else beside the job's journal), which outlives roar: what the shims wrote into it and roar had not read yet
/// is recovered from it. Without one, a memfd shims reach through /proc/<roar>/fd/<fd>.
pub(super) struct RingMap {
    pub(super) fd: libc::c_int,
    pub(super) base: *mut libc::c_void,
    pub(super) len: usize,
    pub(super) ring: Ring,
    /// The ring's file, when it has a name.
    pub(super) path: Option<PathBuf>,
}

impl RingMap {
    /// What the shim is told (`ROAR_INTERNAL_RING`): the file, or roar's pid and fd.
    pub(super) fn env_value(&self) -> OsString {
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
pub(super) fn make_late(ring: &Path) -> std::io::Result<()> {
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

pub(super) const RING_SIZE_ENV: &str = "ROAR_PRELOAD_RING_KB";

pub(super) fn ring_capacity() -> Result<u64, TraceError> {
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

pub(super) fn map_ring(capacity: u64, path: Option<&Path>) -> std::io::Result<RingMap> {
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
pub(super) fn drain_ring(
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
pub(super) enum Stop {
    Empty,
    Pending(i32),
}

pub(super) fn other_kind(n: &Next<'_>) -> Stop {
    match n {
        Next::Pending { pid } => Stop::Pending(*pid),
        _ => Stop::Empty,
    }
}

/// Sleeps until the futex word at `word` (in the shared ring mapping) no longer holds `seen`, it is
/// woken, or `timeout` passes.
pub(super) fn futex_wait(word: *const u32, seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a word of our live mapping with a valid relative timeout.
    unsafe { libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAIT, seen, &ts) };
}

pub(super) fn futex_wake(word: *const u32) {
    // SAFETY: FUTEX_WAKE on a word of our live mapping.
    unsafe { libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAKE, i32::MAX) };
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

pub(super) fn read_ring(
    file: &std::fs::File,
    from: u64,
    events: &mut Vec<Event>,
    malformed: &mut usize,
) {
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
