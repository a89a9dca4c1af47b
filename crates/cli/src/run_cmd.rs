//! `roar run`: trace a command, classify and hash what it touched, record
//! the job, and leave the command's exit status, signals and output as if it had run bare.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use roar_store::hash::HashOptions;
use roar_store::{now_ns, JobRecord, Outcome, Project, Role, Store};
use roar_tracer::collect;
use roar_tracer::early::EarlyHasher;
use roar_tracer::ignore::Ignore;
use roar_tracer::{Backend, Status, Tap, TraceError};

use crate::config::Config;
use crate::entry::ExitCode;
use crate::recording::Recording;
use crate::run_args::RunArgs;

/// The preload shim (`shim.rs` says where it comes from).
fn preload_lib() -> Option<PathBuf> {
    crate::shim::path()
}

/// The commit checked out in the repository around `dir`, if any.
pub fn git_head(dir: &Path) -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `SIGTERM` for 15 (nix's names: every signal Linux has), `signal` for a number it has none for.
fn signal_name(sig: i32) -> &'static str {
    nix::sys::signal::Signal::try_from(sig).map_or("signal", |s| s.as_str())
}

/// The backend a run traces with, and whether `auto` chose it; an error, before anything runs,
/// when it cannot run here.
fn choose_backend(
    args: &RunArgs,
    config: &Config,
    lib: Option<&Path>,
) -> anyhow::Result<(Backend, bool)> {
    let requested = args.tracer.clone().unwrap_or_else(|| config.tracer.clone());
    let auto = requested == "auto";
    let (backend, why) = match requested.as_str() {
        "auto" => roar_tracer::choose(&args.command[0], lib),
        name => {
            let b = Backend::parse(name).ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown tracer {name:?} in config; use auto, preload, ptrace or ebpf"
                )
            })?;
            (b, "requested".to_owned())
        }
    };
    let verdict = roar_tracer::quick_check(backend, lib);
    if !verdict.ok {
        anyhow::bail!(
            "the {} tracer cannot run here: {}; see `roar tracer check`",
            backend.name(),
            verdict.reason
        );
    }
    tracing::debug!("tracer {} ({why})", backend.name());
    if backend == Backend::Preload && roar_tracer::check::inside_preload_run() {
        eprintln!(
            "roar: warning: this run is inside another `roar run` tracing with preload; with --tracer preload the outer job does not see this command's files (use --tracer ptrace or ebpf, as auto does)"
        );
    }
    Ok((backend, auto))
}

pub fn run(args: RunArgs, json: bool) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.set.is_empty(),
        "--set changes a recorded job's parameters: `roar run @N --set KEY=VALUE` (N a job id, name or NAME~K)"
    );
    let labels = crate::labels::parse_all(&args.label)?;
    let t0 = Instant::now();
    let (mut setup, mut job) = Setup::new(&args, t0)?;
    let (traced, recording) = setup.trace(&args, &mut job);
    let early = (setup.early.take())
        .map(EarlyHasher::finish)
        .unwrap_or_default();
    // Every access is in the sink once the gateway has stopped.
    let s3_files = (setup.gateway.take())
        .map(|g| g.finish())
        .unwrap_or_default();
    let t_traced = t0.elapsed();
    job.backend = setup.backend.name().to_owned();
    let traced = match traced {
        Ok(t) => t,
        Err(e) => return failed_to_start(&setup.project, job, recording, e, &setup.keep),
    };
    settle(&mut job, &traced);
    // From here on the command's status is final: a failure to record never changes it.
    let done = setup.record(job, &traced, recording, early, s3_files);
    let [classified, environment, hashed, recorded] = done.at;
    let phases = [
        setup.t_setup,
        t_traced,
        classified,
        environment,
        hashed,
        recorded,
    ];
    let timing = args.timing || std::env::var_os("ROAR_TIMING").is_some_and(|v| v == "1");
    let how = crate::run_report::Reporting {
        project: &setup.project,
        backend: setup.backend,
        cwd: &setup.cwd,
        json,
        summary: args.summary,
        phases: timing.then_some(phases),
    };
    crate::run_report::report(&how, &traced, done, labels);
    crate::background::checkpoint_in_background(&setup.project.db_path());
    crate::keep::budget_in_background(&setup.config);
    crate::remote_cmd::push_in_background(&setup.project, &setup.config);
    // The job is recorded and reported. What is still in memory (every event, the path maps, the
    // hashes: megabytes for a large job) would be freed allocation by allocation on the way out,
    // which the user waits for; the kernel takes it back at once.
    std::process::exit(traced.status.code().clamp(0, 255))
}

/// What a run sets up before its command starts, held until the job is recorded.
struct Setup {
    project: Project,
    config: Config,
    lib: Option<PathBuf>,
    backend: Backend,
    /// `auto` chose the backend (eBPF that cannot load falls back to ptrace).
    auto: bool,
    cwd: PathBuf,
    opts: HashOptions,
    gateway: Option<crate::gateway_cmd::RunGateway>,
    child_env: Vec<(OsString, Option<OsString>)>,
    /// The paths the job's record leaves out (config `ignore`), compiled once for the early
    /// hasher and the classification after the command.
    ignore: Ignore,
    /// The versions kept in the object store (`[keep]`), copied as they are hashed.
    versions: crate::keep::Rule,
    early: Option<EarlyHasher>,
    tap: Tap,
    diff: Option<roar_env::git::DiffJob>,
    /// The job's journal: everything the backend observes is kept in it as it arrives.
    keep: Arc<roar_tracer::Keep>,
    /// `--verbose`: the job's files are listed.
    verbose: bool,
    /// When the run started, and how long finding the project, its config, the backend and git
    /// took.
    t0: Instant,
    t_setup: std::time::Duration,
}

impl Setup {
    /// No project, bad config or an unusable backend: an error before anything runs. With the
    /// job as far as it is known before the command starts.
    fn new(args: &RunArgs, t0: Instant) -> anyhow::Result<(Setup, JobRecord)> {
        let project = crate::project()?;
        let config = Config::load(&project)?;
        let lib = preload_lib();
        let (backend, auto) = choose_backend(args, &config, lib.as_deref())?;
        let cwd = std::env::current_dir()?;
        // Commit, branch and remote from the repository's files; whether the tree is dirty (and
        // how) from a `git diff` that runs alongside the command (see roar_env::git).
        let repo = roar_env::git::Repo::find(&cwd);
        let git =
            (repo.as_ref()).and_then(|r| r.head().or_else(|| roar_env::git::from_git(&r.root)));
        let t_setup = t0.elapsed();
        let opts = HashOptions {
            sha256: config.sha256(),
        };
        let gateway = if args.s3 || args.s3_upstream.is_some() || config.s3.enabled {
            let upstream = args.s3_upstream.as_deref();
            Some(crate::gateway_cmd::for_run(&project, &config.s3, upstream)?)
        } else {
            None
        };
        let child_env = gateway.as_ref().map(|g| g.child_env()).unwrap_or_default();
        let ignore = Ignore::new(&config.ignore);
        let versions = crate::keep::Rule::new(&config.keep, &project);
        let early = early_hasher(&ignore, opts, versions.early());
        let mut tap: Tap = match &early {
            Some(e) => e.tap(),
            None => Arc::new(|_: &roar_tracer::Event| {}),
        };
        if args.trace || args.trace_file.is_some() {
            tap = crate::live::trace_tap(args.trace_file.as_deref(), cwd.clone(), tap)?;
        }
        let job = new_job(args, &cwd, backend, git);
        let diff = repo.as_ref().zip(job.git.as_ref()).and_then(|(r, g)| {
            (config.env.diff).then(|| roar_env::git::DiffJob::start(r, g.commit.as_deref()))
        });
        // A roar killed from now on leaves a job the next roar command recovers (crate::recover).
        let keep = crate::recover::run_keep(&project, &config, &job);
        if let Some(g) = &gateway {
            g.keep_in(&keep);
        }
        let setup = Setup {
            project,
            config,
            lib,
            backend,
            auto,
            cwd,
            opts,
            gateway,
            child_env,
            ignore,
            versions,
            early,
            tap,
            diff,
            keep,
            verbose: args.verbose,
            t0,
            t_setup,
        };
        Ok((setup, job))
    }

    /// Runs the command under the backend, with the recorder started beside it.
    fn trace(
        &mut self,
        args: &RunArgs,
        job: &mut JobRecord,
    ) -> (Result<roar_tracer::Traced, TraceError>, Recording) {
        let mut around = Around {
            db: self.project.db_path(),
            job,
            recording: None,
            diff: self.diff.as_mut(),
            ignore: &self.ignore,
            keep: self.keep.clone(),
        };
        let run = |backend, around: &mut Around| {
            let lib = self.lib.as_ref();
            let (tap, keep) = (self.tap.clone(), self.keep.clone());
            roar_tracer::run(
                backend,
                &args.command,
                &self.child_env,
                lib,
                tap,
                keep,
                around,
            )
        };
        let mut traced = run(self.backend, &mut around);
        if let Err(TraceError::Unavailable { reason, .. }) = &traced {
            if self.auto && self.backend == Backend::Ebpf {
                // Nothing has run yet: the command goes to the next backend the auto rule allows.
                eprintln!("roar: eBPF could not load ({reason}); tracing with ptrace");
                self.backend = Backend::Ptrace;
                traced = run(self.backend, &mut around);
            }
        }
        (traced, around.recording())
    }

    /// Classifies the job's accesses, captures its environment, hashes its files and hands the
    /// job to the store. With a writer of the run's own, the job's row goes into its transaction
    /// with the first files hashed (inputs and other new content, hashed in parallel first,
    /// without the store's write lock), then the outputs as each chunk of them is confirmed: the
    /// writer records one chunk while this thread stats the next (`collect::hash`). The
    /// recorder gets the job whole.
    fn record(
        &mut self,
        mut job: JobRecord,
        traced: &roar_tracer::Traced,
        mut recording: Recording,
        early: roar_tracer::early::Early,
        s3_files: Vec<roar_store::FileRecord>,
    ) -> crate::run_report::Done {
        let t0 = self.t0;
        let floor = traced.ctime_floor_ns;
        let classified = crate::recover::classify_job(
            &mut job,
            &traced.events,
            floor,
            &self.ignore,
            &self.config,
        );
        let t_classified = t0.elapsed();
        // What the packages are found from goes to the recorder now: it looks them up while this
        // run finishes the dirty check and the hashes.
        let packages = self.config.env.packages;
        let wanted = crate::environment::wanted(&job, &classified, packages, self.lib.as_deref());
        recording.wanted(&wanted);
        crate::environment::capture(&mut job, self.diff.take());
        recording.environment(&mut job, wanted);
        let t_environment = t0.elapsed();
        let count = |role: Role| s3_files.iter().filter(|f| f.role == role).count();
        let (inputs, outputs) = (count(Role::Input), count(Role::Output));
        job.files = s3_files;
        let mut listing = self.verbose.then(|| job.files.clone());
        // Opened only if some file may be answered from the hash cache.
        let store = std::cell::OnceCell::new();
        let db = self.project.db_path();
        let cache = || {
            (store.get_or_init(|| Store::open(&db).ok()))
                .as_ref()
                .map(Store::conn)
        };
        let mut job = Some(job);
        self.versions.learn_tracked(&classified);
        let versions = self.versions.versions();
        let hashed = crate::progress::while_hashing("the job's files", || {
            collect::hash(
                classified,
                self.opts,
                &cache,
                &early,
                versions.as_ref(),
                &mut |chunk| {
                    if let Some(listing) = listing.as_mut() {
                        listing.extend(chunk.files.iter().cloned());
                    }
                    recording.files(&mut job, chunk);
                },
            )
        });
        let t_hashed = t0.elapsed();
        let (recorded, recorded_by) = recording.finish(job);
        if recorded.is_ok() {
            // The job is in the store: its journal is done with. (Not recorded, the journal stays
            // and the next roar command records the job from it.)
            drop_journal(&self.keep);
        }
        crate::run_report::Done {
            recorded,
            recorded_by,
            inputs: inputs + hashed.inputs,
            outputs: outputs + hashed.outputs,
            hashed,
            listing,
            at: [t_classified, t_environment, t_hashed, t0.elapsed()],
        }
    }
}

/// The job's times and outcome from the traced command.
fn settle(job: &mut JobRecord, traced: &roar_tracer::Traced) {
    job.started_ns = traced.started_ns;
    job.ended_ns = Some(traced.ended_ns);
    job.outcome = match traced.status {
        Status::Exited(c) => Outcome::Exited(c),
        Status::Signaled(s) => Outcome::Signaled(s),
    };
    job.incomplete = traced.incomplete();
    if let Status::Signaled(s) = traced.status {
        eprintln!("roar: command killed by {} ({s})", signal_name(s));
    }
}

/// The job's record as it starts: the command, where, which backend, the commit; a new uid (its
/// name in its journal and its row: a recovery finds the row by it); the distributed run it is
/// a rank of, if any.
fn new_job(
    args: &RunArgs,
    cwd: &Path,
    backend: Backend,
    git: Option<roar_store::GitState>,
) -> JobRecord {
    JobRecord {
        name: args.name.clone(),
        argv: args.command.clone(),
        cwd: cwd.to_owned(),
        started_ns: now_ns(),
        ended_ns: None,
        outcome: Outcome::Running,
        incomplete: false,
        backend: backend.name().to_owned(),
        git,
        // Read once the command has started (`Around::started`).
        env: Default::default(),
        host: roar_env::runtime::hostname(),
        processes: Vec::new(),
        steps: Vec::new(),
        files: Vec::new(),
        environment: None,
        uid: Some(crate::recover::new_uid()),
        dist: crate::distributed::detect(
            &|k| std::env::var(k).ok(),
            &args.command,
            args.group.as_deref(),
            &crate::distributed::parent_id,
        ),
    }
}

/// What a run does around its command ([`roar_tracer::Beside`]): its job's row, written once the
/// command has started; the dirty check, beside a command that runs on.
struct Around<'a> {
    db: PathBuf,
    job: &'a mut JobRecord,
    recording: Option<Recording>,
    diff: Option<&'a mut roar_env::git::DiffJob>,
    /// Compiled while the command execs: the early hasher and the classification use it.
    ignore: &'a Ignore,
    /// The job's journal: its header again once the environment is read.
    keep: Arc<roar_tracer::Keep>,
}

impl Around<'_> {
    /// The job's recording; for a command that could not be started, its row is written now, to
    /// say so.
    fn recording(mut self) -> Recording {
        if self.recording.is_none() {
            let header_ns = self.job.started_ns;
            roar_tracer::Beside::started(&mut self, header_ns);
        }
        self.recording.expect("started above")
    }
}

impl roar_tracer::Beside for Around<'_> {
    fn started(&mut self, started_ns: i64) {
        // Once only: eBPF that could not load hands the command to ptrace.
        if self.recording.is_some() {
            return;
        }
        // roar's environment is the command's (less what roar adds to it), read while the
        // command execs. The writer redacts it, with the project's `[redact]` rules.
        self.job.env = roar_store::redact::collect_env(std::env::vars_os());
        self.job.started_ns = started_ns;
        // The journal's header is the job without its environment: the row written next holds
        // that (redacted by the recorder, which remembers the environments it redacted), and a
        // recovery takes it from there. Redacting it here too cost every run ~0.3 ms.
        self.keep.job(&roar_store::JobRecord {
            env: Default::default(),
            ..self.job.clone()
        });
        self.keep.commit(None);
        // The job's row is written (running) while the command runs, by the resident recorder
        // or a writer of this run's: a roar killed before the end leaves a job that says so. The
        // record fills that row in.
        self.recording = Some(Recording::start(&self.db, self.job));
        self.ignore.compile();
    }

    fn running_on(&mut self) {
        // The dirty check's thread (roar_tracer::BESIDE_AFTER).
        if let Some(d) = self.diff.as_mut() {
            d.beside();
        }
    }
}

/// The hasher of outputs during the run (see `roar_tracer::early`), unless `ROAR_EARLY_HASH=0`.
fn early_hasher(
    ignore: &Ignore,
    opts: HashOptions,
    keep: Option<roar_tracer::early::KeepOutputs>,
) -> Option<EarlyHasher> {
    if std::env::var_os("ROAR_EARLY_HASH").is_some_and(|v| v == "0") {
        return None;
    }
    Some(EarlyHasher::new(ignore.clone(), opts, keep))
}

/// Removes the run's journal: its job is in the store.
fn drop_journal(keep: &roar_tracer::Keep) {
    if let Some(path) = keep.journal_path() {
        roar_engine::journal::remove(path);
    }
}

/// The command never started: say so like a shell would, exit 127/126, and leave no job — the
/// row written when the run began (for a crash's sake) is taken back, as nothing ran. A command
/// roar itself could not trace is recorded as such (`roar log` says why).
fn failed_to_start(
    project: &Project,
    mut job: JobRecord,
    recording: Recording,
    e: TraceError,
    keep: &roar_tracer::Keep,
) -> anyhow::Result<ExitCode> {
    job.ended_ns = Some(job.started_ns);
    // Nothing ran: the journal holds nothing a recovery would need.
    drop_journal(keep);
    let Some(code) = e.exit_code() else {
        // roar itself could not trace the command: the row written at the start says so
        // instead of reading as a job still running.
        let e = anyhow::Error::from(e);
        job.outcome = Outcome::FailedToStart(format!("{e:#}"));
        let _ = recording.finish(Some(job));
        return Err(e);
    };
    eprintln!("roar: {:#}", anyhow::Error::from(e));
    job.outcome = Outcome::FailedToStart(format!("exit {code}"));
    let taken_back = recording
        .finish(Some(job))
        .0
        .and_then(|id| roar_store::Store::open(&project.db_path())?.delete_job(id));
    if let Err(e) = taken_back {
        eprintln!(
            "roar: the run's row could not be taken back: {:#}",
            anyhow::Error::from(e)
        );
    }
    crate::background::checkpoint_in_background(&project.db_path());
    Ok(ExitCode::from(code as u8))
}
