//! A job's environment as recorded: the packages it used, the machine it ran on and the exact
//! code (the dirty tree's diff as a content-addressed blob). What is captured and how is the
//! `roar-env` crate (its package indexes are a per-user cache, not part of the store); this
//! module is the records and their tables.
//!
//! Tables (schema 8): `packages` (one row per distinct package version and location),
//! `job_packages` (which a job used), `runtimes` (machines, deduplicated by content), `blobs`
//! (content-addressed bytes: diffs).

use rusqlite::{params, Connection, OptionalExtension};
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
pub(crate) fn insert(tx: &Connection, job_id: i64, env: &Environment) -> rusqlite::Result<()> {
    if let Some(diff) = &env.diff {
        tx.prepare_cached(
            "INSERT INTO blobs (blake3, data) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        )?
        .execute(params![blake3_hex(diff), diff])?;
    }
    if let Some(rt) = &env.runtime {
        let info = serde_json::to_string(rt).unwrap_or_default();
        let digest = blake3_hex(info.as_bytes());
        tx.prepare_cached(
            "INSERT INTO runtimes (digest, info) VALUES (?1, ?2) ON CONFLICT (digest) DO NOTHING",
        )?
        .execute(params![digest, info])?;
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
    .execute(params![
        p.kind,
        p.name,
        p.version,
        p.installer,
        location,
        commit
    ])?;
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
pub fn packages_of(conn: &Connection, job_id: i64) -> rusqlite::Result<Vec<Package>> {
    let mut stmt = conn.prepare_cached(
        "SELECT p.kind, p.name, p.version, p.installer, p.location, p.commit_id
         FROM job_packages j JOIN packages p ON p.id = j.package_id
         WHERE j.job_id = ?1 ORDER BY p.kind, p.name, p.version",
    )?;
    let rows = stmt.query_map([job_id], |r| package_from_row(r, 0))?;
    rows.collect()
}

/// The runtime job `job_id` ran on.
pub fn runtime_of(conn: &Connection, job_id: i64) -> rusqlite::Result<Option<Runtime>> {
    let info: Option<String> = conn
        .prepare_cached(
            "SELECT r.info FROM jobs j JOIN runtimes r ON r.id = j.runtime_id WHERE j.id = ?1",
        )?
        .query_row([job_id], |r| r.get(0))
        .optional()?;
    Ok(info.and_then(|s| serde_json::from_str(&s).ok()))
}

/// A content-addressed blob (a diff), by its blake3.
pub fn blob(conn: &Connection, blake3: &str) -> rusqlite::Result<Option<Vec<u8>>> {
    conn.prepare_cached("SELECT data FROM blobs WHERE blake3 = ?1")?
        .query_row([blake3], |r| r.get(0))
        .optional()
}
