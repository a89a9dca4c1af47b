//! `roar lineage`, `roar inputs` and `roar dag`: answers built on the recorded graph of jobs and
//! file versions (rendering in `graph.rs`, `roar status` in `status_cmd.rs`).

use std::ffi::OsStr;
use std::io::Write;
use std::path::PathBuf;

use roar_store::{Outputs, Step};

use crate::fmt::{self, bold, rel};
use crate::graph::{self, Expand};
use crate::names::{open_with, resolve};

pub fn lineage(what: &OsStr, all: bool, expand: &Expand, json: bool) -> anyhow::Result<()> {
    let (project, store) = open_with(all)?;
    let target = resolve(&store, what)?;
    // A listing collapses every directory of many outputs: those are counted, not read (at a
    // team store's scale they are most of a lineage's rows). `--json` has everything.
    let outputs = match json || !expand.collapses_all() {
        true => Outputs::Every,
        false => Outputs::Collapsed {
            at: graph::COLLAPSE_AT,
        },
    };
    let lineage = store.lineage_with(&target, outputs)?;
    if json {
        return fmt::print_json(&lineage);
    }
    // Buffered: a team's lineage is a thousand lines, each a write of its own to a locked
    // stdout otherwise.
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    writeln!(
        out,
        "{} {}  {}",
        bold("lineage of"),
        fmt::shown(&what.to_string_lossy()),
        target.hash.blake3
    )?;
    if lineage.steps.is_empty() {
        writeln!(out, "no recorded job made this content: it is a root input")?;
        out.flush()?;
        return Ok(());
    }
    graph::print_steps(&mut out, &lineage.steps, expand, &project.root)?;
    writeln!(out, "{} ({})", bold("root inputs"), lineage.roots.len())?;
    for r in &lineage.roots {
        graph::print_edge(&mut out, "  ", r, &project.root)?;
    }
    out.flush()?;
    Ok(())
}

pub fn inputs(what: &OsStr, all: bool, json: bool) -> anyhow::Result<()> {
    let (project, store) = open_with(all)?;
    let target = resolve(&store, what)?;
    // Only the root inputs are asked: no output is listed.
    let lineage = store.lineage_with(&target, Outputs::Collapsed { at: 0 })?;
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
        crate::page_data::write(&project, &store, target.as_ref(), out)?;
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
