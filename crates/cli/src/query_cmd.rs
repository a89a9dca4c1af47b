//! `roar init`, `roar log`, `roar show` and `roar db`.

use std::ffi::OsStr;
use std::io::Write;
use std::path::PathBuf;

use roar_store::{Project, Store};
use serde::Serialize;

use crate::entry::ExitCode;
use crate::fmt::{self, bold};
use crate::names::{absolute, classify_in, job_ref, Target};
use crate::show_print::{print_artifact, print_job, print_path, print_run, rank_label};

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
    let (_, store) = crate::names::open()?;
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

/// The prefixes of distributed run names (roar's distributed.rs makes them).
const RUN_PREFIXES: [&str; 4] = ["torchelastic:", "slurm:", "mpi:", "group:"];

pub fn show(what: &OsStr, all: bool, env: bool, patch: bool, json: bool) -> anyhow::Result<()> {
    let (project, store) = crate::names::open_with(all)?;
    let cwd = std::env::current_dir()?;
    let name = what.to_string_lossy();
    if RUN_PREFIXES.iter().any(|p| name.starts_with(p)) && store.has_run(&name)? {
        let run = store.run(&name)?;
        if json {
            return fmt::print_json(&run);
        }
        return print_run(&run, &project.root);
    }
    if let Some(v) = crate::names::versioned(&store, what, &cwd)? {
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
