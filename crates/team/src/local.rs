//! A job of a local (SQLite) store read whole as one [`JobRecord`] (what a push sends), and the
//! marks of what each remote holds. Every table a job owns is read; ids stay local, the job's
//! `uid` and its files' content hashes are what identify it anywhere.

use rusqlite::{params, Connection, OptionalExtension};

use super::codec::{outcome, path, role};

use roar_store::environment::{packages_of, runtime_of, Environment};
use roar_store::{
    argv_from_blob, Distributed, GitState, JobRecord, Ops, ProcessRecord, Redirect, StepContent,
    StepFile, StepRecord,
};

/// Finished jobs (not running, and with a uid) after job `after` that `remote` does not hold
/// yet, oldest first. A push walks forward from 0 (each batch from its last job: rescanning the
/// pushed ones from the start made a long push quadratic).
pub(crate) fn unpushed(
    conn: &Connection,
    remote: &str,
    after: i64,
    limit: usize,
) -> rusqlite::Result<Vec<i64>> {
    conn.prepare_cached(
        "SELECT j.id FROM jobs j
         WHERE j.id > ?2 AND j.status != 'running' AND j.uid IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM pushed p WHERE p.remote = ?1 AND p.job_uid = j.uid)
         ORDER BY j.id LIMIT ?3",
    )?
    .query_map(params![remote, after, limit as i64], |r| r.get(0))?
    .collect()
}

pub(crate) fn mark_pushed(
    conn: &Connection,
    remote: &str,
    uids: &[String],
) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    {
        let mut stmt =
            tx.prepare_cached("INSERT OR IGNORE INTO pushed (remote, job_uid) VALUES (?1, ?2)")?;
        for uid in uids {
            stmt.execute(params![remote, uid])?;
        }
    }
    tx.commit()
}

/// Job `id` as a record but for its file records (read for a whole batch by
/// [`super::files::read_batch`]), or None if it is gone.
pub(crate) fn read_job(conn: &Connection, id: i64) -> rusqlite::Result<Option<JobRecord>> {
    let head = conn
        .prepare_cached(
            "SELECT name, argv, cwd, started_ns, ended_ns, status, exit_code, signal, incomplete,
                    backend, git_commit, git_branch, git_dirty, git_remote, git_diff, env, host,
                    uid, run_group, rank, world_size, local_rank, node_rank
             FROM jobs WHERE id = ?1",
        )?
        .query_row([id], |r| {
            let outcome = outcome(&r.get::<_, String>(5)?, r.get(6)?, r.get(7)?);
            let dirty: Option<bool> = r.get(12)?;
            let git = dirty.map(|dirty| -> rusqlite::Result<GitState> {
                Ok(GitState {
                    commit: r.get(10)?,
                    branch: r.get(11)?,
                    dirty,
                    remote: r.get(13)?,
                    diff: r.get(14)?,
                })
            });
            let env: String = r.get(15)?;
            let group: Option<String> = r.get(18)?;
            let dist = group
                .map(|group| -> rusqlite::Result<Distributed> {
                    Ok(Distributed {
                        group,
                        rank: r.get(19)?,
                        world_size: r.get(20)?,
                        local_rank: r.get(21)?,
                        node_rank: r.get(22)?,
                    })
                })
                .transpose()?;
            Ok(JobRecord {
                name: r.get(0)?,
                argv: argv_from_blob(&r.get::<_, Vec<u8>>(1)?),
                cwd: path(r.get(2)?),
                started_ns: r.get(3)?,
                ended_ns: r.get(4)?,
                outcome,
                incomplete: r.get(8)?,
                backend: r.get(9)?,
                git: git.transpose()?,
                env: serde_json::from_str(&env).unwrap_or_default(),
                host: r.get(16)?,
                processes: Vec::new(),
                steps: Vec::new(),
                files: Vec::new(),
                environment: None,
                uid: r.get(17)?,
                dist,
            })
        })
        .optional()?;
    let Some(mut job) = head else {
        return Ok(None);
    };
    job.processes = conn
        .prepare_cached(
            "SELECT pid, parent_pid, exe, argv, started_ns, ended_ns FROM processes
             WHERE job_id = ?1 ORDER BY id",
        )?
        .query_map([id], |r| {
            Ok(ProcessRecord {
                pid: r.get(0)?,
                parent_pid: r.get(1)?,
                exe: r.get::<_, Option<Vec<u8>>>(2)?.map(path),
                argv: argv_from_blob(&r.get::<_, Option<Vec<u8>>>(3)?.unwrap_or_default()),
                started_ns: r.get(4)?,
                ended_ns: r.get(5)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    job.steps = read_steps(conn, id)?;
    let diff = match job.git.as_ref().and_then(|g| g.diff.as_deref()) {
        Some(hash) => roar_store::environment::blob(conn, hash)?,
        None => None,
    };
    job.environment = Some(Environment {
        packages: packages_of(conn, id)?,
        runtime: runtime_of(conn, id)?,
        diff,
    });
    Ok(Some(job))
}

fn read_steps(conn: &Connection, id: i64) -> rusqlite::Result<Vec<StepRecord>> {
    let mut steps: Vec<(i64, StepRecord)> = conn
        .prepare_cached(
            "SELECT id, seq, parent_seq, pid, exe, argv, cwd, started_ns, ended_ns,
                    stdin, stdout, stderr, appends
             FROM steps WHERE job_id = ?1 ORDER BY seq",
        )?
        .query_map([id], |r| {
            let appends: i64 = r.get(12)?;
            let stream = |at: usize, append: bool| -> rusqlite::Result<Option<Redirect>> {
                Ok(r.get::<_, Option<Vec<u8>>>(at)?.map(|p| Redirect {
                    path: path(p),
                    append,
                }))
            };
            Ok((
                r.get(0)?,
                StepRecord {
                    seq: r.get(1)?,
                    parent: r.get(2)?,
                    pid: r.get(3)?,
                    exe: r.get::<_, Option<Vec<u8>>>(4)?.map(path),
                    argv: argv_from_blob(&r.get::<_, Vec<u8>>(5)?),
                    cwd: path(r.get(6)?),
                    started_ns: r.get(7)?,
                    ended_ns: r.get(8)?,
                    streams: [
                        stream(9, false)?,
                        stream(10, appends & 1 != 0)?,
                        stream(11, appends & 2 != 0)?,
                    ],
                    files: Vec::new(),
                },
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut files = conn.prepare_cached(
        "SELECT role, path, ops, from_seq, content, first_ns, last_ns FROM step_files
         WHERE step_id = ?1 ORDER BY rowid",
    )?;
    for (step_id, step) in &mut steps {
        step.files = files
            .query_map([*step_id], |r| {
                Ok(StepFile {
                    role: role(&r.get::<_, String>(0)?),
                    path: path(r.get(1)?),
                    ops: Ops::parse(&r.get::<_, String>(2)?),
                    from_step: r.get(3)?,
                    content: StepContent::parse(&r.get::<_, String>(4)?),
                    first_ns: r.get(5)?,
                    last_ns: r.get(6)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
    }
    Ok(steps.into_iter().map(|(_, s)| s).collect())
}
