//! A pushed job's file records, read from the local store straight into the columns of the team
//! store's `job_file_lists` row (schema 3): paths as bytes, roles and ops as their codes, contents
//! as the 32 bytes of their hashes. A job's records are most of what a push moves (~77 a job in
//! the fleet), and reading them as [`roar_store::FileRecord`]s — each path, hash and role its own
//! allocation, each hash then decoded from hex again for every record that names it — was most
//! of a pusher's time (bench/NOTES.md, session 54). The batch's records are read by one statement,
//! and each content once per push.

use std::collections::HashMap;

use rusqlite::types::Type;
use rusqlite::{Connection, OptionalExtension};

use roar_store::{Ops, S3Object};

use super::codec::{role, role_code};

/// The content hash of a version as the team store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Content {
    pub blake3: [u8; 32],
    pub sha256: Option<[u8; 32]>,
    pub size: i64,
}

/// One job's file records as columns, in the job's order.
#[derive(Debug, Default)]
pub(crate) struct Files {
    /// Every path's bytes, one after another; `ends[i]` is where path `i` ends.
    paths: Vec<u8>,
    ends: Vec<usize>,
    pub roles: Vec<i8>,
    pub ops: Vec<i16>,
    pub now: Vec<Option<Content>>,
    pub before: Vec<Option<Content>>,
    pub first_ns: Vec<Option<i64>>,
    pub last_ns: Vec<Option<i64>>,
    /// The S3 records' object fields, by their record's position.
    pub s3: Vec<(i32, S3Object)>,
}

impl Files {
    /// Room for `n` more records (a job's are read one at a time; growing eight columns
    /// element by element was ~4 % of a pusher's instructions).
    fn reserve(&mut self, n: usize) {
        self.paths.reserve(n * 64);
        self.ends.reserve(n);
        self.roles.reserve(n);
        self.ops.reserve(n);
        self.now.reserve(n);
        self.before.reserve(n);
        self.first_ns.reserve(n);
        self.last_ns.reserve(n);
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn paths(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.ends.iter().enumerate().map(|(i, &end)| {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            &self.paths[start..end]
        })
    }
}

/// The contents a push has read, by the local store's artifact id: most of a job's records name
/// a content an earlier job's did (the libraries every job reads, a dataset read by many jobs).
#[derive(Default)]
pub(crate) struct Contents {
    by_id: HashMap<i64, Content, foldhash::fast::RandomState>,
}

impl Contents {
    /// Past this many the memo starts again (an entry is ~100 bytes: ~10 MB at most).
    const MAX: usize = 100_000;

    fn get(&mut self, conn: &Connection, id: Option<i64>) -> rusqlite::Result<Option<Content>> {
        let Some(id) = id else {
            return Ok(None);
        };
        if let Some(&content) = self.by_id.get(&id) {
            return Ok(Some(content));
        }
        // A record whose content row is gone is sent without one, as the join it replaced did.
        let Some(content) = conn
            .prepare_cached("SELECT blake3, sha256, size FROM artifacts WHERE id = ?1")?
            .query_row([id], |r| {
                let sha256 = match r.get_ref(1)?.as_str_or_null()? {
                    Some(hex) => Some(decode(1, hex)?),
                    None => None,
                };
                Ok(Content {
                    blake3: decode(0, r.get_ref(0)?.as_str()?)?,
                    sha256,
                    size: r.get(2)?,
                })
            })
            .optional()?
        else {
            return Ok(None);
        };
        if self.by_id.len() >= Self::MAX {
            self.by_id.clear();
        }
        self.by_id.insert(id, content);
        Ok(Some(content))
    }
}

/// A hash the local store holds in hex, as its 32 bytes; anything else fails the push with the
/// hash and the reason.
fn decode(column: usize, hex: &str) -> rusqlite::Result<[u8; 32]> {
    let mut raw = [0u8; 32];
    hex::decode_to_slice(hex, &mut raw).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(
            column,
            Type::Text,
            format!("content hash {hex:?} is not 32 bytes in hex: {e}").into(),
        )
    })?;
    Ok(raw)
}

/// Jobs further apart than this are read by separate statements: a job that ran while many
/// later ones were pushed leaves a gap in a batch's ids, and one range over it would read every
/// record of the jobs in between only to skip them.
const GAP: i64 = 16;

/// The file records of the jobs `ids` (ascending), a statement per run of nearby ids: a job's in
/// its order, for every id (none for a job without records).
pub(crate) fn read_batch(
    conn: &Connection,
    ids: &[i64],
    contents: &mut Contents,
) -> rusqlite::Result<Vec<Files>> {
    let mut out: Vec<Files> = ids.iter().map(|_| Files::default()).collect();
    let mut start = 0;
    for end in 1..=ids.len() {
        if end == ids.len() || ids[end] - ids[end - 1] > GAP {
            read_range(conn, &ids[start..end], &mut out[start..end], contents)?;
            start = end;
        }
    }
    Ok(out)
}

/// The records of `ids` (ascending, nearby) into `out`, by one statement over their range.
fn read_range(
    conn: &Connection,
    ids: &[i64],
    out: &mut [Files],
    contents: &mut Contents,
) -> rusqlite::Result<()> {
    let (Some(&lo), Some(&hi)) = (ids.first(), ids.last()) else {
        return Ok(());
    };
    let mut stmt = conn.prepare_cached(
        "SELECT job_id, role, path, ops, first_ns, last_ns, artifact_id, before_artifact_id,
                s3_object_id
         FROM job_files WHERE job_id BETWEEN ?1 AND ?2 ORDER BY job_id, id",
    )?;
    let mut rows = stmt.query([lo, hi])?;
    let mut at = 0;
    while let Some(r) = rows.next()? {
        let job: i64 = r.get(0)?;
        // Jobs between two of the batch's that are not in it (running, pushed) are skipped.
        while at < ids.len() && ids[at] < job {
            at += 1;
        }
        if ids.get(at) != Some(&job) {
            continue;
        }
        let files = &mut out[at];
        if files.ends.len() == files.ends.capacity() {
            files.reserve(files.len().max(64));
        }
        if let Some(object) = r.get::<_, Option<i64>>(8)? {
            if let Some(object) = read_s3(conn, object)? {
                files.s3.push((files.len() as i32, object));
            }
        }
        files.paths.extend_from_slice(r.get_ref(2)?.as_blob()?);
        files.ends.push(files.paths.len());
        files.roles.push(role_code(role(r.get_ref(1)?.as_str()?)));
        files
            .ops
            .push(i16::from(Ops::parse(r.get_ref(3)?.as_str()?).bits()));
        files.first_ns.push(r.get(4)?);
        files.last_ns.push(r.get(5)?);
        files.now.push(contents.get(conn, r.get(6)?)?);
        files.before.push(contents.get(conn, r.get(7)?)?);
    }
    Ok(())
}

/// An S3 record's object fields (None if their row is gone, as the join it replaced gave).
fn read_s3(conn: &Connection, id: i64) -> rusqlite::Result<Option<S3Object>> {
    conn.prepare_cached(
        "SELECT bucket, key, version_id, etag, size, range FROM s3_objects WHERE id = ?1",
    )?
    .query_row([id], |r| {
        Ok(S3Object {
            bucket: r.get(0)?,
            key: r.get(1)?,
            version_id: r.get(2)?,
            etag: r.get(3)?,
            size: r.get::<_, Option<i64>>(4)?.map(|s| s as u64),
            range: r.get(5)?,
        })
    })
    .optional()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_that_are_not_32_bytes_of_hex_are_refused_with_the_hash() {
        let ok = "ab".repeat(32);
        assert_eq!(decode(0, &ok).unwrap(), [0xab; 32]);
        for bad in ["zz".repeat(32), "ab".repeat(31), "ab".repeat(33)] {
            let e = decode(0, &bad).unwrap_err().to_string();
            assert!(e.contains(&bad), "{e}");
        }
    }

    fn hash(seed: &str) -> roar_store::ContentHash {
        roar_store::ContentHash {
            blake3: blake3_hex(seed),
            sha256: seed
                .len()
                .is_multiple_of(2)
                .then(|| blake3_hex(&format!("sha {seed}"))),
            size: seed.len() as u64,
        }
    }

    fn blake3_hex(seed: &str) -> String {
        seed.bytes()
            .cycle()
            .take(32)
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn job(n: usize) -> roar_store::JobRecord {
        use roar_store::{FileRecord, Ops, Role};
        let files = (0..4 + n)
            .map(|i| FileRecord {
                role: [Role::Input, Role::Output, Role::Temp][i % 3],
                path: format!("/data/j{n}/f{i}").into(),
                // Contents shared between jobs (the memo) and ones of their own.
                hash: (i % 4 != 3).then(|| hash(&format!("c{}", i % 3 + n * (i % 2)))),
                before: (i % 3 == 1).then(|| hash(&format!("before {n} {i}"))),
                ops: if i % 3 == 0 {
                    Ops::READ
                } else {
                    Ops::WRITE | Ops::TRUNCATE
                },
                first_ns: Some(i as i64),
                last_ns: (i % 2 == 0).then_some(i as i64 + 1),
                s3: (i == 2).then(|| S3Object {
                    bucket: "b".into(),
                    key: format!("k{n}"),
                    version_id: Some("v".into()),
                    etag: None,
                    size: Some(9),
                    range: Some("bytes 0-3/9".into()),
                }),
            })
            .collect();
        roar_store::JobRecord {
            uid: Some(format!("{n:032x}")),
            ..roar_store::testing::job(&["x"], "/", n as i64, files)
        }
    }

    /// What [`read_batch`] must give for a job's records, from the records themselves.
    /// A record's path, role code, ops bits, content and content before.
    type Row = (Vec<u8>, i8, i16, [Option<Content>; 2]);

    fn columns(files: &[roar_store::FileRecord]) -> Vec<Row> {
        use std::os::unix::ffi::OsStrExt;
        let content = |h: &Option<roar_store::ContentHash>| {
            h.as_ref().map(|h| Content {
                blake3: decode(0, &h.blake3).unwrap(),
                sha256: h.sha256.as_ref().map(|s| decode(1, s).unwrap()),
                size: h.size as i64,
            })
        };
        files
            .iter()
            .map(|f| {
                (
                    f.path.as_os_str().as_bytes().to_vec(),
                    role_code(f.role),
                    i16::from(f.ops.bits()),
                    [content(&f.hash), content(&f.before)],
                )
            })
            .collect()
    }

    /// Jobs' records read by one statement come back as each job's, in its order, whatever
    /// lies between the batch's jobs (a job not in the batch, a record written later).
    #[test]
    fn a_batch_reads_each_jobs_records_as_the_store_holds_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = roar_store::open(&dir.path().join("roar.db"), true).unwrap();
        let jobs: Vec<_> = (1..=25).map(job).collect();
        roar_store::import_jobs(&mut conn, jobs.clone()).unwrap();
        let id = |n: usize| -> i64 {
            conn.query_row(
                "SELECT id FROM jobs WHERE uid = ?1",
                [format!("{n:032x}")],
                |r| r.get(0),
            )
            .unwrap()
        };
        // Job 2's last record is written after job 4's (rows of jobs interleave in a store).
        let moved: i64 = conn
            .query_row(
                "SELECT max(id) FROM job_files WHERE job_id = ?1",
                [id(2)],
                |r| r.get(0),
            )
            .unwrap();
        conn.execute(
            "INSERT INTO job_files (job_id, role, kind, path, artifact_id, before_artifact_id,
                                    s3_object_id, ops, first_ns, last_ns)
             SELECT job_id, role, kind, path, artifact_id, before_artifact_id, s3_object_id, ops,
                    first_ns, last_ns FROM job_files WHERE id = ?1",
            [moved],
        )
        .unwrap();
        conn.execute("DELETE FROM job_files WHERE id = ?1", [moved])
            .unwrap();
        // Job 4 left out, and a gap wider than GAP before job 25 (read by a statement of its own).
        let ids = [id(1), id(2), id(3), id(5), id(25)];
        assert!(id(25) - id(5) > GAP);
        let mut contents = Contents::default();
        let read = read_batch(&conn, &ids, &mut contents).unwrap();
        assert_eq!(read.len(), 5);
        for (files, n) in read.iter().zip([1, 2, 3, 5, 25]) {
            let want = columns(&jobs[n - 1].files);
            let got: Vec<_> = files
                .paths()
                .enumerate()
                .map(|(i, p)| {
                    (
                        p.to_vec(),
                        files.roles[i],
                        files.ops[i],
                        [files.now[i], files.before[i]],
                    )
                })
                .collect();
            assert_eq!(got, want, "job {n}");
            let times: Vec<_> = jobs[n - 1].files.iter().map(|f| f.first_ns).collect();
            assert_eq!(files.first_ns, times, "job {n}");
            let times: Vec<_> = jobs[n - 1].files.iter().map(|f| f.last_ns).collect();
            assert_eq!(files.last_ns, times, "job {n}");
            let s3: Vec<_> = jobs[n - 1]
                .files
                .iter()
                .enumerate()
                .filter_map(|(i, f)| Some((i as i32, f.s3.clone()?)))
                .collect();
            assert_eq!(files.s3, s3, "job {n}");
        }
        // Read again with the memo warm: the same.
        let again = read_batch(&conn, &ids, &mut contents).unwrap();
        assert_eq!(format!("{again:?}"), format!("{read:?}"));
        // A record whose content row is gone is read without one (as a join gave), not an error.
        conn.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
        let gone: i64 = conn
            .query_row(
                "SELECT artifact_id FROM job_files WHERE job_id = ?1 ORDER BY id LIMIT 1",
                [id(5)],
                |r| r.get(0),
            )
            .unwrap();
        conn.execute("DELETE FROM artifacts WHERE id = ?1", [gone])
            .unwrap();
        let read = read_batch(&conn, &[id(5)], &mut Contents::default()).unwrap();
        assert_eq!(read[0].now[0], None);
        assert_eq!(read[0].len(), jobs[4].files.len());
    }

    #[test]
    fn paths_come_back_in_order() {
        let mut f = Files::default();
        for p in [&b"/a"[..], b"", b"/b/c"] {
            f.paths.extend_from_slice(p);
            f.ends.push(f.paths.len());
        }
        assert_eq!(f.paths().collect::<Vec<_>>(), [&b"/a"[..], b"", b"/b/c"]);
        assert_eq!(f.len(), 3);
    }
}
