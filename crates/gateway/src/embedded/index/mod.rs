//! The embedded store's index: buckets, object versions, multipart uploads and their parts, in
//! SQLite (`objects.db` beside the blobs, WAL, shared by every process that serves the store).
//!
//! Keys are stored as BLOBs so that ordering is the byte order of their UTF-8 (S3's listing
//! order) and a listing can skip past a common prefix by byte arithmetic. A key is only ever a
//! column value: there is no path for it to escape through. Every change that must be atomic
//! (a conditional PUT, an overwrite that demotes the previous version, completing an upload) is
//! one `BEGIN IMMEDIATE` transaction, so gateways in different processes serialize on the
//! database, never on the file system.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Row, Transaction, TransactionBehavior};
use serde::{Deserialize, Serialize};

mod versions;

use versions::put_in;

/// How long a gateway waits for another process's hold on the index.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS buckets (
    name TEXT PRIMARY KEY,
    created_ns INTEGER NOT NULL,
    versioning TEXT,
    owner TEXT
);
CREATE TABLE IF NOT EXISTS versions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    bucket TEXT NOT NULL,
    key BLOB NOT NULL,
    version_id TEXT NOT NULL,
    latest INTEGER NOT NULL,
    delete_marker INTEGER NOT NULL DEFAULT 0,
    blob TEXT,
    size INTEGER NOT NULL DEFAULT 0,
    etag TEXT NOT NULL DEFAULT '',
    modified_ns INTEGER NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    checksums TEXT NOT NULL DEFAULT '{}',
    tags TEXT NOT NULL DEFAULT '[]',
    part_sizes TEXT NOT NULL DEFAULT '[]',
    UNIQUE (bucket, key, version_id)
);
CREATE INDEX IF NOT EXISTS versions_latest ON versions (bucket, key) WHERE latest = 1;
CREATE INDEX IF NOT EXISTS versions_blob ON versions (blob);
CREATE TABLE IF NOT EXISTS uploads (
    upload_id TEXT PRIMARY KEY,
    bucket TEXT NOT NULL,
    key BLOB NOT NULL,
    initiated_ns INTEGER NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    checksum_algorithm TEXT,
    checksum_type TEXT,
    tags TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS uploads_key ON uploads (bucket, key);
CREATE TABLE IF NOT EXISTS parts (
    upload_id TEXT NOT NULL REFERENCES uploads (upload_id) ON DELETE CASCADE,
    part_number INTEGER NOT NULL,
    blob TEXT NOT NULL,
    size INTEGER NOT NULL,
    etag TEXT NOT NULL,
    md5 BLOB NOT NULL,
    checksums TEXT NOT NULL DEFAULT '{}',
    modified_ns INTEGER NOT NULL,
    PRIMARY KEY (upload_id, part_number)
);
CREATE INDEX IF NOT EXISTS parts_blob ON parts (blob);
";

/// Headers stored with an object and served back with it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Meta {
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub content_disposition: Option<String>,
    pub content_language: Option<String>,
    pub cache_control: Option<String>,
    /// Seconds since the epoch.
    pub expires: Option<i64>,
    pub website_redirect_location: Option<String>,
    pub storage_class: Option<String>,
    pub user: BTreeMap<String, String>,
}

/// The checksums an object was stored with (base64, composite ones end in `-N`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Checksums {
    pub crc32: Option<String>,
    pub crc32c: Option<String>,
    pub crc64nvme: Option<String>,
    pub sha1: Option<String>,
    pub sha256: Option<String>,
    /// `FULL_OBJECT` or `COMPOSITE`.
    pub kind: Option<String>,
}

pub(crate) type Tags = Vec<(String, String)>;

#[derive(Debug, Clone)]
pub(crate) struct Version {
    pub seq: i64,
    pub key: String,
    pub version_id: String,
    pub latest: bool,
    pub delete_marker: bool,
    pub blob: Option<String>,
    pub size: u64,
    pub etag: String,
    pub modified_ns: i64,
    pub meta: Meta,
    pub checksums: Checksums,
    pub tags: Tags,
    pub part_sizes: Vec<u64>,
}

/// What a write stores; the version id is the index's to choose.
#[derive(Debug, Clone, Default)]
pub(crate) struct NewVersion {
    pub blob: String,
    pub size: u64,
    pub etag: String,
    pub meta: Meta,
    pub checksums: Checksums,
    pub tags: Tags,
    pub part_sizes: Vec<u64>,
}

/// Conditions a write must meet against the key's current version.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriteIf {
    /// `If-None-Match: *`: only if the key has no current object.
    pub absent: bool,
    /// `If-Match`: only if the current object's ETag is this (`*`: only if one exists).
    pub etag: Option<String>,
}

#[derive(Debug)]
pub(crate) enum Refused {
    NoSuchBucket,
    NoSuchUpload,
    Precondition,
    BucketNotEmpty,
    BucketExists,
    NoSuchVersion,
}

#[derive(Debug)]
pub(crate) enum Error {
    Refused(Refused),
    Db(rusqlite::Error),
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Error {
        Error::Db(e)
    }
}

impl From<Refused> for Error {
    fn from(r: Refused) -> Error {
        Error::Refused(r)
    }
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    pub name: String,
    pub created_ns: i64,
    pub versioning: Option<String>,
    /// The member key that made it; None: the project's (made with a project key, or before
    /// buckets had owners).
    pub owner: Option<String>,
}

/// What a delete did.
#[derive(Debug, Clone, Default)]
pub(crate) struct Deleted {
    pub version_id: Option<String>,
    pub delete_marker: bool,
}

pub(crate) struct Index {
    db: Mutex<Connection>,
}

mod uploads;

pub(crate) use uploads::{Part, Upload};

const VERSION_COLUMNS: &str = "seq, key, version_id, latest, delete_marker, blob, size, etag, \
     modified_ns, meta, checksums, tags, part_sizes";

fn json<T: serde::de::DeserializeOwned + Default>(s: String) -> T {
    serde_json::from_str(&s).unwrap_or_default()
}

fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "{}".into())
}

fn key_of(row: &Row, idx: usize) -> rusqlite::Result<String> {
    let bytes: Vec<u8> = row.get(idx)?;
    // Keys are written from &str only.
    Ok(String::from_utf8(bytes).unwrap_or_default())
}

fn version_of(row: &Row) -> rusqlite::Result<Version> {
    Ok(Version {
        seq: row.get(0)?,
        key: key_of(row, 1)?,
        version_id: row.get(2)?,
        latest: row.get(3)?,
        delete_marker: row.get(4)?,
        blob: row.get(5)?,
        size: row.get::<_, i64>(6)? as u64,
        etag: row.get(7)?,
        modified_ns: row.get(8)?,
        meta: json(row.get(9)?),
        checksums: json(row.get(10)?),
        tags: json(row.get(11)?),
        part_sizes: json(row.get(12)?),
    })
}

/// A random id for versions and uploads: 128 bits, hex.
pub(crate) fn random_id() -> String {
    let mut raw = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut raw);
    }
    // Never two equal ids even if /dev/urandom were unreadable: mix in time and a counter.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = roar_store::now_ns() as u64 ^ (u64::from(std::process::id()) << 32);
    for (i, b) in t
        .to_le_bytes()
        .iter()
        .chain(n.to_le_bytes().iter())
        .enumerate()
    {
        raw[i] ^= b;
    }
    super::blobs::hex(&raw)
}

impl Index {
    /// Opens (and if new, makes) the index at `path`. Gateways opening one new store at once
    /// (concurrent `roar run --s3`) race to switch it to WAL, and SQLite answers the loser
    /// SQLITE_BUSY at once, without its busy handler (waiting there could deadlock): the open is
    /// tried again, from a new connection, for as long as the busy timeout.
    pub(crate) fn open(path: &Path) -> rusqlite::Result<Index> {
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        let mut pause = Duration::from_millis(1);
        loop {
            match Index::open_once(path) {
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if matches!(
                        e.code,
                        rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                    ) && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                done => return done,
            }
        }
    }

    fn open_once(path: &Path) -> rusqlite::Result<Index> {
        let mut db = Connection::open(path)?;
        db.busy_timeout(BUSY_TIMEOUT)?;
        db.pragma_update(None, "journal_mode", "WAL")?;
        db.pragma_update(None, "synchronous", "NORMAL")?;
        db.pragma_update(None, "foreign_keys", "ON")?;
        // Under the write lock from the start: gateways opening one store at once (concurrent
        // `roar run --s3`) would otherwise read the schema, then find it changed when they write
        // and get SQLITE_BUSY at once (a read snapshot cannot wait for a lock).
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(SCHEMA)?;
        // Stores made before buckets had owners: every bucket the project's.
        let has_owner: bool = tx
            .prepare("SELECT 1 FROM pragma_table_info('buckets') WHERE name = 'owner'")?
            .exists([])?;
        if !has_owner {
            tx.execute_batch("ALTER TABLE buckets ADD COLUMN owner TEXT")?;
        }
        tx.commit()?;
        Ok(Index { db: Mutex::new(db) })
    }

    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let db = self.db.lock().unwrap_or_else(|e| e.into_inner());
        f(&db)
    }

    fn write<T>(&self, f: impl FnOnce(&Transaction) -> Result<T>) -> Result<T> {
        let mut db = self.db.lock().unwrap_or_else(|e| e.into_inner());
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }

    // ---- buckets ----

    pub(crate) fn create_bucket(&self, name: &str, owner: Option<&str>) -> Result<()> {
        self.write(|tx| {
            let n = tx.execute(
                "INSERT OR IGNORE INTO buckets (name, created_ns, owner) VALUES (?1, ?2, ?3)",
                params![name, roar_store::now_ns(), owner],
            )?;
            if n == 0 {
                return Err(Refused::BucketExists.into());
            }
            Ok(())
        })
    }

    pub(crate) fn bucket(&self, name: &str) -> Result<Bucket> {
        self.read(|db| bucket_in(db, name))
    }

    pub(crate) fn buckets(&self) -> Result<Vec<Bucket>> {
        self.read(|db| {
            let mut st = db
                .prepare("SELECT name, created_ns, versioning, owner FROM buckets ORDER BY name")?;
            let rows = st.query_map([], bucket_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// Deletes an empty bucket (no versions, delete markers included); its unfinished uploads go
    /// with it.
    pub(crate) fn delete_bucket(&self, name: &str) -> Result<()> {
        self.write(|tx| {
            bucket_in(tx, name)?;
            let any: Option<i64> = tx
                .query_row(
                    "SELECT 1 FROM versions WHERE bucket = ?1 LIMIT 1",
                    [name],
                    |r| r.get(0),
                )
                .optional()?;
            if any.is_some() {
                return Err(Refused::BucketNotEmpty.into());
            }
            tx.execute("DELETE FROM uploads WHERE bucket = ?1", [name])?;
            tx.execute("DELETE FROM buckets WHERE name = ?1", [name])?;
            Ok(())
        })
    }

    pub(crate) fn set_versioning(&self, name: &str, status: &str) -> Result<()> {
        self.write(|tx| {
            bucket_in(tx, name)?;
            tx.execute(
                "UPDATE buckets SET versioning = ?2 WHERE name = ?1",
                params![name, status],
            )?;
            Ok(())
        })
    }

    // ---- gc ----

    /// Every blob an object version or an unfinished upload's part refers to.
    pub(crate) fn referenced_blobs(&self) -> Result<std::collections::HashSet<String>> {
        self.read(|db| {
            let mut st = db.prepare(
                "SELECT blob FROM versions WHERE blob IS NOT NULL UNION SELECT blob FROM parts",
            )?;
            let rows = st.query_map([], |r| r.get::<_, String>(0))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }
}

fn bucket_in(db: &Connection, name: &str) -> Result<Bucket> {
    db.query_row(
        "SELECT name, created_ns, versioning, owner FROM buckets WHERE name = ?1",
        [name],
        bucket_row,
    )
    .optional()?
    .ok_or(Error::Refused(Refused::NoSuchBucket))
}

fn bucket_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Bucket> {
    Ok(Bucket {
        name: r.get(0)?,
        created_ns: r.get(1)?,
        versioning: r.get(2)?,
        owner: r.get(3)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gateways opening one new store at once all get its index (one of them used to get
    /// "database is locked" from the switch to WAL).
    #[test]
    fn indexes_opened_at_once_on_a_new_store_all_open() {
        for round in 0..30 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("objects.db");
            let start = std::sync::Barrier::new(8);
            std::thread::scope(|s| {
                let opened: Vec<_> = (0..8)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            Index::open(&path).map(|_| ())
                        })
                    })
                    .collect();
                for o in opened {
                    let r = o.join().unwrap();
                    assert!(r.is_ok(), "round {round}: {r:?}");
                }
            });
        }
    }
}
