//! The `roar` command: argument parsing, dispatch, and turning errors into one line and an exit code.
//! The process starts in [`entry`] (not Rust's runtime), which calls [`roar_main`].
#![cfg_attr(not(test), no_main)]

mod background;
mod changes;
mod checkout_cmd;
mod commands;
mod config;
mod config_cmd;
mod current;
mod diff_cmd;
mod diff_steps;
mod distributed;
mod entry;
mod environment;
mod export_cmd;
mod fmt;
mod gateway_cmd;
mod gc_cmd;
mod graph;
mod hash_cmd;
mod keep;
mod labels;
mod lineage_cmd;
mod live;
mod log;
mod math;
mod mount_cmd;
mod mount_served;
mod mountinfo;
mod names;
mod namespace;
mod page_data;
mod progress;
mod query_cmd;
mod recording;
mod recover;
mod remote_cmd;
mod reproduce_cmd;
mod reproduce_run;
mod rerun;
mod run_args;
mod run_cmd;
mod run_report;
mod runs_cmd;
mod shim;
mod show_print;
mod status_cmd;
mod step_argv;
mod tracer_cmd;
mod ui_cmd;
mod values;

use std::ffi::OsString;
use std::path::PathBuf;

use commands::{Cli, Command};
use entry::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use roar_recorder as recorder;
use roar_store::{Project, StoreError};

/// Exit codes of roar's own failures (a traced command's status is passed through by `roar run`).
pub mod exit {
    /// Something went wrong that has no more specific code.
    pub const FAILURE: u8 = 1;
    /// Bad command-line usage (clap's own code).
    pub const USAGE: u8 = 2;
    /// No roar project above the current directory.
    pub const NO_PROJECT: u8 = 3;
    /// A job, hash or path that the store does not know.
    pub const NOT_FOUND: u8 = 4;
    /// A hash prefix that names more than one artifact.
    pub const AMBIGUOUS: u8 = 5;
    /// The store cannot be used: corrupt, newer schema, read-only.
    pub const STORE: u8 = 6;
}

/// roar, once [`entry`] has started the process.
#[cfg_attr(test, allow(dead_code))]
fn roar_main() -> ExitCode {
    // The resident eBPF helper a run starts (roar_tracer's ebpf/helper.rs): not a user command.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == roar_tracer::EBPF_HELPER_ARG)
    {
        return ExitCode::from(roar_tracer::ebpf_helper_main() as u8);
    }
    // The resident recorder a run starts (recorder.rs): not a user command.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == recorder::ARG)
    {
        log::init();
        let db = std::env::args_os().nth(2).map(PathBuf::from);
        return ExitCode::from(db.map_or(exit::USAGE, |db| recorder::serve(db) as u8));
    }
    if let Some((args, json)) = run_alone(std::env::args_os().skip(1)) {
        log::init();
        return finish(run(args, json));
    }
    let mut command = Cli::command();
    // Finding the shim takes a few stats: only `roar --version` (clap's long version) pays them,
    // not the start of every `roar run`.
    if std::env::args_os().nth(1).is_some_and(|a| a == "--version") {
        let long_version: &'static str = Box::leak(
            format!(
                "{}\npreload shim: {}\neBPF programs: {}",
                env!("CARGO_PKG_VERSION"),
                shim::describe(),
                if cfg!(feature = "ebpf") {
                    "built into the binary (CO-RE)"
                } else {
                    "none (a lean build, without the eBPF backend)"
                },
            )
            .into_boxed_str(),
        );
        command = command.long_version(long_version);
    }
    let names: Vec<String> = command
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect();
    let parsed = command
        .try_get_matches()
        .and_then(|mut m| Cli::from_arg_matches_mut(&mut m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            if e.kind() == clap::error::ErrorKind::InvalidSubcommand {
                if let Some(typed) = std::env::args().nth(1) {
                    if let Some(meant) = nearest_command(&typed, &names) {
                        eprintln!(
                            "roar: error: no command {}; did you mean `roar {meant}`? (`roar --help` lists them)",
                            fmt::shown(&typed)
                        );
                        return ExitCode::from(exit::USAGE);
                    }
                }
            }
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE } else { 0 });
        }
    };
    log::init();
    // Commands that print reports stop quietly when their reader goes away (`roar db | head -1`),
    // as cat and grep do. Not the commands that run or serve something: `roar run` leaves the
    // command's signal dispositions as they were, and servers must outlive a client.
    if !matches!(
        cli.command,
        Command::Run(_)
            | Command::Mount(_)
            | Command::Gateway(_)
            | Command::Ui { .. }
            | Command::Unmount { .. }
            | Command::CheckpointStore { .. }
    ) {
        #[allow(unsafe_code)]
        // SAFETY: setting a signal disposition before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL)
        };
    }
    finish(dispatch(cli))
}

/// The command `typed` was most likely meant to be: one edit away (a letter missing, extra,
/// changed, or two swapped: `lgo`, `shwo`), or two for longer names. clap's own suggestion
/// (Jaro similarity) misses swapped letters in short names.
fn nearest_command<'a>(typed: &str, names: &'a [String]) -> Option<&'a str> {
    let allowed = if typed.len() >= 5 { 2 } else { 1 };
    names
        .iter()
        .map(|n| (strsim::damerau_levenshtein(typed, n), n))
        .filter(|(d, _)| *d > 0 && *d <= allowed)
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n.as_str())
}

/// A command's result as roar's exit: its code, or the error in one line and its code.
fn finish(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // Whatever the message quotes (a path, an archive's bytes) acts on no terminal; a
            // cause that its error's own message already quotes is not said twice.
            let chain: &(dyn std::error::Error + 'static) = e.as_ref();
            eprintln!(
                "roar: error: {}",
                roar_store::quote::visible(&roar_store::error_chain(chain))
            );
            ExitCode::from(exit_code(&e))
        }
    }
}

/// `roar run ...` read by a parser of `run` alone: building every command's arguments to parse
/// one costs 0.3-0.4 ms of each run's start. Anything it does not take as a plain run (help, a
/// usage error, `--remote`) is left to the whole parser, which answers as always. `args` starts
/// after the program's name.
fn run_alone(mut args: impl Iterator<Item = OsString>) -> Option<(run_args::RunArgs, bool)> {
    use clap::{Arg, ArgAction, Args};
    if args.next()? != "run" {
        return None;
    }
    let args: Vec<OsString> = args.collect();
    // The most common run, `roar run CMD ARGS...` (or `roar run -- CMD ...`), has no option of
    // roar's: everything is the command, as clap reads it (`trailing_var_arg`). Building clap's
    // parser for it cost ~0.15 ms of each such run's start.
    let command = match args.first() {
        Some(a) if a == "--" => &args[1..],
        Some(a) if !a.as_encoded_bytes().starts_with(b"-") => &args[..],
        _ => &[],
    };
    if !command.is_empty() {
        return Some((run_args::RunArgs::command_only(command.to_vec()), false));
    }
    let command = run_args::RunArgs::augment_args(clap::Command::new("run").no_binary_name(true))
        .arg(Arg::new("json").long("json").action(ArgAction::SetTrue))
        .arg(Arg::new("remote").long("remote").num_args(1));
    let mut matches = command.try_get_matches_from(args).ok()?;
    if matches.contains_id("remote") && matches.get_one::<String>("remote").is_some() {
        return None;
    }
    let json = matches.get_flag("json");
    let run = run_args::RunArgs::from_arg_matches_mut(&mut matches).ok()?;
    Some((run, json))
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let json = cli.json;
    if let Some(name) = &cli.remote {
        if let Command::Push { background } = cli.command {
            return remote_cmd::push(Some(name), background, json);
        }
        read_remote(&cli.command, name)?;
    }
    match cli.command {
        Command::Remote { command } => return remote_cmd::remote(command, json),
        Command::Push { background } => return remote_cmd::push(None, background, json),
        Command::Init { dir } => query_cmd::init(dir, json)?,
        Command::Hash { paths, sha256 } => hash_cmd::hash(&paths, sha256, json)?,
        Command::Log { limit } => query_cmd::log(limit, json)?,
        Command::Runs {
            name,
            sort,
            limit,
            label,
        } => runs_cmd::runs(name.as_deref(), sort.as_deref(), limit, &label, json)?,
        Command::Show {
            what,
            all,
            env,
            patch,
        } => query_cmd::show(&what, all, env, patch, json)?,
        Command::Label { job, labels, rm } => labels::label(&job, &labels, &rm, json)?,
        Command::Db {
            secrets_scan,
            redact,
        } => {
            if secrets_scan || redact {
                return query_cmd::db_secrets(redact, json);
            }
            query_cmd::db(json)?
        }
        Command::Lineage { what, all, expand } => {
            lineage_cmd::lineage(&what, all, &expand_dirs(expand), json)?
        }
        Command::Inputs { what, all } => lineage_cmd::inputs(&what, all, json)?,
        Command::Dag {
            target,
            dot,
            svg,
            html,
            all,
            expand,
            all_runs,
        } => lineage_cmd::dag(
            lineage_cmd::DagArgs {
                target,
                dot,
                svg,
                html,
                all,
                expand: expand_dirs(expand),
                all_runs,
            },
            json,
        )?,
        Command::Reproduce {
            what,
            run,
            in_dir,
            in_place,
        } => {
            let rebuild = match (run, in_place) {
                (false, _) => reproduce_cmd::Rebuild::No,
                (true, true) => reproduce_cmd::Rebuild::InPlace,
                (true, false) => reproduce_cmd::Rebuild::Isolated(in_dir.as_deref()),
            };
            return reproduce_cmd::reproduce(&what, rebuild, json);
        }
        Command::Status { exit_code } => return status_cmd::status(exit_code, json),
        Command::Diff { a, b } => diff_cmd::diff(&a, &b, json)?,
        Command::Pin { jobs, remove } => checkout_cmd::pin(&jobs, remove, json)?,
        Command::Checkout { what, output } => {
            return checkout_cmd::checkout(&what, output.as_deref(), json)
        }
        Command::Export {
            format,
            what,
            all: _,
        } => export_cmd::export(what.as_deref(), format)?,
        Command::Run(args) => return run(args, json),
        Command::Gc { grace } => gc_cmd::gc(grace, json)?,
        Command::Mount(args) => return mount_cmd::mount(args, json),
        Command::Gateway(args) => return gateway_cmd::serve(args, json),
        Command::Unmount { dir, force } => return mount_cmd::unmount(&dir, force, json),
        Command::Config { command } => config_cmd::config(command, json)?,
        Command::Rm { jobs } => query_cmd::rm(&jobs, json)?,
        Command::Ui { port } => ui_cmd::serve(port, json)?,
        Command::Completions { shell } => commands::completions(shell)?,
        Command::Man => commands::man()?,
        Command::Tracer { command } => return tracer_cmd::tracer(command, json),
        Command::CheckpointStore { db } => background::checkpoint_store(&db)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `roar run`: a command run and recorded, or `roar run @N` a recorded job run again.
fn run(args: run_args::RunArgs, json: bool) -> anyhow::Result<ExitCode> {
    if rerun::is_rerun(&args.command) {
        return rerun::rerun(args, json);
    }
    run_cmd::run(args, json)
}

/// `--remote NAME`: the query commands (and the UI) read the team store `NAME` from here on.
fn read_remote(command: &Command, name: &str) -> anyhow::Result<()> {
    match command {
        Command::Log { .. }
        | Command::Runs { .. }
        | Command::Show { .. }
        | Command::Lineage { .. }
        | Command::Dag { .. }
        | Command::Diff { .. }
        | Command::Export { .. }
        | Command::Inputs { .. }
        | Command::Reproduce { .. }
        | Command::Checkout { .. }
        | Command::Status { .. } => {
            let local = project()?;
            let _ = READING.set(remote_cmd::reading_remote(local, name)?);
        }
        Command::Ui { .. } => {
            let local = project()?;
            let _ = READING.set(remote_cmd::reading_remote(local.clone(), name)?);
            // The page shows new jobs of the team as they arrive.
            remote_cmd::keep_reading(&local, name)?;
        }
        _ => anyhow::bail!(
            "--remote is for the query commands (log, runs, show, lineage, inputs, dag, diff, export, reproduce, checkout, status), ui and push"
        ),
    }
    Ok(())
}

/// `roar log | head` closes our stdout early: that is not an error worth a message.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// Something the user named that the store does not have (exit code 4, like an unknown path).
#[derive(Debug)]
pub struct NotFound(pub String);

impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotFound {}

fn exit_code(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| c.is::<NotFound>()) {
        return exit::NOT_FOUND;
    }
    match e.chain().find_map(|c| c.downcast_ref::<StoreError>()) {
        Some(StoreError::NoProject { .. }) => exit::NO_PROJECT,
        Some(
            StoreError::UnknownHash { .. }
            | StoreError::UnknownJob { .. }
            | StoreError::UnknownPath { .. },
        ) => exit::NOT_FOUND,
        Some(StoreError::AmbiguousHash { .. }) => exit::AMBIGUOUS,
        Some(
            StoreError::Corrupt { .. }
            | StoreError::NewerSchema { .. }
            | StoreError::ReadOnly { .. },
        ) => exit::STORE,
        _ => exit::FAILURE,
    }
}

/// `--expand` alone expands everything; `--expand=DIR` that directory (made absolute).
fn expand_dirs(arg: Option<Vec<PathBuf>>) -> graph::Expand {
    match arg {
        None => graph::Expand::default(),
        Some(dirs) if dirs.is_empty() => graph::Expand {
            all: true,
            dirs: Vec::new(),
        },
        Some(dirs) => {
            let cwd = std::env::current_dir().unwrap_or_default();
            graph::Expand {
                all: false,
                dirs: dirs
                    .into_iter()
                    .map(|d| std::fs::canonicalize(&d).unwrap_or_else(|_| cwd.join(d)))
                    .collect(),
            }
        }
    }
}

/// The project a query reads when `--remote` chose a team store's mirror.
static READING: std::sync::OnceLock<Project> = std::sync::OnceLock::new();

/// The project around the current directory (reading the team store's mirror under `--remote`).
pub fn project() -> anyhow::Result<Project> {
    if let Some(p) = READING.get() {
        return Ok(p.clone());
    }
    let cwd = std::env::current_dir()?;
    let project = Project::find(&cwd)?;
    // Jobs whose recorder was killed are recovered before anything reads or writes the store.
    static RECOVERED: std::sync::Once = std::sync::Once::new();
    RECOVERED.call_once(|| recover::pending(&project));
    Ok(project)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// roar links GCC's unwinder in (build.rs, `static_unwinder`): a panic still unwinds to
    /// where it is caught (a thread's join, `catch_unwind`) and a backtrace still has frames.
    #[test]
    fn a_panic_unwinds_with_the_unwinder_linked_in() {
        let caught = std::panic::catch_unwind(|| {
            let _kept = String::from("dropped while unwinding");
            panic!("on purpose: this test checks unwinding");
        });
        assert!(caught.is_err());
        let joined = std::thread::spawn(|| panic!("on purpose: this test checks unwinding"));
        assert!(joined.join().is_err());
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        assert!(
            trace.contains("a_panic_unwinds_with_the_unwinder_linked_in"),
            "{trace}"
        );
    }

    /// Whenever the parser of `run` alone takes a command line, the whole parser reads it the
    /// same; whatever it leaves, the whole parser answers (help, errors).
    #[test]
    fn a_run_parsed_alone_reads_as_the_whole_parser_reads_it() {
        use std::os::unix::ffi::OsStringExt;
        let lines: &[&[&str]] = &[
            &["run", "--", "true"],
            &["run", "true"],
            &["run", "--json", "--", "python", "t.py", "--json"],
            &[
                "run", "--tracer", "ptrace", "--name", "n", "-v", "--", "make", "-j2",
            ],
            &[
                "run",
                "--tracer=ebpf",
                "--s3",
                "--summary",
                "ls",
                "-la",
                "--",
                "x",
            ],
            &[
                "run",
                "--trace-file",
                "t.txt",
                "--group",
                "g",
                "--timing",
                "cmd",
                "-q",
            ],
            &["run", "--s3-upstream", "http://x", "--", "--weird"],
            &["run", "-q", "--", "x"],
            &["run", "--tracer", "bogus", "x"],
            &["run", "--help"],
            &["run"],
            &["run", "--remote", "origin", "true"],
            &["run", "--json"],
            &["log"],
            &["--json", "run", "true"],
            &["run", "python", "train.py", "--json", "--tracer", "x", "--"],
            &["run", "--", "--json"],
            &["run", "--", "-"],
            &["run", "--"],
            &["run", "-", "x"],
            &["run", "-v", "x"],
            &["run", "--", "--", "x"],
            &["run", "x", "--", "y"],
        ];
        for line in lines {
            let args = || line.iter().map(OsString::from);
            let alone = run_alone(args());
            let whole = Cli::command()
                .no_binary_name(true)
                .try_get_matches_from(args())
                .ok()
                .and_then(|mut m| Cli::from_arg_matches_mut(&mut m).ok())
                .filter(|c| c.remote.is_none());
            match (alone, whole) {
                (
                    Some((a, aj)),
                    Some(Cli {
                        command: Command::Run(w),
                        json: wj,
                        ..
                    }),
                ) => {
                    assert_eq!(format!("{a:?}"), format!("{w:?}"), "{line:?}");
                    assert_eq!(aj, wj, "{line:?}");
                }
                (None, _) => {}
                (Some(_), _) => panic!("{line:?}: taken alone, not a run for the whole parser"),
            }
        }
        // Arguments that are not UTF-8 are the command's as they are.
        let odd = OsString::from_vec(b"caf\xe9.csv".to_vec());
        let line = [OsString::from("run"), "cat".into(), odd.clone()];
        let (a, _) = run_alone(line.clone().into_iter()).unwrap();
        let Cli {
            command: Command::Run(w),
            ..
        } = Cli::try_parse_from(std::iter::once(OsString::from("roar")).chain(line)).unwrap()
        else {
            panic!("not a run")
        };
        assert_eq!(format!("{a:?}"), format!("{w:?}"));
        assert!(format!("{a:?}").contains("caf\\xE9"), "{a:?}");
        // The plain ones are taken alone (the point of it).
        assert!(run_alone(["run", "--", "true"].map(OsString::from).into_iter()).is_some());
        assert!(run_alone(["run", "--json", "x"].map(OsString::from).into_iter()).is_some());
    }
}
