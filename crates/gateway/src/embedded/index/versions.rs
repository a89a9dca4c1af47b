//! Object versions in the index: the current or a named version, a PUT (conditional, demoting the
//! version it replaces), a DELETE (a marker where versioning is on), tags, and listings of the
//! current versions and of every version, in S3's byte order of keys.

use super::*;

impl Index {
    // ---- object versions ----

    /// The key's current version (`version_id: None`) or the named one. A current delete marker
    /// is returned as such.
    pub(crate) fn version(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
    ) -> Result<Option<Version>> {
        self.read(|db| {
            bucket_in(db, bucket)?;
            version_in(db, bucket, key, version_id)
        })
    }

    /// Stores a new version of `key` as its current one, if `cond` holds. Where versioning is not
    /// enabled, the new version replaces the key's `null` version.
    pub(crate) fn put(
        &self,
        bucket: &str,
        key: &str,
        new: &NewVersion,
        cond: &WriteIf,
    ) -> Result<Version> {
        self.write(|tx| put_in(tx, bucket, key, new, cond))
    }

    pub(crate) fn delete(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
    ) -> Result<Deleted> {
        self.write(|tx| {
            let b = bucket_in(tx, bucket)?;
            let kb = key.as_bytes();
            if let Some(vid) = version_id {
                let Some(v) = version_in(tx, bucket, key, Some(vid))? else {
                    // Deleting a version that is not there succeeds (S3 does the same).
                    return Ok(Deleted {
                        version_id: Some(vid.to_owned()),
                        delete_marker: false,
                    });
                };
                tx.execute("DELETE FROM versions WHERE seq = ?1", [v.seq])?;
                if v.latest {
                    promote_newest(tx, bucket, kb)?;
                }
                return Ok(Deleted {
                    version_id: Some(vid.to_owned()),
                    delete_marker: v.delete_marker,
                });
            }
            match b.versioning.as_deref() {
                Some("Enabled") => {
                    let vid = random_id();
                    insert_marker(tx, bucket, kb, &vid)?;
                    Ok(Deleted {
                        version_id: Some(vid),
                        delete_marker: true,
                    })
                }
                Some(_) => {
                    tx.execute(
                        "DELETE FROM versions WHERE bucket = ?1 AND key = ?2 AND version_id = 'null'",
                        params![bucket, kb],
                    )?;
                    insert_marker(tx, bucket, kb, "null")?;
                    Ok(Deleted {
                        version_id: Some("null".into()),
                        delete_marker: true,
                    })
                }
                None => {
                    tx.execute(
                        "DELETE FROM versions WHERE bucket = ?1 AND key = ?2",
                        params![bucket, kb],
                    )?;
                    Ok(Deleted::default())
                }
            }
        })
    }

    pub(crate) fn set_tags(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        tags: &Tags,
    ) -> Result<String> {
        self.write(|tx| {
            bucket_in(tx, bucket)?;
            let v = match version_in(tx, bucket, key, version_id)? {
                Some(v) if !v.delete_marker => v,
                _ => return Err(Refused::NoSuchVersion.into()),
            };
            tx.execute(
                "UPDATE versions SET tags = ?2 WHERE seq = ?1",
                params![v.seq, to_json(tags)],
            )?;
            Ok(v.version_id)
        })
    }

    /// Current, non-deleted versions with keys starting with `prefix` and greater than `after`,
    /// in key order, at most `limit`.
    pub(crate) fn list_current(
        &self,
        bucket: &str,
        prefix: &str,
        after: &[u8],
        limit: usize,
    ) -> Result<Vec<Version>> {
        self.read(|db| {
            bucket_in(db, bucket)?;
            let from = if after >= prefix.as_bytes() {
                after
            } else {
                prefix.as_bytes()
            };
            let op = if after >= prefix.as_bytes() {
                ">"
            } else {
                ">="
            };
            let sql = format!(
                "SELECT {VERSION_COLUMNS} FROM versions WHERE bucket = ?1 AND latest = 1 \
                 AND delete_marker = 0 AND key {op} ?2 ORDER BY key LIMIT ?3"
            );
            let mut st = db.prepare_cached(&sql)?;
            let rows = st.query_map(params![bucket, from, limit as i64], version_of)?;
            let mut out = Vec::new();
            for v in rows {
                let v = v?;
                if !v.key.starts_with(prefix) {
                    break;
                }
                out.push(v);
            }
            Ok(out)
        })
    }

    /// Every version (delete markers included) in (key ascending, newest first) order after the
    /// position (`after_key`, `after_seq`), keys starting with `prefix`.
    pub(crate) fn list_versions(
        &self,
        bucket: &str,
        prefix: &str,
        after_key: &[u8],
        after_seq: Option<i64>,
        limit: usize,
    ) -> Result<Vec<Version>> {
        self.read(|db| {
            bucket_in(db, bucket)?;
            let mut out = Vec::new();
            // The rest of `after_key`'s versions, older than `after_seq`.
            if let Some(seq) = after_seq {
                let sql = format!(
                    "SELECT {VERSION_COLUMNS} FROM versions WHERE bucket = ?1 AND key = ?2 \
                     AND seq < ?3 ORDER BY seq DESC LIMIT ?4"
                );
                let mut st = db.prepare_cached(&sql)?;
                let rows =
                    st.query_map(params![bucket, after_key, seq, limit as i64], version_of)?;
                for v in rows {
                    out.push(v?);
                }
            }
            let (from, op) = if after_key >= prefix.as_bytes() {
                (after_key, ">")
            } else {
                (prefix.as_bytes(), ">=")
            };
            let sql = format!(
                "SELECT {VERSION_COLUMNS} FROM versions WHERE bucket = ?1 AND key {op} ?2 \
                 ORDER BY key, seq DESC LIMIT ?3"
            );
            let mut st = db.prepare_cached(&sql)?;
            let rows = st.query_map(params![bucket, from, limit as i64], version_of)?;
            for v in rows {
                let v = v?;
                if !v.key.starts_with(prefix) || out.len() >= limit {
                    break;
                }
                out.push(v);
            }
            Ok(out)
        })
    }

    /// The seq of a version id of a key (a ListObjectVersions marker).
    pub(crate) fn seq_of(&self, bucket: &str, key: &str, version_id: &str) -> Result<Option<i64>> {
        self.read(|db| {
            Ok(db
                .query_row(
                    "SELECT seq FROM versions WHERE bucket = ?1 AND key = ?2 AND version_id = ?3",
                    params![bucket, key.as_bytes(), version_id],
                    |r| r.get(0),
                )
                .optional()?)
        })
    }
}

pub(super) fn version_in(
    db: &Connection,
    bucket: &str,
    key: &str,
    version_id: Option<&str>,
) -> Result<Option<Version>> {
    let kb = key.as_bytes();
    let found = match version_id {
        None => db
            .prepare_cached(&format!(
                "SELECT {VERSION_COLUMNS} FROM versions WHERE bucket = ?1 AND key = ?2 AND latest = 1"
            ))?
            .query_row(params![bucket, kb], version_of)
            .optional()?,
        Some(vid) => db
            .prepare_cached(&format!(
                "SELECT {VERSION_COLUMNS} FROM versions WHERE bucket = ?1 AND key = ?2 AND version_id = ?3"
            ))?
            .query_row(params![bucket, kb, vid], version_of)
            .optional()?,
    };
    Ok(found)
}

pub(super) fn put_in(
    tx: &Transaction,
    bucket: &str,
    key: &str,
    new: &NewVersion,
    cond: &WriteIf,
) -> Result<Version> {
    let b = bucket_in(tx, bucket)?;
    let kb = key.as_bytes();
    let current = version_in(tx, bucket, key, None)?.filter(|v| !v.delete_marker);
    if cond.absent && current.is_some() {
        return Err(Refused::Precondition.into());
    }
    if let Some(want) = &cond.etag {
        match &current {
            Some(v) if want == "*" || *want == v.etag => {}
            _ => return Err(Refused::Precondition.into()),
        }
    }
    let version_id = if b.versioning.as_deref() == Some("Enabled") {
        random_id()
    } else {
        tx.execute(
            "DELETE FROM versions WHERE bucket = ?1 AND key = ?2 AND version_id = 'null'",
            params![bucket, kb],
        )?;
        "null".to_owned()
    };
    tx.execute(
        "UPDATE versions SET latest = 0 WHERE bucket = ?1 AND key = ?2 AND latest = 1",
        params![bucket, kb],
    )?;
    let now = roar_store::now_ns();
    tx.execute(
        "INSERT INTO versions (bucket, key, version_id, latest, delete_marker, blob, size, etag, \
         modified_ns, meta, checksums, tags, part_sizes) \
         VALUES (?1, ?2, ?3, 1, 0, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            bucket,
            kb,
            version_id,
            new.blob,
            new.size as i64,
            new.etag,
            now,
            to_json(&new.meta),
            to_json(&new.checksums),
            to_json(&new.tags),
            to_json(&new.part_sizes),
        ],
    )?;
    Ok(Version {
        seq: tx.last_insert_rowid(),
        key: key.to_owned(),
        version_id,
        latest: true,
        delete_marker: false,
        blob: Some(new.blob.clone()),
        size: new.size,
        etag: new.etag.clone(),
        modified_ns: now,
        meta: new.meta.clone(),
        checksums: new.checksums.clone(),
        tags: new.tags.clone(),
        part_sizes: new.part_sizes.clone(),
    })
}

pub(super) fn insert_marker(
    tx: &Transaction,
    bucket: &str,
    key: &[u8],
    version_id: &str,
) -> Result<()> {
    tx.execute(
        "UPDATE versions SET latest = 0 WHERE bucket = ?1 AND key = ?2 AND latest = 1",
        params![bucket, key],
    )?;
    tx.execute(
        "INSERT INTO versions (bucket, key, version_id, latest, delete_marker, modified_ns) \
         VALUES (?1, ?2, ?3, 1, 1, ?4)",
        params![bucket, key, version_id, roar_store::now_ns()],
    )?;
    Ok(())
}

pub(super) fn promote_newest(tx: &Transaction, bucket: &str, key: &[u8]) -> Result<()> {
    tx.execute(
        "UPDATE versions SET latest = 1 WHERE seq = \
         (SELECT MAX(seq) FROM versions WHERE bucket = ?1 AND key = ?2)",
        params![bucket, key],
    )?;
    Ok(())
}
