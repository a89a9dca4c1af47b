//! Bucket ownership on the embedded store, so one gateway can serve several people: a key from
//! `--credentials` is a *member*, a principal of its own; the buckets it makes are its own, and no
//! other member may use them (every operation, and a copy's source too, answers AccessDenied).
//! The project's buckets — made with a project key (the gateway's generated one, the keys lent to
//! `roar run --s3`) or before buckets had owners — are every key's. Project keys may use every
//! bucket: they are the store's owner, who can read `.roar/s3/` anyway. In front of an upstream,
//! the upstream's own rules apply instead (each key its upstream identity: `upstream.rs`).
//!
//! A bucket named in `--share` or `[s3] shared` is every key's, whoever made it.
//!
//! One check for every operation, before it runs (s3s's `S3Access`); CreateBucket and ListBuckets
//! learn the member from the request (`Member`), to record the owner and list what it may use.

use std::collections::HashSet;
use std::sync::Arc;

use s3s::access::{S3Access, S3AccessContext};
use s3s::{s3_error, S3Result};

use crate::control::Keys;
use crate::embedded::Embedded;
pub(crate) use crate::member::{may_use, Member};

pub(crate) struct Owners {
    keys: Keys,
    store: Embedded,
    /// Buckets every key may use (`--share`, `[s3] shared`).
    shared: Arc<HashSet<String>>,
}

impl Owners {
    pub(crate) fn new(keys: Keys, store: Embedded, shared: HashSet<String>) -> Owners {
        Owners {
            keys,
            store,
            shared: Arc::new(shared),
        }
    }
}

/// The bucket an `x-amz-copy-source` names (`bucket/key` or `/bucket/key`, percent-encoded,
/// maybe with `?versionId=`).
fn copy_source_bucket(value: &str) -> Option<String> {
    let path = value.split('?').next()?.trim_start_matches('/');
    let bucket = path.split('/').next()?;
    let decoded = percent_encoding::percent_decode_str(bucket)
        .decode_utf8()
        .ok()?
        .into_owned();
    (!decoded.is_empty()).then_some(decoded)
}

#[async_trait::async_trait]
impl S3Access for Owners {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let Some(access) = cx.credentials().map(|c| c.access_key.clone()) else {
            return Err(s3_error!(AccessDenied, "Signature is required"));
        };
        if !self.keys.is_member(&access) {
            return Ok(());
        }
        let op = cx.s3_op().name();
        if op == "CreateBucket" || op == "ListBuckets" {
            cx.extensions_mut().insert(Member {
                key: access,
                shared: Arc::clone(&self.shared),
            });
            return Ok(());
        }
        let mut buckets: Vec<String> = cx
            .s3_path()
            .get_bucket_name()
            .map(str::to_owned)
            .into_iter()
            .collect();
        if let Some(source) = cx
            .headers()
            .get("x-amz-copy-source")
            .and_then(|v| v.to_str().ok())
        {
            buckets.extend(copy_source_bucket(source));
        }
        for bucket in buckets {
            if self.shared.contains(&bucket) {
                continue;
            }
            // A bucket that does not exist is the operation's to report.
            if let Some(owner) = self.store.owner_of(&bucket) {
                if !may_use(owner.as_deref(), Some(&access)) {
                    return Err(s3_error!(
                        AccessDenied,
                        "bucket {bucket:?} belongs to another key"
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_use_their_own_and_the_projects_buckets() {
        assert!(may_use(None, Some("a")));
        assert!(may_use(Some("a"), Some("a")));
        assert!(!may_use(Some("a"), Some("b")));
        assert!(may_use(Some("a"), None));
        assert!(may_use(None, None));
    }

    #[test]
    fn a_copy_source_names_its_bucket() {
        assert_eq!(copy_source_bucket("alpha/x/y").as_deref(), Some("alpha"));
        assert_eq!(
            copy_source_bucket("/alpha/x?versionId=3").as_deref(),
            Some("alpha")
        );
        assert_eq!(copy_source_bucket("%61lpha/x").as_deref(), Some("alpha"));
        assert_eq!(copy_source_bucket("/").as_deref(), None);
    }
}
