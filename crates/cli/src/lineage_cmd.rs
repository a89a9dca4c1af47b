//! `roar lineage`, `roar inputs` and `roar dag`: answers built on the recorded graph of jobs and
//! file versions (rendering in `graph.rs`, `roar status` in `status_cmd.rs`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};

use roar_store::hash::{hash_paths, HashOptions, Prior};
use roar_store::{ContentHash, Project, Step, Store, Version};

use crate::fmt::{self, bold, rel};
use crate::graph::{self, Expand};
use crate::query_cmd::{classify, Target};

/// Resolves a PATH or HASH argument to the file version (or, for a hash, the content) it names;
/// `PATH@JOB` and `PATH~N` name an earlier version ([`versioned`]).
pub(crate) fn resolve(store: &Store, what: &OsStr) -> anyhow::Result<Version> {
    let cwd = std::env::current_dir()?;
    if let Some(v) = versioned(store, what, &cwd)? {
        return Ok(v);
    }
    let at = |path: PathBuf| store.version_at(&std::fs::canonicalize(&path).unwrap_or(path));
    Ok(match classify(what, &cwd) {
        Target::Hash(prefix) => Version {
            path: None,
            hash: store.resolve_hash(&prefix)?,
        },
        Target::Path(path) => at(path)?,
        Target::Job(id) => {
            // A job reference can also be a file name; only then is it meaningful here.
            let path = cwd.join(what);
            if !path.exists() {
                anyhow::bail!("{} looks like a job (job {id}); this takes a path or a hash prefix (try `roar show {}`)", fmt::shown(&what.to_string_lossy()), fmt::shown(&what.to_string_lossy()));
            }
            at(path)?
        }
    })
}

/// `PATH@JOB`: the version of PATH that job wrote (else the one it read); JOB is a job id or a
/// job's `--name` (`NAME~N`). `PATH~N`: N versions back, counting the distinct contents the
/// record holds for PATH, newest first (`PATH~0` is the newest). `None`: `what` is neither, or
/// names an existing file as it is (a file called `a@3` is that file).
pub(crate) fn versioned(
    store: &Store,
    what: &OsStr,
    cwd: &Path,
) -> anyhow::Result<Option<Version>> {
    let s = what.to_string_lossy();
    if cwd.join(what).exists() {
        return Ok(None);
    }
    let shown = || fmt::shown(&s);
    let at = |p: &str| {
        let path = crate::query_cmd::absolute(cwd, Path::new(p));
        std::fs::canonicalize(&path).unwrap_or(path)
    };
    if let Some((p, job)) = s
        .rsplit_once('@')
        .filter(|(p, j)| !p.is_empty() && !j.is_empty())
    {
        let id = match job.parse::<i64>() {
            Ok(id) => id,
            Err(_) => {
                let (name, back) = match job.rsplit_once('~') {
                    Some((n, b)) => (n, b.parse::<usize>().unwrap_or(usize::MAX)),
                    None => (job, 0),
                };
                store.job_named(name, back)?.ok_or_else(|| {
                    crate::NotFound(format!(
                        "{}: no job is named {} (give a job id, or a name from `roar log`)",
                        shown(),
                        fmt::shown(job)
                    ))
                })?
            }
        };
        let path = at(p);
        let history = store.path(&path)?.history;
        let mine: Vec<_> = history.iter().filter(|u| u.job_id == id).collect();
        let chosen = mine
            .iter()
            .find(|u| u.role == roar_store::Role::Output)
            .or_else(|| mine.iter().find(|u| u.role == roar_store::Role::Input));
        let Some(u) = chosen else {
            let jobs: Vec<String> = history.iter().map(|u| format!("@{}", u.job_id)).collect();
            return Err(crate::NotFound(format!(
                "{}: job {id} neither read nor wrote {} (jobs that did: {})",
                shown(),
                fmt::shown(p),
                jobs.join(", ")
            ))
            .into());
        };
        let hash = u.hash.clone().ok_or_else(|| {
            crate::NotFound(format!(
                "{}: job {id} used {} but its content was not recorded",
                shown(),
                fmt::shown(p)
            ))
        })?;
        return Ok(Some(Version {
            path: Some(path.to_string_lossy().into_owned()),
            hash,
        }));
    }
    let Some((p, n)) = s
        .rsplit_once('~')
        .and_then(|(p, n)| Some((p, n.parse::<usize>().ok()?)))
    else {
        return Ok(None);
    };
    let path = at(p);
    // A job name `NAME~N` is not a path the record knows.
    let Ok(detail) = store.path(&path) else {
        return Ok(None);
    };
    let mut seen = std::collections::HashSet::new();
    let newest_first: Vec<&roar_store::ContentHash> = detail
        .history
        .iter()
        .rev()
        .filter_map(|u| u.hash.as_ref())
        .filter(|h| seen.insert(h.blake3.clone()))
        .collect();
    match newest_first.get(n) {
        Some(h) => Ok(Some(Version {
            path: Some(path.to_string_lossy().into_owned()),
            hash: (*h).clone(),
        })),
        None => Err(crate::NotFound(format!(
            "{}: the record holds {} version(s) of {} (~0 to ~{})",
            shown(),
            newest_first.len(),
            fmt::shown(p),
            newest_first.len().saturating_sub(1)
        ))
        .into()),
    }
}

/// The project and its store, with environment noise (the default ignore list and the project's
/// `ignore` globs) left out of every answer unless `all`.
pub(crate) fn open_with(all: bool) -> anyhow::Result<(Project, Store)> {
    let project = crate::project()?;
    let mut store = Store::open(&project.db_path())?;
    if !all {
        let config = crate::config::Config::load(&project)?;
        store.hide(Some(roar_store::ignore::Ignore::new(&config.ignore)))?;
    }
    Ok((project, store))
}

pub(crate) fn open() -> anyhow::Result<(Project, Store)> {
    open_with(false)
}

pub fn lineage(what: &OsStr, all: bool, expand: &Expand, json: bool) -> anyhow::Result<()> {
    let (project, store) = open_with(all)?;
    let target = resolve(&store, what)?;
    let lineage = store.lineage(&target)?;
    if json {
        return fmt::print_json(&lineage);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} {}  {}",
        bold("lineage of"),
        fmt::shown(&what.to_string_lossy()),
        target.hash.blake3
    )?;
    if lineage.steps.is_empty() {
        writeln!(out, "no recorded job made this content: it is a root input")?;
        return Ok(());
    }
    graph::print_steps(&mut out, &lineage.steps, expand, &project.root)?;
    writeln!(out, "{} ({})", bold("root inputs"), lineage.roots.len())?;
    for r in &lineage.roots {
        graph::print_edge(&mut out, "  ", r, &project.root)?;
    }
    Ok(())
}

pub fn inputs(what: &OsStr, all: bool, json: bool) -> anyhow::Result<()> {
    let (project, store) = open_with(all)?;
    let target = resolve(&store, what)?;
    let lineage = store.lineage(&target)?;
    if json {
        return fmt::print_json(&lineage.roots);
    }
    let mut out = std::io::stdout().lock();
    for r in &lineage.roots {
        let hash = r
            .hash
            .as_ref()
            .map(|h| h.blake3.clone())
            .unwrap_or_else(|| "unknown".into());
        writeln!(out, "{hash}  {}", rel(&r.path, &project.root))?;
    }
    Ok(())
}

pub struct DagArgs {
    pub target: Option<std::ffi::OsString>,
    pub dot: bool,
    pub svg: Option<PathBuf>,
    pub html: Option<PathBuf>,
    pub all: bool,
    pub expand: Expand,
    pub all_runs: bool,
}

pub fn dag(args: DagArgs, json: bool) -> anyhow::Result<()> {
    let (project, store) = open_with(args.all)?;
    let target = match &args.target {
        Some(t) => Some(resolve(&store, t)?),
        None => None,
    };
    if let Some(out) = &args.html {
        crate::ui::page::write(&project, &store, target.as_ref(), out)?;
        if json {
            return fmt::print_json(&serde_json::json!({ "wrote": out }));
        }
        println!("wrote {}", out.display());
        return Ok(());
    }
    let dag = match &target {
        Some(t) => store.dag(Some(t))?,
        None => graph::project_dag(&store)?,
    };
    if json {
        return fmt::print_json(&dag);
    }
    // Jobs, not steps: a job is folded when every step of it is.
    let shown_jobs: std::collections::HashSet<i64> = dag
        .steps
        .iter()
        .filter(|s| !s.superseded)
        .map(|s| s.job_id)
        .collect();
    let all_jobs: std::collections::HashSet<i64> = dag.steps.iter().map(|s| s.job_id).collect();
    let folded = all_jobs.len() - shown_jobs.len();
    let steps: Vec<Step> = dag
        .steps
        .into_iter()
        .filter(|s| args.all_runs || !s.superseded)
        .collect();
    if let Some(svg) = args.svg {
        let mut child = std::process::Command::new("dot")
            .args(["-Tsvg", "-o"])
            .arg(&svg)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => {
                    anyhow::anyhow!("graphviz `dot` is not installed; use `roar dag --dot` and render it elsewhere")
                }
                _ => anyhow::Error::from(e).context("cannot run graphviz `dot`"),
            })?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(graph::dot(&steps, &args.expand, &project.root).as_bytes())?;
        let status = child.wait()?;
        anyhow::ensure!(status.success(), "graphviz `dot` failed ({status})");
        println!("wrote {}", svg.display());
        return Ok(());
    }
    if args.dot {
        print!("{}", graph::dot(&steps, &args.expand, &project.root));
        return Ok(());
    }
    if steps.is_empty() {
        match &target {
            Some(_) => println!("no recorded job made this content: it is a root input"),
            None => println!("no jobs recorded yet; try `roar run -- CMD`"),
        }
        return Ok(());
    }
    graph::print_steps(
        &mut std::io::stdout().lock(),
        &steps,
        &args.expand,
        &project.root,
    )?;
    if folded > 0 && !args.all_runs {
        println!("({folded} earlier runs folded into their latest; --all-runs shows them)");
    }
    Ok(())
}

/// Current content of `paths` (hash cache first), keyed by path; missing files are absent.
pub(crate) fn current_hashes(
    store: &Store,
    paths: &[PathBuf],
    sha256: bool,
) -> HashMap<PathBuf, ContentHash> {
    let batch = hash_paths(
        paths,
        HashOptions { sha256 },
        &|_| Prior::MayBeCached,
        &|| Some(store.conn()),
        &|_| {},
    );
    let mut out = HashMap::new();
    for (p, r) in paths.iter().zip(batch.results) {
        if let Ok(h) = r {
            out.insert(p.clone(), h.hash);
        }
    }
    remember(store, batch.new_cache);
    out
}

/// Saves hashes computed by a query in the hash cache: the next status or reproduce is cheap.
pub(crate) fn remember(store: &Store, entries: Vec<roar_store::CacheEntry>) {
    if entries.is_empty() {
        return;
    }
    if let Some(Ok(w)) = store
        .conn()
        .path()
        .map(|p| roar_store::Writer::start(Path::new(p)))
    {
        let _ = w.cache(entries);
    }
}
