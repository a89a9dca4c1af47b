//! `roar reproduce`: the script that rebuilds an artifact from its root inputs, or (`--run`) the
//! rebuild itself, checked against the recorded hash.
//!
//! The script is POSIX `sh` and exact: every recorded word (argv, cwd) is quoted byte for byte
//! ([`roar_store::quote::script_word`]), every recorded string in a comment is escaped, so no
//! file name or argument can inject a command. An argument roar redacted (a secret) becomes
//! `${ROAR_SECRET_<n>:?...}`: the script stops with a message unless the user supplies it, and
//! `--run` reads the same variables.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use roar_store::quote::script_word;
use roar_store::{shell_join, ContentHash, Lineage, Project, Step, Store};

use crate::current::current_hashes;
use crate::entry::ExitCode;
use crate::fmt::{self, rel, short_hash};
use crate::names::{open, resolve};
use crate::step_argv::{pieces, redirecting, script_argv, supplied};

/// How `--run` rebuilds.
pub enum Rebuild<'a> {
    /// Only print the plan (the script).
    No,
    /// In a scratch worktree (kept in the directory given).
    Isolated(Option<&'a Path>),
    /// In the working tree, over what is there (the root inputs must be as recorded).
    InPlace,
}

pub fn reproduce(what: &OsStr, rebuild: Rebuild, json: bool) -> anyhow::Result<ExitCode> {
    let run = !matches!(rebuild, Rebuild::No);
    let (project, store) = open()?;
    let target = resolve(&store, what)?;
    let lineage = store.lineage(&target)?;
    anyhow::ensure!(
        !lineage.steps.is_empty(),
        "no recorded job made {}: it is a root input, there is nothing to rebuild",
        what.to_string_lossy()
    );
    if json && !run {
        fmt::print_json(&lineage)?;
        return Ok(ExitCode::SUCCESS);
    }
    // The ranks of a distributed run wait for each other: run one after another they would
    // hang. The script lists them; running them is the launcher's job.
    if let Some(d) = lineage
        .steps
        .iter()
        .find_map(|s| s.dist.as_ref())
        .filter(|_| run)
    {
        let ranks = lineage
            .steps
            .iter()
            .filter(|s| s.dist.as_ref().is_some_and(|x| x.group == d.group))
            .count();
        anyhow::bail!(
            "{} comes from the distributed run {} ({ranks} jobs): its ranks must run together under their launcher (torchrun, srun, mpirun), which --run does not start; `roar reproduce` without --run prints each rank's command",
            fmt::shown(&what.to_string_lossy()),
            fmt::shown(&d.group)
        );
    }
    let steps = runnable(&store, &lineage)?;
    if !run {
        let mut out = std::io::stdout().lock();
        script(
            &mut out,
            what,
            &target.hash,
            &lineage,
            &steps,
            &project.root,
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    match rebuild {
        Rebuild::Isolated(into) => crate::reproduce_run::run_isolated(
            &project,
            &store,
            &target.hash,
            &lineage,
            &steps,
            into,
        ),
        _ => run_steps(&project, &store, &target.hash, &lineage, &steps),
    }
}

/// The nodes of the lineage to re-run, in order: all of them, except a step whose ancestor step
/// in the same job is re-run anyway (re-running a step re-runs every step under it).
fn runnable<'a>(store: &Store, lineage: &'a Lineage) -> anyhow::Result<Vec<&'a Step>> {
    let chosen: std::collections::HashSet<(i64, u32)> = lineage
        .steps
        .iter()
        .filter_map(|s| Some((s.job_id, s.step?)))
        .collect();
    let mut parents: std::collections::HashMap<i64, std::collections::HashMap<u32, u32>> =
        Default::default();
    let mut out = Vec::new();
    let mut planned = std::collections::HashSet::new();
    for s in &lineage.steps {
        // Each node once, however many of its outputs the lineage goes through.
        if !planned.insert((s.job_id, s.step)) {
            continue;
        }
        if let Some(seq) = s.step {
            let tree = match parents.entry(s.job_id) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(
                    store
                        .steps(s.job_id)?
                        .into_iter()
                        .filter_map(|d| Some((d.seq, d.parent?)))
                        .collect(),
                ),
            };
            let mut up = tree.get(&seq);
            let mut covered = false;
            while let Some(&p) = up {
                if chosen.contains(&(s.job_id, p)) {
                    covered = true;
                    break;
                }
                up = tree.get(&p);
            }
            if covered {
                continue;
            }
        }
        out.push(s);
    }
    Ok(out)
}

/// Checks the root inputs, re-runs every step under `roar run`, and verifies the result.
fn run_steps(
    project: &Project,
    store: &Store,
    target: &ContentHash,
    lineage: &roar_store::Lineage,
    steps: &[&Step],
) -> anyhow::Result<ExitCode> {
    let sha256 = target.sha256.is_some();
    check_roots(project, store, lineage, sha256)?;
    let head = crate::run_cmd::git_head(&project.root);
    // The uncommitted changes the tree has now, to compare with each step's.
    let now_diff = roar_env::git::Repo::find(&project.root)
        .map(|r| roar_env::git::DiffJob::start(&r, head.as_deref()))
        .and_then(roar_env::git::DiffJob::finish)
        .map(|d| match d {
            roar_env::git::Dirt::Clean => None,
            roar_env::git::Dirt::Dirty(bytes) => {
                bytes.as_deref().map(roar_store::environment::blake3_hex)
            }
        });
    let exe = std::env::current_exe()?;
    let mut slot = 0;
    for s in steps {
        warn_of_drift(s, head.as_deref(), now_diff.as_ref());
        rerun_step(&exe, s, &mut slot)?;
    }
    verify_target(project, store, target, lineage)
}

/// Every root input of the lineage is here with its recorded content, or an error that says
/// which is not and what to do.
fn check_roots(
    project: &Project,
    store: &Store,
    lineage: &roar_store::Lineage,
    sha256: bool,
) -> anyhow::Result<()> {
    let roots: Vec<PathBuf> = lineage
        .roots
        .iter()
        .map(|r| PathBuf::from(&r.path))
        .collect();
    let now = current_hashes(store, &roots, sha256);
    for (r, p) in lineage.roots.iter().zip(&roots) {
        let Some(want) = &r.hash else {
            anyhow::bail!(
                "root input {} was recorded without its content; it cannot be verified",
                rel(&r.path, &project.root)
            );
        };
        match now.get(p) {
            Some(h) if h.blake3 == want.blake3 => {}
            Some(h) => anyhow::bail!(
                "root input {} changed: recorded {}, now {}; restore it before reproducing",
                rel(&r.path, &project.root),
                short_hash(want),
                short_hash(h)
            ),
            None => anyhow::bail!(
                "root input {} is missing; restore it before reproducing",
                rel(&r.path, &project.root)
            ),
        }
    }
    Ok(())
}

/// Warns where the tree is not as the step ran: another commit (`head`), or other uncommitted
/// changes (`now_diff`: the tree's diff hash, None when clean).
fn warn_of_drift(s: &Step, head: Option<&str>, now_diff: Option<&Option<String>>) {
    if let (Some(want), Some(have)) = (&s.git_commit, head) {
        if want != have {
            eprintln!(
                "roar: warning: job {} ran at commit {}, the tree is at {}",
                s.job_id,
                &want[..12.min(want.len())],
                &have[..12.min(have.len())]
            );
        }
    }
    if let (Some(want), Some(have)) = (&s.git_diff, now_diff) {
        if have.as_ref() != Some(want) {
            eprintln!(
                "roar: warning: job {} ran with uncommitted changes (diff {}) the tree does not have; restore them with `git stash && roar show @{} --patch | git apply`",
                s.job_id,
                &want[..12.min(want.len())],
                s.job_id
            );
        }
    }
}

/// Runs one step again under `roar run` (`exe`), in its directory, with its standard streams
/// opened as they were; an error if it fails.
fn rerun_step(exe: &Path, s: &Step, slot: &mut usize) -> anyhow::Result<()> {
    let title = crate::graph::title(s.job_id, s.step);
    anyhow::ensure!(
        s.backend != "gateway",
        "job {} is an S3 client seen by `roar gateway`, not a command; re-create its objects and run `roar reproduce` on what it made",
        s.job_id
    );
    eprintln!("roar: reproducing {title}: {}", shell_join(&s.argv));
    let argv = supplied(s, slot)?;
    let status = std::process::Command::new(exe)
        .arg("run")
        .args(s.uses_s3().then_some("--s3"))
        .arg("--")
        .args(redirecting(&s.streams).into_iter().flat_map(|program| {
            [
                OsString::from("sh"),
                "-c".into(),
                OsString::from_vec(program),
            ]
        }))
        .args(&argv)
        .current_dir(&s.cwd)
        .status()
        .with_context(|| format!("cannot start roar run for {title}"))?;
    anyhow::ensure!(
        status.success(),
        "{title} failed when re-run ({status}); stopping"
    );
    Ok(())
}

/// Whether the steps made the target again: the output of the last step that had its content,
/// hashed now.
fn verify_target(
    project: &Project,
    store: &Store,
    target: &ContentHash,
    lineage: &roar_store::Lineage,
) -> anyhow::Result<ExitCode> {
    let path = lineage
        .steps
        .iter()
        .rev()
        .flat_map(|s| s.outputs.iter())
        .find(|o| o.hash.as_ref().is_some_and(|h| h.blake3 == target.blake3))
        .map(|o| PathBuf::from(&o.path))
        .context("the lineage does not name the target's path")?;
    let sha256 = target.sha256.is_some();
    let got = current_hashes(store, std::slice::from_ref(&path), sha256);
    match got.get(&path) {
        Some(h) if h.blake3 == target.blake3 => {
            println!(
                "reproduced {}: blake3 {} matches",
                rel(&path.to_string_lossy(), &project.root),
                target.blake3
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(h) => {
            println!(
                "{} differs: recorded {}, rebuilt {} (the steps are not deterministic, or an input outside the lineage changed)",
                rel(&path.to_string_lossy(), &project.root),
                target.blake3,
                h.blake3
            );
            Ok(ExitCode::from(crate::exit::FAILURE))
        }
        None => anyhow::bail!("{} was not rebuilt", path.display()),
    }
}

/// The rebuild script (see the module docs).
fn script(
    out: &mut impl Write,
    what: &OsStr,
    target: &ContentHash,
    lineage: &Lineage,
    steps: &[&Step],
    root: &Path,
) -> std::io::Result<()> {
    script_header(out, what, target, lineage, steps, root)?;
    writeln!(out, "set -e")?;
    let mut last_cwd = String::new();
    // The code each step ran: its commit, plus the uncommitted changes kept with it. A patch
    // applied for one step is taken back (`git apply -R`) before the tree moves on.
    let mut last_code: Code = (None, None);
    let mut slot = 0;
    for s in steps {
        script_code(out, s, &mut last_code)?;
        if s.cwd != last_cwd {
            out.write_all(b"cd ")?;
            out.write_all(&script_word(s.cwd.as_bytes()))?;
            out.write_all(b"\n")?;
            last_cwd = s.cwd.clone();
        }
        if let Some(d) = &s.dist {
            // Ranks wait for each other: one after another they would hang.
            // One comment line: `shell_join` quotes a newline as `$'\n'`.
            writeln!(
                out,
                "# job {}: {} on {}; its ranks run together under their launcher (torchrun, srun, mpirun): roar run -- {}",
                s.job_id,
                match (d.rank, d.world_size) {
                    // A comment line: the group (from the environment) must not end it.
                    (Some(r), Some(w)) => format!("rank {r}/{w} of {}", fmt::shown(&d.group)),
                    (Some(r), None) => format!("rank {r} of {}", fmt::shown(&d.group)),
                    _ => format!("one node of {}", fmt::shown(&d.group)),
                },
                fmt::shown(s.host.as_deref().unwrap_or("an unknown host")),
                roar_store::shell_join(&s.argv)
            )?;
            continue;
        }
        if s.backend == "gateway" {
            writeln!(
                out,
                "# job {}: objects an S3 client wrote through `roar gateway` ({}); not a command roar can re-run",
                s.job_id,
                fmt::shown(s.name.as_deref().unwrap_or("unnamed"))
            )?;
            continue;
        }
        out.write_all(if s.uses_s3() {
            b"roar run --s3 -- "
        } else {
            b"roar run -- "
        })?;
        if let Some(program) = redirecting(&s.streams) {
            out.write_all(b"sh -c ")?;
            out.write_all(&script_word(&program))?;
            out.write_all(b" ")?;
        }
        out.write_all(&script_argv(s, &mut slot))?;
        writeln!(out, "  # {}", crate::graph::title(s.job_id, s.step))?;
    }
    Ok(())
}

/// The code a step ran: its commit, and the diff hash and job of the uncommitted changes kept
/// with it.
type Code<'a> = (Option<&'a str>, Option<(&'a str, i64)>);

/// The script's opening comments: what it rebuilds, from which root inputs, and the secrets it
/// needs set.
fn script_header(
    out: &mut impl Write,
    what: &OsStr,
    target: &ContentHash,
    lineage: &Lineage,
    steps: &[&Step],
    root: &Path,
) -> std::io::Result<()> {
    writeln!(out, "#!/bin/sh")?;
    writeln!(
        out,
        "# Rebuilds {} (blake3 {})",
        fmt::shown(&what.to_string_lossy()),
        target.blake3
    )?;
    writeln!(
        out,
        "# from these root inputs (`roar reproduce --run` checks them first):"
    )?;
    for r in &lineage.roots {
        let h = r
            .hash
            .as_ref()
            .map(|h| h.blake3.as_str())
            .unwrap_or("unknown content");
        writeln!(out, "#   {h}  {}", rel(&r.path, root))?;
    }
    let secrets: usize = steps
        .iter()
        .flat_map(|s| &s.argv)
        .map(|a| pieces(a).len() - 1)
        .sum();
    if secrets > 0 {
        writeln!(
            out,
            "# roar redacted {secrets} secret(s) from the commands: set ROAR_SECRET_1..{secrets} before running."
        )?;
    }
    Ok(())
}

/// Moves the tree to the code step `s` ran, where it differs from the last step's (`last`):
/// takes back the last step's patch, checks out its commit, applies its patch.
fn script_code<'a>(out: &mut impl Write, s: &'a Step, last: &mut Code<'a>) -> std::io::Result<()> {
    let patch = s.git_diff.as_deref().map(|d| (d, s.job_id));
    let code = (s.git_commit.as_deref(), patch);
    let same_patch = last.1.map(|p| p.0) == patch.map(|p| p.0);
    if s.git_commit.is_none() || (code.0 == last.0 && same_patch) {
        return Ok(());
    }
    if let Some((d, job)) = last.1 {
        writeln!(
            out,
            "roar show @{job} --patch | git apply -R  # take back the changes of diff {}",
            &d[..12.min(d.len())]
        )?;
    }
    let dirty = match (s.git_dirty == Some(true), patch) {
        (false, _) => "",
        (true, Some(_)) => " (the tree was dirty: its changes are applied next)",
        (true, None) => " (the tree was dirty; its diff was not kept)",
    };
    if code.0 != last.0 {
        let commit = s.git_commit.as_deref().unwrap_or_default();
        out.write_all(b"git checkout ")?;
        out.write_all(&script_word(commit.as_bytes()))?;
        writeln!(out, "  # recorded commit{dirty}")?;
    }
    if let Some((d, job)) = patch {
        writeln!(
            out,
            "roar show @{job} --patch | git apply  # job {job}'s uncommitted changes (diff {})",
            &d[..12.min(d.len())]
        )?;
    }
    *last = code;
    Ok(())
}
