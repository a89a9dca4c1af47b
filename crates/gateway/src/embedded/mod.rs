//! The embedded object store (`.roar/s3/`): what `roar gateway` and `roar run --s3` serve when
//! there is no upstream.
//!
//! Object bodies are content-addressed blobs (`blobs.rs`: blake3-named, written to a unique temp
//! file, verified, then renamed into place); keys, versions, metadata, checksums, tags and
//! multipart uploads live in a SQLite index beside them (`index.rs`). So a key is never a path
//! (no traversal is possible), any number of gateways in any number of processes can write at
//! once (SQLite serializes the index, blobs never change), a rejected body leaves nothing, a
//! version can be served again for as long as its blob is kept, and identical bodies are stored
//! once. `objects.rs` serves object reads and writes, `multipart.rs` uploads in parts,
//! `listing.rs` listings.

mod blobs;
mod body;
mod import;
mod index;
mod listing;
mod multipart;
mod objects;
mod tags;

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3Request, S3Response, S3Result, S3};

pub(crate) use body::wanted as wanted_checksums;
pub(crate) use index::Checksums;

use blobs::Blobs;
use body::blocking;
use import::{import_old_layout, old_layout, OLD_LAYOUT};
use index::{Index, Refused};

/// The store on a directory: `objects.db`, `blobs/`, `tmp/`.
#[derive(Clone)]
pub struct Embedded {
    index: Arc<Index>,
    blobs: Blobs,
}

/// The stored object a response is about: its blake3 (the blob's name) and size. Put in the
/// response's extensions, so that the recorder need not hash what the store already did.
#[derive(Debug, Clone)]
pub struct Stored {
    pub blake3: String,
    pub size: u64,
}

impl Stored {
    pub(crate) fn of(v: &index::Version) -> Option<Stored> {
        Some(Stored {
            blake3: v.blob.clone()?,
            size: v.size,
        })
    }
}

/// Adds what the store knows of `v` to a response.
pub(crate) fn with_stored<T>(mut resp: S3Response<T>, v: &index::Version) -> S3Response<T> {
    if let Some(s) = Stored::of(v) {
        resp.extensions.insert(s);
    }
    resp
}

/// What `gc` removed.
#[derive(Debug, Default, Clone, Copy)]
pub struct Collected {
    pub blobs: u64,
    pub bytes: u64,
    pub temps: u64,
    /// Kept versions let go to stay within the budget, and their bytes.
    pub evicted: u64,
    pub evicted_bytes: u64,
}

/// A size for the object store: past it, the kept versions used least recently go, but for
/// `protected` ones (pinned, or needed by a pinned job) and object bodies an S3 key holds.
pub struct Budget {
    pub bytes: u64,
    pub protected: std::collections::HashSet<String>,
}

/// The name of the index inside the store directory.
const INDEX: &str = "objects.db";

impl Embedded {
    /// Who owns `bucket`: None when there is no such bucket, Some(None) when the project does.
    pub(crate) fn owner_of(&self, bucket: &str) -> Option<Option<String>> {
        blocking(|| self.index.bucket(bucket)).ok().map(|b| b.owner)
    }

    pub fn open(root: &Path) -> anyhow::Result<Embedded> {
        std::fs::create_dir_all(root)
            .with_context(|| format!("cannot create the object store {}", root.display()))?;
        let old = old_layout(root)?;
        let blobs = Blobs::open(root)
            .with_context(|| format!("cannot open the object store {}", root.display()))?;
        let index = Index::open(&root.join(INDEX)).with_context(|| {
            format!(
                "cannot open the object store's index {}",
                root.join(INDEX).display()
            )
        })?;
        let store = Embedded {
            index: Arc::new(index),
            blobs,
        };
        if !old.is_empty() {
            let n = import_old_layout(root, &old, &store).with_context(|| {
                format!(
                    "cannot import the object store {} from its old layout (it is left as it was)",
                    root.display()
                )
            })?;
            tracing::warn!(
                "imported {n} objects of {} from the old layout; the old tree is kept in {}",
                root.display(),
                root.join(OLD_LAYOUT).display()
            );
        }
        Ok(store)
    }

    /// The blake3 and size of the object version with this ETag, if the store holds it.
    pub fn known(&self, bucket: &str, key: &str, etag: &str) -> Option<(String, u64)> {
        let v = self.index.version(bucket, key, None).ok()??;
        if v.etag != etag || v.delete_marker {
            return None;
        }
        Some((v.blob?, v.size))
    }

    /// (ETag, blake3, size) of the key's current object, if there is one.
    pub fn current(&self, bucket: &str, key: &str) -> Option<(String, String, u64)> {
        let v = self.index.version(bucket, key, None).ok()??;
        if v.delete_marker {
            return None;
        }
        Some((v.etag, v.blob?, v.size))
    }

    /// Removes blobs no object version, unfinished upload or `keep` (hashes recorded in lineage)
    /// needs, and temp files, all only if older than `grace_secs`: a body renamed into place a
    /// moment ago may not have its index row yet.
    /// With a `budget`, then lets the least recently used kept versions go (oldest last write or
    /// use first) until the store fits it; never an S3 object's body or a protected version.
    pub fn gc(
        &self,
        keep: &std::collections::HashSet<String>,
        grace_secs: u64,
        budget: Option<&Budget>,
        young_after: Option<std::time::SystemTime>,
    ) -> anyhow::Result<Collected> {
        // Listed first: a blob put in place after this is not a candidate. Then, with no commit
        // half-way (`Blobs::collecting`), what is referenced now decides.
        let listed = self.blobs.list()?;
        let _collecting = self.blobs.collecting()?;
        let referenced = self.index.referenced_blobs().map_err(db_error)?;
        // A version kept by a job still running is recorded when the job ends: a blob written
        // since the oldest running job began may be one.
        let young = |age: std::time::Duration| {
            young_after.is_some_and(|t| {
                std::time::SystemTime::now()
                    .checked_sub(age)
                    .is_some_and(|written| written >= t)
            })
        };
        let mut done = Collected::default();
        let mut left = Vec::new();
        for (blob, age, size) in listed {
            if age.as_secs() < grace_secs
                || young(age)
                || referenced.contains(&blob)
                || keep.contains(&blob)
            {
                left.push((blob, age, size));
                continue;
            }
            let size = self.blobs.remove(&blob)?;
            done.blobs += 1;
            done.bytes += size;
        }
        done.temps = self.blobs.remove_stale_temps(grace_secs.max(3600))?;
        if let Some(budget) = budget {
            let mut total: u64 = left.iter().map(|(_, _, size)| size).sum();
            // Oldest first.
            left.sort_by_key(|b| std::cmp::Reverse(b.1));
            for (blob, age, size) in left {
                if total <= budget.bytes {
                    break;
                }
                if referenced.contains(&blob) || budget.protected.contains(&blob) || young(age) {
                    continue;
                }
                self.blobs.remove(&blob)?;
                total -= size;
                done.evicted += 1;
                done.evicted_bytes += size;
            }
        }
        Ok(done)
    }
}

pub(crate) fn internal(e: impl std::fmt::Display) -> S3Error {
    tracing::error!("object store: {e}");
    s3_error!(InternalError, "the object store failed: {e}")
}

fn db_error(e: index::Error) -> anyhow::Error {
    match e {
        index::Error::Db(e) => anyhow::Error::new(e),
        index::Error::Refused(r) => anyhow::anyhow!("{r:?}"),
    }
}

/// The S3 error for an index refusal, naming what was missing.
pub(crate) fn refused(e: index::Error, bucket: &str, key: Option<&str>) -> S3Error {
    match e {
        index::Error::Db(e) => internal(e),
        index::Error::Refused(r) => match r {
            Refused::NoSuchBucket => {
                s3_error!(NoSuchBucket, "the bucket {bucket:?} does not exist")
            }
            Refused::NoSuchUpload => s3_error!(
                NoSuchUpload,
                "no such multipart upload (aborted, completed or never started)"
            ),
            Refused::Precondition => s3_error!(
                PreconditionFailed,
                "at least one of the preconditions you specified did not hold"
            ),
            Refused::BucketNotEmpty => s3_error!(
                BucketNotEmpty,
                "the bucket {bucket:?} still holds objects or versions"
            ),
            Refused::BucketExists => s3_error!(
                BucketAlreadyOwnedByYou,
                "the bucket {bucket:?} exists and is yours"
            ),
            Refused::NoSuchVersion => match key {
                Some(k) => s3_error!(NoSuchKey, "no object {k:?} in {bucket:?}"),
                None => s3_error!(NoSuchVersion),
            },
        },
    }
}

pub(crate) fn timestamp(ns: i64) -> Timestamp {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(u64::try_from(ns).unwrap_or(0));
    Timestamp::from(t)
}

/// S3 limits keys to 1024 bytes of UTF-8.
fn check_key(key: &str) -> S3Result<()> {
    if key.is_empty() {
        return Err(s3_error!(InvalidArgument, "an object key cannot be empty"));
    }
    if key.len() > 1024 {
        return Err(s3_error!(
            KeyTooLongError,
            "the key is {} bytes; S3 allows at most 1024",
            key.len()
        ));
    }
    Ok(())
}

fn bucket_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'.' || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !name.contains("..")
}

#[async_trait::async_trait]
impl S3 for Embedded {
    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let name = &req.input.bucket;
        if !bucket_name_ok(name) {
            return Err(s3_error!(
                InvalidBucketName,
                "{name:?} is not a valid bucket name (3-63 lowercase letters, digits, '.' and '-')"
            ));
        }
        // A member's key owns what it makes (`access.rs` put its name here); a project key's
        // bucket is the project's.
        let owner = req
            .extensions
            .get::<crate::member::Member>()
            .map(|m| m.key.as_str());
        blocking(|| self.index.create_bucket(name, owner)).map_err(|e| refused(e, name, None))?;
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{name}")),
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let name = &req.input.bucket;
        blocking(|| self.index.bucket(name)).map_err(|e| refused(e, name, None))?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let name = &req.input.bucket;
        blocking(|| self.index.delete_bucket(name)).map_err(|e| refused(e, name, None))?;
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let mut buckets = blocking(|| self.index.buckets()).map_err(|e| refused(e, "", None))?;
        // A member sees the buckets it may use.
        if let Some(member) = req.extensions.get::<crate::member::Member>() {
            buckets.retain(|b| member.may_use(&b.name, b.owner.as_deref()));
        }
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(
                buckets
                    .into_iter()
                    .map(|b| s3s::dto::Bucket {
                        name: Some(b.name),
                        creation_date: Some(timestamp(b.created_ns)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let name = &req.input.bucket;
        blocking(|| self.index.bucket(name)).map_err(|e| refused(e, name, None))?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let name = &req.input.bucket;
        let b = blocking(|| self.index.bucket(name)).map_err(|e| refused(e, name, None))?;
        Ok(S3Response::new(GetBucketVersioningOutput {
            status: b.versioning.map(BucketVersioningStatus::from),
            ..Default::default()
        }))
    }

    async fn put_bucket_versioning(
        &self,
        req: S3Request<PutBucketVersioningInput>,
    ) -> S3Result<S3Response<PutBucketVersioningOutput>> {
        let name = &req.input.bucket;
        let status = match req
            .input
            .versioning_configuration
            .status
            .as_ref()
            .map(|s| s.as_str())
        {
            Some(s @ ("Enabled" | "Suspended")) => s.to_owned(),
            other => {
                return Err(s3_error!(
                    MalformedXML,
                    "versioning status must be Enabled or Suspended, not {other:?}"
                ))
            }
        };
        blocking(|| self.index.set_versioning(name, &status))
            .map_err(|e| refused(e, name, None))?;
        Ok(S3Response::new(PutBucketVersioningOutput::default()))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.put(req).await
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.get(req).await
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        self.head(req).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        self.delete(req).await
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        self.delete_many(req).await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        self.copy(req).await
    }

    async fn get_object_tagging(
        &self,
        req: S3Request<GetObjectTaggingInput>,
    ) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        self.tags(req).await
    }

    async fn put_object_tagging(
        &self,
        req: S3Request<PutObjectTaggingInput>,
    ) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        self.set_tags(req).await
    }

    async fn delete_object_tagging(
        &self,
        req: S3Request<DeleteObjectTaggingInput>,
    ) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        self.clear_tags(req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        self.list_v1(req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.list_v2(req).await
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        self.list_versions(req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.create_upload(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.put_part(req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        self.copy_part(req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.parts(req).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        self.uploads(req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.abort(req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.complete(req).await
    }
}
