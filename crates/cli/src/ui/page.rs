//! The page of `roar ui` and `roar dag --html`: one HTML file with its script and style inlined
//! (compiled into the binary: nothing is fetched at build or view time), and the data it shows.
//!
//! The page reads the same JSON the commands print: `roar dag --json` for the graph, `roar show
//! JOB --json` for a job's details, `roar status --json` for what is stale or modified, `roar diff
//! A B --json` for two jobs side by side. Served, it fetches them from `roar ui`; written to a
//! file, they are embedded in it.

use std::collections::BTreeMap;
use std::path::Path;

use roar_store::{Project, Store, Version};
use serde::Serialize;

const TEMPLATE: &str = include_str!("index.html");
const STYLE: &str = include_str!("app.css");
const SCRIPT: &str = include_str!("app.js");

/// A file written by `roar dag --html` embeds a ranked diff for every pair of its jobs up to this
/// many jobs; past it, only for reruns (jobs of the same stable name).
const DIFF_ALL_PAIRS_UP_TO: usize = 30;

/// What the page is told before it reads any data.
#[derive(Serialize)]
pub struct Config<'a> {
    /// `server` (fetch from roar ui, live) or `file` (everything embedded).
    pub mode: &'static str,
    /// The project root: paths below it are shown relative.
    pub root: &'a str,
    /// Directories with this many files of one role of one job start collapsed (as in `roar dag`).
    pub collapse_at: usize,
    /// When the embedded data was read (file mode), in ns since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generated_ns: Option<i64>,
}

/// Everything a self-contained page shows, read once.
#[derive(Serialize)]
pub struct Embedded {
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

/// JSON inside `<script type="application/json">`: `<` escaped so no string can close the tag.
fn script_json<T: Serialize>(value: &T) -> anyhow::Result<String> {
    Ok(roar_store::quote::json_string(value).replace('<', "\\u003c"))
}

/// What the page may load. A written file may not connect anywhere at all.
const CSP_SERVED: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'";
const CSP_FILE: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'";

pub fn csp(config: &Config) -> &'static str {
    if config.mode == "file" {
        CSP_FILE
    } else {
        CSP_SERVED
    }
}

/// The template with its `{{MARKERS}}` filled in one pass: nothing inserted is searched again, so
/// a recorded path that spells a marker stays a path.
pub fn html(config: &Config, data: Option<&Embedded>) -> anyhow::Result<String> {
    let data = match data {
        Some(d) => script_json(d)?,
        None => "null".into(),
    };
    let config_json = script_json(config)?;
    let fill = |marker: &str| -> &str {
        match marker {
            "CSP" => csp(config),
            "STYLE" => STYLE,
            "CONFIG" => &config_json,
            "DATA" => &data,
            "SCRIPT" => SCRIPT,
            _ => unreachable!("unknown marker {{{{{marker}}}}} in index.html"),
        }
    };
    let mut out = String::with_capacity(TEMPLATE.len() + STYLE.len() + SCRIPT.len() + data.len());
    let mut rest = TEMPLATE;
    while let Some(start) = rest.find("{{") {
        let end = start
            + rest[start..]
                .find("}}")
                .expect("markers in index.html are closed");
        out.push_str(&rest[..start]);
        out.push_str(fill(&rest[start + 2..end]));
        rest = &rest[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The data of `roar dag --html`: the graph (or TARGET's subgraph), the status of the tree, every
/// job's details, and the diffs of the pairs of jobs people compare.
pub fn embed(
    project: &Project,
    store: &Store,
    target: Option<&Version>,
) -> anyhow::Result<Embedded> {
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
    )?;
    std::fs::write(out, page)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", out.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mode: &'static str, root: &str) -> String {
        html(
            &Config {
                mode,
                root,
                collapse_at: 6,
                generated_ns: None,
            },
            None,
        )
        .unwrap()
    }

    #[test]
    fn every_marker_is_filled_once_and_inserted_text_is_not_searched() {
        // A recorded path may spell a marker: it stays what it is.
        let page = config("server", "/p/{{SCRIPT}}/</script>");
        assert!(!page.contains("{{CSP}}") && !page.contains("{{STYLE}}"));
        assert_eq!(page.matches(SCRIPT).count(), 1);
        assert!(page.contains("/p/{{SCRIPT}}/\\u003c/script>"));
        assert_eq!(page.matches("</script>").count(), 3);
    }

    #[test]
    fn a_written_file_may_not_connect() {
        assert!(config("file", "/p").contains(CSP_FILE));
        assert!(
            !CSP_FILE.contains("connect-src"),
            "default-src 'none' covers it"
        );
        assert!(config("server", "/p").contains("connect-src 'self'"));
    }
}
