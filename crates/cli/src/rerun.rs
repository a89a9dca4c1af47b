//! `roar run @N [--set KEY=VALUE]...`: job N's command again, in its directory, with parameters
//! changed where the job took them from — its argv (`--lr 0.1`, `lr=0.1`), else a parameter file
//! it read (`params.yaml`'s `model.max_depth`). A file is never written: the version job N read,
//! with the change, is a scratch copy mounted over the file for the re-run only (a mount
//! namespace of its own), so the re-run reads it at the file's own path and the record says so.
//! The re-run is a new job, labelled `roar.rerun_of=N`, of the same name as N.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use roar_env::values::{param_file, Format};
use roar_store::{JobDetail, Role, Store};

use crate::entry::ExitCode;
use crate::fmt;
use crate::run_args::RunArgs;

/// Whether a `roar run` command line names a recorded job (`@3`, `@train`, `@train~1`).
pub fn is_rerun(command: &[OsString]) -> bool {
    command
        .first()
        .is_some_and(|c| c.as_encoded_bytes().starts_with(b"@"))
}

/// What the re-run runs: the argv, and the parameter files to show changed.
struct Plan {
    argv: Vec<String>,
    /// A parameter file job N read, and its content with every change made to it.
    files: BTreeMap<PathBuf, (Format, Vec<u8>)>,
    /// `lr=0.2 (argv)`, `model.max_depth=5 (params.yaml)`.
    said: Vec<String>,
}

pub fn rerun(args: RunArgs, json: bool) -> anyhow::Result<ExitCode> {
    let mut args = args.into_rerun();
    let reference = args.command.remove(0);
    // `roar run @N --set a=1 --set=b=2`: after @N only --set, which clap left in the command.
    let mut rest = std::mem::take(&mut args.command).into_iter();
    while let Some(a) = rest.next() {
        let a = a.to_string_lossy().into_owned();
        match a.strip_prefix("--set") {
            Some("") => args.set.push(
                rest.next()
                    .map(|v| v.to_string_lossy().into_owned())
                    .ok_or_else(|| anyhow::anyhow!("--set needs KEY=VALUE"))?,
            ),
            Some(v) if v.starts_with('=') => args.set.push(v[1..].to_owned()),
            _ => anyhow::bail!(
                "after {} only --set KEY=VALUE may follow (roar's other options go before it), not {}",
                fmt::shown(&reference.to_string_lossy()),
                fmt::shown(&a)
            ),
        }
    }
    let labels = crate::labels::parse_all(&args.label)?;
    let project = crate::project()?;
    let store = Store::open(&project.db_path())?;
    let cwd = std::env::current_dir()?;
    let name = reference.to_string_lossy();
    let id = crate::names::job_ref(&store, name[1..].as_ref(), &cwd, "")?;
    let job = store.job(id)?;
    let plan = plan(&job, &args.set, crate::values::objects_here().as_ref())?;

    // The scratch copies, under .roar/ (the same file system as the project: nothing to cross).
    let scratch = project
        .dir()
        .join("scratch")
        .join(crate::recover::new_uid());
    let mut binds = Vec::new();
    for (i, (path, (_, bytes))) in plan.files.iter().enumerate() {
        let copy = scratch.join(format!(
            "{i}-{}",
            path.file_name().unwrap_or_default().to_string_lossy()
        ));
        std::fs::create_dir_all(&scratch)?;
        std::fs::write(&copy, bytes)?;
        anyhow::ensure!(
            path.is_file(),
            "{} is not there any more: the re-run reads its changed copy at that path, which needs a file to stand in for (`roar checkout` brings the version back)",
            fmt::shown(&path.to_string_lossy())
        );
        binds.push((copy, path.clone()));
    }
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("run").args(&args.forwarded);
    if json {
        cmd.arg("--json");
    }
    if let Some(n) = args.name.clone().or_else(|| job.summary.name.clone()) {
        cmd.arg("--name").arg(n);
    }
    for (k, v) in labels.iter().filter(|(k, _)| k != "roar.rerun_of") {
        cmd.arg("--label")
            .arg(format!("{k}={}", v.as_deref().unwrap_or_default()));
    }
    cmd.arg("--label").arg(format!("roar.rerun_of={id}"));
    cmd.arg("--").args(&plan.argv).current_dir(&job.summary.cwd);
    let pairs: Vec<(&Path, &Path)> = binds
        .iter()
        .map(|(c, p)| (c.as_path(), p.as_path()))
        .collect();
    if !pairs.is_empty() {
        crate::namespace::with_binds(&mut cmd, &pairs, None)?;
    }
    eprintln!(
        "roar: running job {id} again{}{}",
        if plan.said.is_empty() { "" } else { " with " },
        fmt::shown(&plan.said.join(", "))
    );
    let status = cmd.status();
    let _ = std::fs::remove_dir_all(&scratch);
    let status = status.map_err(|e| {
        anyhow::anyhow!(
            "cannot run job {id} again: {e}{}",
            if pairs.is_empty() { "" } else { " (a changed parameter file is mounted over the file in a mount namespace: that needs root or unprivileged user namespaces)" }
        )
    })?;
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .map_or_else(|| 128 + status.signal().unwrap_or(0) as u8, |c| c as u8);
    Ok(ExitCode::from(code))
}

/// The re-run's argv and changed parameter files, each `--set` applied where job N took that
/// parameter from. Every problem is an error before anything runs.
fn plan(
    job: &JobDetail,
    sets: &[String],
    objects: Option<&roar_store::objects::Objects>,
) -> anyhow::Result<Plan> {
    let mut argv = job.summary.argv.clone();
    let mut files: BTreeMap<PathBuf, (Format, Vec<u8>)> = BTreeMap::new();
    let mut said = Vec::new();
    let params: Vec<(PathBuf, Format, String)> = job
        .files
        .iter()
        .filter(|f| f.role == Role::Input)
        .filter_map(|f| {
            let path = PathBuf::from(&f.path);
            let format = param_file(&path)?;
            Some((path, format, f.hash.as_ref()?.blake3.clone()))
        })
        .collect();
    let id = job.summary.id;
    for set in sets {
        let (key, value) = set.split_once('=').ok_or_else(|| {
            anyhow::anyhow!("--set {} has no `=`: give KEY=VALUE", fmt::shown(set))
        })?;
        // `FILE:KEY` names the file; a bare key is the argv's, else the one file that has it.
        let (file, key) = match key.rsplit_once(':') {
            Some((f, k)) => (Some(f), k),
            None => (None, key),
        };
        let mut in_argv = None;
        if file.is_none() {
            match roar_env::params::set_in_argv(&argv, key, value) {
                Ok(changed) => {
                    argv = changed;
                    said.push(format!("{key}={value} (argv)"));
                    continue;
                }
                Err(why) => in_argv = Some(why),
            }
        }
        let rel = |p: &Path| rel_to(job, p);
        let mut holders = holders(job, &params, &files, objects, file, key)?;
        match holders.len() {
            1 => {
                let (path, format, current) = holders.remove(0);
                let changed =
                    roar_env::values::set(&current, format, key, value).map_err(|why| {
                        anyhow::anyhow!("cannot set {key} in {}: {why}", fmt::shown(&rel(&path)))
                    })?;
                said.push(format!("{key}={value} ({})", rel(&path)));
                files.insert(path, (format, changed));
            }
            // The argv has it, but as a bare flag.
            0 if roar_env::params::of_argv(&argv)
                .iter()
                .any(|p| roar_env::params::same_key(&p.name, key)) =>
            {
                anyhow::bail!("job {id}: {}", in_argv.unwrap_or_default())
            }
            0 => anyhow::bail!(
                "job {id} has no parameter {}: its argv has {}; its parameter files {}",
                fmt::shown(key),
                names(
                    roar_env::params::of_argv(&argv)
                        .into_iter()
                        .map(|p| p.name)
                        .filter(|n| !n.starts_with('#'))
                ),
                if params.is_empty() {
                    "none".to_owned()
                } else {
                    names(params.iter().map(|(p, _, _)| rel(p)))
                }
            ),
            _ => anyhow::bail!(
                "{} is in more than one parameter file job {id} read: name one, as FILE:{} ({})",
                fmt::shown(key),
                fmt::shown(key),
                names(holders.iter().map(|(p, _, _)| rel(p)))
            ),
        }
    }
    Ok(Plan { argv, files, said })
}

/// `p` as job `job` named it: relative to its directory where it is below it.
fn rel_to(job: &JobDetail, p: &Path) -> String {
    p.strip_prefix(&job.summary.cwd)
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

/// The parameter files job `job` read (`params`: path, format, content hash) that set `key`
/// (only `file`, when the `--set` named one), each with its content as the re-run will see it:
/// as an earlier `--set` changed it (`files`), else the version the job read.
fn holders(
    job: &JobDetail,
    params: &[(PathBuf, Format, String)],
    files: &BTreeMap<PathBuf, (Format, Vec<u8>)>,
    objects: Option<&roar_store::objects::Objects>,
    file: Option<&str>,
    key: &str,
) -> anyhow::Result<Vec<(PathBuf, Format, Vec<u8>)>> {
    let mut holders = Vec::new();
    for (path, format, blake3) in params {
        if file.is_some_and(|f| rel_to(job, path) != f && path.to_string_lossy() != f) {
            continue;
        }
        let current = match files.get(path) {
            Some((_, bytes)) => bytes.clone(),
            None => crate::values::content(objects, path, blake3).ok_or_else(|| {
                anyhow::anyhow!(
                    "the version of {} job {} read is neither kept nor in the working tree any more",
                    fmt::shown(&rel_to(job, path)),
                    job.summary.id
                )
            })?,
        };
        if roar_env::values::read(&current, *format)
            .iter()
            .any(|(k, _)| k == key)
        {
            holders.push((path.clone(), *format, current));
        }
    }
    Ok(holders)
}

fn names(it: impl Iterator<Item = String>) -> String {
    let v: Vec<String> = it.map(|n| fmt::shown(&n).into_owned()).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}
