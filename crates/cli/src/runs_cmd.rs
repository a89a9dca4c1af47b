//! `roar runs`: the jobs of one name (its `--name`, else its script's: `python train.py` is
//! `train`) as rows, their parameters (argv and parameter files) and metrics (the metrics files
//! they wrote) as columns — the table ML users compare runs in (`dvc exp show`, MLflow's runs).

use std::collections::BTreeMap;
use std::io::Write;

use roar_store::Role;
use serde::Serialize;

use crate::fmt::{self, bold};

#[derive(Serialize)]
pub struct Run {
    job: i64,
    name: Option<String>,
    started_ns: i64,
    status: String,
    params: BTreeMap<String, String>,
    metrics: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
}

/// `roar runs [NAME] [--sort KEY]`: newest first, or by KEY (a parameter or metric, whole or
/// after its file's `FILE:`; numbers as numbers, descending).
pub fn runs(
    name: Option<&str>,
    sort: Option<&str>,
    limit: usize,
    labels: &[String],
    json: bool,
) -> anyhow::Result<()> {
    let (_, store) = crate::names::open()?;
    let objects = crate::values::objects_here();
    let rows = rows(&store, objects.as_ref(), name, sort, limit, labels)?;
    if json {
        return fmt::print_json(&rows);
    }
    print_table(&rows)
}

/// The runs of `name` (all jobs when None) with label filters (`KEY=VALUE`, or `KEY` for any
/// value: every one must hold), newest first or by `sort`; at most `limit` (0: all). What
/// `roar runs` prints and `roar ui` shows.
pub fn rows(
    store: &roar_store::Store,
    objects: Option<&roar_store::objects::Objects>,
    name: Option<&str>,
    sort: Option<&str>,
    limit: usize,
    labels: &[String],
) -> anyhow::Result<Vec<Run>> {
    let wanted: Vec<(String, Option<String>)> = labels
        .iter()
        .map(|l| match l.split_once('=') {
            Some((k, v)) => crate::labels::check_key(k).map(|_| (k.to_owned(), Some(v.to_owned()))),
            None => crate::labels::check_key(l).map(|_| (l.clone(), None)),
        })
        .collect::<anyhow::Result<_>>()?;
    let mut rows = Vec::new();
    for j in store.jobs(usize::MAX)? {
        if j.status == "failed_to_start" {
            continue;
        }
        let job_name = roar_env::params::run_name(j.name.as_deref(), &j.argv);
        if name.is_some_and(|n| job_name.as_deref() != Some(n)) {
            continue;
        }
        let detail = store.job(j.id)?;
        let labelled = wanted.iter().all(|(k, v)| match (detail.labels.get(k), v) {
            (Some(have), Some(want)) => have == want,
            (have, None) => have.is_some(),
            (None, Some(_)) => false,
        });
        if !labelled {
            continue;
        }
        let mut params: BTreeMap<String, String> =
            crate::values::of_files(&detail, Role::Input, objects)
                .into_iter()
                .map(|p| (p.name, p.value))
                .collect();
        params.extend(
            roar_env::params::of_argv(&j.argv)
                .into_iter()
                .filter(|p| !p.name.starts_with('#'))
                .map(|p| (p.name, p.value)),
        );
        let metrics = crate::values::of_files(&detail, Role::Output, objects)
            .into_iter()
            .map(|p| (p.name, p.value))
            .collect();
        rows.push(Run {
            job: j.id,
            name: job_name,
            started_ns: j.started_ns,
            status: fmt::status(&j.status, j.exit_code, j.signal),
            params,
            metrics,
            labels: detail.labels,
        });
        if limit > 0 && rows.len() == limit && sort.is_none() {
            break;
        }
    }
    if let Some(key) = sort {
        // `acc` names `metrics.json:acc` too.
        let value = |r: &Run| find(&r.metrics, key).or_else(|| find(&r.params, key));
        rows.sort_by(|a, b| compare_values(value(b), value(a)));
    }
    if limit > 0 {
        rows.truncate(limit);
    }
    Ok(rows)
}

/// The runs of job `id`'s name (its `--name`, else its default name), for the page: None when
/// the job has no name of either kind.
pub fn runs_of_job(
    store: &roar_store::Store,
    objects: Option<&roar_store::objects::Objects>,
    id: i64,
) -> anyhow::Result<Option<(String, Vec<Run>)>> {
    let job = store.job(id)?;
    let Some(name) = roar_env::params::run_name(job.summary.name.as_deref(), &job.summary.argv)
    else {
        return Ok(None);
    };
    let rows = rows(store, objects, Some(&name), None, 0, &[])?;
    Ok(Some((name, rows)))
}

/// The value of `key` in `m`: by its whole name, or by the part after its file's `FILE:`.
fn find(m: &BTreeMap<String, String>, key: &str) -> Option<String> {
    m.get(key)
        .or_else(|| {
            m.iter()
                .find(|(k, _)| k.rsplit_once(':').is_some_and(|(_, k)| k == key))
                .map(|(_, v)| v)
        })
        .cloned()
}

/// Numbers as numbers, then text; a run without the key last.
fn compare_values(a: Option<String>, b: Option<String>) -> std::cmp::Ordering {
    let num = |s: &Option<String>| s.as_deref().and_then(|s| s.parse::<f64>().ok());
    match (num(&a), num(&b)) {
        (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal),
        _ => match (&a, &b) {
            (Some(_), None) => std::cmp::Ordering::Greater,
            (None, Some(_)) => std::cmp::Ordering::Less,
            _ => a.cmp(&b),
        },
    }
}

fn print_table(rows: &[Run]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if rows.is_empty() {
        writeln!(out, "no runs")?;
        return Ok(());
    }
    let keys = |f: fn(&Run) -> &BTreeMap<String, String>| -> Vec<String> {
        let mut k: Vec<String> = rows.iter().flat_map(|r| f(r).keys().cloned()).collect();
        k.sort();
        k.dedup();
        k
    };
    let (pk, mk) = (keys(|r| &r.params), keys(|r| &r.metrics));
    let with_labels = rows.iter().any(|r| !r.labels.is_empty());
    let mut header = vec!["job".to_owned(), "name".to_owned(), "status".to_owned()];
    header.extend(with_labels.then(|| "labels".to_owned()));
    header.extend(pk.iter().cloned());
    header.extend(mk.iter().cloned());
    let mut table = vec![header];
    for r in rows {
        let mut line = vec![
            format!("#{}", r.job),
            r.name.clone().unwrap_or_default(),
            r.status.clone(),
        ];
        line.extend(with_labels.then(|| {
            let l: Vec<String> = r.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            if l.is_empty() {
                "-".to_owned()
            } else {
                l.join(",")
            }
        }));
        line.extend(
            pk.iter()
                .map(|k| r.params.get(k).cloned().unwrap_or_else(|| "-".into())),
        );
        line.extend(
            mk.iter()
                .map(|k| r.metrics.get(k).cloned().unwrap_or_else(|| "-".into())),
        );
        table.push(
            line.into_iter()
                .map(|c| fmt::shown(&c).into_owned())
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..table[0].len())
        .map(|c| {
            table
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (i, line) in table.iter().enumerate() {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let text = cells.join("  ");
        if i == 0 {
            writeln!(out, "{}", bold(text.trim_end()))?;
        } else {
            writeln!(out, "{}", text.trim_end())?;
        }
    }
    Ok(())
}
