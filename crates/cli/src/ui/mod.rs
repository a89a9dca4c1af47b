//! `roar ui`: the lineage graph as a web page, served on 127.0.0.1 over the project's store.
//!
//! Every request needs the random token printed in the URL (`?token=`, or `Authorization: Bearer`):
//! the port is reachable by every local user, the store is not theirs to read. The API answers
//! with the JSON of the matching command (`/api/dag` = `roar dag --json`, `/api/job/ID` = `roar
//! show ID --json`, `/api/status` = `roar status --json`, `/api/diff?a=&b=` = `roar diff A B
//! --json`); `/api/events` is a server-sent event stream that says when jobs were added, ended or
//! removed, so the page redraws while it is open. The page itself is in `page.rs`.

pub mod page;

use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use roar_store::{Project, Store};
use tokio::sync::watch;

/// How often the store is asked whether jobs changed (one aggregate query on the jobs table).
const POLL: Duration = Duration::from_millis(500);
/// A comment line on idle event streams, so closed pages are noticed and proxies keep them open.
const HEARTBEAT: Duration = Duration::from_secs(15);

type Body = BoxBody<Bytes, Infallible>;

struct State {
    project: Project,
    token: String,
    /// The page, built once (its data is fetched).
    page: String,
    csp: String,
    /// Bumped when the store's jobs change.
    revision: watch::Receiver<u64>,
}

/// 128 random bits, hex: the kernel's random source, as `getrandom(2)` gives it.
fn token() -> anyhow::Result<String> {
    let mut buf = [0u8; 16];
    #[allow(unsafe_code)]
    // SAFETY: getrandom writes at most `buf.len()` bytes into the buffer we own.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    anyhow::ensure!(
        n == buf.len() as isize,
        "cannot read random bytes for the access token: {}",
        std::io::Error::last_os_error()
    );
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

pub fn serve(port: u16, json: bool) -> anyhow::Result<()> {
    let project = crate::project()?;
    // Fails here, with the store's own message, rather than on the first request.
    drop(open(&project)?);
    let root = project.root.to_string_lossy().into_owned();
    let config = page::Config {
        mode: "server",
        root: &root,
        collapse_at: crate::graph::COLLAPSE_AT,
        generated_ns: None,
    };
    let page = page::html(&config, None)?;
    // The page runs only its own inline code and talks only to this server; no one frames it.
    let csp = format!("{}; frame-ancestors 'none'", page::csp(&config));
    let token = token()?;
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).map_err(|e| {
        anyhow::anyhow!("cannot listen on 127.0.0.1:{port}: {e} (choose another with --port N, or --port 0 for any free port)")
    })?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let url = format!("http://{addr}/?token={token}");
    // Whoever started us may stop reading our output (a pipe closed): the server goes on.
    let said = if json {
        serde_json::to_string(&serde_json::json!({ "url": url, "port": addr.port() }))
    } else {
        Ok(format!("roar ui: open {url}\n(127.0.0.1 only; the token keeps other local users out; Ctrl-C stops)"))
    }?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{said}").and_then(|()| out.flush());
    }

    let (tx, rx) = watch::channel(0u64);
    let watcher = project.clone();
    std::thread::Builder::new()
        .name("roar-ui-watch".into())
        .spawn(move || watch_store(&watcher, &tx))?;
    let state = Arc::new(State {
        project,
        token,
        page,
        csp,
        revision: rx,
    });
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async { accept(tokio::net::TcpListener::from_std(listener)?, state).await })
}

fn open(project: &Project) -> anyhow::Result<Store> {
    let mut store = Store::open(&project.db_path())?;
    let config = crate::config::Config::load(project)?;
    store.hide(Some(roar_store::ignore::Ignore::new(&config.ignore)))?;
    Ok(store)
}

/// Polls the jobs table's revision and publishes each change; ends when the server does.
fn watch_store(project: &Project, tx: &watch::Sender<u64>) {
    let Ok(store) = Store::open(&project.db_path()) else {
        return;
    };
    let mut last = store.revision().ok();
    let mut n = 0u64;
    loop {
        std::thread::sleep(POLL);
        let now = store.revision().ok();
        if now != last {
            last = now;
            n += 1;
            if tx.send(n).is_err() {
                return;
            }
        }
    }
}

async fn accept(listener: tokio::net::TcpListener, state: Arc<State>) -> anyhow::Result<()> {
    let shutdown = tokio::signal::ctrl_c();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = &mut shutdown => return Ok(()),
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, a connection reset before it was taken: the server goes on.
                tracing::warn!("roar ui: cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(req, state).await) }
            });
            // A page closed mid-request is not worth a message.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

fn text(status: StatusCode, msg: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{msg}\n"))).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        "text/plain; charset=utf-8".parse().expect("static header"),
    );
    r
}

fn with_type(body: impl Into<Bytes>, content_type: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        content_type.parse().expect("static header"),
    );
    h.insert(
        hyper::header::CACHE_CONTROL,
        "no-store".parse().expect("static header"),
    );
    h.insert(
        "x-content-type-options",
        "nosniff".parse().expect("static header"),
    );
    r
}

fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then(|| percent_decode(v))
    })
}

/// A query value as a form encodes it: `+` is a space, `%XX` a byte.
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// Compares without an early exit, so the time taken does not tell how much of a guess was right.
fn same_token(given: &str, token: &str) -> bool {
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn authorized(req: &Request<Incoming>, token: &str) -> bool {
    let bearer = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    bearer
        .or_else(|| query_param(req.uri().query(), "token"))
        .is_some_and(|t| same_token(&t, token))
}

async fn route(req: Request<Incoming>, state: Arc<State>) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "roar ui only reads: use GET",
        );
    }
    if !authorized(&req, &state.token) {
        return text(
            StatusCode::UNAUTHORIZED,
            "missing or wrong token: open the URL `roar ui` printed (it ends in ?token=...)",
        );
    }
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    match path.as_str() {
        "/" | "/index.html" => {
            let mut r = with_type(state.page.clone(), "text/html; charset=utf-8");
            r.headers_mut().insert(
                "content-security-policy",
                state.csp.parse().expect("static header"),
            );
            r.headers_mut().insert(
                "referrer-policy",
                "no-referrer".parse().expect("static header"),
            );
            r
        }
        "/api/events" => events(state.revision.clone()),
        _ if path.starts_with("/api/") => {
            let project = state.project.clone();
            let answer =
                tokio::task::spawn_blocking(move || api(&project, &path, query.as_deref())).await;
            match answer {
                Ok(Ok(json)) => with_type(json, "application/json"),
                Ok(Err(e)) => {
                    let status = match crate::exit_code(&e) {
                        _ if e.is::<BadRequest>() => StatusCode::BAD_REQUEST,
                        crate::exit::NOT_FOUND => StatusCode::NOT_FOUND,
                        crate::exit::AMBIGUOUS => StatusCode::BAD_REQUEST,
                        _ => StatusCode::INTERNAL_SERVER_ERROR,
                    };
                    text(status, &format!("{e:#}"))
                }
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "no such page"),
    }
}

#[derive(Debug)]
struct BadRequest(String);

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadRequest {}

/// The JSON of the command each API path stands for.
fn api(project: &Project, path: &str, query: Option<&str>) -> anyhow::Result<Vec<u8>> {
    let store = open(project)?;
    let json = match path {
        "/api/dag" => json(&crate::graph::project_dag(&store)?),
        "/api/status" => json(&crate::status_cmd::report(project, &store)?),
        "/api/diff" => {
            let arg = |n: &str| {
                query_param(query, n).ok_or_else(|| {
                    BadRequest(format!("/api/diff needs ?a=JOB&b=JOB ({n} is missing)"))
                })
            };
            let (a, b) = (arg("a")?, arg("b")?);
            json(&crate::diff_cmd::compare_in(
                &store,
                a.as_ref(),
                b.as_ref(),
            )?)
        }
        "/api/runs" => {
            let job = query_param(query, "job")
                .and_then(|j| j.parse::<i64>().ok())
                .ok_or_else(|| BadRequest("/api/runs needs ?job=JOB".into()))?;
            let runs = crate::runs_cmd::runs_of_job(&store, Some(&project.objects()), job)?;
            let (name, runs) = runs.unwrap_or_default();
            json(&serde_json::json!({ "name": name, "runs": runs }))
        }
        _ => match path.strip_prefix("/api/job/").map(str::parse::<i64>) {
            Some(Ok(id)) => json(&store.job(id)?),
            _ => return Err(crate::NotFound(format!("no API at {path}")).into()),
        },
    };
    Ok(json)
}

/// JSON as every output writes it (`roar_store::quote::write_json`).
fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    roar_store::quote::json_string(value).into_bytes()
}

/// `text/event-stream`: one `change` event per new revision of the jobs, a comment as heartbeat.
fn events(mut rx: watch::Receiver<u64>) -> Response<Body> {
    rx.mark_unchanged();
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let frame = tokio::select! {
            changed = rx.changed() => {
                changed.ok()?;
                let n = *rx.borrow_and_update();
                format!("event: change\ndata: {n}\n\n")
            }
            _ = tokio::time::sleep(HEARTBEAT) => ":\n\n".to_owned(),
        };
        Some((Ok::<_, Infallible>(Frame::data(Bytes::from(frame))), rx))
    });
    let mut r = Response::new(StreamBody::new(stream).boxed());
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        "text/event-stream".parse().expect("static header"),
    );
    h.insert(
        hyper::header::CACHE_CONTROL,
        "no-store".parse().expect("static header"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same_token("00ff", "00ff"));
        assert!(!same_token("00fe", "00ff"));
        assert!(!same_token("00f", "00ff"));
        assert!(!same_token("", "00ff"));
    }

    #[test]
    fn query_parameters_are_decoded() {
        assert_eq!(
            query_param(Some("a=1&b=x%2Fy+z"), "b").as_deref(),
            Some("x/y z")
        );
        assert_eq!(query_param(Some("token=ab"), "a"), None);
        assert_eq!(query_param(Some("a=%zz%"), "a").as_deref(), Some("%zz%"));
        assert_eq!(query_param(None, "a"), None);
    }

    #[test]
    fn tokens_are_random() {
        let (a, b) = (token().unwrap(), token().unwrap());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}
