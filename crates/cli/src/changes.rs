//! What differs between two jobs' files, or two values of one job: the pieces of `roar diff`'s
//! answer that its job and step comparisons share.

use std::collections::{BTreeMap, BTreeSet};

use roar_store::ContentHash;
use serde::Serialize;

#[derive(Serialize)]
pub(crate) struct Change<T> {
    pub a: T,
    pub b: T,
}

#[derive(Serialize)]
pub(crate) struct FileChange {
    pub path: String,
    /// modified | added (only in B) | removed (only in A)
    pub change: &'static str,
    pub a: Option<ContentHash>,
    pub b: Option<ContentHash>,
}

/// The files that differ between `a` and `b` (path to content), and how many are the same.
pub(crate) fn compare(
    a: &BTreeMap<String, Option<ContentHash>>,
    b: &BTreeMap<String, Option<ContentHash>>,
) -> (Vec<FileChange>, usize) {
    let paths: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let mut changes = Vec::new();
    let mut same = 0;
    for p in paths {
        let (ha, hb) = (a.get(p), b.get(p));
        let change = match (ha, hb) {
            (Some(x), Some(y))
                if x.as_ref().map(|h| &h.blake3) == y.as_ref().map(|h| &h.blake3) =>
            {
                same += 1;
                continue;
            }
            (Some(_), Some(_)) => "modified",
            (None, _) => "added",
            (_, None) => "removed",
        };
        changes.push(FileChange {
            path: p.clone(),
            change,
            a: ha.cloned().flatten(),
            b: hb.cloned().flatten(),
        });
    }
    (changes, same)
}
