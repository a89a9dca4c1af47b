//! `roar gateway` and the gateway of `roar run --s3`: where the S3 gateway's accesses become jobs.
//!
//! - `roar run --s3` borrows a key from the project's running `roar gateway` if there is one for
//!   the same backend (through `.roar/gateway.sock`), else starts a gateway of its own on a free
//!   loopback port with a fresh credential pair. Either way it hands the command
//!   `AWS_ENDPOINT_URL`(`_S3`) and the run's credentials, and adds every object access made with
//!   them to the run's job.
//! - `roar gateway` serves until SIGINT/SIGTERM. Accesses are grouped per access key into
//!   sessions; a session becomes one job (backend `gateway`, named after the key) once the key has
//!   been idle for `--session-idle`, or when the gateway stops. Accesses made with a key lent to a
//!   run go to that run instead; if the run vanishes without collecting them (killed), they become
//!   a session like any other, so nothing is lost.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use roar_gateway::{Access, Backend, Gateway, Sink};
use roar_store::{FileRecord, Project, Writer};

use crate::config::{Config, S3Config};
use crate::entry::ExitCode;
use roar_gateway::sessions::{Known, Session, Sessions};

mod lend;

use lend::{offer_keys, Lender};

#[derive(Args)]
pub struct GatewayArgs {
    /// Address to listen on. Anything but loopback also needs --allow-remote.
    #[arg(long, default_value = "127.0.0.1:9900")]
    listen: SocketAddr,
    /// Listen on a non-loopback address (clients elsewhere can then reach the store).
    #[arg(long)]
    allow_remote: bool,
    /// Forward to this S3 service instead of serving the embedded store in .roar/s3/
    /// (default: `[s3] upstream` in the config).
    #[arg(long, value_name = "URL")]
    upstream: Option<String>,
    /// Region clients sign for, and the upstream's (default: `[s3] region`).
    #[arg(long)]
    region: Option<String>,
    /// File of `ACCESS_KEY SECRET_KEY` lines clients may sign with; each access key gets jobs of
    /// its own (default: one generated pair, printed at start). With --upstream, a line may add
    /// `UPSTREAM_ACCESS_KEY UPSTREAM_SECRET_KEY`: that client's requests go upstream as that
    /// identity, never as the gateway's own.
    #[arg(long, value_name = "FILE")]
    credentials: Option<PathBuf>,
    /// A bucket of the embedded store every --credentials key may use, whoever made it
    /// (otherwise a bucket a key made is that key's alone); repeatable, added to `[s3] shared`.
    #[arg(long, value_name = "BUCKET")]
    share: Vec<String>,
    /// Base domain for virtual-hosted-style requests (BUCKET.DOMAIN); repeatable.
    #[arg(long = "domain", default_value = "localhost")]
    domains: Vec<String>,
    /// Seconds without a request after which an access key's session is recorded as a job.
    #[arg(long, default_value_t = 30)]
    session_idle: u64,
    /// Seconds an upstream may stay silent before a request fails.
    #[arg(long, default_value_t = 30)]
    upstream_timeout: u64,
    /// Seconds a client may take to send its request headers, or stay silent mid-body, before
    /// the request fails with 400 RequestTimeout.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    client_timeout: u64,
}

fn backend(project: &Project, s3: &S3Config, upstream: Option<&str>) -> Backend {
    match upstream.or(s3.upstream.as_deref()) {
        Some(url) => Backend::Upstream {
            url: url.to_owned(),
        },
        None => Backend::Embedded(project.dir().join("s3")),
    }
}

/// What a run asks a running gateway to serve; it borrows a key only if the answers match.
fn describe(backend: &Backend) -> String {
    match backend {
        Backend::Embedded(dir) => format!("embedded {}", dir.display()),
        Backend::Upstream { url } => format!("upstream {url}"),
    }
}

/// Where a running `roar gateway` offers keys to `roar run --s3` (owner-only, inside `.roar/`).
fn socket_path(project: &Project) -> PathBuf {
    project.dir().join("gateway.sock")
}

/// How long a gateway waits for a finished run's requests to end before it hands over what it has.
const SETTLE: Duration = Duration::from_secs(10);

/// The gateway's answer to `begin`: where to send requests and the key to sign them with.
#[derive(serde::Serialize, serde::Deserialize)]
struct Lent {
    endpoint: String,
    access_key: String,
    secret_key: String,
    region: String,
}

/// The gateway's answer to `end`: every access made with the run's key.
#[derive(serde::Serialize, serde::Deserialize)]
struct Returned {
    accesses: Vec<Access>,
    /// False if some request was still in flight after SETTLE: its access, when it ends, goes to
    /// an ordinary session of the key instead.
    settled: bool,
}

// ---- roar run --s3 ----

struct Collector {
    accesses: Mutex<Vec<Access>>,
    known: Known,
    /// The run's journal: each access is written to it as it completes.
    keep: std::sync::OnceLock<Arc<roar_tracer::Keep>>,
}

impl Sink for Collector {
    fn record(&self, access: Access) {
        if let Some(keep) = self.keep.get() {
            keep.now(&roar_gateway::sessions::access_record(&access));
        }
        self.accesses.lock().unwrap().push(access);
    }

    fn known(&self, bucket: &str, key: &str, etag: &str) -> Option<(String, u64)> {
        self.known.get(bucket, key, etag)
    }
}

/// The gateway a run's command talks to: its own, or a key borrowed from the project's running
/// `roar gateway`.
pub struct RunGateway {
    serving: Serving,
    endpoint: String,
    credentials: (String, String),
    region: String,
}

enum Serving {
    Own {
        gateway: Gateway,
        sink: Arc<Collector>,
    },
    Borrowed {
        conn: UnixStream,
        reader: BufReader<UnixStream>,
    },
}

pub fn for_run(
    project: &Project,
    s3: &S3Config,
    upstream: Option<&str>,
) -> anyhow::Result<RunGateway> {
    let backend = backend(project, s3, upstream);
    if let Some(borrowed) = borrow(project, &backend) {
        return Ok(borrowed);
    }
    let credentials = roar_gateway::random_credentials()
        .context("cannot make credentials for the run's S3 gateway")?;
    let mut config = roar_gateway::Config::new(backend);
    config.region = s3.region.clone();
    config.credentials = vec![credentials.clone()];
    let sink = Arc::new(Collector {
        accesses: Mutex::default(),
        known: Known::new(&project.db_path()),
        keep: std::sync::OnceLock::new(),
    });
    let gateway = Gateway::start(config, Arc::clone(&sink) as Arc<dyn Sink>)
        .context("cannot start the S3 gateway for --s3")?;
    Ok(RunGateway {
        endpoint: gateway.endpoint(),
        serving: Serving::Own { gateway, sink },
        credentials,
        region: s3.region.clone(),
    })
}

/// A key lent by the project's running gateway, if one is listening and serves `backend`. Any
/// failure (no gateway, a stale socket, another backend, a gateway that does not answer within a
/// few seconds) means the run starts a gateway of its own.
fn borrow(project: &Project, backend: &Backend) -> Option<RunGateway> {
    let conn = UnixStream::connect(socket_path(project)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    (&conn)
        .write_all(format!("begin {}\n", describe(backend)).as_bytes())
        .ok()?;
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let lent: Lent = serde_json::from_str(&line).ok()?;
    // The end of a run waits for the gateway to settle the run's requests (up to SETTLE).
    conn.set_read_timeout(Some(SETTLE + Duration::from_secs(20)))
        .ok()?;
    Some(RunGateway {
        serving: Serving::Borrowed { conn, reader },
        endpoint: lent.endpoint,
        credentials: (lent.access_key, lent.secret_key),
        region: lent.region,
    })
}

impl RunGateway {
    /// The run's own gateway writes each access to the run's journal from now on (a borrowed
    /// key's accesses are in the lending gateway's journal).
    pub fn keep_in(&self, keep: &Arc<roar_tracer::Keep>) {
        if let Serving::Own { sink, .. } = &self.serving {
            let _ = sink.keep.set(Arc::clone(keep));
        }
    }

    /// What the command's environment needs to reach the gateway with the run's credentials.
    pub fn child_env(&self) -> Vec<(OsString, Option<OsString>)> {
        let set = |k: &str, v: &str| (OsString::from(k), Some(OsString::from(v)));
        vec![
            set("AWS_ENDPOINT_URL", &self.endpoint),
            set("AWS_ENDPOINT_URL_S3", &self.endpoint),
            set("AWS_ACCESS_KEY_ID", &self.credentials.0),
            set("AWS_SECRET_ACCESS_KEY", &self.credentials.1),
            set("AWS_REGION", &self.region),
            set("AWS_DEFAULT_REGION", &self.region),
            // A session token belongs to other credentials; signing with it would be refused.
            (OsString::from("AWS_SESSION_TOKEN"), None),
            (OsString::from("AWS_SECURITY_TOKEN"), None),
        ]
    }

    /// Ends the run's use of the gateway once its requests are over and returns the job's S3
    /// files: its own gateway stops; a borrowed key goes back and its accesses come with it.
    pub fn finish(self) -> Vec<FileRecord> {
        match self.serving {
            Serving::Own { gateway, sink } => {
                gateway.stop();
                let accesses = std::mem::take(&mut *sink.accesses.lock().unwrap());
                roar_gateway::job_files(&accesses)
            }
            Serving::Borrowed { conn, mut reader } => {
                let mut line = String::new();
                let returned = (&conn)
                    .write_all(b"end\n")
                    .and_then(|()| reader.read_line(&mut line))
                    .ok()
                    .and_then(|_| serde_json::from_str::<Returned>(&line).ok());
                match returned {
                    Some(r) => {
                        if !r.settled {
                            eprintln!(
                                "roar: some S3 requests of this run were still in flight at {} after {}s; the gateway records them as a job of key {}",
                                self.endpoint,
                                SETTLE.as_secs(),
                                self.credentials.0
                            );
                        }
                        roar_gateway::job_files(&r.accesses)
                    }
                    None => {
                        eprintln!(
                            "roar: the S3 gateway at {} did not hand back this run's object accesses; it records them as a job of key {}",
                            self.endpoint, self.credentials.0
                        );
                        Vec::new()
                    }
                }
            }
        }
    }
}

// ---- roar gateway ----

/// The keys clients sign with, and the upstream identity of each key that has its own.
type Keys = (Vec<(String, String)>, HashMap<String, (String, String)>);

/// `--credentials FILE`: `ACCESS SECRET` lines, or `ACCESS SECRET UPSTREAM_ACCESS
/// UPSTREAM_SECRET` for a client that goes upstream as itself.
fn load_credentials(path: &Path) -> anyhow::Result<Keys> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --credentials {}", path.display()))?;
    let (mut pairs, mut identities) = (Vec::new(), HashMap::new());
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields[..] {
            [access, secret] => pairs.push((access.to_owned(), secret.to_owned())),
            [access, secret, up_access, up_secret] => {
                pairs.push((access.to_owned(), secret.to_owned()));
                identities.insert(access.to_owned(), (up_access.to_owned(), up_secret.to_owned()));
            }
            _ => anyhow::bail!(
                "{}:{}: expected `ACCESS_KEY SECRET_KEY [UPSTREAM_ACCESS_KEY UPSTREAM_SECRET_KEY]`, found {} fields",
                path.display(),
                n + 1,
                fields.len()
            ),
        }
    }
    if pairs.is_empty() {
        anyhow::bail!("{} has no `ACCESS_KEY SECRET_KEY` line", path.display());
    }
    Ok((pairs, identities))
}

pub fn serve(args: GatewayArgs, json: bool) -> anyhow::Result<ExitCode> {
    let project = crate::project()?;
    let config = Config::load(&project)?;
    if !args.listen.ip().is_loopback() && !args.allow_remote {
        anyhow::bail!(
            "--listen {} is not a loopback address; add --allow-remote to serve other machines",
            args.listen
        );
    }
    let (credentials, identities) = match &args.credentials {
        Some(path) => load_credentials(path)?,
        None => (vec![roar_gateway::random_credentials()?], HashMap::new()),
    };
    let backend = backend(&project, &config.s3, args.upstream.as_deref());
    let region = args.region.clone().unwrap_or(config.s3.region.clone());
    let gw = gateway_config(&args, &config, &backend, &region, &credentials, identities);
    let writer = Writer::start(&project.db_path())?;
    let sessions = Arc::new(Sessions::new(&project, Known::new(&project.db_path())));
    // Blocked before the gateway's threads start, so only this thread takes them.
    let signals = roar_roarfs::sys::block_signals(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP]);
    let gateway = Gateway::start(gw, Arc::clone(&sessions) as Arc<dyn Sink>)?;
    if !args.listen.ip().is_loopback() {
        eprintln!(
            "roar: warning: serving on {}: anyone who can reach it and holds a key can read and write the store",
            gateway.addr()
        );
    }
    // Runs can borrow a key before anyone is told the gateway is up: a `roar run --s3` started
    // the moment the endpoint is printed finds the socket.
    let lender = Lender {
        serving: describe(&backend),
        endpoint: gateway.endpoint(),
        region: region.clone(),
        control: gateway.control(),
        sessions: Arc::clone(&sessions),
    };
    let socket = offer_keys(&project, lender);
    let serving = match &backend {
        Backend::Embedded(dir) => format!(
            "the embedded store {}",
            crate::fmt::rel(&dir.to_string_lossy(), &project.root)
        ),
        Backend::Upstream { url } => format!("upstream {url}"),
    };
    eprintln!(
        "roar: S3 gateway on {} for {serving}; stop with Ctrl-C",
        gateway.endpoint()
    );
    tell_clients(
        &args,
        json,
        &gateway.endpoint(),
        &region,
        &serving,
        &credentials,
    )?;

    let idle = Duration::from_secs(args.session_idle);
    let record = |done: Vec<(String, Session)>| {
        for (key, session) in done {
            match writer.record_job(session.job(&project, &key)) {
                Ok(id) => {
                    eprintln!(
                        "roar: job {id}: {} object accesses by {key}",
                        session.accesses.len()
                    );
                    session.recorded();
                    crate::remote_cmd::push_in_background(&project, &config);
                }
                Err(e) => eprintln!(
                    "roar: the accesses of {key} could not be recorded: {:#}",
                    anyhow::Error::from(e)
                ),
            }
        }
    };
    loop {
        if roar_roarfs::sys::wait_signal(&signals, Duration::from_secs(1)).is_some() {
            break;
        }
        record(sessions.take_idle(Some(idle)));
    }
    eprintln!("roar: stopping the gateway");
    if let Some(path) = socket {
        let _ = std::fs::remove_file(path);
    }
    gateway.stop();
    // Runs still going lose their gateway: what they did so far is recorded here instead.
    sessions.adopt_all_lent();
    record(sessions.take_idle(None));
    Ok(ExitCode::SUCCESS)
}

/// The gateway's configuration from the command line and the project's `[s3]`.
fn gateway_config(
    args: &GatewayArgs,
    config: &Config,
    backend: &Backend,
    region: &str,
    credentials: &[(String, String)],
    identities: HashMap<String, (String, String)>,
) -> roar_gateway::Config {
    let mut gw = roar_gateway::Config::new(backend.clone());
    gw.listen = args.listen;
    gw.region = region.to_owned();
    gw.credentials = credentials.to_vec();
    // Keys given in a file are people's: each owns the buckets it makes in the embedded store.
    gw.members = args.credentials.is_some();
    gw.shared = args
        .share
        .iter()
        .chain(&config.s3.shared)
        .cloned()
        .collect();
    gw.identities = identities;
    gw.domains = args.domains.clone();
    gw.upstream_timeout = Duration::from_secs(args.upstream_timeout);
    gw.client_timeout = Duration::from_secs(args.client_timeout);
    gw
}

/// Tells clients where the gateway is: with `--json` one line a program can read, else the
/// `export` line for a shell (with the key made for this gateway, when none were given).
fn tell_clients(
    args: &GatewayArgs,
    json: bool,
    endpoint: &str,
    region: &str,
    serving: &str,
    credentials: &[(String, String)],
) -> anyhow::Result<()> {
    if json {
        // One line on stdout a program can read before it starts its clients.
        let (access, secret) = match &args.credentials {
            None => (Some(&credentials[0].0), Some(&credentials[0].1)),
            Some(_) => (None, None),
        };
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "endpoint": endpoint,
                "region": region,
                "serving": serving,
                "access_key_id": access,
                "secret_access_key": secret,
            })
        )?;
        out.flush()?;
    } else {
        let mut out = std::io::stdout().lock();
        if args.credentials.is_none() {
            let (access, secret) = &credentials[0];
            writeln!(
                out,
                "export AWS_ENDPOINT_URL={endpoint} AWS_ACCESS_KEY_ID={access} AWS_SECRET_ACCESS_KEY={secret} AWS_REGION={region}",
            )?;
        } else {
            writeln!(
                out,
                "export AWS_ENDPOINT_URL={endpoint} AWS_REGION={region}"
            )?;
        }
        out.flush()?;
    }
    Ok(())
}
