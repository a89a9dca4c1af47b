//! The journal: what an observer saw, appended as it arrives, so that the record of a job
//! survives the death of the process that observed it (docs/SEMANTICS.md, "Crashes").
//!
//! One file per job under `.roar/journal/`. Its records are exactly the engine's inputs — the
//! job's header, each [`Event`], each content [`Fact`] and the other calls into
//! [`crate::Rules`] — so replaying a journal through the rule rebuilds the state the observer
//! had: recovery is not a second rule, it is the same one fed from a file.
//!
//! Writing is a plain `write(2)` into the page cache: it survives the writer's `kill -9`; a power
//! loss can take what was written since the last [`Journal::sync`] (the job's end). Each record
//! is framed by its length and a checksum, so a record torn by a crash in the middle of a write
//! (or pages a power loss left zeroed) ends the journal there and never reads as another record.
//!
//! Who is alive: the writer holds an exclusive `flock` on its journal for as long as it lives;
//! the kernel drops it when the process dies, however it dies. A journal whose lock can be taken
//! is one whose writer is gone, and whoever takes it (recovery) keeps it while it rebuilds the
//! job, so two recoveries never record one job twice.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use roar_store::redact::Policy;
use roar_store::{ContentHash, JobRecord};

use crate::classify::Context;
use crate::event::Event;
use crate::{Fact, Rules};

mod codec;

use codec::{checksum_as, Sum};
pub use codec::{frame_redacted, frame_redacted_record};
mod orphans;

pub use orphans::{open_orphan, orphans, parse, remove, Claim, Orphan};
use orphans::{read, NEW};

const MAGIC: &[u8; 8] = b"roarjnl2";
/// A journal a roar before version 2 of the format wrote (its records' checksums are blake3's):
/// still recovered after an upgrade.
const MAGIC_V1: &[u8; 8] = b"roarjnl1";
/// A record's frame: its length (u32) and its checksum (u32; [`Sum`]).
const FRAME: usize = 8;
/// Bigger than any record an observer writes (an exec with its whole argv is the largest): a
/// frame claiming more is damage.
const MAX_RECORD: usize = 64 << 20;

/// Which observer wrote a journal: how recovery turns it into a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// `roar run`: the events of its backend (preload, ptrace, eBPF).
    Run,
    /// The mount daemon: one journal per live job, its calls into the rule and its step log.
    Mount,
    /// The gateway: one journal per session's job.
    Gateway,
}

/// One record of a journal.
#[derive(Debug, Clone)]
pub enum Record {
    /// The job as it was known when it began (no files): the first record.
    Job(Box<JobRecord>),
    /// `roar run`'s preload ring and the file where shims put events once roar is gone
    /// (`late`): recovery reads what is left in them.
    Ring {
        ring: PathBuf,
        late: PathBuf,
    },
    /// Every ring event before this position is in the journal already.
    RingPos(u64),
    /// The rule's context: file changes at or after this time may be the job's.
    CtimeFloor(i64),
    Event(Event),
    /// [`crate::Rules::found`].
    Found {
        path: PathBuf,
        fact: Fact,
        ts: i64,
    },
    /// [`crate::Rules::found_in`].
    FoundIn(Fact),
    /// [`crate::Rules::found_named`].
    FoundNamed {
        path: PathBuf,
        content: ContentHash,
        mark: u64,
        ts: i64,
    },
    /// [`crate::Rules::moved_dir`].
    MovedDir {
        from: PathBuf,
        to: PathBuf,
    },
    /// Something an observer keeps beside the rule (the gateway's S3 object of a path), as bytes
    /// of its own format.
    Extra(Vec<u8>),
    /// The job's root process is gone (the mount: its end was seen).
    RootGone,
    /// An event for the observer's own account of the job's processes (the mount's step log),
    /// not a call into the rule.
    Step(Event),
    /// Where the mount that wrote this journal was mounted.
    Mounted(PathBuf),
    /// [`crate::Rules::holds`]: whether a name a directory move refilled holds a file.
    Holds {
        path: PathBuf,
        holds: bool,
    },
}

/// An open journal, appended to by one observer.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: Mutex<Appender>,
}

/// The journal's file and where its records end. A small journal is appended with `pwrite(2)`;
/// past [`MAP_AFTER`] bytes it is appended through a shared mapping of the file: a record is then
/// copied into the page cache with no system call (each `pwrite` dirtied the inode again, its
/// size and times: ~3 µs a record on ext4, two or three records per access through the mount). A
/// page written through a shared mapping is the file's page in the page cache: it survives the
/// writer's death exactly as written bytes do. The space is allocated before it is mapped (a page
/// of a sparse mapping that cannot be allocated later is a SIGBUS, not an error); a filesystem
/// that cannot allocate ahead keeps `pwrite`. A short job (`roar run true`) never pays for the
/// allocation and the mapping (~0.4 ms).
#[derive(Debug)]
struct Appender {
    file: File,
    len: usize,
    map: Option<memmap2::MmapMut>,
    /// The filesystem cannot allocate ahead: never mapped.
    plain_only: bool,
}

/// Bytes after which a journal is mapped.
const MAP_AFTER: usize = 16 << 10;

impl Appender {
    /// Appends after the first `len` bytes of `file`.
    fn new(file: File, len: usize) -> Appender {
        Appender {
            file,
            len,
            map: None,
            plain_only: false,
        }
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let end = self.len + bytes.len();
        if self.map.is_none() && !self.plain_only && end > MAP_AFTER {
            self.map_to(end)?;
        }
        match &mut self.map {
            Some(map) => {
                if end > map.len() {
                    self.map_to(end)?;
                }
                let map = self.map.as_mut().expect("mapped above");
                map[self.len..end].copy_from_slice(bytes);
            }
            None => self.file.write_all_at(bytes, self.len as u64)?,
        }
        self.len = end;
        Ok(())
    }

    /// Maps the file with room for at least `end` bytes (twice what is mapped now, at least).
    fn map_to(&mut self, end: usize) -> io::Result<()> {
        let now = self.map.as_ref().map_or(0, |m| m.len());
        let have = self.file.metadata()?.len() as usize;
        let cap = (now * 2).max(end).max(have).next_power_of_two();
        if !reserve(&self.file, cap)? {
            self.plain_only = true;
            if self.map.is_some() {
                return Err(io::Error::other(
                    "the journal's filesystem stopped allocating ahead",
                ));
            }
            return Ok(());
        }
        // SAFETY: the file is this journal's, locked by this process; nothing truncates it while
        // it is mapped (a journal only ever grows, then is removed whole).
        self.map = Some(unsafe { memmap2::MmapMut::map_mut(&self.file)? });
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        match &self.map {
            Some(map) => map.flush(),
            None => self.file.sync_data(),
        }
    }
}

/// Allocates `file` to `size` bytes; false where the filesystem cannot allocate ahead.
fn reserve(file: &File, size: usize) -> io::Result<bool> {
    // SAFETY: fallocate on a descriptor we own.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) } {
        0 => Ok(true),
        libc::EOPNOTSUPP | libc::EINVAL => Ok(false),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

impl Journal {
    /// Creates the journal `name` in `dir` (made 0700 if missing), written by `writer`, and
    /// takes its lock for this process's lifetime. A journal under its own name is never one
    /// whose writer has not locked and headed it yet, so a recovery that finds it unlocked knows
    /// its writer is gone (before, a recovery running in the instant between the file's making
    /// and its lock took a live run's empty journal for a dead one's and removed it). The file
    /// is made without a name (`O_TMPFILE`) and linked into place once locked and headed: a
    /// writer killed before that leaves nothing behind. Where the filesystem cannot make
    /// unnamed files, it is made as `.NAME.journal.new`, which recoveries pass over (and remove
    /// once stale), and renamed into place.
    pub fn create(dir: &Path, name: &str, writer: Writer) -> io::Result<Journal> {
        let path = dir.join(format!("{name}.journal"));
        let (file, new) = match with_dir(dir, || unnamed(dir)) {
            Ok(file) => (file, None),
            Err(e) if unnamed_unsupported(&e) => {
                let new = dir.join(format!(".{name}.journal{NEW}"));
                (with_dir(dir, || open_new(&new))?, Some(new))
            }
            Err(e) => return Err(e),
        };
        lock(&file, true)?;
        // The header is written before the file grows: a writer killed in between leaves a
        // journal that still says what it is.
        let mut head = Vec::with_capacity(9);
        head.extend_from_slice(MAGIC);
        head.push(writer as u8);
        (&file).write_all(&head)?;
        match new {
            Some(new) => std::fs::rename(&new, &path)?,
            None => name_unnamed(&file, &path)?,
        }
        Ok(Journal {
            path,
            file: Mutex::new(Appender::new(file, head.len())),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes over the journal at `path` once its writer is gone (its lock free within `wait`),
    /// to go on appending to it: an observer that outlives the one that began it (the eBPF
    /// helper, for a run that died while its command runs). `Ok(None)`: the writer still holds
    /// it after `wait`, or a recovery took it and removed it.
    pub fn adopt(path: &Path, wait: std::time::Duration) -> io::Result<Option<Journal>> {
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let deadline = std::time::Instant::now() + wait;
        loop {
            match lock(&file, false) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                    if std::time::Instant::now() >= deadline {
                        return Ok(None);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => return Err(e),
            }
        }
        if !path.exists() {
            return Ok(None);
        }
        // Appended after its last whole record (the rest is the space allocated ahead).
        let end = read(&file)?.end;
        Ok(Some(Journal {
            path: path.to_owned(),
            file: Mutex::new(Appender::new(file, end)),
        }))
    }

    /// Appends `records` with one write, each redacted by `policy` as the store would redact it:
    /// a journal is on disk (the only other way in is bytes framed the same way).
    pub fn append(&self, policy: &Policy, records: &[Record]) -> io::Result<()> {
        let mut buf = Vec::with_capacity(128 * records.len());
        for r in records {
            frame_redacted_record(policy, r, &mut buf);
        }
        self.append_framed(&buf)
    }

    /// Appends bytes made by [`frame_redacted_record`] or [`frame_redacted`]: an observer that
    /// batches frames them as events arrive.
    pub fn append_framed(&self, bytes: &[u8]) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.append(bytes)
    }

    /// Makes what was appended survive a power loss (the job's end; docs/SEMANTICS.md).
    pub fn sync(&self) -> io::Result<()> {
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.sync()
    }

    /// The job is in the store: the journal is no longer needed.
    pub fn remove(self) {
        remove(&self.path);
    }
}

/// Journals made ahead, one at a time, by a thread of their own: an observer that begins a job
/// while it answers a request (the mount daemon, under its lock of the live jobs) takes a journal
/// with no file made on its path — making a file on ext4 costs tens of µs. A journal made ahead
/// and never taken is removed when the `Ahead` is dropped (a killed observer's holds its header
/// alone: a recovery finds nothing in it and removes it).
pub struct Ahead {
    made: Mutex<Option<std::sync::mpsc::Receiver<(String, Journal)>>>,
    maker: Option<std::thread::JoinHandle<()>>,
    dir: PathBuf,
    writer: Writer,
}

impl Ahead {
    /// Starts making journals of `writer` in `dir`, each named by a fresh uid.
    pub fn new(dir: &Path, writer: Writer) -> Ahead {
        // A rendezvous: the one made waits in the thread's hand, never in a buffer a drop would
        // lose it in.
        let (tx, rx) = std::sync::mpsc::sync_channel::<(String, Journal)>(0);
        let into = dir.to_owned();
        let maker = move || loop {
            let uid = new_uid();
            let Ok(journal) = Journal::create(&into, &uid, writer) else {
                return;
            };
            // Taken by no one: the observer is gone.
            if let Err(std::sync::mpsc::SendError((_, journal))) = tx.send((uid, journal)) {
                journal.remove();
                return;
            }
        };
        let maker = std::thread::Builder::new()
            .name("roar-journal-ahead".into())
            .spawn(maker)
            .map_err(|e| tracing::debug!("journals are made as jobs begin ({e})"))
            .ok();
        Ahead {
            made: Mutex::new(Some(rx)),
            maker,
            dir: dir.to_owned(),
            writer,
        }
    }

    /// A journal and its uid: one made ahead, else one made now.
    pub fn take(&self) -> io::Result<(String, Journal)> {
        let made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ready) = made.as_ref().and_then(|rx| rx.try_recv().ok()) {
            return Ok(ready);
        }
        drop(made);
        let uid = new_uid();
        Journal::create(&self.dir, &uid, self.writer).map(|j| (uid, j))
    }
}

impl Drop for Ahead {
    /// Removes the journal made and not taken: the thread's hand-over fails once no one can
    /// take it, and it removes that one and ends.
    fn drop(&mut self) {
        drop(
            self.made
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        if let Some(maker) = self.maker.take() {
            let _ = maker.join();
        }
    }
}

impl Rules {
    /// Applies a journal record that is a call into the rule (an event, a fact, a moved
    /// directory); any other record is left to its observer (false). The live observer calls the
    /// rule through this too ([`Journaled`]): a journal replayed is the rule the observer had.
    pub fn replay(&mut self, cx: &Context, record: &Record) -> bool {
        match record {
            Record::Event(ev) => self.apply(cx, ev),
            Record::Found { path, fact, ts } => self.found(cx, path, fact.clone(), *ts),
            Record::FoundIn(fact) => self.found_in(fact.clone()),
            Record::FoundNamed {
                path,
                content,
                mark,
                ts,
            } => self.found_named(cx, path, content.clone(), *mark, *ts),
            Record::MovedDir { from, to } => self.moved_dir(from, to),
            Record::Holds { path, holds } => self.holds(path, *holds),
            _ => return false,
        }
        true
    }
}

/// A job's rule with its journal, for an observer that calls the rule as accesses happen (the
/// mount, the gateway): each call is written to the journal, then applied by
/// [`Rules::replay`] — what recovery applies the journal with.
pub struct Journaled {
    rules: Rules,
    journal: Option<Journal>,
    policy: Policy,
    buf: Vec<u8>,
}

impl Journaled {
    /// A rule whose calls go to `journal` (none: not kept), redacted by `policy`.
    pub fn new(journal: Option<Journal>, policy: Policy) -> Journaled {
        Journaled {
            rules: Rules::default(),
            journal,
            policy,
            buf: Vec::new(),
        }
    }

    /// Writes `record`, then applies it to the rule if it is a call into it.
    pub fn call(&mut self, cx: &Context, record: &Record) {
        self.write(record);
        self.rules.replay(cx, record);
    }

    /// Writes `record` only (the observer's own state: a header, a step, the root's end). A
    /// failed write (a full disk) is reported once; the job is then as durable as before journals.
    pub fn write(&mut self, record: &Record) {
        self.append(|policy, buf| frame_redacted_record(policy, record, buf));
    }

    /// Writes `ev` as a [`Record::Step`] (the observer's own account of the job's processes),
    /// without a copy of it.
    pub fn step(&mut self, ev: &Event) {
        self.append(|policy, buf| frame_redacted(policy, ev, true, buf));
    }

    fn append(&mut self, frame: impl FnOnce(&Policy, &mut Vec<u8>)) {
        let Journaled {
            journal: Some(j),
            policy,
            buf,
            ..
        } = self
        else {
            return;
        };
        buf.clear();
        frame(policy, buf);
        if let Err(e) = j.append_framed(buf) {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| tracing::warn!("cannot write a job's journal: {e}"));
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The rule as the calls left it, and the journal (removed once the job is in the store).
    pub fn into_parts(self) -> (Rules, Option<Journal>) {
        (self.rules, self.journal)
    }
}

impl std::fmt::Debug for Journaled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journaled")
            .field("journal", &self.journal)
            .finish_non_exhaustive()
    }
}

/// `open()`, with `dir` made (0700) first where it is missing: one system call less on every
/// run than making it every time.
fn with_dir(dir: &Path, open: impl Fn() -> io::Result<File>) -> io::Result<File> {
    match open() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            make_dir(dir)?;
            open()
        }
        other => other,
    }
}

/// A new file in `dir` without a name (`O_TMPFILE`), readable and writable by its owner only.
fn unnamed(dir: &Path) -> io::Result<File> {
    if !Path::new("/proc/self/fd").is_dir() {
        // It could not be named (`name_unnamed`).
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir)
}

/// The errors of a filesystem (or kernel) that cannot make unnamed files, or cannot name them
/// (`/proc` absent).
fn unnamed_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
    )
}

/// A new file at `path` (which must not exist), readable and writable by its owner only.
fn open_new(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// Gives the unnamed `file` the name `path` (which must not exist), through its
/// `/proc/self/fd` link: `linkat` with `AT_EMPTY_PATH` would need `CAP_DAC_READ_SEARCH`.
fn name_unnamed(file: &File, path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let from = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(io::Error::other)?;
    let to = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: both strings are NUL-terminated and outlive the call; the descriptor is ours.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn make_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

fn lock(file: &File, wait: bool) -> io::Result<()> {
    let op = libc::LOCK_EX | if wait { 0 } else { libc::LOCK_NB };
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), op) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A fresh job uid: 16 random bytes as hex, the form the store gives a job without one (and the
/// name of its journal).
pub fn new_uid() -> String {
    let mut b = [0u8; 16];
    // SAFETY: getrandom writes at most b.len() bytes into our buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        // No entropy source: unique enough for a file name and a row (time and pid).
        let t = roar_store::now_ns() as u128 ^ ((std::process::id() as u128) << 64);
        b = t.to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests;
