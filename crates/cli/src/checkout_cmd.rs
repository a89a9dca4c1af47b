//! `roar checkout REF [-o FILE]`: writes a recorded version back, from the object store, a file
//! here that has it now, or the team's bucket — its bytes checked against the hash as they are
//! copied. The version a path holds before it is overwritten is kept (and pinned) first: a
//! checkout never loses content. `roar pin`: jobs whose versions a size budget never lets go.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use roar_store::hash::{hash_paths, HashOptions, Prior};
use roar_store::objects::Objects;
use roar_store::{ContentHash, Store};

use crate::entry::ExitCode;
use crate::fmt::{self, rel};
use crate::names::{open, resolve};
use crate::NotFound;

pub fn checkout(what: &OsStr, out: Option<&Path>, json: bool) -> anyhow::Result<ExitCode> {
    let (project, store) = open()?;
    let objects = project.objects();
    let version = match resolve(&store, what) {
        Err(e) if unknown_hash(&e) => kept_only(&objects, what).ok_or(e)?,
        other => other?,
    };
    let dest = match (out, &version.path) {
        (Some(o), _) => crate::names::absolute(&std::env::current_dir()?, o),
        (None, Some(p)) => PathBuf::from(p),
        (None, None) => anyhow::bail!(
            "{} names content, not a place to put it: give -o FILE",
            fmt::shown(&what.to_string_lossy())
        ),
    };
    let want = &version.hash;
    let shown_dest = rel(&dest.to_string_lossy(), &project.root);
    let now = current(&dest);
    if now.as_ref().is_some_and(|h| h.blake3 == want.blake3) {
        report(json, &shown_dest, want, "already there")?;
        return Ok(ExitCode::SUCCESS);
    }
    let source = find(
        &store,
        &objects,
        &crate::keep::TeamObjects::new(&project),
        want,
    )?;
    // What is there now is kept before it is replaced.
    if let Some(h) = &now {
        if !objects.has(&h.blake3) {
            roar_store::hash::keep_file(&objects, &dest, false)
                .and_then(|kept| objects.pin(&kept.blake3))
                .map_err(|e| {
                    anyhow::anyhow!(
                        "cannot keep the current version of {shown_dest} before replacing it ({e}); nothing was changed"
                    )
                })?;
            eprintln!(
                "roar: kept the current {shown_dest} (blake3 {}) first; `roar checkout b3:{} -o FILE` gives it back",
                &h.blake3[..12],
                &h.blake3[..12]
            );
        }
    }
    let mode = std::fs::metadata(&dest).ok().map(|m| m.permissions());
    match source {
        Source::Kept => objects.copy_out(&want.blake3, &dest)?,
        Source::File(from) => roar_store::objects::copy_verified(&from, &want.blake3, &dest)
            .map_err(|e| {
                anyhow::anyhow!(
                    "{} changed while it was copied ({e}); nothing was changed",
                    from.display()
                )
            })?,
    }
    if let Some(mode) = mode {
        let _ = std::fs::set_permissions(&dest, mode);
    }
    report(json, &shown_dest, want, "checked out")?;
    Ok(ExitCode::SUCCESS)
}

fn unknown_hash(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<roar_store::StoreError>(),
        Some(roar_store::StoreError::UnknownHash { .. })
    )
}

/// A hash prefix no job recorded that names one kept version (one `roar checkout` kept before
/// replacing it).
fn kept_only(objects: &Objects, what: &OsStr) -> Option<roar_store::Version> {
    let s = what.to_string_lossy();
    let prefix = s.strip_prefix("b3:").unwrap_or(&s);
    let [name] = objects.find_prefix(prefix).try_into().ok()?;
    let size = std::fs::metadata(objects.path(&name)).ok()?.len();
    Some(roar_store::Version {
        path: None,
        hash: ContentHash {
            blake3: name,
            sha256: None,
            size,
        },
    })
}

fn report(json: bool, dest: &str, want: &ContentHash, what: &str) -> anyhow::Result<()> {
    if json {
        return fmt::print_json(&serde_json::json!({
            "path": dest, "blake3": want.blake3, "size": want.size, "result": what,
        }));
    }
    println!("{what} {dest}: blake3 {}", want.blake3);
    Ok(())
}

/// The hash of the regular file at `path` now, if there is one.
fn current(path: &Path) -> Option<ContentHash> {
    roar_store::hash::hash_path(path, HashOptions::default())
        .ok()
        .map(|h| h.hash)
}

/// Where the bytes of a version come from.
enum Source {
    Kept,
    File(PathBuf),
}

/// The object store, else a file here that has the content now (every path the record saw it
/// at), else the team's kept versions. None: which version is missing and where it was last seen.
fn find(
    store: &Store,
    objects: &Objects,
    team: &crate::keep::TeamObjects,
    want: &ContentHash,
) -> anyhow::Result<Source> {
    if objects.has(&want.blake3) {
        return Ok(Source::Kept);
    }
    let detail = store.artifact(want)?;
    let mut paths: Vec<PathBuf> = detail
        .made_by
        .iter()
        .chain(&detail.used_by)
        .map(|u| PathBuf::from(&u.path))
        .collect();
    paths.sort();
    paths.dedup();
    let batch = hash_paths(
        &paths,
        HashOptions::default(),
        &|_| Prior::MayBeCached,
        &|| Some(store.conn()),
        &|_| {},
    );
    for (p, r) in paths.iter().zip(&batch.results) {
        if r.as_ref().is_ok_and(|h| h.hash.blake3 == want.blake3) {
            return Ok(Source::File(p.clone()));
        }
    }
    if team.fetch(&want.blake3) {
        return Ok(Source::Kept);
    }
    let last = detail
        .made_by
        .iter()
        .chain(&detail.used_by)
        .max_by_key(|u| u.started_ns)
        .map(|u| {
            format!(
                " (last seen at {} in job {})",
                fmt::shown(&u.path),
                u.job_id
            )
        })
        .unwrap_or_default();
    Err(NotFound(format!(
        "version {} is not kept and no file here has it{last}; keep versions with [keep] in .roar/config.toml, or fetch it from the team store",
        &want.blake3[..12]
    ))
    .into())
}

/// `roar pin [--remove] JOB...`: pins (or unpins) jobs; without jobs, lists the pinned ones.
pub fn pin(jobs: &[std::ffi::OsString], remove: bool, json: bool) -> anyhow::Result<()> {
    let (project, store) = open()?;
    let objects = project.objects();
    let cwd = std::env::current_dir()?;
    for j in jobs {
        let crate::names::Target::Job(id) = crate::names::classify_in(Some(&store), j, &cwd) else {
            return Err(NotFound(format!(
                "{} is not a job (give its id, @N or name)",
                fmt::shown(&j.to_string_lossy())
            ))
            .into());
        };
        store.job(id)?;
        objects.pin_job(id, !remove)?;
    }
    let pinned: Vec<i64> = objects.pinned_jobs().into_iter().collect();
    if json {
        return fmt::print_json(&serde_json::json!({ "pinned": pinned }));
    }
    if pinned.is_empty() {
        println!("no pinned jobs");
    } else {
        let ids: Vec<String> = pinned.iter().map(|j| format!("@{j}")).collect();
        println!("pinned: {}", ids.join(" "));
    }
    Ok(())
}
