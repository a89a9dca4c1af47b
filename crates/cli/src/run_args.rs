//! `roar run`'s arguments: roar's options, then the command word for word (`trailing_var_arg`:
//! an unknown option before the command is an error, never the command's).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

#[derive(Args, Debug)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    /// Capture backend: auto, preload, ptrace or ebpf (default: the project's config, else auto).
    #[arg(long, value_parser = ["auto", "preload", "ptrace", "ebpf"])]
    pub(crate) tracer: Option<String>,
    /// A name for the job, shown by `roar log`.
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Make the job one rank of the distributed run NAME, with the other jobs of that name on
    /// any machine (torchrun, Slurm and MPI ranks are grouped without it).
    #[arg(long, value_name = "NAME")]
    pub(crate) group: Option<String>,
    /// List the job's inputs and outputs after it finishes.
    #[arg(short, long)]
    pub(crate) verbose: bool,
    /// Print each access as roar observes it (`[pid] open R data/x.csv`), on stderr.
    #[arg(long)]
    pub(crate) trace: bool,
    /// Write the --trace lines to FILE instead of stderr (implies --trace).
    #[arg(long, value_name = "FILE")]
    pub(crate) trace_file: Option<PathBuf>,
    /// End with counts per operation and per directory, like `strace -c`.
    #[arg(long)]
    pub(crate) summary: bool,
    /// Print where roar's own time went (also ROAR_TIMING=1).
    #[arg(long)]
    pub(crate) timing: bool,
    /// Serve S3 to the command through a gateway of its own and record the objects it reads and
    /// writes (also `[s3] enabled` in the config).
    #[arg(long)]
    pub(crate) s3: bool,
    /// With --s3: forward to this S3 service instead of the embedded store in .roar/s3/.
    #[arg(long, value_name = "URL")]
    pub(crate) s3_upstream: Option<String>,
    /// Put a label on the job (KEY=VALUE, repeatable); `roar label` changes them later.
    #[arg(long, value_name = "KEY=VALUE")]
    pub(crate) label: Vec<String>,
    /// With `@N` for the command: run job N again with this parameter set (KEY=VALUE,
    /// repeatable): in its argv (`lr` for `--lr 0.1`), else in a parameter file it read
    /// (`model.max_depth`, or `params.yaml:model.max_depth`), through a scratch copy.
    #[arg(long, value_name = "KEY=VALUE")]
    pub(crate) set: Vec<String>,
    /// The command and its arguments. Options before it are roar's (an unknown one is an error,
    /// never the command); everything from the command's name on is the command's.
    #[arg(required = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

/// What `roar run @N` takes from its own options: the options a plain `roar run` of the same
/// job gets, and the re-run's own.
pub struct RerunArgs {
    /// `--tracer`, `--group`, `-v`, `--trace`, `--trace-file`, `--summary`, `--timing`, `--s3`,
    /// `--s3-upstream` as given.
    pub forwarded: Vec<OsString>,
    pub name: Option<String>,
    pub label: Vec<String>,
    pub set: Vec<String>,
    pub command: Vec<OsString>,
}

impl RunArgs {
    pub fn into_rerun(self) -> RerunArgs {
        let mut f: Vec<OsString> = Vec::new();
        let mut opt = |flag: &str, v: Option<OsString>| {
            if let Some(v) = v {
                f.push(flag.into());
                f.push(v);
            }
        };
        opt("--tracer", self.tracer.map(Into::into));
        opt("--group", self.group.map(Into::into));
        opt("--trace-file", self.trace_file.map(Into::into));
        opt("--s3-upstream", self.s3_upstream.map(Into::into));
        for (on, flag) in [
            (self.verbose, "--verbose"),
            (self.trace, "--trace"),
            (self.summary, "--summary"),
            (self.timing, "--timing"),
            (self.s3, "--s3"),
        ] {
            if on {
                f.push(flag.into());
            }
        }
        RerunArgs {
            forwarded: f,
            name: self.name,
            label: self.label,
            set: self.set,
            command: self.command,
        }
    }

    /// `roar run CMD...` with no option of roar's: what clap makes of it, without clap.
    pub fn command_only(command: Vec<OsString>) -> RunArgs {
        RunArgs {
            tracer: None,
            name: None,
            group: None,
            verbose: false,
            trace: false,
            trace_file: None,
            summary: false,
            timing: false,
            s3: false,
            s3_upstream: None,
            label: Vec::new(),
            set: Vec::new(),
            command,
        }
    }
}
