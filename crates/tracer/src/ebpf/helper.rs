//! The resident helper: keeps the eBPF programs loaded between runs, so a run does not pay the
//! ~45 ms of loading and verifying them.
//!
//! The first `roar run --tracer ebpf` starts it (`roar __ebpf-helper`, detached: its own session,
//! cwd `/`, no terminal, not a child of the run). It listens on an abstract unix socket named after
//! the programs' build and the ring size, so a rebuilt roar never talks to an old helper. For each
//! run that connects it hands out a free slot with a new generation, the slot's ring buffer and
//! the maps' fds; the connection is the run's lease: when it closes after the run said `done`, the
//! slot's generation is cleared, so any process the run left behind reaches no run; when it closes
//! without (the run died), the helper follows the run's command into its journal first
//! (`takeover`). A slot's ring is made the first time the slot is used and kept: putting a ring
//! into the programs' map waits for an RCU grace period (~10 ms); records carry their run's
//! generation, so a run skips what an earlier run of its slot left unread. The programs are attached only while some run holds a slot
//! and for a second after the last one (attaching takes ~0.6 ms): otherwise no syscall on the
//! machine passes through them (attached, they add ~0.3 µs to every syscall of every process).
//! The helper exits after `ROAR_EBPF_IDLE_SECS` (default 300) without a run. Only a peer with the helper's own uid is
//! served, and a run only trusts a helper with its own uid.
//!
//! A run falls back to loading the programs itself when `ROAR_EBPF_HELPER=0`, when it runs inside
//! another `roar` (that roar waits for every process its command leaves, and would wait for the
//! helper), or when the helper cannot be reached or has no free slot.
#![allow(unsafe_code)]

use std::collections::HashSet;
use std::io::{self, BufRead, BufReader, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{self, sockopt, ControlMessage, ControlMessageOwned, MsgFlags};

use libbpf_rs::{MapHandle, MapInfo, MapType};

use super::maps::{put_ring, Maps, RunKey, MAX_RUNS};
use super::{attach, load, new_ring, ring_kb, unavailable};
use crate::from_proc::inside_roar;
use crate::TraceError;

/// The hidden first argument that makes `roar` the helper (checked before any other parsing).
pub const HELPER_ARG: &str = "__ebpf-helper";
const HELPER_ENV: &str = "ROAR_EBPF_HELPER";
const IDLE_ENV: &str = "ROAR_EBPF_IDLE_SECS";
const IDLE_DEFAULT: u64 = 300;
/// How long the programs stay attached after the last run: back-to-back runs (a pipeline of
/// `roar run` steps) do not attach and detach each time.
const LINGER: Duration = Duration::from_secs(1);
/// How long a run waits for a helper to answer (loading the programs takes ~50 ms).
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
const MAGIC: u32 = 0x5241_4f52; // "ROAR"
const REFUSED: u32 = u32::MAX;

/// A run's lease on the helper's programs.
pub(super) struct Lease {
    pub maps: Maps,
    pub key: RunKey,
    /// The ring at the run's slot.
    pub ring: MapHandle,
    /// Closed by the helper only if it dies: the run then lost events.
    pub conn: UnixStream,
}

/// What a run and its helper say to each other: a helper that speaks another version is not
/// reached (a run that tells its journal would not be followed by an older helper).
const PROTOCOL: u32 = 2;

fn socket_name(ring_kb: u32) -> String {
    format!(
        "roar-ebpf-{}-{}-p{PROTOCOL}-{ring_kb}k",
        env!("CARGO_PKG_VERSION"),
        env!("ROAR_BPF_ID")
    )
}

fn address(ring_kb: u32) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(socket_name(ring_kb).as_bytes())
}

fn peer_uid(s: &impl AsFd) -> io::Result<u32> {
    Ok(socket::getsockopt(s, sockopt::PeerCredentials)?.uid())
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// A lease from the running helper, starting one if none runs. `Ok(None)`: load the programs in
/// this process instead (the reason is in the debug log). An error is what loading here would
/// also fail with (the helper could not load the programs).
pub(super) fn lease(ring_kb: u32) -> Result<Option<Lease>, TraceError> {
    if std::env::var_os(HELPER_ENV).is_some_and(|v| v == "0") {
        return Ok(None);
    }
    let addr = address(ring_kb).map_err(|source| TraceError::Socket { source })?;
    for attempt in 0..3 {
        match UnixStream::connect_addr(&addr) {
            Ok(conn) => match receive(conn, ring_kb) {
                Ok(Some(lease)) => return Ok(Some(lease)),
                Ok(None) => return Ok(None),
                Err(e) => tracing::debug!("the eBPF helper did not answer: {e}"),
            },
            Err(e) if attempt == 0 => {
                tracing::debug!("no eBPF helper ({e})");
                if let Some(why) = inside_roar() {
                    tracing::debug!("not starting the eBPF helper: {why}");
                    return Ok(None);
                }
                start(ring_kb)?;
            }
            Err(e) => tracing::debug!("cannot reach the eBPF helper: {e}"),
        }
    }
    Ok(None)
}

/// Reads the helper's answer: a grant with three map fds, or a refusal with its reason.
fn receive(conn: UnixStream, ring_kb: u32) -> io::Result<Option<Lease>> {
    if peer_uid(&conn)? != euid() {
        tracing::debug!("the eBPF helper's socket belongs to another user: not used");
        return Ok(None);
    }
    conn.set_read_timeout(Some(ANSWER_WITHIN))?;
    let mut head = [0u8; 512];
    let mut cmsg = nix::cmsg_space!([RawFd; 3]);
    let mut iov = [IoSliceMut::new(&mut head)];
    let msg = socket::recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(got) = c {
            // SAFETY: the kernel just installed these fds for us; nothing else owns them.
            fds.extend(
                got.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let n = msg.bytes;
    let word = |i: usize| u32::from_le_bytes(head[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    if n < 12 || word(0) != MAGIC {
        return Err(io::Error::other("a malformed answer"));
    }
    if word(1) == REFUSED {
        tracing::debug!(
            "the eBPF helper has no slot for this run: {}",
            String::from_utf8_lossy(&head[8..n])
        );
        return Ok(None);
    }
    let [tracked, runs, ring]: [OwnedFd; 3] = fds
        .try_into()
        .map_err(|_| io::Error::other("an answer without its three maps"))?;
    // libbpf-rs reads a ring only through a map handle it opened, which takes the map's id.
    let info = MapInfo::new(ring.as_fd()).map_err(io::Error::other)?;
    if info.map_type() != MapType::RingBuf || info.info.max_entries != ring_kb * 1024 {
        return Err(io::Error::other(
            "the ring handed over is not this run's kind",
        ));
    }
    let ring = MapHandle::from_map_id(info.info.id).map_err(io::Error::other)?;
    conn.set_read_timeout(None)?;
    Ok(Some(Lease {
        maps: Maps { tracked, runs },
        key: RunKey {
            slot: word(1),
            gen: word(2),
        },
        ring,
        conn,
    }))
}

/// Starts a helper and waits until it listens with the programs loaded (or says why it cannot).
/// The helper is a grandchild: the middle process exits at once, so the helper is nobody's child
/// that waits (this roar is not yet a subreaper).
fn start(ring_kb: u32) -> Result<(), TraceError> {
    let exe = std::env::current_exe().map_err(|source| TraceError::Socket { source })?;
    let mut cmd = Command::new(exe);
    // A long-lived process keeps nothing of this run's environment but its own settings.
    cmd.arg0("roar-ebpf-helper")
        .arg(HELPER_ARG)
        .env_clear()
        .env(super::RING_ENV, ring_kb.to_string())
        .current_dir("/");
    if let Some(idle) = std::env::var_os(IDLE_ENV) {
        cmd.env(IDLE_ENV, idle);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut middle = crate::launch::detached(&mut cmd)
        .spawn()
        .map_err(|source| TraceError::Socket { source })?;
    let out = middle.stdout.take().expect("piped");
    let _ = middle.wait();
    let mut line = String::new();
    let _ = BufReader::new(out).read_line(&mut line);
    match line.trim_end() {
        "ready" | "busy" => Ok(()),
        said => match said.strip_prefix("error: ") {
            Some(reason) => Err(unavailable(reason.to_owned())),
            // It died without a word: this run loads the programs itself.
            None => Ok(()),
        },
    }
}

/// A run holding a slot.
struct Client {
    conn: UnixStream,
    key: RunKey,
    /// Where its journal is, and whether it ended normally (`takeover`).
    told: super::takeover::Told,
}

/// The helper's main: `roar __ebpf-helper`. Says `ready`, `busy` (another helper has the socket)
/// or `error: REASON` on stdout, then serves until idle. Returns the exit code.
pub fn serve() -> i32 {
    let say = |what: &str| {
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "{what}");
        let _ = out.flush();
    };
    let fail = |e: String| say(&format!("error: {e}"));
    let Ok(ring_kb) = ring_kb().map_err(|e| fail(e.reason())) else {
        return 1;
    };
    let idle = std::env::var(IDLE_ENV)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_secs(IDLE_DEFAULT), Duration::from_secs);
    let listener = match address(ring_kb).and_then(|a| UnixListener::bind_addr(&a)) {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            say("busy");
            return 0;
        }
        Err(e) => {
            fail(format!("cannot listen for runs: {e}"));
            return 1;
        }
    };
    let mut obj = MaybeUninit::uninit();
    let Ok(skel) = load(&mut obj, ring_kb).map_err(|e| fail(e.reason())) else {
        return 1;
    };
    let Ok(maps) = super::maps_of(&skel).map_err(|e| fail(e.to_string())) else {
        return 1;
    };
    let mut rings: Vec<Option<MapHandle>> = (0..MAX_RUNS).map(|_| None).collect();
    // The first run's ring is made now: that run already waits for the load.
    if let Err(e) = ring_for(&skel, &mut rings, 0, ring_kb) {
        fail(e);
        return 1;
    }
    say("ready");
    stdout_to_null();
    let _ = listener.set_nonblocking(true);
    let mut gens = [0u32; MAX_RUNS as usize];
    let mut clients: Vec<Client> = Vec::new();
    // Slots of dead runs whose commands are still followed (`takeover`).
    let busy: Arc<Mutex<HashSet<u32>>> = Arc::default();
    // When the last run ended (or the helper started).
    let mut idle_since = Instant::now();
    // Attached while some run holds a slot, and for LINGER after the last one.
    let mut links = Vec::new();
    loop {
        let mut fds = poll_fds(&listener, &clients);
        let following = !busy.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
        if following {
            idle_since = Instant::now();
        }
        let timeout = if !clients.is_empty() {
            None
        } else if following {
            // Looked at again soon: the programs stay attached while a takeover lasts.
            Some(Duration::from_millis(200))
        } else {
            let wait = if links.is_empty() { idle } else { LINGER };
            Some(wait.saturating_sub(idle_since.elapsed()))
        };
        let timeout_ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: fds is a valid array of pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n < 0 {
            continue;
        }
        if n == 0 && clients.is_empty() && !following {
            if links.is_empty() {
                return 0;
            }
            links.clear();
            continue;
        }
        for (key, told) in hear(&mut clients, &fds[1..]) {
            end_lease(key, told, &maps, &rings, &busy);
        }
        if fds[0].revents != 0 {
            while let Ok((conn, _)) = listener.accept() {
                if !attached(&skel, &mut links, &conn) {
                    continue;
                }
                // Slots held by runs, and by dead runs whose commands are followed.
                let mut taken = busy.lock().unwrap_or_else(|p| p.into_inner()).clone();
                taken.extend(clients.iter().map(|c| c.key.slot));
                if let Some(c) = grant(conn, &skel, &maps, &mut rings, ring_kb, &mut gens, &taken) {
                    clients.push(c);
                }
            }
        }
        if clients.is_empty() && n > 0 {
            idle_since = Instant::now();
        }
    }
}

/// Attaches the programs if they are not (they are while some run holds a slot, and a while
/// after); false, with `conn` told why, if they cannot be.
fn attached(
    skel: &super::skel::RoarSkel<'_>,
    links: &mut Vec<libbpf_rs::Link>,
    conn: &UnixStream,
) -> bool {
    if links.is_empty() {
        match attach(skel) {
            Ok(l) => *links = l,
            Err(e) => {
                refuse(conn, &e.reason());
                return false;
            }
        }
    }
    true
}

/// What the helper waits on: new runs at the listener, then each run's connection.
fn poll_fds(listener: &UnixListener, clients: &[Client]) -> Vec<libc::pollfd> {
    std::iter::once(listener as &dyn AsRawFd)
        .chain(clients.iter().map(|c| &c.conn as &dyn AsRawFd))
        .map(|s| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect()
}

/// Nobody reads stdout once the helper has said it is ready; a write to it must not fail or
/// block.
fn stdout_to_null() {
    if let Ok(null) = std::fs::File::options().write(true).open("/dev/null") {
        // SAFETY: dup2 onto our own stdout.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
}

/// Reads what the runs whose connections `fds` (one per client, in order) found readable said.
/// A run's connection is readable when it says where its journal is, that it is done, or when
/// it closes: its lease ends. The leases that ended, taken out of `clients`.
fn hear(clients: &mut Vec<Client>, fds: &[libc::pollfd]) -> Vec<(RunKey, super::takeover::Told)> {
    let mut i = 0;
    let mut ended = Vec::new();
    clients.retain_mut(|c| {
        let readable = fds[i].revents != 0;
        i += 1;
        if !readable {
            return true;
        }
        let mut buf = [0u8; 8192];
        match (&c.conn).read(&mut buf) {
            Ok(n) if n > 0 => {
                c.told.read(&buf[..n]);
                true
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => true,
            _ => {
                ended.push((c.key, std::mem::take(&mut c.told)));
                false
            }
        }
    });
    ended
}

/// The ring at `slot`, made and put in place the first time.
fn ring_for<'r>(
    skel: &super::skel::RoarSkel<'_>,
    rings: &'r mut [Option<MapHandle>],
    slot: u32,
    ring_kb: u32,
) -> Result<&'r MapHandle, String> {
    let entry = &mut rings[slot as usize];
    if entry.is_none() {
        let ring = new_ring(ring_kb).map_err(TraceError::reason)?;
        put_ring(
            skel.maps.rings.as_fd().as_raw_fd(),
            slot,
            ring.as_fd().as_raw_fd(),
        )
        .map_err(|e| format!("cannot put a ring buffer in place: {e}"))?;
        *entry = Some(ring);
    }
    Ok(entry.as_ref().expect("just made"))
}

/// Hands `conn` a free slot with a new generation and the slot's ring, or refuses it.
fn grant(
    conn: UnixStream,
    skel: &super::skel::RoarSkel<'_>,
    maps: &Maps,
    rings: &mut [Option<MapHandle>],
    ring_kb: u32,
    gens: &mut [u32; MAX_RUNS as usize],
    taken: &HashSet<u32>,
) -> Option<Client> {
    if peer_uid(&conn).ok() != Some(euid()) {
        refuse(&conn, "only the helper's own user is served");
        return None;
    }
    let Some(slot) = (0..MAX_RUNS).find(|s| !taken.contains(s)) else {
        refuse(&conn, &format!("{MAX_RUNS} runs are already traced"));
        return None;
    };
    let ring = match ring_for(skel, rings, slot, ring_kb) {
        Ok(r) => r.as_fd().as_raw_fd(),
        Err(why) => {
            refuse(&conn, &why);
            return None;
        }
    };
    let gen = &mut gens[slot as usize];
    *gen = gen.wrapping_add(1).max(1);
    let key = RunKey { slot, gen: *gen };
    if let Err(e) = maps.open_run(key) {
        refuse(&conn, &format!("cannot open a run slot: {e}"));
        return None;
    }
    let mut head = Vec::with_capacity(12);
    for w in [MAGIC, slot, key.gen] {
        head.extend_from_slice(&w.to_le_bytes());
    }
    let fds = [maps.tracked.as_raw_fd(), maps.runs.as_raw_fd(), ring];
    let sent = socket::sendmsg::<()>(
        conn.as_raw_fd(),
        &[IoSlice::new(&head)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    );
    match sent {
        Ok(_) => Some(Client {
            conn,
            key,
            told: Default::default(),
        }),
        Err(_) => {
            maps.close_run(slot);
            None
        }
    }
}

/// A lease is over: the slot is closed, unless its run died without saying `done` and told
/// where its journal is, while its command may go on: then the slot is followed into the
/// journal until the command is over (`takeover`).
fn end_lease(
    key: RunKey,
    told: super::takeover::Told,
    maps: &Maps,
    rings: &[Option<MapHandle>],
    busy: &Arc<Mutex<HashSet<u32>>>,
) {
    let handles = || -> io::Result<(MapHandle, Maps)> {
        let ring = rings[key.slot as usize]
            .as_ref()
            .ok_or_else(|| io::Error::other("no ring at the slot"))?;
        Ok((
            super::takeover::handle(ring.as_fd())?,
            Maps {
                tracked: maps.tracked.try_clone()?,
                runs: maps.runs.try_clone()?,
            },
        ))
    };
    match told.journal {
        Some(journal) if !told.done => match handles() {
            Ok((ring, maps)) => super::takeover::start(ring, maps, key, journal, Arc::clone(busy)),
            Err(e) => {
                tracing::debug!("cannot follow a dead run's slot: {e}");
                maps.close_run(key.slot);
                journal.2.release();
            }
        },
        journal => {
            maps.close_run(key.slot);
            if let Some((_, _, claim)) = journal {
                claim.release();
            }
        }
    }
}

fn refuse(conn: &UnixStream, why: &str) {
    let mut msg = Vec::new();
    for w in [MAGIC, REFUSED] {
        msg.extend_from_slice(&w.to_le_bytes());
    }
    msg.extend_from_slice(why.as_bytes());
    let _ = socket::send(conn.as_raw_fd(), &msg, MsgFlags::MSG_NOSIGNAL);
}
