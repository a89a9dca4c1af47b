//! The data a page written by `roar dag --html FILE` carries (`roar_ui::page` is the page): the
//! graph, the status of the tree, every job's details, the diffs of the pairs of jobs people
//! compare, and the runs of each job name run more than once; each the JSON its command prints.

use std::collections::BTreeMap;
use std::path::Path;

use roar_store::{Project, Store, Version};
use roar_ui::page::{html, Config};
use serde::Serialize;

/// A file written by `roar dag --html` embeds a ranked diff for every pair of its jobs up to this
/// many jobs; past it, only for reruns (jobs of the same stable name).
const DIFF_ALL_PAIRS_UP_TO: usize = 30;

/// Everything a self-contained page shows, read once.
#[derive(Serialize)]
struct Embedded {
    pub dag: roar_store::Dag,
    /// None when the tree could not be compared with the record.
    pub status: Option<crate::status_cmd::Report>,
    /// `roar show ID --json` of every job in the graph.
    pub jobs: BTreeMap<i64, roar_store::JobDetail>,
    /// `roar diff A B --json` keyed `"A-B"` (A < B).
    pub diffs: BTreeMap<String, crate::diff_cmd::Diff>,
    /// `roar runs NAME --json` of each job name with more than one run, and each job's name.
    pub runs: BTreeMap<String, Vec<crate::runs_cmd::Run>>,
    pub run_of: BTreeMap<i64, String>,
}

/// The data of `roar dag --html`: the graph (or TARGET's subgraph), the status of the tree, every
/// job's details, and the diffs of the pairs of jobs people compare.
fn embed(project: &Project, store: &Store, target: Option<&Version>) -> anyhow::Result<Embedded> {
    let dag = match target {
        Some(t) => store.dag(Some(t))?,
        None => crate::graph::project_dag(store)?,
    };
    let mut jobs = BTreeMap::new();
    for s in &dag.steps {
        jobs.insert(s.job_id, store.job(s.job_id)?);
    }
    let status = crate::status_cmd::report(project, store)
        .map_err(|e| eprintln!("roar: the page has no status marks: {e:#}"))
        .ok();
    // Reruns of one command share a stable name (its argv without parameter values).
    let names: BTreeMap<i64, Vec<String>> = jobs
        .iter()
        .map(|(id, j)| (*id, roar_env::params::stable_name(&j.summary.argv)))
        .collect();
    let all_pairs = jobs.len() <= DIFF_ALL_PAIRS_UP_TO;
    let details: Vec<(&i64, &roar_store::JobDetail)> = jobs.iter().collect();
    let mut diffs = BTreeMap::new();
    for (i, (a, ja)) in details.iter().enumerate() {
        for (b, jb) in &details[i + 1..] {
            if all_pairs || names[*a] == names[*b] {
                diffs.insert(format!("{a}-{b}"), crate::diff_cmd::compare_jobs(ja, jb));
            }
        }
    }
    let mut run_of = BTreeMap::new();
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for (id, j) in &jobs {
        if let Some(n) = roar_env::params::run_name(j.summary.name.as_deref(), &j.summary.argv) {
            *count.entry(n.clone()).or_default() += 1;
            run_of.insert(*id, n);
        }
    }
    let objects = project.objects();
    let mut runs = BTreeMap::new();
    for (name, _) in count.into_iter().filter(|(_, n)| *n > 1) {
        let rows = crate::runs_cmd::rows(store, Some(&objects), Some(&name), None, 0, &[])?;
        runs.insert(name, rows);
    }
    run_of.retain(|_, n| runs.contains_key(n));
    Ok(Embedded {
        dag,
        status,
        jobs,
        diffs,
        runs,
        run_of,
    })
}

pub fn write(
    project: &Project,
    store: &Store,
    target: Option<&Version>,
    out: &Path,
) -> anyhow::Result<()> {
    let data = embed(project, store, target)?;
    let root = project.root.to_string_lossy();
    let page = html(
        &Config {
            mode: "file",
            root: &root,
            collapse_at: crate::graph::COLLAPSE_AT,
            generated_ns: Some(roar_store::now_ns()),
        },
        Some(&data),
    );
    std::fs::write(out, page)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", out.display()))?;
    Ok(())
}
