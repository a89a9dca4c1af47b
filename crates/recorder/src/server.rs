//! The recorder process itself (`roar __recorder DB`): it accepts runs' connections and commits
//! their jobs through the store's writer, completing each environment from its package cache.
#![allow(unsafe_code)]

use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roar_env::Cache;
use roar_store::job_bytes::{self, Bytes};
use roar_store::{CacheEntry, Checkpoints, Committer, JobRecord, Runtime, StoreError};

use super::{
    address, euid, identity, peer, receive, send, BEGIN, FAILED, ID, IDLE_DEFAULT, IDLE_ENV,
    RECORD, TICK, WANTED,
};
use roar_env::wanted::{self, Wanted};

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
        roar_store::error_chain(&e)
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

/// The packages `wanted` finds and the machine ([`wanted::resolve`]), from the recorder's
/// package cache and machine.
fn resolve(wanted: &Wanted, shared: &Shared) -> (Vec<roar_store::Package>, Option<Runtime>) {
    let mut packages = shared.packages.lock().unwrap_or_else(|p| p.into_inner());
    // The machine: kept per host name (a recorder lives within one boot).
    let machine = shared.machine(&packages);
    let mut env = roar_store::Environment::default();
    wanted::resolve(&mut env, wanted, &mut packages, &machine);
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
