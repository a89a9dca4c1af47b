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
use std::os::unix::ffi::OsStrExt;

use postgres::binary_copy::BinaryCopyInWriter;
use postgres::types::{accepts, to_sql_checked, IsNull, ToSql, Type};
use postgres::Transaction;

use super::codec::{bytes, role_code};
use roar_store::environment::Package;
use roar_store::{
    argv_to_blob, ContentHash, Distributed, FileRecord, GitState, JobRecord, Outcome,
    ProcessRecord, S3Object, StepFile, StepRecord,
};

/// Writes `jobs` (each with its uid) in one transaction; returns how many were new. Shared rows
/// go first, sorted, then each job and its own rows.
pub(crate) fn write_jobs(
    tx: &mut Transaction,
    jobs: &[JobRecord],
    pushed_from: Option<&str>,
) -> Result<usize, postgres::Error> {
    let mut packages = BTreeSet::new();
    let mut blobs = BTreeMap::new();
    for job in jobs {
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
        tx.execute(
            "INSERT INTO blobs (blake3, data) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[hash, data],
        )?;
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
        "INSERT INTO packages (kind, name, version, installer, location, commit_id)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
         ORDER BY 1, 2, 3, 5, 6
         ON CONFLICT DO NOTHING",
        &[&kinds, &names, &versions, &installers, &locations, &commits],
    )?;
    let seqs = insert_jobs(tx, jobs, pushed_from)?;
    let new: Vec<(i64, &JobRecord)> = jobs
        .iter()
        .filter_map(|j| Some((*seqs.get(j.uid.as_deref()?)?, j)))
        .collect();
    if !new.is_empty() {
        insert_children(tx, &new)?;
    }
    Ok(new.len())
}

/// The jobs' rows, in one statement; the `seq` of each job the team store did not have, by uid.
fn insert_jobs(
    tx: &mut Transaction,
    jobs: &[JobRecord],
    pushed_from: Option<&str>,
) -> Result<BTreeMap<String, i64>, postgres::Error> {
    let col = |f: &dyn Fn(&JobRecord) -> Option<String>| jobs.iter().map(f).collect::<Vec<_>>();
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
        "INSERT INTO jobs (pushed_from, uid, name, argv, cwd, started_ns, ended_ns, status,
                           exit_code, signal, incomplete, backend, git_commit, git_branch,
                           git_dirty, git_remote, git_diff, env, host, runtime, run_group, rank,
                           world_size, local_rank, node_rank)
         SELECT $1::text, * FROM unnest($2::text[], $3::text[], $4::bytea[], $5::bytea[],
                $6::bigint[], $7::bigint[], $8::text[], $9::int[], $10::int[], $11::bool[],
                $12::text[], $13::text[], $14::text[], $15::bool[], $16::text[], $17::text[],
                $18::text[], $19::text[], $20::text[], $21::text[], $22::int[], $23::int[],
                $24::int[], $25::int[])
         ON CONFLICT (uid) DO NOTHING RETURNING uid, seq",
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
fn copy_files(tx: &mut Transaction, new: &[(i64, &JobRecord)]) -> Result<(), postgres::Error> {
    let sink = tx.copy_in(
        "COPY job_file_lists (job_seq, paths, roles, ops, blake3, sha256, sizes, before_blake3,
                              before_sha256, before_sizes, first_ns, last_ns)
         FROM STDIN BINARY",
    )?;
    let (bytes, ints) = (Type::BYTEA_ARRAY, Type::INT8_ARRAY);
    let types = [
        Type::INT8,
        bytes.clone(),
        Type::CHAR_ARRAY,
        Type::INT2_ARRAY,
        bytes.clone(),
        bytes.clone(),
        ints.clone(),
        bytes.clone(),
        bytes,
        ints.clone(),
        ints.clone(),
        ints,
    ];
    let mut rows = BinaryCopyInWriter::new(sink, &types);
    for &(seq, job) in new {
        let files = &job.files;
        let ints = |f: &dyn Fn(&FileRecord) -> Option<i64>| -> Vec<Option<i64>> {
            files.iter().map(f).collect()
        };
        let (now, before) = (
            Contents::of(files, |f| &f.hash),
            Contents::of(files, |f| &f.before),
        );
        rows.write(&[
            &seq,
            &files
                .iter()
                .map(|f| f.path.as_os_str().as_bytes())
                .collect::<Vec<_>>(),
            &files.iter().map(|f| role_code(f.role)).collect::<Vec<_>>(),
            &files
                .iter()
                .map(|f| i16::from(f.ops.bits()))
                .collect::<Vec<_>>(),
            &now.blake3,
            &now.sha256,
            &now.sizes,
            &before.blake3,
            &before.sha256,
            &before.sizes,
            &ints(&|f| f.first_ns),
            &ints(&|f| f.last_ns),
        ])?;
    }
    rows.finish()?;
    insert_s3_fields(tx, new)
}

/// One content field of a job's file records (what each had, or had before), as the arrays of
/// schema 3.
struct Contents<'a> {
    blake3: Vec<Option<HashBytes<'a>>>,
    sha256: Vec<Option<HashBytes<'a>>>,
    sizes: Vec<Option<i64>>,
}

impl<'a> Contents<'a> {
    fn of(files: &'a [FileRecord], field: fn(&FileRecord) -> &Option<ContentHash>) -> Self {
        let hashes: Vec<Option<&ContentHash>> = files.iter().map(|f| field(f).as_ref()).collect();
        Contents {
            blake3: hashes
                .iter()
                .map(|h| Some(HashBytes(&h.as_ref()?.blake3)))
                .collect(),
            sha256: hashes
                .iter()
                .map(|h| Some(HashBytes(h.as_ref()?.sha256.as_deref()?)))
                .collect(),
            sizes: hashes
                .iter()
                .map(|h| Some(h.as_ref()?.size as i64))
                .collect(),
        }
    }
}

/// A content hash, held in hex by the local store, sent as its bytes (`bytea`); a hash that is
/// not hex fails the push with the reason, as any value PostgreSQL cannot take.
#[derive(Debug)]
struct HashBytes<'a>(&'a str);

impl ToSql for HashBytes<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let mut raw = [0u8; 32];
        let raw = match hex::decode_to_slice(self.0, &mut raw) {
            Ok(()) => &raw[..],
            Err(_) => {
                &hex::decode(self.0).map_err(|e| format!("content hash {:?}: {e}", self.0))?
            }
        };
        raw.to_sql(ty, out)
    }

    accepts!(BYTEA);
    to_sql_checked!();
}

/// The object fields of the new jobs' S3 records, by the record's position in its job.
fn insert_s3_fields(
    tx: &mut Transaction,
    new: &[(i64, &JobRecord)],
) -> Result<(), postgres::Error> {
    let s3: Vec<(i64, i32, &S3Object)> = numbered(new, |j| &j.files)
        .into_iter()
        .filter_map(|(seq, i, f)| Some((seq, i, f.s3.as_ref()?)))
        .collect();
    if s3.is_empty() {
        return Ok(());
    }
    let col =
        |f: &dyn Fn(&S3Object) -> Option<String>| s3.iter().map(|o| f(o.2)).collect::<Vec<_>>();
    tx.execute(
        "INSERT INTO job_file_s3 (job_seq, ord, bucket, key, version_id, etag, size, range)
         SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::text[],
                              $6::text[], $7::bigint[], $8::text[])",
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
fn insert_children(tx: &mut Transaction, new: &[(i64, &JobRecord)]) -> Result<(), postgres::Error> {
    insert_processes(tx, new)?;
    copy_files(tx, new)?;
    insert_steps(tx, new)?;
    insert_packages(tx, new)
}

/// The new jobs' processes, in one statement.
fn insert_processes(
    tx: &mut Transaction,
    new: &[(i64, &JobRecord)],
) -> Result<(), postgres::Error> {
    let procs: Vec<(i64, i32, &ProcessRecord)> = numbered(new, |j| &j.processes);
    tx.execute(
        "INSERT INTO processes (job_seq, ord, pid, parent_pid, exe, argv, started_ns, ended_ns)
         SELECT * FROM unnest($1::bigint[], $2::int[], $3::int[], $4::int[], $5::bytea[],
                              $6::bytea[], $7::bigint[], $8::bigint[])",
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
fn insert_steps(tx: &mut Transaction, new: &[(i64, &JobRecord)]) -> Result<(), postgres::Error> {
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
            "INSERT INTO steps (job_seq, seq, parent_seq, pid, exe, argv, cwd, started_ns,
                                ended_ns, stdin, stdout, stderr, appends)
             SELECT * FROM unnest($1::bigint[], $2::int[], $3::int[], $4::int[], $5::bytea[],
                                  $6::bytea[], $7::bytea[], $8::bigint[], $9::bigint[],
                                  $10::bytea[], $11::bytea[], $12::bytea[], $13::int[])",
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
            "INSERT INTO step_files (job_seq, step_seq, ord, role, path, ops, from_seq, content,
                                     first_ns, last_ns)
             SELECT * FROM unnest($1::bigint[], $2::int[], $3::int[], $4::text[], $5::bytea[],
                                  $6::text[], $7::int[], $8::text[], $9::bigint[], $10::bigint[])",
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
fn insert_packages(tx: &mut Transaction, new: &[(i64, &JobRecord)]) -> Result<(), postgres::Error> {
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
            "INSERT INTO job_packages (job_seq, package_id)
             SELECT u.job_seq, p.id FROM packages p
             JOIN unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
                  AS u (job_seq, kind, name, version, location, commit_id)
             USING (kind, name, version, location, commit_id)
             ON CONFLICT DO NOTHING",
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
