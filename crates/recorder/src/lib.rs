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
use std::os::unix::net::{SocketAddr, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::socket::{self, sockopt};
use roar_store::job_bytes::{self, Bytes};
use roar_store::{CacheEntry, JobRecord};

use roar_env::wanted::Wanted;

mod server;

pub use server::serve;

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
