//! Labels on jobs: `roar label REF key=value... [--rm key]`, `roar run --label key=value`, shown
//! by `roar show`, listed and filtered by `roar runs --label`, searchable in `roar ui`. They are
//! what people say about a job (`baseline=true`, `ticket=ML-42`), never what was observed, so
//! they can be set and removed at any time. roar's own live under `roar.` (`roar.rerun_of`).

use std::collections::BTreeMap;
use std::ffi::OsString;

use roar_store::redact::Policy;
use roar_store::{Project, Store};

use crate::fmt;

/// `key=value`: a key of letters, digits and `_ . - /`, then any value (it may be empty).
pub fn parse(s: &str) -> anyhow::Result<(String, String)> {
    let Some((k, v)) = s.split_once('=') else {
        anyhow::bail!(
            "label {} has no `=`: give KEY=VALUE (e.g. baseline=true)",
            fmt::shown(s)
        );
    };
    check_key(k)?;
    Ok((k.to_owned(), v.to_owned()))
}

pub fn check_key(k: &str) -> anyhow::Result<()> {
    let ok = !k.is_empty()
        && k.len() <= 128
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/'));
    anyhow::ensure!(
        ok,
        "label key {} is not one: use letters, digits and _ . - / (at most 128)",
        fmt::shown(k)
    );
    Ok(())
}

/// Every `KEY=VALUE` of `labels`, checked before anything is written.
pub fn parse_all(labels: &[String]) -> anyhow::Result<Vec<(String, Option<String>)>> {
    labels
        .iter()
        .map(|l| parse(l).map(|(k, v)| (k, Some(v))))
        .collect()
}

/// Sets (`Some`) or removes (`None`) labels of job `id`. A value passes the store's redaction as an
/// environment variable of the label's name would: a label is no way around it
/// (`api_token=ghp_...` is stored `<redacted>`).
pub fn apply(
    project: &Project,
    store: &Store,
    id: i64,
    changes: Vec<(String, Option<String>)>,
) -> anyhow::Result<()> {
    let mut values: BTreeMap<String, String> = changes
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
        .collect();
    Policy::for_config(&project.config_path()).env(&mut values);
    let changes: Vec<(String, Option<String>)> = changes
        .into_iter()
        .map(|(k, v)| {
            let v = v.map(|given| values.get(&k).cloned().unwrap_or(given));
            (k, v)
        })
        .collect();
    store.set_labels(id, &changes)?;
    Ok(())
}

/// `roar label REF [KEY=VALUE...] [--rm KEY...]`; with neither, lists the job's labels.
pub fn label(what: &OsString, set: &[String], rm: &[String], json: bool) -> anyhow::Result<()> {
    let project = crate::project()?;
    let store = Store::open(&project.db_path())?;
    let cwd = std::env::current_dir()?;
    let id = crate::names::job_ref(&store, what, &cwd, "")?;
    let mut changes = parse_all(set)?;
    for k in rm {
        check_key(k)?;
        changes.push((k.clone(), None));
    }
    if !changes.is_empty() {
        apply(&project, &store, id, changes)?;
    }
    let labels = store.labels(id)?;
    if json {
        return fmt::print_json(&serde_json::json!({ "job": id, "labels": labels }));
    }
    if labels.is_empty() {
        println!("job {id} has no labels");
    }
    for (k, v) in &labels {
        println!("{}={}", fmt::shown(k), fmt::shown(v));
    }
    Ok(())
}
