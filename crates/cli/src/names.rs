//! What the user names on the command line, resolved against the record: a job (`3`, `@3`, a
//! `--name`, `NAME~N`), a hash prefix, a path, an earlier version of a path (`PATH@JOB`,
//! `PATH~N`); and the project's store opened for answering. Every query command starts here.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

use roar_store::{Project, Store, Version};

use crate::fmt;

/// Resolves a PATH or HASH argument to the file version (or, for a hash, the content) it names;
/// `PATH@JOB` and `PATH~N` name an earlier version ([`versioned`]).
pub(crate) fn resolve(store: &Store, what: &OsStr) -> anyhow::Result<Version> {
    let cwd = std::env::current_dir()?;
    if let Some(v) = versioned(store, what, &cwd)? {
        return Ok(v);
    }
    let at = |path: PathBuf| store.version_at(&std::fs::canonicalize(&path).unwrap_or(path));
    Ok(match classify(what, &cwd) {
        Target::Hash(prefix) => Version {
            path: None,
            hash: store.resolve_hash(&prefix)?,
        },
        Target::Path(path) => at(path)?,
        Target::Job(id) => {
            // A job reference can also be a file name; only then is it meaningful here.
            let path = cwd.join(what);
            if !path.exists() {
                anyhow::bail!("{} looks like a job (job {id}); this takes a path or a hash prefix (try `roar show {}`)", fmt::shown(&what.to_string_lossy()), fmt::shown(&what.to_string_lossy()));
            }
            at(path)?
        }
    })
}

/// `PATH@JOB`: the version of PATH that job wrote (else the one it read); JOB is a job id or a
/// job's `--name` (`NAME~N`). `PATH~N`: N versions back, counting the distinct contents the
/// record holds for PATH, newest first (`PATH~0` is the newest). `None`: `what` is neither, or
/// names an existing file as it is (a file called `a@3` is that file).
pub(crate) fn versioned(
    store: &Store,
    what: &OsStr,
    cwd: &Path,
) -> anyhow::Result<Option<Version>> {
    let s = what.to_string_lossy();
    if cwd.join(what).exists() {
        return Ok(None);
    }
    let shown = || fmt::shown(&s);
    let at = |p: &str| {
        let path = crate::names::absolute(cwd, Path::new(p));
        std::fs::canonicalize(&path).unwrap_or(path)
    };
    if let Some((p, job)) = s
        .rsplit_once('@')
        .filter(|(p, j)| !p.is_empty() && !j.is_empty())
    {
        let id = match job.parse::<i64>() {
            Ok(id) => id,
            Err(_) => {
                let (name, back) = match job.rsplit_once('~') {
                    Some((n, b)) => (n, b.parse::<usize>().unwrap_or(usize::MAX)),
                    None => (job, 0),
                };
                store.job_named(name, back)?.ok_or_else(|| {
                    crate::NotFound(format!(
                        "{}: no job is named {} (give a job id, or a name from `roar log`)",
                        shown(),
                        fmt::shown(job)
                    ))
                })?
            }
        };
        let path = at(p);
        let history = store.path(&path)?.history;
        let mine: Vec<_> = history.iter().filter(|u| u.job_id == id).collect();
        let chosen = mine
            .iter()
            .find(|u| u.role == roar_store::Role::Output)
            .or_else(|| mine.iter().find(|u| u.role == roar_store::Role::Input));
        let Some(u) = chosen else {
            let jobs: Vec<String> = history.iter().map(|u| format!("@{}", u.job_id)).collect();
            return Err(crate::NotFound(format!(
                "{}: job {id} neither read nor wrote {} (jobs that did: {})",
                shown(),
                fmt::shown(p),
                jobs.join(", ")
            ))
            .into());
        };
        let hash = u.hash.clone().ok_or_else(|| {
            crate::NotFound(format!(
                "{}: job {id} used {} but its content was not recorded",
                shown(),
                fmt::shown(p)
            ))
        })?;
        return Ok(Some(Version {
            path: Some(path.to_string_lossy().into_owned()),
            hash,
        }));
    }
    let Some((p, n)) = s
        .rsplit_once('~')
        .and_then(|(p, n)| Some((p, n.parse::<usize>().ok()?)))
    else {
        return Ok(None);
    };
    let path = at(p);
    // A job name `NAME~N` is not a path the record knows.
    let Ok(detail) = store.path(&path) else {
        return Ok(None);
    };
    let mut seen = std::collections::HashSet::new();
    let newest_first: Vec<&roar_store::ContentHash> = detail
        .history
        .iter()
        .rev()
        .filter_map(|u| u.hash.as_ref())
        .filter(|h| seen.insert(h.blake3.clone()))
        .collect();
    match newest_first.get(n) {
        Some(h) => Ok(Some(Version {
            path: Some(path.to_string_lossy().into_owned()),
            hash: (*h).clone(),
        })),
        None => Err(crate::NotFound(format!(
            "{}: the record holds {} version(s) of {} (~0 to ~{})",
            shown(),
            newest_first.len(),
            fmt::shown(p),
            newest_first.len().saturating_sub(1)
        ))
        .into()),
    }
}

/// The project and its store, with environment noise (the default ignore list and the project's
/// `ignore` globs) left out of every answer unless `all`.
pub(crate) fn open_with(all: bool) -> anyhow::Result<(Project, Store)> {
    let project = crate::project()?;
    let mut store = Store::open(&project.db_path())?;
    if !all {
        let config = crate::config::Config::load(&project)?;
        store.hide(Some(roar_store::ignore::Ignore::new(&config.ignore)))?;
    }
    Ok((project, store))
}

pub(crate) fn open() -> anyhow::Result<(Project, Store)> {
    open_with(false)
}

/// What `roar show` was asked about, decided from the argument's form.
pub(crate) enum Target {
    Job(i64),
    Hash(String),
    Path(PathBuf),
}

/// `123` or `@123` is a job id, `b3:…` or 4+ hex digits a hash prefix (unless a file of that name
/// exists), `s3://bucket/key` an object, `ARCHIVE!/member` a member of an archive, `NAME` or
/// `NAME~N` a job's `--name`, else the name its script gives it (`python train.py` is `train`),
/// unless a file of that name exists; anything else a path.
pub(crate) fn classify(what: &OsStr, cwd: &Path) -> Target {
    classify_in(None, what, cwd)
}

/// [`classify`], with job names resolved against `store`.
pub(crate) fn classify_in(store: Option<&Store>, what: &OsStr, cwd: &Path) -> Target {
    let s = what.to_string_lossy();
    if let Ok(id) = s.strip_prefix('@').unwrap_or(&s).parse::<i64>() {
        return Target::Job(id);
    }
    if let Some(h) = s.strip_prefix("b3:") {
        return Target::Hash(h.to_owned());
    }
    if s.starts_with("s3://") {
        return Target::Path(PathBuf::from(what));
    }
    let path = absolute(cwd, Path::new(what));
    if path.exists() {
        return Target::Path(path);
    }
    // A member of a mounted archive, `ARCHIVE!/path/in/archive`: named in the record after the
    // archive's canonical path.
    if let Some((archive, member)) = roar_archive::split_member_path(&path) {
        let archive = std::fs::canonicalize(&archive).unwrap_or(archive);
        return Target::Path(roar_archive::member_path(&archive, &member));
    }
    let hexish = s.len() >= 4 && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    if hexish {
        return Target::Hash(s.into_owned());
    }
    if let Some(store) = store {
        let (name, back) = match s.rsplit_once('~') {
            Some((n, k)) if k.bytes().all(|b| b.is_ascii_digit()) => {
                (n, k.parse::<usize>().unwrap_or(usize::MAX))
            }
            _ => (s.as_ref(), 0),
        };
        if let Ok(Some(id)) = store.job_named(name, back) {
            return Target::Job(id);
        }
        if let Ok(Some(id)) = store.job_by_default_name(name, back, roar_env::params::default_name)
        {
            return Target::Job(id);
        }
    }
    Target::Path(path)
}

/// The recorded job `what` names (`3`, `@3`, a name, `NAME~N`); else a one-line error ending
/// with `then`.
pub(crate) fn job_ref(store: &Store, what: &OsStr, cwd: &Path, then: &str) -> anyhow::Result<i64> {
    if let Target::Job(id) = classify_in(Some(store), what, cwd) {
        if store.job(id).is_ok() {
            return Ok(id);
        }
    }
    Err(crate::NotFound(format!(
        "{} is not a recorded job (give an id, `@ID`, a job name or `NAME~N`; `roar log` lists them){then}",
        fmt::shown(&what.to_string_lossy())
    ))
    .into())
}

/// `path` made absolute against `cwd` and lexically normalised (no filesystem access).
pub fn absolute(cwd: &Path, path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in cwd.join(path).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
