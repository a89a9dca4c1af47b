//! Jobs written to and read from the team store's tables (schema.rs has the tables).
//!
//! A job is keyed by its `uid` (never by a local id); its rows hang off `jobs.seq`, the order in
//! which the team store received jobs. Contents are keyed by blake3, packages by what they are.
//! Pushing a job is one `INSERT .. ON CONFLICT (uid) DO NOTHING`: a job pushed twice, from two
//! machines or by two pushers at once, is stored once. Shared rows (artifacts, blobs, packages)
//! are inserted in sorted order before the job, so concurrent pushers never deadlock on them.
//! `jobs.xid` (the inserting transaction) lets a reader fetch exactly what committed since it
//! last looked, although `seq` values commit out of order (see [`read_since`]).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use postgres::{GenericClient, Transaction};

use crate::environment::{Environment, Package, Runtime};
use crate::model::{
    argv_from_blob, argv_to_blob, ContentHash, Distributed, FileRecord, GitState, JobRecord, Ops,
    Outcome, ProcessRecord, Redirect, Role, S3Object, StepContent, StepFile, StepRecord,
};

fn bytes(p: &std::path::Path) -> Vec<u8> {
    p.as_os_str().as_bytes().to_vec()
}

fn path(b: Vec<u8>) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(&b))
}

fn role(s: &str) -> Role {
    match s {
        "input" => Role::Input,
        "output" => Role::Output,
        _ => Role::Temp,
    }
}

/// Writes `jobs` (each with its uid) in one transaction; returns how many were new. Shared rows
/// go first, sorted, then each job and its own rows.
pub(crate) fn write_jobs(
    tx: &mut Transaction,
    jobs: &[JobRecord],
    pushed_from: Option<&str>,
) -> Result<usize, postgres::Error> {
    let mut artifacts = BTreeMap::new();
    let mut packages = std::collections::BTreeSet::new();
    let mut blobs = BTreeMap::new();
    for job in jobs {
        for f in &job.files {
            for h in [&f.hash, &f.before].into_iter().flatten() {
                artifacts.entry(h.blake3.clone()).or_insert(h);
            }
        }
        if let Some(env) = &job.environment {
            packages.extend(env.packages.iter());
            if let (Some(diff), Some(hash)) =
                (&env.diff, job.git.as_ref().and_then(|g| g.diff.clone()))
            {
                blobs.insert(hash, diff);
            }
        }
    }
    let (a_b3, a_sha, a_size): (Vec<&str>, Vec<Option<&str>>, Vec<i64>) = artifacts
        .values()
        .map(|h| (h.blake3.as_str(), h.sha256.as_deref(), h.size as i64))
        .collect();
    tx.execute(
        "INSERT INTO artifacts (blake3, sha256, size)
         SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) ORDER BY 1
         ON CONFLICT (blake3) DO NOTHING",
        &[&a_b3, &a_sha, &a_size],
    )?;
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
    let mut new = 0;
    for job in jobs {
        if let Some(seq) = insert_job(tx, job, pushed_from)? {
            insert_children(tx, seq, job)?;
            new += 1;
        }
    }
    Ok(new)
}

/// The job's row; None if the team store already has it.
fn insert_job(
    tx: &mut Transaction,
    job: &JobRecord,
    pushed_from: Option<&str>,
) -> Result<Option<i64>, postgres::Error> {
    let (exit_code, signal) = match &job.outcome {
        Outcome::Exited(c) => (Some(*c), None),
        Outcome::Signaled(s) => (None, Some(*s)),
        _ => (None, None),
    };
    let git = job.git.as_ref();
    let env = serde_json::to_string(&job.env).unwrap_or_else(|_| "{}".into());
    let runtime = job
        .environment
        .as_ref()
        .and_then(|e| e.runtime.as_ref())
        .and_then(|r| serde_json::to_string(r).ok());
    let dist = job.dist.as_ref();
    let int = |v: Option<u32>| v.map(|v| v as i32);
    let row = tx.query_opt(
        "INSERT INTO jobs (uid, pushed_from, name, argv, cwd, started_ns, ended_ns, status,
                           exit_code, signal, incomplete, backend, git_commit, git_branch,
                           git_dirty, git_remote, git_diff, env, host, runtime, run_group, rank,
                           world_size, local_rank, node_rank)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
                 $19, $20, $21, $22, $23, $24, $25)
         ON CONFLICT (uid) DO NOTHING RETURNING seq",
        &[
            &job.uid,
            &pushed_from,
            &job.name,
            &argv_to_blob(&job.argv),
            &bytes(&job.cwd),
            &job.started_ns,
            &job.ended_ns,
            &job.outcome.status(),
            &exit_code,
            &signal,
            &job.incomplete,
            &job.backend,
            &git.and_then(|g| g.commit.as_deref()),
            &git.and_then(|g| g.branch.as_deref()),
            &git.map(|g| g.dirty),
            &git.and_then(|g| g.remote.as_deref()),
            &git.and_then(|g| g.diff.as_deref()),
            &env,
            &job.host,
            &runtime,
            &dist.map(|d| d.group.as_str()),
            &int(dist.and_then(|d| d.rank)),
            &int(dist.and_then(|d| d.world_size)),
            &int(dist.and_then(|d| d.local_rank)),
            &int(dist.and_then(|d| d.node_rank)),
        ],
    )?;
    Ok(row.map(|r| r.get(0)))
}

fn insert_children(tx: &mut Transaction, seq: i64, job: &JobRecord) -> Result<(), postgres::Error> {
    let procs = &job.processes;
    let ords: Vec<i32> = (0..procs.len() as i32).collect();
    tx.execute(
        "INSERT INTO processes (job_seq, ord, pid, parent_pid, exe, argv, started_ns, ended_ns)
         SELECT $1, * FROM unnest($2::int[], $3::int[], $4::int[], $5::bytea[], $6::bytea[],
                                  $7::bigint[], $8::bigint[])",
        &[
            &seq,
            &ords,
            &procs.iter().map(|p| p.pid).collect::<Vec<_>>(),
            &procs.iter().map(|p| p.parent_pid).collect::<Vec<_>>(),
            &procs
                .iter()
                .map(|p| p.exe.as_deref().map(bytes))
                .collect::<Vec<_>>(),
            &procs
                .iter()
                .map(|p| argv_to_blob(&p.argv))
                .collect::<Vec<_>>(),
            &procs.iter().map(|p| p.started_ns).collect::<Vec<_>>(),
            &procs.iter().map(|p| p.ended_ns).collect::<Vec<_>>(),
        ],
    )?;
    let files = &job.files;
    let s3 = |f: fn(&S3Object) -> Option<String>| {
        files
            .iter()
            .map(|r| r.s3.as_ref().and_then(f))
            .collect::<Vec<_>>()
    };
    tx.execute(
        "INSERT INTO job_files (job_seq, ord, role, path, blake3, before_blake3, ops, first_ns,
                               last_ns, s3_bucket, s3_key, s3_version_id, s3_etag, s3_size,
                               s3_range)
         SELECT $1, * FROM unnest($2::int[], $3::text[], $4::bytea[], $5::text[], $6::text[],
                                  $7::text[], $8::bigint[], $9::bigint[], $10::text[],
                                  $11::text[], $12::text[], $13::text[], $14::bigint[],
                                  $15::text[])",
        &[
            &seq,
            &(0..files.len() as i32).collect::<Vec<_>>(),
            &files.iter().map(|f| f.role.as_str()).collect::<Vec<_>>(),
            &files.iter().map(|f| bytes(&f.path)).collect::<Vec<_>>(),
            &files
                .iter()
                .map(|f| f.hash.as_ref().map(|h| h.blake3.as_str()))
                .collect::<Vec<_>>(),
            &files
                .iter()
                .map(|f| f.before.as_ref().map(|h| h.blake3.as_str()))
                .collect::<Vec<_>>(),
            &files
                .iter()
                .map(|f| f.ops.names().join(","))
                .collect::<Vec<_>>(),
            &files.iter().map(|f| f.first_ns).collect::<Vec<_>>(),
            &files.iter().map(|f| f.last_ns).collect::<Vec<_>>(),
            &s3(|o| Some(o.bucket.clone())),
            &s3(|o| Some(o.key.clone())),
            &s3(|o| o.version_id.clone()),
            &s3(|o| o.etag.clone()),
            &files
                .iter()
                .map(|f| f.s3.as_ref().and_then(|o| o.size).map(|s| s as i64))
                .collect::<Vec<_>>(),
            &s3(|o| o.range.clone()),
        ],
    )?;
    let steps = &job.steps;
    if !steps.is_empty() {
        let stream = |fd: usize| {
            steps
                .iter()
                .map(|s| s.streams[fd].as_ref().map(|r| bytes(&r.path)))
                .collect::<Vec<_>>()
        };
        let appends: Vec<i32> = steps
            .iter()
            .map(|s| {
                (1..3)
                    .filter(|&fd| s.streams[fd].as_ref().is_some_and(|r| r.append))
                    .map(|fd| 1 << (fd - 1))
                    .sum()
            })
            .collect();
        tx.execute(
            "INSERT INTO steps (job_seq, seq, parent_seq, pid, exe, argv, cwd, started_ns,
                                ended_ns, stdin, stdout, stderr, appends)
             SELECT $1, * FROM unnest($2::int[], $3::int[], $4::int[], $5::bytea[], $6::bytea[],
                                      $7::bytea[], $8::bigint[], $9::bigint[], $10::bytea[],
                                      $11::bytea[], $12::bytea[], $13::int[])",
            &[
                &seq,
                &steps.iter().map(|s| s.seq as i32).collect::<Vec<_>>(),
                &steps
                    .iter()
                    .map(|s| s.parent.map(|p| p as i32))
                    .collect::<Vec<_>>(),
                &steps.iter().map(|s| s.pid).collect::<Vec<_>>(),
                &steps
                    .iter()
                    .map(|s| s.exe.as_deref().map(bytes))
                    .collect::<Vec<_>>(),
                &steps
                    .iter()
                    .map(|s| argv_to_blob(&s.argv))
                    .collect::<Vec<_>>(),
                &steps.iter().map(|s| bytes(&s.cwd)).collect::<Vec<_>>(),
                &steps.iter().map(|s| s.started_ns).collect::<Vec<_>>(),
                &steps.iter().map(|s| s.ended_ns).collect::<Vec<_>>(),
                &stream(0),
                &stream(1),
                &stream(2),
                &appends,
            ],
        )?;
        let all: Vec<(i32, i32, &StepFile)> = steps
            .iter()
            .flat_map(|s| {
                s.files
                    .iter()
                    .enumerate()
                    .map(move |(i, f)| (s.seq as i32, i as i32, f))
            })
            .collect();
        tx.execute(
            "INSERT INTO step_files (job_seq, step_seq, ord, role, path, ops, from_seq, content,
                                     first_ns, last_ns)
             SELECT $1, * FROM unnest($2::int[], $3::int[], $4::text[], $5::bytea[], $6::text[],
                                      $7::int[], $8::text[], $9::bigint[], $10::bigint[])",
            &[
                &seq,
                &all.iter().map(|a| a.0).collect::<Vec<_>>(),
                &all.iter().map(|a| a.1).collect::<Vec<_>>(),
                &all.iter().map(|a| a.2.role.as_str()).collect::<Vec<_>>(),
                &all.iter().map(|a| bytes(&a.2.path)).collect::<Vec<_>>(),
                &all.iter()
                    .map(|a| a.2.ops.names().join(","))
                    .collect::<Vec<_>>(),
                &all.iter()
                    .map(|a| a.2.from_step.map(|s| s as i32))
                    .collect::<Vec<_>>(),
                &all.iter().map(|a| a.2.content.as_str()).collect::<Vec<_>>(),
                &all.iter().map(|a| a.2.first_ns).collect::<Vec<_>>(),
                &all.iter().map(|a| a.2.last_ns).collect::<Vec<_>>(),
            ],
        )?;
    }
    if let Some(env) = job.environment.as_ref().filter(|e| !e.packages.is_empty()) {
        let p = &env.packages;
        let col = |f: fn(&Package) -> String| p.iter().map(f).collect::<Vec<_>>();
        tx.execute(
            "INSERT INTO job_packages (job_seq, package_id)
             SELECT $1, p.id FROM packages p
             JOIN unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
                  AS u (kind, name, version, location, commit_id)
             USING (kind, name, version, location, commit_id)
             ON CONFLICT DO NOTHING",
            &[
                &seq,
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

/// What [`read_since`] found: jobs in the order the team store received them, and where the
/// next read starts.
pub(crate) struct Page {
    pub jobs: Vec<JobRecord>,
    /// The last `seq` read (the next page of the same read starts after it).
    pub last_seq: i64,
}

/// The horizon of a read: every transaction with an id below it has ended, so a job row with a
/// lower `xid` that is not visible now never will be. Taken first, in the reading transaction.
pub(crate) fn horizon(client: &mut impl GenericClient) -> Result<u64, postgres::Error> {
    let text: String = client
        .query_one("SELECT pg_snapshot_xmin(pg_current_snapshot())::text", &[])?
        .get(0);
    Ok(text.parse().unwrap_or(0))
}

/// Jobs whose inserting transaction is at or after `from_xid` (a previous read's horizon), with
/// `seq` after `after`, at most `limit`. Rows of transactions that were still running at the
/// previous read have an xid at or above its horizon, so nothing committed late is skipped; rows
/// read twice are recognised by uid by the caller.
pub(crate) fn read_since(
    client: &mut impl GenericClient,
    from_xid: u64,
    after: i64,
    limit: i64,
) -> Result<Page, postgres::Error> {
    let rows = client.query(
        "SELECT seq, uid, name, argv, cwd, started_ns, ended_ns, status, exit_code, signal,
                incomplete, backend, git_commit, git_branch, git_dirty, git_remote, git_diff, env,
                host, runtime, run_group, rank, world_size, local_rank, node_rank
         FROM jobs WHERE xid >= $1::text::xid8 AND seq > $2 ORDER BY seq LIMIT $3",
        &[&from_xid.to_string(), &after, &limit],
    )?;
    let mut jobs = Vec::with_capacity(rows.len());
    let mut seqs = Vec::with_capacity(rows.len());
    for r in &rows {
        let status: String = r.get(7);
        let outcome = match status.as_str() {
            "exited" => Outcome::Exited(r.get::<_, Option<i32>>(8).unwrap_or_default()),
            "signaled" => Outcome::Signaled(r.get::<_, Option<i32>>(9).unwrap_or_default()),
            "failed_to_start" => Outcome::FailedToStart(String::new()),
            "running" => Outcome::Running,
            _ => Outcome::Ended,
        };
        let git = r.get::<_, Option<bool>>(14).map(|dirty| GitState {
            commit: r.get(12),
            branch: r.get(13),
            dirty,
            remote: r.get(15),
            diff: r.get(16),
        });
        let uint = |at: usize| r.get::<_, Option<i32>>(at).map(|v| v as u32);
        let dist = r.get::<_, Option<String>>(20).map(|group| Distributed {
            group,
            rank: uint(21),
            world_size: uint(22),
            local_rank: uint(23),
            node_rank: uint(24),
        });
        let runtime: Option<Runtime> = r
            .get::<_, Option<String>>(19)
            .and_then(|s| serde_json::from_str(&s).ok());
        seqs.push(r.get::<_, i64>(0));
        jobs.push(JobRecord {
            uid: Some(r.get(1)),
            name: r.get(2),
            argv: argv_from_blob(&r.get::<_, Vec<u8>>(3)),
            cwd: path(r.get(4)),
            started_ns: r.get(5),
            ended_ns: r.get(6),
            outcome,
            incomplete: r.get(10),
            backend: r.get(11),
            git,
            env: serde_json::from_str(&r.get::<_, String>(17)).unwrap_or_default(),
            host: r.get(18),
            processes: Vec::new(),
            steps: Vec::new(),
            files: Vec::new(),
            environment: Some(Environment {
                packages: Vec::new(),
                runtime,
                diff: None,
            }),
            dist,
        });
    }
    let last_seq = seqs.last().copied().unwrap_or(after);
    if jobs.is_empty() {
        return Ok(Page { jobs, last_seq });
    }
    let index: BTreeMap<i64, usize> = seqs.iter().enumerate().map(|(i, s)| (*s, i)).collect();
    for r in client.query(
        "SELECT job_seq, pid, parent_pid, exe, argv, started_ns, ended_ns FROM processes
         WHERE job_seq = ANY($1) ORDER BY job_seq, ord",
        &[&seqs],
    )? {
        jobs[index[&r.get::<_, i64>(0)]]
            .processes
            .push(ProcessRecord {
                pid: r.get(1),
                parent_pid: r.get(2),
                exe: r.get::<_, Option<Vec<u8>>>(3).map(path),
                argv: argv_from_blob(&r.get::<_, Vec<u8>>(4)),
                started_ns: r.get(5),
                ended_ns: r.get(6),
            });
    }
    for r in client.query(
        "SELECT f.job_seq, f.role, f.path, f.ops, f.first_ns, f.last_ns,
                a.blake3, a.sha256, a.size, b.blake3, b.sha256, b.size,
                f.s3_bucket, f.s3_key, f.s3_version_id, f.s3_etag, f.s3_size, f.s3_range
         FROM job_files f
         LEFT JOIN artifacts a ON a.blake3 = f.blake3
         LEFT JOIN artifacts b ON b.blake3 = f.before_blake3
         WHERE f.job_seq = ANY($1) ORDER BY f.job_seq, f.ord",
        &[&seqs],
    )? {
        let hash = |at: usize| {
            r.get::<_, Option<String>>(at).map(|blake3| ContentHash {
                blake3,
                sha256: r.get(at + 1),
                size: r.get::<_, i64>(at + 2) as u64,
            })
        };
        let s3 = r.get::<_, Option<String>>(12).map(|bucket| S3Object {
            bucket,
            key: r.get::<_, Option<String>>(13).unwrap_or_default(),
            version_id: r.get(14),
            etag: r.get(15),
            size: r.get::<_, Option<i64>>(16).map(|s| s as u64),
            range: r.get(17),
        });
        jobs[index[&r.get::<_, i64>(0)]].files.push(FileRecord {
            role: role(r.get(1)),
            path: path(r.get(2)),
            hash: hash(6),
            before: hash(9),
            ops: Ops::parse(r.get(3)),
            first_ns: r.get(4),
            last_ns: r.get(5),
            s3,
        });
    }
    for r in client.query(
        "SELECT job_seq, seq, parent_seq, pid, exe, argv, cwd, started_ns, ended_ns, stdin,
                stdout, stderr, appends
         FROM steps WHERE job_seq = ANY($1) ORDER BY job_seq, seq",
        &[&seqs],
    )? {
        let appends: i32 = r.get(12);
        let stream = |at: usize, append: bool| {
            r.get::<_, Option<Vec<u8>>>(at).map(|p| Redirect {
                path: path(p),
                append,
            })
        };
        jobs[index[&r.get::<_, i64>(0)]].steps.push(StepRecord {
            seq: r.get::<_, i32>(1) as u32,
            parent: r.get::<_, Option<i32>>(2).map(|p| p as u32),
            pid: r.get(3),
            exe: r.get::<_, Option<Vec<u8>>>(4).map(path),
            argv: argv_from_blob(&r.get::<_, Vec<u8>>(5)),
            cwd: path(r.get(6)),
            started_ns: r.get(7),
            ended_ns: r.get(8),
            streams: [
                stream(9, false),
                stream(10, appends & 1 != 0),
                stream(11, appends & 2 != 0),
            ],
            files: Vec::new(),
        });
    }
    for r in client.query(
        "SELECT job_seq, step_seq, role, path, ops, from_seq, content, first_ns, last_ns
         FROM step_files WHERE job_seq = ANY($1) ORDER BY job_seq, step_seq, ord",
        &[&seqs],
    )? {
        let job = &mut jobs[index[&r.get::<_, i64>(0)]];
        let step_seq = r.get::<_, i32>(1) as u32;
        if let Some(step) = job.steps.iter_mut().find(|s| s.seq == step_seq) {
            step.files.push(StepFile {
                role: role(r.get(2)),
                path: path(r.get(3)),
                ops: Ops::parse(r.get(4)),
                from_step: r.get::<_, Option<i32>>(5).map(|s| s as u32),
                content: StepContent::parse(r.get(6)),
                first_ns: r.get(7),
                last_ns: r.get(8),
            });
        }
    }
    for r in client.query(
        "SELECT jp.job_seq, p.kind, p.name, p.version, p.installer, p.location, p.commit_id
         FROM job_packages jp JOIN packages p ON p.id = jp.package_id
         WHERE jp.job_seq = ANY($1) ORDER BY jp.job_seq, p.kind, p.name, p.version",
        &[&seqs],
    )? {
        let nonempty = |s: String| (!s.is_empty()).then_some(s);
        let job = &mut jobs[index[&r.get::<_, i64>(0)]];
        if let Some(env) = job.environment.as_mut() {
            env.packages.push(Package {
                kind: r.get(1),
                name: r.get(2),
                version: r.get(3),
                installer: r.get(4),
                location: nonempty(r.get(5)),
                commit: nonempty(r.get(6)),
            });
        }
    }
    let diffs: Vec<String> = jobs
        .iter()
        .filter_map(|j| j.git.as_ref().and_then(|g| g.diff.clone()))
        .collect();
    if !diffs.is_empty() {
        let found: BTreeMap<String, Vec<u8>> = client
            .query(
                "SELECT blake3, data FROM blobs WHERE blake3 = ANY($1)",
                &[&diffs],
            )?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        for job in &mut jobs {
            let hash = job.git.as_ref().and_then(|g| g.diff.clone());
            if let (Some(hash), Some(env)) = (hash, job.environment.as_mut()) {
                env.diff = found.get(&hash).cloned();
            }
        }
    }
    Ok(Page { jobs, last_seq })
}
