//! `roar status`: recorded files that changed, outputs made stale by a change upstream (with the
//! chain of jobs it went through), and files no job touched. Judged in `roar_store::status`; this
//! file looks at the files (stat and hash cache first) and prints the report.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use roar_store::hash::{hash_paths, HashError, HashOptions, Prior};
use roar_store::{Now, Project, StatusReport, Store};
use serde::Serialize;

use crate::entry::ExitCode;
use crate::fmt::{self, bold, rel_exact};
use crate::names::open;

/// What is at each path now: the hash cache answers for a file whose identity did not move; only
/// the others are read. An archive member (`ARCHIVE!/member`) is what the archive's index says
/// (built again if the archive changed).
fn look(project: &Project, store: &Store, paths: &[String]) -> HashMap<String, Now> {
    let (members, paths): (Vec<&String>, Vec<&String>) = paths
        .iter()
        .partition(|p| roar_archive::split_member_path(Path::new(p)).is_some());
    let mut now = look_members(project, &members);
    let bufs: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
    let batch = crate::progress::while_hashing("the recorded files", || {
        hash_paths(
            &bufs,
            HashOptions { sha256: false },
            &|_| Prior::MayBeCached,
            &|| Some(store.conn()),
            &|_| {},
        )
    });
    now.extend(paths.iter().zip(batch.results).map(|(p, r)| {
        let n = match r {
            Ok(h) => Now::Content(h.hash.blake3),
            Err(HashError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Now::Missing
            }
            // A directory now where a file was, or a file that was replaced by another kind.
            Err(HashError::NotAFile { .. }) => Now::Missing,
            Err(_) => Now::Unknown,
        };
        ((*p).clone(), n)
    }));
    crate::current::remember(store, batch.new_cache);
    now
}

fn look_members(project: &Project, members: &[&String]) -> HashMap<String, Now> {
    let mut by_archive: HashMap<PathBuf, Vec<(&String, Vec<u8>)>> = HashMap::new();
    for p in members {
        if let Some((archive, member)) = roar_archive::split_member_path(Path::new(p)) {
            by_archive.entry(archive).or_default().push((p, member));
        }
    }
    let mut now = HashMap::new();
    for (archive, wanted) in by_archive {
        let index =
            roar_archive::cache::open(&archive, &crate::mount_cmd::index_dir(project), &|_| {});
        let Ok((index, _)) = index else {
            // Not an archive any more (or unreadable): nothing can be said of its members.
            now.extend(wanted.into_iter().map(|(p, _)| (p.clone(), Now::Unknown)));
            continue;
        };
        let hashes: HashMap<&[u8], &[u8; 32]> = index
            .members
            .iter()
            .filter(|m| m.kind == roar_archive::Kind::File)
            .map(|m| (m.path.as_slice(), &m.blake3))
            .collect();
        let dir = crate::mount_cmd::index_dir(project);
        let mut inside = None;
        for (p, member) in wanted {
            // An earlier version (`x.versions/1`), or a member of an archive inside the archive
            // (`inner.tar!/x`), opened if one is.
            let mut nested = || {
                let open = || roar_archive::nested::Lookup::new(index.clone(), &dir).ok();
                Some(
                    inside
                        .get_or_insert_with(open)
                        .as_mut()?
                        .file(&member)?
                        .blake3,
                )
            };
            let n = match hashes
                .get(member.as_slice())
                .map(|h| **h)
                .or_else(&mut nested)
            {
                Some(h) => Now::Content(roar_store::hash::hex(&h)),
                None => Now::Missing,
            };
            now.insert(p.clone(), n);
        }
    }
    now
}

/// What `roar status --json` prints, and what `roar ui` marks nodes with.
#[derive(Serialize)]
pub(crate) struct Report {
    pub clean: bool,
    #[serde(flatten)]
    pub report: StatusReport,
    /// Relative to the project root.
    pub untracked: Vec<String>,
    /// `roar mount`s of the project: what their processes do now is recorded when each job ends.
    pub mounts: Vec<serde_json::Value>,
    /// Jobs still running (under `roar run` or a mount), and jobs whose roar was killed.
    pub unfinished: Vec<roar_store::Unfinished>,
}

/// The tree against the record: changed files, stale outputs, untracked files, running jobs.
pub(crate) fn report(project: &Project, store: &Store) -> anyhow::Result<Report> {
    let config = crate::config::Config::load(project)?;
    // Over a team store: this project and what is upstream of it, not every project's files.
    let plan = match project.reads_a_mirror() {
        true => store.status_plan_upstream(&project.root)?,
        false => store.status_plan(&project.root)?,
    };
    let now = look(project, store, &plan.paths());
    let report = plan.evaluate(&now);

    // Files in the tree that no job ever touched.
    let ignore = roar_store::ignore::Ignore::new(&config.ignore);
    let mut found = Vec::new();
    walk(&project.root, &ignore, &mut found)?;
    let untracked = found
        .into_iter()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| !plan.knows(p))
        .map(|p| rel_exact(&p, &project.root))
        .collect();
    Ok(Report {
        clean: report.is_clean(),
        report,
        untracked,
        mounts: crate::mount_cmd::mounts(project),
        unfinished: store.unfinished()?,
    })
}

pub fn status(exit_code: bool, json: bool) -> anyhow::Result<ExitCode> {
    let (project, store) = open()?;
    let r = report(&project, &store)?;
    let code = if exit_code && !r.clean {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    };
    if json {
        fmt::print_json(&r)?;
        return Ok(code);
    }
    let Report {
        clean,
        report,
        untracked,
        mounts,
        unfinished,
    } = r;
    let root = &project.root;
    let mut out = std::io::stdout().lock();
    if !report.changed.is_empty() {
        writeln!(
            out,
            "{} ({})",
            bold("changed since recorded"),
            report.changed.len()
        )?;
        for c in &report.changed {
            writeln!(
                out,
                "  {:<9} {}  ({} by job {})",
                format!("{}:", c.state),
                fmt::shown(&rel_exact(&c.path, root)),
                if c.made { "made" } else { "read" },
                c.job
            )?;
        }
    }
    print_stale(&mut out, &report.stale, root)?;
    if !untracked.is_empty() {
        writeln!(out, "{} ({})", bold("untracked"), untracked.len())?;
        for p in &untracked {
            writeln!(out, "  {}", fmt::shown(p))?;
        }
    }
    print_unfinished(&mut out, &unfinished)?;
    for m in &mounts {
        writeln!(
            out,
            "{} {}  (pid {}, since {}, {}): jobs running under it are recorded when they end",
            bold("mount"),
            fmt::shown(&rel_exact(m["dir"].as_str().unwrap_or_default(), root)),
            m["pid"],
            m["since"].as_str().unwrap_or_default(),
            m["state"].as_str().unwrap_or_default(),
        )?;
    }
    if clean && untracked.is_empty() {
        writeln!(out, "everything matches what roar recorded")?;
    }
    Ok(code)
}

/// The jobs (and steps) whose outputs would change if they ran again, each with why.
fn print_stale(
    out: &mut impl Write,
    stale: &[roar_store::StaleJob],
    root: &Path,
) -> anyhow::Result<()> {
    if stale.is_empty() {
        return Ok(());
    }
    let files: usize = stale.iter().map(|s| s.outputs.len()).sum();
    let of = if stale.iter().any(|s| s.step.is_some()) {
        "jobs and steps"
    } else {
        "jobs"
    };
    writeln!(
        out,
        "{} ({files} files of {} {of})",
        bold("stale outputs"),
        stale.len()
    )?;
    for s in stale {
        let causes = s
            .causes
            .iter()
            .map(|c| {
                let chain = c
                    .chain
                    .iter()
                    .map(|j| format!("job {j}"))
                    .collect::<Vec<_>>()
                    .join(" → ");
                format!(
                    "{} {} ({chain})",
                    fmt::shown(&rel_exact(&c.path, root)),
                    c.change
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        writeln!(
            out,
            "  {}  {}  ({} file{}): {causes}",
            crate::graph::title(s.job, s.step),
            fmt::shown(&s.label),
            s.outputs.len(),
            if s.outputs.len() == 1 { "" } else { "s" },
        )?;
        let shown = 3;
        for o in s.outputs.iter().take(shown) {
            writeln!(out, "      {}", fmt::shown(&rel_exact(o, root)))?;
        }
        if s.outputs.len() > shown {
            writeln!(out, "      ... {} more", s.outputs.len() - shown)?;
        }
    }
    Ok(())
}

/// Jobs still running, and jobs whose roar was killed.
fn print_unfinished(
    out: &mut impl Write,
    unfinished: &[roar_store::Unfinished],
) -> anyhow::Result<()> {
    if unfinished.is_empty() {
        return Ok(());
    }
    writeln!(out, "{} ({})", bold("not ended"), unfinished.len())?;
    for u in unfinished {
        let why = match u.status.as_str() {
            "killed" => "its recorder was killed while it ran: recorded from its journal once its processes end",
            _ => "running: its files are judged once it ends",
        };
        writeln!(
            out,
            "  job {}  {}  ({}, since {}): {why}",
            u.job,
            fmt::shown(&u.label),
            u.backend,
            fmt::time_ns(u.started_ns)
        )?;
    }
    Ok(())
}

fn walk(
    dir: &Path,
    ignore: &roar_store::ignore::Ignore,
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
