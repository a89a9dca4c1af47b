//! A lineage node read from the store: a whole job, or one step of a job that has steps, with
//! its inputs (each with its producer) and outputs.

use super::*;

/// A path as read: text when it is UTF-8 (almost always: one allocation, no copy), else its
/// bytes, which the lookups need, and their lossy text.
enum ReadPath {
    Text(String),
    Bytes(Vec<u8>),
}

impl From<Vec<u8>> for ReadPath {
    fn from(b: Vec<u8>) -> ReadPath {
        match String::from_utf8(b) {
            Ok(s) => ReadPath::Text(s),
            Err(e) => ReadPath::Bytes(e.into_bytes()),
        }
    }
}

impl ReadPath {
    fn bytes(&self) -> &[u8] {
        match self {
            ReadPath::Text(s) => s.as_bytes(),
            ReadPath::Bytes(b) => b,
        }
    }

    fn into_text(self) -> String {
        match self {
            ReadPath::Text(s) => s,
            ReadPath::Bytes(b) => lossy(&b),
        }
    }
}

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
                    output_dirs: Vec::new(),
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

    /// One job with its non-temp files, in the order of their paths' bytes.
    pub(super) fn step(&self, job_id: i64, memo: &mut Memo) -> rusqlite::Result<Step> {
        let mut step = self.job_header(job_id)?;
        let (inputs, outputs) = match memo.outputs {
            Outputs::Every => self.every_row(job_id)?,
            Outputs::Collapsed { at } => {
                let (inputs, dirs) = self.inputs_and_dirs(job_id, at)?;
                self.collapsed_outputs(&mut step, dirs, at)?;
                (inputs, Vec::new())
            }
        };
        for (path, artifact, hash) in inputs {
            let producer = match artifact {
                Some(artifact) => {
                    self.producer_of(path.bytes(), artifact, job_id, step.started_ns, memo)?
                }
                None => None,
            };
            let mut edge = edge(path, hash);
            if let Some((job, copy_of)) = producer {
                let at = copy_of.as_deref().unwrap_or(&edge.path);
                edge.producer_step = self.producer_step(job, at.as_bytes(), memo)?;
                edge.producer = Some(job);
                edge.copy_of = copy_of;
            }
            step.inputs.push(edge);
        }
        let outputs = outputs.into_iter().map(|(path, _, hash)| edge(path, hash));
        step.outputs.extend(outputs);
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

    /// The first and last row id of a job's files (None without files). A job's rows are
    /// written together, so the range is short: a lineage reads every file of every job
    /// upstream (80,000 rows at the team store's scale) in one pass over the rows as they lie,
    /// not through the job's index and a seek into the table per row. The range only narrows
    /// the scan: the job is still matched row by row.
    fn row_range(&self, job_id: i64) -> rusqlite::Result<Option<(i64, i64)>> {
        self.conn
            // One aggregate per subquery: each is then one seek in the job's index, where
            // both in one statement step through every row of the job.
            .prepare_cached(
                "SELECT (SELECT MIN(id) FROM job_files WHERE job_id = ?1),
                        (SELECT MAX(id) FROM job_files WHERE job_id = ?1)",
            )?
            .query_row([job_id], |r| Ok(r.get::<_, Option<i64>>(0)?.zip(r.get(1)?)))
    }

    /// A job's inputs and outputs that are not noise, each with its content, each in the order
    /// of their paths' bytes (sorted here: SQLite's sorter cost more than the sort).
    fn every_row(&self, job_id: i64) -> rusqlite::Result<(Vec<Row>, Vec<Row>)> {
        let Some((first, last)) = self.row_range(job_id)? else {
            return Ok(Default::default());
        };
        let mut stmt = self.conn.prepare_cached(
            "SELECT f.role = 'input', f.path, f.artifact_id, a.blake3, a.sha256, a.size FROM job_files f
             LEFT JOIN artifacts a ON a.id = f.artifact_id
             WHERE f.id BETWEEN ?2 AND ?3 AND +f.job_id = ?1 AND f.role != 'temp'
               AND NOT roar_noise(f.path)",
        )?;
        let mut rows = stmt.query(params![job_id, first, last])?;
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        while let Some(r) = rows.next()? {
            let row = (
                ReadPath::from(r.get_ref(1)?.as_bytes()?.to_vec()),
                r.get(2)?,
                hash_from(r.get(3)?, r.get(4)?, r.get(5)?),
            );
            match r.get::<_, bool>(0)? {
                true => inputs.push(row),
                false => outputs.push(row),
            }
        }
        inputs.sort_by(|a, b| a.0.bytes().cmp(b.0.bytes()));
        outputs.sort_by(|a, b| a.0.bytes().cmp(b.0.bytes()));
        Ok((inputs, outputs))
    }

    /// A job's inputs as [`Self::every_row`] reads them, and its outputs counted by directory,
    /// the first `at` of each kept with its artifact: what [`Outputs::Collapsed`] shows, without
    /// reading or copying the content of outputs it only counts.
    fn inputs_and_dirs(&self, job_id: i64, at: usize) -> rusqlite::Result<(Vec<Row>, Dirs)> {
        let mut dirs = Dirs::default();
        let Some((first, last)) = self.row_range(job_id)? else {
            return Ok((Vec::new(), dirs));
        };
        let mut stmt = self.conn.prepare_cached(
            "SELECT f.role = 'input', f.path, f.artifact_id FROM job_files f
             WHERE f.id BETWEEN ?2 AND ?3 AND +f.job_id = ?1 AND f.role != 'temp'
               AND NOT roar_noise(f.path)",
        )?;
        let mut rows = stmt.query(params![job_id, first, last])?;
        let mut inputs = Vec::new();
        while let Some(r) = rows.next()? {
            let path = r.get_ref(1)?.as_bytes()?;
            let artifact: Option<i64> = r.get(2)?;
            match r.get::<_, bool>(0)? {
                true => inputs.push((ReadPath::from(path.to_vec()), artifact, None)),
                false => dirs.count(path, artifact, at),
            }
        }
        dirs.close();
        for (_, artifact, hash) in &mut inputs {
            *hash = self.content(*artifact)?;
        }
        inputs.sort_by(|a, b| a.0.bytes().cmp(b.0.bytes()));
        Ok((inputs, dirs))
    }

    /// The content an artifact id names.
    fn content(&self, artifact: Option<i64>) -> rusqlite::Result<Option<ContentHash>> {
        let Some(id) = artifact else {
            return Ok(None);
        };
        self.conn
            .prepare_cached("SELECT blake3, sha256, size FROM artifacts WHERE id = ?1")?
            .query_row([id], |r| Ok(hash_from(r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()
            .map(Option::flatten)
    }

    /// The outputs [`Self::inputs_and_dirs`] counted, as [`Outputs::Collapsed`] shows them: a
    /// directory that reached `at` becomes a count, the paths of the others edges with their
    /// content (in the order of their paths' bytes).
    fn collapsed_outputs(&self, step: &mut Step, dirs: Dirs, at: usize) -> rusqlite::Result<()> {
        for (dir, d) in dirs.done {
            if d.count >= at {
                step.output_dirs.push((lossy(&dir), d.count));
                continue;
            }
            for (path, artifact) in d.first {
                let hash = self.content(artifact)?;
                step.outputs.push(edge(ReadPath::from(path), hash));
            }
        }
        step.outputs
            .sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        step.output_dirs.sort();
        Ok(())
    }
}

/// A file row of a job: its path, artifact and content (when read).
type Row = (ReadPath, Option<i64>, Option<ContentHash>);

/// Outputs counted by directory, the first few of each kept.
#[derive(Default)]
struct Dirs {
    done: HashMap<Vec<u8>, Dir>,
    /// The directory of the rows counted last, not yet in `done`: rows come as they were
    /// written, a directory's files mostly together, so a run of them is looked up once.
    run: Option<(Vec<u8>, Dir)>,
}

#[derive(Default)]
struct Dir {
    count: usize,
    first: Vec<(Vec<u8>, Option<i64>)>,
}

impl Dirs {
    fn count(&mut self, path: &[u8], artifact: Option<i64>, at: usize) {
        let dir = parent(path);
        if self.run.as_ref().is_none_or(|(d, _)| d.as_slice() != dir) {
            self.close();
            let counted = self.done.remove(dir).unwrap_or_default();
            self.run = Some((dir.to_vec(), counted));
        }
        let (_, d) = self.run.as_mut().expect("set above");
        d.count += 1;
        if d.first.len() < at {
            d.first.push((path.to_vec(), artifact));
        }
    }

    fn close(&mut self) {
        if let Some((dir, counted)) = self.run.take() {
            self.done.insert(dir, counted);
        }
    }
}

/// An edge to `path` with `hash`, its producer not yet looked up.
fn edge(path: ReadPath, hash: Option<ContentHash>) -> Edge {
    Edge {
        path: path.into_text(),
        hash,
        producer: None,
        producer_step: None,
        copy_of: None,
    }
}

/// The directory of a path as the listings group it: up to its last `/` (`/` itself for a file
/// at the root, nothing for a bare name).
fn parent(path: &[u8]) -> &[u8] {
    match memchr::memrchr(b'/', path) {
        Some(0) => b"/",
        Some(i) => &path[..i],
        None => b"",
    }
}
