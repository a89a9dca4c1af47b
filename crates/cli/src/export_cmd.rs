//! `roar export`: the recorded graph in the two standard lineage formats.
//!
//! - W3C PROV-JSON: one document; artifacts are entities named by content (`b3:<blake3>`), jobs
//!   (or each step of a job that has steps) are activities, with `used`, `wasGeneratedBy`,
//!   `wasDerivedFrom` (every output of an activity derives from each of its inputs) and
//!   `wasInformedBy` (an activity used what another generated).
//! - OpenLineage: newline-delimited run events, a START and a COMPLETE/FAIL per job or step (a
//!   step is a child run: its `parent` facet names its parent step's run, the root step's run
//!   being the job's), the form
//!   OpenLineage's file transport writes and its HTTP endpoint accepts one line at a time. Files
//!   are datasets in namespace `file://HOST` named by absolute path, S3 objects in `s3://BUCKET`
//!   named by key; the content hash is the standard `datasetVersion` facet.
//!
//! The mapping is spelled out in docs/EXPORT.md; tests validate both against the published
//! schema (PROV-JSON) and OpenLineage's own client model.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Write;

use roar_store::{shell_join, Edge, Project, Step};
use serde_json::{json, Map, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// W3C PROV-JSON document.
    ProvJson,
    /// OpenLineage run events, one JSON object per line.
    Openlineage,
}

const PRODUCER: &str = concat!("urn:roar:", env!("CARGO_PKG_VERSION"));

pub fn export(what: Option<&OsStr>, format: Format) -> anyhow::Result<()> {
    let (project, store) = crate::names::open()?;
    let steps = match what {
        Some(what) => {
            let target = crate::names::resolve(&store, what)?;
            store.lineage(&target)?.steps
        }
        None => store.dag(None)?.steps,
    };
    let envs = environments(&store, &steps)?;
    let mut out = std::io::stdout().lock();
    match format {
        Format::ProvJson => {
            roar_store::quote::write_json(&mut out, &prov_json(&project, &steps, &envs), false)
                .map_err(std::io::Error::from)?;
            writeln!(out)?;
        }
        Format::Openlineage => {
            for event in openlineage(&project, &steps, &envs) {
                roar_store::quote::write_json(&mut out, &event, false)
                    .map_err(std::io::Error::from)?;
                writeln!(out)?;
            }
        }
    }
    Ok(())
}

/// What an export says of a job's environment besides its Step.
struct JobEnv {
    /// When the job started (a step's node carries the step's start).
    started_ns: i64,
    /// The job's global identity: its runs have the same ids wherever it is exported from.
    uid: Option<String>,
    /// The job's OpenLineage job name (its steps' runs are children of its run).
    name: String,
    params: Vec<roar_env::params::Param>,
    git: Option<roar_store::GitState>,
    env: roar_store::EnvironmentDetail,
}

fn environments(
    store: &roar_store::Store,
    steps: &[Step],
) -> anyhow::Result<BTreeMap<i64, JobEnv>> {
    let mut out = BTreeMap::new();
    for s in steps {
        let job = store.job(s.job_id)?;
        out.insert(
            s.job_id,
            JobEnv {
                started_ns: job.summary.started_ns,
                uid: job.summary.uid.clone(),
                name: job
                    .summary
                    .name
                    .clone()
                    .unwrap_or_else(|| job_name(&job.summary.argv)),
                params: roar_env::params::of_argv(&job.summary.argv),
                git: job.summary.git,
                env: job.environment,
            },
        );
    }
    Ok(out)
}

/// A job's OpenLineage name from its argv: the command without its parameters (a job keeps its
/// name when only its parameters change: they are a run facet).
fn job_name(argv: &[String]) -> String {
    let stable: Vec<std::ffi::OsString> = roar_env::params::stable_name(argv)
        .into_iter()
        .map(Into::into)
        .collect();
    shell_join(&stable)
}

/// A package as one string: `python:numpy==2.4.6`.
fn package_id(p: &roar_store::Package) -> String {
    format!("{}:{}=={}", p.kind, p.name, p.version)
}

/// RFC 3339 UTC with nanoseconds, as both formats want for times.
fn rfc3339(ns: i64) -> String {
    let (date_time, frac) = (crate::fmt::time_ns(ns), ns.rem_euclid(1_000_000_000));
    format!("{}T{}.{frac:09}Z", &date_time[..10], &date_time[11..])
}

/// A short, stable identifier of this project, so ids from two stores do not collide.
fn project_tag(project: &Project) -> String {
    use std::os::unix::ffi::OsStrExt;
    blake3::hash(project.root.as_os_str().as_bytes()).to_hex()[..16].to_owned()
}

/// The host a job ran on, for `file://HOST` dataset namespaces.
fn host(step: &Step) -> &str {
    step.host.as_deref().unwrap_or("localhost")
}

/// The PROV id of a job, or of one of its steps.
fn activity_id(job: i64, step: Option<u32>) -> String {
    match step {
        Some(seq) => format!("roar:job-{job}-step-{seq}"),
        None => format!("roar:job-{job}"),
    }
}

/// A job's or step's PROV activity: its command, times, outcome and source version, and its
/// job's environment.
fn prov_activity(s: &Step, envs: &BTreeMap<i64, JobEnv>) -> Map<String, Value> {
    let mut a = Map::new();
    a.insert("prov:startTime".into(), json!(rfc3339(s.started_ns)));
    if let Some(end) = s.ended_ns {
        a.insert("prov:endTime".into(), json!(rfc3339(end)));
    }
    match s.step {
        Some(seq) => {
            a.insert("prov:type".into(), json!("roar:Step"));
            a.insert("roar:job".into(), json!(s.job_id));
            a.insert("roar:step".into(), json!(seq));
            if let Some(p) = s.parent_step {
                a.insert(
                    "roar:parentStep".into(),
                    json!(activity_id(s.job_id, Some(p))),
                );
            }
        }
        None => {
            a.insert("prov:type".into(), json!("roar:Job"));
        }
    }
    a.insert("prov:label".into(), json!(shell_join(&s.argv)));
    a.insert(
        "roar:argv".into(),
        json!(s
            .argv
            .iter()
            .map(|x| x.to_string_lossy())
            .collect::<Vec<_>>()),
    );
    a.insert("roar:cwd".into(), json!(s.cwd));
    a.insert("roar:status".into(), json!(s.status));
    if let Some(code) = s.exit_code {
        a.insert("roar:exitCode".into(), json!(code));
    }
    if let Some(name) = &s.name {
        a.insert("roar:name".into(), json!(name));
    }
    if let Some(commit) = &s.git_commit {
        a.insert("roar:gitCommit".into(), json!(commit));
    }
    if let Some(dirty) = s.git_dirty {
        a.insert("roar:gitDirty".into(), json!(dirty));
    }
    if let Some(e) = envs.get(&s.job_id) {
        prov_environment(&mut a, e);
    }
    a
}

/// What a job's environment adds to its activity: the repository, parameters, packages and
/// machine.
fn prov_environment(a: &mut Map<String, Value>, e: &JobEnv) {
    if let Some(remote) = e.git.as_ref().and_then(|g| g.remote.as_ref()) {
        a.insert("roar:gitRemote".into(), json!(remote));
    }
    if let Some(diff) = e.git.as_ref().and_then(|g| g.diff.as_ref()) {
        a.insert("roar:gitDiff".into(), json!(format!("b3:{diff}")));
    }
    if !e.params.is_empty() {
        let p: Vec<String> = e
            .params
            .iter()
            .map(|p| format!("{}={}", p.name, p.value))
            .collect();
        a.insert("roar:parameters".into(), json!(p));
    }
    if !e.env.packages.is_empty() {
        let p: Vec<String> = e.env.packages.iter().map(package_id).collect();
        a.insert("roar:packages".into(), json!(p));
    }
    if let Some(rt) = &e.env.runtime {
        for (k, v) in [
            ("roar:os", rt.os.clone()),
            ("roar:kernel", rt.kernel.clone()),
            ("roar:cpu", rt.cpu_model.clone()),
            ("roar:cpus", Some(rt.cpus.to_string())),
            ("roar:container", rt.container.clone()),
        ] {
            if let Some(v) = v {
                a.insert(k.into(), json!(v));
            }
        }
        let gpus: Vec<String> = rt.gpus.iter().map(|g| g.model.clone()).collect();
        if !gpus.is_empty() {
            a.insert("roar:gpus".into(), json!(gpus));
        }
    }
}

/// The PROV entity of the content an edge names: its hashes and size where it was hashed.
fn content_entity(e: &Edge) -> Value {
    let mut en = Map::new();
    en.insert("prov:type".into(), json!("roar:Content"));
    if let Some(h) = &e.hash {
        en.insert("roar:blake3".into(), json!(h.blake3));
        en.insert("roar:size".into(), json!(h.size));
        if let Some(sha) = &h.sha256 {
            en.insert("roar:sha256".into(), json!(sha));
        }
    }
    Value::Object(en)
}

/// One path as a string, several as a list.
fn one_or_list(mut paths: Vec<String>) -> Value {
    if paths.len() == 1 {
        json!(paths.remove(0))
    } else {
        json!(paths)
    }
}

fn prov_json(project: &Project, steps: &[Step], envs: &BTreeMap<i64, JobEnv>) -> Value {
    let mut entity = Map::new();
    let mut activity = Map::new();
    let mut used = Map::new();
    let mut generated = Map::new();
    let mut derived = Map::new();
    let mut informed = Map::new();
    // Content without a hash (unreadable, changed while read, a step's intermediate state) is
    // still an entity, per path and the job or step that made it (or read it, if none did).
    let entity_id = |node: &str, e: &Edge| match &e.hash {
        Some(h) => format!("b3:{}", h.blake3),
        None => format!(
            "roar:unhashed-{node}-{}",
            blake3::hash(e.path.as_bytes()).to_hex()
        ),
    };
    let mut locations: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in steps {
        let node = roar_store::node_name(s.job_id, s.step);
        let act = activity_id(s.job_id, s.step);
        activity.insert(act.clone(), Value::Object(prov_activity(s, envs)));

        let mut edge_entities = |e: &Edge| {
            let maker = match e.producer {
                Some(j) => roar_store::node_name(j, e.producer_step),
                None => node.clone(),
            };
            let id = entity_id(&maker, e);
            let paths = locations.entry(id.clone()).or_default();
            if !paths.contains(&e.path) {
                paths.push(e.path.clone());
            }
            if !entity.contains_key(&id) {
                entity.insert(id.clone(), content_entity(e));
            }
            id
        };
        let inputs: Vec<String> = s.inputs.iter().map(&mut edge_entities).collect();
        let outputs: Vec<String> = s.outputs.iter().map(&mut edge_entities).collect();
        for (i, (id, e)) in inputs.iter().zip(&s.inputs).enumerate() {
            used.insert(
                format!("roar:use-{node}-{i}"),
                json!({"prov:activity": act, "prov:entity": id, "roar:path": e.path}),
            );
            if let Some(j) = e.producer {
                let by = activity_id(j, e.producer_step);
                informed.insert(
                    format!("roar:inf-{node}-{i}"),
                    json!({"prov:informed": act, "prov:informant": by}),
                );
            }
        }
        for (o, (id, e)) in outputs.iter().zip(&s.outputs).enumerate() {
            let mut g = json!({"prov:activity": act, "prov:entity": id, "roar:path": e.path});
            if let Some(end) = s.ended_ns {
                g["prov:time"] = json!(rfc3339(end));
            }
            generated.insert(format!("roar:gen-{node}-{o}"), g);
            for (i, input) in inputs.iter().enumerate() {
                derived.insert(
                    format!("roar:der-{node}-{o}-{i}"),
                    json!({
                        "prov:generatedEntity": id,
                        "prov:usedEntity": input,
                        "prov:activity": act,
                        "prov:generation": format!("roar:gen-{node}-{o}"),
                        "prov:usage": format!("roar:use-{node}-{i}"),
                    }),
                );
            }
        }
    }
    for (id, paths) in locations {
        if let Some(Value::Object(en)) = entity.get_mut(&id) {
            en.insert("prov:location".into(), one_or_list(paths));
        }
    }
    json!({
        "prefix": {
            "roar": format!("urn:roar:project:{}:", project_tag(project)),
            "b3": "urn:blake3:",
        },
        "entity": entity,
        "activity": activity,
        "used": used,
        "wasGeneratedBy": generated,
        "wasDerivedFrom": derived,
        "wasInformedBy": informed,
    })
}

/// A version-8 UUID (RFC 9562, application-defined) from the job's identity and the step, so
/// exporting the same job twice, or from another store that holds it (the team store), gives the
/// same runIds. The identity is the job's global uid; a job without one (none since schema 10) is
/// named by the project, its id and start. A job's root step is the job's own run.
fn run_id(job: &str, step: Option<u32>) -> String {
    let name = match step.filter(|&s| s != 1) {
        Some(seq) => format!("{job}/{seq}"),
        None => job.to_owned(),
    };
    let h = blake3::hash(name.as_bytes());
    let mut b: [u8; 16] = h.as_bytes()[..16].try_into().expect("16 bytes");
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let x: String = b.iter().map(|v| format!("{v:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &x[..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..]
    )
}

/// What names job `job_id` in its run ids (see [`run_id`]).
fn job_identity(tag: &str, job_id: i64, e: Option<&JobEnv>, started_ns: i64) -> String {
    match e.and_then(|e| e.uid.as_deref()) {
        Some(uid) => format!("uid:{uid}"),
        None => format!("{tag}/{job_id}/{started_ns}"),
    }
}

fn facet(schema: &str, fields: Value) -> Value {
    let mut f = json!({"_producer": PRODUCER, "_schemaURL": schema});
    if let (Value::Object(f), Value::Object(fields)) = (&mut f, fields) {
        f.extend(fields);
    }
    f
}

fn dataset(e: &Edge, host: &str) -> Value {
    let (namespace, name) = match e.path.strip_prefix("s3://") {
        Some(rest) => {
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            (format!("s3://{bucket}"), key.to_owned())
        }
        None => (format!("file://{host}"), e.path.clone()),
    };
    let mut facets = Map::new();
    if let Some(h) = &e.hash {
        facets.insert(
            "version".into(),
            facet(
                "https://openlineage.io/spec/facets/1-0-1/DatasetVersionDatasetFacet.json#/$defs/DatasetVersionDatasetFacet",
                json!({"datasetVersion": format!("blake3:{}", h.blake3)}),
            ),
        );
        let mut content = json!({"blake3": h.blake3, "size": h.size});
        if let Some(sha) = &h.sha256 {
            content["sha256"] = json!(sha);
        }
        facets.insert(
            "roar_content".into(),
            facet("urn:roar:facet:ContentDatasetFacet", content),
        );
    }
    json!({"namespace": namespace, "name": name, "facets": facets})
}

fn openlineage(project: &Project, steps: &[Step], envs: &BTreeMap<i64, JobEnv>) -> Vec<Value> {
    let tag = project_tag(project);
    // Jobs are named within their project.
    let namespace = format!("roar://{}", project.root.display());
    let mut events = Vec::new();
    for s in steps {
        let e = envs.get(&s.job_id);
        let job_started = e.map_or(s.started_ns, |e| e.started_ns);
        let identity = job_identity(&tag, s.job_id, e, job_started);
        let this_run = run_id(&identity, s.step);
        let job = ol_job(s, e, &namespace);
        let run_facets = ol_run_facets(s, e, &identity, &namespace);
        let inputs: Vec<Value> = s.inputs.iter().map(|e| dataset(e, host(s))).collect();
        let outputs: Vec<Value> = s.outputs.iter().map(|e| dataset(e, host(s))).collect();
        events.push(json!({
            "eventType": "START",
            "eventTime": rfc3339(s.started_ns),
            "producer": PRODUCER,
            "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
            "run": {"runId": this_run, "facets": run_facets},
            "job": job,
            "inputs": inputs,
            "outputs": [],
        }));
        let Some(finished) = ol_finished(s) else {
            continue;
        };
        events.push(json!({
            "eventType": finished,
            "eventTime": rfc3339(s.ended_ns.unwrap_or(s.started_ns)),
            "producer": PRODUCER,
            "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
            "run": {"runId": this_run, "facets": run_facets},
            "job": job,
            "inputs": inputs,
            "outputs": outputs,
        }));
    }
    events
}

/// The OpenLineage job a job or step is a run of: its name (the job's name, or its command's)
/// and where its source code is.
fn ol_job(s: &Step, e: Option<&JobEnv>, namespace: &str) -> Value {
    let argv: Vec<String> = s
        .argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut job_facets = json!({
        "jobType": facet(
            "https://openlineage.io/spec/facets/2-0-4/JobTypeJobFacet.json#/$defs/JobTypeJobFacet",
            json!({"processingType": "BATCH", "integration": "ROAR", "jobType": "COMMAND"}),
        ),
    });
    if let Some(g) = e.and_then(|e| e.git.as_ref()) {
        if let Some(url) = &g.remote {
            let mut f = json!({"type": "git", "url": url, "repoUrl": url});
            if let Some(c) = &g.commit {
                f["version"] = json!(c);
            }
            if let Some(b) = &g.branch {
                f["branch"] = json!(b);
            }
            job_facets["sourceCodeLocation"] = facet(
                "https://openlineage.io/spec/facets/1-1-0/SourceCodeLocationJobFacet.json#/$defs/SourceCodeLocationJobFacet",
                f,
            );
        }
    }
    let name = match (&s.name, s.step) {
        (Some(n), None | Some(1)) => n.clone(),
        (Some(n), Some(_)) => format!("{n}/{}", job_name(&argv)),
        (None, _) => job_name(&argv),
    };
    json!({
        "namespace": namespace,
        "name": name,
        "facets": job_facets,
    })
}

/// The facets of a job's or step's run: roar's own (command, outcome, source version), the
/// parent run of a step, the parameters and the environment.
fn ol_run_facets(s: &Step, e: Option<&JobEnv>, identity: &str, namespace: &str) -> Value {
    let mut roar = json!({
        "jobId": s.job_id,
        "argv": s.argv.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>(),
        "cwd": s.cwd,
        "status": s.status,
    });
    if let Some(code) = s.exit_code {
        roar["exitCode"] = json!(code);
    }
    if let Some(commit) = &s.git_commit {
        roar["gitCommit"] = json!(commit);
    }
    if let Some(dirty) = s.git_dirty {
        roar["gitDirty"] = json!(dirty);
    }
    let mut run_facets = json!({
        "processing_engine": facet(
            "https://openlineage.io/spec/facets/1-1-1/ProcessingEngineRunFacet.json#/$defs/ProcessingEngineRunFacet",
            json!({"version": env!("CARGO_PKG_VERSION"), "name": "roar"}),
        ),
        "roar": facet("urn:roar:facet:JobRunFacet", roar),
    });
    if let (Some(seq), Some(e)) = (s.step.filter(|&q| q != 1), e) {
        // A step is a child run of its job's run (the root step's); where it sits in the
        // step tree is in the roar facet.
        run_facets["parent"] = facet(
            "https://openlineage.io/spec/facets/1-2-0/ParentRunFacet.json#/$defs/ParentRunFacet",
            json!({
                "run": {"runId": run_id(identity, None), "facets": {}},
                "job": {"namespace": namespace, "name": e.name, "facets": {}},
            }),
        );
        run_facets["roar"]["step"] = json!(seq);
        if let Some(p) = s.parent_step {
            run_facets["roar"]["parentStep"] = json!(p);
        }
    }
    let Some(e) = e else {
        return run_facets;
    };
    if !e.params.is_empty() {
        let params: Map<String, Value> = e
            .params
            .iter()
            .map(|p| (p.name.clone(), json!(p.value)))
            .collect();
        run_facets["parameters"] = facet(
            "urn:roar:facet:ParametersRunFacet",
            json!({ "parameters": params }),
        );
    }
    if !e.env.packages.is_empty() || e.env.runtime.is_some() {
        run_facets["environment"] = facet(
            "urn:roar:facet:EnvironmentRunFacet",
            json!({"packages": e.env.packages, "runtime": e.env.runtime}),
        );
    }
    if let Some(d) = e.git.as_ref().and_then(|g| g.diff.as_ref()) {
        run_facets["roar"]["gitDiff"] = json!(format!("b3:{d}"));
    }
    run_facets
}

/// The event type that closes a run, `None` while it runs.
fn ol_finished(s: &Step) -> Option<&'static str> {
    Some(match s.status.as_str() {
        "running" => return None,
        "exited" if s.exit_code == Some(0) => "COMPLETE",
        // Only the job's (root step's) exit status is observed: a step inside a job that
        // exited is taken to have completed.
        "exited" if s.step.is_some_and(|q| q != 1) => "COMPLETE",
        // A job the mount saw end without an observable exit status.
        "ended" => "COMPLETE",
        // Its recorder died; rebuilt from the journal, the run's end is not known.
        "killed" => "ABORT",
        _ => "FAIL",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_keeps_nanoseconds() {
        assert_eq!(
            rfc3339(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123456789Z"
        );
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000000Z");
    }

    #[test]
    fn run_ids_are_version_8_uuids_and_stable() {
        let id = run_id("uid:0123", None);
        assert_eq!(id, run_id("uid:0123", None));
        assert_eq!(
            id,
            run_id("uid:0123", Some(1)),
            "the root step is the job's run"
        );
        assert_ne!(id, run_id("uid:0123", Some(2)));
        assert_ne!(id, run_id("uid:0124", None));
        assert_eq!(&id[14..15], "8", "version 8");
        assert!(
            matches!(&id[19..20], "8" | "9" | "a" | "b"),
            "RFC 9562 variant"
        );
    }
}
