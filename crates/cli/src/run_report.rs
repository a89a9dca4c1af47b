//! What `roar run` says on stderr once its job is recorded (or not): the closing line (or one
//! JSON object), warnings of what the record may miss, the `--verbose` listing, `--summary` and
//! `--timing`.
#![allow(unsafe_code)]

use std::io::Write;
use std::path::Path;

use roar_store::{Project, Role};
use roar_tracer::Backend;

use crate::fmt::{self, rel};

/// A job classified, hashed and handed to the store (or not).
pub(crate) struct Done {
    pub(crate) recorded: roar_store::Result<i64>,
    pub(crate) recorded_by: crate::recording::By,
    pub(crate) inputs: usize,
    pub(crate) outputs: usize,
    pub(crate) hashed: roar_tracer::collect::Hashed,
    /// The job's files, with `--verbose`.
    pub(crate) listing: Option<Vec<roar_store::FileRecord>>,
    /// When classifying, the environment, hashing and recording were done.
    pub(crate) at: [std::time::Duration; 4],
}

/// How a run reports: where its project is, the backend that traced it, the directory it ran in,
/// and the flags that change the report (`--json`, `--summary`, `--timing`'s phases).
#[derive(Clone, Copy)]
pub(crate) struct Reporting<'a> {
    pub(crate) project: &'a Project,
    pub(crate) backend: Backend,
    pub(crate) cwd: &'a Path,
    pub(crate) json: bool,
    pub(crate) summary: bool,
    pub(crate) phases: Option<[std::time::Duration; 6]>,
}

/// What a run says on stderr when its job is recorded (or not): labels set, the closing line,
/// warnings, the `--verbose` listing, `--summary` and `--timing` (`phases`).
pub(crate) fn report(
    how: &Reporting,
    traced: &roar_tracer::Traced,
    done: Done,
    labels: Vec<(String, Option<String>)>,
) {
    let Reporting {
        project,
        backend,
        cwd,
        json,
        summary,
        phases,
    } = *how;
    let child_ns = traced.ended_ns - traced.started_ns;
    let t_recorded = done.at[3];
    let overhead_ms = (t_recorded.as_nanos() as i64 - child_ns) as f64 / 1e6;
    // Stderr is unbuffered: without a line buffer each piece of a line is a write of its own, and
    // output of the command's leftover background processes could land inside roar's line.
    let mut err = std::io::LineWriter::new(std::io::stderr().lock());
    if let (Ok(id), false) = (&done.recorded, labels.is_empty()) {
        let set = roar_store::Store::open(&project.db_path())
            .map_err(anyhow::Error::from)
            .and_then(|s| crate::labels::apply(project, &s, *id, labels));
        if let Err(e) = set {
            let _ = writeln!(err, "roar: warning: job {id}'s labels were not set: {e}");
        }
    }
    match done.recorded {
        Ok(id) => {
            let summary = Summary {
                id,
                inputs: done.inputs,
                outputs: done.outputs,
                backend,
                recorded_by: done.recorded_by,
                overhead_ms,
                unhashed_inputs: done.hashed.unhashed_inputs,
                listing: done.listing.as_deref(),
            };
            summary.print(&mut err, traced, json);
            warnings(&mut err, traced, done.hashed.unhashed_inputs);
        }
        Err(e) => {
            let e = anyhow::Error::from(e);
            let _ = writeln!(err, "roar: job could not be recorded: {e:#}");
        }
    }
    if let Some(files) = done.listing.filter(|_| !json) {
        print_listing(&mut err, &files, &project.root);
    }
    if summary {
        let _ = crate::live::summary(&traced.events, cwd, &mut err);
    }
    if let Some(phases) = phases {
        print_timing(
            &mut err,
            phases,
            child_ns,
            done.hashed.hashed_early,
            traced.stops,
        );
    }
    let _ = err.flush();
}

/// The line a recorded run closes with, on stderr (stdout is the command's): `roar: job N, ...`,
/// or with `--json` one object.
struct Summary<'a> {
    id: i64,
    inputs: usize,
    outputs: usize,
    backend: Backend,
    recorded_by: crate::recording::By,
    overhead_ms: f64,
    unhashed_inputs: usize,
    /// The job's files, with `--verbose`.
    listing: Option<&'a [roar_store::FileRecord]>,
}

impl Summary<'_> {
    fn print(&self, err: &mut impl Write, traced: &roar_tracer::Traced, json: bool) {
        let incomplete = incomplete_reason(traced);
        let Summary {
            id,
            inputs,
            outputs,
            overhead_ms,
            ..
        } = *self;
        if !json {
            let _ = writeln!(
                err,
                "roar: job {id}, {inputs} inputs, {outputs} outputs, {}, +{overhead_ms:.0} ms{incomplete}",
                self.backend.name()
            );
            return;
        }
        let files = self.listing.map(|files| {
            files
                .iter()
                .filter(|f| f.role != Role::Temp)
                .map(|f| {
                    serde_json::json!({
                        "role": f.role.as_str(),
                        "path": f.path.to_string_lossy(),
                        "blake3": f.hash.as_ref().map(|h| h.blake3.clone()),
                    })
                })
                .collect::<Vec<_>>()
        });
        let untraced: Vec<_> = traced
            .untraced
            .iter()
            .map(|(exe, why)| serde_json::json!({"program": exe.to_string_lossy(), "why": why}))
            .collect();
        let summary = serde_json::json!({
            "job": id,
            "inputs": inputs,
            "outputs": outputs,
            "backend": self.backend.name(),
            "recorded_by": self.recorded_by,
            "overhead_ms": (overhead_ms * 100.0).round() / 100.0,
            "incomplete": !incomplete.is_empty(),
            "untraced": untraced,
            "forged_datagrams": traced.forged,
            "unprivileged": traced.unprivileged.iter().map(|p| p.to_string_lossy()).collect::<Vec<_>>(),
            "unhashed_inputs": self.unhashed_inputs,
            "files": files,
        });
        let _ = writeln!(err, "{}", roar_store::quote::json_string(&summary));
    }
}

/// `--timing` (or `ROAR_TIMING=1`): where a run's time went. `at`: the times since the start at
/// which setup, the traced run, classification, the environment, hashing and recording ended.
fn print_timing(
    err: &mut impl Write,
    at: [std::time::Duration; 6],
    child_ns: i64,
    hashed_early: usize,
    stops: u64,
) {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let [setup, traced, classified, environment, hashed, recorded] = at;
    let _ = writeln!(
        err,
        "roar: timing: setup {:.2} ms, traced run {:.2} ms (command {:.2} ms), classify {:.2} ms, environment {:.2} ms, hash {:.2} ms ({} files hashed during the run) with recording alongside, record {:.2} ms after the last file was hashed; roar's own CPU {:.2} ms{}",
        ms(setup),
        ms(traced - setup),
        child_ns as f64 / 1e6,
        ms(classified - traced),
        ms(environment - classified),
        ms(hashed - environment),
        hashed_early,
        ms(recorded - hashed),
        own_cpu_ms(),
        if stops > 0 {
            format!("; the command stopped {stops} times for the tracer")
        } else {
            String::new()
        },
    );
}

/// `--verbose`: each input and output, its short hash and its path from the project's root.
fn print_listing(err: &mut impl Write, files: &[roar_store::FileRecord], root: &Path) {
    for f in files.iter().filter(|f| f.role != Role::Temp) {
        let hash = f
            .hash
            .as_ref()
            .map(fmt::short_hash)
            .unwrap_or_else(|| "-".repeat(fmt::SHORT_HASH));
        let _ = writeln!(
            err,
            "  {:<6} {hash}  {}",
            f.role.as_str(),
            rel(&f.path.to_string_lossy(), root)
        );
    }
}

/// `, incomplete (why)` for a job the tracer could not see whole, else nothing.
fn incomplete_reason(traced: &roar_tracer::Traced) -> String {
    match (traced.lost, traced.malformed) {
        _ if traced.cut_short.is_some() => {
            format!(", incomplete ({})", traced.cut_short.unwrap_or_default())
        }
        (0, 0) if traced.cut_off > 0 => format!(
            ", incomplete ({} event(s) cut off: a process was killed while reporting them)",
            traced.cut_off
        ),
        (0, 0) if !traced.untraced.is_empty() => {
            ", incomplete (programs whose files the tracer could not see)".to_owned()
        }
        (0, 0) if !traced.unprivileged.is_empty() => {
            ", incomplete (setuid programs ran without their privileges)".to_owned()
        }
        (0, 0) if traced.forged > 0 => format!(
            ", incomplete ({} event(s) refused: not from a process of this run)",
            traced.forged
        ),
        (0, 0) => String::new(),
        (0, bad) => format!(", incomplete ({bad} undecodable events)"),
        (lost, _) => format!(
            ", incomplete ({lost} events lost: the eBPF ring buffer was full; raise ROAR_EBPF_RING_KB)"
        ),
    }
}

/// The warnings a recorded run prints under its summary line: programs the tracer could not
/// follow, setuid programs run without privileges, refused datagrams, inputs changed unhashed.
fn warnings(err: &mut impl Write, traced: &roar_tracer::Traced, unhashed_inputs: usize) {
    for (exe, why) in traced.untraced.iter().take(3) {
        let _ = writeln!(
            err,
            "roar: warning: the job ran {} ({why}): its files are not in the record; {}",
            roar_store::shown(&exe.to_string_lossy()),
            roar_tracer::remedy(why)
        );
    }
    if traced.untraced.len() > 3 {
        let _ = writeln!(
            err,
            "roar: warning: ... and {} more programs the tracer could not follow",
            traced.untraced.len() - 3
        );
    }
    for exe in &traced.unprivileged {
        let _ = writeln!(
            err,
            "roar: warning: the job ran {} without its setuid/setgid privileges (an unprivileged ptrace cannot keep them): it may have behaved otherwise than bare; use --tracer preload or ebpf",
            roar_store::shown(&exe.to_string_lossy())
        );
    }
    if traced.forged > 0 {
        let _ = writeln!(
            err,
            "roar: warning: refused {} event datagrams the kernel does not place in this run (another process on this machine sent them, or one of the run's that became another user and was gone before they were read); none of them is in the record",
            traced.forged
        );
    }
    if unhashed_inputs > 0 {
        let _ = writeln!(
            err,
            "roar: {unhashed_inputs} inputs changed before they could be hashed; their content is unknown"
        );
    }
}

/// CPU time (user + system) this process has used so far, all threads together: what roar's
/// bookkeeping costs the machine beside the command.
fn own_cpu_ms() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(u.ru_utime) + ms(u.ru_stime)
}
