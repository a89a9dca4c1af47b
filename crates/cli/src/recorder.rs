//! The resident recorder: a process per store and user that keeps the store open and writes the
//! jobs of `roar run`, so a run does not open SQLite (read the schema, replay the WAL, set up its
//! page cache: ~2 ms of CPU on a writer thread beside the command, on two cores) for the two
//! rows of a short job.
//!
//! The first `roar run` of a store records its own job itself, then starts it (`roar __recorder
//! DB`, detached: its own session, cwd `/`, no terminal, stdio on /dev/null, not a child of the
//! run; started once the command is done, never while the run reaps what its command left);
//! later runs connect. It listens on an abstract unix socket named after the user, the
//! roar binary (device, inode, mtime and size of /proc/self/exe: a rebuilt roar never talks to an
//! old recorder, whose byte format may differ) and the store (device and inode of roar.db). Only a
//! peer of its own uid in its own mount namespace is served, and a run only trusts a recorder of
//! its own uid.
//!
//! A run's connection carries two requests, each answered once committed: `begin` (the job's
//! `running` row, naming the run as its recorder, so a killed run's job reads `killed`) and
//! `record` (the whole job, [`roar_store::job_bytes`]). Between them, as soon as the command has
//! ended, an unanswered `wanted`: what the job's packages are found from, looked up while the run
//! finishes the record; the record carries it again and the lookup is used only if it matches.
//! A run that cannot reach the recorder, gets no answer or an error records the job itself, into
//! the row `begin` made when it has its id: the recorder is a shortcut, never the only way into
//! the store.
//!
//! It exits after `ROAR_RECORDER_IDLE_SECS` (default 300) without a connection, or within a second
//! of its store being deleted or replaced. It rereads the project's `[redact]` rules when
//! config.toml changes. `ROAR_RECORDER=0` makes every run record its own job.

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{self, sockopt};
use roar_env::Cache;
use roar_store::job_bytes::{self, Bytes};
use roar_store::{CacheEntry, Checkpoints, Committer, JobRecord, Runtime, StoreError};

use crate::environment::{self, Wanted};

/// The hidden first argument that makes `roar` the recorder (checked before any other parsing).
pub const ARG: &str = "__recorder";
const ENV: &str = "ROAR_RECORDER";
const IDLE_ENV: &str = "ROAR_RECORDER_IDLE_SECS";
const IDLE_DEFAULT: u64 = 300;
/// How often the recorder checks its store is still there and whether it has been idle long
/// enough.
const TICK: Duration = Duration::from_secs(1);
/// How long a run waits for an answer: a commit behind another writer's transaction (the mount's,
/// a big job's) can take a while; past this the run records its job itself.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// Frames past this are refused (a job of millions of files is recorded by its run directly).
const MAX_FRAME: u32 = 1 << 30;

const BEGIN: u8 = 1;
const RECORD: u8 = 2;
/// What the job's packages are found from, ahead of the record (no answer).
const WANTED: u8 = 3;
const ID: u8 = 1;
const FAILED: u8 = 2;

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The recorder's address for the store of identity `store` ([`identity`]), by this binary and
/// this user.
fn address((dev, ino): (u64, u64)) -> io::Result<SocketAddr> {
    let exe = std::fs::metadata("/proc/self/exe")?;
    let name = format!(
        "roar-recorder-{}-{:x}.{:x}.{:x}.{:x}-{:x}.{:x}",
        euid(),
        exe.dev(),
        exe.ino(),
        exe.mtime_nsec() + exe.mtime() * 1_000_000_000,
        exe.size(),
        dev,
        ino,
    );
    SocketAddr::from_abstract_name(name.as_bytes())
}

fn peer(s: &impl AsFd) -> io::Result<(u32, i32)> {
    let cred = socket::getsockopt(s, sockopt::PeerCredentials)?;
    Ok((cred.uid(), cred.pid()))
}

fn send(conn: &mut UnixStream, kind: u8, payload: &[&[u8]]) -> io::Result<()> {
    let len: usize = 1 + payload.iter().map(|p| p.len()).sum::<usize>();
    let len = u32::try_from(len)
        .ok()
        .filter(|&l| l <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "record too large"))?;
    let mut frame = Vec::with_capacity(len as usize + 4);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.push(kind);
    for p in payload {
        frame.extend_from_slice(p);
    }
    conn.write_all(&frame)
}

/// One frame: its kind and payload; None at a clean end of the stream.
fn receive(conn: &mut UnixStream) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut len = [0u8; 4];
    match conn.read_exact(&mut len) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        r => r?,
    }
    let len = u32::from_le_bytes(len);
    if len == 0 || len > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "bad frame"));
    }
    let mut body = vec![0u8; len as usize];
    conn.read_exact(&mut body)?;
    let kind = body.remove(0);
    Ok(Some((kind, body)))
}

/// An answer: the row's id, or why there is none.
fn answer(conn: &mut UnixStream) -> Result<i64, String> {
    match receive(conn) {
        Ok(Some((ID, id))) if id.len() == 8 => Ok(i64::from_le_bytes(id.try_into().expect("8"))),
        Ok(Some((FAILED, why))) => Err(String::from_utf8_lossy(&why).into_owned()),
        Ok(Some(_)) => Err("an answer of an unknown kind".into()),
        Ok(None) => Err("the recorder closed the connection".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A run's connection to the recorder.
pub struct Recorder {
    conn: UnixStream,
    /// A `begin` was sent and its answer not read yet.
    begun: bool,
    /// The store the recorder writes, and its identity when this run connected: a run that
    /// records its job itself uses the recorder's running row only in that same store.
    db: PathBuf,
    store: (u64, u64),
}

/// The device and inode of the store at `db`.
fn identity(db: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(db).ok().map(|m| (m.dev(), m.ino()))
}

/// What a run reached of its store's recorder.
pub enum Reached {
    Serving(Recorder),
    /// None serves the store: the run records its job itself, then starts one for the next run
    /// ([`start_for`], once its command is done).
    Absent,
    /// One is not to be used (`ROAR_RECORDER=0`, a socket of another user, no store).
    Unused,
}

impl Recorder {
    /// The recorder of the store at `db`, if one serves it. Never fails: anything but
    /// [`Reached::Serving`] means "record it yourself".
    pub fn connect(db: &Path) -> Reached {
        if std::env::var_os(ENV).is_some_and(|v| v == "0") {
            return Reached::Unused;
        }
        let Some(store) = identity(db) else {
            return Reached::Unused;
        };
        let addr = match address(store) {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!("no recorder: {e}");
                return Reached::Unused;
            }
        };
        match UnixStream::connect_addr(&addr) {
            Ok(conn) => {
                match peer(&conn) {
                    Ok((uid, _)) if uid == euid() => {}
                    _ => {
                        tracing::debug!("the recorder's socket belongs to another user: not used");
                        return Reached::Unused;
                    }
                }
                if conn.set_read_timeout(Some(ANSWER_WITHIN)).is_err() {
                    return Reached::Unused;
                }
                Reached::Serving(Recorder {
                    conn,
                    begun: false,
                    db: db.to_owned(),
                    store,
                })
            }
            Err(e) => {
                tracing::debug!("no recorder ({e})");
                Reached::Absent
            }
        }
    }

    /// Asks for the job's `running` row, naming this process as its recorder; the answer is read
    /// by [`Recorder::record`].
    pub fn begin(&mut self, header: &JobRecord) -> io::Result<()> {
        let me = roar_store::recorder_id();
        let len = (me.len() as u32).to_le_bytes();
        send(
            &mut self.conn,
            BEGIN,
            &[&len, me.as_bytes(), &job_bytes::encode(header)],
        )?;
        self.begun = true;
        Ok(())
    }

    /// Sends what the job's packages are found from, for the recorder to look them up before
    /// the record arrives. Best effort, unanswered: the record carries it again, and a recorder
    /// that did not get it (or got other evidence) looks them up then.
    pub fn wanted(&mut self, wanted: &Wanted) {
        let mut bytes = Vec::new();
        wanted.put(&mut bytes);
        let _ = send(&mut self.conn, WANTED, &[&bytes]);
    }

    /// Records the job (into the row `begin` made) and returns its id once committed. On failure,
    /// the id of the row `begin` made, if it was made, for the caller to record the job into.
    pub fn record(
        mut self,
        job: &JobRecord,
        cache: &[CacheEntry],
        wanted: &Wanted,
    ) -> Result<i64, (Option<i64>, String)> {
        let begun = if self.begun {
            match answer(&mut self.conn) {
                Ok(id) => Some(id),
                Err(why) => return Err((None, format!("no running row: {why}"))),
            }
        } else {
            None
        };
        let mut bytes = job_bytes::encode_with_cache(job, cache);
        wanted.put(&mut bytes);
        let recorded = match send(&mut self.conn, RECORD, &[&bytes]) {
            Ok(()) => answer(&mut self.conn),
            Err(e) => Err(format!("cannot send the job: {e}")),
        };
        // The running row is in the store the run connected for, not in one put in its place.
        recorded.map_err(|why| {
            (
                begun.filter(|_| identity(&self.db) == Some(self.store)),
                why,
            )
        })
    }

    /// The id of the row `begin` made (waiting for it), for a job that is not sent here after all.
    pub fn begun(mut self) -> Option<i64> {
        self.begun
            .then(|| answer(&mut self.conn).ok())
            .flatten()
            .filter(|_| identity(&self.db) == Some(self.store))
    }
}

/// Why no recorder should be started from this process: a resident child would be waited for,
/// or would hold open a store it cannot write (a read-only mount that would then be busy).
fn why_not_start(db: &Path) -> Option<String> {
    if let Err(e) = nix::unistd::access(db, nix::unistd::AccessFlags::W_OK) {
        return Some(format!("the store cannot be written ({e})"));
    }
    // Under a tracer (`strace -f roar run ...`), which follows and waits for every descendant.
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let tracer = status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .map(str::trim);
    if tracer.is_some_and(|t| t != "0") {
        return Some("roar itself is being traced".into());
    }
    // Inside another roar, which waits for every process its command leaves.
    roar_tracer::inside_roar()
}

/// Starts a recorder for the store at `db`, unless this process should not ([`why_not_start`]).
/// Called once the run's command is done: a process started while the run reaps what its command
/// left would be reparented to the run (a subreaper) and waited for as one of them.
pub fn start_for(db: &Path) {
    match why_not_start(db) {
        Some(why) => tracing::debug!("not starting a recorder: {why}"),
        None => start(db),
    }
}

/// Starts a recorder for the store at `db` and returns at once. The recorder is a grandchild:
/// the middle process exits at once, so it is not this run's child (a subreaper's orphan, it is
/// this run's only until the run exits, and never waited for).
fn start(db: &Path) {
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut cmd = Command::new(exe);
    // A long-lived process keeps nothing of this run's environment but its own settings.
    cmd.arg0("roar-recorder")
        .arg(ARG)
        .arg(db)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // Its idle time and log, and where the package cache is (roar_env::cache::dir, else TMPDIR).
    for var in [
        IDLE_ENV,
        "ROAR_LOG",
        "HOME",
        "ROAR_CACHE_DIR",
        "XDG_CACHE_HOME",
        "TMPDIR",
    ] {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    match roar_tracer::detached(&mut cmd).spawn() {
        Ok(mut middle) => {
            let _ = middle.wait();
        }
        Err(e) => tracing::debug!("cannot start a recorder: {e}"),
    }
}

/// What the recorder serves from: the store's writer, remade when the redaction rules change.
/// Each run's thread commits through it itself (no writer thread to wake and wait for).
struct Shared {
    db: PathBuf,
    /// The store's device and inode when the recorder opened it.
    store: (u64, u64),
    /// Set when the store went away or changed schema: the recorder stops serving.
    done: std::sync::atomic::AtomicBool,
    config: PathBuf,
    writer: Mutex<(Option<Stamp>, Arc<Committer>)>,
    /// The user's package cache, open for as long as the recorder runs.
    packages: Mutex<Cache>,
    /// The machine as last found, and the host name it was found under: the package cache
    /// keeps it per boot (a recorder lives within one) and host name too, but asking it is a
    /// query per job.
    machine: Mutex<Option<(String, Runtime)>>,
    clients: AtomicUsize,
    last_seen: Mutex<Instant>,
}

/// What identifies a file's version for the recorder: changed, it is read again.
type Stamp = (u64, u64, i64, i64, u64);

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        m.size(),
    ))
}

impl Shared {
    /// Whether the store is still the one opened; if not, the recorder stops (the run records
    /// its job itself). Its schema is checked by each commit, under the write lock
    /// ([`Shared::failed`]).
    fn still_serving(&self) -> Result<(), String> {
        if identity(&self.db) == Some(self.store) {
            return Ok(());
        }
        self.done.store(true, Ordering::SeqCst);
        Err("the store was removed or replaced".into())
    }

    /// Why a write failed, for the run; a store a newer roar migrated stops the recorder (the
    /// run then records its job itself, and says what is wrong).
    fn failed(&self, e: StoreError) -> String {
        if matches!(e, StoreError::SchemaChanged { .. }) {
            self.done.store(true, Ordering::SeqCst);
        }
        format!("{:#}", anyhow::Error::from(e))
    }

    /// The machine the job ran on (CPU, memory, OS, GPUs): probed once per boot and host name.
    fn machine(&self, packages: &Cache) -> Runtime {
        // uname(2): one syscall, where /proc/sys/kernel/hostname is an open and a read.
        let host = nix::sys::utsname::uname()
            .ok()
            .map(|u| u.nodename().to_string_lossy().into_owned());
        let mut kept = self.machine.lock().unwrap_or_else(|p| p.into_inner());
        match (kept.as_ref(), host) {
            (Some((h, rt)), Some(host)) if *h == host => rt.clone(),
            (_, host) => {
                let rt = roar_env::machine(packages);
                *kept = host.map(|h| (h, rt.clone()));
                rt
            }
        }
    }

    /// The writer, with the redaction rules of config.toml as it is now.
    fn writer(&self) -> roar_store::Result<Arc<Committer>> {
        let now = stamp(&self.config);
        let mut slot = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if slot.0 != now {
            // A writer reads the rules when it opens; runs holding the old one finish with it.
            *slot = (
                now,
                Arc::new(Committer::open(&self.db, Checkpoints::Deferred)?),
            );
        }
        Ok(slot.1.clone())
    }
}

/// The recorder's main: `roar __recorder DB`. Returns the exit code.
pub fn serve(db: PathBuf) -> i32 {
    let idle = std::env::var(IDLE_ENV)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_secs(IDLE_DEFAULT), Duration::from_secs);
    let Some(store) = identity(&db) else {
        return 1;
    };
    if nix::unistd::access(&db, nix::unistd::AccessFlags::W_OK).is_err() {
        return 1;
    }
    let listener = match address(store).and_then(|a| UnixListener::bind_addr(&a)) {
        Ok(l) => l,
        // Another recorder won the race for this store.
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => return 0,
        Err(_) => return 1,
    };
    let config = db.with_file_name(roar_store::CONFIG_NAME);
    // Opening migrates the store if it is older than this roar: the writer expects its schema.
    let opened =
        roar_store::open(&db, false).and_then(|_| Committer::open(&db, Checkpoints::Deferred));
    let writer = match opened {
        Ok(w) => Arc::new(w),
        Err(e) => {
            tracing::warn!("the recorder cannot open {}: {e}", db.display());
            return 1;
        }
    };
    let shared = Arc::new(Shared {
        store,
        done: std::sync::atomic::AtomicBool::new(false),
        writer: Mutex::new((stamp(&config), writer)),
        packages: Mutex::new(Cache::open()),
        machine: Mutex::new(None),
        db,
        config,
        clients: AtomicUsize::new(0),
        last_seen: Mutex::new(Instant::now()),
    });
    let my_ns = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut poll = [libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&listener),
        events: libc::POLLIN,
        revents: 0,
    }];
    loop {
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(poll.as_mut_ptr(), 1, TICK.as_millis() as i32) };
        if ready > 0 {
            if let Ok((conn, _)) = listener.accept() {
                let ok = match peer(&conn) {
                    // The peer must see the same files as the recorder (a run in another mount
                    // namespace records its own job).
                    Ok((uid, pid)) => {
                        uid == euid()
                            && std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok() == my_ns
                    }
                    Err(_) => false,
                };
                if ok {
                    shared.clients.fetch_add(1, Ordering::SeqCst);
                    let for_run = shared.clone();
                    let spawned = std::thread::Builder::new()
                        .name("roar-recorder-run".into())
                        .spawn(move || {
                            serve_run(conn, &for_run);
                            *for_run.last_seen.lock().unwrap_or_else(|p| p.into_inner()) =
                                Instant::now();
                            for_run.clients.fetch_sub(1, Ordering::SeqCst);
                        });
                    if spawned.is_err() {
                        shared.clients.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }
            continue;
        }
        // The store deleted (`rm -rf .roar`, a test's directory) or replaced: nothing to serve.
        let here = std::fs::metadata(&shared.db).ok();
        if here.is_none_or(|m| (m.dev(), m.ino()) != store || m.nlink() == 0)
            || shared.done.load(Ordering::SeqCst)
        {
            break;
        }
        let quiet = shared
            .last_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed();
        if shared.clients.load(Ordering::SeqCst) == 0 && quiet >= idle {
            break;
        }
    }
    // No new run can connect; the runs still connected finish (their threads hold the writer).
    drop(listener);
    while shared.clients.load(Ordering::SeqCst) > 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    0
}

/// Packages and machine found ahead of a record, for the evidence they were found from.
struct Found {
    wanted: Vec<u8>,
    packages: Vec<roar_store::Package>,
    runtime: Option<Runtime>,
}

/// One run's requests: `begin`, then `wanted` (optional), then `record`.
fn serve_run(mut conn: UnixStream, shared: &Shared) {
    let mut begun: Option<i64> = None;
    let mut found: Option<Found> = None;
    while let Ok(Some((kind, body))) = receive(&mut conn) {
        let result = match kind {
            BEGIN => begin(&body, shared).inspect(|id| begun = Some(*id)),
            WANTED => {
                found = find(body, shared);
                continue;
            }
            RECORD => record(&body, begun.take(), found.take(), shared),
            _ => return,
        };
        let sent = match result {
            Ok(id) => send(&mut conn, ID, &[&id.to_le_bytes()]),
            Err(why) => send(&mut conn, FAILED, &[why.as_bytes()]),
        };
        if sent.is_err() {
            return;
        }
    }
}

fn begin(body: &[u8], shared: &Shared) -> Result<i64, String> {
    shared.still_serving()?;
    let (len, rest) = body.split_at_checked(4).ok_or("short begin")?;
    let len = u32::from_le_bytes(len.try_into().expect("4")) as usize;
    let (who, job) = rest.split_at_checked(len).ok_or("short begin")?;
    let who = String::from_utf8(who.to_vec()).map_err(|_| "bad recorder id")?;
    let job = job_bytes::decode(job).map_err(|e| e.to_string())?;
    let writer = shared.writer().map_err(|e| e.to_string())?;
    writer
        .begin_job_for(&job, who)
        .map_err(|e| shared.failed(e))
}

/// The packages and the machine for the evidence in `body` (a `wanted` frame); None if it is
/// malformed (the record then brings it again).
fn find(body: Vec<u8>, shared: &Shared) -> Option<Found> {
    let mut input = &body[..];
    let wanted = Wanted::get(&mut input).ok().filter(|_| input.is_empty())?;
    let (packages, runtime) = resolve(&wanted, shared);
    Some(Found {
        wanted: body,
        packages,
        runtime,
    })
}

/// The packages `wanted` finds and the machine ([`environment::resolve`]), from the recorder's
/// package cache and machine.
fn resolve(wanted: &Wanted, shared: &Shared) -> (Vec<roar_store::Package>, Option<Runtime>) {
    let mut packages = shared.packages.lock().unwrap_or_else(|p| p.into_inner());
    // The machine: kept per host name (a recorder lives within one boot).
    let machine = shared.machine(&packages);
    let mut env = roar_store::Environment::default();
    environment::resolve(&mut env, wanted, &mut packages, &machine);
    (env.packages, env.runtime)
}

/// Puts the packages and the machine into `env`: those found ahead of the record if they were
/// found from the same evidence (`wanted`, as the record carries it), else what `resolve` finds
/// now.
fn complete(
    env: &mut roar_store::Environment,
    wanted: &[u8],
    found: Option<Found>,
    resolve: impl FnOnce() -> (Vec<roar_store::Package>, Option<Runtime>),
) {
    (env.packages, env.runtime) = match found.filter(|f| f.wanted == wanted) {
        Some(f) => (f.packages, f.runtime),
        None => resolve(),
    };
}

fn record(
    body: &[u8],
    begun: Option<i64>,
    found: Option<Found>,
    shared: &Shared,
) -> Result<i64, String> {
    let mut input = body;
    let (mut job, cache, wanted, wanted_bytes) = (|| {
        let job = JobRecord::get(&mut input)?;
        let cache = Vec::<CacheEntry>::get(&mut input)?;
        let rest = input;
        let wanted = Wanted::get(&mut input)?;
        let wanted_bytes = &rest[..rest.len() - input.len()];
        Ok::<_, job_bytes::Malformed>((job, cache, wanted, wanted_bytes))
    })()
    .map_err(|e| e.to_string())?;
    if !input.is_empty() {
        return Err("trailing bytes after the job".into());
    }
    shared.still_serving()?;
    // A job whose command never started has no environment to complete.
    if let Some(env) = job.environment.as_mut() {
        complete(env, wanted_bytes, found, || resolve(&wanted, shared));
    }
    let writer = shared.writer().map_err(|e| e.to_string())?;
    writer
        .record(begun, &cache, job)
        .map_err(|e| shared.failed(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn package(name: &str) -> roar_store::Package {
        roar_store::Package {
            kind: "dpkg".into(),
            name: name.into(),
            version: "1".into(),
            installer: None,
            location: None,
            commit: None,
        }
    }

    /// Packages found ahead of the record are used only for the evidence they were found from;
    /// for other evidence (or none sent ahead) they are looked up again.
    #[test]
    fn packages_found_ahead_are_used_only_for_the_same_evidence() {
        let wanted = |files: &[&str]| {
            let mut b = Vec::new();
            Wanted {
                packages: true,
                files: files.iter().map(PathBuf::from).collect(),
                ..Default::default()
            }
            .put(&mut b);
            b
        };
        let ahead = || Found {
            wanted: wanted(&["/usr/lib/libc.so.6"]),
            packages: vec![package("ahead")],
            runtime: None,
        };
        let now = || (vec![package("now")], None);
        let names = |env: &roar_store::Environment| {
            env.packages
                .iter()
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
        };
        let mut env = roar_store::Environment::default();
        complete(
            &mut env,
            &wanted(&["/usr/lib/libc.so.6"]),
            Some(ahead()),
            || panic!("looked up again for the same evidence"),
        );
        assert_eq!(names(&env), ["ahead"]);
        complete(
            &mut env,
            &wanted(&["/usr/lib/libm.so.6"]),
            Some(ahead()),
            now,
        );
        assert_eq!(names(&env), ["now"]);
        complete(&mut env, &wanted(&["/usr/lib/libc.so.6"]), None, now);
        assert_eq!(names(&env), ["now"]);
    }
}
