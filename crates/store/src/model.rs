//! What the store records: the plain data types producers hand to the writer and queries return.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use serde::Serialize;

/// The content identity of one artifact. blake3 is always present; sha256 only when asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContentHash {
    pub blake3: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    pub size: u64,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Running,
    Exited(i32),
    Signaled(i32),
    /// The command never started (not found, not executable); the text says why.
    FailedToStart(String),
    /// The job's root process is gone but its exit status was not observable (jobs the mount
    /// attributes to processes it did not start).
    Ended,
    /// The process that recorded the job was killed before the job ended: the job was rebuilt
    /// from its journal (docs/SEMANTICS.md, "Crashes") and holds every access observed until
    /// then; its exit status is unknown.
    Killed,
}

impl Outcome {
    pub fn status(&self) -> &'static str {
        match self {
            Outcome::Running => "running",
            Outcome::Exited(_) => "exited",
            Outcome::Signaled(_) => "signaled",
            Outcome::FailedToStart(_) => "failed_to_start",
            Outcome::Ended => "ended",
            Outcome::Killed => "killed",
        }
    }
}

/// The git state of the working tree the job ran in. A dirty tree is recorded, never refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GitState {
    pub commit: Option<String>,
    pub branch: Option<String>,
    pub dirty: bool,
    /// The URL of the branch's remote (else `origin`), without credentials.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// blake3 of the dirty tree's `git diff HEAD --binary`, kept in the store (`roar reproduce`
    /// applies it on the commit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Input,
    Output,
    /// Created and deleted inside the job: listed, never an artifact.
    Temp,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Input => "input",
            Role::Output => "output",
            Role::Temp => "temp",
        }
    }

    pub(crate) fn parse(s: &str) -> Role {
        match s {
            "input" => Role::Input,
            "output" => Role::Output,
            _ => Role::Temp,
        }
    }
}

/// How a job used one path (or object), as every producer sees it at the end of the job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathUse {
    /// Content the job did not make was read.
    pub read_prior: bool,
    /// The job wrote, created, truncated or renamed onto it.
    pub job_made: bool,
    /// It exists at the end of the job.
    pub exists: bool,
    /// The job deleted it.
    pub unlinked: bool,
    /// A file the job had not made was there when the job first touched the path (its own
    /// events show it): what the job removed there is that file, never a temporary of its own.
    pub found: bool,
    /// The job put a file at the path that was not the one there before: made it, or renamed,
    /// linked or exchanged one onto the name (writing the file found there in place is not
    /// putting one there). Gone at the end, such a file is a temporary even where the job also
    /// read what was there before (`cat x; rm x; echo > x; rm x`).
    pub placed: bool,
    /// What the job had left at the path (a deletion, a temporary) before later events would
    /// hide it: a directory it moved refilled the name with a file it had never seen, or it put
    /// a file there, or it read the removed file's bytes through a name it had linked.
    /// Superseded while a file is there, it stands if the name is empty at the end (`rm -r d0;
    /// mv d1 d0; rm d0/g`: the file that was at `d0/g` before the job is gone; `ln f f2; rm f;
    /// cat f2`: `f` was removed before its bytes were read).
    pub superseded: Option<Made>,
}

/// What a job left at a path, besides reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// Content the job made is there: an output with that content.
    Output,
    /// The job made it and removed it: a temporary (made: not a file that was there before,
    /// changed in place and then removed).
    Temp,
    /// A pre-existing path the job deleted: an output with no content.
    Deleted,
}

impl PathUse {
    /// The records one path gets, by the rules shared by `roar run`, the mount and the gateway:
    /// whether it is an input, and what the job left there.
    pub fn records(self) -> (bool, Option<Made>) {
        let made = if self.exists && self.job_made {
            Some(Made::Output)
        } else if self.job_made && !self.read_prior && !self.found {
            Some(Made::Temp)
        } else if !self.exists && !self.read_prior && (self.unlinked || self.found) {
            // Removed, or (a file found here, its content replaced unread) moved away: what was
            // there before the job is gone.
            Some(Made::Deleted)
        } else if !self.exists && self.superseded == Some(Made::Deleted) {
            // The file there before the job was removed unread: the empty name records that,
            // whatever the job put there since and removed again.
            Some(Made::Deleted)
        } else if !self.exists && self.placed {
            Some(Made::Temp)
        } else if !self.exists {
            self.superseded
        } else {
            None
        };
        (self.read_prior, made)
    }
}

/// The operations a job did on one path, as a small bit set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ops(u8);

impl Ops {
    pub const READ: Ops = Ops(1);
    pub const WRITE: Ops = Ops(2);
    pub const CREATE: Ops = Ops(4);
    pub const TRUNCATE: Ops = Ops(8);
    pub const RENAME: Ops = Ops(16);
    pub const UNLINK: Ops = Ops(32);
    const NAMES: [(Ops, &'static str); 6] = [
        (Ops::READ, "read"),
        (Ops::WRITE, "write"),
        (Ops::CREATE, "create"),
        (Ops::TRUNCATE, "truncate"),
        (Ops::RENAME, "rename"),
        (Ops::UNLINK, "unlink"),
    ];

    /// The set as its bits (the store's columns name them instead: [`Ops::names`]).
    pub fn bits(self) -> u8 {
        self.0
    }

    pub fn from_bits(bits: u8) -> Ops {
        Ops(bits)
    }

    pub fn contains(self, other: Ops) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn insert(&mut self, other: Ops) {
        self.0 |= other.0;
    }

    pub fn names(self) -> Vec<&'static str> {
        Ops::NAMES
            .iter()
            .filter(|(op, _)| self.contains(*op))
            .map(|(_, name)| *name)
            .collect()
    }

    pub fn parse(s: &str) -> Ops {
        let mut ops = Ops::default();
        for word in s.split(',') {
            if let Some((op, _)) = Ops::NAMES.iter().find(|(_, n)| *n == word) {
                ops.insert(*op);
            }
        }
        ops
    }
}

impl std::ops::BitOr for Ops {
    type Output = Ops;
    fn bitor(self, rhs: Ops) -> Ops {
        Ops(self.0 | rhs.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct S3Object {
    pub bucket: String,
    pub key: String,
    pub version_id: Option<String>,
    pub etag: Option<String>,
    /// Size of the whole object.
    pub size: Option<u64>,
    /// The byte range(s) a ranged read got (`bytes 0-1023/4096`), None for whole-object access.
    pub range: Option<String>,
}

/// One path (or S3 object) a job touched.
#[derive(Debug, Clone)]
pub struct FileRecord {
    pub role: Role,
    pub path: PathBuf,
    /// Content at the end of the job for outputs, as read for inputs. None when it could not
    /// be hashed (gone, unreadable, or changed while the job read it).
    pub hash: Option<ContentHash>,
    /// The last content the store knew for this path before the job, for outputs that replaced it.
    pub before: Option<ContentHash>,
    pub ops: Ops,
    pub first_ns: Option<i64>,
    pub last_ns: Option<i64>,
    pub s3: Option<S3Object>,
}

/// One process of a job's tree.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessRecord {
    pub pid: i32,
    pub parent_pid: Option<i32>,
    #[serde(serialize_with = "ser_path")]
    pub exe: Option<PathBuf>,
    #[serde(serialize_with = "ser_argv")]
    pub argv: Vec<OsString>,
    pub started_ns: Option<i64>,
    pub ended_ns: Option<i64>,
}

/// One step of a job: a program a driver (a shell, make, xargs, Python...) of the job started, with
/// the processes it forked, and what they did to files. Steps form a tree; the root is the job's
/// own command.
#[derive(Debug, Clone)]
pub struct StepRecord {
    /// 1 for the job's root step; steps are numbered in the order they started.
    pub seq: u32,
    pub parent: Option<u32>,
    pub pid: i32,
    /// The program the step's first process ran last (`sh -c 'sort a'` that exec'd sort: sort).
    pub exe: Option<PathBuf>,
    /// The command the step was started with (what `roar reproduce` re-runs).
    pub argv: Vec<OsString>,
    pub cwd: PathBuf,
    pub started_ns: Option<i64>,
    pub ended_ns: Option<i64>,
    /// Its stdin, stdout and stderr when they were files opened for it (redirections): a re-run
    /// of the step needs them as much as its argv.
    pub streams: [Option<Redirect>; 3],
    pub files: Vec<StepFile>,
}

/// A standard stream of a step that was a file: `< path`, `> path` or `>> path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Redirect {
    #[serde(serialize_with = "ser_pathbuf")]
    pub path: PathBuf,
    /// Opened to append (`>>`).
    pub append: bool,
}

fn ser_pathbuf<S: serde::Serializer>(p: &std::path::Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

/// Which of the job's recorded contents a step's file had, when it had one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepContent {
    /// What was there before the job: the content of the job's input record for the path.
    Prior,
    /// What the job left there: the content of the job's output record for the path.
    Final,
    /// A state in between (written again later in the job, or removed): not hashed.
    Unknown,
}

impl StepContent {
    pub fn as_str(self) -> &'static str {
        match self {
            StepContent::Prior => "prior",
            StepContent::Final => "final",
            StepContent::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> StepContent {
        match s {
            "prior" => StepContent::Prior,
            "final" => StepContent::Final,
            _ => StepContent::Unknown,
        }
    }
}

/// One path a step used, classified by the job-level rules applied to the step's own accesses.
#[derive(Debug, Clone)]
pub struct StepFile {
    pub path: PathBuf,
    pub role: Role,
    pub ops: Ops,
    /// For an input: the step of the same job that last wrote the path before this step first
    /// touched it (None: the content predates the job).
    pub from_step: Option<u32>,
    pub content: StepContent,
    pub first_ns: Option<i64>,
    pub last_ns: Option<i64>,
}

/// Everything recorded about one job, handed to the writer in one piece.
#[derive(Debug, Clone)]
pub struct JobRecord {
    pub name: Option<String>,
    pub argv: Vec<OsString>,
    pub cwd: PathBuf,
    pub started_ns: i64,
    pub ended_ns: Option<i64>,
    pub outcome: Outcome,
    /// The tracer could not promise it saw every access (lost events, unsupported syscalls).
    pub incomplete: bool,
    pub backend: String,
    pub git: Option<GitState>,
    pub env: BTreeMap<String, String>,
    pub host: Option<String>,
    pub processes: Vec<ProcessRecord>,
    /// The job's steps (SEMANTICS.md "Steps"), root first; empty when the job is one step.
    pub steps: Vec<StepRecord>,
    pub files: Vec<FileRecord>,
    /// Packages, machine and the dirty tree's diff, when the producer captured them.
    pub environment: Option<crate::environment::Environment>,
    /// The job's global identity (32 hex digits): None for a new job (the store makes one), the
    /// original's for a job copied from another store (the team store), so a job is the same
    /// record everywhere.
    pub uid: Option<String>,
    /// The distributed run this job is one rank (or one node) of.
    pub dist: Option<Distributed>,
}

/// Where a job stands in a distributed run (torchrun, Slurm, MPI, or `roar run --group`): jobs
/// with the same `group` are one run, whatever machine recorded them (docs/SEMANTICS.md
/// "Distributed runs").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Distributed {
    /// `torchelastic:RUN_ID`, `slurm:JOB_ID[.STEP]`, `mpi:JOB`, or `group:NAME`.
    pub group: String,
    /// Global rank; None for a job that runs a whole node's ranks (`roar run -- torchrun`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    /// The node's rank (torchrun's GROUP_RANK, Slurm's SLURM_NODEID).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_rank: Option<u32>,
}

/// A file's identity as the hash cache sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl FileStat {
    pub fn from_metadata(m: &std::fs::Metadata) -> FileStat {
        use std::os::unix::fs::MetadataExt;
        FileStat {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        }
    }
}

/// A hash-cache entry: this content was read from a file with this identity at `hashed_ns`.
#[derive(Debug, Clone)]
pub struct CacheEntry {
    pub stat: FileStat,
    pub hash: ContentHash,
    pub hashed_ns: i64,
}

pub fn argv_to_blob(argv: &[OsString]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, a) in argv.iter().enumerate() {
        if i > 0 {
            out.push(0);
        }
        out.extend_from_slice(a.as_bytes());
    }
    out
}

pub fn argv_from_blob(blob: &[u8]) -> Vec<OsString> {
    if blob.is_empty() {
        return Vec::new();
    }
    blob.split(|b| *b == 0)
        .map(|a| OsString::from_vec(a.to_vec()))
        .collect()
}

pub(crate) fn ser_path<S: serde::Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
    match p {
        Some(p) => s.serialize_some(&p.to_string_lossy()),
        None => s.serialize_none(),
    }
}

pub(crate) fn ser_argv<S: serde::Serializer>(argv: &[OsString], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(argv.len()))?;
    for a in argv {
        seq.serialize_element(&a.to_string_lossy())?;
    }
    seq.end()
}

pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// This process as a job's recorder: `pid:start time` (clock ticks since boot, from
/// /proc/self/stat), so a reused pid is never taken for it.
pub fn recorder_id() -> String {
    let pid = std::process::id() as i32;
    format!("{pid}:{}", proc_start(pid).unwrap_or(0))
}

/// A job's status as shown: a `running` row whose recorder is gone is `killed` (the roar that
/// recorded it died before the job ended: its files are not in the record). A row recorded on
/// another host (a shared store) cannot be checked here and stays `running`.
pub(crate) fn live_status(status: String, recorder: Option<String>, host: Option<&str>) -> String {
    let here = || {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
    };
    match recorder {
        Some(r)
            if status == "running"
                && host.is_none_or(|h| here().as_deref() == Some(h))
                && !recorder_alive(&r) =>
        {
            "killed".into()
        }
        _ => status,
    }
}

/// Whether the recorder `id` (see [`recorder_id`]) still runs on this machine.
pub(crate) fn recorder_alive(id: &str) -> bool {
    let Some((pid, start)) = id.split_once(':') else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<i32>(), start.parse::<u64>()) else {
        return false;
    };
    proc_start(pid) == Some(start)
}

/// A process's start time (clock ticks since boot), from /proc/PID/stat.
fn proc_start(pid: i32) -> Option<u64> {
    use procfs::FromRead;
    let stat = procfs::process::Stat::from_file(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.starttime)
}

/// One step of a job, with its files.
#[derive(Debug, Clone, Serialize)]
pub struct StepDetail {
    /// 1 for the job's root step.
    pub seq: u32,
    pub parent: Option<u32>,
    pub pid: i32,
    pub exe: Option<String>,
    #[serde(serialize_with = "crate::model::ser_argv")]
    pub argv: Vec<std::ffi::OsString>,
    pub cwd: String,
    pub started_ns: Option<i64>,
    pub ended_ns: Option<i64>,
    /// Its standard streams that were files opened for it (`< in`, `> out`, `2>> log`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<Stream>,
    pub inputs: Vec<StepEdge>,
    pub outputs: Vec<StepEdge>,
    pub temps: Vec<String>,
}

/// A standard stream of a step that was a file.
#[derive(Debug, Clone, Serialize)]
pub struct Stream {
    /// 0, 1 or 2.
    pub fd: u8,
    pub path: String,
    /// `>>` rather than `>`.
    pub append: bool,
}

impl Stream {
    /// The shell's spelling without the path: `<`, `>`, `>>`, `2>`, `2>>`.
    pub fn operator(&self) -> &'static str {
        match (self.fd, self.append) {
            (0, _) => "<",
            (1, false) => ">",
            (1, true) => ">>",
            (_, false) => "2>",
            (_, true) => "2>>",
        }
    }
}

/// A path a step read or wrote.
#[derive(Debug, Clone, Serialize)]
pub struct StepEdge {
    pub path: String,
    /// The content, when it is the job's prior or final content of the path.
    pub hash: Option<ContentHash>,
    /// For an input: the step of the same job that wrote what was read.
    pub from_step: Option<u32>,
}
