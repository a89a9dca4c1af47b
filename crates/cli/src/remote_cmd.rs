//! `roar remote` (the team stores a project pushes to), `roar push`, the push in the background
//! after each `roar run`, and `--remote` on query commands (which read a mirror of the team
//! store brought up to date first). The team store itself: the roar-team crate.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::Context;
use clap::Subcommand;
use roar_store::Project;
use roar_team::{self as team, Remote};

use crate::config::Config;
use crate::entry::ExitCode;

#[derive(Subcommand)]
pub enum RemoteCommand {
    /// Add a team store: `roar remote add origin postgres://USER@HOST:PORT/DATABASE`. The
    /// password comes from PGPASSWORD or ~/.pgpass, never from the URL. Every `roar run` then
    /// pushes its job in the background (`--no-auto-push` to push only with `roar push`).
    Add {
        name: String,
        url: String,
        #[arg(long)]
        no_auto_push: bool,
    },
    /// The team stores, with how many local jobs each does not hold yet.
    List,
    /// Forget a team store and its local mirror; the team store itself is not touched.
    Remove { name: String },
}

pub fn remote(command: RemoteCommand, json: bool) -> anyhow::Result<ExitCode> {
    let project = crate::project()?;
    match command {
        RemoteCommand::Add {
            name,
            url,
            no_auto_push,
        } => add(&project, &name, &url, no_auto_push, json)?,
        RemoteCommand::List => list(&project, json)?,
        RemoteCommand::Remove { name } => remove(&project, &name, json)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn add(
    project: &Project,
    name: &str,
    url: &str,
    no_auto_push: bool,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "{name:?} is not a remote name; use letters, digits, - and _"
    );
    Remote::check_url(url).map_err(|why| anyhow::anyhow!(why))?;
    let mut doc = crate::config_cmd::document(project)?;
    if !doc.contains_table("remotes") {
        let mut table = toml_edit::Table::new();
        table.set_implicit(true);
        doc.insert("remotes", toml_edit::Item::Table(table));
    }
    anyhow::ensure!(
        doc["remotes"].get(name).is_none(),
        "a remote {name:?} exists already; `roar remote remove {name}` first"
    );
    let mut table = toml_edit::Table::new();
    table["url"] = toml_edit::value(url);
    if no_auto_push {
        table["auto_push"] = toml_edit::value(false);
    }
    doc["remotes"][name] = toml_edit::Item::Table(table);
    crate::config_cmd::write_document(project, &doc)?;
    if json {
        crate::fmt::print_json(&serde_json::json!({"name": name, "url": url}))?;
    } else {
        eprintln!(
            "roar: added remote {name} ({url}); `roar push` sends the jobs recorded so far{}",
            if no_auto_push {
                ""
            } else {
                ", and every `roar run` pushes its job in the background"
            }
        );
    }
    Ok(())
}

fn list(project: &Project, json: bool) -> anyhow::Result<()> {
    let config = Config::load(project)?;
    let conn = roar_store::open(&project.db_path(), false)?;
    let mut rows = Vec::new();
    for name in config.remotes.keys() {
        let r = config.remote(name).expect("listed");
        let waiting = team::unpushed_count(&conn, &r).unwrap_or(0);
        rows.push(serde_json::json!({
            "name": name, "url": r.url, "unpushed": waiting,
            "auto_push": config.remotes[name].auto_push,
            "last_error": last_error(project, &r),
        }));
    }
    if json {
        crate::fmt::print_json(&rows)?;
    } else if rows.is_empty() {
        println!("no remotes; `roar remote add origin postgres://USER@HOST:PORT/DATABASE` adds a team store");
    } else {
        for r in &rows {
            print!(
                "{}  {}  {} job(s) not pushed yet",
                r["name"].as_str().unwrap_or_default(),
                r["url"].as_str().unwrap_or_default(),
                r["unpushed"]
            );
            match r["last_error"].as_str() {
                Some(e) => println!("  (last background push failed: {e})"),
                None => println!(),
            }
        }
    }
    Ok(())
}

fn remove(project: &Project, name: &str, json: bool) -> anyhow::Result<()> {
    let config = Config::load(project)?;
    let Some(r) = config.remote(name) else {
        anyhow::bail!("no remote {name:?}; `roar remote list` shows them");
    };
    let mut doc = crate::config_cmd::document(project)?;
    if let Some(t) = doc.get_mut("remotes").and_then(|t| t.as_table_mut()) {
        t.remove(name);
    }
    crate::config_cmd::write_document(project, &doc)?;
    let mirror = team::mirror_path(&project.dir(), &r);
    for suffix in ["", "-wal", "-shm"] {
        let mut p = mirror.clone().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
    if !json {
        eprintln!("roar: removed remote {name}; the team store itself is untouched");
    }
    Ok(())
}

/// The remotes a command names: `--remote NAME`, or every configured one.
fn chosen(config: &Config, name: Option<&str>) -> anyhow::Result<Vec<Remote>> {
    match name {
        Some(n) => Ok(vec![config.remote(n).ok_or_else(|| {
            anyhow::anyhow!("no remote {n:?}; `roar remote add {n} postgres://USER@HOST:PORT/DATABASE` adds it")
        })?]),
        None if config.remotes.is_empty() => anyhow::bail!(
            "no remotes; `roar remote add origin postgres://USER@HOST:PORT/DATABASE` adds a team store"
        ),
        None => Ok(config
            .remotes
            .keys()
            .filter_map(|n| config.remote(n))
            .collect()),
    }
}

fn error_file(project: &Project, r: &Remote) -> PathBuf {
    project
        .dir()
        .join("remotes")
        .join(format!("{}.push-error", r.name))
}

fn last_error(project: &Project, r: &Remote) -> Option<String> {
    std::fs::read_to_string(error_file(project, r))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// `roar push`: sends every finished local job each chosen remote does not hold yet. One push
/// at a time per project (`push.lock`). `background`: the pusher roar starts after recording a
/// job ([`push_in_background`]); it leaves its failure in `.roar/remotes/NAME.push-error` (shown
/// by `roar remote list`) instead of printing it, and lingers ([`linger`]).
pub fn push(name: Option<&str>, background: bool, json: bool) -> anyhow::Result<ExitCode> {
    let project = crate::project()?;
    let config = Config::load(&project)?;
    let remotes = chosen(&config, name)?;
    let dir = project.dir().join("remotes");
    roar_store::private::create_dir(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let lock_path = dir.join("push.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("cannot open {}", lock_path.display()))?;
    let mut out = Vec::new();
    let mut pass = || -> anyhow::Result<Option<roar_store::StoreError>> {
        lock.lock()
            .with_context(|| format!("cannot lock {}", lock_path.display()))?;
        let failed = push_once(&project, &config, &remotes, background, json, &mut out);
        let _ = lock.unlock();
        Ok(failed)
    };
    if background {
        linger(&project, &mut pass)?;
        return Ok(ExitCode::SUCCESS);
    }
    let failed = pass()?;
    if json {
        crate::fmt::print_json(&out)?;
    }
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// How long the background pusher waits for the next job before it exits.
const LINGER: std::time::Duration = std::time::Duration::from_secs(60);

/// The socket the project's background pusher listens on while it lingers: in `.roar/remotes/`,
/// which only the project's owner can reach (0700).
fn push_socket(project: &Project) -> PathBuf {
    project.dir().join("remotes").join("push.sock")
}

/// Tells a lingering background pusher that a job was recorded; false if none listens.
fn notify(project: &Project) -> bool {
    std::os::unix::net::UnixDatagram::unbound()
        .and_then(|s| s.send_to(b"job", push_socket(project)))
        .is_ok()
}

/// The background pusher: pushes, then waits for the next recorded job (a datagram on the
/// project's push socket) and pushes again, until nothing came for [`LINGER`]. So a `roar run`
/// only sends a datagram when a pusher lingers, and starts a process only when none does. On
/// its way out it removes the socket first and pushes once more: a job recorded before a run
/// found the socket gone is pushed by this pass, one recorded after it by the pusher that run
/// starts. A second pusher started meanwhile hands over to the first and exits; where no socket
/// can be made (a path too long for one), each pusher pushes once and exits.
fn linger(
    project: &Project,
    pass: &mut dyn FnMut() -> anyhow::Result<Option<roar_store::StoreError>>,
) -> anyhow::Result<()> {
    let path = push_socket(project);
    let mut bound = std::os::unix::net::UnixDatagram::bind(&path);
    if matches!(&bound, Err(e) if e.kind() == std::io::ErrorKind::AddrInUse) {
        if notify(project) {
            return Ok(()); // a pusher lingers: it has the job now
        }
        // Left by a pusher that was killed.
        let _ = std::fs::remove_file(&path);
        bound = std::os::unix::net::UnixDatagram::bind(&path);
    }
    let Ok(sock) = bound else {
        pass()?;
        return Ok(());
    };
    sock.set_read_timeout(Some(LINGER))?;
    let mut buf = [0u8; 16];
    loop {
        pass()?;
        if sock.recv(&mut buf).is_err() {
            break;
        }
        // Jobs recorded while this pass runs come as datagrams too: one pass serves them all.
        sock.set_nonblocking(true)?;
        while sock.recv(&mut buf).is_ok() {}
        sock.set_nonblocking(false)?;
    }
    let _ = std::fs::remove_file(&path);
    drop(sock);
    pass()?;
    Ok(())
}

/// One pass over the remotes; the first failure, if any.
fn push_once(
    project: &Project,
    config: &Config,
    remotes: &[Remote],
    background: bool,
    json: bool,
    out: &mut Vec<serde_json::Value>,
) -> Option<roar_store::StoreError> {
    let host = roar_env::runtime::hostname();
    let mut failed = None;
    for r in remotes {
        if background && !config.remotes[&r.name].auto_push {
            continue;
        }
        let started = std::time::Instant::now();
        let pushed = team::push(&project.db_path(), r, host.as_deref()).and_then(|p| {
            crate::keep::push_objects(project, &r.name, &config.remotes[&r.name])
                .map(|objects| (p, objects))
                .map_err(|e| roar_store::StoreError::Team(format!("{e:#}")))
        });
        match pushed {
            Ok((p, objects)) => {
                let _ = std::fs::remove_file(error_file(project, r));
                out.push(serde_json::json!({
                    "remote": r.name, "new": p.new, "already_there": p.known, "files": p.files,
                    "objects": objects,
                    "seconds": started.elapsed().as_secs_f64(),
                }));
                if !json && !background {
                    eprintln!(
                        "roar: pushed {} job(s) ({} file records{}) to {}{}",
                        p.new,
                        p.files,
                        if objects > 0 {
                            format!(", {objects} kept versions")
                        } else {
                            String::new()
                        },
                        r.name,
                        if p.known > 0 {
                            format!("; {} were there already", p.known)
                        } else {
                            String::new()
                        }
                    );
                }
            }
            Err(e) => {
                if background {
                    let _ = std::fs::write(error_file(project, r), format!("{e}\n"));
                }
                failed.get_or_insert(e);
            }
        }
    }
    failed
}

/// After a job was recorded (`roar run`, the gateway, the mount): wakes the project's lingering
/// background pusher, or starts one (`roar push --background`: detached, its own process group,
/// no terminal, output discarded) when none lingers. Never waits for the push. A failure to
/// start it changes nothing: the job is pushed by the next push.
pub fn push_in_background(project: &Project, config: &Config) {
    if !config.remotes.values().any(|r| r.auto_push) || notify(project) {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut cmd = Command::new(exe);
    cmd.args(["push", "--background"])
        .current_dir(&project.root)
        .env("ROAR_DIR", project.dir())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    let _ = cmd.spawn();
}

/// For producers that record jobs as they end while they run (the mount daemon): starts a
/// thread that looks at the store every two seconds and starts a background push whenever a job
/// was added or ended since it last looked. Nothing when no remote pushes automatically.
pub fn push_as_jobs_end(project: &Project, config: &Config) {
    if !config.remotes.values().any(|r| r.auto_push) {
        return;
    }
    let (project, config) = (project.clone(), config.clone());
    let revision = move |p: &Project| {
        roar_store::Store::open(&p.db_path())
            .and_then(|s| s.revision())
            .ok()
    };
    // Taken now, before the producer records anything.
    let mut seen = revision(&project);
    let _ = std::thread::Builder::new()
        .name("roar-push-watch".into())
        .spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_secs(2));
            let now = revision(&project);
            if now.is_some() && now != seen {
                push_in_background(&project, &config);
                seen = now;
            }
        });
}

/// How often `roar ui --remote` reads what the team store received.
const UI_FETCH: std::time::Duration = std::time::Duration::from_secs(3);

/// `roar ui --remote NAME`: a thread that brings the mirror up to date every few seconds for as
/// long as the page is served (the page's own watch on the mirror then shows new jobs live). A
/// failed read is tried again at the next tick.
pub fn keep_reading(project: &Project, name: &str) -> anyhow::Result<()> {
    let config = Config::load(project)?;
    let r = chosen(&config, Some(name))?.remove(0);
    let mirror = team::mirror_path(&project.dir(), &r);
    std::thread::Builder::new()
        .name("roar-remote-read".into())
        .spawn(move || {
            // Said once per outage, not at every tick.
            let mut failing = false;
            loop {
                std::thread::sleep(UI_FETCH);
                match team::fetch(&mirror, &r) {
                    Ok(_) if failing => {
                        failing = false;
                        eprintln!("roar: the team store {} is back", r.name);
                    }
                    Ok(_) => {}
                    Err(e) if !failing => {
                        failing = true;
                        eprintln!("roar: warning: {e}; the page shows what was read before");
                    }
                    Err(_) => {}
                }
            }
        })?;
    Ok(())
}

/// `--remote NAME` on a query command: the mirror of that team store, brought up to date. If
/// the team store cannot be reached, a mirror read before answers, with a warning saying so;
/// never one that was not read (or a store that refused to be read: that is no outage).
pub fn reading_remote(project: Project, name: &str) -> anyhow::Result<Project> {
    let config = Config::load(&project)?;
    let r = chosen(&config, Some(name))?.remove(0);
    let mirror = team::mirror_path(&project.dir(), &r);
    if let Err(e) = team::fetch(&mirror, &r) {
        if matches!(e, roar_store::StoreError::Team(_)) && !team::was_read(&mirror, &r) {
            anyhow::bail!("{e}; no copy of it was read before, so nothing can answer");
        }
        // Written at every read: the database, or its WAL until a checkpoint.
        let synced = ["", "-wal"]
            .iter()
            .filter_map(|suffix| {
                let mut p = mirror.clone().into_os_string();
                p.push(suffix);
                std::fs::metadata(p).and_then(|m| m.modified()).ok()
            })
            .max();
        match synced {
            Some(at) if matches!(e, roar_store::StoreError::Team(_)) => {
                let ns = at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as i64);
                eprintln!(
                    "roar: warning: {e}; answering from the copy read {}",
                    crate::fmt::time_ns(ns)
                );
            }
            _ => return Err(e.into()),
        }
    }
    Ok(project.reading(mirror))
}
