//! A job as rows: the job's row (inserted, or completed in place), its processes, steps and file
//! records, the artifacts they name and hash-cache entries; one transaction's statements, shared by
//! the writer thread, the recorder's `Committer` and a mirror's import.

use std::os::unix::ffi::OsStrExt;

use rusqlite::{params, CachedStatement, Connection, OptionalExtension};

use std::sync::mpsc::Receiver;

use crate::model::{argv_to_blob, CacheEntry, ContentHash, FileRecord, JobRecord, StepRecord};

use super::FileChunk;

/// The artifact row of `h`'s content, inserted if new, with sha256 filled in if it was missing.
/// `insert` is the prepared [`INSERT_ARTIFACT`] (prepared once per batch: this runs per file).
pub(super) fn upsert_artifact(
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
pub(super) const INSERT_ARTIFACT: &str =
    "INSERT INTO artifacts (blake3, sha256, size) VALUES (?1, ?2, ?3)
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
pub(super) fn write_job_row(
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

pub(super) fn insert_processes(
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

/// Adds jobs copied from another store (a team store's mirror, the roar-team crate) in one
/// transaction: each keeps its uid, and one the store already has is skipped. Returns how many
/// were added. The caller has redacted them (roar-team's `fetch` applies the project's policy).
pub fn import(conn: &mut Connection, jobs: Vec<JobRecord>) -> rusqlite::Result<usize> {
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

pub(super) fn insert_steps(
    tx: &Connection,
    job_id: i64,
    steps: &[StepRecord],
) -> rusqlite::Result<()> {
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

pub(super) fn insert_files(
    tx: &Connection,
    job_id: i64,
    files: &[FileRecord],
) -> rusqlite::Result<()> {
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
