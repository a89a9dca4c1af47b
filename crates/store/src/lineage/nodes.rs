//! A lineage node read from the store: a whole job, or one step of a job that has steps, with
//! its inputs (each with its producer) and outputs.

use super::*;

impl Store {
    /// A lineage node: a whole job, or one of its steps.
    pub(super) fn node(&self, (job, seq): Node, memo: &mut Memo) -> rusqlite::Result<Step> {
        match seq {
            Some(seq) => self.step_node(job, seq, memo),
            None => self.step(job, memo),
        }
    }

    /// Step `seq` of job `job_id`: the job's attributes with the step's command, times and files.
    /// An input another step of the job wrote comes from that step; one the job found comes
    /// from whoever made it before the job, as for a whole job.
    pub(super) fn step_node(
        &self,
        job_id: i64,
        seq: u32,
        memo: &mut Memo,
    ) -> rusqlite::Result<Step> {
        let mut node = self.job_header(job_id)?;
        let Some(detail) = self.step_detail(job_id, seq)? else {
            return self.step(job_id, memo);
        };
        node.step = Some(seq);
        node.parent_step = detail.parent;
        node.streams = detail.streams;
        node.argv = detail.argv;
        node.cwd = detail.cwd;
        node.started_ns = detail.started_ns.unwrap_or(node.started_ns);
        node.ended_ns = detail.ended_ns;
        if seq != 1 {
            // Only the root's exit status is observed.
            node.exit_code = None;
        }
        for i in detail.inputs {
            let mut edge = Edge {
                path: i.path,
                hash: i.hash,
                producer: None,
                producer_step: None,
                copy_of: None,
            };
            if let Some(w) = i.from_step {
                edge.producer = Some(job_id);
                edge.producer_step = Some(w);
            } else if let Some(artifact) = edge
                .hash
                .as_ref()
                .map(|h| self.artifact_id(&h.blake3))
                .transpose()?
                .flatten()
            {
                let found = self.producer_of(
                    edge.path.as_bytes(),
                    artifact,
                    job_id,
                    node.started_ns,
                    memo,
                )?;
                if let Some((job, copy_of)) = found {
                    let at = copy_of.as_deref().unwrap_or(&edge.path);
                    edge.producer_step = self.producer_step(job, at.as_bytes(), memo)?;
                    edge.producer = Some(job);
                    edge.copy_of = copy_of;
                }
            }
            node.inputs.push(edge);
        }
        node.outputs = detail
            .outputs
            .into_iter()
            .map(|o| Edge {
                path: o.path,
                hash: o.hash,
                producer: None,
                producer_step: None,
                copy_of: None,
            })
            .collect();
        Ok(node)
    }

    /// A job's row as a lineage node, without files.
    pub(super) fn job_header(&self, job_id: i64) -> rusqlite::Result<Step> {
        self
            .conn
            .prepare_cached(
                "SELECT name, argv, cwd, started_ns, ended_ns, status, exit_code, git_commit, git_dirty, host,
                        backend, recorder, git_diff, run_group, rank, world_size, local_rank,
                        node_rank
                 FROM jobs WHERE id = ?1",
            )?
            .query_row([job_id], |r| {
                Ok(Step {
                    job_id,
                    name: r.get(0)?,
                    argv: r
                        .get_ref(1)?
                        .as_bytes()
                        .map(argv_from_blob)
                        .unwrap_or_default(),
                    cwd: lossy(r.get_ref(2)?.as_bytes().unwrap_or_default()),
                    started_ns: r.get(3)?,
                    ended_ns: r.get(4)?,
                    status: crate::model::live_status(
                        r.get(5)?,
                        r.get(11)?,
                        r.get::<_, Option<String>>(9)?.as_deref(),
                    ),
                    exit_code: r.get(6)?,
                    git_commit: r.get(7)?,
                    git_dirty: r.get(8)?,
                    git_diff: r.get(12)?,
                    host: r.get(9)?,
                    backend: r.get(10)?,
                    dist: r
                        .get::<_, Option<String>>(13)?
                        .map(|group| -> rusqlite::Result<crate::Distributed> {
                            Ok(crate::Distributed {
                                group,
                                rank: r.get(14)?,
                                world_size: r.get(15)?,
                                local_rank: r.get(16)?,
                                node_rank: r.get(17)?,
                            })
                        })
                        .transpose()?,
                    step: None,
                    parent_step: None,
                    streams: Vec::new(),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                    superseded: false,
                    earlier_runs: 0,
                    labels: BTreeMap::new(),
                })
            })
            .and_then(|mut step| {
                step.labels = self
                    .conn
                    .prepare_cached("SELECT key, value FROM labels WHERE job_id = ?1")?
                    .query_map([job_id], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<rusqlite::Result<_>>()?;
                Ok(step)
            })
    }

    /// One job with its non-temp files.
    pub(super) fn step(&self, job_id: i64, memo: &mut Memo) -> rusqlite::Result<Step> {
        let mut step = self.job_header(job_id)?;
        let mut stmt = self.conn.prepare_cached(
            "SELECT f.role, f.path, f.artifact_id, a.blake3, a.sha256, a.size FROM job_files f
             LEFT JOIN artifacts a ON a.id = f.artifact_id
             WHERE f.job_id = ?1 AND f.role != 'temp' AND NOT roar_noise(f.path)
             ORDER BY f.path",
        )?;
        let rows = stmt
            .query_map([job_id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get_ref(1)?.as_bytes()?.to_vec(),
                    r.get::<_, Option<i64>>(2)?,
                    hash_from(r.get(3)?, r.get(4)?, r.get(5)?),
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        for (role, path, artifact, hash) in rows {
            let mut edge = Edge {
                path: lossy(&path),
                hash,
                producer: None,
                producer_step: None,
                copy_of: None,
            };
            if role == "input" {
                if let Some(artifact) = artifact {
                    if let Some((job, copy_of)) =
                        self.producer_of(&path, artifact, job_id, step.started_ns, memo)?
                    {
                        let at = copy_of.as_ref().map_or(&path[..], |c| c.as_bytes());
                        edge.producer_step = self.producer_step(job, at, memo)?;
                        edge.producer = Some(job);
                        edge.copy_of = copy_of;
                    }
                }
                step.inputs.push(edge);
            } else {
                step.outputs.push(edge);
            }
        }
        // An output with the bytes of one of the job's inputs elsewhere is a copy of it.
        let read: HashMap<&str, &str> = step
            .inputs
            .iter()
            .filter_map(|i| Some((i.hash.as_ref()?.blake3.as_str(), i.path.as_str())))
            .collect();
        let copies: Vec<Option<String>> = step
            .outputs
            .iter()
            .map(|o| {
                let from = read.get(o.hash.as_ref()?.blake3.as_str())?;
                (*from != o.path).then(|| from.to_string())
            })
            .collect();
        for (o, c) in step.outputs.iter_mut().zip(copies) {
            o.copy_of = c;
        }
        Ok(step)
    }
}
