//! Auditing a store for secrets recorded before redaction existed (or before a `[redact]` rule
//! was added), and removing them: `roar db --secrets-scan` and `roar db --redact`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

use rusqlite::{params, Connection};
use serde::Serialize;

use crate::error::Result;
use crate::model::{argv_from_blob, argv_to_blob};
use crate::redact::Policy;
use crate::Store;

/// One stored field that holds a secret by the current rules. The value is never included:
/// `redacted` shows the field as it would be stored now.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub job_id: i64,
    /// `name`, `argv[3]`, `env.DB_URL`, `process 1234 argv[1]` or `step 2 argv[1]`.
    pub field: String,
    pub redacted: String,
}

/// A stored row and what redaction makes of it.
struct Row {
    job_id: i64,
    name: Option<String>,
    argv: Vec<OsString>,
    env: BTreeMap<String, String>,
}

fn argv_findings(
    policy: &Policy,
    job_id: i64,
    prefix: &str,
    argv: &[OsString],
    out: &mut Vec<Finding>,
) -> Option<Vec<OsString>> {
    let mut redacted = argv.to_vec();
    if policy.argv(&mut redacted) == 0 {
        return None;
    }
    for (i, (a, b)) in argv.iter().zip(&redacted).enumerate() {
        if a != b {
            out.push(Finding {
                job_id,
                field: format!("{prefix}argv[{i}]"),
                redacted: b.to_string_lossy().into_owned(),
            });
        }
    }
    Some(redacted)
}

/// Every field of the store that the rules would redact now.
pub fn scan(store: &Store, policy: &Policy) -> Result<Vec<Finding>> {
    Ok(plan(store.conn(), policy).map_err(|e| store.err(e))?.0)
}

type Updates = (
    Vec<(i64, Option<String>, Vec<u8>, String)>,
    Vec<(i64, Vec<u8>)>,
    Vec<(i64, Vec<u8>)>,
);

/// The findings, and the updates that would remove them: (job rows, process rows, step rows).
fn plan(conn: &Connection, policy: &Policy) -> rusqlite::Result<(Vec<Finding>, Updates)> {
    let mut findings = Vec::new();
    let mut jobs = Vec::new();
    let mut stmt = conn.prepare("SELECT id, name, argv, env FROM jobs ORDER BY id")?;
    let rows = stmt.query_map([], |r| {
        let env: String = r.get(3)?;
        Ok(Row {
            job_id: r.get(0)?,
            name: r.get(1)?,
            argv: argv_from_blob(&r.get::<_, Vec<u8>>(2)?),
            env: serde_json::from_str(&env).unwrap_or_default(),
        })
    })?;
    for row in rows {
        let row = row?;
        let argv = argv_findings(policy, row.job_id, "", &row.argv, &mut findings);
        let name = row.name.as_deref().and_then(|n| policy.scrub(n));
        if let Some(n) = &name {
            findings.push(Finding {
                job_id: row.job_id,
                field: "name".into(),
                redacted: n.clone(),
            });
        }
        let mut env = row.env.clone();
        if policy.env(&mut env) > 0 {
            for (k, v) in &env {
                if row.env.get(k) != Some(v) {
                    findings.push(Finding {
                        job_id: row.job_id,
                        field: format!("env.{k}"),
                        redacted: v.clone(),
                    });
                }
            }
        }
        if argv.is_some() || name.is_some() || env != row.env {
            jobs.push((
                row.job_id,
                name.or(row.name),
                argv_to_blob(argv.as_deref().unwrap_or(&row.argv)),
                serde_json::to_string(&env).unwrap_or_else(|_| "{}".into()),
            ));
        }
    }
    let procs = argv_rows(
        conn,
        policy,
        "SELECT id, job_id, pid, argv FROM processes ORDER BY job_id, id",
        "process",
        &mut findings,
    )?;
    let steps = argv_rows(
        conn,
        policy,
        "SELECT id, job_id, seq, argv FROM steps ORDER BY job_id, seq",
        "step",
        &mut findings,
    )?;
    Ok((findings, (jobs, procs, steps)))
}

/// The argv rows `sql` selects (row id, job id, a number naming the row — a pid, a step — and
/// the argv) that the rules would redact now, as updates; each finding is named `WHAT N argv[i]`.
fn argv_rows(
    conn: &Connection,
    policy: &Policy,
    sql: &str,
    what: &str,
    findings: &mut Vec<Finding>,
) -> rusqlite::Result<Vec<(i64, Vec<u8>)>> {
    let mut updates = Vec::new();
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, Vec<u8>>(3)?,
        ))
    })?;
    for row in rows {
        let (rowid, job_id, n, blob) = row?;
        let argv = argv_from_blob(&blob);
        if let Some(new) = argv_findings(policy, job_id, &format!("{what} {n} "), &argv, findings) {
            updates.push((rowid, argv_to_blob(&new)));
        }
    }
    Ok(updates)
}

/// Redacts the store at `path` in place by the current rules, then rewrites the file so no old
/// value survives in free pages or the WAL (`secure_delete`, `VACUUM`, a truncating checkpoint).
/// Returns what was redacted.
pub fn redact_store(path: &Path, policy: &Policy) -> Result<Vec<Finding>> {
    let mut conn = crate::db::open(path, false)?;
    let classify = |e| crate::db::classify(path, e);
    conn.pragma_update(None, "secure_delete", true)
        .map_err(classify)?;
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(classify)?;
    let (findings, (jobs, procs, steps)) = plan(&tx, policy).map_err(classify)?;
    for (id, name, argv, env) in &jobs {
        tx.execute(
            "UPDATE jobs SET name = ?2, argv = ?3, env = ?4 WHERE id = ?1",
            params![id, name, argv, env],
        )
        .map_err(classify)?;
    }
    for (rowid, argv) in &procs {
        tx.execute(
            "UPDATE processes SET argv = ?2 WHERE id = ?1",
            params![rowid, argv],
        )
        .map_err(classify)?;
    }
    for (rowid, argv) in &steps {
        tx.execute(
            "UPDATE steps SET argv = ?2 WHERE id = ?1",
            params![rowid, argv],
        )
        .map_err(classify)?;
    }
    tx.commit().map_err(classify)?;
    if !findings.is_empty() {
        conn.execute_batch("VACUUM").map_err(classify)?;
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .map_err(classify)?;
    Ok(findings)
}
