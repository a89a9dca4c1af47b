//! `roar init`, `roar log`, `roar show` and `roar db`.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use roar_store::{ArtifactDetail, JobDetail, PathDetail, Project, Store, Use};
use serde::Serialize;

use crate::entry::ExitCode;
use crate::fmt::{self, bold, rel, short_hash};

pub fn init(dir: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    let cwd = std::env::current_dir()?;
    let root = absolute(&cwd, &dir.unwrap_or_else(|| cwd.clone()));
    let (project, fresh) = Project::init(&root)?;
    if json {
        #[derive(Serialize)]
        struct Out {
            root: String,
            created: bool,
        }
        return fmt::print_json(&Out {
            root: project.root.to_string_lossy().into_owned(),
            created: fresh,
        });
    }
    let verb = if fresh {
        "Initialised"
    } else {
        "Reinitialised existing"
    };
    println!("{verb} roar project in {}", project.dir().display());
    Ok(())
}

pub fn log(limit: usize, json: bool) -> anyhow::Result<()> {
    let (_, store) = crate::lineage_cmd::open()?;
    // -n 0 lists every job: an empty list is never what was asked for.
    let jobs = store.jobs(if limit == 0 { usize::MAX } else { limit })?;
    if json {
        return fmt::print_json(&jobs);
    }
    let mut out = std::io::stdout().lock();
    for j in &jobs {
        let argv = fmt::argv(&j.argv);
        let label = j
            .name
            .as_deref()
            .map(|n| format!("[{}] ", fmt::shown(n)))
            .unwrap_or_default();
        let rank = j.dist.as_ref().map(rank_label).unwrap_or_default();
        writeln!(
            out,
            "{:>5}  {}  {:<10} {:>3} in {:>3} out  {:<7} {label}{rank}{argv}{}",
            bold(&format!("#{}", j.id)),
            fmt::time_ns(j.started_ns),
            fmt::status(&j.status, j.exit_code, j.signal),
            j.inputs,
            j.outputs,
            j.backend,
            if j.incomplete { "  (incomplete)" } else { "" },
        )?;
    }
    if jobs.is_empty() {
        writeln!(out, "no jobs recorded yet; try `roar run -- CMD`")?;
    }
    Ok(())
}

/// `[rank 3/8 slurm:991] `, `[node 1 torchelastic:j7] ` or `[group:nightly] `.
fn rank_label(d: &roar_store::Distributed) -> String {
    let of = d.world_size.map(|w| format!("/{w}")).unwrap_or_default();
    // The group comes from the launcher's environment: escaped like every recorded string.
    let group = fmt::shown(&d.group);
    match (d.rank, d.node_rank) {
        (Some(r), _) => format!("[rank {r}{of} {group}] "),
        (None, Some(n)) => format!("[node {n} {group}] "),
        (None, None) => format!("[{group}] "),
    }
}

/// The prefixes of distributed run names (roar's distributed.rs makes them).
const RUN_PREFIXES: [&str; 4] = ["torchelastic:", "slurm:", "mpi:", "group:"];

/// What `roar show` was asked about, decided from the argument's form.
pub(crate) enum Target {
    Job(i64),
    Hash(String),
    Path(PathBuf),
}

/// `123` or `@123` is a job id, `b3:…` or 4+ hex digits a hash prefix (unless a file of that name
/// exists), `s3://bucket/key` an object, `ARCHIVE!/member` a member of an archive, `NAME` or
/// `NAME~N` a job's `--name`, else the name its script gives it (`python train.py` is `train`),
/// unless a file of that name exists; anything else a path.
pub(crate) fn classify(what: &OsStr, cwd: &Path) -> Target {
    classify_in(None, what, cwd)
}

/// [`classify`], with job names resolved against `store`.
pub(crate) fn classify_in(store: Option<&Store>, what: &OsStr, cwd: &Path) -> Target {
    let s = what.to_string_lossy();
    if let Ok(id) = s.strip_prefix('@').unwrap_or(&s).parse::<i64>() {
        return Target::Job(id);
    }
    if let Some(h) = s.strip_prefix("b3:") {
        return Target::Hash(h.to_owned());
    }
    if s.starts_with("s3://") {
        return Target::Path(PathBuf::from(what));
    }
    let path = absolute(cwd, Path::new(what));
    if path.exists() {
        return Target::Path(path);
    }
    // A member of a mounted archive, `ARCHIVE!/path/in/archive`: named in the record after the
    // archive's canonical path.
    if let Some((archive, member)) = roar_archive::split_member_path(&path) {
        let archive = std::fs::canonicalize(&archive).unwrap_or(archive);
        return Target::Path(roar_archive::member_path(&archive, &member));
    }
    let hexish = s.len() >= 4 && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    if hexish {
        return Target::Hash(s.into_owned());
    }
    if let Some(store) = store {
        let (name, back) = match s.rsplit_once('~') {
            Some((n, k)) if k.bytes().all(|b| b.is_ascii_digit()) => {
                (n, k.parse::<usize>().unwrap_or(usize::MAX))
            }
            _ => (s.as_ref(), 0),
        };
        if let Ok(Some(id)) = store.job_named(name, back) {
            return Target::Job(id);
        }
        if let Ok(Some(id)) = store.job_by_default_name(name, back, roar_env::params::default_name)
        {
            return Target::Job(id);
        }
    }
    Target::Path(path)
}

pub fn show(what: &OsStr, all: bool, env: bool, patch: bool, json: bool) -> anyhow::Result<()> {
    let (project, store) = crate::lineage_cmd::open_with(all)?;
    let cwd = std::env::current_dir()?;
    let name = what.to_string_lossy();
    if RUN_PREFIXES.iter().any(|p| name.starts_with(p)) && store.has_run(&name)? {
        let run = store.run(&name)?;
        if json {
            return fmt::print_json(&run);
        }
        return print_run(&run, &project.root);
    }
    if let Some(v) = crate::lineage_cmd::versioned(&store, what, &cwd)? {
        let detail = store.artifact(&v.hash)?;
        if json {
            return fmt::print_json(&detail);
        }
        return print_artifact(&detail, &project.root);
    }
    let target = classify_in(Some(&store), what, &cwd);
    if (env || patch) && !matches!(target, Target::Job(_)) {
        anyhow::bail!(
            "--{} is about a job; {} is not one (give its id, @N or name)",
            if env { "env" } else { "patch" },
            fmt::shown(&what.to_string_lossy())
        );
    }
    match target {
        Target::Job(id) if patch => {
            let Some(diff) = store.job_patch(id)? else {
                let dirty = store.job(id)?.summary.git.is_some_and(|g| g.dirty);
                anyhow::bail!(
                    "job {id} {}",
                    if dirty {
                        "ran in a dirty tree but its diff was not kept (an added line held a secret, the diff was over 64 MiB, or `env.diff = false`)"
                    } else {
                        "ran in a clean tree (or outside git): there is no patch"
                    }
                );
            };
            std::io::stdout().lock().write_all(&diff)?;
            Ok(())
        }
        Target::Job(id) if env => crate::environment::show(&store.job(id)?, json),
        Target::Job(id) => {
            let job = store.job(id)?;
            if json {
                return fmt::print_json(&job);
            }
            print_job(&job, &project.root)
        }
        Target::Hash(prefix) => {
            let hash = store.resolve_hash(&prefix)?;
            let detail = store.artifact(&hash)?;
            if json {
                return fmt::print_json(&detail);
            }
            print_artifact(&detail, &project.root)
        }
        Target::Path(path) => {
            let bare_word = !name.contains('/') && !path.exists();
            let path = std::fs::canonicalize(&path).unwrap_or(path);
            let detail = match store.path(&path) {
                Err(roar_store::StoreError::UnknownPath { .. }) if bare_word => {
                    return Err(crate::NotFound(format!(
                        "no job named {} and no recorded file {}: a job goes by its --name or its script (`python train.py` is `train`, `train~1` the one before); `roar log` lists them",
                        fmt::shown(&name),
                        fmt::shown(&path.to_string_lossy())
                    ))
                    .into());
                }
                r => r?,
            };
            if json {
                return fmt::print_json(&detail);
            }
            print_path(&detail, &project.root)
        }
    }
}

/// The recorded job `what` names (`3`, `@3`, a name, `NAME~N`); else a one-line error ending
/// with `then`.
pub(crate) fn job_ref(store: &Store, what: &OsStr, cwd: &Path, then: &str) -> anyhow::Result<i64> {
    if let Target::Job(id) = classify_in(Some(store), what, cwd) {
        if store.job(id).is_ok() {
            return Ok(id);
        }
    }
    Err(crate::NotFound(format!(
        "{} is not a recorded job (give an id, `@ID`, a job name or `NAME~N`; `roar log` lists them){then}",
        fmt::shown(&what.to_string_lossy())
    ))
    .into())
}

/// A file's short hash, or dashes of the same width when its content is unknown.
fn hash_cell(h: Option<&roar_store::ContentHash>) -> String {
    h.map(short_hash)
        .unwrap_or_else(|| "-".repeat(fmt::SHORT_HASH))
}

/// `roar show RUN`: a distributed run's jobs (one line per rank), hosts and files.
fn print_run(run: &roar_store::RunDetail, root: &Path) -> anyhow::Result<()> {
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

fn print_job(job: &JobDetail, root: &Path) -> anyhow::Result<()> {
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
    for (title, role) in [
        ("inputs", roar_store::Role::Input),
        ("outputs", roar_store::Role::Output),
        ("temporaries", roar_store::Role::Temp),
    ] {
        let files: Vec<_> = job.files.iter().filter(|f| f.role == role).collect();
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
    print_steps(&mut out, s.id, &job.steps, root)?;
    if !job.processes.is_empty() {
        const SHOWN: usize = 20;
        writeln!(out, "{} ({})", bold("processes"), job.processes.len())?;
        if job.processes.len() > SHOWN {
            writeln!(
                out,
                "  ... {} more; `roar show {} --json` lists all",
                job.processes.len() - SHOWN,
                s.id
            )?;
        }
        // The last ones are the interesting ones: the command's own program comes after wrappers.
        for p in job
            .processes
            .iter()
            .skip(job.processes.len().saturating_sub(SHOWN))
        {
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

fn print_artifact(a: &ArtifactDetail, root: &Path) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{} {}", bold("artifact"), a.hash.blake3)?;
    if let Some(s) = &a.hash.sha256 {
        writeln!(out, "  sha256  {s}")?;
    }
    writeln!(out, "  size    {}", fmt::size(a.hash.size))?;
    print_uses(&mut out, "made by", &a.made_by, root)?;
    print_uses(&mut out, "used by", &a.used_by, root)
}

fn print_path(p: &PathDetail, root: &Path) -> anyhow::Result<()> {
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

pub fn db(json: bool) -> anyhow::Result<()> {
    let project = crate::project()?;
    let stats = Store::open(&project.db_path())?.stats()?;
    if json {
        return fmt::print_json(&stats);
    }
    println!("store       {}", fmt::shown(&stats.path));
    println!("size        {}", fmt::size(stats.size_bytes));
    println!(
        "schema      {} (this roar writes {})",
        stats.schema_version,
        roar_store::SCHEMA_VERSION
    );
    println!("jobs        {}", stats.jobs);
    println!("processes   {}", stats.processes);
    println!("artifacts   {}", stats.artifacts);
    println!("job files   {}", stats.job_files);
    println!("s3 objects  {}", stats.s3_objects);
    println!("hash cache  {}", stats.hash_cache);
    Ok(())
}

/// `roar db --secrets-scan` (exit 1 when the store holds secrets) and `roar db --redact`.
pub fn db_secrets(redact: bool, json: bool) -> anyhow::Result<ExitCode> {
    let project = crate::project()?;
    crate::config::Config::load(&project)?;
    let policy = roar_store::redact::Policy::for_config(&project.config_path());
    let findings = if redact {
        roar_store::audit::redact_store(&project.db_path(), &policy)?
    } else {
        roar_store::audit::scan(&Store::open(&project.db_path())?, &policy)?
    };
    if json {
        fmt::print_json(&findings)?;
    } else {
        let mut out = std::io::stdout().lock();
        for f in &findings {
            writeln!(
                out,
                "job {:<5} {:<24} {}",
                f.job_id,
                fmt::shown(&f.field),
                fmt::shown(&f.redacted)
            )?;
        }
        let jobs: std::collections::BTreeSet<i64> = findings.iter().map(|f| f.job_id).collect();
        match (findings.is_empty(), redact) {
            (true, _) => writeln!(out, "no secrets found by the current redaction rules")?,
            (false, false) => writeln!(
                out,
                "{} fields in {} jobs hold secrets; `roar db --redact` removes them",
                findings.len(),
                jobs.len()
            )?,
            (false, true) => writeln!(
                out,
                "redacted {} fields in {} jobs; the store was rewritten so no old value remains",
                findings.len(),
                jobs.len()
            )?,
        }
    }
    Ok(if findings.is_empty() || redact {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::FAILURE)
    })
}

/// `path` made absolute against `cwd` and lexically normalised (no filesystem access).
pub fn absolute(cwd: &Path, path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in cwd.join(path).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// `roar rm JOB...`: every reference is resolved before anything is removed, so one typo removes
/// nothing.
pub fn rm(jobs: &[std::ffi::OsString], json: bool) -> anyhow::Result<()> {
    let project = crate::project()?;
    let store = Store::open(&project.db_path())?;
    let cwd = std::env::current_dir()?;
    let mut ids = Vec::new();
    for j in jobs {
        ids.push(job_ref(&store, j, &cwd, "; nothing was removed")?);
    }
    ids.dedup();
    for id in &ids {
        store.delete_job(*id)?;
    }
    if json {
        return fmt::print_json(&serde_json::json!({ "removed": ids }));
    }
    for id in &ids {
        println!("removed job {id} from the record (files untouched)");
    }
    Ok(())
}
