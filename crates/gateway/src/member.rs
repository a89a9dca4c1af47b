//! Who may use a bucket: the member key a request is signed with (a principal of its own, with
//! the buckets it made), the project's keys, and the buckets every key shares. The rule
//! `access.rs` checks before every operation and the embedded store lists buckets by.

use std::collections::HashSet;
use std::sync::Arc;

/// The member key a request is signed with, and the buckets every key shares, for the
/// operations that need them (CreateBucket records the owner, ListBuckets lists what it may use).
#[derive(Clone, Debug)]
pub(crate) struct Member {
    pub key: String,
    pub shared: Arc<HashSet<String>>,
}

impl Member {
    pub(crate) fn may_use(&self, bucket: &str, owner: Option<&str>) -> bool {
        self.shared.contains(bucket) || may_use(owner, Some(&self.key))
    }
}

/// Whether a bucket owned by `owner` (None: the project) may be used by `member` (None: a
/// project key).
pub(crate) fn may_use(owner: Option<&str>, member: Option<&str>) -> bool {
    match (owner, member) {
        (_, None) | (None, _) => true,
        (Some(o), Some(m)) => o == m,
    }
}
