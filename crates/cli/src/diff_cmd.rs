//! `roar diff A B`: what differs between the provenance of two jobs or two artifacts.
//!
//! An artifact stands for the job that produced it. Compared, most likely cause first: the
//! parameters in argv (`lr: 0.1 -> 0.01`), argv itself, working directory, code (git commit, dirty
//! state and diff), package versions, the machine, environment variables, the direct inputs and
//! outputs by path, and for artifacts also the root inputs of their whole lineage, where a changed
//! dataset many steps up shows; when both jobs have steps, the steps that differ
//! (`diff_steps.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::Write;
use std::path::Path;

use roar_env::params::{self, ParamChange};
use roar_store::{ContentHash, JobDetail, Role, Store, Version};
use serde::Serialize;

pub(crate) use crate::changes::{compare, Change, FileChange};
use crate::diff_steps::{compare_steps, StepChange};
use crate::fmt::{self, bold, rel, short_hash};
use crate::names::{classify_in, Target};

/// One side of the comparison.
struct Side {
    label: String,
    job: JobDetail,
    /// Root inputs of the artifact's lineage, by path; None when the side is a job.
    roots: Option<Roots>,
}

#[derive(Serialize)]
struct EnvChange {
    name: String,
    a: Option<String>,
    b: Option<String>,
}

#[derive(Serialize)]
struct PackageChange {
    kind: String,
    name: String,
    a: Option<String>,
    b: Option<String>,
}

/// Ranked like a root-cause report: parameters, code, packages, machine and environment, then
/// data.
#[derive(Serialize)]
pub(crate) struct Diff {
    a_job: i64,
    b_job: i64,
    parameters: Vec<ParamChange>,
    argv: Option<Change<Vec<String>>>,
    cwd: Option<Change<String>>,
    git: Option<Change<String>>,
    packages: Vec<PackageChange>,
    machine: Vec<EnvChange>,
    env: Vec<EnvChange>,
    inputs: Vec<FileChange>,
    outputs: Vec<FileChange>,
    root_inputs: Vec<FileChange>,
    /// Direct inputs with the same path and content on both sides.
    same_inputs: usize,
    /// The steps that differ, when both jobs have steps (SEMANTICS.md "Steps inside a job").
    steps: Vec<StepChange>,
    /// Paired steps with the same command and contents.
    same_steps: usize,
}

fn side(store: &Store, what: &OsStr) -> anyhow::Result<Side> {
    let cwd = std::env::current_dir()?;
    let label = fmt::shown(&what.to_string_lossy()).into_owned();
    let versioned = crate::names::versioned(store, what, &cwd)?;
    let target = match classify_in(Some(store), what, &cwd) {
        _ if versioned.is_some() => versioned.expect("checked"),
        Target::Job(id) => {
            return Ok(Side {
                label: format!("job {id}"),
                job: store.job(id)?,
                roots: None,
            })
        }
        Target::Hash(prefix) => Version {
            path: None,
            hash: store.resolve_hash(&prefix)?,
        },
        Target::Path(path) => store.version_at(&std::fs::canonicalize(&path).unwrap_or(path))?,
    };
    let lineage = store.lineage(&target)?;
    let Some(producer) = store.made_by(&target)? else {
        anyhow::bail!(
            "{label} ({}) is a root input: no recorded job made it, so it has no provenance to compare",
            short_hash(&target.hash)
        );
    };
    let mut job = store.job(producer)?;
    // Made by one step of a job that has steps (`make`, `bash pipeline.sh`): that step is the
    // side, not the whole job and every other thing it made.
    let step = lineage.steps.iter().find(|s| {
        s.job_id == producer
            && s.step.is_some()
            && s.outputs.iter().any(|o| {
                o.hash
                    .as_ref()
                    .is_some_and(|h| h.blake3 == target.hash.blake3)
                    && target.path.as_ref().is_none_or(|p| *p == o.path)
            })
    });
    let made_by = match step {
        Some(s) => {
            let whole = fmt::argv(&job.summary.argv);
            narrow_to_step(&mut job, s);
            format!("{} of {whole}", crate::graph::title(producer, s.step))
        }
        None => format!("job {producer}"),
    };
    Ok(Side {
        label: format!("{label} ({made_by})"),
        job,
        roots: Some(
            lineage
                .roots
                .into_iter()
                .map(|r| (r.path, r.hash))
                .collect(),
        ),
    })
}

/// `job` as its step `s` alone: the step's command, directory and files; the job's code,
/// packages, machine and environment.
fn narrow_to_step(job: &mut JobDetail, s: &roar_store::Step) {
    job.summary.argv = s
        .argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    job.summary.cwd = s.cwd.clone();
    let row = |role: Role, e: &roar_store::Edge| roar_store::FileRow {
        role,
        kind: "file".into(),
        path: e.path.clone(),
        hash: e.hash.clone(),
        before: None,
        ops: Vec::new(),
        s3: None,
    };
    job.files = s
        .inputs
        .iter()
        .map(|e| row(Role::Input, e))
        .chain(s.outputs.iter().map(|e| row(Role::Output, e)))
        .collect();
    job.steps.clear();
}

fn files(job: &JobDetail, role: Role) -> BTreeMap<String, Option<ContentHash>> {
    job.files
        .iter()
        .filter(|f| f.role == role)
        .map(|f| (f.path.clone(), f.hash.clone()))
        .collect()
}

fn git_label(job: &JobDetail) -> String {
    match &job.summary.git {
        Some(g) => format!(
            "{}{}",
            g.commit
                .as_deref()
                .map(|c| &c[..12.min(c.len())])
                .unwrap_or("no commit"),
            match (g.dirty, &g.diff) {
                (false, _) => String::new(),
                // Two dirty trees differ when their diffs do.
                (true, Some(d)) => format!(" (dirty, diff {})", &d[..12.min(d.len())]),
                (true, None) => " (dirty)".into(),
            }
        ),
        None => "not a git tree".into(),
    }
}

fn changed<T: PartialEq>(a: T, b: T) -> Option<Change<T>> {
    (a != b).then_some(Change { a, b })
}

fn diff_of(a: &Side, b: &Side) -> Diff {
    diff_jobs(&a.job, a.roots.as_ref(), &b.job, b.roots.as_ref())
}

/// `roar diff A B --json` of two jobs already read (`roar dag --html` holds every job's details).
pub(crate) fn compare_jobs(a: &JobDetail, b: &JobDetail) -> Diff {
    diff_jobs(a, None, b, None)
}

type Roots = BTreeMap<String, Option<ContentHash>>;

fn diff_jobs(ja: &JobDetail, ra: Option<&Roots>, jb: &JobDetail, rb: Option<&Roots>) -> Diff {
    let mut env = Vec::new();
    let names: BTreeSet<&String> = ja.env.keys().chain(jb.env.keys()).collect();
    for name in names {
        let (va, vb) = (ja.env.get(name), jb.env.get(name));
        if va != vb {
            env.push(EnvChange {
                name: name.clone(),
                a: va.cloned(),
                b: vb.cloned(),
            });
        }
    }
    let (inputs, same_inputs) = compare(&files(ja, Role::Input), &files(jb, Role::Input));
    let (outputs, _) = compare(&files(ja, Role::Output), &files(jb, Role::Output));
    let root_inputs = match (ra, rb) {
        (Some(ra), Some(rb)) => compare(ra, rb).0,
        _ => Vec::new(),
    };
    // Values in the parameter files each read first (`params.yaml:max_depth: 8 -> 5`).
    let objects = crate::values::objects_here();
    let mut parameters = params::compare(
        &crate::values::of_files(ja, Role::Input, objects.as_ref()),
        &crate::values::of_files(jb, Role::Input, objects.as_ref()),
    );
    parameters.extend(params::compare(
        &params::of_argv(&ja.summary.argv),
        &params::of_argv(&jb.summary.argv),
    ));
    let (steps, same_steps) = compare_steps(&ja.steps, &jb.steps);
    Diff {
        a_job: ja.summary.id,
        b_job: jb.summary.id,
        parameters,
        packages: package_changes(ja, jb),
        machine: machine_changes(ja, jb),
        argv: changed(ja.summary.argv.clone(), jb.summary.argv.clone()),
        cwd: changed(ja.summary.cwd.clone(), jb.summary.cwd.clone()),
        git: changed(git_label(ja), git_label(jb)),
        env,
        inputs,
        outputs,
        root_inputs,
        same_inputs,
        steps,
        same_steps,
    }
}

/// Packages by (kind, name): a version that changed, or one only one side used. Jobs recorded
/// before packages were (no package at all on a side) compare as unknown, not as removals.
fn package_changes(a: &JobDetail, b: &JobDetail) -> Vec<PackageChange> {
    let (pa, pb) = (&a.environment.packages, &b.environment.packages);
    if pa.is_empty() || pb.is_empty() {
        return Vec::new();
    }
    let versions = |ps: &[roar_store::Package]| -> BTreeMap<(String, String), String> {
        ps.iter()
            .map(|p| ((p.kind.clone(), p.name.clone()), p.version.clone()))
            .collect()
    };
    let (va, vb) = (versions(pa), versions(pb));
    let keys: BTreeSet<&(String, String)> = va.keys().chain(vb.keys()).collect();
    keys.into_iter()
        .filter(|k| va.get(*k) != vb.get(*k))
        .map(|k| PackageChange {
            kind: k.0.clone(),
            name: k.1.clone(),
            a: va.get(k).cloned(),
            b: vb.get(k).cloned(),
        })
        .collect()
}

/// The machine fields that differ (hostname, CPU, GPUs, OS, kernel...).
fn machine_changes(a: &JobDetail, b: &JobDetail) -> Vec<EnvChange> {
    let (Some(ra), Some(rb)) = (&a.environment.runtime, &b.environment.runtime) else {
        return Vec::new();
    };
    let flat = |r: &roar_store::Runtime| -> BTreeMap<String, String> {
        let v = serde_json::to_value(r).unwrap_or_default();
        v.as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| {
                        let s = v
                            .as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| v.to_string());
                        (k.clone(), s)
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let (fa, fb) = (flat(ra), flat(rb));
    let keys: BTreeSet<&String> = fa.keys().chain(fb.keys()).collect();
    keys.into_iter()
        .filter(|k| fa.get(*k) != fb.get(*k))
        .map(|k| EnvChange {
            name: k.clone(),
            a: fa.get(k).cloned(),
            b: fb.get(k).cloned(),
        })
        .collect()
}

fn print_files(
    out: &mut impl Write,
    title: &str,
    changes: &[FileChange],
    root: &Path,
) -> std::io::Result<()> {
    let hash = |h: &Option<ContentHash>| h.as_ref().map(short_hash).unwrap_or_else(|| "?".into());
    for (i, c) in changes.iter().enumerate() {
        let head = if i == 0 { title } else { "" };
        let path = rel(&c.path, root);
        match c.change {
            "modified" => writeln!(out, "{head:<12}~ {path}  {} -> {}", hash(&c.a), hash(&c.b))?,
            "added" => writeln!(out, "{head:<12}+ {path}  {}  (only in B)", hash(&c.b))?,
            _ => writeln!(out, "{head:<12}- {path}  {}  (only in A)", hash(&c.a))?,
        }
    }
    Ok(())
}

/// The steps that differ, each with what differs in it, then how many are the same.
fn print_steps(out: &mut impl Write, d: &Diff, root: &Path) -> std::io::Result<()> {
    let seq = |s: Option<u32>| s.map_or("-".into(), |n| n.to_string());
    for (i, s) in d.steps.iter().enumerate() {
        let head = if i == 0 { "steps" } else { "" };
        let command = fmt::argv(&s.command);
        match s.change {
            "added" => writeln!(out, "{head:<12}+ step {}  {command}  (only in B)", seq(s.b))?,
            "removed" => writeln!(out, "{head:<12}- step {}  {command}  (only in A)", seq(s.a))?,
            _ => {
                writeln!(
                    out,
                    "{head:<12}~ step {} -> {}  {command}",
                    seq(s.a),
                    seq(s.b)
                )?;
                if let Some(c) = &s.argv {
                    writeln!(out, "{:<14}argv {}", "", fmt::argv(&c.a))?;
                    writeln!(out, "{:<14}  -> {}", "", fmt::argv(&c.b))?;
                }
                print_files(out, "    in", &s.inputs, root)?;
                print_files(out, "    out", &s.outputs, root)?;
            }
        }
    }
    if d.same_steps > 0 {
        writeln!(
            out,
            "{:<12}{} identical step{}",
            "",
            d.same_steps,
            if d.same_steps == 1 { "" } else { "s" }
        )?;
    }
    Ok(())
}

/// What `roar diff A B --json` prints (A and B as on the command line).
pub(crate) fn compare_in(store: &Store, a: &OsStr, b: &OsStr) -> anyhow::Result<Diff> {
    Ok(diff_of(&side(store, a)?, &side(store, b)?))
}

pub fn diff(a: &OsStr, b: &OsStr, json: bool) -> anyhow::Result<()> {
    let (project, store) = crate::names::open()?;
    let (sa, sb) = (side(&store, a)?, side(&store, b)?);
    let d = diff_of(&sa, &sb);
    if json {
        return fmt::print_json(&d);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{} {}", bold("A:"), sa.label)?;
    writeln!(out, "{} {}", bold("B:"), sb.label)?;
    if sa.job.summary.id == sb.job.summary.id {
        writeln!(out, "both were made by the same job")?;
        return Ok(());
    }
    let mut any = print_job_changes(&mut out, &d)?;
    print_files(&mut out, "inputs", &d.inputs, &project.root)?;
    print_files(&mut out, "outputs", &d.outputs, &project.root)?;
    print_files(&mut out, "root inputs", &d.root_inputs, &project.root)?;
    any |= !(d.inputs.is_empty() && d.outputs.is_empty() && d.root_inputs.is_empty());
    if d.same_inputs > 0 {
        writeln!(
            out,
            "{:<12}{} identical input{}",
            "",
            d.same_inputs,
            if d.same_inputs == 1 { "" } else { "s" }
        )?;
    }
    print_steps(&mut out, &d, &project.root)?;
    any |= !d.steps.is_empty();
    if !any {
        writeln!(
            out,
            "same provenance: parameters, directory, code, packages, machine, environment and inputs are identical"
        )?;
    }
    Ok(())
}

/// The lines for what differs between the two jobs themselves: parameters, argv, directory,
/// code, packages, machine and environment. Whether there were any.
fn print_job_changes(out: &mut impl Write, d: &Diff) -> std::io::Result<bool> {
    let mut any = false;
    for (i, p) in d.parameters.iter().enumerate() {
        let head = if i == 0 { "parameters" } else { "" };
        let v = |x: &Option<String>| -> String {
            x.as_deref()
                .map_or("(unset)".into(), |s| fmt::shown(s).into_owned())
        };
        writeln!(
            out,
            "{head:<12}{}: {} -> {}",
            fmt::shown(&p.name),
            v(&p.a),
            v(&p.b)
        )?;
        any = true;
    }
    if let Some(c) = &d.argv {
        writeln!(out, "{:<12}{}", "argv", fmt::argv(&c.a))?;
        writeln!(out, "{:<12}{}", "", fmt::argv(&c.b))?;
        any = true;
    }
    if let Some(c) = &d.cwd {
        writeln!(
            out,
            "{:<12}{} -> {}",
            "cwd",
            fmt::shown(&c.a),
            fmt::shown(&c.b)
        )?;
        any = true;
    }
    if let Some(c) = &d.git {
        writeln!(out, "{:<12}{} -> {}", "code", c.a, c.b)?;
        any = true;
    }
    for (i, p) in d.packages.iter().enumerate() {
        let head = if i == 0 { "packages" } else { "" };
        let name = fmt::shown(&p.name);
        // Versions come from files a package installed: escaped like every recorded string.
        let (a, b) = (
            p.a.as_deref().map(fmt::shown),
            p.b.as_deref().map(fmt::shown),
        );
        match (a, b) {
            (Some(x), Some(y)) => writeln!(out, "{head:<12}~ {name} ({}): {x} -> {y}", p.kind)?,
            (None, Some(y)) => writeln!(out, "{head:<12}+ {name} {y} ({}, only in B)", p.kind)?,
            (Some(x), None) => writeln!(out, "{head:<12}- {name} {x} ({}, only in A)", p.kind)?,
            (None, None) => {}
        }
        any = true;
    }
    for (i, m) in d.machine.iter().enumerate() {
        let head = if i == 0 { "machine" } else { "" };
        let v = |x: &Option<String>| -> String {
            x.as_deref()
                .map_or("-".into(), |s| fmt::shown(s).into_owned())
        };
        writeln!(out, "{head:<12}{}: {} -> {}", m.name, v(&m.a), v(&m.b))?;
        any = true;
    }
    for (i, e) in d.env.iter().enumerate() {
        let head = if i == 0 { "env" } else { "" };
        let (name, a, b) = (
            fmt::shown(&e.name),
            e.a.as_deref().map(fmt::shown),
            e.b.as_deref().map(fmt::shown),
        );
        match (a, b) {
            (Some(x), Some(y)) => writeln!(out, "{head:<12}~ {name}: {x} -> {y}")?,
            (None, Some(y)) => writeln!(out, "{head:<12}+ {name}={y}")?,
            (Some(x), None) => writeln!(out, "{head:<12}- {name}={x}")?,
            (None, None) => {}
        }
        any = true;
    }
    Ok(any)
}
