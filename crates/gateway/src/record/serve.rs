//! The S3 operations as the recorder serves them: the backend answers, and each completed object
//! access is recorded (the rules in the parent module's doc).

use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, S3};

use std::collections::HashMap;
use std::sync::Arc;

use super::{access_key, empty_blob, etag_str, shown, Access, AccessKind, Recorder};
use tokio::sync::oneshot;

use crate::body::{Digest, Hashing};
use crate::parts::{self, PartHasher};
use crate::Stored;

/// The operations served as they are: the backend answers, nothing is recorded.
macro_rules! recorder_impl {
    ( passthrough { $( $op:ident : $input:ident => $output:ident ; )* } recorded { $($rec:tt)* } ) => {
        #[async_trait::async_trait]
        impl S3 for Recorder {
            $(
                async fn $op(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.shared.inner.$op(req).await
                }
            )*
            $($rec)*
        }
    };
}

with_plain_ops!(recorder_impl {
    head_object: HeadObjectInput => HeadObjectOutput;
}
    recorded {
        async fn put_object(
            &self,
            mut req: S3Request<PutObjectInput>,
        ) -> S3Result<S3Response<PutObjectOutput>> {
            refuse_too_large(req.input.content_length, &req.headers)?;
            if self.shared.store.is_some() {
                // The embedded store hashes what it keeps (blobs are named by blake3): one pass.
                let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
                let access_key = access_key(&req);
                let resp = self.shared.inner.put_object(req).await?;
                if let Some(stored) = resp.extensions.get::<Stored>() {
                    self.shared.record(Access {
                        version_id: resp.output.version_id.clone(),
                        etag: etag_str(&resp.output.e_tag),
                        blake3: Some(stored.blake3.clone()),
                        size: Some(stored.size),
                        ..Access::new(access_key, bucket, key, AccessKind::Write)
                    });
                }
                return Ok(resp);
            }
            let (tx, rx) = oneshot::channel();
            let body = req.input.body.take().unwrap_or_else(empty_blob);
            // Zero also stands for "unknown" after aws-chunked decoding without a decoded length.
            let expected = req.input.content_length.and_then(|n| u64::try_from(n).ok()).filter(|&n| n > 0);
            req.input.body = Some(Hashing::wrap(body, expected, move |d| {
                let _ = tx.send(d);
            }));
            let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
            let access_key = access_key(&req);
            let resp = self.shared.inner.put_object(req).await?;
            match rx.await.ok().flatten() {
                Some(d) => self.shared.record(Access {
                    version_id: resp.output.version_id.clone(),
                    etag: etag_str(&resp.output.e_tag),
                    blake3: Some(d.blake3),
                    size: Some(d.size),
                    ..Access::new(access_key, bucket, key, AccessKind::Write)
                }),
                None => tracing::warn!(
                    "PUT {} was accepted but its body was not read to the end; not recorded",
                    shown(&bucket, &key)
                ),
            }
            Ok(resp)
        }

        async fn get_object(
            &self,
            req: S3Request<GetObjectInput>,
        ) -> S3Result<S3Response<GetObjectOutput>> {
            let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
            let access_key = access_key(&req);
            let asked_range = req.input.range.as_ref().map(Range::to_header_string);
            let part = req.input.part_number.is_some();
            let mut resp = self.shared.inner.get_object(req).await?;
            let out = &mut resp.output;
            // A range that covers the whole object is a full read.
            let ranged = (asked_range.is_some() || part)
                && out.content_range.as_deref().is_some_and(|cr| !covers_all(cr));
            let access = Access {
                version_id: out.version_id.clone(),
                etag: etag_str(&out.e_tag),
                range: ranged.then(|| out.content_range.clone().or(asked_range).unwrap_or_default()),
                ..Access::new(access_key, bucket, key, AccessKind::Read)
            };
            let body = out.body.take().unwrap_or_else(empty_blob);
            let expected = out.content_length.and_then(|n| u64::try_from(n).ok());
            let shared = Arc::clone(&self.shared);
            if let Some(stored) = resp.extensions.get::<Stored>().cloned() {
                // The store knows the whole object's hash: count the bytes the client gets.
                let known = Digest { blake3: stored.blake3, size: stored.size };
                resp.output.body = Some(Hashing::wrap_known(body, expected, known, move |d| {
                    let Some(d) = d else { return };
                    shared.record(Access {
                        blake3: Some(d.blake3),
                        size: Some(d.size),
                        at_ns: roar_store::now_ns(),
                        ..access
                    });
                }));
                return Ok(resp);
            }
            out.body = Some(Hashing::wrap(body, expected, move |d| {
                let Some(d) = d else { return };
                let mut access = access;
                access.at_ns = roar_store::now_ns();
                if access.range.is_none() {
                    access.blake3 = Some(d.blake3);
                    access.size = Some(d.size);
                    shared.record(access);
                } else {
                    let pin = access.etag.clone();
                    shared.record_with_digest(access, pin);
                }
            }));
            Ok(resp)
        }

        async fn delete_object(
            &self,
            req: S3Request<DeleteObjectInput>,
        ) -> S3Result<S3Response<DeleteObjectOutput>> {
            let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
            let access_key = access_key(&req);
            let resp = self.shared.inner.delete_object(req).await?;
            self.shared.record(deleted(access_key, bucket, key, resp.output.version_id.clone()));
            Ok(resp)
        }

        async fn delete_objects(
            &self,
            req: S3Request<DeleteObjectsInput>,
        ) -> S3Result<S3Response<DeleteObjectsOutput>> {
            let bucket = req.input.bucket.clone();
            let access_key = access_key(&req);
            // A quiet request's answer lists only failures: what was deleted is what was asked
            // for less those.
            let asked: Vec<(String, Option<String>)> = req
                .input
                .delete
                .objects
                .iter()
                .map(|o| (o.key.clone(), o.version_id.clone()))
                .collect();
            let resp = self.shared.inner.delete_objects(req).await?;
            let failed: std::collections::HashSet<(String, Option<String>)> = resp
                .output
                .errors
                .iter()
                .flatten()
                .filter_map(|e| Some((e.key.clone()?, e.version_id.clone())))
                .collect();
            let listed: HashMap<String, Option<String>> = resp
                .output
                .deleted
                .iter()
                .flatten()
                .filter_map(|d| Some((d.key.clone()?, d.delete_marker_version_id.clone().or(d.version_id.clone()))))
                .collect();
            for (key, version) in asked {
                if failed.contains(&(key.clone(), version.clone())) {
                    continue;
                }
                let version = listed.get(&key).cloned().flatten().or(version);
                self.shared.record(deleted(access_key.clone(), bucket.clone(), key, version));
            }
            Ok(resp)
        }

        async fn copy_object(
            &self,
            req: S3Request<CopyObjectInput>,
        ) -> S3Result<S3Response<CopyObjectOutput>> {
            let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
            let source = copy_source_of(&req.input.copy_source);
            let access_key = access_key(&req);
            let resp = self.shared.inner.copy_object(req).await?;
            let stored = resp.extensions.get::<Stored>().cloned();
            let etag = resp
                .output
                .copy_object_result
                .as_ref()
                .and_then(|r| etag_str(&r.e_tag));
            let written = Access {
                version_id: resp.output.version_id.clone(),
                etag: etag.clone(),
                ..Access::new(access_key.clone(), bucket, key, AccessKind::Write)
            };
            // The copy has the source's content: one hash serves both records.
            let shared = Arc::clone(&self.shared);
            let guard = self.shared.background(access_key.as_deref());
            tokio::spawn(async move {
                let known = stored
                    .map(|s| (s.blake3, s.size))
                    .or_else(|| etag.as_deref().and_then(|e| shared.known(&written.bucket, &written.key, e)));
                let d = match known {
                    Some((blake3, size)) => Some(Digest { blake3, size }),
                    None => shared
                        .digest_object(&written.bucket, &written.key, etag.as_deref())
                        .await
                        .map(|(d, _)| d),
                };
                let (blake3, size) = (d.as_ref().map(|d| d.blake3.clone()), d.map(|d| d.size));
                if let Some((src_bucket, src_key, src_version)) = source {
                    shared.record(Access {
                        version_id: src_version,
                        blake3: blake3.clone(),
                        size,
                        at_ns: written.at_ns,
                        ..Access::new(access_key, src_bucket, src_key, AccessKind::Read)
                    });
                }
                shared.record(Access { blake3, size, ..written });
                drop(guard);
            });
            Ok(resp)
        }

        async fn upload_part_copy(
            &self,
            req: S3Request<UploadPartCopyInput>,
        ) -> S3Result<S3Response<UploadPartCopyOutput>> {
            let source = copy_source_of(&req.input.copy_source);
            let range = req
                .input
                .copy_source_range
                .as_deref()
                .map(|r| format!("bytes {}", r.trim_start_matches("bytes=")));
            let access_key = access_key(&req);
            let resp = self.shared.inner.upload_part_copy(req).await?;
            // The part's bytes are the source's: a read of the source version, by its hash.
            if let Some((bucket, key, version)) = source {
                let access = Access {
                    version_id: version.or_else(|| resp.output.copy_source_version_id.clone()),
                    range,
                    ..Access::new(access_key, bucket, key, AccessKind::Read)
                };
                self.shared.record_with_digest(access, None);
            }
            Ok(resp)
        }

        async fn upload_part(
            &self,
            mut req: S3Request<UploadPartInput>,
        ) -> S3Result<S3Response<UploadPartOutput>> {
            refuse_too_large(req.input.content_length, &req.headers)?;
            // The embedded store hashes the object it assembles; an upstream's parts are hashed
            // here as subtrees of their object, where their offset can be known.
            // aws-chunked bodies give their length in x-amz-decoded-content-length.
            let len = req
                .input
                .content_length
                .and_then(|n| u64::try_from(n).ok())
                .filter(|&n| n > 0)
                .or_else(|| {
                    req.headers
                        .get("x-amz-decoded-content-length")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                });
            let (upload_id, number) = (req.input.upload_id.clone(), req.input.part_number);
            let offset = match self.shared.store {
                Some(_) => None,
                None => self.shared.uploads.offset(&upload_id, number, len).await,
            };
            let Some(offset) = offset else {
                return self.shared.inner.upload_part(req).await;
            };
            let (tx, rx) = oneshot::channel();
            let body = req.input.body.take().unwrap_or_else(empty_blob);
            req.input.body = Some(Hashing::with(body, len, PartHasher::at(offset), move |h| {
                let _ = tx.send(h);
            }));
            let resp = self.shared.inner.upload_part(req).await?;
            if let Some(h) = rx.await.ok().flatten() {
                self.shared.uploads.done(&upload_id, number, h, etag_str(&resp.output.e_tag));
            }
            Ok(resp)
        }

        async fn abort_multipart_upload(
            &self,
            req: S3Request<AbortMultipartUploadInput>,
        ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
            let upload_id = req.input.upload_id.clone();
            let resp = self.shared.inner.abort_multipart_upload(req).await?;
            self.shared.uploads.forget(&upload_id);
            Ok(resp)
        }

        async fn complete_multipart_upload(
            &self,
            req: S3Request<CompleteMultipartUploadInput>,
        ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
            let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
            let access_key = access_key(&req);
            let upload_id = req.input.upload_id.clone();
            let listed: Vec<(i32, Option<String>)> = req
                .input
                .multipart_upload
                .iter()
                .flat_map(|m| m.parts.iter().flatten())
                .filter_map(|p| Some((p.part_number?, etag_str(&p.e_tag))))
                .collect();
            let resp = self.shared.inner.complete_multipart_upload(req).await?;
            let merged = self
                .shared
                .uploads
                .finish(&upload_id, &listed)
                .and_then(|parts| parts::combine(&parts));
            let etag = etag_str(&resp.output.e_tag);
            let access = Access {
                version_id: resp.output.version_id.clone(),
                etag: etag.clone(),
                ..Access::new(access_key, bucket, key, AccessKind::Write)
            };
            let known = resp
                .extensions
                .get::<Stored>()
                .map(|s| (s.blake3.clone(), s.size))
                .or(merged);
            match known {
                Some((blake3, size)) => self.shared.record(Access {
                    blake3: Some(blake3),
                    size: Some(size),
                    ..access
                }),
                None => {
                    tracing::info!(
                        "{}: its parts do not form its blake3 tree (sizes, numbering or a part \
                         not seen whole); reading it back to hash it",
                        shown(&access.bucket, &access.key)
                    );
                    self.shared.record_with_digest(access, etag)
                }
            }
            Ok(resp)
        }
    }
);

/// S3's largest single PUT or part.
const MAX_BODY: u64 = 5 << 30;

/// EntityTooLarge before a byte of the body is read, for a body announced over 5 GiB.
fn refuse_too_large(content_length: Option<i64>, headers: &http::HeaderMap) -> S3Result<()> {
    let decoded = headers
        .get("x-amz-decoded-content-length")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let announced = content_length
        .and_then(|n| u64::try_from(n).ok())
        .max(decoded);
    match announced {
        Some(n) if n > MAX_BODY => Err(s3s::s3_error!(
            EntityTooLarge,
            "the body is {n} bytes; a single PUT or part holds at most {MAX_BODY} (use a multipart upload)"
        )),
        _ => Ok(()),
    }
}

/// (bucket, key, version) of a `BUCKET/KEY` copy source.
fn copy_source_of(source: &CopySource) -> Option<(String, String, Option<String>)> {
    match source {
        CopySource::Bucket {
            bucket,
            key,
            version_id,
        } => Some((
            bucket.to_string(),
            key.to_string(),
            version_id.as_ref().map(|v| v.to_string()),
        )),
        _ => None,
    }
}

fn deleted(
    access_key: Option<String>,
    bucket: String,
    key: String,
    version_id: Option<String>,
) -> Access {
    Access {
        version_id,
        ..Access::new(access_key, bucket, key, AccessKind::Delete)
    }
}

/// Whether a Content-Range value (`bytes 0-99/100`) covers its whole object.
fn covers_all(content_range: &str) -> bool {
    let Some(spec) = content_range.strip_prefix("bytes ") else {
        return false;
    };
    let Some((range, total)) = spec.split_once('/') else {
        return false;
    };
    let Some((first, last)) = range.split_once('-') else {
        return false;
    };
    match (
        first.parse::<u64>(),
        last.parse::<u64>(),
        total.parse::<u64>(),
    ) {
        (Ok(0), Ok(last), Ok(total)) => last + 1 == total,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::covers_all;

    #[test]
    fn whole_object_ranges() {
        assert!(covers_all("bytes 0-99/100"));
        assert!(!covers_all("bytes 0-98/100"));
        assert!(!covers_all("bytes 1-99/100"));
        assert!(!covers_all("bytes 0-99/*"));
        assert!(!covers_all("garbage"));
    }
}
