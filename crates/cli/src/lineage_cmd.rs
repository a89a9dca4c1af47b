//! `roar lineage`, `roar inputs`, `roar dag` and `roar status`: answers built on
//! the recorded graph of jobs and artifacts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};

use roar_store::hash::{hash_paths, HashOptions, Prior};
use roar_store::{shell_join, ContentHash, Edge, Project, Step, Store};
use serde::Serialize;

use crate::fmt::{self, bold, rel, rel_exact, short_hash};
use crate::query_cmd::{classify, Target};

/// Resolves a PATH or HASH argument to the artifact it names.
pub(crate) fn resolve(store: &Store, what: &OsStr) -> anyhow::Result<ContentHash> {
    let cwd = std::env::current_dir()?;
    Ok(match classify(what, &cwd) {
        Target::Hash(prefix) => store.resolve_hash(&prefix)?,
        Target::Path(path) => store.artifact_at(&std::fs::canonicalize(&path).unwrap_or(path))?,
        Target::Job(id) => {
            // A number can also be a file name; only then is it meaningful here.
            let path = cwd.join(what);
            if !path.exists() {
                anyhow::bail!("{id} looks like a job id; lineage takes a path or a hash prefix (try `roar show {id}`)");
            }
            store.artifact_at(&std::fs::canonicalize(&path)?)?
        }
    })
}

pub(crate) fn open() -> anyhow::Result<(Project, Store)> {
    let project = crate::project()?;
    let store = Store::open(&project.db_path())?;
    Ok((project, store))
}

const SHOWN_OUTPUTS: usize = 5;

fn label(step: &Step) -> String {
    let name = step
        .name
        .as_deref()
        .map(|n| format!("[{n}] "))
        .unwrap_or_default();
    format!("{name}{}", shell_join(&step.argv))
}

fn print_edge(out: &mut impl Write, arrow: &str, e: &Edge, root: &Path) -> std::io::Result<()> {
    let hash = e
        .hash
        .as_ref()
        .map(short_hash)
        .unwrap_or_else(|| "?".repeat(fmt::SHORT_HASH));
    let from = e
        .producer
        .map(|p| format!("  (job {p})"))
        .unwrap_or_default();
    writeln!(out, "    {arrow} {hash}  {}{from}", rel(&e.path, root))
}

fn print_steps(out: &mut impl Write, steps: &[Step], root: &Path) -> std::io::Result<()> {
    for s in steps {
        writeln!(out, "{} {}", bold(&format!("job {}", s.job_id)), label(s))?;
        for i in &s.inputs {
            print_edge(out, "<-", i, root)?;
        }
        for o in s.outputs.iter().take(SHOWN_OUTPUTS) {
            print_edge(out, "->", o, root)?;
        }
        if s.outputs.len() > SHOWN_OUTPUTS {
            writeln!(
                out,
                "    -> ... {} more outputs",
                s.outputs.len() - SHOWN_OUTPUTS
            )?;
        }
    }
    Ok(())
}

pub fn lineage(what: &OsStr, json: bool) -> anyhow::Result<()> {
    let (project, store) = open()?;
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
        target.blake3
    )?;
    if lineage.steps.is_empty() {
        writeln!(out, "no recorded job made this content: it is a root input")?;
        return Ok(());
    }
    print_steps(&mut out, &lineage.steps, &project.root)?;
    writeln!(out, "{} ({})", bold("root inputs"), lineage.roots.len())?;
    for r in &lineage.roots {
        print_edge(&mut out, "  ", r, &project.root)?;
    }
    Ok(())
}

pub fn inputs(what: &OsStr, json: bool) -> anyhow::Result<()> {
    let (project, store) = open()?;
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

/// Graphviz source for the project's graph: jobs are boxes, contents are notes.
fn dot(steps: &[Step], root: &Path) -> String {
    let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let node = |e: &Edge| match &e.hash {
        Some(h) => format!("a{}", &h.blake3[..16]),
        None => format!("p{}", esc(&e.path)),
    };
    let mut s = String::from(
        "digraph roar {\n  rankdir=LR;\n  node [fontname=\"monospace\", fontsize=10];\n",
    );
    let mut declared = HashSet::new();
    for st in steps {
        s += &format!(
            "  \"j{}\" [shape=box, style=bold, label=\"job {}\\n{}\"];\n",
            st.job_id,
            st.job_id,
            esc(&label(st))
        );
        for (e, is_input) in st
            .inputs
            .iter()
            .map(|e| (e, true))
            .chain(st.outputs.iter().map(|e| (e, false)))
        {
            let n = node(e);
            if declared.insert(n.clone()) {
                let hash = e
                    .hash
                    .as_ref()
                    .map(short_hash)
                    .unwrap_or_else(|| "?".into());
                s += &format!(
                    "  \"{n}\" [shape=note, label=\"{}\\n{hash}\"];\n",
                    esc(&rel(&e.path, root))
                );
            }
            if is_input {
                s += &format!("  \"{n}\" -> \"j{}\";\n", st.job_id);
            } else {
                s += &format!("  \"j{}\" -> \"{n}\";\n", st.job_id);
            }
        }
    }
    s += "}\n";
    s
}

pub fn dag(as_dot: bool, svg: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    let (project, store) = open()?;
    let dag = store.dag()?;
    if json {
        return fmt::print_json(&dag);
    }
    if let Some(svg) = svg {
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
            .write_all(dot(&dag.steps, &project.root).as_bytes())?;
        let status = child.wait()?;
        anyhow::ensure!(status.success(), "graphviz `dot` failed ({status})");
        println!("wrote {}", svg.display());
        return Ok(());
    }
    if as_dot {
        print!("{}", dot(&dag.steps, &project.root));
        return Ok(());
    }
    if dag.steps.is_empty() {
        println!("no jobs recorded yet; try `roar run -- CMD`");
        return Ok(());
    }
    print_steps(&mut std::io::stdout().lock(), &dag.steps, &project.root)?;
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
    // Remembering these makes the next status or reproduce cheap.
    if !batch.new_cache.is_empty() {
        if let Some(Ok(w)) = store
            .conn()
            .path()
            .map(|p| roar_store::Writer::start(Path::new(p)))
        {
            let _ = w.cache(batch.new_cache);
        }
    }
    out
}

#[derive(Serialize)]
struct StatusLine {
    path: String,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

pub fn status(json: bool) -> anyhow::Result<()> {
    let (project, store) = open()?;
    let config = crate::config::Config::load(&project)?;
    // Only the project's own files: inputs elsewhere (/etc, other trees) are not its status.
    let tracked: Vec<_> = store
        .tracked_files()?
        .into_iter()
        .filter(|(p, _, _)| Path::new(p).starts_with(&project.root))
        .collect();
    let paths: Vec<PathBuf> = tracked.iter().map(|(p, _, _)| PathBuf::from(p)).collect();
    let now = current_hashes(&store, &paths, false);
    let mut lines = Vec::new();
    let mut changed: HashSet<String> = HashSet::new();
    for ((path, recorded, _role), p) in tracked.iter().zip(&paths) {
        let state = match (recorded, now.get(p)) {
            (_, None) if !p.exists() => "deleted",
            (Some(r), Some(h)) if r.blake3 != h.blake3 => "modified",
            _ => continue,
        };
        changed.insert(path.clone());
        lines.push(StatusLine {
            path: rel_exact(path, &project.root),
            state,
            detail: None,
        });
    }
    // Outputs whose producing job read content that is no longer there.
    let dag = store.dag()?;
    let mut latest_maker: BTreeMap<&str, &Step> = BTreeMap::new();
    for s in &dag.steps {
        for o in &s.outputs {
            latest_maker.insert(o.path.as_str(), s);
        }
    }
    let current: HashMap<&str, &ContentHash> = tracked
        .iter()
        .zip(&paths)
        .filter_map(|((path, _, _), p)| now.get(p).map(|h| (path.as_str(), h)))
        .collect();
    for (out, step) in &latest_maker {
        if changed.contains(*out) || !Path::new(out).exists() {
            continue;
        }
        let stale = step.inputs.iter().find(|i| {
            // An object's current content is the last one recorded for it (roar cannot look
            // into the bucket without a client's credentials).
            if i.path.starts_with("s3://") {
                let last = store.artifact_at(Path::new(&i.path)).ok();
                return matches!((&i.hash, last), (Some(r), Some(h)) if r.blake3 != h.blake3);
            }
            match (&i.hash, current.get(i.path.as_str())) {
                (Some(r), Some(h)) => r.blake3 != h.blake3,
                (Some(_), None) => true,
                _ => false,
            }
        });
        if let Some(i) = stale {
            lines.push(StatusLine {
                path: rel_exact(out, &project.root),
                state: "stale",
                detail: Some(format!(
                    "input {} changed since job {}",
                    rel_exact(&i.path, &project.root),
                    step.job_id
                )),
            });
        }
    }
    // Files in the tree that no job ever touched.
    let known: HashSet<&str> = tracked.iter().map(|(p, _, _)| p.as_str()).collect();
    let ignore = roar_tracer::ignore::Ignore::new(&config.ignore);
    let mut untracked = Vec::new();
    walk(&project.root, &ignore, &mut untracked)?;
    for p in untracked {
        let s = p.to_string_lossy();
        if !known.contains(s.as_ref()) {
            lines.push(StatusLine {
                path: rel_exact(&s, &project.root),
                state: "untracked",
                detail: None,
            });
        }
    }
    if json {
        return fmt::print_json(&lines);
    }
    let mut out = std::io::stdout().lock();
    for l in &lines {
        let detail = l
            .detail
            .as_deref()
            .map(|d| format!("  ({})", fmt::shown(d)))
            .unwrap_or_default();
        writeln!(
            out,
            "{:<10} {}{detail}",
            format!("{}:", l.state),
            fmt::shown(&l.path)
        )?;
    }
    if lines.is_empty() {
        writeln!(out, "everything matches what roar recorded")?;
    }
    Ok(())
}

fn walk(
    dir: &Path,
    ignore: &roar_tracer::ignore::Ignore,
    out: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries {
        let e = e?;
        let path = e.path();
        let name = e.file_name();
        if name == ".roar" || name == ".git" || ignore.is_ignored(&path) {
            continue;
        }
        let ty = e.file_type()?;
        if ty.is_dir() {
            walk(&path, ignore, out)?;
        } else if ty.is_file() {
            out.push(path);
        }
    }
    Ok(())
}
