//! The package indexes and the last machine probe, kept per user (`$ROAR_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/roar`, else `~/.cache/roar`; `packages.db`): what is installed belongs to
//! the machine, not to a project, so every project's first job must not re-index dpkg (115,000
//! files here: a second or so). Derived data only: deleting the file costs one rebuild, and a
//! cache that cannot be opened means indexes built for the job alone, never a wrong answer.

use std::cell::RefCell;
use std::collections::HashMap;
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
    /// Answers of [`Cache::lookup`] per source, kept while the source's stored stamp is the one
    /// [`Cache::stamp`] read last (every resolution reads it before looking anything up, and a
    /// stored index does not change under one stamp). A job's files share a few keys; the
    /// resident recorder keeps one `Cache` for every job, and asks the same keys each time.
    memo: RefCell<HashMap<String, Answers>>,
}

/// One source's stamp and the answers known under it.
#[derive(Default)]
struct Answers {
    stamp: Option<String>,
    by_key: HashMap<Vec<u8>, Option<Package>>,
}

/// Answers kept per source, at most: past this the source's are dropped and asked again.
const MEMO_PER_SOURCE: usize = 1 << 16;

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
    /// A home that cannot be written (a service account, a read-only container) falls back to
    /// a directory of this user's under the system's temporary directory.
    pub fn open() -> Cache {
        // SAFETY: getuid cannot fail.
        #[allow(unsafe_code)]
        let uid = unsafe { libc::getuid() };
        let fallback = std::env::temp_dir().join(format!("roar-cache-{uid}"));
        let conn = dir()
            .into_iter()
            .chain([fallback])
            .find_map(|d| open(&d.join("packages.db")).ok());
        Cache {
            conn,
            memo: RefCell::default(),
        }
    }

    /// A cache that keeps nothing.
    pub fn none() -> Cache {
        Cache {
            conn: None,
            memo: RefCell::default(),
        }
    }

    pub fn at(path: &Path) -> Cache {
        Cache {
            conn: open(path).ok(),
            memo: RefCell::default(),
        }
    }

    pub fn stamp(&self, source: &str) -> Option<String> {
        let stamp: Option<String> = self
            .conn
            .as_ref()?
            .prepare_cached("SELECT stamp FROM sources WHERE source = ?1")
            .and_then(|mut s| s.query_row([source], |r| r.get(0)).optional())
            .ok()
            .flatten();
        let mut memo = self.memo.borrow_mut();
        let answers = memo.entry(source.to_owned()).or_default();
        if answers.stamp != stamp {
            *answers = Answers {
                stamp: stamp.clone(),
                by_key: HashMap::new(),
            };
        }
        stamp
    }

    pub fn lookup(&self, source: &str, key: &[u8]) -> Option<Package> {
        if let Some(found) = self
            .memo
            .borrow()
            .get(source)
            .and_then(|a| a.by_key.get(key))
        {
            return found.clone();
        }
        let found = self.lookup_stored(source, key);
        let mut memo = self.memo.borrow_mut();
        let answers = memo.entry(source.to_owned()).or_default();
        if answers.by_key.len() >= MEMO_PER_SOURCE {
            answers.by_key.clear();
        }
        answers.by_key.insert(key.to_vec(), found.clone());
        found
    }

    fn lookup_stored(&self, source: &str, key: &[u8]) -> Option<Package> {
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
        self.memo.get_mut().remove(&index.source);
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
    let refuse = || rusqlite::Error::InvalidPath(path.to_owned());
    if let Some(parent) = path.parent() {
        let _ = roar_store::private::create_dir(parent);
        // Another user's directory (planted in /tmp, say) is never trusted with the cache.
        use std::os::unix::fs::MetadataExt;
        // SAFETY: getuid cannot fail.
        #[allow(unsafe_code)]
        let uid = unsafe { libc::getuid() };
        let m = std::fs::symlink_metadata(parent).map_err(|_| refuse())?;
        if !m.is_dir() || m.uid() != uid || m.mode() & 0o002 != 0 {
            return Err(refuse());
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pkg(name: &str) -> Package {
        Package {
            kind: "python".into(),
            name: name.into(),
            version: "1.0".into(),
            installer: Some("pip".into()),
            location: Some("/site".into()),
            commit: None,
        }
    }

    #[test]
    fn an_answer_kept_is_dropped_when_another_process_restamps_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("packages.db");
        // Two processes: the resident recorder's long-lived cache, and a run that re-indexes.
        let (resident, mut other) = (Cache::at(&db), Cache::at(&db));
        let index = |stamp: &str, name: &str| PackageIndex {
            source: "dpkg".into(),
            stamp: stamp.into(),
            entries: vec![(b"/usr/bin/x".to_vec(), pkg(name))],
        };
        other.replace(&index("1", "old"));
        assert_eq!(resident.stamp("dpkg").as_deref(), Some("1"));
        assert_eq!(resident.lookup("dpkg", b"/usr/bin/x"), Some(pkg("old")));
        assert_eq!(resident.lookup("dpkg", b"/usr/bin/y"), None);
        other.replace(&index("2", "new"));
        // A resolution reads the stamp first: the answers kept under "1" go with it.
        assert_eq!(resident.stamp("dpkg").as_deref(), Some("2"));
        assert_eq!(resident.lookup("dpkg", b"/usr/bin/x"), Some(pkg("new")));
    }

    #[test]
    fn indexes_round_trip_and_are_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut cache = Cache::at(&dir.path().join("c/packages.db"));
        assert_eq!(cache.stamp("python:/site"), None);
        cache.replace(&PackageIndex {
            source: "python:/site".into(),
            stamp: "1".into(),
            entries: vec![
                (b"numpy".to_vec(), pkg("numpy")),
                (b"editable:/src/a".to_vec(), pkg("a")),
                (b"editable:/src/b".to_vec(), pkg("b")),
                (b"editablf".to_vec(), pkg("not-a-prefix-match")),
            ],
        });
        assert_eq!(cache.stamp("python:/site").as_deref(), Some("1"));
        assert_eq!(cache.lookup("python:/site", b"numpy"), Some(pkg("numpy")));
        assert_eq!(cache.lookup("dpkg", b"numpy"), None);
        let editable: Vec<String> = cache
            .prefixed("python:/site", b"editable:")
            .into_iter()
            .map(|(_, p)| p.name)
            .collect();
        assert_eq!(editable, ["a", "b"]);
        cache.replace(&PackageIndex {
            source: "python:/site".into(),
            stamp: "2".into(),
            entries: vec![(b"six.py".to_vec(), pkg("six"))],
        });
        assert_eq!(
            cache.lookup("python:/site", b"numpy"),
            None,
            "the old index is gone"
        );
        assert_eq!(cache.lookup("python:/site", b"six.py"), Some(pkg("six")));
        let rt = Runtime {
            hostname: Some("h".into()),
            cpus: 2,
            ..Runtime::default()
        };
        cache.keep_runtime("boot-1", &rt);
        assert_eq!(cache.runtime("boot-1", Some("h")), Some(rt));
        assert_eq!(cache.runtime("boot-1", Some("other-host")), None);
        assert_eq!(cache.runtime("boot-2", Some("h")), None);
    }

    #[test]
    fn a_directory_of_another_user_or_world_writable_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open_dir = dir.path().join("world");
        std::fs::create_dir(&open_dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(open(&open_dir.join("packages.db")).is_err());
        // SAFETY: getuid cannot fail.
        #[allow(unsafe_code)]
        if unsafe { libc::getuid() } == 0 {
            let theirs = dir.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            assert!(open(&theirs.join("packages.db")).is_err());
        }
    }
}
