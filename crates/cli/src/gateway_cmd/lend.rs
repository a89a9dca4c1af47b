//! A running `roar gateway` lending keys to `roar run --s3` through `.roar/gateway.sock`, and
//! handing each run back the accesses made with its key.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use roar_store::Project;

use super::{socket_path, Lent, Returned, Sessions, SETTLE};

/// What a gateway needs to lend keys to runs.
pub(super) struct Lender {
    pub(super) serving: String,
    pub(super) endpoint: String,
    pub(super) region: String,
    pub(super) control: roar_gateway::Control,
    pub(super) sessions: Arc<Sessions>,
}

/// Listens on `.roar/gateway.sock` for runs that want a key; returns the socket's path, or None
/// (with a warning) if this gateway cannot offer keys: then `roar run --s3` starts its own.
pub(super) fn offer_keys(project: &Project, lender: Lender) -> Option<PathBuf> {
    let path = socket_path(project);
    if UnixStream::connect(&path).is_ok() {
        eprintln!(
            "roar: warning: another gateway already serves runs of this project through {}; `roar run --s3` keeps using that one",
            path.display()
        );
        return None;
    }
    // Nobody answers: a socket left by a gateway that was killed.
    let _ = std::fs::remove_file(&path);
    let listener = match bind_private(&path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "roar: warning: cannot offer keys to `roar run --s3` at {}: {e}; runs will start gateways of their own",
                path.display()
            );
            return None;
        }
    };
    let lender = Arc::new(lender);
    let spawned = std::thread::Builder::new()
        .name("roar-gateway-keys".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let lender = Arc::clone(&lender);
                let _ = std::thread::Builder::new()
                    .name("roar-gateway-run".into())
                    .spawn(move || lend(conn, &lender));
            }
        });
    match spawned {
        Ok(_) => Some(path),
        Err(e) => {
            eprintln!("roar: warning: cannot offer keys to `roar run --s3`: {e}");
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

/// A unix socket only its owner can connect to: a connection gets a key to the store.
fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves one run: `begin BACKEND` gets a fresh key (if this gateway serves BACKEND); `end`, once
/// the run's command is over, gets every access made with it. A run that disconnects without
/// `end` leaves its accesses to an ordinary session of the key.
fn lend(conn: UnixStream, lender: &Lender) {
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let reply = |text: String| (&conn).write_all(format!("{text}\n").as_bytes());
    match line.trim_end().strip_prefix("begin ") {
        Some(want) if want == lender.serving => {}
        // Another backend, or not a run at all: the run starts a gateway of its own.
        _ => {
            let _ = reply(
                serde_json::json!({ "error": format!("this gateway serves {}", lender.serving) })
                    .to_string(),
            );
            return;
        }
    }
    let Ok((access, secret)) = roar_gateway::random_credentials() else {
        return;
    };
    lender.sessions.lend(&access);
    lender.control.add_key(&access, &secret);
    let lent = Lent {
        endpoint: lender.endpoint.clone(),
        access_key: access.clone(),
        secret_key: secret,
        region: lender.region.clone(),
    };
    let begun = serde_json::to_string(&lent).is_ok_and(|t| reply(t).is_ok());
    line.clear();
    let ended =
        begun && matches!(reader.read_line(&mut line), Ok(n) if n > 0) && line.trim_end() == "end";
    // No new request with the key from here; the ones already verified finish and are recorded.
    lender.control.remove_key(&access);
    let settled = lender.control.settle(&access, SETTLE);
    let mut session = lender.sessions.take_back(&access);
    if ended {
        let returned = Returned {
            accesses: std::mem::take(&mut session.accesses),
            settled,
        };
        if serde_json::to_string(&returned).is_ok_and(|t| reply(t).is_ok()) {
            // The run has them now, and records them in its job.
            session.recorded();
            return;
        }
        session.accesses = returned.accesses;
    }
    lender.sessions.adopt(&access, session);
    eprintln!("roar: a run using key {access} ended without collecting its object accesses; they are recorded as that key's job");
}
