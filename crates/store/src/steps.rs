//! Reading a job's steps (SEMANTICS.md "Steps"): the tree `roar show` prints, and the step a
//! lineage walk enters a job at.
//!
//! A step's file holds no content of its own: `content` names which of the job's records for the
//! path has it (`prior`: the job's input record, `final`: its output record); any other state of
//! the path in between was never hashed.

use rusqlite::{params, OptionalExtension};

use crate::error::Result;
use crate::model::{argv_from_blob, Role, StepDetail, StepEdge, Stream};
use crate::query::{hash_from, Store};

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The step file's content, from the job's own record of the path.
const STEP_FILES: &str = "
    SELECT f.role, f.path, f.from_seq, a.blake3, a.sha256, a.size
    FROM step_files f
    LEFT JOIN job_files j ON j.job_id = ?1 AND j.path = f.path
         AND j.role = CASE f.content WHEN 'prior' THEN 'input' WHEN 'final' THEN 'output' END
    LEFT JOIN artifacts a ON a.id = j.artifact_id
    WHERE f.step_id = ?2 AND NOT roar_noise(f.path)
    ORDER BY f.path";

impl Store {
    /// Job `job`'s steps, root first; empty when the job is one step.
    pub fn steps(&self, job: i64) -> Result<Vec<StepDetail>> {
        self.steps_where(job, None).map_err(|e| self.err(e))
    }

    /// One step of job `job`.
    pub(crate) fn step_detail(&self, job: i64, seq: u32) -> rusqlite::Result<Option<StepDetail>> {
        Ok(self.steps_where(job, Some(seq))?.pop())
    }

    fn steps_where(&self, job: i64, seq: Option<u32>) -> rusqlite::Result<Vec<StepDetail>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, seq, parent_seq, pid, exe, argv, cwd, started_ns, ended_ns,
                    stdin, stdout, stderr, appends FROM steps
             WHERE job_id = ?1 AND (?2 IS NULL OR seq = ?2) ORDER BY seq",
        )?;
        let rows = stmt
            .query_map(params![job, seq], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    StepDetail {
                        seq: r.get(1)?,
                        parent: r.get(2)?,
                        pid: r.get(3)?,
                        exe: r.get::<_, Option<Vec<u8>>>(4)?.map(|b| lossy(&b)),
                        argv: argv_from_blob(r.get_ref(5)?.as_bytes()?),
                        cwd: lossy(r.get_ref(6)?.as_bytes()?),
                        started_ns: r.get(7)?,
                        ended_ns: r.get(8)?,
                        streams: {
                            let appends: i64 = r.get(12)?;
                            let mut v = Vec::new();
                            for fd in 0..3u8 {
                                if let Some(p) = r.get::<_, Option<Vec<u8>>>(9 + fd as usize)? {
                                    v.push(Stream {
                                        fd,
                                        path: lossy(&p),
                                        append: fd > 0 && appends & (1 << (fd - 1)) != 0,
                                    });
                                }
                            }
                            v
                        },
                        inputs: Vec::new(),
                        outputs: Vec::new(),
                        temps: Vec::new(),
                    },
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut files = self.conn.prepare_cached(STEP_FILES)?;
        let mut steps = Vec::with_capacity(rows.len());
        for (id, mut step) in rows {
            let edges = files.query_map(params![job, id], |r| {
                Ok((
                    Role::parse(&r.get::<_, String>(0)?),
                    StepEdge {
                        path: lossy(r.get_ref(1)?.as_bytes()?),
                        from_step: r.get(2)?,
                        hash: hash_from(r.get(3)?, r.get(4)?, r.get(5)?),
                    },
                ))
            })?;
            for edge in edges {
                let (role, edge) = edge?;
                match role {
                    Role::Input => step.inputs.push(edge),
                    Role::Output => step.outputs.push(edge),
                    Role::Temp => step.temps.push(edge.path),
                }
            }
            steps.push(step);
        }
        Ok(steps)
    }

    /// The numbers of job `job`'s steps; empty when the job is one step.
    pub(crate) fn step_seqs(&self, job: i64) -> rusqlite::Result<Vec<u32>> {
        self.conn
            .prepare_cached("SELECT seq FROM steps WHERE job_id = ?1 ORDER BY seq")?
            .query_map([job], |r| r.get(0))?
            .collect()
    }

    /// The step of job `job` that left its final content at `path`, if the job has steps.
    pub(crate) fn step_that_made(&self, job: i64, path: &[u8]) -> rusqlite::Result<Option<u32>> {
        self.conn
            .prepare_cached(
                "SELECT s.seq FROM step_files f JOIN steps s ON s.id = f.step_id
                 WHERE s.job_id = ?1 AND f.path = ?2 AND f.role = 'output' AND f.content = 'final'
                 ORDER BY s.seq DESC LIMIT 1",
            )?
            .query_row(params![job, path], |r| r.get(0))
            .optional()
    }
}
