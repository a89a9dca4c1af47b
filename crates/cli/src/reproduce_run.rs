//! `roar reproduce REF --run`: the plan re-run in a scratch worktree, never in the working tree.
//!
//! The worktree mirrors the repository (or the project when there is none). Before each job:
//! its code — the files of its recorded commit (`git archive`) and its kept uncommitted diff
//! (`git apply`) — then each input inside the tree at the version the job read, from the worktree
//! when it has it already, else the working tree when the file there has that content, else the
//! versions kept (`roar_store::objects`). The job runs under `roar run` in a mount namespace
//! where the worktree is mounted over the tree's own path, so the recorded working directory and
//! every absolute path in the command name the worktree's files: nothing the job writes can
//! reach the working tree. Each output is then compared with the recorded hash.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context;
use roar_store::hash::{hash_path, HashOptions};
use roar_store::objects::Objects;
use roar_store::redact::REDACTED;
use roar_store::{ContentHash, Edge, Lineage, Project, Step, Store};

use crate::entry::ExitCode;
use crate::fmt::{self, rel, short_hash};

/// The scratch worktree and what it mirrors.
struct Worktree {
    /// The scratch directory.
    dir: PathBuf,
    /// The tree it stands for: the repository's work tree, else the project's root.
    top: PathBuf,
    repo: Option<PathBuf>,
    /// The code state last put in place (commit, diff).
    code: Option<(String, Option<String>)>,
}

impl Worktree {
    /// `path` inside the worktree, if it is inside the tree.
    fn inside(&self, path: &Path) -> Option<PathBuf> {
        path.strip_prefix(&self.top).ok().map(|r| self.dir.join(r))
    }
}

/// What became of one output.
enum Verdict {
    Exact,
    /// The rebuilt content, and the likeliest cause ([`likeliest_cause`]).
    Differs(ContentHash, String),
    Missing,
    NotRun(String),
}

/// Runs the plan `steps` (each node once, in dependency order) in a scratch worktree (`into`,
/// kept; else a temporary one, removed) and reports each output.
pub fn run_isolated(
    project: &Project,
    store: &Store,
    target: &ContentHash,
    lineage: &Lineage,
    steps: &[&Step],
    into: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let repo = roar_env::git::Repo::find(&project.root).map(|r| r.root);
    let top = repo.clone().unwrap_or_else(|| project.root.clone());
    let dir = match into {
        Some(d) => {
            let d = crate::names::absolute(&std::env::current_dir()?, d);
            anyhow::ensure!(
                !d.starts_with(&top),
                "--in {} is inside the tree it would stand for; give a directory outside {}",
                d.display(),
                top.display()
            );
            if d.exists() && std::fs::read_dir(&d)?.next().is_some() {
                anyhow::bail!(
                    "--in {}: the directory is not empty; give a new or empty one",
                    d.display()
                );
            }
            d
        }
        None => std::env::temp_dir().join(format!("roar-reproduce-{}", crate::recover::new_uid())),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut wt = Worktree {
        dir: dir.clone(),
        top,
        repo,
        code: None,
    };
    let result = run_plan(project, store, target, lineage, steps, &mut wt);
    match into {
        Some(_) => eprintln!("roar: the worktree is kept in {}", dir.display()),
        None => {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    result
}

fn run_plan(
    project: &Project,
    store: &Store,
    target: &ContentHash,
    lineage: &Lineage,
    steps: &[&Step],
    wt: &mut Worktree,
) -> anyhow::Result<ExitCode> {
    // The re-runs are recorded in a store of the worktree's own, with the project's settings.
    let inner = wt
        .inside(&project.root)
        .context("the project is outside its repository")?;
    let (scratch, _) = Project::init(&inner)?;
    let _ = std::fs::copy(project.config_path(), scratch.config_path());
    let objects = project.objects();
    let team = crate::keep::TeamObjects::new(project);
    let exe = std::env::current_exe()?;
    eprintln!(
        "roar: reproducing {} job(s) in {} (the working tree is not touched)",
        steps.len(),
        wt.dir.display()
    );
    let mut target_verdict = None;
    let mut slot = 0;
    for s in steps {
        let title = crate::graph::title(s.job_id, s.step);
        let nodes: Vec<&Step> = lineage
            .steps
            .iter()
            .filter(|n| n.job_id == s.job_id)
            .collect();
        let outputs: Vec<&Edge> = nodes.iter().flat_map(|n| &n.outputs).collect();
        let verdicts = match prepare(store, &objects, &team, s, &nodes, wt) {
            Err(why) => outputs
                .iter()
                .map(|_| Verdict::NotRun(why.clone()))
                .collect(),
            Ok(()) => {
                let argv = crate::step_argv::supplied(s, &mut slot)?;
                eprintln!("roar: {title}: {}", roar_store::shell_join(&s.argv));
                let env = job_env(&store.job(s.job_id)?.env, s.job_id);
                match rerun(&exe, s, &argv, &env, wt) {
                    Ok(status) if status.success() => check(&outputs, wt, &|| {
                        likeliest_cause(store, &scratch, s.job_id, &project.root)
                    }),
                    Ok(status) => outputs
                        .iter()
                        .map(|_| Verdict::NotRun(format!("the command failed ({status})")))
                        .collect(),
                    Err(e) => return Err(e),
                }
            }
        };
        println!("{title}: {}", fmt::shown(&roar_store::shell_join(&s.argv)));
        for (o, v) in outputs.iter().zip(&verdicts) {
            let shown = rel(&o.path, &project.root);
            let want = o.hash.as_ref();
            let line = match v {
                Verdict::Exact => format!("  reproduced  {shown}  bit-exact"),
                Verdict::Differs(got, why) => format!(
                    "  differs     {shown}  recorded {}, rebuilt {}: {why}",
                    want.map(short_hash).unwrap_or_default(),
                    short_hash(got)
                ),
                Verdict::Missing => format!("  differs     {shown}  the re-run did not write it"),
                Verdict::NotRun(why) => format!("  not run     {shown}  {why}"),
            };
            println!("{line}");
            if want.is_some_and(|h| h.blake3 == target.blake3) {
                target_verdict = Some(matches!(v, Verdict::Exact));
                if matches!(v, Verdict::NotRun(_)) {
                    target_verdict = None;
                }
            }
        }
    }
    match target_verdict {
        Some(true) => {
            println!("reproduced blake3 {}: matches", target.blake3);
            Ok(ExitCode::SUCCESS)
        }
        Some(false) => Ok(ExitCode::from(crate::exit::FAILURE)),
        None => Ok(ExitCode::from(crate::exit::NOT_FOUND)),
    }
}

/// Puts the job's code and every input it read inside the tree in place. Err: why it cannot run
/// (an input version that is nowhere, a commit the repository lacks).
fn prepare(
    store: &Store,
    objects: &Objects,
    team: &crate::keep::TeamObjects,
    s: &Step,
    nodes: &[&Step],
    wt: &mut Worktree,
) -> Result<(), String> {
    if let (Some(commit), Some(repo)) = (&s.git_commit, wt.repo.clone()) {
        let code = (commit.clone(), s.git_diff.clone());
        if wt.code.as_ref() != Some(&code) {
            extract(&repo, commit, &wt.dir)?;
            if s.git_diff.is_some() {
                let patch = store.job_patch(s.job_id).ok().flatten().ok_or_else(|| {
                    format!("job {}'s uncommitted changes were not kept", s.job_id)
                })?;
                apply(&patch, &wt.dir)?;
            }
            wt.code = Some(code);
        }
    }
    if let Some(cwd) = wt.inside(Path::new(&s.cwd)) {
        std::fs::create_dir_all(&cwd).map_err(|e| format!("cannot make {}: {e}", cwd.display()))?;
    }
    let mut done = HashSet::new();
    for e in nodes.iter().flat_map(|n| &n.inputs) {
        let (Some(want), Some(dest)) = (&e.hash, wt.inside(Path::new(&e.path))) else {
            continue;
        };
        if !done.insert(dest.clone()) {
            continue;
        }
        materialize(store, objects, team, e, want, &dest)?;
    }
    for o in nodes.iter().flat_map(|n| &n.outputs) {
        make_dirs_it_found(Path::new(&o.path), s.started_ns, wt);
    }
    Ok(())
}

/// Makes in the worktree the directories above an output, but one the job made itself (the
/// working tree's directory was born after the job began): a job writes into the others without
/// making them. A directory the working tree does not have (a fresh clone) is made.
fn make_dirs_it_found(output: &Path, started_ns: i64, wt: &Worktree) {
    let Ok(rel) = output.strip_prefix(&wt.top) else {
        return;
    };
    let mut here = wt.top.clone();
    let mut there = wt.dir.clone();
    for part in rel.parent().into_iter().flat_map(Path::components) {
        here.push(part);
        there.push(part);
        if there.is_dir() {
            continue;
        }
        let made_by_the_job = std::fs::metadata(&here)
            .ok()
            .filter(std::fs::Metadata::is_dir)
            .and_then(|m| m.created().ok())
            .is_some_and(|t| {
                let ns = t
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as i64);
                ns >= started_ns
            });
        if made_by_the_job || std::fs::create_dir(&there).is_err() {
            return;
        }
    }
}

/// The files of `commit`, written over the worktree (`git archive | tar -x`).
fn extract(repo: &Path, commit: &str, dir: &Path) -> Result<(), String> {
    let mut archive = Command::new("git")
        .args(["archive", "--format=tar", commit])
        .current_dir(repo)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run git archive: {e}"))?;
    let tar = Command::new("tar")
        .args(["-x", "-f", "-", "-C"])
        .arg(dir)
        .stdin(archive.stdout.take().expect("piped"))
        .status()
        .map_err(|e| format!("cannot run tar: {e}"))?;
    let out = archive.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "commit {} is not in the repository (fetch it, then run again): {}",
            &commit[..12.min(commit.len())],
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    if !tar.success() {
        return Err(format!("tar could not write the files of commit {commit}"));
    }
    Ok(())
}

/// Applies a kept diff to the worktree.
fn apply(patch: &[u8], dir: &Path) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("git")
        .args(["apply", "--whitespace=nowarn", "-"])
        .current_dir(dir)
        .env_remove("GIT_DIR")
        .env("GIT_CEILING_DIRECTORIES", dir)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run git apply: {e}"))?;
    let _ = child.stdin.take().expect("piped").write_all(patch);
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "the kept uncommitted changes do not apply: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Puts version `want` of input `e` at `dest`: there already, the working tree's file when it
/// has that content, else the versions kept, else any file the record saw it at, else the
/// team's kept versions. Every copy is checked against the hash.
fn materialize(
    store: &Store,
    objects: &Objects,
    team: &crate::keep::TeamObjects,
    e: &Edge,
    want: &ContentHash,
    dest: &Path,
) -> Result<(), String> {
    let has =
        |p: &Path| hash_path(p, HashOptions::default()).is_ok_and(|h| h.hash.blake3 == want.blake3);
    if has(dest) {
        return Ok(());
    }
    let copy = |src: &Path| roar_store::objects::copy_verified(src, &want.blake3, dest).is_ok();
    let here = Path::new(&e.path);
    if has(here) && copy(here) {
        return Ok(());
    }
    if objects.has(&want.blake3) && objects.copy_out(&want.blake3, dest).is_ok() {
        return Ok(());
    }
    // Anywhere else the record saw this content, if a file there still has it.
    if let Ok(detail) = store.artifact(want) {
        for u in detail.made_by.iter().chain(&detail.used_by) {
            let p = Path::new(&u.path);
            if has(p) && copy(p) {
                return Ok(());
            }
        }
    }
    if team.fetch(&want.blake3) && objects.copy_out(&want.blake3, dest).is_ok() {
        return Ok(());
    }
    Err(format!(
        "input {} version {} is not kept here or by the team and no file here has it (keep versions with [keep] in .roar/config.toml)",
        fmt::shown(&e.path),
        &want.blake3[..12]
    ))
}

/// Why a re-run made other bytes, from its record (the worktree's store) against the original
/// job's: an input it read with other content (one outside the tree, which the worktree does not
/// put in place: a library, a file in /tmp), else a package at another version, else none found.
fn likeliest_cause(store: &Store, scratch: &Project, job: i64, root: &Path) -> String {
    let rerun = Store::open(&scratch.db_path())
        .ok()
        .and_then(|s| Some((s.jobs(1).ok()?.first()?.id, s)))
        .and_then(|(id, s)| s.job(id).ok());
    let (Some(rerun), Ok(original)) = (rerun, store.job(job)) else {
        return "the re-run's record cannot be read".to_owned();
    };
    let read = |j: &roar_store::JobDetail| -> HashMap<String, Option<String>> {
        j.files
            .iter()
            .filter(|f| f.role == roar_store::Role::Input)
            .map(|f| (f.path.clone(), f.hash.as_ref().map(|h| h.blake3.clone())))
            .collect()
    };
    let (then, now) = (read(&original), read(&rerun));
    let mut changed: Vec<&String> = then
        .iter()
        .filter(|(p, h)| now.get(*p).is_some_and(|n| n != *h))
        .map(|(p, _)| p)
        .collect();
    changed.sort();
    if let Some(p) = changed.first() {
        return format!(
            "input {} had other content this time ({} input(s) differ; `roar show` the two jobs)",
            rel(p, root),
            changed.len()
        );
    }
    let versions = |j: &roar_store::JobDetail| -> HashMap<String, String> {
        j.environment
            .packages
            .iter()
            .map(|p| (format!("{} {}", p.kind, p.name), p.version.clone()))
            .collect()
    };
    let (then, now) = (versions(&original), versions(&rerun));
    if let Some((name, v)) = then
        .iter()
        .find(|(n, v)| now.get(*n).is_some_and(|w| w != *v))
    {
        return format!(
            "package {} was {v}, now {}",
            fmt::shown(name),
            fmt::shown(&now[name])
        );
    }
    "the job read the same inputs with the same packages, so the command is not deterministic (a seed, the time, threads)".to_owned()
}

/// Each output's verdict, read from the worktree (outside the tree: from where it is).
/// `why` is asked (once) only if an output differs.
fn check(outputs: &[&Edge], wt: &Worktree, why: &dyn Fn() -> String) -> Vec<Verdict> {
    let found = std::cell::OnceCell::new();
    let cause = || found.get_or_init(why).clone();
    outputs
        .iter()
        .map(|o| {
            let at = wt
                .inside(Path::new(&o.path))
                .unwrap_or_else(|| PathBuf::from(&o.path));
            match (hash_path(&at, HashOptions::default()), &o.hash) {
                (Ok(h), Some(want)) if h.hash.blake3 == want.blake3 => Verdict::Exact,
                (Ok(h), _) => Verdict::Differs(h.hash, cause()),
                (Err(_), _) => Verdict::Missing,
            }
        })
        .collect()
}

/// Runs the job under `roar run` with the worktree mounted over the tree (a mount namespace of
/// its own; a user namespace too when not root).
fn rerun(
    exe: &Path,
    s: &Step,
    argv: &[OsString],
    env: &[(String, OsString)],
    wt: &Worktree,
) -> anyhow::Result<std::process::ExitStatus> {
    let mut cmd = Command::new(exe);
    cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    cmd.arg("run")
        .args(s.uses_s3().then_some("--s3"))
        .arg("--")
        .args(
            crate::step_argv::redirecting(&s.streams)
                .into_iter()
                .flat_map(|program| {
                    [
                        OsString::from("sh"),
                        "-c".into(),
                        OsString::from_vec(program),
                    ]
                }),
        )
        .args(argv);
    // Started outside the tree: the mount below puts the job in its recorded directory.
    cmd.current_dir("/");
    crate::namespace::with_binds(&mut cmd, &[(&wt.dir, &wt.top)], Some(Path::new(&s.cwd)))?;
    cmd.status().map_err(|e| {
        anyhow::anyhow!(
            "cannot re-run job {} in the worktree: {e} (the worktree is mounted over {} in a mount namespace; that needs root or unprivileged user namespaces)",
            s.job_id,
            wt.top.display()
        )
    })
}

/// The environment a job runs with again: the one it recorded; a value roar redacted is taken
/// from this environment when it has the variable, else left unset — each said on stderr. roar's
/// own settings (`ROAR_*`) come from this environment.
fn job_env(recorded: &BTreeMap<String, String>, job: i64) -> Vec<(String, OsString)> {
    let mut env = Vec::with_capacity(recorded.len());
    for (k, v) in recorded {
        if k.starts_with("ROAR_") {
            continue;
        }
        if !v.contains(REDACTED) {
            env.push((k.clone(), OsString::from(v)));
            continue;
        }
        match std::env::var_os(k) {
            Some(now) => {
                eprintln!(
                    "roar: job {job}: {} was recorded redacted; its value is taken from this environment",
                    fmt::shown(k)
                );
                env.push((k.clone(), now));
            }
            None => eprintln!(
                "roar: job {job}: {} was recorded redacted and is not set here; the job runs without it",
                fmt::shown(k)
            ),
        }
    }
    env.extend(
        std::env::vars_os()
            .filter(|(k, _)| {
                let k = k.to_string_lossy();
                k.starts_with("ROAR_") && !k.starts_with("ROAR_INTERNAL_")
            })
            .map(|(k, v)| (k.to_string_lossy().into_owned(), v)),
    );
    env
}
