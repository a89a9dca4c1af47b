//! A job's object accesses as its inputs and outputs, by the rules `roar run` applies to files
//! (`roar_store::PathUse`): an object read before the job wrote it is an input (with the content
//! read); one the job wrote and left is an output (with its final content); one it wrote and
//! deleted is a temporary; a pre-existing object it deleted is an output with no content.

use std::collections::HashMap;
use std::path::PathBuf;

use roar_store::{ContentHash, FileRecord, Made, Ops, PathUse, Role, S3Object};

use crate::record::{Access, AccessKind};

#[derive(Default)]
struct State<'a> {
    ops: Ops,
    first_ns: i64,
    last_ns: i64,
    /// The first read, if it came before any write of the job.
    read_prior: Option<&'a Access>,
    /// Ranges of the reads that came before any write, if all of them were ranged.
    ranges: Vec<&'a str>,
    full_read: bool,
    written: Option<&'a Access>,
    exists: bool,
    job_made: bool,
}

/// The file records of `accesses` (in any order), one or two per object.
pub fn job_files(accesses: &[Access]) -> Vec<FileRecord> {
    let mut in_time: Vec<&Access> = accesses.iter().collect();
    in_time.sort_by_key(|a| a.at_ns);
    let mut order: Vec<(&str, &str)> = Vec::new();
    let mut states: HashMap<(&str, &str), State> = HashMap::new();
    for a in in_time {
        let id = (a.bucket.as_str(), a.key.as_str());
        let st = states.entry(id).or_insert_with(|| {
            order.push(id);
            State {
                first_ns: a.at_ns,
                exists: true,
                ..State::default()
            }
        });
        st.last_ns = a.at_ns;
        match a.kind {
            AccessKind::Read => {
                st.ops.insert(Ops::READ);
                if !st.job_made {
                    st.read_prior.get_or_insert(a);
                    match &a.range {
                        Some(r) => st.ranges.push(r),
                        None => st.full_read = true,
                    }
                }
            }
            AccessKind::Write => {
                // Every PUT creates a new object (version); S3 has no in-place writes.
                st.ops.insert(Ops::WRITE | Ops::CREATE);
                st.written = Some(a);
                st.exists = true;
                st.job_made = true;
            }
            AccessKind::Delete => {
                st.ops.insert(Ops::UNLINK);
                st.exists = false;
            }
        }
    }

    let mut files = Vec::new();
    for id in order {
        let st = &states[&id];
        let record = |role: Role, a: Option<&Access>, range: Option<String>| FileRecord {
            role,
            path: PathBuf::from(format!("s3://{}/{}", id.0, id.1)),
            hash: a.and_then(hash),
            before: None,
            ops: st.ops,
            first_ns: Some(st.first_ns),
            last_ns: Some(st.last_ns),
            s3: Some(S3Object {
                bucket: id.0.to_owned(),
                key: id.1.to_owned(),
                version_id: a.and_then(|a| a.version_id.clone()),
                etag: a.and_then(|a| a.etag.clone()),
                size: a.and_then(|a| a.size),
                range,
            }),
        };
        let (input, made) = PathUse {
            read_prior: st.read_prior.is_some(),
            job_made: st.job_made,
            exists: st.exists,
            unlinked: st.ops.contains(Ops::UNLINK),
        }
        .records();
        if input {
            let range = (!st.full_read).then(|| st.ranges.join(", "));
            files.push(record(Role::Input, st.read_prior, range));
        }
        match made {
            Some(Made::Output) => files.push(record(Role::Output, st.written, None)),
            Some(Made::Temp) => files.push(record(Role::Temp, None, None)),
            Some(Made::Deleted) => files.push(record(Role::Output, None, None)),
            None => {}
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
