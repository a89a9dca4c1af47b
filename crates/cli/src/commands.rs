//! The command line: every command and option roar takes, as clap parses them. `main.rs`
//! dispatches them; `--help`, the man page and the completions are generated from here.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};

use crate::{config_cmd, export_cmd, gateway_cmd, mount_cmd, remote_cmd, run_args, tracer_cmd};

#[derive(Parser)]
#[command(
    name = "roar",
    version,
    about = "Record data lineage by observing execution",
    long_about = "roar records which command made each file from which exact inputs (by content hash), \
                  by watching programs run instead of asking you to declare a pipeline.",
    after_help = "Exit codes: 0 ok, 1 failure, 2 usage, 3 no project, 4 not found, 5 ambiguous hash prefix, \
                  6 store unusable; `roar run` exits with the command's own status (128+N for signal N)."
)]
pub(crate) struct Cli {
    /// Print machine-readable JSON instead of text (query commands).
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// Query the team store NAME (`roar remote add`) instead of the local store: log, show,
    /// lineage, inputs, dag, diff, export, reproduce, status, ui. With `roar push`: push to NAME
    /// only.
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) remote: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Create a roar project (.roar/ with the store and config) in DIR or the current directory.
    Init {
        /// Directory to make a project root (default: the current directory).
        dir: Option<PathBuf>,
    },
    /// Print the content hash of files (like b3sum) and record them in the hash cache.
    Hash {
        /// Files or directories (directories are walked recursively).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Also compute sha256 (printed after the blake3 hash).
        #[arg(long)]
        sha256: bool,
    },
    /// List recorded jobs, newest first.
    Log {
        /// Show at most this many jobs (0: all of them).
        #[arg(short = 'n', long, default_value_t = 20)]
        limit: usize,
    },
    /// The runs of one job name as a table: parameters (argv and parameter files such as
    /// params.yaml) and metrics (metrics files such as metrics.json) as columns
    Runs {
        /// Only jobs of this name (their --name, else their script's: `python train.py` is
        /// `train`); all jobs when absent.
        name: Option<String>,
        /// Order by this parameter or metric, highest first (numbers as numbers).
        #[arg(long, value_name = "KEY")]
        sort: Option<String>,
        /// Show at most this many runs (0: all of them).
        #[arg(short = 'n', long, default_value_t = 20)]
        limit: usize,
        /// Only runs with this label (KEY=VALUE, or KEY for any value; repeatable: all must hold).
        #[arg(long, value_name = "KEY[=VALUE]")]
        label: Vec<String>,
    },
    /// Put labels on a job (`roar label train baseline=true`), remove them (--rm KEY), or list
    /// them; `roar show` prints them, `roar runs --label KEY=VALUE` filters on them.
    Label {
        /// The job: its id (`3` or `@3`), its name, or `NAME~N`.
        job: OsString,
        /// Labels to set, as KEY=VALUE.
        labels: Vec<String>,
        /// Remove the label KEY (repeatable).
        #[arg(long, value_name = "KEY")]
        rm: Vec<String>,
    },
    /// Show a job, an artifact (by hash prefix) or a path with its history.
    Show {
        /// A job: its id (`3` or `@3`), its `--name` (the latest job of that name) or `NAME~N`
        /// (the Nth before it); a blake3 hash prefix (at least 4 hex digits); or a path.
        what: OsString,
        /// Also list files hidden as environment noise (fonts, caches, `ignore` globs).
        #[arg(long)]
        all: bool,
        /// For a job: its environment instead (parameters, code, packages, machine).
        #[arg(long)]
        env: bool,
        /// For a job run in a dirty tree: the uncommitted changes it ran with, as a patch
        /// (`roar show 3 --patch | git apply`).
        #[arg(long, conflicts_with = "env")]
        patch: bool,
    },
    /// Show the store's size, schema version and row counts; audit it for secrets.
    Db {
        /// List every stored field that holds a secret by the current redaction rules (a store
        /// recorded by an older roar, or before a `[redact]` rule was added); exit 1 if any.
        #[arg(long, conflicts_with = "redact")]
        secrets_scan: bool,
        /// Redact those fields in place and rewrite the store so no old value survives.
        #[arg(long)]
        redact: bool,
    },
    /// How a file version was made: the jobs upstream of it, down to its root inputs.
    Lineage {
        /// A path or a blake3 hash prefix.
        what: OsString,
        /// Also list files hidden as environment noise (fonts, caches, `ignore` globs).
        #[arg(long)]
        all: bool,
        /// Do not collapse directories of many files (all, or the given directory).
        #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true)]
        expand: Option<Vec<PathBuf>>,
    },
    /// The root inputs a file version was made from (versions no recorded job produced).
    Inputs {
        /// A path or a blake3 hash prefix.
        what: OsString,
        /// Also list files hidden as environment noise (fonts, caches, `ignore` globs).
        #[arg(long)]
        all: bool,
    },
    /// The lineage graph: the jobs that made TARGET, or every job, with inputs and outputs.
    Dag {
        /// A path or a blake3 hash prefix: only the subgraph that made it.
        target: Option<OsString>,
        /// Print Graphviz source instead of text.
        #[arg(long)]
        dot: bool,
        /// Render the graph to an SVG file with Graphviz's `dot`.
        #[arg(long, value_name = "FILE", conflicts_with = "dot")]
        svg: Option<PathBuf>,
        /// Write the interactive view of `roar ui` as one self-contained HTML file (no server, no
        /// network: the data is embedded).
        #[arg(long, value_name = "FILE", conflicts_with_all = ["dot", "svg"])]
        html: Option<PathBuf>,
        /// Also show files hidden as environment noise (fonts, caches, `ignore` globs).
        #[arg(long)]
        all: bool,
        /// Do not collapse directories of many files (all, or the given directory).
        #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true)]
        expand: Option<Vec<PathBuf>>,
        /// Show every run, not only the latest: by default a run that a later run of the same
        /// command replaced (and that nothing current read) is folded into that run's count.
        #[arg(long)]
        all_runs: bool,
    },
    /// The commands that rebuild an artifact, as a shell script; --run executes and verifies them.
    Reproduce {
        /// A path or a blake3 hash prefix.
        what: OsString,
        /// Re-run the plan in a scratch worktree (each job's code and the input versions it read,
        /// the working tree untouched) and report each output: bit-exact, differs, or not run.
        #[arg(long)]
        run: bool,
        /// With --run: build the worktree in this (new or empty) directory and keep it.
        #[arg(
            long = "in",
            value_name = "DIR",
            requires = "run",
            conflicts_with = "in_place"
        )]
        in_dir: Option<PathBuf>,
        /// With --run: rebuild in the working tree instead (its root inputs must be as recorded).
        #[arg(long, requires = "run")]
        in_place: bool,
    },
    /// Write a recorded version back: `PATH@JOB`, `PATH~N` (N versions back), or a hash prefix
    /// (with -o). The bytes come from the versions kept (checked against the hash) or from a file
    /// here that has them; what the path held before is kept first.
    Checkout {
        /// `PATH@JOB`, `PATH~N`, a path, or a blake3 hash prefix.
        what: OsString,
        /// Write the version here instead of its own path.
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
    },
    /// Pin jobs: a size budget (`[keep] budget_bytes`) never lets go of a version they read or
    /// wrote. Without jobs, lists the pinned ones.
    Pin {
        /// Job ids (`@N`) or names (`NAME~N`).
        jobs: Vec<OsString>,
        /// Unpin them instead.
        #[arg(long)]
        remove: bool,
    },
    /// What differs between the provenance of two jobs or artifacts: argv, code, environment, inputs.
    Diff {
        /// A job id, a path, or a blake3 hash prefix.
        a: OsString,
        /// A job id, a path, or a blake3 hash prefix.
        b: OsString,
    },
    /// Export the lineage graph as W3C PROV-JSON or OpenLineage run events (one per line).
    Export {
        /// Output format.
        #[arg(long, value_enum, default_value = "prov-json")]
        format: export_cmd::Format,
        /// Export only the lineage of this path or hash prefix.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        what: Option<OsString>,
        /// Export every job of the project.
        #[arg(long)]
        all: bool,
    },
    /// Recorded files that changed, outputs made stale by a change upstream, untracked files.
    Status {
        /// Exit with status 1 when anything changed or is stale (as `git diff --exit-code`).
        #[arg(long)]
        exit_code: bool,
    },
    /// Mount roarfs over DIR, in place: everything read or written under DIR is recorded.
    Mount(mount_cmd::MountArgs),
    /// Serve S3 (embedded store or an upstream) and record which client read or wrote which object.
    Gateway(gateway_cmd::GatewayArgs),
    /// Unmount a `roar mount`, recording its remaining jobs. Refused while files under it are
    /// open for writing (the writers are listed), unless --force.
    Unmount {
        /// The mounted directory.
        dir: PathBuf,
        /// Detach the mount now even if files under it are open: it leaves the tree at once,
        /// keeps serving the open files until they close, then records their jobs.
        #[arg(long)]
        force: bool,
    },
    /// Run a command and record every file it reads and writes.
    Run(run_args::RunArgs),
    /// Remove object bodies from the embedded S3 store (.roar/s3/) that no object version,
    /// unfinished upload or recorded job needs.
    Gc {
        /// Keep anything younger than this many seconds (a body being stored right now).
        #[arg(long, default_value_t = 3600)]
        grace: u64,
    },
    /// Team stores (PostgreSQL) this project pushes its jobs to and can query (`--remote`).
    Remote {
        #[command(subcommand)]
        command: remote_cmd::RemoteCommand,
    },
    /// Send every finished job the team stores do not hold yet (`--remote NAME`: that one only).
    /// Idempotent: a job is stored once however often, and from wherever, it is pushed.
    Push {
        /// The pusher roar starts after recording a job: lingers for the next ones, and leaves
        /// a failure for `roar remote list` instead of printing it.
        #[arg(long, hide = true)]
        background: bool,
    },
    /// Read or change the project's settings (.roar/config.toml).
    Config {
        #[command(subcommand)]
        command: config_cmd::ConfigCommand,
    },
    /// Remove jobs from the record (their file records with them); never touches any file.
    Rm {
        /// Jobs: ids (`3`, `@3`), names (the latest job of that name) or `NAME~N`.
        #[arg(required = true)]
        jobs: Vec<OsString>,
    },
    /// Serve the lineage graph as a web page on 127.0.0.1 (a random token in the printed URL
    /// keeps other local users out); new jobs appear while it is open.
    Ui {
        /// The port to listen on; 0 picks a free one.
        #[arg(long, default_value_t = 4242)]
        port: u16,
    },
    /// Print a shell completion script: `roar completions bash > /etc/bash_completion.d/roar`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): `roar man | man -l -`.
    Man,
    /// Inspect the tracer backends.
    Tracer {
        #[command(subcommand)]
        command: tracer_cmd::TracerCommand,
    },
    /// Fold the store's WAL into the database (what `roar run` starts in the background).
    #[command(hide = true, name = "checkpoint-store")]
    CheckpointStore {
        /// The store database.
        db: PathBuf,
    },
}

/// `roar completions SHELL`: the completion script on stdout.
pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "roar", &mut std::io::stdout().lock());
    Ok(())
}

/// `roar man`: the manual page (roff) on stdout, `man -l -` renders it.
pub fn man() -> anyhow::Result<()> {
    let cmd = Cli::command();
    clap_mangen::Man::new(cmd).render(&mut std::io::stdout().lock())?;
    Ok(())
}
