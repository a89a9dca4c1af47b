//! The package indexes and the last machine probe, kept per user (`$ROAR_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/roar`, else `~/.cache/roar`; `packages.db`): what is installed belongs to
//! the machine, not to a project, so every project's first job must not re-index dpkg (115,000
//! files here: a second or so). Derived data only: deleting the file costs one rebuild, and a
//! cache that cannot be opened means indexes built for the job alone, never a wrong answer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use roar_store::{Package, Runtime};

use crate::PackageIndex;
use rusqlite::{params, Connection, OptionalExtension};

const VERSION: i64 = 1;

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS sources (source TEXT PRIMARY KEY, stamp TEXT NOT NULL) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS packages (id INTEGER PRIMARY KEY, json TEXT NOT NULL UNIQUE);
    CREATE TABLE IF NOT EXISTS files (
        source      TEXT NOT NULL,
        key         BLOB NOT NULL,
        package_id  INTEGER NOT NULL,
        PRIMARY KEY (source, key)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS runtimes (
        boot_id  TEXT PRIMARY KEY,
        host     TEXT,
        json     TEXT NOT NULL
    ) WITHOUT ROWID;
";

pub struct Cache {
    conn: Option<Connection>,
}

/// Where the cache lives.
pub fn dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("ROAR_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("roar"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/roar"))
}

impl Cache {
    /// The user's cache, or none (every lookup misses) when it cannot be opened.
    pub fn open() -> Cache {
        let conn = dir().and_then(|d| open(&d.join("packages.db")).ok());
        Cache { conn }
    }

    /// A cache that keeps nothing.
    pub fn none() -> Cache {
        Cache { conn: None }
    }

    pub fn at(path: &Path) -> Cache {
        Cache {
            conn: open(path).ok(),
        }
    }

    pub fn stamp(&self, source: &str) -> Option<String> {
        self.conn
            .as_ref()?
            .prepare_cached("SELECT stamp FROM sources WHERE source = ?1")
            .and_then(|mut s| s.query_row([source], |r| r.get(0)).optional())
            .ok()
            .flatten()
    }

    pub fn lookup(&self, source: &str, key: &[u8]) -> Option<Package> {
        let json: String = self
            .conn
            .as_ref()?
            .prepare_cached(
                "SELECT p.json FROM files f JOIN packages p ON p.id = f.package_id
                 WHERE f.source = ?1 AND f.key = ?2",
            )
            .and_then(|mut s| s.query_row(params![source, key], |r| r.get(0)).optional())
            .ok()
            .flatten()?;
        serde_json::from_str(&json).ok()
    }

    /// The entries of `source` whose key starts with `prefix` (a range of the primary key).
    pub fn prefixed(&self, source: &str, prefix: &[u8]) -> Vec<(Vec<u8>, Package)> {
        let Some(conn) = &self.conn else {
            return Vec::new();
        };
        let mut upper = prefix.to_vec();
        while let Some(last) = upper.pop() {
            if last < 0xff {
                upper.push(last + 1);
                break;
            }
        }
        let rows = conn
            .prepare_cached(
                "SELECT f.key, p.json FROM files f JOIN packages p ON p.id = f.package_id
                 WHERE f.source = ?1 AND f.key >= ?2 AND (?3 IS NULL OR f.key < ?3)",
            )
            .and_then(|mut s| {
                let upper = (!upper.is_empty()).then_some(upper);
                s.query_map(params![source, prefix, upper], |r| {
                    Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, String>(1)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .unwrap_or_default();
        rows.into_iter()
            .filter_map(|(k, j)| Some((k, serde_json::from_str(&j).ok()?)))
            .collect()
    }

    /// Replaces index `index.source`. A failure only means it is rebuilt next time.
    pub fn replace(&mut self, index: &PackageIndex) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let mut write = || -> rusqlite::Result<()> {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            tx.execute("DELETE FROM files WHERE source = ?1", [&index.source])?;
            {
                let mut add_pkg = tx.prepare_cached(
                    "INSERT INTO packages (json) VALUES (?1) ON CONFLICT DO NOTHING",
                )?;
                let mut pkg_id = tx.prepare_cached("SELECT id FROM packages WHERE json = ?1")?;
                let mut add_file = tx.prepare_cached(
                    "INSERT OR REPLACE INTO files (source, key, package_id) VALUES (?1, ?2, ?3)",
                )?;
                let mut ids = std::collections::HashMap::new();
                for (key, p) in &index.entries {
                    let id = match ids.get(p) {
                        Some(id) => *id,
                        None => {
                            let json = serde_json::to_string(p).unwrap_or_default();
                            add_pkg.execute([&json])?;
                            let id: i64 = pkg_id.query_row([&json], |r| r.get(0))?;
                            ids.insert(p.clone(), id);
                            id
                        }
                    };
                    add_file.execute(params![index.source, key, id])?;
                }
            }
            tx.execute(
                "INSERT OR REPLACE INTO sources (source, stamp) VALUES (?1, ?2)",
                params![index.source, index.stamp],
            )?;
            tx.commit()
        };
        if let Err(e) = write() {
            tracing::warn!("package index {} not cached: {e}", index.source);
        }
    }

    /// The machine probed in boot `boot_id` on `host`.
    pub fn runtime(&self, boot_id: &str, host: Option<&str>) -> Option<Runtime> {
        let (h, json): (Option<String>, String) = self
            .conn
            .as_ref()?
            .prepare_cached("SELECT host, json FROM runtimes WHERE boot_id = ?1")
            .and_then(|mut s| {
                s.query_row([boot_id], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .ok()
            .flatten()?;
        (h.as_deref() == host).then(|| serde_json::from_str(&json).ok())?
    }

    pub fn keep_runtime(&self, boot_id: &str, rt: &Runtime) {
        if let Some(conn) = &self.conn {
            let json = serde_json::to_string(rt).unwrap_or_default();
            let _ = conn.execute(
                "INSERT OR REPLACE INTO runtimes (boot_id, host, json) VALUES (?1, ?2, ?3)",
                params![boot_id, rt.hostname, json],
            );
        }
    }
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    if let Some(parent) = path.parent() {
        let _ = roar_store::private::create_dir(parent);
    }
    let _ = roar_store::private::create_file(path);
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    conn.execute_batch("PRAGMA synchronous = NORMAL")?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version != VERSION {
        // Another layout (an older or newer roar): a cache is rebuilt, never migrated.
        conn.execute_batch(
            "DROP TABLE IF EXISTS files; DROP TABLE IF EXISTS packages;
             DROP TABLE IF EXISTS sources; DROP TABLE IF EXISTS runtimes;",
        )?;
        conn.execute_batch(SCHEMA)?;
        conn.pragma_update(None, "user_version", VERSION)?;
    }
    Ok(conn)
}
