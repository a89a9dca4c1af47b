//! `roar mount DIR`, `roar mount ARCHIVE... DIR`, `roar mount --list`, `roar unmount DIR`: the
//! roarfs daemon's lifecycle.
//!
//! Archives are indexed (or their index reused) here, in the foreground with a progress bar,
//! before the daemon starts; the daemon then finds every index current.
//!
//! `roar mount DIR` starts itself again as `roar mount DIR --foreground` in its own process group,
//! with stdout a pipe on which the daemon says "ready" (or why not) once the mount is in place, and
//! stderr appended to `.roar/mounts/<tag>.log`. The daemon writes `.roar/mounts/<tag>.json` (dir,
//! pid) while it runs; `roar unmount` sends it SIGTERM and waits for it to record its jobs and exit.

use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use roar_roarfs::archive::Layer;
use roar_store::Project;
use serde::{Deserialize, Serialize};

use crate::entry::ExitCode;
use crate::mount_served::{cpu_ms, requests_path, served_line, write_requests};
use crate::mountinfo::{is_dead, is_roarfs_mount};
use roar_store::error_chain;

mod state;

pub(crate) use archives::index_dir;
use archives::*;
use state::*;
mod archives;

#[derive(clap::Args)]
pub struct MountArgs {
    /// `DIR`: mount over that directory in place (its contents stay where they are) and record
    /// every file read and written under it. `ARCHIVE... DIR`: mount archives (tar, tar.gz,
    /// tar.zst, tar.xz, tar.bz2, zip) read-only on DIR as one tree, recording which members each
    /// job reads; a folder among them is a layer of that tree too (later ones win).
    #[arg(required_unless_present = "list", value_name = "[ARCHIVE...] DIR")]
    paths: Vec<PathBuf>,
    /// Also mount the archives found inside the archives (members named .tar, .tar.gz, .tgz,
    /// .tar.zst, .tar.xz, .tar.bz2, .zip, ...), each as a directory of its name, up to 8 levels:
    /// `data.tar.gz!/shards/0.tar!/x.jpg`.
    #[arg(long, short = 'r', conflicts_with = "list")]
    recursive: bool,
    /// Stay in the foreground (for debugging); Ctrl-C unmounts.
    #[arg(long, conflicts_with = "list")]
    foreground: bool,
    /// List the active mounts of this project.
    #[arg(long)]
    list: bool,
}

pub fn mount(args: MountArgs, json: bool) -> anyhow::Result<ExitCode> {
    let project = crate::project()?;
    if args.list {
        return list(&project, json);
    }
    let (dir, archives) = args.paths.split_last().expect("clap requires DIR");
    let dir = absolute(dir)?;
    // A config error is reported here, not by the daemon.
    crate::config::Config::load(&project)?;
    if clear_dead(&dir, &project)? {
        // The killed daemon's jobs, now that their files can be read.
        crate::recover::pending(&project);
    }
    let dir = mount_point(&project, &dir, !archives.is_empty())?;
    let indexes = if archives.is_empty() {
        warn_processes_inside(&dir);
        Vec::new()
    } else {
        index_archives(&project, &dir, archives, args.recursive)?
    };
    let archives: Vec<PathBuf> = indexes.iter().map(|g| g.path().to_owned()).collect();
    if args.foreground {
        return foreground(&project, &dir, indexes, args.recursive);
    }
    drop(indexes);
    std::fs::create_dir_all(state_dir(&project))?;
    let log = state_dir(&project).join(format!("{}.log", tag(&dir)));
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)?;
    let (reader, writer) = std::io::pipe()?;
    let mut child = Command::new(std::env::current_exe()?)
        .arg("mount")
        .arg("--foreground")
        .args(args.recursive.then_some("--recursive"))
        .args(&archives)
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(log_file)
        .env("ROAR_INTERNAL_MOUNT_DAEMON", "1")
        .process_group(0)
        .spawn()
        .context("cannot start the roarfs daemon")?;
    let mut line = String::new();
    std::io::BufReader::new(reader).read_line(&mut line)?;
    match line.trim_end().strip_prefix("ready ") {
        Some(ready) => {
            tell_mounted(ready, &dir, &archives, json)?;
            Ok(ExitCode::SUCCESS)
        }
        None => {
            let _ = child.wait();
            let why = line
                .trim_end()
                .strip_prefix("error: ")
                .unwrap_or("the daemon exited");
            anyhow::bail!(
                "cannot mount {}: {why} (log: {})",
                dir.display(),
                log.display()
            )
        }
    }
}

/// The directory to mount on, checked: made if an archive is mounted there, a directory, not
/// mounted by roar already, and not holding the store (which must never live on the mount it
/// records). Its canonical path.
fn mount_point(project: &Project, dir: &Path, archive: bool) -> anyhow::Result<PathBuf> {
    if archive && !dir.exists() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the mount point {}", dir.display()))?;
    }
    let meta =
        std::fs::metadata(dir).with_context(|| format!("cannot mount on {}", dir.display()))?;
    anyhow::ensure!(
        meta.is_dir(),
        "{} is not a directory{}",
        dir.display(),
        if !archive && meta.is_file() {
            "; to mount an archive, name the directory to mount it on: `roar mount ARCHIVE DIR`"
        } else {
            ""
        }
    );
    let dir = std::fs::canonicalize(dir)?;
    anyhow::ensure!(
        !is_roarfs_mount(&dir),
        "{} is already mounted by roar; `roar unmount {}` first",
        dir.display(),
        dir.display()
    );
    // The store must never live on the mount it records.
    anyhow::ensure!(
        !project.dir().starts_with(&dir),
        "the store {} is inside {}; mount a directory that does not contain .roar/",
        project.dir().display(),
        dir.display()
    );
    Ok(dir)
}

/// Tells the user (or, with `--json`, a program) what the daemon's `ready PID SCHEME
/// TRANSPORT` line says was mounted.
fn tell_mounted(ready: &str, dir: &Path, archives: &[PathBuf], json: bool) -> anyhow::Result<()> {
    let mut words = ready.split(' ');
    let (pid, scheme, transport) = (
        words.next().unwrap_or(""),
        words.next().unwrap_or(""),
        words.next().unwrap_or(""),
    );
    if json {
        crate::fmt::print_json(&serde_json::json!({
            "dir": dir, "pid": pid.parse::<i64>().ok(), "inodes": scheme,
            "transport": transport, "archives": archives
        }))?;
    } else if !archives.is_empty() {
        eprintln!(
            "roar: mounted {} archive(s) or folder(s) read-only on {} (daemon pid {pid}); every member a job reads is recorded as its input; `roar unmount {}` to stop",
            archives.len(),
            dir.display(),
            dir.display()
        );
    } else {
        let mut how = match scheme {
            "path-fds" => ", one descriptor per known inode: this filesystem has no file handles",
            _ => "",
        }
        .to_owned();
        if transport == "io_uring" {
            how.push_str(", requests over io_uring");
        } else if std::env::var_os("ROAR_MOUNT_URING").is_some_and(|v| v == "1") {
            eprintln!("roar: warning: ROAR_MOUNT_URING=1 but the kernel does not offer FUSE over io_uring (Linux 6.14+ with /sys/module/fuse/parameters/enable_uring set to Y): requests go through /dev/fuse");
        }
        eprintln!(
            "roar: mounted {} (daemon pid {pid}{how}); every file opened through it is recorded; `roar unmount {}` to stop",
            dir.display(),
            dir.display()
        );
    }
    Ok(())
}

fn warn_processes_inside(dir: &Path) {
    let inside = roar_roarfs::sys::processes_inside(dir);
    if !inside.is_empty() {
        let list: Vec<String> = inside
            .iter()
            .take(5)
            .map(|(pid, comm)| format!("{pid} ({comm})"))
            .collect();
        eprintln!(
            "roar: warning: {} process(es) have their working directory inside {} and will bypass the mount until they leave it: {}",
            inside.len(),
            dir.display(),
            list.join(", ")
        );
    }
}

fn foreground(
    project: &Project,
    dir: &Path,
    archives: Vec<Given>,
    recursive: bool,
) -> anyhow::Result<ExitCode> {
    let daemon = std::env::var_os("ROAR_INTERNAL_MOUNT_DAEMON").is_some();
    let state = state_path(project, dir);
    let config = crate::config::Config::load(project)?;
    let ignore = roar_store::ignore::Ignore::new(&config.ignore);
    let machine = Some(roar_env::machine(&roar_env::Cache::open()));
    let archive_paths: Vec<PathBuf> = archives.iter().map(|g| g.path().to_owned()).collect();
    let db = project.db_path();
    crate::remote_cmd::push_as_jobs_end(project, &config);
    let journals = Some((project.journal_dir(), config.policy()));
    // The versions jobs read and leave are kept by the rule `roar run` keeps by (`[keep]`).
    let keep = crate::keep::Rule::new(&config.keep, project).for_mount();
    let mount = || {
        if archives.is_empty() {
            let steps =
                roar_tracer::steps::Rule::new(config.steps.drivers.iter().map(String::as_str));
            return roar_roarfs::mount(dir, &db, ignore, machine, steps, journals, keep);
        }
        let mut sources = Vec::new();
        for given in archives {
            sources.extend(place(project, given, recursive)?);
        }
        roar_roarfs::mount_archives(sources, dir, &db, ignore, machine, journals)
    };
    let requests = requests_path(&state);
    let mut served = 0;
    let tick = |stats: &roar_roarfs::Stats| write_requests(&requests, stats, &mut served);
    let result = roar_roarfs::serve(
        dir,
        mount,
        |r| {
            let mut out = std::io::stdout();
            match r {
                Ok((scheme, transport)) => {
                    let s = State {
                        dir: dir.to_owned(),
                        pid: std::process::id() as i32,
                        started_ns: roar_store::now_ns(),
                        archives: archive_paths.clone(),
                    };
                    let _ = std::fs::create_dir_all(state_dir(project));
                    let _ = std::fs::write(&state, serde_json::to_vec(&s).unwrap_or_default());
                    if daemon {
                        let _ = writeln!(out, "ready {} {scheme} {transport}", std::process::id());
                    } else {
                        eprintln!(
                            "roar: mounted {} in the foreground; Ctrl-C unmounts",
                            dir.display()
                        );
                    }
                }
                Err(e) => {
                    if daemon {
                        let _ = writeln!(out, "error: {}", error_chain(e));
                    }
                }
            }
            let _ = out.flush();
            if daemon {
                // Nothing else goes to the parent's pipe: it returns as soon as it has this line.
                roar_roarfs::sys::dup_stderr_to_stdout();
            }
        },
        tick,
    );
    // A mount detached by `--force` may have been mounted again meanwhile: its state is not ours.
    if read_state(&state).is_some_and(|s| s.pid == std::process::id() as i32) {
        let _ = std::fs::remove_file(&state);
        let _ = std::fs::remove_file(&requests);
    }
    let ids = result?;
    crate::remote_cmd::push_in_background(project, &config);
    eprintln!(
        "roar: unmounted {}; {} job(s) recorded",
        dir.display(),
        ids.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// The project's mounts as their state files describe them, with how each one is doing.
pub(crate) fn mounts(project: &Project) -> Vec<serde_json::Value> {
    let mut mounts = Vec::new();
    if let Ok(entries) = std::fs::read_dir(state_dir(project)) {
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "json") {
                if let Some(s) = read_state(&e.path()) {
                    let state = if !alive(s.pid) {
                        "dead (daemon gone; `roar mount` or `roar unmount` clears it)"
                    } else if is_roarfs_mount(&s.dir) {
                        "active"
                    } else {
                        "starting or stopping"
                    };
                    let served = std::fs::read(requests_path(&e.path()))
                        .ok()
                        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
                    mounts.push(serde_json::json!({
                        "dir": s.dir, "pid": s.pid, "since": crate::fmt::time_ns(s.started_ns), "state": state,
                        "archives": s.archives, "served": served, "daemon_cpu_ms": cpu_ms(s.pid)
                    }));
                }
            }
        }
    }
    mounts
}

fn list(project: &Project, json: bool) -> anyhow::Result<ExitCode> {
    let mounts = mounts(project);
    if json {
        crate::fmt::print_json(&mounts)?;
    } else if mounts.is_empty() {
        println!(
            "no active mounts; `roar mount DIR` records everything read and written under DIR"
        );
    } else {
        for m in &mounts {
            let archives: Vec<&str> = m["archives"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            println!(
                "{}  pid {}  since {}  {}{}",
                m["dir"].as_str().unwrap_or_default(),
                m["pid"],
                m["since"].as_str().unwrap_or_default(),
                m["state"].as_str().unwrap_or_default(),
                if archives.is_empty() {
                    String::new()
                } else {
                    format!("  archives: {}", archives.join(", "))
                }
            );
            if let Some(line) = served_line(m) {
                println!("  {line}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn unmount(dir: &Path, force: bool, json: bool) -> anyhow::Result<ExitCode> {
    let project = crate::project()?;
    let dir = absolute(dir)?;
    let state_file = state_path(&project, &dir);
    let state = read_state(&state_file);
    if let Some(s) = state.as_ref().filter(|s| alive(s.pid)) {
        let writers = roar_roarfs::sys::writers_under(&dir, s.pid);
        if !writers.is_empty() && !force {
            let mut pids: Vec<String> = writers
                .iter()
                .map(|w| format!("{} ({}: {})", w.pid, w.comm, w.path.display()))
                .collect();
            pids.dedup();
            anyhow::bail!(
                "cannot unmount {}: files under it are open for writing by {}; let them finish, or `roar unmount --force {}` to detach it now (open files keep working and are recorded when they close)",
                dir.display(),
                pids.join(", "),
                dir.display()
            );
        }
        for h in roar_roarfs::sys::cwds_under(&dir, s.pid) {
            eprintln!(
                "roar: process {} ({}) has its working directory in {}: the mount is detached and that directory reads as disconnected for it",
                h.pid,
                roar_store::shown(&h.comm),
                roar_store::shown(&h.path.to_string_lossy())
            );
        }
        roar_roarfs::sys::terminate(s.pid);
        if force && !writers.is_empty() {
            // The daemon detaches the mount and serves the open files until they close.
            let deadline = Instant::now() + Duration::from_secs(60);
            while is_roarfs_mount(&dir) && alive(s.pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            anyhow::ensure!(
                !is_roarfs_mount(&dir),
                "the roarfs daemon (pid {}) did not detach {} within 60 s",
                s.pid,
                dir.display()
            );
            if json {
                crate::fmt::print_json(&serde_json::json!({
                    "dir": dir, "state": "detached", "pid": s.pid, "open_writers": writers.len()
                }))?;
            } else {
                eprintln!(
                    "roar: detached {}; the daemon (pid {}) records the remaining jobs once {} open file(s) are closed",
                    dir.display(),
                    s.pid,
                    writers.len()
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while alive(s.pid) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the roarfs daemon (pid {}) did not exit within 60 s; see {}",
                s.pid,
                state_dir(&project)
                    .join(format!("{}.log", tag(&dir)))
                    .display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(&state_file);
        if json {
            crate::fmt::print_json(&serde_json::json!({
                "dir": dir, "state": "unmounted", "pid": s.pid
            }))?;
        } else {
            eprintln!(
                "roar: unmounted {}; its jobs are recorded (`roar log`)",
                dir.display()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if clear_dead(&dir, &project)? {
        crate::recover::pending(&project);
        return Ok(ExitCode::SUCCESS);
    }
    let _ = std::fs::remove_file(&state_file);
    anyhow::bail!(
        "{} is not mounted by roar (`roar mount --list` shows the mounts)",
        dir.display()
    )
}
