//! How `roar show` prints a job, a distributed run, an artifact or a path for a person (`--json`
//! prints the store's records as they are).

use std::io::Write;
use std::path::Path;

use roar_store::{ArtifactDetail, JobDetail, PathDetail, Use};

use crate::fmt::{self, bold, rel, short_hash};

/// `[rank 3/8 slurm:991] `, `[node 1 torchelastic:j7] ` or `[group:nightly] `.
pub(crate) fn rank_label(d: &roar_store::Distributed) -> String {
    let of = d.world_size.map(|w| format!("/{w}")).unwrap_or_default();
    // The group comes from the launcher's environment: escaped like every recorded string.
    let group = fmt::shown(&d.group);
    match (d.rank, d.node_rank) {
        (Some(r), _) => format!("[rank {r}{of} {group}] "),
        (None, Some(n)) => format!("[node {n} {group}] "),
        (None, None) => format!("[{group}] "),
    }
}

/// A file's short hash, or dashes of the same width when its content is unknown.
fn hash_cell(h: Option<&roar_store::ContentHash>) -> String {
    h.map(short_hash)
        .unwrap_or_else(|| "-".repeat(fmt::SHORT_HASH))
}

/// `roar show RUN`: a distributed run's jobs (one line per rank), hosts and files.
pub(crate) fn print_run(run: &roar_store::RunDetail, root: &Path) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} {} jobs on {} host(s): {}",
        bold(&format!("run {}", fmt::shown(&run.group))),
        run.jobs.len(),
        run.hosts.len(),
        run.hosts
            .iter()
            .map(|h| fmt::shown(h))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    for j in &run.jobs {
        let s = &j.summary;
        let who = s.dist.as_ref().map(rank_label).unwrap_or_default();
        writeln!(
            out,
            "  {who}job {} on {}  {}  {} in {} out  {}",
            s.id,
            fmt::shown(j.host.as_deref().unwrap_or("?")),
            fmt::status(&s.status, s.exit_code, s.signal),
            s.inputs,
            s.outputs,
            fmt::argv(&s.argv)
        )?;
    }
    for (title, files) in [("inputs", &run.inputs), ("outputs", &run.outputs)] {
        if files.is_empty() {
            continue;
        }
        writeln!(out, "{} ({})", bold(title), files.len())?;
        for f in files {
            let hash = hash_cell(f.hash.as_ref());
            let jobs: Vec<String> = f.jobs.iter().map(|j| j.to_string()).collect();
            writeln!(
                out,
                "  {hash}  {}  (job{} {})",
                rel(&f.path, root),
                if jobs.len() == 1 { "" } else { "s" },
                jobs.join(", ")
            )?;
        }
    }
    Ok(())
}

pub(crate) fn print_job(job: &JobDetail, root: &Path) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let s = &job.summary;
    writeln!(
        out,
        "{} {}",
        bold(&format!("job {}", s.id)),
        fmt::argv(&s.argv)
    )?;
    if let Some(n) = &s.name {
        writeln!(out, "  name     {}", fmt::shown(n))?;
    }
    if !job.labels.is_empty() {
        let labels: Vec<String> = job
            .labels
            .iter()
            .map(|(k, v)| format!("{}={}", fmt::shown(k), fmt::shown(v)))
            .collect();
        writeln!(out, "  labels   {}", labels.join(" "))?;
    }
    writeln!(
        out,
        "  status   {}{}",
        fmt::status(&s.status, s.exit_code, s.signal),
        match s.status.as_str() {
            "killed" => " (its recorder was killed: recovered from its journal, the record holds every access observed until then; the exit status is unknown)",
            "running" => " (files are recorded when it ends)",
            _ if s.incomplete => " (incomplete: not every access was seen)",
            _ => "",
        }
    )?;
    let took = s
        .ended_ns
        .map(|e| format!(" ({})", fmt::duration_ns(e - s.started_ns)))
        .unwrap_or_default();
    writeln!(out, "  started  {}{took}", fmt::time_ns(s.started_ns))?;
    writeln!(out, "  cwd      {}", fmt::shown(&s.cwd))?;
    writeln!(out, "  backend  {}", s.backend)?;
    if let Some(d) = &s.dist {
        writeln!(
            out,
            "  run      {}; `roar show {}`",
            rank_label(d).trim_end().trim_matches(['[', ']']),
            fmt::shown(&d.group)
        )?;
    }

    if let Some(g) = &s.git {
        let commit = g
            .commit
            .as_deref()
            .map(|c| &c[..c.len().min(12)])
            .unwrap_or("(no commit)");
        let branch = g.branch.as_deref().unwrap_or("detached");
        let dirty = if g.dirty { ", dirty" } else { "" };
        writeln!(out, "  git      {commit} ({branch}{dirty})")?;
    }
    let e = &job.environment;
    if !e.packages.is_empty() || e.runtime.is_some() {
        writeln!(
            out,
            "  env      {}; `roar show {} --env`",
            crate::environment::one_line(e),
            s.id
        )?;
    }
    print_files(&mut out, &job.files, root)?;
    print_steps(&mut out, s.id, &job.steps, root)?;
    print_processes(&mut out, s.id, &job.processes)?;
    Ok(())
}

/// A job's files by role, each with its hash, size, what it replaced and the byte range read.
fn print_files(
    out: &mut impl Write,
    files: &[roar_store::FileRow],
    root: &Path,
) -> anyhow::Result<()> {
    for (title, role) in [
        ("inputs", roar_store::Role::Input),
        ("outputs", roar_store::Role::Output),
        ("temporaries", roar_store::Role::Temp),
    ] {
        let files: Vec<_> = files.iter().filter(|f| f.role == role).collect();
        if files.is_empty() {
            continue;
        }
        writeln!(out, "{} ({})", bold(title), files.len())?;
        for f in files {
            let hash = hash_cell(f.hash.as_ref());
            let size = f
                .hash
                .as_ref()
                .map(|h| fmt::size(h.size))
                .unwrap_or_default();
            // An output that replaced content roar had seen before says what it replaced.
            let was = match (&f.before, &f.hash) {
                (Some(b), Some(h)) if b.blake3 != h.blake3 => format!("  (was {})", short_hash(b)),
                _ => String::new(),
            };
            let range = match f.s3.as_ref().and_then(|o| o.range.as_deref()) {
                Some(r) => format!("  ({r})"),
                None => String::new(),
            };
            writeln!(
                out,
                "  {hash}  {size:>9}  {}{was}{range}",
                rel(&f.path, root)
            )?;
        }
    }
    Ok(())
}

/// The last of a job's processes (the command's own program comes after wrappers).
fn print_processes(
    out: &mut impl Write,
    job: i64,
    processes: &[roar_store::ProcessRecord],
) -> anyhow::Result<()> {
    if !processes.is_empty() {
        const SHOWN: usize = 20;
        writeln!(out, "{} ({})", bold("processes"), processes.len())?;
        if processes.len() > SHOWN {
            writeln!(
                out,
                "  ... {} more; `roar show {} --json` lists all",
                processes.len() - SHOWN,
                job
            )?;
        }
        // The last ones are the interesting ones: the command's own program comes after wrappers.
        for p in processes.iter().skip(processes.len().saturating_sub(SHOWN)) {
            let parent = p.parent_pid.map(|p| format!(" <- {p}")).unwrap_or_default();
            writeln!(
                out,
                "  {}{parent}  {}",
                p.pid,
                roar_store::shell_join(&p.argv)
            )?;
        }
    }
    Ok(())
}

/// The step tree, each step with its files: `in`/`out`/`tmp`, and where an input came from.
fn print_steps(
    out: &mut impl Write,
    job: i64,
    steps: &[roar_store::StepDetail],
    root: &Path,
) -> anyhow::Result<()> {
    if steps.is_empty() {
        return Ok(());
    }
    const SHOWN: usize = 40;
    writeln!(out, "{} ({})", bold("steps"), steps.len())?;
    let mut depth: std::collections::HashMap<u32, usize> = Default::default();
    for (n, st) in steps.iter().enumerate() {
        if n == SHOWN {
            writeln!(
                out,
                "  ... {} more; `roar show {job} --json` lists all",
                steps.len() - SHOWN
            )?;
            break;
        }
        let d = st.parent.and_then(|p| depth.get(&p)).map_or(0, |d| d + 1);
        depth.insert(st.seq, d);
        let indent = "  ".repeat(d);
        let took = match (st.started_ns, st.ended_ns) {
            (Some(a), Some(b)) => format!("  ({})", fmt::duration_ns(b - a)),
            _ => String::new(),
        };
        let streams: String = st
            .streams
            .iter()
            .map(|r| format!(" {} {}", r.operator(), rel(&r.path, root)))
            .collect();
        writeln!(
            out,
            "  {:>3}  {indent}{}{streams}{took}",
            st.seq,
            roar_store::shell_join(&st.argv)
        )?;
        let hash = |h: &Option<roar_store::ContentHash>| hash_cell(h.as_ref());
        for i in &st.inputs {
            let from = i
                .from_step
                .map(|w| format!("  (from step {w})"))
                .unwrap_or_default();
            let (h, p) = (hash(&i.hash), rel(&i.path, root));
            writeln!(out, "       {indent}in   {h}  {p}{from}")?;
        }
        for o in &st.outputs {
            let (h, p) = (hash(&o.hash), rel(&o.path, root));
            writeln!(out, "       {indent}out  {h}  {p}")?;
        }
        for t in &st.temps {
            writeln!(out, "       {indent}tmp  {}", rel(t, root))?;
        }
    }
    Ok(())
}

fn print_uses(out: &mut impl Write, title: &str, uses: &[Use], root: &Path) -> anyhow::Result<()> {
    writeln!(out, "{}", bold(title))?;
    if uses.is_empty() {
        writeln!(out, "  (none recorded)")?;
    }
    for u in uses {
        writeln!(
            out,
            "  job {:<5} {}  {}",
            u.job_id,
            rel(&u.path, root),
            fmt::argv(&u.argv)
        )?;
    }
    Ok(())
}

pub(crate) fn print_artifact(a: &ArtifactDetail, root: &Path) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{} {}", bold("artifact"), a.hash.blake3)?;
    if let Some(s) = &a.hash.sha256 {
        writeln!(out, "  sha256  {s}")?;
    }
    writeln!(out, "  size    {}", fmt::size(a.hash.size))?;
    print_uses(&mut out, "made by", &a.made_by, root)?;
    print_uses(&mut out, "used by", &a.used_by, root)
}

pub(crate) fn print_path(p: &PathDetail, root: &Path) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{} {}", bold("path"), rel(&p.path, root))?;
    for u in &p.history {
        let hash = hash_cell(u.hash.as_ref());
        writeln!(
            out,
            "  {}  {:<6} job {:<5} {}",
            hash,
            u.role.as_str(),
            u.job_id,
            fmt::argv(&u.argv)
        )?;
    }
    Ok(())
}
