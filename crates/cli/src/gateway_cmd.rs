//! `roar gateway` and the gateway of `roar run --s3`: where the S3 gateway's accesses become jobs.
//!
//! - `roar run --s3` starts a gateway of its own on a free loopback port with a fresh credential
//!   pair, hands the command `AWS_ENDPOINT_URL`(`_S3`) and those credentials, and adds every object
//!   access to the run's job.
//! - `roar gateway` serves until SIGINT/SIGTERM. Accesses are grouped per access key into
//!   sessions; a session becomes one job (backend `gateway`, named after the key) once the key has
//!   been idle for `--session-idle`, or when the gateway stops.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use roar_gateway::{Access, Backend, Gateway, Sink};
use roar_store::{FileRecord, JobRecord, Outcome, Project, Store, Writer};

use crate::config::{Config, S3Config};

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
    /// its own (default: one generated pair, printed at start).
    #[arg(long, value_name = "FILE")]
    credentials: Option<PathBuf>,
    /// Base domain for virtual-hosted-style requests (BUCKET.DOMAIN); repeatable.
    #[arg(long = "domain", default_value = "localhost")]
    domains: Vec<String>,
    /// Seconds without a request after which an access key's session is recorded as a job.
    #[arg(long, default_value_t = 30)]
    session_idle: u64,
    /// Seconds an upstream may stay silent before a request fails.
    #[arg(long, default_value_t = 30)]
    upstream_timeout: u64,
}

fn backend(project: &Project, s3: &S3Config, upstream: Option<&str>) -> Backend {
    match upstream.or(s3.upstream.as_deref()) {
        Some(url) => Backend::Upstream {
            url: url.to_owned(),
        },
        None => Backend::Embedded(project.dir().join("s3")),
    }
}

/// Looks up hashes of object versions recorded before, so ranged reads and copies of them need
/// not read the object again.
struct Known {
    store: Mutex<Option<Store>>,
}

impl Known {
    fn new(db: &Path) -> Known {
        Known {
            store: Mutex::new(Store::open(db).ok()),
        }
    }

    fn get(&self, bucket: &str, key: &str, etag: &str) -> Option<(String, u64)> {
        let store = self.store.lock().unwrap();
        store.as_ref()?.s3_known(bucket, key, etag).ok().flatten()
    }
}

// ---- roar run --s3 ----

struct Collector {
    accesses: Mutex<Vec<Access>>,
    known: Known,
}

impl Sink for Collector {
    fn record(&self, access: Access) {
        self.accesses.lock().unwrap().push(access);
    }

    fn known(&self, bucket: &str, key: &str, etag: &str) -> Option<(String, u64)> {
        self.known.get(bucket, key, etag)
    }
}

pub struct RunGateway {
    gateway: Gateway,
    sink: Arc<Collector>,
    credentials: (String, String),
    region: String,
}

pub fn for_run(
    project: &Project,
    s3: &S3Config,
    upstream: Option<&str>,
) -> anyhow::Result<RunGateway> {
    let credentials = roar_gateway::random_credentials()
        .context("cannot make credentials for the run's S3 gateway")?;
    let mut config = roar_gateway::Config::new(backend(project, s3, upstream));
    config.region = s3.region.clone();
    config.credentials = vec![credentials.clone()];
    let sink = Arc::new(Collector {
        accesses: Mutex::default(),
        known: Known::new(&project.db_path()),
    });
    let gateway = Gateway::start(config, Arc::clone(&sink) as Arc<dyn Sink>)
        .context("cannot start the S3 gateway for --s3")?;
    Ok(RunGateway {
        gateway,
        sink,
        credentials,
        region: s3.region.clone(),
    })
}

impl RunGateway {
    /// What the command's environment needs to reach the gateway with the run's credentials.
    pub fn child_env(&self) -> Vec<(OsString, Option<OsString>)> {
        let endpoint = self.gateway.endpoint();
        let set = |k: &str, v: &str| (OsString::from(k), Some(OsString::from(v)));
        vec![
            set("AWS_ENDPOINT_URL", &endpoint),
            set("AWS_ENDPOINT_URL_S3", &endpoint),
            set("AWS_ACCESS_KEY_ID", &self.credentials.0),
            set("AWS_SECRET_ACCESS_KEY", &self.credentials.1),
            set("AWS_REGION", &self.region),
            set("AWS_DEFAULT_REGION", &self.region),
            // A session token belongs to other credentials; signing with it would be refused.
            (OsString::from("AWS_SESSION_TOKEN"), None),
            (OsString::from("AWS_SECURITY_TOKEN"), None),
        ]
    }

    /// Stops the gateway (requests in flight finish) and returns the job's S3 files.
    pub fn finish(self) -> Vec<FileRecord> {
        self.gateway.stop();
        let accesses = std::mem::take(&mut *self.sink.accesses.lock().unwrap());
        roar_gateway::job_files(&accesses)
    }
}

// ---- roar gateway ----

struct Session {
    accesses: Vec<Access>,
    last: Instant,
}

struct Sessions {
    open: Mutex<HashMap<String, Session>>,
    known: Known,
}

impl Sink for Sessions {
    fn record(&self, access: Access) {
        let key = access
            .access_key
            .clone()
            .unwrap_or_else(|| "anonymous".into());
        let mut open = self.open.lock().unwrap();
        let session = open.entry(key).or_insert_with(|| Session {
            accesses: Vec::new(),
            last: Instant::now(),
        });
        session.last = Instant::now();
        session.accesses.push(access);
    }

    fn known(&self, bucket: &str, key: &str, etag: &str) -> Option<(String, u64)> {
        self.known.get(bucket, key, etag)
    }
}

impl Sessions {
    /// Removes the sessions idle for `idle` (all with `None`), oldest first.
    fn take_idle(&self, idle: Option<Duration>) -> Vec<(String, Session)> {
        let mut open = self.open.lock().unwrap();
        let done: Vec<String> = open
            .iter()
            .filter(|(_, s)| idle.is_none_or(|idle| s.last.elapsed() >= idle))
            .map(|(k, _)| k.clone())
            .collect();
        let mut done: Vec<(String, Session)> = done
            .into_iter()
            .filter_map(|k| open.remove_entry(&k))
            .collect();
        // Jobs are recorded in the order their sessions began.
        done.sort_by_key(|(_, s)| s.accesses.iter().map(|a| a.at_ns).min());
        done
    }
}

fn session_job(project: &Project, access_key: &str, session: &Session) -> JobRecord {
    let first = session.accesses.first().map_or(0, |a| a.at_ns);
    let last = session.accesses.last().map_or(first, |a| a.at_ns);
    JobRecord {
        name: Some(format!("s3 client {access_key}")),
        argv: vec!["s3-client".into(), access_key.into()],
        cwd: project.root.clone(),
        started_ns: first,
        ended_ns: Some(last),
        outcome: Outcome::Ended,
        incomplete: false,
        backend: "gateway".into(),
        git: None,
        env: Default::default(),
        host: crate::run_cmd::hostname(),
        processes: Vec::new(),
        files: roar_gateway::job_files(&session.accesses),
    }
}

fn load_credentials(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --credentials {}", path.display()))?;
    let mut pairs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            [access, secret] => pairs.push((access.to_owned(), secret.to_owned())),
            _ => anyhow::bail!(
                "{}:{}: expected `ACCESS_KEY SECRET_KEY`, found {} fields",
                path.display(),
                n + 1,
                line.split_whitespace().count()
            ),
        }
    }
    if pairs.is_empty() {
        anyhow::bail!("{} has no `ACCESS_KEY SECRET_KEY` line", path.display());
    }
    Ok(pairs)
}

pub fn serve(args: GatewayArgs) -> anyhow::Result<ExitCode> {
    let project = crate::project()?;
    let config = Config::load(&project)?;
    if !args.listen.ip().is_loopback() && !args.allow_remote {
        anyhow::bail!(
            "--listen {} is not a loopback address; add --allow-remote to serve other machines",
            args.listen
        );
    }
    let credentials = match &args.credentials {
        Some(path) => load_credentials(path)?,
        None => vec![roar_gateway::random_credentials()?],
    };
    let backend = backend(&project, &config.s3, args.upstream.as_deref());
    let region = args.region.clone().unwrap_or(config.s3.region.clone());
    let mut gw = roar_gateway::Config::new(backend.clone());
    gw.listen = args.listen;
    gw.region = region.clone();
    gw.credentials = credentials.clone();
    gw.domains = args.domains.clone();
    gw.upstream_timeout = Duration::from_secs(args.upstream_timeout);

    let writer = Writer::start(&project.db_path())?;
    let sessions = Arc::new(Sessions {
        open: Mutex::default(),
        known: Known::new(&project.db_path()),
    });
    // Blocked before the gateway's threads start, so only this thread takes them.
    let signals = roar_roarfs::sys::block_signals(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP]);
    let gateway = Gateway::start(gw, Arc::clone(&sessions) as Arc<dyn Sink>)?;
    if !args.listen.ip().is_loopback() {
        eprintln!(
            "roar: warning: serving on {}: anyone who can reach it and holds a key can read and write the store",
            gateway.addr()
        );
    }
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
    {
        let mut out = std::io::stdout().lock();
        if args.credentials.is_none() {
            let (access, secret) = &credentials[0];
            writeln!(
                out,
                "export AWS_ENDPOINT_URL={} AWS_ACCESS_KEY_ID={access} AWS_SECRET_ACCESS_KEY={secret} AWS_REGION={region}",
                gateway.endpoint()
            )?;
        } else {
            writeln!(
                out,
                "export AWS_ENDPOINT_URL={} AWS_REGION={region}",
                gateway.endpoint()
            )?;
        }
        out.flush()?;
    }

    let idle = Duration::from_secs(args.session_idle);
    let record = |done: Vec<(String, Session)>| {
        for (key, session) in done {
            match writer.record_job(session_job(&project, &key, &session)) {
                Ok(id) => eprintln!(
                    "roar: job {id}: {} object accesses by {key}",
                    session.accesses.len()
                ),
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
    gateway.stop();
    record(sessions.take_idle(None));
    Ok(ExitCode::SUCCESS)
}
