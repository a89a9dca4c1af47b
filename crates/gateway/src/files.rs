//! A job's object accesses as its inputs and outputs: each access becomes an engine event (a GET
//! an open for reading with the content it read, a PUT a creating open with the content it wrote,
//! a DELETE an unlink) and the engine's rule (`roar_engine::Rules`, the one `roar run` and the
//! mount apply) decides the roles: an object read before the job wrote it is an input (with the
//! content read); one the job wrote and left is an output (with its final content); one it wrote
//! and deleted is a temporary; a pre-existing object it deleted is an output with no content.
//! What is S3's own (ranges, version ids, ETags) stays here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use roar_engine::classify::Context;
use roar_engine::{Event, HashSet, Judge, Rules, Version};
use roar_store::{ContentHash, FileRecord, S3Object};

use crate::record::{Access, AccessKind};

/// What the rule does not know of an object: which it is, and which of its accesses its records
/// describe.
struct Seen<'a> {
    bucket: &'a str,
    key: &'a str,
    /// The first read, if it came before any write of the job.
    read_prior: Option<&'a Access>,
    /// Ranges of the reads that came before any write, if all of them were ranged.
    ranges: Vec<&'a str>,
    full_read: bool,
    written: Option<&'a Access>,
}

/// An object as the engine's events name it.
fn object_path(bucket: &str, key: &str) -> PathBuf {
    PathBuf::from(format!("s3://{bucket}/{key}"))
}

/// The engine's event for one access.
fn event(a: &Access, path: &Path) -> Event {
    let open = |flags| Event::Open {
        pid: 0,
        path: path.to_owned(),
        flags,
        stat: None,
        ts_ns: a.at_ns,
    };
    match a.kind {
        AccessKind::Read => open(libc::O_RDONLY),
        // Every PUT makes a new object (version) whole, at the access: S3 has no in-place
        // writes and keeps nothing of what the key held. An object has no identity but its key.
        AccessKind::Write => open(libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL),
        AccessKind::Delete => Event::Unlink {
            pid: 0,
            path: path.to_owned(),
            ts_ns: a.at_ns,
        },
    }
}

/// The file records of `accesses` (in any order), one or two per object.
pub fn job_files(accesses: &[Access]) -> Vec<FileRecord> {
    let mut in_time: Vec<&Access> = accesses.iter().collect();
    in_time.sort_by_key(|a| a.at_ns);
    let (dirs, nothing_ignored) = (HashSet::default(), HashSet::default());
    let judge = Judge::Known(&nothing_ignored);
    let cx = Context {
        dirs: &dirs,
        ctime_floor_ns: i64::MIN,
        ignore: &judge,
        ask_filesystem: false,
    };
    let mut rules = Rules::default();
    let mut seen: HashMap<PathBuf, Seen> = HashMap::new();
    for a in in_time {
        let path = object_path(&a.bucket, &a.key);
        let made_before = rules.state(&path).is_some_and(|st| st.job_made);
        rules.apply(&cx, &event(a, &path));
        // The content this access read or wrote: the object's current version's.
        if let (AccessKind::Read | AccessKind::Write, Some(content)) = (a.kind, hash(a)) {
            let mark = rules.mark();
            rules.found_named(&cx, &path, content, mark, a.at_ns);
        }
        let s = seen.entry(path).or_insert_with(|| Seen {
            bucket: &a.bucket,
            key: &a.key,
            read_prior: None,
            ranges: Vec::new(),
            full_read: false,
            written: None,
        });
        match a.kind {
            AccessKind::Read if !made_before => {
                s.read_prior.get_or_insert(a);
                match &a.range {
                    Some(r) => s.ranges.push(r),
                    None => s.full_read = true,
                }
            }
            AccessKind::Write => s.written = Some(a),
            _ => {}
        }
    }
    let mut files = Vec::new();
    for (path, st) in rules.finish().paths {
        let s = &seen[&path];
        for (role, version) in st.roles() {
            let (hash, access, range) = match version {
                Version::Prior => (
                    st.input.clone(),
                    s.read_prior,
                    (!s.full_read).then(|| s.ranges.join(", ")),
                ),
                Version::Left => (st.output().cloned(), s.written, None),
                Version::Gone => (None, None, None),
            };
            let mut record = st.record(role, path.clone(), hash);
            record.s3 = Some(S3Object {
                bucket: s.bucket.to_owned(),
                key: s.key.to_owned(),
                version_id: access.and_then(|a| a.version_id.clone()),
                etag: access.and_then(|a| a.etag.clone()),
                size: access.and_then(|a| a.size),
                range,
            });
            files.push(record);
        }
    }
    files
}

fn hash(a: &Access) -> Option<ContentHash> {
    Some(ContentHash {
        blake3: a.blake3.clone()?,
        sha256: None,
        size: a.size?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use roar_store::{Ops, Role};

    fn access(kind: AccessKind, key: &str, b3: Option<&str>, range: Option<&str>) -> Access {
        Access {
            access_key: None,
            bucket: "b".into(),
            key: key.into(),
            kind,
            version_id: None,
            etag: b3.map(|h| format!("etag-{h}")),
            blake3: b3.map(str::to_owned),
            size: b3.map(|_| 3),
            range: range.map(str::to_owned),
            at_ns: 1,
        }
    }

    fn roles(files: &[FileRecord]) -> Vec<(String, Role, Option<String>)> {
        files
            .iter()
            .map(|f| {
                (
                    f.path.to_string_lossy().into_owned(),
                    f.role,
                    f.hash.as_ref().map(|h| h.blake3.clone()),
                )
            })
            .collect()
    }

    #[test]
    fn read_then_overwrite_is_input_and_output() {
        use AccessKind::*;
        let files = job_files(&[
            access(Read, "k", Some("old"), None),
            access(Write, "k", Some("new"), None),
            access(Read, "k", Some("new"), None),
        ]);
        assert_eq!(
            roles(&files),
            vec![
                ("s3://b/k".into(), Role::Input, Some("old".into())),
                ("s3://b/k".into(), Role::Output, Some("new".into())),
            ]
        );
        assert!(files[1].ops.contains(Ops::CREATE | Ops::WRITE | Ops::READ));
    }

    #[test]
    fn temporaries_deletions_and_ranges() {
        use AccessKind::*;
        let files = job_files(&[
            access(Write, "tmp", Some("t"), None),
            access(Delete, "tmp", None, None),
            access(Delete, "gone", None, None),
            access(Read, "big", Some("h"), Some("bytes 0-9/100")),
            access(Read, "big", Some("h"), Some("bytes 10-19/100")),
        ]);
        assert_eq!(
            roles(&files),
            vec![
                ("s3://b/tmp".into(), Role::Temp, None),
                ("s3://b/gone".into(), Role::Output, None),
                ("s3://b/big".into(), Role::Input, Some("h".into())),
            ]
        );
        let big = files[2].s3.as_ref().unwrap();
        assert_eq!(big.range.as_deref(), Some("bytes 0-9/100, bytes 10-19/100"));
    }

    #[test]
    fn a_full_read_clears_the_range() {
        use AccessKind::*;
        let files = job_files(&[
            access(Read, "k", Some("h"), Some("bytes 0-9/100")),
            access(Read, "k", Some("h"), None),
        ]);
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].s3.as_ref().unwrap().range, None);
    }
}
