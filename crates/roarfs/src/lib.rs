//! roarfs: the filesystem behind `roar mount DIR`. Mounted in place over DIR, it serves DIR's
//! own contents (reached through an fd opened before the mount) and records, per job, every file
//! opened, written, renamed or deleted through it, with content hashes computed inline.
//!
//! - [`fs`]: the FUSE operations (a thin adapter), passthrough, inline hashing of writes.
//! - [`archive`]: `roar mount ARCHIVE... DIR`, archives as a read-only tree of members.
//! - [`inodes`]: the inode table (backing files by kernel file handle, stable inode numbers).
//! - [`content`]: what is known of backing files' content, and hashing them.
//! - [`jobs`]: which job an access belongs to, and each live job's files until it is recorded.
//! - [`sys`]: the fd-relative syscalls, file handles, creating as the caller.

pub mod archive;
pub mod content;
pub mod folder;
pub mod fs;
pub mod inodes;
pub mod jobs;
pub mod sys;

use roar_store::ignore::Ignore;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use fs::RoarFs;
pub use fuser::{RequestCount, SpinStats, Stats};
pub use jobs::{recover, Jobs, Steps};

/// Where the live jobs' journals go and what of a command line they may keep
/// (docs/SEMANTICS.md, "Crashes").
pub type Journals = Option<(PathBuf, roar_store::redact::Policy)>;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("cannot open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot mount roarfs on {path}")]
    Mount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] roar_store::StoreError),
}

/// A live mount: dropping it (or calling [`Mounted::unmount`]) unmounts and records every job.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    jobs: Arc<Jobs>,
    path: PathBuf,
    /// The mount's device, to unmount only while it is still the mount on top at `path`.
    dev: Option<u64>,
    how: &'static str,
    transport: &'static str,
    stats: fuser::Stats,
}

/// Which versions of the files jobs read and leave are kept (`[keep]`), and where: the rule
/// `roar run` keeps by.
pub struct Keep {
    pub objects: roar_store::objects::Objects,
    pub rule: Box<dyn roar_tracer::collect::KeepRule + Send>,
}

/// Mounts roarfs in place over `dir`, recording into the store at `db`; paths `ignore` matches
/// are never inputs or outputs (the rule `roar run` applies). `machine` is recorded with every
/// job (the mount sees no packages: only its own files); `steps` cuts jobs into steps; each live
/// job is kept in a journal in `journals`; the versions jobs read and leave are kept by `keep`.
pub fn mount(
    dir: &Path,
    db: &Path,
    ignore: Ignore,
    machine: Option<roar_store::Runtime>,
    steps: roar_tracer::steps::Rule,
    journals: Journals,
    keep: Option<Keep>,
) -> Result<Mounted, MountError> {
    let root_fd: OwnedFd = std::fs::File::open(dir)
        .and_then(|f| sys::open_path(std::os::fd::AsFd::as_fd(&f), ".".as_ref()))
        .map_err(|source| MountError::Open {
            path: dir.to_owned(),
            source,
        })?;
    // The daemon needs a descriptor per open file and per request in flight, never one per
    // known inode; a high soft limit only makes room for many open files.
    if let Err(e) = sys::raise_fd_limit() {
        tracing::warn!("roarfs: cannot raise the open-file limit: {e}");
    }
    let writer = roar_store::Writer::start(db)?;
    let jobs = Arc::new(
        Jobs::new(writer, ignore)
            .with_machine(machine)
            .with_steps(steps)
            .with_journals(journals, dir),
    );
    jobs.watch_exits();
    let fs =
        RoarFs::new(root_fd, dir.to_owned(), jobs.clone(), Some(db), keep).map_err(|source| {
            MountError::Open {
                path: dir.to_owned(),
                source,
            }
        })?;
    let how = fs.inodes().scheme().name();
    let uring = fs.uring();
    let (session, stats) = spawn(fs, dir, false)?;
    let transport = if uring.load(std::sync::atomic::Ordering::Relaxed) {
        "io_uring"
    } else {
        "dev-fuse"
    };
    let dev = sys::top_mount_dev(dir);
    match dev {
        Some(dev) => jobs.set_mount(dev, dir.to_owned()),
        None => tracing::warn!(
            "roarfs: {} is not in /proc/self/mountinfo: a shell's redirections stay in its step",
            dir.display()
        ),
    }
    Ok(Mounted {
        session: Some(session),
        jobs,
        path: dir.to_owned(),
        dev,
        how,
        transport,
        stats,
    })
}

/// Mounts the indexed archives read-only on `dir` as one tree (later archives win where paths
/// collide; an archive found inside another is a directory where its member was), recording
/// member reads into the store at `db`.
pub fn mount_archives(
    sources: Vec<archive::Layer>,
    dir: &Path,
    db: &Path,
    ignore: Ignore,
    machine: Option<roar_store::Runtime>,
    journals: Journals,
) -> Result<Mounted, MountError> {
    let writer = roar_store::Writer::start(db)?;
    let jobs = Arc::new(
        Jobs::new(writer, ignore)
            .with_machine(machine)
            .with_journals(journals, dir),
    );
    jobs.watch_exits();
    let archives = sources.len();
    let fs = archive::ArchiveFs::new(sources, jobs.clone());
    tracing::info!(
        "roarfs: {} entries from {archives} archive(s) on {}",
        fs.entries(),
        dir.display()
    );
    let (session, stats) = spawn(fs, dir, true)?;
    Ok(Mounted {
        session: Some(session),
        jobs,
        path: dir.to_owned(),
        dev: sys::top_mount_dev(dir),
        how: "archive",
        transport: "dev-fuse",
        stats,
    })
}

/// Mounts `fs` on `dir` as roarfs (the name `roar mount` recognises its mounts by), open to
/// every user with the kernel checking permissions, and serves it on its own threads, which
/// poll for the next request for up to [`poll_max`] before they sleep.
fn spawn<F: fuser::Filesystem + Send + Sync + 'static>(
    fs: F,
    dir: &Path,
    read_only: bool,
) -> Result<(fuser::BackgroundSession, fuser::Stats), MountError> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("roarfs".into()),
        fuser::MountOption::Subtype("roarfs".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    if read_only {
        config.mount_options.push(fuser::MountOption::RO);
    }
    config.acl = fuser::SessionACL::All;
    // Hashing at open or release, or decoding a compressed member, blocks one thread; keep
    // others serving.
    config.n_threads = Some(4);
    config.poll_max = poll_max();
    fuser::Session::new(fs, dir, &config)
        .and_then(|s| {
            let stats = s.stats();
            Ok((s.spawn()?, stats))
        })
        .map_err(|source| MountError::Mount {
            path: dir.to_owned(),
            source,
        })
}

/// How long a serving thread may poll for the next request before it sleeps:
/// `ROAR_MOUNT_POLL_US` microseconds (0: never), else [`POLL_MAX_US`]. The window adapts below
/// it to how fast requests come (vendor/fuser/src/spin.rs).
fn poll_max() -> Option<Duration> {
    let us = std::env::var("ROAR_MOUNT_POLL_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(POLL_MAX_US);
    (us > 0).then(|| Duration::from_micros(us))
}

/// The default of [`poll_max`], in microseconds (bench/NOTES.md, "Requests per operation and an
/// adaptive poll").
pub const POLL_MAX_US: u64 = 200;

impl Mounted {
    /// How the daemon reaches what it serves: "file-handles" or "path-fds" for a directory,
    /// "archive" for archives.
    pub fn how(&self) -> &'static str {
        self.how
    }

    /// How requests reach the daemon: "io_uring" (per-CPU queues) or "dev-fuse".
    pub fn transport(&self) -> &'static str {
        self.transport
    }

    /// The requests the kernel has sent the mount by kind, and how polling for them went.
    pub fn stats(&self) -> &fuser::Stats {
        &self.stats
    }

    /// Whether the session ended without [`Mounted::unmount`]: the mount was unmounted from
    /// outside roar (`umount DIR`), or detached and its last open file closed.
    pub fn ended(&self) -> bool {
        self.session.as_ref().is_some_and(|s| s.guard.is_finished())
    }

    /// Records the jobs whose root process has exited; call it every few hundred milliseconds.
    pub fn tick(&self) -> Vec<i64> {
        self.jobs.finish(false)
    }

    /// Unmounts, then records every remaining job. While files under the mount are still open
    /// (`roar unmount --force`), the mount is detached from the tree at once but keeps serving
    /// those files until they are closed, so no byte written through them is lost; the kernel
    /// ends the session then, and this returns.
    pub fn unmount(mut self) -> Vec<i64> {
        self.stop()
    }

    fn stop(&mut self) -> Vec<i64> {
        if let Some(session) = self.session.take() {
            // Unmounting by path takes whatever is on top there: once this mount is gone
            // (someone ran `umount`), that is the directory's own filesystem, left alone.
            if self
                .dev
                .is_some_and(|dev| sys::top_mount_dev(&self.path) != Some(dev))
            {
                tracing::info!("roarfs: {} was unmounted already", self.path.display());
                if session.join_unmounted().is_err() {
                    tracing::error!("roarfs: the filesystem thread panicked");
                }
                return self.record_rest();
            }
            match sys::umount(&self.path) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    tracing::info!(
                        "roarfs: {} is busy; detached, serving its open files until they close",
                        self.path.display()
                    );
                    if let Err(e) = sys::umount_detach(&self.path) {
                        tracing::error!("roarfs: cannot detach {}: {e}", self.path.display());
                    }
                }
                Err(e) => {
                    // Not ours to unmount directly (a non-root daemon: EPERM): fuser's own
                    // unmount goes through fusermount.
                    tracing::info!("roarfs: umount {}: {e}", self.path.display());
                    if let Err(e) = session.umount_and_join() {
                        tracing::error!("roarfs: cannot unmount {}: {e}", self.path.display());
                    }
                    return self.record_rest();
                }
            }
            // Detached: the kernel ends the session when the last reference goes. Files open for
            // writing are served until they close; a reference that is only a working directory
            // (an idle shell `cd`'d into the mount) could hold it for ever, so once no file is
            // open for writing the daemon records its jobs and lets the session go with its
            // process (closing /dev/fuse aborts the connection: that directory then reads as
            // disconnected).
            while !session.guard.is_finished() && self.jobs.writers_open() > 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            if !session.guard.is_finished() {
                tracing::info!(
                    "roarfs: {} detached; only idle references (working directories) remain: ending the session",
                    self.path.display()
                );
                let ids = self.record_rest();
                std::mem::forget(session);
                return ids;
            }
            if session.join_unmounted().is_err() {
                tracing::error!("roarfs: the filesystem thread panicked");
            }
        }
        self.record_rest()
    }

    /// Records every job still live (the mount is gone).
    fn record_rest(&mut self) -> Vec<i64> {
        self.jobs.stop_journals_ahead();
        let ids = self.jobs.finish(true);
        self.jobs.flush();
        ids
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.session.is_some() {
            self.stop();
        }
    }
}

/// How often a daemon records jobs whose root process has exited.
pub const TICK: Duration = Duration::from_millis(200);

/// Runs a mount until SIGTERM, SIGINT or SIGHUP, or until it is unmounted from outside roar:
/// mounts, calls `ready` (so a parent waiting on a daemon can return), records finished jobs
/// every [`TICK`], and at the end unmounts (if still mounted) and records the rest. Signals are
/// blocked in every thread and taken synchronously here, so no handler runs inside the
/// filesystem's threads.
///
/// `mount` makes the mount ([`mount`] or [`mount_archives`]); `ready` gets [`Mounted::how`] and
/// [`Mounted::transport`]; `tick` gets the mount's [`Mounted::stats`] at every tick.
pub fn serve(
    dir: &Path,
    mount: impl FnOnce() -> Result<Mounted, MountError>,
    ready: impl FnOnce(Result<(&'static str, &'static str), &MountError>),
    mut tick: impl FnMut(&fuser::Stats),
) -> Result<Vec<i64>, MountError> {
    let signals = sys::block_signals(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP]);
    let mounted = match mount() {
        Ok(m) => m,
        Err(e) => {
            ready(Err(&e));
            return Err(e);
        }
    };
    ready(Ok((mounted.how(), mounted.transport())));
    let mut recorded = Vec::new();
    loop {
        if let Some(sig) = sys::wait_signal(&signals, TICK) {
            tracing::info!("roarfs: signal {sig}, unmounting {}", dir.display());
            break;
        }
        if mounted.ended() {
            tracing::info!(
                "roarfs: {} was unmounted from outside roar; recording its jobs",
                dir.display()
            );
            break;
        }
        recorded.extend(mounted.tick());
        tick(mounted.stats());
    }
    recorded.extend(mounted.unmount());
    Ok(recorded)
}
