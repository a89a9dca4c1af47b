//! Attribution: which job an access through the mount belongs to, and each live job's files.
//!
//! A process belongs to an implicit job rooted at its top-most ancestor in the same process group
//! that is not an interactive shell, terminal multiplexer, sshd, login or init. Interactive shells
//! give every command line its own process group, so `python train.py` with its dataloader workers
//! is one job with argv `python train.py`; a script run as `bash pipeline.sh` is one job. A job is
//! identified by its root's pid and start time, with argv/cwd/exe read once from /proc, and ends
//! when the root exits. Processes under `roar run` are left to that run's tracer, which records
//! them in its own job.

mod attribute;
mod births;
mod recover;
mod steps;

use attribute::{cmdline, read_proc_stat};

pub use recover::recover;
pub(crate) use steps::{Access, Unreplied};

use roar_store::ignore::Ignore;
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use roar_engine::classify::Context;
use roar_engine::journal::{Journaled, Record};
use roar_engine::{Event, Fact, Judge, Version};
use roar_store::{now_ns, ContentHash, JobRecord, Ops, Outcome, ProcessRecord, Writer};

/// A job's identity: its root process and that process's start time (clock ticks after boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobKey {
    pub pid: i32,
    pub start: u64,
}

struct LiveJob {
    argv: Vec<OsString>,
    cwd: PathBuf,
    exe: Option<PathBuf>,
    started_ns: i64,
    /// The job's uid: its row's, and its journal's name.
    uid: String,
    /// The engine's rule, applied to each access as it happens (the job's files and what is
    /// known of their content), each call written to the job's journal first.
    rules: Journaled,
    /// Writable handles still open: the job is finalised only once they are released.
    open_writers: usize,
    root_gone: bool,
    /// The job's row, written (running) when it first touched a recorded path: ids follow the
    /// order jobs started, and `roar log` shows the job while it runs.
    begun: Option<roar_store::Begun>,
    /// Its processes' programs and accesses, for cutting it into steps.
    log: steps::Log,
}

/// The live jobs of one mount and the writer their records go to.
pub struct Jobs {
    /// Paths that are never inputs or outputs (`roar run`'s rule and the project's globs).
    ignore: Ignore,
    inner: Mutex<Inner>,
    /// Thread exits arrive from the kernel (see [`Jobs::watch_exits`]): a cached thread is
    /// alive, and its job is known without reading /proc.
    exits_watched: std::sync::atomic::AtomicBool,
    /// Questions to the reader of those events, and what wakes it to answer.
    drains: births::Drains,
    poke: std::sync::OnceLock<crate::sys::Poke>,
    writer: Writer,
    boot_ns: i64,
    tick_ns: i64,
    host: Option<String>,
    /// The machine, recorded with every job.
    machine: Option<roar_store::Runtime>,
    /// Which programs begin steps (`[steps] drivers`).
    rule: roar_tracer::steps::Rule,
    /// The mount's device and path, once mounted: with the mount's inode numbers, a file's
    /// identity as its processes see it.
    mount: std::sync::OnceLock<(u64, PathBuf)>,
    /// Held while processes are read into a job's log (see `steps`).
    placing: Mutex<()>,
    /// Where each live job's journal goes, and what of a command line it may keep.
    journals: crate::Journals,
    /// Journals made ahead in that directory: a job begins with no file made under `inner`.
    ahead: Mutex<Option<roar_engine::journal::Ahead>>,
    /// Where the mount is, for its journals.
    mounted_on: PathBuf,
}

/// What the mount knows of a thread that made a request.
#[derive(Debug, Clone, Copy)]
struct Cached {
    /// When the thread started (a reused id is another thread).
    start: u64,
    /// Its job, or None when it is not recorded here.
    job: Option<JobKey>,
    /// Its process (thread group).
    pid: i32,
    /// It had exited when it was cached (see `Jobs::seen_alive_after_cached`): not trusted
    /// without /proc.
    exited: bool,
}

#[derive(Default)]
struct Inner {
    by_tid: HashMap<i32, Cached>,
    jobs: HashMap<JobKey, LiveJob>,
    births: births::Births,
}

fn boot_ns() -> i64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let btime: i64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    btime * 1_000_000_000
}

impl Jobs {
    pub fn new(writer: Writer, ignore: Ignore) -> Jobs {
        let hz = crate::sys::clock_ticks_per_second();
        Jobs {
            ignore,
            inner: Mutex::new(Inner::default()),
            exits_watched: std::sync::atomic::AtomicBool::new(false),
            drains: births::Drains::default(),
            poke: std::sync::OnceLock::new(),
            writer,
            boot_ns: boot_ns(),
            tick_ns: 1_000_000_000 / hz,
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned()),
            machine: None,
            rule: roar_tracer::steps::Rule::default(),
            mount: std::sync::OnceLock::new(),
            placing: Mutex::new(()),
            journals: None,
            ahead: Mutex::new(None),
            mounted_on: PathBuf::new(),
        }
    }

    /// Keeps each live job's calls into the rule in a journal (docs/SEMANTICS.md, "Crashes"),
    /// in the directory `journals` names, redacted by its policy: a daemon killed at any moment
    /// loses none of it. `dir`: where the mount is.
    pub fn with_journals(mut self, journals: crate::Journals, dir: &Path) -> Jobs {
        self.ahead = Mutex::new(journals.as_ref().map(|(d, _)| {
            roar_engine::journal::Ahead::new(d, roar_engine::journal::Writer::Mount)
        }));
        self.journals = journals;
        self.mounted_on = dir.to_owned();
        self
    }

    /// A job first seen now, with its journal begun: its header and where the mount is.
    fn live_job(&self, key: JobKey) -> LiveJob {
        let ahead = self.ahead.lock().expect("journals made ahead");
        let (uid, journal, policy) = match (ahead.as_ref(), &self.journals) {
            (Some(ahead), Some((_, policy))) => match ahead.take() {
                Ok((uid, j)) => (uid, Some(j), policy.clone()),
                Err(e) => {
                    static ONCE: std::sync::Once = std::sync::Once::new();
                    ONCE.call_once(|| tracing::warn!("roarfs: no journal for a job ({e}): a daemon killed now loses its events"));
                    (roar_engine::journal::new_uid(), None, policy.clone())
                }
            },
            _ => (roar_engine::journal::new_uid(), None, Default::default()),
        };
        drop(ahead);
        let mut job = LiveJob {
            argv: cmdline(key.pid),
            cwd: std::fs::read_link(format!("/proc/{}/cwd", key.pid)).unwrap_or_default(),
            exe: std::fs::read_link(format!("/proc/{}/exe", key.pid)).ok(),
            started_ns: self.boot_ns + key.start as i64 * self.tick_ns,
            uid,
            rules: Journaled::new(journal, policy),
            open_writers: 0,
            root_gone: false,
            begun: None,
            log: steps::Log::default(),
        };
        let header = self.header(key, &job);
        job.rules.write(&Record::Job(Box::new(header)));
        job.rules.write(&Record::Mounted(self.mounted_on.clone()));
        job.log = steps::Log::new(key, self.mount(), &mut job.rules);
        job
    }

    /// Calls `job`'s rule with `record` (written to its journal first); the job's row is begun
    /// at its first recorded path (ids follow the order jobs started, and `roar log` shows the
    /// job while it runs).
    fn call(&self, key: JobKey, j: &mut LiveJob, record: &Record) {
        let judge = Judge::Globs(&self.ignore);
        j.rules.call(&context(&judge, j.started_ns), record);
        self.begin(key, j);
    }

    fn begin(&self, key: JobKey, j: &mut LiveJob) {
        if j.begun.is_none() && !j.rules.rules().is_empty() {
            let header = self.header(key, j);
            j.begun = self.writer.begin_job(&header).ok();
        }
    }

    /// Asks `job`'s rule, with its context.
    fn with_rules<T>(
        &self,
        job: JobKey,
        f: impl FnOnce(&roar_engine::Rules, &Context) -> T,
    ) -> Option<T> {
        let inner = self.inner.lock().expect("jobs lock");
        let j = inner.jobs.get(&job)?;
        let judge = Judge::Globs(&self.ignore);
        Some(f(j.rules.rules(), &context(&judge, j.started_ns)))
    }

    /// Calls `job`'s rule with `record`, if the job is live.
    fn call_live(&self, job: JobKey, record: &Record) {
        let mut inner = self.inner.lock().expect("jobs lock");
        if let Some(j) = inner.jobs.get_mut(&job) {
            self.call(job, j, record);
        }
    }

    /// Where `job`'s events are now: taken before a hash, it tells [`Jobs::found`] and
    /// [`Jobs::found_in`] which changes the hash may have missed (0 for a job not live).
    pub fn mark(&self, job: JobKey) -> u64 {
        self.with_rules(job, |r, _| r.mark()).unwrap_or(0)
    }

    /// `job` saw `content` at `path`, which is the mount's inode `ino` now, having taken `mark`
    /// before reading it: told before an access that changes the path, it is what the access
    /// found there; after, what it left.
    pub fn found(&self, job: JobKey, path: &Path, ino: u64, content: ContentHash, mark: u64) {
        let fact = Fact {
            file: (self.mount_dev(), ino),
            content,
            mark,
        };
        let found = Record::Found {
            path: path.to_owned(),
            fact,
            ts: now_ns(),
        };
        self.call_live(job, &found);
    }

    /// The last writer of the mount's inode `ino` left `content` (read after `mark`): the content
    /// of every name the job knows that file by (never one another file was renamed onto since,
    /// nor one changed since the mark).
    pub fn found_in(&self, job: JobKey, ino: u64, content: ContentHash, mark: u64) {
        let fact = Fact {
            file: (self.mount_dev(), ino),
            content,
            mark,
        };
        self.call_live(job, &Record::FoundIn(fact));
    }

    /// Whether `job` read prior content at `path` whose hash is not known yet.
    pub fn wants_input(&self, job: JobKey, path: &Path) -> bool {
        self.with_rules(job, |r, _| r.wants_input(path))
            .unwrap_or(false)
    }

    /// Whether what is at `path` may be content `job` has not made nor read yet: an in-place
    /// write would keep it as an input.
    pub fn may_keep_prior(&self, job: JobKey, path: &Path) -> bool {
        self.with_rules(job, |r, _| {
            r.state(path)
                .is_none_or(|st| !st.job_made && !st.reads_prior)
        })
        .unwrap_or(false)
    }

    /// Whether `path` may still name the mount's inode `ino` as far as `job` knows (a change
    /// through a handle on it happened there only then).
    pub fn names(&self, job: JobKey, path: &Path, ino: u64) -> bool {
        let file = (self.mount_dev(), ino);
        self.with_rules(job, |r, _| r.names(path, file))
            .unwrap_or(true)
    }

    /// Whether the content now at `path` is unknown to `job`'s rule.
    pub fn wants_content(&self, job: JobKey, path: &Path) -> bool {
        self.with_rules(job, |r, cx| r.wants_content(cx, path))
            .unwrap_or(false)
    }

    /// Whether the job unlinked a file at `path` (at any time: sqlite deletes its journal and
    /// makes a new one at the same name, each transaction).
    pub fn unlinked(&self, job: JobKey, path: &Path) -> bool {
        self.with_rules(job, |r, _| {
            r.state(path).is_some_and(|st| st.ops.contains(Ops::UNLINK))
        })
        .unwrap_or(false)
    }

    /// A read of `path` whose content is known without hashing (an archive member), as `job`'s.
    pub fn read_known(&self, job: JobKey, path: &Path, content: ContentHash) {
        let open = Event::Open {
            pid: job.pid,
            path: path.to_owned(),
            flags: libc::O_RDONLY,
            stat: None,
            ts_ns: now_ns(),
        };
        let mut inner = self.inner.lock().expect("jobs lock");
        let Some(j) = inner.jobs.get_mut(&job) else {
            return;
        };
        let open = Record::Event(open);
        self.call(job, j, &open);
        if let Record::Event(ev) = open {
            j.log.push(ev);
        }
        if j.rules.rules().wants_input(path) {
            let found = Record::FoundNamed {
                path: path.to_owned(),
                content,
                mark: j.rules.rules().mark(),
                ts: now_ns(),
            };
            self.call(job, j, &found);
        }
    }

    /// A directory moved: every live job's files below it now live below its new name, and
    /// each name a job knew below the new name holds what the moved directory held there:
    /// `holds` says whether that is a file, by the name's place below `to`.
    pub fn moved_dir(&self, from: &Path, to: &Path, holds: impl Fn(&Path) -> bool) {
        let mut inner = self.inner.lock().expect("jobs lock");
        let moved = Record::MovedDir {
            from: from.to_owned(),
            to: to.to_owned(),
        };
        let judge = Judge::Globs(&self.ignore);
        for job in inner.jobs.values_mut() {
            let cx = context(&judge, job.started_ns);
            job.rules.call(&cx, &moved);
            for path in job.rules.rules().refilled_below(to) {
                let rest = path.strip_prefix(to).expect("below the new name");
                let holds = holds(rest);
                job.rules.call(&cx, &Record::Holds { path, holds });
            }
        }
    }

    pub fn writer_opened(&self, job: JobKey) {
        if let Some(j) = self.inner.lock().expect("jobs lock").jobs.get_mut(&job) {
            j.open_writers += 1;
        }
    }

    /// Writable handles still open, over every live job.
    pub fn writers_open(&self) -> usize {
        let inner = self.inner.lock().expect("jobs lock");
        inner.jobs.values().map(|j| j.open_writers).sum()
    }

    pub fn writer_released(&self, job: JobKey) {
        if let Some(j) = self.inner.lock().expect("jobs lock").jobs.get_mut(&job) {
            j.open_writers = j.open_writers.saturating_sub(1);
        }
    }

    /// Records every job whose root process has exited (and whose writers are all released);
    /// with `all`, every job: only after the unmount (see [`Jobs::record`]). Returns the store ids of the jobs recorded.
    /// No more jobs begin: the journals made ahead and not taken are removed.
    pub fn stop_journals_ahead(&self) {
        drop(self.ahead.lock().expect("journals made ahead").take());
    }

    pub fn finish(&self, all: bool) -> Vec<i64> {
        let done: Vec<(JobKey, LiveJob)> = {
            let mut inner = self.inner.lock().expect("jobs lock");
            let mut keys = Vec::new();
            let Inner { jobs, by_tid, .. } = &mut *inner;
            for (key, job) in jobs.iter_mut() {
                if !job.root_gone {
                    // An unreadable /proc (descriptors exhausted) is not an exit.
                    job.root_gone = match read_proc_stat(key.pid) {
                        Ok(Some(p)) => p.start != key.start,
                        Ok(None) => true,
                        Err(_) => false,
                    };
                    if job.root_gone {
                        job.rules.write(&Record::RootGone);
                    }
                }
                // A job whose root is gone stays open while a member still runs.
                if all
                    || (job.root_gone && job.open_writers == 0 && !Self::members_alive(by_tid, key))
                {
                    keys.push(*key);
                }
            }
            if !keys.is_empty() {
                inner
                    .by_tid
                    .retain(|_, c| c.job.is_none_or(|j| !keys.contains(&j)));
            }
            keys.into_iter()
                .filter_map(|k| inner.jobs.remove(&k).map(|j| (k, j)))
                .collect()
        };
        // Jobs that end in the same tick are recorded in the order they started.
        let mut done = done;
        done.sort_by_key(|(key, job)| (job.started_ns, key.pid));
        let mut ids = Vec::new();
        for (key, mut job) in done {
            let begun = job.begun.take();
            let header = self.header(key, &job);
            let (rules, journal) = job.rules.into_parts();
            if rules.is_empty() {
                if let Some(j) = journal {
                    j.remove();
                }
                continue;
            }
            let record = record(header, rules, &job.log, &self.rules_of_steps(), all);
            let record = JobRecord {
                incomplete: !job.root_gone,
                ..record
            };
            match self.writer.record_begun(begun, record) {
                Ok(id) => {
                    ids.push(id);
                    if let Some(j) = journal {
                        j.remove();
                    }
                }
                // Left for the next roar command to recover, once this daemon is gone.
                Err(e) => tracing::error!("roarfs: cannot record a job: {e}"),
            }
        }
        ids
    }

    /// Records `machine` with every job.
    pub fn with_machine(mut self, machine: Option<roar_store::Runtime>) -> Jobs {
        self.machine = machine;
        self
    }

    /// Cuts jobs into steps by `rule`.
    pub fn with_steps(mut self, rule: roar_tracer::steps::Rule) -> Jobs {
        self.rule = rule;
        self
    }

    /// The device the mount's files show and where it is, once it is mounted.
    pub fn set_mount(&self, dev: u64, path: PathBuf) {
        let _ = self.mount.set((dev, path));
    }

    fn mount(&self) -> &(u64, PathBuf) {
        static NONE: (u64, PathBuf) = (0, PathBuf::new());
        self.mount.get().unwrap_or(&NONE)
    }

    fn mount_dev(&self) -> u64 {
        self.mount().0
    }

    /// What the job's row says while it runs (and, completed, once it has ended).
    fn header(&self, key: JobKey, job: &LiveJob) -> JobRecord {
        JobRecord {
            name: None,
            argv: job.argv.clone(),
            cwd: job.cwd.clone(),
            started_ns: job.started_ns,
            ended_ns: None,
            outcome: Outcome::Running,
            incomplete: false,
            backend: "mount".into(),
            git: None,
            env: Default::default(),
            host: self.host.clone(),
            processes: vec![ProcessRecord {
                pid: key.pid,
                parent_pid: None,
                exe: job.exe.clone(),
                argv: job.argv.clone(),
                started_ns: Some(job.started_ns),
                ended_ns: None,
            }],
            steps: Vec::new(),
            files: Vec::new(),
            environment: self.machine.clone().map(|rt| roar_store::Environment {
                runtime: Some(rt),
                ..Default::default()
            }),
            uid: Some(job.uid.clone()),
            dist: None,
        }
    }

    fn rules_of_steps(&self) -> Steps<'_> {
        Steps {
            ignore: &self.ignore,
            rule: &self.rule,
        }
    }

    pub fn flush(&self) {
        let _ = self.writer.flush();
    }

    pub fn writer(&self) -> &Writer {
        &self.writer
    }
}

/// The rule's context for a job that started at `started_ns`: the project's ignore rules, the
/// job's start as the ctime floor (start times are clock ticks: a file the job made in its first
/// tick has a ctime at or after it), and no filesystem look-ups (the mount's paths lead back into
/// itself).
fn context<'a>(judge: &'a Judge<'a>, started_ns: i64) -> Context<'a> {
    static NO_DIRS: std::sync::LazyLock<roar_engine::HashSet<&'static Path>> =
        std::sync::LazyLock::new(roar_engine::HashSet::default);
    Context {
        dirs: &NO_DIRS,
        ctime_floor_ns: started_ns,
        ignore: judge,
        ask_filesystem: false,
    }
}

/// How a job's log is cut into steps: the paths never recorded and which programs begin steps.
pub struct Steps<'a> {
    pub ignore: &'a Ignore,
    pub rule: &'a roar_tracer::steps::Rule,
}

/// The job `header` began as, with the files `rules` left and the steps of `log`, ended now.
/// `unmounted`: the mount is gone, so paths name the backing files and an output whose last
/// release never arrived (releases are asynchronous; an unmount can overtake one) can be hashed
/// from the file itself.
fn record(
    header: JobRecord,
    rules: roar_engine::Rules,
    log: &steps::Log,
    steps: &Steps,
    unmounted: bool,
) -> JobRecord {
    let steps = log.steps(steps.ignore, header.started_ns, steps.rule);
    let classified = rules.finish();
    let mut files = Vec::new();
    for (path, st) in &classified.paths {
        for (role, version) in st.roles() {
            let hash = match version {
                Version::Prior => st.input.clone(),
                Version::Left => st.output().cloned().or_else(|| {
                    unmounted
                        .then(|| roar_store::hash::hash_path(path, Default::default()).ok())
                        .flatten()
                        .map(|h| h.hash)
                }),
                Version::Gone => None,
            };
            files.push(st.record(role, path.clone(), hash));
        }
    }
    JobRecord {
        ended_ns: Some(now_ns()),
        outcome: Outcome::Ended,
        files,
        steps,
        ..header
    }
}
