//! The team store: one PostgreSQL database that every member's project pushes its jobs to, and
//! that every query command can read (`--remote`). docs/SEMANTICS.md "The team store".
//!
//! - **Push** ([`push`]): each finished local job the remote does not hold yet is read whole
//!   ([`local::read_job`], its file records as the team store's columns by [`files::read_batch`])
//!   and written in the remote's tables ([`write::write_jobs`]), a batch per
//!   transaction, keyed by the job's global `uid`: pushing twice, from two machines or from many
//!   pushers at once stores every job exactly once. What a remote holds is remembered locally
//!   (`pushed`), after the remote committed: a push cut short (the server stopped) is simply
//!   pushed again, and the remote skips what it already has.
//! - **Read** ([`fetch`]): a query over the team store runs on a local mirror of it (a store of
//!   the same schema in `.roar/remotes/NAME.db`) brought up to date first by reading only what
//!   the team store received since the last read. The same query code then gives the same answers
//!   over the team store as over the local one, and a query costs a round trip, not a transfer
//!   of the graph.
//!
//! Credentials are never stored: a URL with a password is refused; the password comes from
//! `PGPASSWORD` or the password file (`PGPASSFILE`, else `~/.pgpass`), as for psql. With
//! `sslmode=require` the connection is TLS and the server verified ([`tls`]).

mod codec;
mod copy;
mod files;
mod local;
mod read;
mod schema;
pub use schema::MIGRATIONS;
mod tls;
mod write;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use roar_store::{Result, StoreError};

/// A configured remote: a name and a `postgres://` URL without a password.
#[derive(Debug, Clone)]
pub struct Remote {
    pub name: String,
    pub url: String,
}

/// How many jobs go in one transaction of a push.
const PUSH_BATCH: usize = 64;
/// How many jobs one page of a fetch reads.
const FETCH_PAGE: i64 = 500;

fn team_err(remote: &Remote, what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Team(format!(
        "{what} the team store {} ({}): {e}",
        remote.name,
        remote.key()
    ))
}

/// A PostgreSQL error of `what` (reading, writing, setting up) the team store: the server's
/// refusal, with its reason and what to do, or (no answer from the server) why it could not be
/// reached.
fn db_err(remote: &Remote, what: &str, e: postgres::Error) -> StoreError {
    let Some(db) = e.as_db_error() else {
        return team_err(remote, what, roar_store::error_chain(&e));
    };
    let role = postgres::Config::from_str(&remote.url)
        .ok()
        .and_then(|c| c.get_user().map(str::to_owned))
        .or_else(|| std::env::var("PGUSER").ok())
        .unwrap_or_else(|| "this role".into());
    let todo = if *db.code() == postgres::error::SqlState::INSUFFICIENT_PRIVILEGE {
        let right = if what.contains("write") || what.contains("set up") {
            "INSERT and SELECT on the team store's tables (and CREATE on its schema for its first push)"
        } else {
            "SELECT on the team store's tables"
        };
        format!("; {role} needs {right}: ask the database's owner to GRANT them")
    } else {
        db.hint().map(|h| format!("; {h}")).unwrap_or_default()
    };
    StoreError::TeamRefused(format!(
        "{what} the team store {} ({}): the server refused: {} (SQLSTATE {}){todo}",
        remote.name,
        remote.key(),
        db.message(),
        db.code().code()
    ))
}

impl Remote {
    /// Checks a URL given to `roar remote add`: a postgres URL, without a password.
    pub fn check_url(url: &str) -> std::result::Result<(), String> {
        // The URL is never repeated in an error: it may hold the password being refused.
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err("not a PostgreSQL URL; use postgres://USER@HOST:PORT/DATABASE".into());
        }
        let config = postgres::Config::from_str(url).map_err(|e| {
            format!("not a valid PostgreSQL URL ({e}); use postgres://USER@HOST:PORT/DATABASE")
        })?;
        if config.get_password().is_some() {
            return Err(
                "the URL carries a password, which roar never stores; remove it and put it in ~/.pgpass (HOST:PORT:DATABASE:USER:PASSWORD, mode 0600) or PGPASSWORD"
                    .into(),
            );
        }
        Ok(())
    }

    /// The remote's identity for `pushed`/`fetched`: user, host, port and database (a rename of
    /// the remote, or a password change, is the same team store).
    pub fn key(&self) -> String {
        match postgres::Config::from_str(&self.url) {
            Ok(c) => {
                let host = match c.get_hosts().first() {
                    Some(postgres::config::Host::Tcp(h)) => h.clone(),
                    Some(postgres::config::Host::Unix(p)) => p.display().to_string(),
                    None => "localhost".into(),
                };
                format!(
                    "postgres://{}@{}:{}/{}",
                    c.get_user().unwrap_or_default(),
                    host,
                    c.get_ports().first().copied().unwrap_or(5432),
                    c.get_dbname().unwrap_or_default()
                )
            }
            Err(_) => self.url.clone(),
        }
    }

    fn connect(&self) -> Result<postgres::Client> {
        let mut config = postgres::Config::from_str(&self.url)
            .map_err(|e| team_err(self, "cannot read the URL of", e))?;
        if config.get_user().is_none() {
            let user = std::env::var("PGUSER")
                .ok()
                .or_else(|| std::env::var("USER").ok())
                .unwrap_or_else(|| "postgres".into());
            config.user(&user);
        }
        if config.get_hosts().is_empty() {
            config.host(&std::env::var("PGHOST").unwrap_or_else(|_| "localhost".into()));
        }
        if config.get_dbname().is_none() {
            if let Some(user) = config.get_user().map(str::to_owned) {
                config.dbname(&user);
            }
        }
        if config.get_password().is_none() {
            if let Some(pw) = password_for(&config) {
                config.password(pw);
            }
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        let connected = match config.get_ssl_mode() {
            postgres::config::SslMode::Require => {
                let tls =
                    tls::Rustls::new().map_err(|e| team_err(self, "cannot set up TLS for", e))?;
                config.connect(tls)
            }
            _ => config.connect(postgres::NoTls),
        };
        connected.map_err(|e| team_err(self, "cannot reach", roar_store::error_chain(&e)))
    }
}

/// The password for `config` from `PGPASSWORD` or the password file, as libpq finds it.
fn password_for(config: &postgres::Config) -> Option<String> {
    if let Ok(pw) = std::env::var("PGPASSWORD") {
        return Some(pw);
    }
    let file = std::env::var_os("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pgpass")))?;
    let text = std::fs::read_to_string(file).ok()?;
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "localhost".into(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let want = [
        host.as_str(),
        port.as_str(),
        config.get_dbname().unwrap_or_default(),
        config.get_user().unwrap_or_default(),
    ];
    pgpass_lookup(&text, &want)
}

/// The password of the first line of a pgpass file matching `want` (host, port, database,
/// user); `*` matches anything, `\` escapes `:` and `\`.
fn pgpass_lookup(text: &str, want: &[&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = Vec::with_capacity(5);
        let mut cur = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => cur.extend(chars.next()),
                ':' if fields.len() < 4 => fields.push(std::mem::take(&mut cur)),
                c => cur.push(c),
            }
        }
        fields.push(cur);
        if fields.len() == 5
            && fields[..4]
                .iter()
                .zip(want)
                .all(|(f, w)| f == "*" || f == w)
        {
            return fields.pop();
        }
    }
    None
}

/// What a push did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Pushed {
    /// Jobs the team store did not have before.
    pub new: usize,
    /// Jobs it already had (an earlier push that could not say so locally).
    pub known: usize,
    pub files: usize,
}

fn open_schema(remote: &Remote, client: &mut postgres::Client) -> Result<()> {
    let version = schema::schema_version(client).map_err(|e| db_err(remote, "cannot read", e))?;
    if version > schema::SCHEMA_VERSION {
        return Err(StoreError::Team(format!(
            "the team store {} has schema version {version}, newer than this roar ({}); upgrade roar",
            remote.name,
            schema::SCHEMA_VERSION
        )));
    }
    if version < schema::SCHEMA_VERSION {
        schema::migrate(client).map_err(|e| db_err(remote, "cannot set up", e))?;
    }
    Ok(())
}

/// Sends every finished job of the store at `db` that `remote` does not hold yet.
pub fn push(db: &Path, remote: &Remote, host: Option<&str>) -> Result<Pushed> {
    let conn = roar_store::open(db, false)?;
    let mut client = remote.connect()?;
    open_schema(remote, &mut client)?;
    let sql = write::Sql::prepare(&mut client).map_err(|e| db_err(remote, "cannot write to", e))?;
    let key = remote.key();
    let mut report = Pushed::default();
    let sqlite = |e: rusqlite::Error| StoreError::sqlite(db, e);
    let mut after = 0;
    let mut contents = files::Contents::default();
    loop {
        let ids = local::unpushed(&conn, &key, after, PUSH_BATCH).map_err(sqlite)?;
        let Some(&last) = ids.last() else {
            return Ok(report);
        };
        after = last;
        // The batch read in one read transaction (a lock of the WAL's index per statement was
        // a sixth of a pusher's time).
        let read = conn.unchecked_transaction().map_err(sqlite)?;
        let files = files::read_batch(&read, &ids, &mut contents).map_err(sqlite)?;
        let mut jobs = Vec::with_capacity(ids.len());
        for (id, files) in ids.into_iter().zip(files) {
            if let Some(job) = local::read_job(&read, id).map_err(sqlite)? {
                jobs.push(write::Outgoing { job, files });
            }
        }
        read.commit().map_err(sqlite)?;
        let new = write_with_retry(remote, &mut client, &sql, &jobs, host)?;
        let uids: Vec<String> = jobs.iter().filter_map(|o| o.job.uid.clone()).collect();
        local::mark_pushed(&conn, &key, &uids).map_err(sqlite)?;
        report.new += new;
        report.known += jobs.len() - new;
        report.files += jobs.iter().map(|o| o.files.len()).sum::<usize>();
    }
}

/// One batch in one transaction, tried again on a deadlock or serialization failure (another
/// pusher's transaction; never expected with sorted shared rows, handled anyway).
fn write_with_retry(
    remote: &Remote,
    client: &mut postgres::Client,
    sql: &write::Sql,
    jobs: &[write::Outgoing],
    host: Option<&str>,
) -> Result<usize> {
    let mut attempt = 0;
    loop {
        let result = (|| {
            let mut tx = client.transaction()?;
            let n = write::write_jobs(&mut tx, sql, jobs, host)?;
            tx.commit()?;
            Ok::<_, postgres::Error>(n)
        })();
        match result {
            Ok(n) => return Ok(n),
            Err(e)
                if attempt < 5
                    && e.code().is_some_and(|c| {
                        *c == postgres::error::SqlState::T_R_DEADLOCK_DETECTED
                            || *c == postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
                    }) =>
            {
                attempt += 1;
            }
            Err(e) => return Err(db_err(remote, "cannot write to", e)),
        }
    }
}

/// What a fetch did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fetched {
    pub new: usize,
}

/// Where the mirror of `remote` lives in a project's `.roar/`.
pub fn mirror_path(roar_dir: &Path, remote: &Remote) -> PathBuf {
    roar_dir.join("remotes").join(format!("{}.db", remote.name))
}

/// Brings the mirror at `mirror` up to date with `remote`: reads the jobs the team store
/// received since the last fetch (see [`read::read_since`]) and adds those the mirror lacks.
pub fn fetch(mirror: &Path, remote: &Remote) -> Result<Fetched> {
    // Reached and read first: a mirror exists only once the team store has been read, so an
    // answer from it is never one from a store roar could not read.
    let mut client = remote.connect()?;
    let version =
        schema::schema_version(&mut client).map_err(|e| db_err(remote, "cannot read", e))?;
    if version != 0 {
        // A team store of an older schema is brought up to date by its first reader too (one
        // without the rights to is told so); a newer one is refused.
        open_schema(remote, &mut client)?;
    }
    if let Some(dir) = mirror.parent() {
        roar_store::private::create_dir(dir).map_err(|e| StoreError::io("create", dir, e))?;
    }
    let mut conn = roar_store::open(mirror, true)?;
    let key = remote.key();
    let sqlite = |e: rusqlite::Error| StoreError::sqlite(mirror, e);
    if version == 0 {
        // Nothing was ever pushed there: an empty team store, read.
        conn.execute(
            "INSERT INTO fetched (remote, xid_horizon) VALUES (?1, 0) ON CONFLICT (remote) DO NOTHING",
            [&key],
        )
        .map_err(sqlite)?;
        return Ok(Fetched::default());
    }
    let from: u64 = conn
        .query_row(
            "SELECT xid_horizon FROM fetched WHERE remote = ?1",
            [&key],
            |r| r.get::<_, i64>(0),
        )
        .optional()
        .map_err(sqlite)?
        .unwrap_or(0) as u64;
    let mut tx = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(|e| db_err(remote, "cannot read", e))?;
    let horizon = read::horizon(&mut tx).map_err(|e| db_err(remote, "cannot read", e))?;
    // What others pushed passes this project's redaction too before it is stored here.
    let policy = roar_store::redact::Policy::for_config(
        &mirror
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("/"))
            .join(roar_store::CONFIG_NAME),
    );
    let mut report = Fetched::default();
    let mut after = 0;
    loop {
        let mut page = read::read_since(&mut tx, from, after, FETCH_PAGE)
            .map_err(|e| db_err(remote, "cannot read", e))?;
        let n = page.jobs.len() as i64;
        after = page.last_seq;
        for job in &mut page.jobs {
            policy.job(job);
        }
        report.new += roar_store::import_jobs(&mut conn, page.jobs).map_err(sqlite)?;
        if n < FETCH_PAGE {
            break;
        }
    }
    tx.commit().map_err(|e| db_err(remote, "cannot read", e))?;
    conn.execute(
        "INSERT INTO fetched (remote, xid_horizon) VALUES (?1, ?2)
         ON CONFLICT (remote) DO UPDATE SET xid_horizon = excluded.xid_horizon",
        params![key, horizon as i64],
    )
    .map_err(sqlite)?;
    Ok(report)
}

/// Whether the mirror at `mirror` holds a completed read of `remote` (one it may answer from when
/// the team store cannot be reached).
pub fn was_read(mirror: &Path, remote: &Remote) -> bool {
    if !mirror.is_file() {
        return false;
    }
    let Ok(conn) = roar_store::open(mirror, false) else {
        return false;
    };
    conn.query_row(
        "SELECT 1 FROM fetched WHERE remote = ?1",
        [remote.key()],
        |_| Ok(()),
    )
    .optional()
    .is_ok_and(|row| row.is_some())
}

/// Local jobs `remote` does not hold yet (finished ones: running jobs are pushed once they end).
pub fn unpushed_count(conn: &Connection, remote: &Remote) -> rusqlite::Result<usize> {
    conn.query_row(
        "SELECT count(*) FROM jobs j WHERE j.status != 'running' AND j.uid IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM pushed p WHERE p.remote = ?1 AND p.job_uid = j.uid)",
        [remote.key()],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_lines_match_like_libpq() {
        let text = "# comment\n\
                    otherhost:5432:*:*:nope\n\
                    127.0.0.1:5433:team:alice:s3cr\\:et\\\\x\n\
                    *:*:*:alice:fallback\n";
        assert_eq!(
            pgpass_lookup(text, &["127.0.0.1", "5433", "team", "alice"]).as_deref(),
            Some("s3cr:et\\x")
        );
        assert_eq!(
            pgpass_lookup(text, &["10.0.0.1", "5432", "db", "alice"]).as_deref(),
            Some("fallback")
        );
        assert_eq!(
            pgpass_lookup(text, &["10.0.0.1", "5432", "db", "bob"]),
            None
        );
    }

    #[test]
    fn urls_with_passwords_are_refused_and_keys_carry_none() {
        assert!(Remote::check_url("postgres://alice:pw@db:5432/team").is_err());
        assert!(Remote::check_url("mysql://db/team").is_err());
        // A malformed URL with a password is refused without repeating it.
        let bad = Remote::check_url("postgres://alice:hunter2@db:notaport/team").unwrap_err();
        assert!(!bad.contains("hunter2"), "{bad}");
        assert!(Remote::check_url("postgres://alice@db:5433/team").is_ok());
        let r = Remote {
            name: "origin".into(),
            url: "postgres://alice@db:5433/team".into(),
        };
        assert_eq!(r.key(), "postgres://alice@db:5433/team");
    }
}
