//! The index's multipart uploads and their parts.

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::{
    bucket_in, json, key_of, put_in, to_json, Checksums, Error, Index, Meta, NewVersion, Refused,
    Result, Tags, Version, WriteIf,
};

#[derive(Debug, Clone)]
pub(crate) struct Upload {
    pub upload_id: String,
    pub bucket: String,
    pub key: String,
    pub initiated_ns: i64,
    pub meta: Meta,
    pub checksum_algorithm: Option<String>,
    pub checksum_type: Option<String>,
    pub tags: Tags,
}

#[derive(Debug, Clone)]
pub(crate) struct Part {
    pub number: i32,
    pub blob: String,
    pub size: u64,
    pub etag: String,
    pub md5: Vec<u8>,
    pub checksums: Checksums,
    pub modified_ns: i64,
}

fn upload_of(row: &Row) -> rusqlite::Result<Upload> {
    Ok(Upload {
        upload_id: row.get(0)?,
        bucket: row.get(1)?,
        key: key_of(row, 2)?,
        initiated_ns: row.get(3)?,
        meta: json(row.get(4)?),
        checksum_algorithm: row.get(5)?,
        checksum_type: row.get(6)?,
        tags: json(row.get(7)?),
    })
}

const UPLOAD_COLUMNS: &str =
    "upload_id, bucket, key, initiated_ns, meta, checksum_algorithm, checksum_type, tags";

impl Index {
    pub(crate) fn create_upload(&self, u: &Upload) -> Result<()> {
        self.write(|tx| {
            bucket_in(tx, &u.bucket)?;
            tx.execute(
                &format!("INSERT INTO uploads ({UPLOAD_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
                params![
                    u.upload_id,
                    u.bucket,
                    u.key.as_bytes(),
                    u.initiated_ns,
                    to_json(&u.meta),
                    u.checksum_algorithm,
                    u.checksum_type,
                    to_json(&u.tags),
                ],
            )?;
            Ok(())
        })
    }

    /// The upload, if it exists and belongs to (bucket, key).
    pub(crate) fn upload(&self, bucket: &str, key: &str, upload_id: &str) -> Result<Upload> {
        self.read(|db| upload_in(db, bucket, key, upload_id))
    }

    pub(crate) fn put_part(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        p: &Part,
    ) -> Result<()> {
        self.write(|tx| {
            upload_in(tx, bucket, key, upload_id)?;
            tx.execute(
                "INSERT OR REPLACE INTO parts (upload_id, part_number, blob, size, etag, md5, \
                 checksums, modified_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    upload_id,
                    p.number,
                    p.blob,
                    p.size as i64,
                    p.etag,
                    p.md5,
                    to_json(&p.checksums),
                    p.modified_ns
                ],
            )?;
            Ok(())
        })
    }

    /// Parts numbered above `after`, ascending, at most `limit`.
    pub(crate) fn parts(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        after: i32,
        limit: usize,
    ) -> Result<Vec<Part>> {
        self.read(|db| {
            upload_in(db, bucket, key, upload_id)?;
            parts_in(db, upload_id, after, limit)
        })
    }

    pub(crate) fn abort(&self, bucket: &str, key: &str, upload_id: &str) -> Result<()> {
        self.write(|tx| {
            upload_in(tx, bucket, key, upload_id)?;
            tx.execute("DELETE FROM uploads WHERE upload_id = ?1", [upload_id])?;
            Ok(())
        })
    }

    /// Ends an upload as a new version of its key, in one transaction (the upload must still
    /// exist: two completes of the same upload make one object).
    pub(crate) fn complete(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        new: &NewVersion,
        cond: &WriteIf,
    ) -> Result<Version> {
        self.write(|tx| {
            upload_in(tx, bucket, key, upload_id)?;
            let v = put_in(tx, bucket, key, new, cond)?;
            tx.execute("DELETE FROM uploads WHERE upload_id = ?1", [upload_id])?;
            Ok(v)
        })
    }

    /// Unfinished uploads of a bucket with keys starting with `prefix`, after the marker
    /// (key, upload id), in (key, initiation) order.
    pub(crate) fn uploads(
        &self,
        bucket: &str,
        prefix: &str,
        after_key: &[u8],
        after_id: &str,
        limit: usize,
    ) -> Result<Vec<Upload>> {
        self.read(|db| {
            bucket_in(db, bucket)?;
            let sql = format!(
                "SELECT {UPLOAD_COLUMNS} FROM uploads WHERE bucket = ?1 AND \
                 (key > ?2 OR (key = ?2 AND upload_id > ?3)) ORDER BY key, initiated_ns, upload_id"
            );
            let mut st = db.prepare_cached(&sql)?;
            let rows = st.query_map(params![bucket, after_key, after_id], upload_of)?;
            let mut out = Vec::new();
            for u in rows {
                let u = u?;
                if !u.key.starts_with(prefix) {
                    if u.key.as_bytes() > prefix.as_bytes() && !prefix.is_empty() {
                        break;
                    }
                    continue;
                }
                out.push(u);
                if out.len() >= limit {
                    break;
                }
            }
            Ok(out)
        })
    }
}

fn upload_in(db: &Connection, bucket: &str, key: &str, upload_id: &str) -> Result<Upload> {
    bucket_in(db, bucket)?;
    db.prepare_cached(&format!(
        "SELECT {UPLOAD_COLUMNS} FROM uploads WHERE upload_id = ?1 AND bucket = ?2 AND key = ?3"
    ))?
    .query_row(params![upload_id, bucket, key.as_bytes()], upload_of)
    .optional()?
    .ok_or(Error::Refused(Refused::NoSuchUpload))
}

fn parts_in(db: &Connection, upload_id: &str, after: i32, limit: usize) -> Result<Vec<Part>> {
    let mut st = db.prepare_cached(
        "SELECT part_number, blob, size, etag, md5, checksums, modified_ns FROM parts \
         WHERE upload_id = ?1 AND part_number > ?2 ORDER BY part_number LIMIT ?3",
    )?;
    let rows = st.query_map(params![upload_id, after, limit as i64], |r| {
        Ok(Part {
            number: r.get(0)?,
            blob: r.get(1)?,
            size: r.get::<_, i64>(2)? as u64,
            etag: r.get(3)?,
            md5: r.get(4)?,
            checksums: json(r.get(5)?),
            modified_ns: r.get(6)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}
