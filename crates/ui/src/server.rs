//! The server of `roar ui`: the page and its data on 127.0.0.1.
//!
//! Every request needs the random token printed in the URL (`?token=`, or `Authorization: Bearer`):
//! the port is reachable by every local user, the store is not theirs to read. `/` is the page;
//! `/api/...` is answered by the [`Answers`] the server was given (`roar` answers each path with
//! the JSON of the matching command); `/api/events` is a server-sent event stream that says when
//! the revision the server was given to watch changed (jobs added, ended or removed), so the page
//! redraws while it is open.

use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::watch;

/// How often the revision is asked for (`roar`: one aggregate query on the jobs table).
const POLL: Duration = Duration::from_millis(500);
/// A comment line on idle event streams, so closed pages are noticed and proxies keep them open.
const HEARTBEAT: Duration = Duration::from_secs(15);

type Body = BoxBody<Bytes, Infallible>;

/// Why a path of the API has no answer: the request (400), nothing there (404), or the server's
/// own failure (500). The message is the response's body.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Internal(String),
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UiError(String);

/// The query string of an API request.
pub struct Params<'a>(Option<&'a str>);

impl Params<'_> {
    /// The value of `name`, decoded as a form encodes it; None when it is not there.
    pub fn get(&self, name: &str) -> Option<String> {
        query_param(self.0, name)
    }
}

/// What answers the API: the JSON body for each `/api/...` path but `/api/events`. Called on a
/// thread that may block.
pub trait Answers: Send + Sync + 'static {
    fn answer(&self, path: &str, params: &Params) -> Result<Vec<u8>, ApiError>;
}

struct State {
    answers: Arc<dyn Answers>,
    token: String,
    /// The page, built once (its data is fetched).
    page: String,
    csp: String,
    /// Bumped when the watched revision changes.
    revision: watch::Receiver<u64>,
}

/// 128 random bits, hex: the kernel's random source, as `getrandom(2)` gives it.
fn token() -> Result<String, UiError> {
    let mut buf = [0u8; 16];
    #[allow(unsafe_code)]
    // SAFETY: getrandom writes at most `buf.len()` bytes into the buffer we own.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n != buf.len() as isize {
        return Err(UiError(format!(
            "cannot read random bytes for the access token: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// A server listening on 127.0.0.1, not yet serving: its URL can be told first.
pub struct Server {
    listener: std::net::TcpListener,
    addr: std::net::SocketAddr,
    token: String,
    page: String,
    csp: String,
}

impl Server {
    /// Listens on `port` (0: any free port) with a fresh token, the page built for `config`.
    pub fn bind(port: u16, config: &crate::page::Config) -> Result<Server, UiError> {
        let page = crate::page::html(config, None::<&()>);
        // The page runs only its own inline code and talks only to this server; no one frames it.
        let csp = format!("{}; frame-ancestors 'none'", crate::page::csp(config));
        let token = token()?;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).map_err(|e| {
            UiError(format!("cannot listen on 127.0.0.1:{port}: {e} (choose another with --port N, or --port 0 for any free port)"))
        })?;
        let io = |e: std::io::Error| UiError(format!("cannot listen on 127.0.0.1:{port}: {e}"));
        listener.set_nonblocking(true).map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        Ok(Server {
            listener,
            addr,
            token,
            page,
            csp,
        })
    }

    /// The page's address, token included.
    pub fn url(&self) -> String {
        format!("http://{}/?token={}", self.addr, self.token)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Serves until SIGINT. `revision` is asked every [`POLL`] on a thread of its own (it may
    /// block); each change is an event to the open pages. It ends the thread by returning None.
    pub fn run<R: PartialEq + Send + 'static>(
        self,
        answers: impl Answers,
        mut revision: impl FnMut() -> Option<R> + Send + 'static,
    ) -> Result<(), UiError> {
        let (tx, rx) = watch::channel(0u64);
        // The revision a change is a change from, read before anything is served: read on the
        // watching thread, it could come after a page had opened its stream and the jobs had
        // changed (a thread started late on a busy machine), and that change was never sent.
        let mut last = revision();
        let spawned = std::thread::Builder::new()
            .name("roar-ui-watch".into())
            .spawn(move || {
                let mut n = 0u64;
                loop {
                    std::thread::sleep(POLL);
                    let now = revision();
                    if now != last {
                        last = now;
                        n += 1;
                        if tx.send(n).is_err() {
                            return;
                        }
                    }
                }
            });
        spawned.map_err(|e| UiError(format!("cannot start the watching thread: {e}")))?;
        let state = Arc::new(State {
            answers: Arc::new(answers),
            token: self.token,
            page: self.page,
            csp: self.csp,
            revision: rx,
        });
        let io = |e: std::io::Error| UiError(format!("roar ui: {e}"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(io)?;
        runtime
            .block_on(async {
                accept(tokio::net::TcpListener::from_std(self.listener)?, state).await
            })
            .map_err(io)
    }
}

async fn accept(listener: tokio::net::TcpListener, state: Arc<State>) -> std::io::Result<()> {
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
            let answers = state.answers.clone();
            let answer = tokio::task::spawn_blocking(move || {
                answers.answer(&path, &Params(query.as_deref()))
            })
            .await;
            match answer {
                Ok(Ok(json)) => with_type(json, "application/json"),
                Ok(Err(ApiError::BadRequest(e))) => text(StatusCode::BAD_REQUEST, &e),
                Ok(Err(ApiError::NotFound(e))) => text(StatusCode::NOT_FOUND, &e),
                Ok(Err(ApiError::Internal(e))) => text(StatusCode::INTERNAL_SERVER_ERROR, &e),
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "no such page"),
    }
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
