//! The S3 gateway behind `roar gateway` and `roar run --s3`.
//!
//! An s3s endpoint on its own thread and tokio runtime. s3s parses and verifies each request's
//! SigV4 signature (streaming aws-chunked and unsigned-payload uploads included) against the
//! gateway's credentials; a wrong signature is answered 403 before the backend sees anything. The
//! backend is either the embedded object store (`embedded/`: content-addressed blobs and a SQLite
//! index on a directory, `.roar/s3/` in a project) or an upstream S3 service (`upstream.rs`: every
//! request over one pooled hyper client, re-signed with aws-sigv4 and the upstream credentials
//! from the environment or an AWS profile (`credentials.rs`); the operations with nothing to
//! record go through as they came, `upstream/plain.rs`). Between the two sits `record::Recorder`,
//! which hashes bodies as they stream and reports completed accesses to a `Sink`;
//! `files::job_files` turns them into a job's inputs and outputs. `control.rs` holds the keys the
//! gateway accepts (changeable while it serves) and counts requests in flight per key.

#[macro_use]
mod ops;
pub mod objects_remote;

mod access;
mod body;
mod control;
mod credentials;
mod embedded;
mod files;
mod host;
mod member;
mod parts;
mod pending;
mod record;
pub mod sessions;
pub(crate) mod upstream;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use hyper_util::server::graceful::GracefulShutdown;
use s3s::service::S3ServiceBuilder;
use tokio::sync::oneshot;

pub use control::Control;
pub use embedded::{Budget, Collected, Embedded, Stored};
pub use files::job_files;
pub use record::{Access, AccessKind, Sink};

use control::{Counted, Inflight, Keys};
use pending::Pending;

/// Where objects live.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The embedded object store: buckets are directories under this one.
    Embedded(PathBuf),
    /// An S3-compatible service, addressed path-style.
    Upstream { url: String },
}

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub backend: Backend,
    /// The region clients sign for, and the upstream's.
    pub region: String,
    /// (access key, secret key) pairs clients may sign with.
    pub credentials: Vec<(String, String)>,
    /// Whether those keys are people's (`--credentials`): on the embedded store each is then a
    /// principal of its own, owning the buckets it makes (`access.rs`); else they are the
    /// project's, like the keys lent to runs.
    pub members: bool,
    /// Buckets every member key may use, whoever made them.
    pub shared: Vec<String>,
    /// Forwarding to an upstream: the upstream (access key, secret key) each client access key
    /// goes there as; a key not here goes as the gateway itself (the environment's or the
    /// profile's credentials).
    pub identities: HashMap<String, (String, String)>,
    /// Base domains for virtual-hosted-style addressing (`BUCKET.localhost`).
    pub domains: Vec<String>,
    /// How long an upstream may stay silent (connect, or between bytes) before the request fails.
    pub upstream_timeout: Duration,
    /// How long a client may take to send a request's headers, or stay silent in the middle of
    /// its body, before the request fails (400 RequestTimeout) and the connection is closed.
    pub client_timeout: Duration,
}

impl Config {
    pub fn new(backend: Backend) -> Config {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            backend,
            region: "us-east-1".into(),
            credentials: Vec::new(),
            members: false,
            shared: Vec::new(),
            identities: HashMap::new(),
            domains: vec!["localhost".into()],
            upstream_timeout: Duration::from_secs(30),
            client_timeout: Duration::from_secs(30),
        }
    }
}

/// A running gateway. `stop` ends it cleanly; dropping it stops it too.
pub struct Gateway {
    addr: SocketAddr,
    control: Control,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Requests still in flight when the gateway stops get this long to finish.
const DRAIN: Duration = Duration::from_secs(10);

impl Gateway {
    /// Binds, builds the backend and starts serving; returns once requests can be sent, or with
    /// what prevented it (address in use, no upstream credentials, unusable store directory).
    pub fn start(config: Config, sink: Arc<dyn Sink>) -> anyhow::Result<Gateway> {
        if config.credentials.is_empty() {
            anyhow::bail!("the gateway needs at least one access key to verify signatures with");
        }
        if !config.identities.is_empty() && matches!(config.backend, Backend::Embedded(_)) {
            anyhow::bail!(
                "upstream identities in the credentials need an upstream (--upstream URL)"
            );
        }
        // glibc gives each thread that allocates an arena of its own and keeps what is freed in
        // it: ten uploads at once over the runtime's and the blocking pool's threads left a
        // 1 GiB PUT+GET at 79-92 MB peak RSS; two arenas hold it at 48-55 MB, no slower
        // (bench/NOTES.md). Process-wide, set before the gateway's threads start.
        #[allow(unsafe_code)]
        // SAFETY: mallopt only changes a malloc tunable.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2)
        };
        let listener = std::net::TcpListener::bind(config.listen)
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let keys = Keys::default();
        for (access, secret) in &config.credentials {
            if config.members {
                keys.add_member(access, secret);
            } else {
                keys.add(access, secret);
            }
        }
        let control = Control {
            keys,
            inflight: Arc::default(),
        };
        let shared = control.clone();
        let (ready_tx, ready_rx) = mpsc::channel::<anyhow::Result<()>>();
        let (stop_tx, stop_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("roar-gateway".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("roar-gateway-io")
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let pending = Arc::new(Pending::default());
                    let service = match build(&config, sink, &shared, &pending).await {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.into()));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    serve(
                        listener,
                        service,
                        shared.inflight,
                        config.client_timeout,
                        stop_rx,
                    )
                    .await;
                    pending.wait().await;
                });
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Gateway {
                addr,
                control,
                stop: Some(stop_tx),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                anyhow::bail!("the gateway thread died while starting")
            }
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle to add and remove access keys and to wait for a key's requests, from any thread.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// The endpoint URL clients should use.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting connections, lets requests in flight finish (up to 10 s) and waits for
    /// background hashing; every access is in the sink when this returns.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn build(
    config: &Config,
    sink: Arc<dyn Sink>,
    control: &Control,
    pending: &Arc<Pending>,
) -> anyhow::Result<s3s::service::S3Service> {
    let (backend, store, plain): (Box<dyn s3s::S3>, Option<Embedded>, _) = match &config.backend {
        Backend::Embedded(root) => {
            let store = Embedded::open(root)?;
            (Box::new(store.clone()), Some(store), None)
        }
        Backend::Upstream { url } => {
            let up = upstream::connect(
                url,
                &config.region,
                config.upstream_timeout,
                &config.identities,
            )
            .await?;
            let plain = up.plain_route(host::Hosts::new(&config.domains));
            (Box::new(up), None, Some(plain))
        }
    };
    // Bucket ownership is the embedded store's to enforce; an upstream enforces its own.
    let access_store = store.clone();
    let recorder = record::Recorder::new(
        backend,
        store,
        sink,
        Arc::clone(pending),
        Arc::clone(&control.inflight),
    );
    let mut b = S3ServiceBuilder::new(recorder);
    b.set_auth(control.keys.clone());
    b.set_host(host::Hosts::new(&config.domains));
    if let Some(plain) = plain {
        b.set_route(plain);
    }
    if let Some(store) = access_store {
        let shared = config.shared.iter().cloned().collect();
        b.set_access(access::Owners::new(control.keys.clone(), store, shared));
    }
    Ok(b.build())
}

async fn serve(
    listener: tokio::net::TcpListener,
    service: s3s::service::S3Service,
    inflight: Arc<Inflight>,
    client_timeout: Duration,
    mut stop: oneshot::Receiver<()>,
) {
    // Each request counts as in flight under the key it claims until its response body is gone.
    let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let guard = control::claimed_key(&req).map(|k| inflight.start(k));
        let req = req.map(|b| s3s::Body::http_body(body::Idle::new(b, client_timeout)));
        let service = service.clone();
        let reply = async move { service.call(req).await };
        async move {
            let mut resp = reply.await?;
            name_request(&mut resp);
            Ok::<_, s3s::HttpError>(resp.map(|body| Counted {
                body,
                _guard: guard,
            }))
        }
    });
    let mut http = ConnBuilder::new(TokioExecutor::new());
    // A client that does not finish its request headers in time is disconnected.
    http.http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(client_timeout);
    let graceful = GracefulShutdown::new();
    loop {
        let socket = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    // Out of fds: do not spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        // Without it small responses wait for the peer's delayed ACK (20-40 ms).
        let _ = socket.set_nodelay(true);
        let conn = http.serve_connection(TokioIo::new(socket), service.clone());
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after {DRAIN:?}; stopping anyway");
    }
}

/// Every answer names its request (S3 clients log it; support asks for it) with one id, in its
/// `x-amz-request-id` header and, for an error, in its body's `<RequestId>`: the id an
/// upstream's error body names, else the upstream's header, else a new one.
fn name_request(resp: &mut http::Response<s3s::Body>) {
    const HEADER: &str = "x-amz-request-id";
    let error = resp.status().as_u16() >= 400;
    let body = error.then(|| resp.body().bytes()).flatten();
    let text = body.as_deref().and_then(|b| std::str::from_utf8(b).ok());
    let in_body = text.and_then(|t| {
        let start = t.find("<RequestId>")? + "<RequestId>".len();
        let len = t[start..].find("</RequestId>")?;
        Some(t[start..start + len].to_owned())
    });
    let in_header = resp
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let id = in_body
        .clone()
        .or(in_header)
        .filter(|id| !id.is_empty())
        .unwrap_or_else(request_id);
    if let Ok(v) = http::HeaderValue::from_str(&id) {
        resp.headers_mut().insert(HEADER, v);
    }
    if let (None, Some(t)) = (&in_body, text) {
        if let Some(end) = t.rfind("</Error>") {
            let escaped = id
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;");
            let new = format!("{}<RequestId>{escaped}</RequestId>{}", &t[..end], &t[end..]);
            if let Ok(v) = http::HeaderValue::from_str(&new.len().to_string()) {
                if resp.headers().contains_key(http::header::CONTENT_LENGTH) {
                    resp.headers_mut().insert(http::header::CONTENT_LENGTH, v);
                }
            }
            *resp.body_mut() = s3s::Body::from(new);
        }
    }
}

/// A request id: 16 hex digits, unique per gateway process.
fn request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let seed = u64::from(std::process::id()).rotate_left(40) ^ roar_store::now_ns() as u64;
    format!("{:016X}", seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n)
}

/// A fresh random credential pair (20-character access key, 40-character secret).
pub fn random_credentials() -> std::io::Result<(String, String)> {
    use std::io::Read;
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    const SECRET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut raw = [0u8; 56];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
    // 36 and 64 symbols: the modulo bias of 256 % 36 is irrelevant for a per-run key.
    let access: String = std::iter::once("ROAR")
        .map(str::to_owned)
        .chain(
            raw[..16]
                .iter()
                .map(|b| (ALNUM[*b as usize % ALNUM.len()] as char).to_string()),
        )
        .collect();
    let secret: String = raw[16..]
        .iter()
        .map(|b| SECRET[*b as usize % SECRET.len()] as char)
        .collect();
    Ok((access, secret))
}
