//! Jobs written into the team store's tables (schema.rs).
//!
//! A job is keyed by its `uid` (never by a local id); its rows hang off `jobs.seq`, the order in
//! which the team store received jobs; its file records are one row of arrays, their paths and
//! contents in it. Diffs are keyed by blake3, packages by what they are. A batch is one
//! `INSERT .. ON CONFLICT (uid) DO NOTHING` for its jobs, then one statement (or COPY) per table
//! for the new jobs' rows: a job pushed twice, from two machines or by two pushers at once, is
//! stored once. Shared rows (blobs, packages) are inserted in sorted order before the jobs, so
//! concurrent pushers never deadlock on them.

use std::collections::{BTreeMap, BTreeSet};

use std::io::Write;

use postgres::{Statement, Transaction};

use super::codec::bytes;
use super::copy::{CopyRows, Elem};
use super::files::Files;
use roar_store::environment::Package;
use roar_store::{
    argv_to_blob, Distributed, GitState, JobRecord, Outcome, ProcessRecord, S3Object, StepFile,
    StepRecord,
};

/// The statements a push runs for every batch, prepared once per connection: parsing and
/// planning them again for each batch was a round trip and PostgreSQL's time on every
/// transaction (bench/NOTES.md, session 54).
pub(crate) struct Sql {
    blobs: Statement,
    packages: Statement,
    jobs: Statement,
    copy_files: Statement,
    s3: Statement,
    processes: Statement,
    steps: Statement,
    step_files: Statement,
    job_packages: Statement,
}

impl Sql {
    pub fn prepare(client: &mut postgres::Client) -> Result<Self, postgres::Error> {
        Ok(Sql {
            blobs: client.prepare(BLOBS)?,
            packages: client.prepare(PACKAGES)?,
            jobs: client.prepare(JOBS)?,
            copy_files: client.prepare(COPY_FILES)?,
            s3: client.prepare(S3)?,
            processes: client.prepare(PROCESSES)?,
            steps: client.prepare(STEPS)?,
            step_files: client.prepare(STEP_FILES)?,
            job_packages: client.prepare(JOB_PACKAGES)?,
        })
    }
}

const BLOBS: &str = "INSERT INTO blobs (blake3, data) VALUES ($1, $2) ON CONFLICT DO NOTHING";

const PACKAGES: &str = "INSERT INTO packages (kind, name, version, installer, location, commit_id)
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
     ORDER BY 1, 2, 3, 5, 6
     ON CONFLICT DO NOTHING";

const JOBS: &str =
    "INSERT INTO jobs (pushed_from, uid, name, argv, cwd, started_ns, ended_ns, status,
     exit_code, signal, incomplete, backend, git_commit, git_branch,
     git_dirty, git_remote, git_diff, env, host, runtime, run_group, rank,
     world_size, local_rank, node_rank)
     SELECT $1::text, * FROM unnest($2::text[], $3::text[], $4::bytea[], $5::bytea[],
     $6::bigint[], $7::bigint[], $8::text[], $9::int[], $10::int[], $11::bool[],
     $12::text[], $13::text[], $14::text[], $15::bool[], $16::text[], $17::text[],
     $18::text[], $19::text[], $20::text[], $21::text[], $22::int[], $23::int[],
     $24::int[], $25::int[])
     ON CONFLICT (uid) DO NOTHING RETURNING uid, seq";

const COPY_FILES: &str =
    "COPY job_file_lists (job_seq, paths, roles, ops, blake3, sha256, sizes, before_blake3,
     before_sha256, before_sizes, first_ns, last_ns)
     FROM STDIN BINARY";

const S3: &str =
    "INSERT INTO job_file_s3 (job_seq, ord, bucket, key, version_id, etag, size, range)
     SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::text[],
     $6::text[], $7::bigint[], $8::text[])";

const PROCESSES: &str =
    "INSERT INTO processes (job_seq, ord, pid, parent_pid, exe, argv, started_ns, ended_ns)
     SELECT * FROM unnest($1::bigint[], $2::int[], $3::int[], $4::int[], $5::bytea[],
     $6::bytea[], $7::bigint[], $8::bigint[])";

const STEPS: &str = "INSERT INTO steps (job_seq, seq, parent_seq, pid, exe, argv, cwd, started_ns,
     ended_ns, stdin, stdout, stderr, appends)
     SELECT * FROM unnest($1::bigint[], $2::int[], $3::int[], $4::int[], $5::bytea[],
     $6::bytea[], $7::bytea[], $8::bigint[], $9::bigint[],
     $10::bytea[], $11::bytea[], $12::bytea[], $13::int[])";

const STEP_FILES: &str =
    "INSERT INTO step_files (job_seq, step_seq, ord, role, path, ops, from_seq, content,
     first_ns, last_ns)
     SELECT * FROM unnest($1::bigint[], $2::int[], $3::int[], $4::text[], $5::bytea[],
     $6::text[], $7::int[], $8::text[], $9::bigint[], $10::bigint[])";

const JOB_PACKAGES: &str = "INSERT INTO job_packages (job_seq, package_id)
     SELECT u.job_seq, p.id FROM packages p
     JOIN unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
     AS u (job_seq, kind, name, version, location, commit_id)
     USING (kind, name, version, location, commit_id)
     ON CONFLICT DO NOTHING";

/// A local job as a push sends it: its record, and its file records as the team store's columns
/// (the record's `files` are not read).
pub(crate) struct Outgoing {
    pub job: JobRecord,
    pub files: Files,
}

/// Writes `batch` (each job with its uid) in one transaction; returns how many were new. Shared rows
/// go first, sorted, then each job and its own rows.
pub(crate) fn write_jobs(
    tx: &mut Transaction,
    sql: &Sql,
    batch: &[Outgoing],
    pushed_from: Option<&str>,
) -> Result<usize, postgres::Error> {
    let jobs: Vec<&JobRecord> = batch.iter().map(|o| &o.job).collect();
    let mut packages = BTreeSet::new();
    let mut blobs = BTreeMap::new();
    for job in &jobs {
        if let Some(env) = &job.environment {
            packages.extend(env.packages.iter());
            if let (Some(diff), Some(hash)) =
                (&env.diff, job.git.as_ref().and_then(|g| g.diff.clone()))
            {
                blobs.insert(hash, diff);
            }
        }
    }
    for (hash, data) in &blobs {
        tx.execute(&sql.blobs, &[hash, data])?;
    }
    let pkg = |f: fn(&Package) -> String| packages.iter().map(|p| f(p)).collect::<Vec<_>>();
    let (kinds, names, versions, locations, commits) = (
        pkg(|p| p.kind.clone()),
        pkg(|p| p.name.clone()),
        pkg(|p| p.version.clone()),
        pkg(|p| p.location.clone().unwrap_or_default()),
        pkg(|p| p.commit.clone().unwrap_or_default()),
    );
    let installers: Vec<Option<&str>> = packages.iter().map(|p| p.installer.as_deref()).collect();
    tx.execute(
        &sql.packages,
        &[&kinds, &names, &versions, &installers, &locations, &commits],
    )?;
    let seqs = insert_jobs(tx, sql, &jobs, pushed_from)?;
    let new: Vec<(i64, &Outgoing)> = batch
        .iter()
        .filter_map(|o| Some((*seqs.get(o.job.uid.as_deref()?)?, o)))
        .collect();
    if !new.is_empty() {
        insert_children(tx, sql, &new)?;
    }
    Ok(new.len())
}

/// The jobs' rows, in one statement; the `seq` of each job the team store did not have, by uid.
fn insert_jobs(
    tx: &mut Transaction,
    sql: &Sql,
    jobs: &[&JobRecord],
    pushed_from: Option<&str>,
) -> Result<BTreeMap<String, i64>, postgres::Error> {
    let col =
        |f: &dyn Fn(&JobRecord) -> Option<String>| jobs.iter().map(|j| f(j)).collect::<Vec<_>>();
    let int = |f: &dyn Fn(&Distributed) -> Option<u32>| {
        jobs.iter()
            .map(|j| j.dist.as_ref().and_then(f).map(|v| v as i32))
            .collect::<Vec<_>>()
    };
    let git = |f: &dyn Fn(&GitState) -> Option<String>| col(&|j| j.git.as_ref().and_then(f));
    let outcome = |j: &JobRecord| match &j.outcome {
        Outcome::Exited(c) => (Some(*c), None),
        Outcome::Signaled(s) => (None, Some(*s)),
        _ => (None, None),
    };
    let rows = tx.query(
        &sql.jobs,
        &[
            &pushed_from,
            &col(&|j| j.uid.clone()),
            &col(&|j| j.name.clone()),
            &jobs
                .iter()
                .map(|j| argv_to_blob(&j.argv))
                .collect::<Vec<_>>(),
            &jobs.iter().map(|j| bytes(&j.cwd)).collect::<Vec<_>>(),
            &jobs.iter().map(|j| j.started_ns).collect::<Vec<_>>(),
            &jobs.iter().map(|j| j.ended_ns).collect::<Vec<_>>(),
            &jobs.iter().map(|j| j.outcome.status()).collect::<Vec<_>>(),
            &jobs.iter().map(|j| outcome(j).0).collect::<Vec<_>>(),
            &jobs.iter().map(|j| outcome(j).1).collect::<Vec<_>>(),
            &jobs.iter().map(|j| j.incomplete).collect::<Vec<_>>(),
            &jobs.iter().map(|j| j.backend.as_str()).collect::<Vec<_>>(),
            &git(&|g| g.commit.clone()),
            &git(&|g| g.branch.clone()),
            &jobs
                .iter()
                .map(|j| j.git.as_ref().map(|g| g.dirty))
                .collect::<Vec<_>>(),
            &git(&|g| g.remote.clone()),
            &git(&|g| g.diff.clone()),
            &jobs
                .iter()
                .map(|j| serde_json::to_string(&j.env).unwrap_or_else(|_| "{}".into()))
                .collect::<Vec<_>>(),
            &col(&|j| j.host.clone()),
            &col(&|j| {
                let rt = j.environment.as_ref()?.runtime.as_ref()?;
                serde_json::to_string(rt).ok()
            }),
            &col(&|j| j.dist.as_ref().map(|d| d.group.clone())),
            &int(&|d| d.rank),
            &int(&|d| d.world_size),
            &int(&|d| d.local_rank),
            &int(&|d| d.node_rank),
        ],
    )?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Every new job's `rows`, each with its job's seq and its position in the job.
fn numbered<'a, T>(
    new: &[(i64, &'a JobRecord)],
    rows: fn(&'a JobRecord) -> &'a [T],
) -> Vec<(i64, i32, &'a T)> {
    new.iter()
        .flat_map(|&(seq, j)| {
            rows(j)
                .iter()
                .enumerate()
                .map(move |(i, r)| (seq, i as i32, r))
        })
        .collect()
}

/// The new jobs' file records: one row per job, an array per field (schema 3), by COPY in
/// binary (measured in bench/NOTES.md against a row per record and dictionaries of paths and
/// contents); the few S3 records' object fields beside them, by position.
fn copy_files(
    tx: &mut Transaction,
    sql: &Sql,
    new: &[(i64, &Outgoing)],
) -> Result<(), postgres::Error> {
    let mut rows = CopyRows::new();
    for &(seq, out) in new {
        let f = &out.files;
        rows.row(12);
        rows.int8(seq);
        rows.array(Elem::Bytea, f.paths().map(Some));
        rows.array(Elem::Char, f.roles.iter().map(|&r| Some(r)));
        rows.array(Elem::Int2, f.ops.iter().map(|&o| Some(o)));
        // blake3, sha256, sizes, then the same of the content before.
        for contents in [&f.now, &f.before] {
            let c = || contents.iter().map(Option::as_ref);
            rows.array(Elem::Bytea, c().map(|c| Some(&c?.blake3[..])));
            rows.array(Elem::Bytea, c().map(|c| Some(&c?.sha256.as_ref()?[..])));
            rows.array(Elem::Int8, c().map(|c| Some(c?.size)));
        }
        rows.array(Elem::Int8, f.first_ns.iter().copied());
        rows.array(Elem::Int8, f.last_ns.iter().copied());
    }
    let mut sink = tx.copy_in(&sql.copy_files)?;
    sink.write_all(&rows.finish()).map_err(copy_error)?;
    sink.finish()?;
    insert_s3_fields(tx, sql, new)
}

/// The PostgreSQL error inside an error of postgres' COPY writer, which wraps its connection's.
fn copy_error(e: std::io::Error) -> postgres::Error {
    match e.into_inner().map(|e| e.downcast::<postgres::Error>()) {
        Some(Ok(e)) => *e,
        _ => unreachable!("postgres' CopyInWriter fails only with its connection's errors"),
    }
}

/// The object fields of the new jobs' S3 records, by the record's position in its job.
fn insert_s3_fields(
    tx: &mut Transaction,
    sql: &Sql,
    new: &[(i64, &Outgoing)],
) -> Result<(), postgres::Error> {
    let s3: Vec<(i64, i32, &S3Object)> = new
        .iter()
        .flat_map(|&(seq, o)| o.files.s3.iter().map(move |(i, obj)| (seq, *i, obj)))
        .collect();
    if s3.is_empty() {
        return Ok(());
    }
    let col =
        |f: &dyn Fn(&S3Object) -> Option<String>| s3.iter().map(|o| f(o.2)).collect::<Vec<_>>();
    tx.execute(
        &sql.s3,
        &[
            &s3.iter().map(|o| o.0).collect::<Vec<_>>(),
            &s3.iter().map(|o| o.1).collect::<Vec<_>>(),
            &s3.iter().map(|o| o.2.bucket.as_str()).collect::<Vec<_>>(),
            &col(&|o| Some(o.key.clone())),
            &col(&|o| o.version_id.clone()),
            &col(&|o| o.etag.clone()),
            &s3.iter()
                .map(|o| o.2.size.map(|s| s as i64))
                .collect::<Vec<_>>(),
            &col(&|o| o.range.clone()),
        ],
    )?;
    Ok(())
}

/// The rows of the new jobs' processes, files, steps, step files and packages: one statement
/// (or one COPY) per table for the whole batch.
fn insert_children(
    tx: &mut Transaction,
    sql: &Sql,
    new: &[(i64, &Outgoing)],
) -> Result<(), postgres::Error> {
    copy_files(tx, sql, new)?;
    let new: Vec<(i64, &JobRecord)> = new.iter().map(|&(seq, o)| (seq, &o.job)).collect();
    insert_processes(tx, sql, &new)?;
    insert_steps(tx, sql, &new)?;
    insert_packages(tx, sql, &new)
}

/// The new jobs' processes, in one statement.
fn insert_processes(
    tx: &mut Transaction,
    sql: &Sql,
    new: &[(i64, &JobRecord)],
) -> Result<(), postgres::Error> {
    let procs: Vec<(i64, i32, &ProcessRecord)> = numbered(new, |j| &j.processes);
    tx.execute(
        &sql.processes,
        &[
            &procs.iter().map(|p| p.0).collect::<Vec<_>>(),
            &procs.iter().map(|p| p.1).collect::<Vec<_>>(),
            &procs.iter().map(|p| p.2.pid).collect::<Vec<_>>(),
            &procs.iter().map(|p| p.2.parent_pid).collect::<Vec<_>>(),
            &procs
                .iter()
                .map(|p| p.2.exe.as_deref().map(bytes))
                .collect::<Vec<_>>(),
            &procs
                .iter()
                .map(|p| argv_to_blob(&p.2.argv))
                .collect::<Vec<_>>(),
            &procs.iter().map(|p| p.2.started_ns).collect::<Vec<_>>(),
            &procs.iter().map(|p| p.2.ended_ns).collect::<Vec<_>>(),
        ],
    )?;
    Ok(())
}

/// The new jobs' steps and their files, one statement each.
fn insert_steps(
    tx: &mut Transaction,
    sql: &Sql,
    new: &[(i64, &JobRecord)],
) -> Result<(), postgres::Error> {
    let steps: Vec<(i64, &StepRecord)> = new
        .iter()
        .flat_map(|(seq, j)| j.steps.iter().map(move |s| (*seq, s)))
        .collect();
    if !steps.is_empty() {
        let stream = |fd: usize| {
            steps
                .iter()
                .map(|s| s.1.streams[fd].as_ref().map(|r| bytes(&r.path)))
                .collect::<Vec<_>>()
        };
        let appends: Vec<i32> = steps
            .iter()
            .map(|s| {
                (1..3)
                    .filter(|&fd| s.1.streams[fd].as_ref().is_some_and(|r| r.append))
                    .map(|fd| 1 << (fd - 1))
                    .sum()
            })
            .collect();
        tx.execute(
            &sql.steps,
            &[
                &steps.iter().map(|s| s.0).collect::<Vec<_>>(),
                &steps.iter().map(|s| s.1.seq as i32).collect::<Vec<_>>(),
                &steps
                    .iter()
                    .map(|s| s.1.parent.map(|p| p as i32))
                    .collect::<Vec<_>>(),
                &steps.iter().map(|s| s.1.pid).collect::<Vec<_>>(),
                &steps
                    .iter()
                    .map(|s| s.1.exe.as_deref().map(bytes))
                    .collect::<Vec<_>>(),
                &steps
                    .iter()
                    .map(|s| argv_to_blob(&s.1.argv))
                    .collect::<Vec<_>>(),
                &steps.iter().map(|s| bytes(&s.1.cwd)).collect::<Vec<_>>(),
                &steps.iter().map(|s| s.1.started_ns).collect::<Vec<_>>(),
                &steps.iter().map(|s| s.1.ended_ns).collect::<Vec<_>>(),
                &stream(0),
                &stream(1),
                &stream(2),
                &appends,
            ],
        )?;
        let all: Vec<(i64, i32, i32, &StepFile)> = steps
            .iter()
            .flat_map(|(seq, s)| {
                s.files
                    .iter()
                    .enumerate()
                    .map(move |(i, f)| (*seq, s.seq as i32, i as i32, f))
            })
            .collect();
        tx.execute(
            &sql.step_files,
            &[
                &all.iter().map(|a| a.0).collect::<Vec<_>>(),
                &all.iter().map(|a| a.1).collect::<Vec<_>>(),
                &all.iter().map(|a| a.2).collect::<Vec<_>>(),
                &all.iter().map(|a| a.3.role.as_str()).collect::<Vec<_>>(),
                &all.iter().map(|a| bytes(&a.3.path)).collect::<Vec<_>>(),
                &all.iter()
                    .map(|a| a.3.ops.names().join(","))
                    .collect::<Vec<_>>(),
                &all.iter()
                    .map(|a| a.3.from_step.map(|s| s as i32))
                    .collect::<Vec<_>>(),
                &all.iter().map(|a| a.3.content.as_str()).collect::<Vec<_>>(),
                &all.iter().map(|a| a.3.first_ns).collect::<Vec<_>>(),
                &all.iter().map(|a| a.3.last_ns).collect::<Vec<_>>(),
            ],
        )?;
    }
    Ok(())
}

/// Which packages each new job ran with (the packages themselves are shared rows, written first).
fn insert_packages(
    tx: &mut Transaction,
    sql: &Sql,
    new: &[(i64, &JobRecord)],
) -> Result<(), postgres::Error> {
    let pkgs: Vec<(i64, &Package)> = new
        .iter()
        .flat_map(|(seq, j)| {
            j.environment
                .iter()
                .flat_map(|e| e.packages.iter())
                .map(move |p| (*seq, p))
        })
        .collect();
    if !pkgs.is_empty() {
        let col = |f: fn(&Package) -> String| pkgs.iter().map(|p| f(p.1)).collect::<Vec<_>>();
        tx.execute(
            &sql.job_packages,
            &[
                &pkgs.iter().map(|p| p.0).collect::<Vec<_>>(),
                &col(|p| p.kind.clone()),
                &col(|p| p.name.clone()),
                &col(|p| p.version.clone()),
                &col(|p| p.location.clone().unwrap_or_default()),
                &col(|p| p.commit.clone().unwrap_or_default()),
            ],
        )?;
    }
    Ok(())
}
