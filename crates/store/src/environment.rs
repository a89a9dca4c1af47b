//! A job's environment as recorded: the packages it used, the machine it ran on and the exact
//! code (the dirty tree's diff as a content-addressed blob). What is captured and how is the
//! `roar-env` crate; this module is the records, their tables and the package indexes' storage.
//!
//! Tables (schema 8): `packages` (one row per distinct package version and location),
//! `job_packages` (which a job used), `runtimes` (machines, deduplicated by content), `blobs`
//! (content-addressed bytes: diffs), and the package indexes (`env_sources`: one per dpkg
//! database or Python site directory, with the identity of what it was built from;
//! `env_files`: key -> package).

use rusqlite::{params, Connection, OptionalExtension, Transaction};
use serde::{Deserialize, Serialize};

/// One package version a job used.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Package {
    /// `python` (a distribution), `dpkg`, or `interpreter`.
    pub kind: String,
    pub name: String,
    pub version: String,
    /// Who installed it: pip, uv, conda, poetry... (Python distributions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installer: Option<String>,
    /// Where it lives: the site directory, an editable install's source directory, the
    /// interpreter's path. None for system packages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// An editable install's git commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// The machine a job ran on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Runtime {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_model: Option<String>,
    /// Logical CPUs this process may run on.
    pub cpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// `PRETTY_NAME` of os-release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// docker, podman, kubernetes, lxc... when the job ran in a container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The hypervisor when the machine is a virtual one (kvm, vmware, microsoft, xen...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtualization: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
}

/// What a job record carries besides its files: written with the job, in its transaction.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// Sorted, each once.
    pub packages: Vec<Package>,
    pub runtime: Option<Runtime>,
    /// The boot the runtime was probed in: a later job in the same boot reuses it unprobed.
    pub boot_id: Option<String>,
    /// `git diff HEAD --binary` of a dirty tree; its blake3 is [`crate::GitState::diff`].
    pub diff: Option<Vec<u8>>,
}

/// A job's environment as read back (`roar show --env`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct EnvironmentDetail {
    pub packages: Vec<Package>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
}

pub fn blake3_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Writes `env` for job `job_id` (in the job's transaction).
pub(crate) fn insert(tx: &Transaction, job_id: i64, env: &Environment) -> rusqlite::Result<()> {
    if let Some(diff) = &env.diff {
        tx.prepare_cached("INSERT INTO blobs (blake3, data) VALUES (?1, ?2) ON CONFLICT DO NOTHING")?
            .execute(params![blake3_hex(diff), diff])?;
    }
    if let Some(rt) = &env.runtime {
        let info = serde_json::to_string(rt).unwrap_or_default();
        let digest = blake3_hex(info.as_bytes());
        tx.prepare_cached(
            "INSERT INTO runtimes (digest, boot_id, info) VALUES (?1, ?2, ?3)
             ON CONFLICT (digest) DO UPDATE SET boot_id = coalesce(excluded.boot_id, boot_id)",
        )?
        .execute(params![digest, env.boot_id, info])?;
        tx.prepare_cached(
            "UPDATE jobs SET runtime_id = (SELECT id FROM runtimes WHERE digest = ?1) WHERE id = ?2",
        )?
        .execute(params![digest, job_id])?;
    }
    let mut link = tx.prepare_cached(
        "INSERT OR IGNORE INTO job_packages (job_id, package_id) VALUES (?1, ?2)",
    )?;
    for p in &env.packages {
        let id = package_id(tx, p)?;
        link.execute(params![job_id, id])?;
    }
    Ok(())
}

fn package_id(conn: &Connection, p: &Package) -> rusqlite::Result<i64> {
    let location = p.location.clone().unwrap_or_default();
    let commit = p.commit.clone().unwrap_or_default();
    conn.prepare_cached(
        "INSERT INTO packages (kind, name, version, installer, location, commit_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
    )?
    .execute(params![p.kind, p.name, p.version, p.installer, location, commit])?;
    conn.prepare_cached(
        "SELECT id FROM packages WHERE kind = ?1 AND name = ?2 AND version = ?3
           AND location = ?4 AND commit_id = ?5",
    )?
    .query_row(params![p.kind, p.name, p.version, location, commit], |r| {
        r.get(0)
    })
}

fn package_from_row(r: &rusqlite::Row, at: usize) -> rusqlite::Result<Package> {
    let nonempty = |s: String| (!s.is_empty()).then_some(s);
    Ok(Package {
        kind: r.get(at)?,
        name: r.get(at + 1)?,
        version: r.get(at + 2)?,
        installer: r.get(at + 3)?,
        location: nonempty(r.get(at + 4)?),
        commit: nonempty(r.get(at + 5)?),
    })
}

/// The packages job `job_id` used, sorted by kind and name.
pub(crate) fn packages_of(conn: &Connection, job_id: i64) -> rusqlite::Result<Vec<Package>> {
    let mut stmt = conn.prepare_cached(
        "SELECT p.kind, p.name, p.version, p.installer, p.location, p.commit_id
         FROM job_packages j JOIN packages p ON p.id = j.package_id
         WHERE j.job_id = ?1 ORDER BY p.kind, p.name, p.version",
    )?;
    let rows = stmt.query_map([job_id], |r| package_from_row(r, 0))?;
    rows.collect()
}

/// The runtime job `job_id` ran on.
pub(crate) fn runtime_of(conn: &Connection, job_id: i64) -> rusqlite::Result<Option<Runtime>> {
    let info: Option<String> = conn
        .query_row(
            "SELECT r.info FROM jobs j JOIN runtimes r ON r.id = j.runtime_id WHERE j.id = ?1",
            [job_id],
            |r| r.get(0),
        )
        .optional()?;
    Ok(info.and_then(|s| serde_json::from_str(&s).ok()))
}

/// The runtime last recorded in boot `boot_id`, if it was probed on `host`.
pub fn runtime_for_boot(
    conn: &Connection,
    boot_id: &str,
    host: Option<&str>,
) -> rusqlite::Result<Option<Runtime>> {
    let found: Option<String> = conn
        .prepare_cached("SELECT info FROM runtimes WHERE boot_id = ?1 ORDER BY id DESC LIMIT 1")?
        .query_row([boot_id], |r| r.get(0))
        .optional()?;
    Ok(found
        .and_then(|s| serde_json::from_str::<Runtime>(&s).ok())
        .filter(|rt| rt.hostname.as_deref() == host))
}

/// A content-addressed blob (a diff), by its blake3.
pub fn blob(conn: &Connection, blake3: &str) -> rusqlite::Result<Option<Vec<u8>>> {
    conn.query_row("SELECT data FROM blobs WHERE blake3 = ?1", [blake3], |r| {
        r.get(0)
    })
    .optional()
}

/// A package index: `source` names what was indexed (`dpkg`, `python:SITE_DIR`), `stamp` the
/// identity of its files when it was built, `entries` key -> package.
#[derive(Debug, Clone, Default)]
pub struct PackageIndex {
    pub source: String,
    pub stamp: String,
    pub entries: Vec<(Vec<u8>, Package)>,
}

/// The stamp index `source` was built with, if it was.
pub fn index_stamp(conn: &Connection, source: &str) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT stamp FROM env_sources WHERE source = ?1")?
        .query_row([source], |r| r.get(0))
        .optional()
}

/// The package `key` maps to in index `source`.
pub fn index_lookup(
    conn: &Connection,
    source: &str,
    key: &[u8],
) -> rusqlite::Result<Option<Package>> {
    conn.prepare_cached(
        "SELECT p.kind, p.name, p.version, p.installer, p.location, p.commit_id
         FROM env_files f JOIN packages p ON p.id = f.package_id
         WHERE f.source = ?1 AND f.key = ?2",
    )?
    .query_row(params![source, key], |r| package_from_row(r, 0))
    .optional()
}

/// The entries of index `source` whose key starts with `prefix`.
pub fn index_prefixed(
    conn: &Connection,
    source: &str,
    prefix: &[u8],
) -> rusqlite::Result<Vec<(Vec<u8>, Package)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT f.key, p.kind, p.name, p.version, p.installer, p.location, p.commit_id
         FROM env_files f JOIN packages p ON p.id = f.package_id
         WHERE f.source = ?1 AND f.key >= ?2 AND f.key < ?3",
    )?;
    // The keys from `prefix` up to the next prefix of its length: a range of the primary key.
    let mut upper = prefix.to_vec();
    while let Some(last) = upper.pop() {
        if last < 0xff {
            upper.push(last + 1);
            break;
        }
    }
    let upper: &[u8] = if upper.is_empty() { &[0xff; 64] } else { &upper };
    let rows = stmt.query_map(params![source, prefix, upper], |r| {
        Ok((r.get(0)?, package_from_row(r, 1)?))
    })?;
    rows.collect()
}

/// Replaces index `source` (in the writer's transaction).
pub(crate) fn replace_index(tx: &Transaction, index: &PackageIndex) -> rusqlite::Result<()> {
    tx.execute("DELETE FROM env_files WHERE source = ?1", [&index.source])?;
    tx.execute(
        "INSERT OR REPLACE INTO env_sources (source, stamp) VALUES (?1, ?2)",
        params![index.source, index.stamp],
    )?;
    let mut insert = tx.prepare_cached(
        "INSERT OR REPLACE INTO env_files (source, key, package_id) VALUES (?1, ?2, ?3)",
    )?;
    let mut ids = std::collections::HashMap::new();
    for (key, p) in &index.entries {
        let id = match ids.get(p) {
            Some(id) => *id,
            None => {
                let id = package_id(tx, p)?;
                ids.insert(p.clone(), id);
                id
            }
        };
        insert.execute(params![index.source, key, id])?;
    }
    Ok(())
}
