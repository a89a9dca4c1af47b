//! Who made a version: the last job started before the reader that wrote that location with
//! that content, else (for a location no job wrote) a job that wrote that content elsewhere,
//! and the step inside it that left the content.

use super::*;

impl Store {
    /// The version recorded last at `path` (as an output, else as an input).
    pub fn version_at(&self, path: &Path) -> Result<Version> {
        let bytes = path.as_os_str().as_bytes();
        let found = self
            .conn
            .prepare_cached(
                "SELECT a.blake3, a.sha256, a.size FROM job_files f JOIN artifacts a ON a.id = f.artifact_id
                 WHERE f.path = ?1 AND f.role != 'temp'
                 ORDER BY f.role = 'output' DESC, f.id DESC LIMIT 1",
            )
            .and_then(|mut s| {
                s.query_row([bytes], |r| {
                    Ok(ContentHash {
                        blake3: r.get(0)?,
                        sha256: r.get(1)?,
                        size: r.get::<_, i64>(2)? as u64,
                    })
                })
                .optional()
            })
            .map_err(|e| self.err(e))?;
        match found {
            Some(hash) => Ok(Version {
                path: Some(path.to_string_lossy().into_owned()),
                hash,
            }),
            None => Err(StoreError::UnknownPath {
                path: path.to_owned(),
            }),
        }
    }

    /// The content recorded last at `path`.
    pub fn artifact_at(&self, path: &Path) -> Result<ContentHash> {
        Ok(self.version_at(path)?.hash)
    }

    /// Who made the content `artifact` found at `path` by a job (`reader`, or none) that started
    /// at `before_ns`: the last job started before it that wrote that path with that content;
    /// else, only if no job wrote the path at all, the last that wrote the content anywhere.
    pub(super) fn producer_of(
        &self,
        path: &[u8],
        artifact: i64,
        reader: i64,
        before_ns: i64,
        memo: &mut Memo,
    ) -> rusqlite::Result<Option<Producer>> {
        // The last writer of the path before the reader, one with these bytes first: a writer
        // with other bytes only means the path changed outside roar since (no producer).
        let here = self
            .writers_of(path, artifact, memo)?
            .iter()
            .filter(|&&(job, _, started)| job != reader && started < before_ns)
            .max_by_key(|&&(job, same, started)| (same, started, job))
            .map(|&(job, same, _)| (job, same));
        match here {
            Some((job, true)) => return Ok(Some((job, None))),
            Some((_, false)) => return Ok(None),
            None => {}
        }
        // No job wrote the path: the content, wherever a job wrote it (a copy roar did not see),
        // by a job that started before any job found these bytes here — one that read them here
        // (the `cp` that copied this dataset elsewhere) came after them, it did not make them.
        // Content no job ever wrote (a dataset every step reads) is remembered for the walk.
        if memo.never_made.contains(&artifact) {
            return Ok(None);
        }
        // Asked first, by content alone (one seek): the bound below reads every job that read
        // these bytes here — 10,000 for a dataset every job reads — and is only needed when
        // some job wrote them somewhere.
        let written: bool = self
            .conn
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM job_files WHERE artifact_id = ?1 AND role = 'output')",
            )?
            .query_row([artifact], |r| r.get(0))?;
        if !written {
            memo.never_made.insert(artifact);
            return Ok(None);
        }
        let first_read: Option<i64> = self
            .conn
            .prepare_cached(
                "SELECT MIN(j.started_ns) FROM job_files f JOIN jobs j ON j.id = f.job_id
                 WHERE f.path = ?1 AND f.artifact_id = ?2 AND f.role = 'input'",
            )?
            .query_row(params![path, artifact], |r| r.get(0))?;
        let before_ns = first_read.map_or(before_ns, |t| t.min(before_ns));
        let found: Option<(i64, String, i64)> = self
            .conn
            .prepare_cached(
                "SELECT f.job_id, f.path, j.started_ns < ?3 AND f.job_id != ?2 AS before FROM job_files f
                 JOIN jobs j ON j.id = f.job_id
                 WHERE f.artifact_id = ?1 AND f.role = 'output'
                 ORDER BY before DESC, j.started_ns DESC, f.job_id DESC LIMIT 1",
            )?
            .query_row(params![artifact, reader, before_ns], |r| {
                Ok((r.get(0)?, lossy(r.get_ref(1)?.as_bytes()?), r.get(2)?))
            })
            .optional()?;
        match found {
            Some((job, at, 1)) => Ok(Some((job, Some(at)))),
            Some(_) => Ok(None),
            None => {
                memo.never_made.insert(artifact);
                Ok(None)
            }
        }
    }

    /// Every job that wrote `path`, with whether it wrote `artifact` there and when it started:
    /// read once per walk (a path read by a run's 64 ranks is looked up once), each reader then
    /// picks its producer from the list.
    fn writers_of<'m>(
        &self,
        path: &[u8],
        artifact: i64,
        memo: &'m mut Memo,
    ) -> rusqlite::Result<&'m [Writer]> {
        let known = memo.writers.entry(artifact).or_default();
        if !known.contains_key(path) {
            let writers = self
                .conn
                .prepare_cached(
                    "SELECT f.job_id, f.artifact_id IS ?2, j.started_ns FROM job_files f
                     JOIN jobs j ON j.id = f.job_id
                     WHERE f.path = ?1 AND f.role = 'output'",
                )?
                .query_map(params![path, artifact], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?
                .collect::<rusqlite::Result<Vec<Writer>>>()?;
            known.insert(path.to_vec(), writers);
        }
        Ok(&known[path])
    }

    /// The job that made `target` (see [`Store::lineage`]), if a recorded one did.
    pub fn made_by(&self, target: &Version) -> Result<Option<i64>> {
        Ok(self
            .maker(target)
            .map_err(|e| self.err(e))?
            .map(|(job, _)| job))
    }

    /// The node that made `target`: its maker job, at the step of it that left the content.
    pub(super) fn maker_node(&self, target: &Version) -> rusqlite::Result<Option<Node>> {
        let Some((job, at)) = self.maker(target)? else {
            return Ok(None);
        };
        let step = match at.as_deref().or(target.path.as_deref()) {
            Some(path) => self.step_that_made(job, path.as_bytes())?,
            None => self.step_that_made_content(job, &target.hash.blake3)?,
        };
        Ok(Some((job, step)))
    }

    /// The step of job `job` whose final output has content `blake3`.
    pub(super) fn step_that_made_content(
        &self,
        job: i64,
        blake3: &str,
    ) -> rusqlite::Result<Option<u32>> {
        let path: Option<Vec<u8>> = self
            .conn
            .prepare_cached(
                "SELECT f.path FROM job_files f JOIN artifacts a ON a.id = f.artifact_id
                 WHERE f.job_id = ?1 AND f.role = 'output' AND a.blake3 = ?2 LIMIT 1",
            )?
            .query_row(params![job, blake3], |r| r.get(0))
            .optional()?;
        match path {
            Some(p) => self.step_that_made(job, &p),
            None => Ok(None),
        }
    }

    pub(super) fn artifact_id(&self, blake3: &str) -> rusqlite::Result<Option<i64>> {
        self.conn
            .prepare_cached("SELECT id FROM artifacts WHERE blake3 = ?1")?
            .query_row([blake3], |r| r.get(0))
            .optional()
    }

    /// The job that made `target`: for a path, by the rule of [`Store::producer_of`] with no
    /// time bound; for content alone, the last job that wrote it anywhere.
    pub(super) fn maker(&self, target: &Version) -> rusqlite::Result<Option<Producer>> {
        let Some(artifact) = self.artifact_id(&target.hash.blake3)? else {
            return Ok(None);
        };
        match &target.path {
            Some(p) => self.producer_of(p.as_bytes(), artifact, -1, i64::MAX, &mut Memo::default()),
            None => self
                .conn
                .prepare_cached(
                    "SELECT f.job_id FROM job_files f JOIN jobs j ON j.id = f.job_id
                     WHERE f.artifact_id = ?1 AND f.role = 'output'
                     ORDER BY j.started_ns DESC, f.job_id DESC LIMIT 1",
                )?
                .query_row([artifact], |r| Ok((r.get(0)?, None)))
                .optional(),
        }
    }

    /// The step of `job` that wrote `path` last, if the job has steps (asked once per job).
    pub(super) fn producer_step(
        &self,
        job: i64,
        path: &[u8],
        memo: &mut Memo,
    ) -> rusqlite::Result<Option<u32>> {
        let has_steps = match memo.has_steps.get(&job) {
            Some(&known) => known,
            None => {
                let has: bool = self
                    .conn
                    .prepare_cached("SELECT EXISTS (SELECT 1 FROM steps WHERE job_id = ?1)")?
                    .query_row([job], |r| r.get(0))?;
                memo.has_steps.insert(job, has);
                has
            }
        };
        match has_steps {
            true => self.step_that_made(job, path),
            false => Ok(None),
        }
    }
}
