//! The one writer of a process: a thread that owns a connection, drains a channel and commits
//! whatever is queued in one `BEGIN IMMEDIATE` transaction.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use rusqlite::{params, CachedStatement, Connection, OptionalExtension};

use crate::db;
use crate::error::{Result, StoreError};
use crate::model::{argv_to_blob, CacheEntry, ContentHash, FileRecord, JobRecord, StepRecord};
use crate::redact::Policy;

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

/// The artifact row of `h`'s content, inserted if new, with sha256 filled in if it was missing.
/// `insert` is the prepared [`INSERT_ARTIFACT`] (prepared once per batch: this runs per file).
fn upsert_artifact(
    tx: &Connection,
    insert: &mut CachedStatement,
    h: &ContentHash,
) -> rusqlite::Result<i64> {
    // Most artifacts are new (fresh outputs) or already known: neither case rewrites a row.
    if insert.execute(params![h.blake3, h.sha256, h.size as i64])? == 1 {
        return Ok(tx.last_insert_rowid());
    }
    let (id, sha256): (i64, Option<String>) = tx
        .prepare_cached("SELECT id, sha256 FROM artifacts WHERE blake3 = ?1")?
        .query_row([&h.blake3], |r| Ok((r.get(0)?, r.get(1)?)))?;
    if sha256.is_none() && h.sha256.is_some() {
        tx.prepare_cached("UPDATE artifacts SET sha256 = ?2 WHERE id = ?1")?
            .execute(params![id, h.sha256])?;
    }
    Ok(id)
}

/// Not `INSERT .. RETURNING`: SQLite builds a temporary table for every RETURNING statement.
const INSERT_ARTIFACT: &str = "INSERT INTO artifacts (blake3, sha256, size) VALUES (?1, ?2, ?3)
                               ON CONFLICT (blake3) DO NOTHING";

/// `recorder`: who records a running job, when not this process.
pub(crate) fn insert_job(
    tx: &Connection,
    job: &JobRecord,
    more: Option<&Receiver<FileChunk>>,
    begun: Option<i64>,
    recorder: Option<&str>,
) -> rusqlite::Result<i64> {
    // A running row names its recorder, so a reader can tell a job still running from one whose
    // recorder died; a finished row needs none.
    let recorder = matches!(job.outcome, crate::Outcome::Running)
        .then(|| recorder.map_or_else(crate::model::recorder_id, str::to_owned));
    // The row written when the job began is completed in place (it keeps its id: ids follow the
    // order jobs started); if it is gone (`roar rm` meanwhile), a new row is made. A row already
    // completed is this job recorded before: a run whose recorder committed the job but died
    // before saying so records it again, and must not add its files twice.
    if let Some(id) = begun {
        let status: Option<String> = tx
            .prepare_cached("SELECT status FROM jobs WHERE id = ?1")?
            .query_row([id], |r| r.get(0))
            .optional()?;
        if status.is_some_and(|s| s != "running") {
            return Ok(id);
        }
    }
    let changed = write_job_row(tx, job, begun, recorder.as_deref())?;
    if begun.is_some() && changed == 0 {
        return insert_job(tx, job, more, None, None);
    }
    let job_id = begun.unwrap_or_else(|| tx.last_insert_rowid());
    if let Some(g) = job
        .git
        .as_ref()
        .filter(|g| g.remote.is_some() || g.diff.is_some())
    {
        tx.prepare_cached("UPDATE jobs SET git_remote = ?1, git_diff = ?2 WHERE id = ?3")?
            .execute(params![g.remote, g.diff, job_id])?;
    }
    if let Some(env) = &job.environment {
        crate::environment::insert(tx, job_id, env)?;
    }

    insert_processes(tx, job_id, &job.processes)?;
    insert_steps(tx, job_id, &job.steps)?;
    insert_files(tx, job_id, &job.files)?;
    // The sender ends the job by hanging up.
    for chunk in more.into_iter().flatten() {
        insert_files(tx, job_id, &chunk.files)?;
        insert_cache(tx, &chunk.cache)?;
    }
    Ok(job_id)
}

/// Writes the job's row: completes the row written when it began (`begun`), or makes one. How
/// many rows changed (none: the begun row is gone).
fn write_job_row(
    tx: &Connection,
    job: &JobRecord,
    begun: Option<i64>,
    recorder: Option<&str>,
) -> rusqlite::Result<usize> {
    let (exit_code, signal) = match &job.outcome {
        crate::Outcome::Exited(c) => (Some(*c), None),
        crate::Outcome::Signaled(s) => (None, Some(*s)),
        _ => (None, None),
    };
    let env = serde_json::to_string(&job.env).unwrap_or_else(|_| "{}".into());
    let sql = if begun.is_some() {
        "UPDATE jobs SET name = ?1, argv = ?2, cwd = ?3, started_ns = ?4, ended_ns = ?5,
                status = ?6, exit_code = ?7, signal = ?8, incomplete = ?9, backend = ?10,
                git_commit = ?11, git_branch = ?12, git_dirty = ?13, env = ?14, host = ?15,
                recorder = ?16, uid = coalesce(?17, uid), run_group = ?18, rank = ?19,
                world_size = ?20, local_rank = ?21, node_rank = ?22
         WHERE id = ?23"
    } else {
        "INSERT INTO jobs (name, argv, cwd, started_ns, ended_ns, status, exit_code, signal,
                           incomplete, backend, git_commit, git_branch, git_dirty, env, host,
                           recorder, uid, run_group, rank, world_size, local_rank, node_rank)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                 coalesce(?17, lower(hex(randomblob(16)))), ?18, ?19, ?20, ?21, ?22)"
    };
    let mut stmt = tx.prepare_cached(sql)?;
    let mut values: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(23);
    let argv = argv_to_blob(&job.argv);
    let cwd = job.cwd.as_os_str().as_bytes();
    let status = job.outcome.status();
    let commit = job.git.as_ref().and_then(|g| g.commit.clone());
    let branch = job.git.as_ref().and_then(|g| g.branch.clone());
    let dirty = job.git.as_ref().map(|g| g.dirty);
    values.extend([
        &job.name as &dyn rusqlite::ToSql,
        &argv,
        &cwd,
        &job.started_ns,
        &job.ended_ns,
        &status,
        &exit_code,
        &signal,
        &job.incomplete,
        &job.backend,
        &commit,
        &branch,
        &dirty,
        &env,
        &job.host,
        &recorder,
        &job.uid,
    ]);
    let dist = job.dist.as_ref();
    let group = dist.map(|d| d.group.as_str());
    let (rank, world_size, local_rank, node_rank) = (
        dist.and_then(|d| d.rank),
        dist.and_then(|d| d.world_size),
        dist.and_then(|d| d.local_rank),
        dist.and_then(|d| d.node_rank),
    );
    values.extend([
        &group as &dyn rusqlite::ToSql,
        &rank,
        &world_size,
        &local_rank,
        &node_rank,
    ]);
    if let Some(id) = &begun {
        values.push(id);
    }
    stmt.execute(rusqlite::params_from_iter(values))
}

fn insert_processes(
    tx: &Connection,
    job_id: i64,
    processes: &[crate::ProcessRecord],
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached(
        "INSERT INTO processes (job_id, pid, parent_pid, exe, argv, started_ns, ended_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for p in processes {
        stmt.execute(params![
            job_id,
            p.pid,
            p.parent_pid,
            p.exe.as_ref().map(|e| e.as_os_str().as_bytes().to_vec()),
            argv_to_blob(&p.argv),
            p.started_ns,
            p.ended_ns,
        ])?;
    }
    Ok(())
}

/// Adds jobs copied from another store (the team store's mirror, crate::team) in one
/// transaction: each keeps its uid, and one the store already has is skipped. Returns how many
/// were added. The caller has redacted them (crate::team::fetch applies the project's policy).
pub(crate) fn import(conn: &mut Connection, jobs: Vec<JobRecord>) -> rusqlite::Result<usize> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let mut added = 0;
    for job in &jobs {
        let known = match &job.uid {
            Some(uid) => tx
                .prepare_cached("SELECT 1 FROM jobs WHERE uid = ?1")?
                .exists([uid])?,
            None => false,
        };
        if !known {
            insert_job(&tx, job, None, None, None)?;
            added += 1;
        }
    }
    tx.commit()?;
    Ok(added)
}

fn insert_steps(tx: &Connection, job_id: i64, steps: &[StepRecord]) -> rusqlite::Result<()> {
    if steps.is_empty() {
        return Ok(());
    }
    let mut step_stmt = tx.prepare_cached(
        "INSERT INTO steps (job_id, seq, parent_seq, pid, exe, argv, cwd, started_ns, ended_ns,
                            stdin, stdout, stderr, appends)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?;
    let mut file_stmt = tx.prepare_cached(
        "INSERT INTO step_files (step_id, role, path, ops, from_seq, content, first_ns, last_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for s in steps {
        let stream = |fd: usize| {
            s.streams[fd]
                .as_ref()
                .map(|r| r.path.as_os_str().as_bytes().to_vec())
        };
        // 1: stdout appends, 2: stderr appends.
        let appends: i64 = (1..3)
            .filter(|&fd| s.streams[fd].as_ref().is_some_and(|r| r.append))
            .map(|fd| 1 << (fd - 1))
            .sum();
        step_stmt.execute(params![
            job_id,
            s.seq,
            s.parent,
            s.pid,
            s.exe.as_ref().map(|e| e.as_os_str().as_bytes()),
            argv_to_blob(&s.argv),
            s.cwd.as_os_str().as_bytes(),
            s.started_ns,
            s.ended_ns,
            stream(0),
            stream(1),
            stream(2),
            appends,
        ])?;
        let step_id = tx.last_insert_rowid();
        for f in &s.files {
            file_stmt.execute(params![
                step_id,
                f.role.as_str(),
                f.path.as_os_str().as_bytes(),
                f.ops.names().join(","),
                f.from_step,
                f.content.as_str(),
                f.first_ns,
                f.last_ns,
            ])?;
        }
    }
    Ok(())
}

fn insert_files(tx: &Connection, job_id: i64, files: &[FileRecord]) -> rusqlite::Result<()> {
    let mut insert_artifact = tx.prepare_cached(INSERT_ARTIFACT)?;
    let mut insert_file = tx.prepare_cached(
        "INSERT INTO job_files (job_id, role, kind, path, artifact_id, before_artifact_id,
                                s3_object_id, ops, first_ns, last_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    for f in files {
        let artifact = f
            .hash
            .as_ref()
            .map(|h| upsert_artifact(tx, &mut insert_artifact, h))
            .transpose()?;
        let before = f
            .before
            .as_ref()
            .map(|h| upsert_artifact(tx, &mut insert_artifact, h))
            .transpose()?;
        let s3_id = match &f.s3 {
            Some(o) => Some(
                tx.prepare_cached(
                    "INSERT INTO s3_objects (bucket, key, version_id, etag, artifact_id, size, range)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?
                .insert(params![
                    o.bucket,
                    o.key,
                    o.version_id,
                    o.etag,
                    artifact,
                    o.size.map(|s| s as i64),
                    o.range,
                ])?,
            ),
            None => None,
        };
        insert_file.execute(params![
            job_id,
            f.role.as_str(),
            if f.s3.is_some() { "s3" } else { "file" },
            f.path.as_os_str().as_bytes(),
            artifact,
            before,
            s3_id,
            f.ops.names().join(","),
            f.first_ns,
            f.last_ns,
        ])?;
    }
    Ok(())
}

pub(crate) fn insert_cache(tx: &Connection, entries: &[CacheEntry]) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached(
        "INSERT OR REPLACE INTO hash_cache (dev, ino, size, mtime_ns, ctime_ns, blake3, sha256, hashed_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for e in entries {
        stmt.execute(params![
            e.stat.dev as i64,
            e.stat.ino as i64,
            e.stat.size as i64,
            e.stat.mtime_ns,
            e.stat.ctime_ns,
            e.hash.blake3,
            e.hash.sha256,
            e.hashed_ns,
        ])?;
    }
    Ok(())
}
