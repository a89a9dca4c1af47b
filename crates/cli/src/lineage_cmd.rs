//! `roar lineage`, `roar inputs` and `roar dag`: answers built on the recorded graph of jobs and
//! file versions (rendering in `graph.rs`, `roar status` in `status_cmd.rs`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};

use roar_store::hash::{hash_paths, HashOptions, Prior};
use roar_store::{ContentHash, Project, Store, Version};

use crate::fmt::{self, bold, rel};
use crate::graph::{self, Expand};
use crate::query_cmd::{classify, Target};

/// Resolves a PATH or HASH argument to the file version (or, for a hash, the content) it names.
pub(crate) fn resolve(store: &Store, what: &OsStr) -> anyhow::Result<Version> {
    let cwd = std::env::current_dir()?;
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
    let dag = store.dag(target.as_ref())?;
    if json {
        return fmt::print_json(&dag);
    }
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
            .write_all(graph::dot(&dag.steps, &args.expand, &project.root).as_bytes())?;
        let status = child.wait()?;
        anyhow::ensure!(status.success(), "graphviz `dot` failed ({status})");
        println!("wrote {}", svg.display());
        return Ok(());
    }
    if args.dot {
        print!("{}", graph::dot(&dag.steps, &args.expand, &project.root));
        return Ok(());
    }
    if dag.steps.is_empty() {
        match &target {
            Some(_) => println!("no recorded job made this content: it is a root input"),
            None => println!("no jobs recorded yet; try `roar run -- CMD`"),
        }
        return Ok(());
    }
    graph::print_steps(
        &mut std::io::stdout().lock(),
        &dag.steps,
        &args.expand,
        &project.root,
    )?;
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
