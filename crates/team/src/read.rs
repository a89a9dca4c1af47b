//! Jobs read from the team store: what committed since a reader last looked. `jobs.xid` (the
//! inserting transaction) makes that exact although `seq` values commit out of order (see
//! [`read_since`]).

use std::collections::BTreeMap;

use postgres::GenericClient;

use super::codec::{outcome, path, role, role_of_code};
use roar_store::environment::{Environment, Package, Runtime};
use roar_store::{
    argv_from_blob, ContentHash, Distributed, FileRecord, GitState, JobRecord, Ops, ProcessRecord,
    Redirect, S3Object, StepContent, StepFile, StepRecord,
};

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
        let outcome = outcome(&r.get::<_, String>(7), r.get(8), r.get(9));
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
    add_processes(client, &seqs, &index, &mut jobs)?;
    add_files(client, &seqs, &index, &mut jobs)?;
    add_steps(client, &seqs, &index, &mut jobs)?;
    add_packages(client, &seqs, &index, &mut jobs)?;
    add_diffs(client, &mut jobs)?;
    Ok(Page { jobs, last_seq })
}

/// The page's jobs' processes.
fn add_processes(
    client: &mut impl GenericClient,
    seqs: &[i64],
    index: &BTreeMap<i64, usize>,
    jobs: &mut [JobRecord],
) -> Result<(), postgres::Error> {
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
    Ok(())
}

/// The page's jobs' file records: a row of arrays per job (schema 3), then the object fields
/// of its S3 records.
fn add_files(
    client: &mut impl GenericClient,
    seqs: &[i64],
    index: &BTreeMap<i64, usize>,
    jobs: &mut [JobRecord],
) -> Result<(), postgres::Error> {
    type Hashes = Vec<Option<Vec<u8>>>;
    type Ints = Vec<Option<i64>>;
    for r in client.query(
        "SELECT job_seq, paths, roles, ops, blake3, sha256, sizes, before_blake3, before_sha256,
                before_sizes, first_ns, last_ns
         FROM job_file_lists WHERE job_seq = ANY($1)",
        &[&seqs],
    )? {
        let paths: Vec<Vec<u8>> = r.get(1);
        let roles: Vec<i8> = r.get(2);
        let ops: Vec<i16> = r.get(3);
        let (blake3, sha256, sizes): (Hashes, Hashes, Ints) = (r.get(4), r.get(5), r.get(6));
        let (b_blake3, b_sha256, b_sizes): (Hashes, Hashes, Ints) = (r.get(7), r.get(8), r.get(9));
        let (first, last): (Ints, Ints) = (r.get(10), r.get(11));
        let hash = |b3: &Option<Vec<u8>>, sha: &Option<Vec<u8>>, size: Option<i64>| {
            b3.as_ref().map(|b3| ContentHash {
                blake3: hex::encode(b3),
                sha256: sha.as_ref().map(hex::encode),
                size: size.unwrap_or_default() as u64,
            })
        };
        jobs[index[&r.get::<_, i64>(0)]].files = paths
            .into_iter()
            .enumerate()
            .map(|(i, p)| FileRecord {
                role: role_of_code(roles[i]),
                path: path(p),
                hash: hash(&blake3[i], &sha256[i], sizes[i]),
                before: hash(&b_blake3[i], &b_sha256[i], b_sizes[i]),
                ops: Ops::from_bits(ops[i] as u8),
                first_ns: first[i],
                last_ns: last[i],
                s3: None,
            })
            .collect();
    }
    for r in client.query(
        "SELECT job_seq, ord, bucket, key, version_id, etag, size, range FROM job_file_s3
         WHERE job_seq = ANY($1)",
        &[&seqs],
    )? {
        let job = &mut jobs[index[&r.get::<_, i64>(0)]];
        if let Some(f) = job.files.get_mut(r.get::<_, i32>(1) as usize) {
            f.s3 = Some(S3Object {
                bucket: r.get(2),
                key: r.get::<_, Option<String>>(3).unwrap_or_default(),
                version_id: r.get(4),
                etag: r.get(5),
                size: r.get::<_, Option<i64>>(6).map(|s| s as u64),
                range: r.get(7),
            });
        }
    }
    Ok(())
}

/// The page's jobs' steps, then each step's files.
fn add_steps(
    client: &mut impl GenericClient,
    seqs: &[i64],
    index: &BTreeMap<i64, usize>,
    jobs: &mut [JobRecord],
) -> Result<(), postgres::Error> {
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
    Ok(())
}

/// The packages each of the page's jobs ran with.
fn add_packages(
    client: &mut impl GenericClient,
    seqs: &[i64],
    index: &BTreeMap<i64, usize>,
    jobs: &mut [JobRecord],
) -> Result<(), postgres::Error> {
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
    Ok(())
}

/// The uncommitted changes the page's dirty-tree jobs ran with.
fn add_diffs(
    client: &mut impl GenericClient,
    jobs: &mut [JobRecord],
) -> Result<(), postgres::Error> {
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
        for job in jobs.iter_mut() {
            let hash = job.git.as_ref().and_then(|g| g.diff.clone());
            if let (Some(hash), Some(env)) = (hash, job.environment.as_mut()) {
                env.diff = found.get(&hash).cloned();
            }
        }
    }
    Ok(())
}
