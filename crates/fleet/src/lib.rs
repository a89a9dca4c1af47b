//! A simulated fleet for the team store (issue 66): every node's job stream, written into the
//! node's own project store through the same [`Writer`] as `roar run`, so that `roar push` sends
//! what a real fleet would.
//!
//! The streams are what a cluster that trains models records (the shape is in [`Shape`]):
//! - a **shared dataset** on shared storage, written by ingest jobs spread over the nodes and read
//!   by most jobs of every node (so lineage crosses nodes);
//! - **pipelines with steps** on each node: a preprocessing job of two steps (decode, featurize)
//!   over a sample of the dataset, then training epochs that **overwrite a checkpoint** in place
//!   (`ckpt/last.pt`, each epoch's content the next one's `before`), then an evaluation;
//! - **distributed runs** of 8 to 64 ranks, 8 ranks per node, each rank a job on its node reading
//!   its slice of the dataset; rank 0 writes the run's checkpoint, and most runs resume from the
//!   previous run's checkpoint (a chain of runs across nodes);
//! - every job also reads the code and a slice of the Python libraries of the image, identical on
//!   every node (the paths and contents a team store sees over and over).
//!
//! Everything is a function of the shape and the node's number: the generator needs no state
//! shared between nodes, and a test can say from the shape alone which jobs a lineage holds.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use roar_store::{
    ContentHash, Distributed, FileRecord, GitState, JobRecord, Ops, Outcome, Project, Role,
    StepContent, StepFile, StepRecord, Writer,
};

/// Where the fleet's shared files live (the same path on every node).
pub const SHARED: &str = "/mnt/shared";
/// Ranks of a distributed run per node (8 GPUs a node).
pub const RANKS_PER_NODE: u32 = 8;
/// Dataset shards one ingest job writes.
const SHARDS_PER_INGEST: u32 = 500;
/// Library files of the image every job reads a slice of.
const LIBRARY_FILES: u32 = 2_000;
/// When the fleet's pipelines begin (ns). The dataset is ingested before, and run `g` starts at
/// `T0 + g * RUN_PERIOD`, so that every read of a file made on another node comes after it was
/// made, as in a fleet whose clocks agree.
const T0: i64 = 1_790_000_000_000_000_000;
const SECOND: i64 = 1_000_000_000;
const RUN_PERIOD: i64 = 7_200 * SECOND;

/// The fleet's size and mix. [`Shape::new`] picks the mix a training cluster records.
#[derive(Debug, Clone)]
pub struct Shape {
    pub nodes: u32,
    /// Jobs each node records (distributed ranks included), approximately: a node stops at the
    /// first episode boundary past it.
    pub jobs_per_node: u32,
    /// Files of the shared dataset.
    pub dataset_files: u32,
    /// Distributed runs across the fleet.
    pub runs: u32,
    /// Library files each job reads.
    pub libraries_per_job: u32,
    /// Dataset shards a preprocessing job or a rank reads.
    pub shards_per_job: u32,
    pub seed: u64,
}

impl Shape {
    /// About a fifth of the jobs are ranks of distributed runs.
    pub fn new(nodes: u32, jobs_per_node: u32, seed: u64) -> Shape {
        let total = u64::from(nodes) * u64::from(jobs_per_node);
        Shape {
            nodes,
            jobs_per_node,
            dataset_files: ((total * 10).clamp(1_000, 100_000)) as u32,
            runs: ((total / 5 / 30).max(1)) as u32,
            libraries_per_job: 60,
            shards_per_job: 16,
            seed,
        }
    }

    /// Ranks of run `g`: 8, 16, 32 or 64.
    pub fn world_size(&self, g: u32) -> u32 {
        8 << (mix(self.seed, 1, u64::from(g)) % 4)
    }

    /// The node that runs rank `rank` of run `g`: 8 consecutive ranks per node, the run's first
    /// node moving round the fleet from run to run.
    pub fn node_of_rank(&self, g: u32, rank: u32) -> u32 {
        (g + rank / RANKS_PER_NODE) % self.nodes
    }

    /// The run whose checkpoint run `g` resumes from (three of four runs resume).
    pub fn resumes(&self, g: u32) -> Option<u32> {
        (!g.is_multiple_of(4)).then(|| g - 1)
    }

    /// Ingest jobs that write the dataset, and the node each runs on.
    pub fn ingest_jobs(&self) -> u32 {
        self.dataset_files.div_ceil(SHARDS_PER_INGEST)
    }

    pub fn node_of_ingest(&self, i: u32) -> u32 {
        i % self.nodes
    }

    /// The dataset shard's path and content.
    pub fn shard(&self, k: u32) -> (PathBuf, ContentHash) {
        (
            PathBuf::from(format!(
                "{SHARED}/datasets/corpus-v3/train/shard-{k:06}.tar"
            )),
            content(self.seed, &format!("shard {k}"), 64 << 20),
        )
    }

    /// The checkpoint run `g` writes (rank 0).
    pub fn run_checkpoint(&self, g: u32) -> (PathBuf, ContentHash) {
        (
            PathBuf::from(format!("{SHARED}/runs/run-{g:05}/ckpt.pt")),
            content(self.seed, &format!("run {g} ckpt"), 512 << 20),
        )
    }

    /// The dataset shards a job reads: `shards_per_job` consecutive ones from a place the salt
    /// picks.
    pub fn shards_read(&self, salt: u64) -> impl Iterator<Item = u32> + '_ {
        let first = (mix(self.seed, 4, salt) % u64::from(self.dataset_files)) as u32;
        (0..self.shards_per_job).map(move |i| (first + i) % self.dataset_files)
    }

    /// The salt of rank `r` of run `g` (which shards it reads).
    fn rank_salt(g: u32, r: u32) -> u64 {
        (u64::from(g) << 16) | u64::from(r)
    }

    /// The jobs in the lineage of run `g`'s checkpoint, as (host, job name): every rank of every
    /// run back to the one that started the chain (a run's ranks are one computation,
    /// SEMANTICS.md), and the ingest jobs that wrote the shards those ranks read. Code and
    /// libraries have no producer.
    pub fn run_lineage(&self, g: u32) -> BTreeSet<(String, String)> {
        let mut jobs = BTreeSet::new();
        let mut run = Some(g);
        while let Some(g) = run {
            for r in 0..self.world_size(g) {
                jobs.insert((
                    self.host(self.node_of_rank(g, r)),
                    format!("run{g}-rank{r}"),
                ));
                for k in self.shards_read(Self::rank_salt(g, r)) {
                    let i = k / SHARDS_PER_INGEST;
                    jobs.insert((self.host(self.node_of_ingest(i)), format!("ingest-{i}")));
                }
            }
            run = self.resumes(g);
        }
        jobs
    }

    /// The host name node `n` records.
    pub fn host(&self, n: u32) -> String {
        format!("node{n:03}")
    }
}

/// What one node wrote.
#[derive(Debug, Default, Clone, Copy)]
pub struct Written {
    pub jobs: u64,
    pub files: u64,
}

/// Writes node `node`'s whole stream into the project at `dir` (made if it is not one yet).
pub fn write_node(shape: &Shape, node: u32, dir: &Path) -> roar_store::Result<Written> {
    let (project, _) = Project::init(dir)?;
    let writer = Writer::start(&project.db_path())?;
    let mut written = Written::default();
    for job in NodeStream::new(shape, node, dir) {
        written.jobs += 1;
        written.files += job.files.len() as u64;
        writer.record_job(job)?;
    }
    writer.flush()?;
    Ok(written)
}

/// A node's jobs in the order it ran them: its ingest jobs, then episodes (a pipeline, or its
/// ranks of the next distributed run) until the node has its jobs.
pub struct NodeStream<'a> {
    shape: &'a Shape,
    node: u32,
    root: PathBuf,
    clock: i64,
    episode: u32,
    /// What `ckpt/last.pt` holds (the last epoch of the node's latest pipeline).
    last: Option<ContentHash>,
    pending: std::collections::VecDeque<JobRecord>,
    made: u32,
    next_run: u32,
}

impl<'a> NodeStream<'a> {
    pub fn new(shape: &'a Shape, node: u32, root: &Path) -> NodeStream<'a> {
        let mut stream = NodeStream {
            shape,
            node,
            root: root.to_owned(),
            clock: T0 + i64::from(node) * 1_000_000,
            episode: 0,
            last: None,
            pending: Default::default(),
            made: 0,
            next_run: 0,
        };
        for i in (0..shape.ingest_jobs()).filter(|&i| shape.node_of_ingest(i) == node) {
            let job = stream.ingest(i);
            stream.pending.push_back(job);
        }
        stream
    }

    /// When the node's next pipeline job starts (its pipelines run one after the other).
    fn tick(&mut self, seconds: i64) -> (i64, i64) {
        let start = self.clock;
        self.clock += seconds * SECOND;
        (start, seconds)
    }

    /// A job of this node that started at `when.0` and ran `when.1` seconds.
    fn job(
        &self,
        name: String,
        argv: &[&str],
        when: (i64, i64),
        files: Vec<FileRecord>,
    ) -> JobRecord {
        let (started_ns, ended_ns) = (when.0, when.0 + when.1 * SECOND);
        let mut env = BTreeMap::new();
        env.insert(
            "CUDA_VISIBLE_DEVICES".to_owned(),
            "0,1,2,3,4,5,6,7".to_owned(),
        );
        env.insert("PYTHONHASHSEED".to_owned(), "0".to_owned());
        JobRecord {
            name: Some(name),
            argv: argv.iter().map(OsString::from).collect(),
            cwd: self.root.clone(),
            started_ns,
            ended_ns: Some(ended_ns),
            outcome: Outcome::Exited(0),
            incomplete: false,
            backend: "preload".into(),
            git: Some(GitState {
                commit: Some(format!("{:040x}", mix(self.shape.seed, 2, 0) as u128)),
                branch: Some("main".into()),
                dirty: false,
                remote: Some("git@example.invalid:ml/models.git".into()),
                diff: None,
            }),
            env,
            host: Some(self.shape.host(self.node)),
            processes: Vec::new(),
            steps: Vec::new(),
            files,
            environment: None,
            uid: None,
            dist: None,
        }
    }

    /// What every job reads besides its data: its script and a slice of the image's libraries.
    fn code(&self, script: &str, salt: u64) -> Vec<FileRecord> {
        let mut files = vec![input(
            self.root.join(script),
            content(self.shape.seed, script, 4_096),
        )];
        let first = (mix(self.shape.seed, 3, salt) % u64::from(LIBRARY_FILES)) as u32;
        for i in 0..self.shape.libraries_per_job {
            let l = (first + i * 7) % LIBRARY_FILES;
            files.push(input(
                PathBuf::from(format!(
                    "/usr/local/lib/python3.12/site-packages/pkg{:03}/module_{l:04}.py",
                    l / 40
                )),
                content(self.shape.seed, &format!("library {l}"), 16_384),
            ));
        }
        files
    }

    fn ingest(&mut self, i: u32) -> JobRecord {
        let mut files = self.code("ingest.py", u64::from(i));
        let end = ((i + 1) * SHARDS_PER_INGEST).min(self.shape.dataset_files);
        for k in i * SHARDS_PER_INGEST..end {
            let (path, hash) = self.shape.shard(k);
            files.push(output(path, hash, None));
        }
        let start = T0 - i64::from(self.shape.ingest_jobs() - i + 1) * 600 * SECOND;
        self.job(
            format!("ingest-{i}"),
            &["python", "ingest.py", &format!("--part={i}")],
            (start, 600),
            files,
        )
    }

    fn shards(&self, salt: u64) -> Vec<FileRecord> {
        self.shape
            .shards_read(salt)
            .map(|k| {
                let (path, hash) = self.shape.shard(k);
                input(path, hash)
            })
            .collect()
    }

    /// A pipeline: preprocessing (two steps), some epochs overwriting `ckpt/last.pt`, evaluation.
    fn pipeline(&mut self, e: u32) {
        let salt = (u64::from(self.node) << 32) | u64::from(e);
        let features: Vec<(PathBuf, ContentHash)> = (0..8)
            .map(|k| {
                (
                    self.root.join(format!("features/e{e:05}/part-{k}.npy")),
                    content(
                        self.shape.seed,
                        &format!("n{} e{e} features {k}", self.node),
                        1 << 24,
                    ),
                )
            })
            .collect();
        let prep = self.prep(e, salt, &features);
        self.pending.push_back(prep);
        let epochs = 2 + (mix(self.shape.seed, 5, salt) % 5) as u32;
        let last = self.root.join("ckpt/last.pt");
        let mut before = self.last.take();
        for epoch in 0..epochs {
            let mut files = self.code("train.py", salt);
            files.extend(features.iter().map(|(p, h)| input(p.clone(), h.clone())));
            if let Some(b) = &before {
                files.push(input(last.clone(), b.clone()));
            }
            let now = self.checkpoint(e, epoch);
            files.push(output(last.clone(), now.clone(), before.clone()));
            files.push(output(
                self.root.join(format!("ckpt/e{e:05}-epoch{epoch}.pt")),
                now.clone(),
                None,
            ));
            let when = self.tick(1_800);
            let job = self.job(
                format!("train-e{e}-{epoch}"),
                &[
                    "python",
                    "train.py",
                    "--config=conf/train.yaml",
                    &format!("--epoch={epoch}"),
                ],
                when,
                files,
            );
            self.pending.push_back(job);
            before = Some(now);
        }
        let mut files = self.code("eval.py", salt);
        let trained = before.expect("at least two epochs");
        files.push(input(last.clone(), trained.clone()));
        self.last = Some(trained);
        files.extend(self.shards(salt ^ 0xe));
        files.push(output(
            self.root.join(format!("metrics/e{e:05}.json")),
            content(
                self.shape.seed,
                &format!("n{} e{e} metrics", self.node),
                2_048,
            ),
            None,
        ));
        let when = self.tick(300);
        let job = self.job(format!("eval-e{e}"), &["python", "eval.py"], when, files);
        self.pending.push_back(job);
    }

    fn checkpoint(&self, e: u32, epoch: u32) -> ContentHash {
        content(
            self.shape.seed,
            &format!("n{} e{e} epoch {epoch}", self.node),
            256 << 20,
        )
    }

    /// Preprocessing: decode the shards into a temporary, featurize it (two steps).
    fn prep(&mut self, e: u32, salt: u64, features: &[(PathBuf, ContentHash)]) -> JobRecord {
        let mut files = self.code("prep.py", salt);
        let shards = self.shards(salt);
        let tmp = self.root.join(format!("tmp/e{e:05}.arrow"));
        files.extend(shards.iter().cloned());
        files.push(FileRecord {
            role: Role::Temp,
            ops: Ops::WRITE | Ops::CREATE | Ops::READ | Ops::UNLINK,
            hash: None,
            ..input(tmp.clone(), content(0, "", 0))
        });
        files.extend(
            features
                .iter()
                .map(|(p, h)| output(p.clone(), h.clone(), None)),
        );
        let when = self.tick(900);
        let mut job = self.job(format!("prep-e{e}"), &["make", "features"], when, files);
        let (cwd, started_ns, ended_ns) = (job.cwd.clone(), job.started_ns, job.ended_ns);
        let step = |seq: u32, argv: &[&str], files: Vec<StepFile>| StepRecord {
            seq,
            parent: (seq > 1).then_some(1),
            pid: 1000 + seq as i32,
            exe: Some(PathBuf::from("/usr/bin/python3")),
            argv: argv.iter().map(OsString::from).collect(),
            cwd: cwd.clone(),
            started_ns: Some(started_ns),
            ended_ns,
            streams: [None, None, None],
            files,
        };
        let mut decode: Vec<StepFile> = shards
            .iter()
            .map(|f| step_file(&f.path, Role::Input, None))
            .collect();
        decode.push(step_file(&tmp, Role::Output, None));
        let mut featurize = vec![step_file(&tmp, Role::Input, Some(2))];
        featurize.extend(
            features
                .iter()
                .map(|(p, _)| step_file(p, Role::Output, None)),
        );
        job.steps = vec![
            step(1, &["make", "features"], Vec::new()),
            step(2, &["python", "prep.py", "decode"], decode),
            step(3, &["python", "prep.py", "featurize"], featurize),
        ];
        job
    }

    /// Episode `e` is a pipeline unless it is this node's turn in the next distributed run.
    fn is_pipeline(&self, e: u32) -> bool {
        !mix(
            self.shape.seed,
            6,
            (u64::from(self.node) << 32) | u64::from(e),
        )
        .is_multiple_of(5)
    }

    /// This node's ranks of the next run that has some here, if any is left.
    fn ranks(&mut self) -> bool {
        while self.next_run < self.shape.runs {
            let g = self.next_run;
            self.next_run += 1;
            let mine: Vec<u32> = (0..self.shape.world_size(g))
                .filter(|&r| self.shape.node_of_rank(g, r) == self.node)
                .collect();
            if mine.is_empty() {
                continue;
            }
            for r in mine {
                let job = self.rank(g, r);
                self.pending.push_back(job);
            }
            return true;
        }
        false
    }

    fn rank(&mut self, g: u32, r: u32) -> JobRecord {
        let w = self.shape.world_size(g);
        let mut files = self.code("train.py", u64::from(g));
        files.extend(self.shards(Shape::rank_salt(g, r)));
        if let Some(p) = self.shape.resumes(g) {
            let (path, hash) = self.shape.run_checkpoint(p);
            files.push(input(path, hash));
        }
        files.push(output(
            PathBuf::from(format!("{SHARED}/runs/run-{g:05}/rank-{r}.log")),
            content(self.shape.seed, &format!("run {g} rank {r} log"), 65_536),
            None,
        ));
        if r == 0 {
            let (path, hash) = self.shape.run_checkpoint(g);
            files.push(output(path, hash, None));
        }
        let mut job = self.job(
            format!("run{g}-rank{r}"),
            &["python", "train.py", "--distributed"],
            (T0 + i64::from(g) * RUN_PERIOD, 3_600),
            files,
        );
        job.env.insert("RANK".into(), r.to_string());
        job.env.insert("WORLD_SIZE".into(), w.to_string());
        job.dist = Some(Distributed {
            group: format!("torchelastic:fleet-{}-{g}", self.shape.seed),
            rank: Some(r),
            world_size: Some(w),
            local_rank: Some(r % RANKS_PER_NODE),
            node_rank: Some(r / RANKS_PER_NODE),
        });
        job
    }
}

impl Iterator for NodeStream<'_> {
    type Item = JobRecord;

    fn next(&mut self) -> Option<JobRecord> {
        loop {
            if let Some(job) = self.pending.pop_front() {
                self.made += 1;
                return Some(job);
            }
            if self.made >= self.shape.jobs_per_node {
                // The runs this node takes part in are recorded whatever its quota says: a
                // run's ranks are all somewhere.
                return self.ranks().then(|| self.pending.pop_front()).flatten();
            }
            let e = self.episode;
            self.episode += 1;
            if self.is_pipeline(e) || !self.ranks() {
                self.pipeline(e);
            }
        }
    }
}

fn input(path: PathBuf, hash: ContentHash) -> FileRecord {
    FileRecord {
        role: Role::Input,
        path,
        hash: Some(hash),
        before: None,
        ops: Ops::READ,
        first_ns: None,
        last_ns: None,
        s3: None,
    }
}

fn output(path: PathBuf, hash: ContentHash, before: Option<ContentHash>) -> FileRecord {
    FileRecord {
        role: Role::Output,
        ops: if before.is_some() {
            Ops::WRITE | Ops::TRUNCATE
        } else {
            Ops::WRITE | Ops::CREATE
        },
        before,
        ..input(path, hash)
    }
}

fn step_file(path: &Path, role: Role, from_step: Option<u32>) -> StepFile {
    StepFile {
        path: path.to_owned(),
        role,
        ops: if role == Role::Input {
            Ops::READ
        } else {
            Ops::WRITE | Ops::CREATE
        },
        from_step,
        content: if from_step.is_some() {
            StepContent::Unknown
        } else if role == Role::Input {
            StepContent::Prior
        } else {
            StepContent::Final
        },
        first_ns: None,
        last_ns: None,
    }
}

/// A content that stands for `label` (its blake3), of about `size` bytes.
fn content(seed: u64, label: &str, size: u64) -> ContentHash {
    let hash = blake3::hash(format!("{seed} {label}").as_bytes());
    let bytes = hash.as_bytes();
    ContentHash {
        blake3: hash.to_hex().to_string(),
        sha256: None,
        size: size / 2 + u64::from(u16::from_le_bytes([bytes[0], bytes[1]])) * (size / 65_536 + 1),
    }
}

/// A number from the seed, a purpose and an input (splitmix64's finaliser): the generator's only
/// randomness, so every node agrees on the fleet's schedule without talking.
pub fn mix(seed: u64, purpose: u64, x: u64) -> u64 {
    let mut z = seed
        .wrapping_add(purpose.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add(x.wrapping_mul(0xbf58_476d_1ce4_e5b9));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
