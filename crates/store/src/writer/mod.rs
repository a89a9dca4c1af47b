//! The one writer of a process: a thread that owns a connection, drains a channel and commits
//! whatever is queued in one `BEGIN IMMEDIATE` transaction.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use rusqlite::Connection;

use crate::db;
use crate::error::{Result, StoreError};
use crate::model::{CacheEntry, ContentHash, FileRecord, JobRecord};
use crate::redact::Policy;

mod rows;

pub use rows::import;
pub(crate) use rows::{insert_cache, insert_job};
use rows::{upsert_artifact, INSERT_ARTIFACT};

/// Most messages one transaction takes before it commits and starts the next.
const MAX_BATCH: usize = 4096;

enum Msg {
    /// A job that has just started: its row, `running`, recorded by this process (see
    /// [`Writer::begin_job`]).
    Begin(Box<JobRecord>, Sender<Result<i64>>),
    /// A job, where the rest of its files arrive while it is being recorded (see
    /// [`Writer::start_job`]), and the row [`Msg::Begin`] made for it, if any.
    Job(
        Box<JobRecord>,
        Option<Receiver<FileChunk>>,
        Sender<Result<i64>>,
        Option<i64>,
    ),
    Cache(Vec<CacheEntry>),
    Artifacts(Vec<ContentHash>),
    Flush(Sender<Result<()>>),
}

/// When the WAL is folded back into the database (a checkpoint: two fsyncs, tens of milliseconds
/// on a virtual disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkpoints {
    /// SQLite's own policy (after any commit that leaves the WAL over 1000 pages) plus a
    /// truncating checkpoint when the writer exits with the WAL over [`WAL_LIMIT`]. For
    /// long-lived writers and commands nobody waits on per file.
    Inline,
    /// Never in this writer: the caller checks [`checkpoint_due`] once it has answered its user
    /// and hands the work to another process (`roar run`, whose user waits on its exit).
    Deferred,
}

/// More files of a job being recorded, with the hash-cache entries their hashing produced.
#[derive(Debug, Default)]
pub struct FileChunk {
    pub files: Vec<FileRecord>,
    pub cache: Vec<CacheEntry>,
}

/// A job whose row is in the writer's open transaction while its caller still produces files
/// (see [`Writer::start_job`]).
pub struct JobStream {
    files: Sender<FileChunk>,
    answer: Receiver<Result<i64>>,
}

impl JobStream {
    /// Queues more of the job's files. Never blocks; if the writer has already failed, the chunk
    /// is dropped and [`JobStream::finish`] reports why.
    pub fn send(&self, chunk: FileChunk) {
        let _ = self.files.send(chunk);
    }

    /// Ends the job's files, waits for the commit and returns the job's id.
    pub fn finish(self) -> Result<i64> {
        drop(self.files);
        self.answer.recv().map_err(|_| StoreError::WriterGone)?
    }
}

/// Handle to the writer thread. Dropping it flushes what is queued and joins the thread.
pub struct Writer {
    tx: Option<Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Opens the store at `path` for writing and starts the writer thread; it checkpoints
    /// [`Checkpoints::Inline`].
    pub fn start(path: &Path) -> Result<Writer> {
        Writer::start_with(path, Checkpoints::Inline)
    }

    /// [`Writer::start`], with the WAL checkpointed as `checkpoints` says.
    pub fn start_with(path: &Path, checkpoints: Checkpoints) -> Result<Writer> {
        let conn = connect(path, checkpoints)?;
        let (tx, rx) = mpsc::channel();
        let path = path.to_owned();
        let thread = spawn_thread(move || run(conn, path, rx, checkpoints))?;
        Ok(Writer {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// [`Writer::start_with`], with the store opened on the writer's own thread while the caller
    /// goes on: a process's first connection replays the WAL and reads the schema (about a
    /// millisecond `roar run` spends while the command runs, not after it). Fails here only if
    /// the thread cannot start; [`OpeningWriter::wait`] says whether the store opened.
    pub fn open_in_background(path: &Path, checkpoints: Checkpoints) -> Result<OpeningWriter> {
        let (tx, rx) = mpsc::channel();
        let (opened_tx, opened) = mpsc::channel();
        let path = path.to_owned();
        let thread = spawn_thread(move || match connect(&path, checkpoints) {
            Ok(conn) => {
                // The receiver is gone only if the caller dropped the OpeningWriter, which also
                // dropped `tx`: `run` then ends at once.
                let _ = opened_tx.send(Ok(()));
                run(conn, path, rx, checkpoints);
            }
            Err(e) => {
                let _ = opened_tx.send(Err(e));
            }
        })?;
        Ok(OpeningWriter { tx, opened, thread })
    }

    /// Records a whole job and returns its id once committed.
    pub fn record_job(&self, job: JobRecord) -> Result<i64> {
        self.record_begun(None, job)
    }

    /// Writes `job`'s row now, as `running` with this process as its recorder, and returns at
    /// once; the row is committed in the background. A job recorded later through
    /// [`Writer::record_begun`]/[`Writer::start_begun`] with the [`Begun`] fills that row in.
    /// Until then `roar log` shows the job running, and if this process dies first (killed), the
    /// row stays to say so instead of the job leaving no trace.
    pub fn begin_job(&self, job: &JobRecord) -> Result<Begun> {
        let (reply, answer) = mpsc::channel();
        self.send(Msg::Begin(Box::new(header(job)), reply))?;
        Ok(Begun { answer })
    }

    /// [`Writer::record_job`] into the row of a [`Writer::begin_job`] (a new row if `begun` is
    /// None or its row could not be written).
    pub fn record_begun(&self, begun: Option<Begun>, job: JobRecord) -> Result<i64> {
        let (reply, answer) = mpsc::channel();
        let id = begun.and_then(Begun::wait);
        self.send(Msg::Job(Box::new(job), None, reply, id))?;
        answer.recv().map_err(|_| StoreError::WriterGone)?
    }

    /// [`Writer::record_job`] into the row `id` (a job's row written while it ran, by a process
    /// that died before recording it: see `roar_engine::journal`).
    pub fn record_into(&self, id: Option<i64>, job: JobRecord) -> Result<i64> {
        let (reply, answer) = mpsc::channel();
        self.send(Msg::Job(Box::new(job), None, reply, id))?;
        answer.recv().map_err(|_| StoreError::WriterGone)?
    }

    /// Starts recording `job` and returns where the rest of its files go: the writer inserts the
    /// job's row and `job.files` at once, then each [`FileChunk`] as it arrives, all in one
    /// transaction that commits at [`JobStream::finish`]. The caller's last work on the files
    /// (`roar run` confirming that each output is still the content hashed during the run) then
    /// runs on another core while SQLite writes, instead of before it. Nothing else this writer
    /// is sent commits until the job does, and the writer waits for the job's files until the
    /// `JobStream` is finished or dropped: end it before dropping the `Writer`.
    pub fn start_job(&self, job: JobRecord) -> Result<JobStream> {
        self.start_begun(None, job)
    }

    /// [`Writer::start_job`] into the row of a [`Writer::begin_job`].
    pub fn start_begun(&self, begun: Option<Begun>, job: JobRecord) -> Result<JobStream> {
        let (reply, answer) = mpsc::channel();
        let (files, more) = mpsc::channel();
        let id = begun.and_then(Begun::wait);
        self.send(Msg::Job(Box::new(job), Some(more), reply, id))?;
        Ok(JobStream { files, answer })
    }

    /// Queues hash-cache entries; they are committed with the next batch.
    pub fn cache(&self, entries: Vec<CacheEntry>) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        self.send(Msg::Cache(entries))
    }

    /// Queues artifacts known by content alone (from `roar hash`), with no job attached.
    pub fn artifacts(&self, hashes: Vec<ContentHash>) -> Result<()> {
        if hashes.is_empty() {
            return Ok(());
        }
        self.send(Msg::Artifacts(hashes))
    }

    /// Waits until everything queued before this call is committed.
    pub fn flush(&self) -> Result<()> {
        let (reply, answer) = mpsc::channel();
        self.send(Msg::Flush(reply))?;
        answer.recv().map_err(|_| StoreError::WriterGone)?
    }

    fn send(&self, msg: Msg) -> Result<()> {
        self.tx
            .as_ref()
            .ok_or(StoreError::WriterGone)?
            .send(msg)
            .map_err(|_| StoreError::WriterGone)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A job whose `running` row was queued by [`Writer::begin_job`].
#[derive(Debug)]
pub struct Begun {
    answer: Receiver<Result<i64>>,
}

impl Begun {
    /// A row already written, by its id (by another process, or answered earlier).
    pub fn known(id: i64) -> Begun {
        let (reply, answer) = mpsc::channel();
        let _ = reply.send(Ok(id));
        Begun { answer }
    }

    /// The row's id, once committed (messages are applied in order, so by the time the job is
    /// recorded this does not wait); None if it could not be written.
    pub fn wait(self) -> Option<i64> {
        match self.answer.recv() {
            Ok(Ok(id)) => Some(id),
            Ok(Err(e)) => {
                tracing::warn!("the job's row could not be written when it started: {e}");
                None
            }
            Err(_) => None,
        }
    }
}

/// What a [`Msg::Begin`] stores: the job without files or processes, running.
pub(crate) fn header(job: &JobRecord) -> JobRecord {
    JobRecord {
        outcome: crate::Outcome::Running,
        ended_ns: None,
        processes: Vec::new(),
        steps: Vec::new(),
        files: Vec::new(),
        environment: None,
        ..job.clone()
    }
}

/// A [`Writer`] whose store is still being opened on its thread.
pub struct OpeningWriter {
    tx: Sender<Msg>,
    opened: Receiver<Result<()>>,
    thread: JoinHandle<()>,
}

impl OpeningWriter {
    /// [`Writer::begin_job`], queued while the store opens.
    pub fn begin_job(&self, job: &JobRecord) -> Result<Begun> {
        let (reply, answer) = mpsc::channel();
        self.tx
            .send(Msg::Begin(Box::new(header(job)), reply))
            .map_err(|_| StoreError::WriterGone)?;
        Ok(Begun { answer })
    }

    /// The writer, once its store is open, or why it could not be opened.
    pub fn wait(self) -> Result<Writer> {
        match self.opened.recv() {
            Ok(Ok(())) => Ok(Writer {
                tx: Some(self.tx),
                thread: Some(self.thread),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => match self.thread.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(()) => Err(StoreError::WriterGone),
            },
        }
    }
}

/// Opens the store at `path` for the writer: its own connection, set up for `checkpoints`.
pub(crate) fn connect(path: &Path, checkpoints: Checkpoints) -> Result<Connection> {
    let conn = db::open(path, false)?;
    // Every id this writer stores comes from a row it inserted or looked up in the same
    // transaction, so SQLite's check of each reference (a b-tree seek per id, per file
    // recorded) is switched off here; `foreign_key_check` stays clean (tests/store.rs).
    conn.pragma_update(None, "foreign_keys", false)
        .map_err(|e| db::classify(path, e))?;
    if checkpoints == Checkpoints::Deferred {
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(|e| db::classify(path, e))?;
    }
    Ok(conn)
}

fn spawn_thread(f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("roar-store-writer".into())
        .spawn(f)
        .map_err(|e| StoreError::io("start the writer thread for", "roar.db", e))
}

fn run(mut conn: Connection, path: PathBuf, rx: Receiver<Msg>, checkpoints: Checkpoints) {
    let mut lost = None;
    // Every job is redacted here, on its way in: nothing secret reaches the database or its WAL.
    let policy = Policy::for_config(&path.with_file_name(crate::project::CONFIG_NAME));
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        for msg in &mut batch {
            if let Msg::Job(job, _, _, _) | Msg::Begin(job, _) = msg {
                policy.job(job);
            }
        }
        commit(&mut conn, &path, batch, &mut lost);
    }
    if checkpoints == Checkpoints::Inline && checkpoint_due(&path) {
        // Busy (a reader elsewhere) is fine: the next writer tries again.
        let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    }
}

/// WAL size above which it is folded into the database and truncated. The first connection of
/// every process replays the whole WAL (~0.55 ms per MiB here), so the limit is a trade: at 1 MiB
/// `roar run true` costs ~1.2 ms less than at 4 MiB (0.5 MiB replayed on average instead of 2),
/// for a detached checkpoint every ~60 small jobs or after each job of ~2,000 files or more
/// (bench/NOTES.md).
pub const WAL_LIMIT: u64 = 1 << 20;

/// Whether the WAL of the store at `path` has outgrown [`WAL_LIMIT`]. Each process opening the
/// store replays the whole WAL (a WAL nobody checkpointed on close is never restarted), so it is
/// kept small: one fsync'd checkpoint every megabyte of writes instead of one per process.
pub fn checkpoint_due(path: &Path) -> bool {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(&wal).is_ok_and(|m| m.len() > WAL_LIMIT)
}

/// Folds the WAL of the store at `path` into the database and truncates it. The copy runs
/// without the write lock (other processes keep committing meanwhile); only the final truncation
/// needs the store to itself, and is skipped, not waited for, if another writer holds it.
pub fn checkpoint(path: &Path) -> Result<()> {
    let conn = db::open(path, false)?;
    // A checkpoint that could not finish says so in its result row (busy = 1), not as an error.
    let run = |mode: &str| {
        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()))
            .map_err(|e| db::classify(path, e))
    };
    run("PASSIVE")?;
    conn.busy_timeout(std::time::Duration::ZERO)
        .map_err(|e| db::classify(path, e))?;
    run("TRUNCATE")
}

/// Applies one batch in one transaction, then answers every waiting caller. `lost` holds the
/// failure of hash records nobody waited for until the next flush reports it: the batch that
/// carries a flush need not be the one that failed.
fn commit(conn: &mut Connection, path: &Path, batch: Vec<Msg>, lost: &mut Option<StoreError>) {
    let mut job_ids = Vec::new();
    let outcome = (|| -> rusqlite::Result<()> {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        for msg in &batch {
            match msg {
                Msg::Job(job, more, _, begun) => {
                    job_ids.push(insert_job(&tx, job, more.as_ref(), *begun, None)?)
                }
                Msg::Begin(job, _) => job_ids.push(insert_job(&tx, job, None, None, None)?),
                Msg::Cache(entries) => insert_cache(&tx, entries)?,
                Msg::Artifacts(hashes) => {
                    let mut insert = tx.prepare_cached(INSERT_ARTIFACT)?;
                    for h in hashes {
                        upsert_artifact(&tx, &mut insert, h)?;
                    }
                }
                Msg::Flush(_) => {}
            }
        }
        tx.commit()
    })();
    let mut ids = job_ids.into_iter();
    for msg in batch {
        let err = || match &outcome {
            Ok(()) => unreachable!(),
            Err(e) => db::classify(path, clone_err(e)),
        };
        match msg {
            Msg::Job(_, _, reply, _) | Msg::Begin(_, reply) => {
                let _ = reply.send(match &outcome {
                    Ok(()) => Ok(ids.next().expect("one id per job")),
                    Err(_) => Err(err()),
                });
            }
            Msg::Flush(reply) => {
                let result = match (&outcome, lost.take()) {
                    (Err(_), _) => Err(err()),
                    (Ok(()), Some(earlier)) => Err(earlier),
                    (Ok(()), None) => Ok(()),
                };
                let _ = reply.send(result);
            }
            Msg::Cache(_) | Msg::Artifacts(_) => {
                if outcome.is_err() {
                    // Nobody waits on these: a lost entry only costs a re-hash later, and the
                    // caller's next flush() reports the failure.
                    tracing::warn!("hash records not stored: {}", err());
                    lost.get_or_insert_with(err);
                }
            }
        }
    }
}

/// rusqlite errors are not Clone; every waiter of a failed batch gets an equivalent one.
fn clone_err(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(code, msg) => {
            rusqlite::Error::SqliteFailure(*code, msg.clone())
        }
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        ),
    }
}
