//! Read-side queries behind `roar log`, `roar show` and `roar db`.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::functions::FunctionFlags;
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::Serialize;

use crate::error::{Result, StoreError};
use crate::ignore::Ignore;
use crate::model::{argv_from_blob, ContentHash, GitState, Ops, ProcessRecord, Role, S3Object};

/// One line of `roar log`.
#[derive(Debug, Clone, Serialize)]
pub struct JobSummary {
    pub id: i64,
    pub name: Option<String>,
    pub argv: Vec<String>,
    pub cwd: String,
    pub started_ns: i64,
    pub ended_ns: Option<i64>,
    pub status: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub incomplete: bool,
    pub backend: String,
    pub git: Option<GitState>,
    pub inputs: i64,
    pub outputs: i64,
    /// The job's global identity, the same in every store that holds it (the team store).
    pub uid: Option<String>,
    /// The distributed run the job is a rank of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dist: Option<crate::Distributed>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FileRow {
    pub role: Role,
    pub kind: String,
    pub path: String,
    pub hash: Option<ContentHash>,
    pub before: Option<ContentHash>,
    pub ops: Vec<&'static str>,
    /// Bucket, key, version, ETag and range, for S3 objects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Object>,
}

#[derive(Debug, Clone, Serialize)]
pub struct JobDetail {
    #[serde(flatten)]
    pub summary: JobSummary,
    pub host: Option<String>,
    pub env: BTreeMap<String, String>,
    pub processes: Vec<ProcessRecord>,
    pub files: Vec<FileRow>,
    /// The job's steps, root first (SEMANTICS.md "Steps"); empty when the job is one step.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<crate::model::StepDetail>,
    /// Packages used and the machine (schema 8 on; empty for jobs recorded before).
    pub environment: crate::environment::EnvironmentDetail,
    /// Labels put on the job (schema 12).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// One job's use of an artifact or path.
#[derive(Debug, Clone, Serialize)]
pub struct Use {
    pub job_id: i64,
    pub role: Role,
    pub path: String,
    pub argv: Vec<String>,
    pub started_ns: i64,
    pub hash: Option<ContentHash>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ArtifactDetail {
    pub hash: ContentHash,
    pub made_by: Vec<Use>,
    pub used_by: Vec<Use>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PathDetail {
    pub path: String,
    /// Every job that read or wrote the path, oldest first.
    pub history: Vec<Use>,
}

const SUMMARY_COLS: &str =
    "j.id, j.name, j.argv, j.cwd, j.started_ns, j.ended_ns, j.status, j.exit_code,
     j.signal, j.incomplete, j.backend, j.git_commit, j.git_branch, j.git_dirty,
     (SELECT count(*) FROM job_files f
      WHERE f.job_id = j.id AND f.role = 'input' AND NOT roar_noise(f.path)),
     (SELECT count(*) FROM job_files f
      WHERE f.job_id = j.id AND f.role = 'output' AND NOT roar_noise(f.path)),
     j.recorder, j.host, j.git_remote, j.git_diff,
     j.uid, j.run_group, j.rank, j.world_size, j.local_rank, j.node_rank";

fn lossy_argv(blob: &[u8]) -> Vec<String> {
    argv_from_blob(blob)
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

fn lossy(blob: Vec<u8>) -> String {
    String::from_utf8_lossy(&blob).into_owned()
}

/// A path or argv column as bytes, whether it was stored as BLOB (roar) or TEXT (by hand).
fn bytes(r: &Row, idx: usize) -> rusqlite::Result<Vec<u8>> {
    match r.get_ref(idx)? {
        rusqlite::types::ValueRef::Null => Ok(Vec::new()),
        v => Ok(v.as_bytes()?.to_vec()),
    }
}

fn summary_from_row(r: &Row) -> rusqlite::Result<JobSummary> {
    let dirty: Option<bool> = r.get(13)?;
    let commit: Option<String> = r.get(11)?;
    let branch: Option<String> = r.get(12)?;
    Ok(JobSummary {
        id: r.get(0)?,
        name: r.get(1)?,
        argv: lossy_argv(&bytes(r, 2)?),
        cwd: lossy(bytes(r, 3)?),
        started_ns: r.get(4)?,
        ended_ns: r.get(5)?,
        status: crate::model::live_status(
            r.get(6)?,
            r.get(16)?,
            r.get::<_, Option<String>>(17)?.as_deref(),
        ),
        exit_code: r.get(7)?,
        signal: r.get(8)?,
        incomplete: r.get(9)?,
        backend: r.get(10)?,
        git: dirty.map(|dirty| GitState {
            commit,
            branch,
            dirty,
            remote: r.get(18).ok().flatten(),
            diff: r.get(19).ok().flatten(),
        }),
        inputs: r.get(14)?,
        outputs: r.get(15)?,
        uid: r.get(20)?,
        dist: r
            .get::<_, Option<String>>(21)?
            .map(|group| crate::Distributed {
                group,
                rank: r.get(22).ok().flatten(),
                world_size: r.get(23).ok().flatten(),
                local_rank: r.get(24).ok().flatten(),
                node_rank: r.get(25).ok().flatten(),
            }),
    })
}

pub(crate) fn hash_from(
    blake3: Option<String>,
    sha256: Option<String>,
    size: Option<i64>,
) -> Option<ContentHash> {
    Some(ContentHash {
        blake3: blake3?,
        sha256,
        size: size? as u64,
    })
}

/// The store, opened for reading and querying.
pub struct Store {
    pub(crate) conn: Connection,
    pub(crate) path: PathBuf,
    /// Paths that are environment, not data: left out of every answer (see [`Store::hide`]).
    pub(crate) noise: Option<Arc<Ignore>>,
}

impl Store {
    pub fn open(path: &Path) -> Result<Store> {
        let mut store = Store {
            conn: crate::db::open(path, false)?,
            path: path.to_owned(),
            noise: None,
        };
        store.hide(None)?;
        Ok(store)
    }

    /// Leaves the paths `noise` matches out of every answer from now on: jobs recorded before an
    /// ignore glob was added are shown as if it had applied. The rule is also the SQL function
    /// `roar_noise(path)`, so counts computed in SQL agree with the lists built here.
    pub fn hide(&mut self, noise: Option<Ignore>) -> Result<()> {
        self.hide_shared(noise.map(Arc::new))
    }

    /// [`Store::hide`] with a rule another store of the same project uses too.
    pub(crate) fn hide_shared(&mut self, noise: Option<Arc<Ignore>>) -> Result<()> {
        let f = noise.clone();
        self.conn
            .create_scalar_function(
                "roar_noise",
                1,
                FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
                move |ctx| {
                    let Some(f) = &f else { return Ok(false) };
                    let bytes = match ctx.get_raw(0) {
                        ValueRef::Blob(b) | ValueRef::Text(b) => b,
                        _ => return Ok(false),
                    };
                    Ok(f.is_ignored(Path::new(std::ffi::OsStr::from_bytes(bytes))))
                },
            )
            .map_err(|e| self.err(e))?;
        self.noise = noise;
        Ok(())
    }

    /// Whether `path` is hidden by [`Store::hide`].
    pub fn is_noise(&self, path: &str) -> bool {
        self.noise
            .as_ref()
            .is_some_and(|n| n.is_ignored(Path::new(path)))
    }

    /// [`Store::is_noise`] of a path's bytes.
    pub(crate) fn is_noise_bytes(&self, path: &[u8]) -> bool {
        self.noise
            .as_ref()
            .is_some_and(|n| n.is_ignored(Path::new(std::ffi::OsStr::from_bytes(path))))
    }

    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    pub(crate) fn err(&self, e: rusqlite::Error) -> StoreError {
        crate::db::classify(&self.path, e)
    }

    /// Jobs, the last started first (ids are given as rows are written: see migration 11).
    pub fn jobs(&self, limit: usize) -> Result<Vec<JobSummary>> {
        let sql = format!(
            "SELECT {SUMMARY_COLS} FROM jobs j ORDER BY j.started_ns DESC, j.id DESC LIMIT ?1"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([limit as i64], summary_from_row)
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>());
        rows.map_err(|e| self.err(e))
    }

    /// Changes whenever a job is added, ends or is removed: what a live view polls (a cheap
    /// aggregate over the jobs table, not the files).
    pub fn revision(&self) -> Result<(i64, i64, i64)> {
        self.conn
            .prepare_cached("SELECT COUNT(*), COALESCE(MAX(id), 0), COUNT(ended_ns) FROM jobs")
            .and_then(|mut s| s.query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))))
            .map_err(|e| self.err(e))
    }

    /// The latest job recorded with `--name NAME`, or the `back`-th before it (`NAME~back`).
    pub fn job_named(&self, name: &str, back: usize) -> Result<Option<i64>> {
        self.conn
            .prepare_cached(
                "SELECT id FROM jobs WHERE name = ?1 ORDER BY started_ns DESC, id DESC
                 LIMIT 1 OFFSET ?2",
            )
            .and_then(|mut s| {
                s.query_row(params![name, back.min(i64::MAX as usize) as i64], |r| {
                    r.get(0)
                })
                .optional()
            })
            .map_err(|e| self.err(e))
    }

    /// The latest job without a `--name` that `named` names `name` from its argv (the default
    /// name: `python train.py` is `train`), or the `back`-th before it (`NAME~back`). Jobs that
    /// never started have no name.
    pub fn job_by_default_name(
        &self,
        name: &str,
        back: usize,
        named: impl Fn(&[String]) -> Option<String>,
    ) -> Result<Option<i64>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, argv FROM jobs WHERE name IS NULL AND status != 'failed_to_start'
                 ORDER BY started_ns DESC, id DESC",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))
            .map_err(|e| self.err(e))?;
        let mut seen = 0;
        for row in rows {
            let (id, argv) = row.map_err(|e| self.err(e))?;
            if named(&lossy_argv(&argv)).as_deref() == Some(name) {
                if seen == back {
                    return Ok(Some(id));
                }
                seen += 1;
            }
        }
        Ok(None)
    }

    /// A transaction that takes the write lock at once (waiting up to the busy timeout for it):
    /// one that read first and wrote after would fail at once when another process (a run's
    /// recorder finishing its job) committed in between, as "database is locked".
    fn write_transaction(&self) -> rusqlite::Result<rusqlite::Transaction<'_>> {
        rusqlite::Transaction::new_unchecked(&self.conn, rusqlite::TransactionBehavior::Immediate)
    }

    /// Removes a job's record (its processes and file records with it) and the content
    /// records nothing refers to any more. Files are never touched.
    pub fn delete_job(&self, id: i64) -> Result<bool> {
        let delete = || -> rusqlite::Result<bool> {
            let tx = self.write_transaction()?;
            let n = tx.execute("DELETE FROM jobs WHERE id = ?1", [id])?;
            // A dirty tree's diff no job refers to any more goes too (it may be megabytes).
            tx.execute(
                "DELETE FROM blobs WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.git_diff = blobs.blake3)",
                [],
            )?;
            tx.execute(
                "DELETE FROM artifacts WHERE NOT EXISTS (SELECT 1 FROM job_files f WHERE f.artifact_id = artifacts.id)
                   AND NOT EXISTS (SELECT 1 FROM job_files f WHERE f.before_artifact_id = artifacts.id)
                   AND NOT EXISTS (SELECT 1 FROM s3_objects o WHERE o.artifact_id = artifacts.id)",
                [],
            )?;
            tx.commit()?;
            Ok(n == 1)
        };
        delete().map_err(|e| self.err(e))
    }

    pub fn job(&self, id: i64) -> Result<JobDetail> {
        let sql = format!("SELECT {SUMMARY_COLS}, j.env FROM jobs j WHERE j.id = ?1");
        let found = self
            .conn
            .query_row(&sql, [id], |r| {
                Ok((
                    summary_from_row(r)?,
                    r.get::<_, Option<String>>(17)?,
                    r.get::<_, String>(26)?,
                ))
            })
            .optional()
            .map_err(|e| self.err(e))?;
        let Some((summary, host, env)) = found else {
            return Err(StoreError::UnknownJob { id });
        };
        let processes = self.processes(id).map_err(|e| self.err(e))?;
        let files = self.files(id).map_err(|e| self.err(e))?;
        let steps = self.steps(id)?;
        let environment = crate::environment::EnvironmentDetail {
            packages: crate::environment::packages_of(&self.conn, id).map_err(|e| self.err(e))?,
            runtime: crate::environment::runtime_of(&self.conn, id).map_err(|e| self.err(e))?,
        };
        let labels = self.labels(id)?;
        Ok(JobDetail {
            summary,
            host,
            env: serde_json::from_str(&env).unwrap_or_default(),
            processes,
            files,
            steps,
            environment,
            labels,
        })
    }

    /// Job `id`'s labels.
    pub fn labels(&self, id: i64) -> Result<BTreeMap<String, String>> {
        let read = || -> rusqlite::Result<BTreeMap<String, String>> {
            self.conn
                .prepare_cached("SELECT key, value FROM labels WHERE job_id = ?1")?
                .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        };
        read().map_err(|e| self.err(e))
    }

    /// Sets (`Some`) or removes (`None`) labels of job `id`, in one transaction.
    pub fn set_labels(&self, id: i64, labels: &[(String, Option<String>)]) -> Result<()> {
        let write = || -> rusqlite::Result<bool> {
            let tx = self.write_transaction()?;
            let exists = tx
                .query_row("SELECT 1 FROM jobs WHERE id = ?1", [id], |_| Ok(()))
                .optional()?
                .is_some();
            for (k, v) in labels.iter().filter(|_| exists) {
                match v {
                    Some(v) => tx.execute(
                        "INSERT INTO labels (job_id, key, value) VALUES (?1, ?2, ?3)
                         ON CONFLICT (job_id, key) DO UPDATE SET value = excluded.value",
                        rusqlite::params![id, k, v],
                    )?,
                    None => tx.execute(
                        "DELETE FROM labels WHERE job_id = ?1 AND key = ?2",
                        rusqlite::params![id, k],
                    )?,
                };
            }
            tx.commit()?;
            Ok(exists)
        };
        match write().map_err(|e| self.err(e))? {
            true => Ok(()),
            false => Err(StoreError::UnknownJob { id }),
        }
    }

    /// The uncommitted changes job `id` ran with (`git diff HEAD --binary`), when kept.
    pub fn job_patch(&self, id: i64) -> Result<Option<Vec<u8>>> {
        let hash: Option<Option<String>> = self
            .conn
            .query_row("SELECT git_diff FROM jobs WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(|e| self.err(e))?;
        let Some(hash) = hash else {
            return Err(StoreError::UnknownJob { id });
        };
        match hash {
            Some(h) => crate::environment::blob(&self.conn, &h).map_err(|e| self.err(e)),
            None => Ok(None),
        }
    }

    fn processes(&self, job: i64) -> rusqlite::Result<Vec<ProcessRecord>> {
        let mut stmt = self.conn.prepare(
            "SELECT pid, parent_pid, exe, argv, started_ns, ended_ns FROM processes
             WHERE job_id = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map([job], |r| {
            Ok(ProcessRecord {
                pid: r.get(0)?,
                parent_pid: r.get(1)?,
                exe: r
                    .get::<_, Option<Vec<u8>>>(2)?
                    .map(|b| PathBuf::from(std::ffi::OsString::from(lossy(b)))),
                argv: argv_from_blob(&r.get::<_, Option<Vec<u8>>>(3)?.unwrap_or_default()),
                started_ns: r.get(4)?,
                ended_ns: r.get(5)?,
            })
        })?;
        rows.collect()
    }

    fn files(&self, job: i64) -> rusqlite::Result<Vec<FileRow>> {
        let mut stmt = self.conn.prepare(
            "SELECT f.role, f.kind, f.path, a.blake3, a.sha256, a.size, b.blake3, b.sha256, b.size, f.ops,
                    o.bucket, o.key, o.version_id, o.etag, o.size, o.range
             FROM job_files f
             LEFT JOIN artifacts a ON a.id = f.artifact_id
             LEFT JOIN s3_objects o ON o.id = f.s3_object_id
             JOIN jobs j ON j.id = f.job_id
             -- The previous content: recorded by the producer, else the path's last record that
             -- began before this one did, by time — the record's first access, else its job's
             -- start; row ids only break ties. Never by row id alone: jobs are written when they
             -- end, so a reader of this output can have the smaller id, and a team store's mirror
             -- numbers jobs in the order they were pushed, not run.
             LEFT JOIN artifacts b ON b.id = coalesce(f.before_artifact_id, (
                 SELECT p.artifact_id FROM job_files p JOIN jobs pj ON pj.id = p.job_id
                 WHERE p.path = f.path AND p.id != f.id AND p.role != 'temp' AND f.role = 'output'
                   AND (coalesce(p.first_ns, pj.started_ns), p.id)
                       < (coalesce(f.first_ns, j.started_ns), f.id)
                 ORDER BY coalesce(p.first_ns, pj.started_ns) DESC, p.id DESC LIMIT 1))
             WHERE f.job_id = ?1 AND NOT roar_noise(f.path)
             ORDER BY CASE f.role WHEN 'input' THEN 0 WHEN 'output' THEN 1 ELSE 2 END, f.path",
        )?;
        let rows = stmt.query_map([job], |r| {
            Ok(FileRow {
                role: Role::parse(&r.get::<_, String>(0)?),
                kind: r.get(1)?,
                path: lossy(bytes(r, 2)?),
                hash: hash_from(r.get(3)?, r.get(4)?, r.get(5)?),
                before: hash_from(r.get(6)?, r.get(7)?, r.get(8)?),
                ops: Ops::parse(&r.get::<_, String>(9)?).names(),
                s3: match r.get::<_, Option<String>>(10)? {
                    Some(bucket) => Some(S3Object {
                        bucket,
                        key: r.get(11)?,
                        version_id: r.get(12)?,
                        etag: r.get(13)?,
                        size: r.get::<_, Option<i64>>(14)?.map(|s| s as u64),
                        range: r.get(15)?,
                    }),
                    None => None,
                },
            })
        })?;
        rows.collect()
    }

    /// Resolves a hex prefix of a blake3 hash to the one artifact it names.
    pub fn resolve_hash(&self, prefix: &str) -> Result<ContentHash> {
        let prefix = prefix.to_ascii_lowercase();
        let mut stmt = self
            .conn
            .prepare("SELECT blake3, sha256, size FROM artifacts WHERE blake3 >= ?1 AND blake3 < ?2 ORDER BY blake3 LIMIT 11")
            .map_err(|e| self.err(e))?;
        let upper = format!("{prefix}g");
        let found: Vec<ContentHash> = stmt
            .query_map(params![prefix, upper], |r| {
                Ok(ContentHash {
                    blake3: r.get(0)?,
                    sha256: r.get(1)?,
                    size: r.get::<_, i64>(2)? as u64,
                })
            })
            .and_then(|rows| rows.collect())
            .map_err(|e| self.err(e))?;
        match found.len() {
            0 => Err(StoreError::UnknownHash { prefix }),
            1 => Ok(found.into_iter().next().expect("one")),
            _ => Err(StoreError::AmbiguousHash {
                prefix,
                candidates: found
                    .into_iter()
                    .map(|h| h.blake3[..16].to_owned())
                    .collect(),
            }),
        }
    }

    fn uses(&self, where_clause: &str, arg: &dyn rusqlite::ToSql) -> Result<Vec<Use>> {
        let sql = format!(
            "SELECT f.job_id, f.role, f.path, j.argv, j.started_ns, a.blake3, a.sha256, a.size
             FROM job_files f JOIN jobs j ON j.id = f.job_id
             LEFT JOIN artifacts a ON a.id = f.artifact_id
             WHERE {where_clause} ORDER BY j.started_ns, f.job_id"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([arg], |r| {
                Ok(Use {
                    job_id: r.get(0)?,
                    role: Role::parse(&r.get::<_, String>(1)?),
                    path: lossy(bytes(r, 2)?),
                    argv: lossy_argv(&bytes(r, 3)?),
                    started_ns: r.get(4)?,
                    hash: hash_from(r.get(5)?, r.get(6)?, r.get(7)?),
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>());
        rows.map_err(|e| self.err(e))
    }

    pub fn artifact(&self, hash: &ContentHash) -> Result<ArtifactDetail> {
        let all = self.uses(
            "f.artifact_id = (SELECT id FROM artifacts WHERE blake3 = ?1)",
            &hash.blake3,
        )?;
        let (made_by, used_by) = all.into_iter().partition(|u| u.role == Role::Output);
        Ok(ArtifactDetail {
            hash: hash.clone(),
            made_by,
            used_by,
        })
    }

    /// Every recorded use of an absolute path.
    pub fn path(&self, path: &Path) -> Result<PathDetail> {
        let bytes = path.as_os_str().as_bytes().to_vec();
        let history = self.uses("f.path = ?1", &bytes)?;
        if history.is_empty() {
            return Err(StoreError::UnknownPath {
                path: path.to_owned(),
            });
        }
        Ok(PathDetail {
            path: path.to_string_lossy().into_owned(),
            history,
        })
    }
}
