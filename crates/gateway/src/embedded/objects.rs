//! Object reads and writes of the embedded store: PUT, GET (ranges, parts, conditions), HEAD,
//! DELETE and copies (tags: `tags.rs`).

use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result};

use super::body::{self, blocking, BlobStream};
use super::index::{Checksums, Meta, NewVersion, Version, WriteIf};
use super::tags::parse_tagging;
use super::{check_key, internal, refused, timestamp, with_stored, Embedded};

impl Embedded {
    pub(super) async fn put(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let mut input = req.input;
        check_key(&input.key)?;
        let (bucket, key) = (input.bucket.clone(), input.key.clone());
        // Fail fast on a bucket that is not there, before reading a body.
        blocking(|| self.index.bucket(&bucket)).map_err(|e| refused(e, &bucket, None))?;
        let mut claimed = Checksums::claimed([
            input.checksum_crc32.take(),
            input.checksum_crc32c.take(),
            input.checksum_crc64nvme.take(),
            input.checksum_sha1.take(),
            input.checksum_sha256.take(),
        ]);
        let hasher = body::wanted(&claimed, input.checksum_algorithm.as_ref(), &req.headers)?;
        let written = body::receive(&self.blobs, input.body.take(), hasher).await?;
        claimed.add_trailers(req.trailing_headers.as_ref())?;
        body::verify_length(input.content_length, &written)?;
        body::verify_md5(input.content_md5.as_deref(), &written)?;
        let mut computed = Checksums::from_dto(written.checksums.clone());
        claimed.verify(&computed)?;
        if computed.fields().iter().any(|(_, v)| v.is_some()) {
            computed.kind = Some(ChecksumType::FULL_OBJECT.to_owned());
        }
        let new = NewVersion {
            etag: written.md5_hex(),
            size: written.size,
            meta: meta_of(
                input.content_type,
                input.content_encoding,
                input.content_disposition,
                input.content_language,
                input.cache_control,
                input.expires,
                input.website_redirect_location,
                input.storage_class.map(|s| s.as_str().to_owned()),
                input.metadata,
            ),
            checksums: computed,
            tags: input
                .tagging
                .as_deref()
                .map(parse_tagging)
                .transpose()?
                .unwrap_or_default(),
            part_sizes: Vec::new(),
            blob: String::new(),
        };
        let cond = write_if(input.if_match.as_ref(), input.if_none_match.as_ref())?;
        // The body in place and the row naming it, with no `roar gc` in between.
        let committing = self.blobs.committing().map_err(internal)?;
        let blob = blocking(|| written.keep(&self.blobs)).map_err(internal)?;
        let new = NewVersion { blob, ..new };
        let v = blocking(|| self.index.put(&bucket, &key, &new, &cond))
            .map_err(|e| refused(e, &bucket, Some(&key)))?;
        drop(committing);
        let c = &v.checksums;
        let out = S3Response::new(PutObjectOutput {
            e_tag: Some(ETag::Strong(v.etag.clone())),
            version_id: version_out(&v),
            checksum_crc32: c.crc32.clone(),
            checksum_crc32c: c.crc32c.clone(),
            checksum_crc64nvme: c.crc64nvme.clone(),
            checksum_sha1: c.sha1.clone(),
            checksum_sha256: c.sha256.clone(),
            checksum_type: c.kind.clone().map(ChecksumType::from),
            size: Some(v.size as i64),
            ..Default::default()
        });
        Ok(with_stored(out, &v))
    }

    /// The version a read names, or the S3 error for why there is none.
    pub(super) fn readable(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
    ) -> S3Result<Version> {
        let v = blocking(|| self.index.version(bucket, key, version_id))
            .map_err(|e| refused(e, bucket, Some(key)))?;
        match v {
            Some(v) if !v.delete_marker => Ok(v),
            Some(_) if version_id.is_some() => Err(s3_error!(
                MethodNotAllowed,
                "that version of {key:?} is a delete marker"
            )),
            None if version_id.is_some() => {
                Err(s3_error!(NoSuchVersion, "no such version of {key:?}"))
            }
            _ => Err(s3_error!(NoSuchKey, "no object {key:?} in {bucket:?}")),
        }
    }

    /// What a GET or HEAD serves: the version (after its conditions) and the bytes of it.
    #[allow(clippy::too_many_arguments)]
    fn read_target(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        [if_match, if_none_match]: [&Option<ETagCondition>; 2],
        [if_modified_since, if_unmodified_since]: [&Option<Timestamp>; 2],
        range: Option<&Range>,
        part: Option<i32>,
    ) -> S3Result<(Version, Span)> {
        let v = self.readable(bucket, key, version_id)?;
        check_conditions(
            &v,
            if_match.as_ref(),
            if_none_match.as_ref(),
            if_modified_since.as_ref(),
            if_unmodified_since.as_ref(),
        )?;
        let span = span_of(&v, range, part)?;
        Ok((v, span))
    }

    pub(super) async fn get(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let i = req.input;
        let (
            v,
            Span {
                bytes: span,
                content_range,
                parts_count,
            },
        ) = self.read_target(
            &i.bucket,
            &i.key,
            i.version_id.as_deref(),
            [&i.if_match, &i.if_none_match],
            [&i.if_modified_since, &i.if_unmodified_since],
            i.range.as_ref(),
            i.part_number,
        )?;
        let file = blocking(|| self.blobs.open_blob(v.blob.as_deref().unwrap_or_default()))
            .map_err(|e| body::not_found_blob(&e))?;
        let whole = content_range.is_none();
        let mut out = GetObjectOutput {
            body: Some(BlobStream::blob(file, span.start, span.end)),
            content_length: Some((span.end - span.start) as i64),
            content_range,
            parts_count,
            accept_ranges: Some("bytes".into()),
            ..Default::default()
        };
        fill!(out, v, whole && checksums_wanted(i.checksum_mode.as_ref()));
        out.tag_count = (!v.tags.is_empty()).then_some(v.tags.len() as i32);
        Ok(with_stored(S3Response::new(out), &v))
    }

    pub(super) async fn head(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let i = req.input;
        let (
            v,
            Span {
                bytes: span,
                content_range,
                parts_count,
            },
        ) = self.read_target(
            &i.bucket,
            &i.key,
            i.version_id.as_deref(),
            [&i.if_match, &i.if_none_match],
            [&i.if_modified_since, &i.if_unmodified_since],
            i.range.as_ref(),
            i.part_number,
        )?;
        let whole = content_range.is_none();
        let mut out = HeadObjectOutput {
            content_length: Some((span.end - span.start) as i64),
            content_range,
            parts_count,
            accept_ranges: Some("bytes".into()),
            ..Default::default()
        };
        fill!(out, v, whole && checksums_wanted(i.checksum_mode.as_ref()));
        Ok(S3Response::new(out))
    }

    pub(super) async fn delete(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let i = req.input;
        let d = blocking(|| {
            self.index
                .delete(&i.bucket, &i.key, i.version_id.as_deref())
        })
        .map_err(|e| refused(e, &i.bucket, None))?;
        Ok(S3Response::new(DeleteObjectOutput {
            delete_marker: d.delete_marker.then_some(true),
            version_id: d.version_id,
            ..Default::default()
        }))
    }

    pub(super) async fn delete_many(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let i = req.input;
        blocking(|| self.index.bucket(&i.bucket)).map_err(|e| refused(e, &i.bucket, None))?;
        if i.delete.objects.len() > 1000 {
            return Err(s3_error!(
                MalformedXML,
                "a DeleteObjects request names at most 1000 keys"
            ));
        }
        let quiet = i.delete.quiet.unwrap_or(false);
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        for o in i.delete.objects {
            match blocking(|| {
                self.index
                    .delete(&i.bucket, &o.key, o.version_id.as_deref())
            }) {
                Ok(d) => deleted.push(DeletedObject {
                    key: Some(o.key),
                    delete_marker: d.delete_marker.then_some(true),
                    delete_marker_version_id: d
                        .delete_marker
                        .then(|| d.version_id.clone())
                        .flatten(),
                    version_id: if d.delete_marker { None } else { d.version_id },
                }),
                Err(e) => {
                    let e = refused(e, &i.bucket, Some(&o.key));
                    errors.push(Error {
                        code: Some(e.code().as_str().to_owned()),
                        message: e.message().map(str::to_owned),
                        key: Some(o.key),
                        version_id: o.version_id,
                    });
                }
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: (!quiet).then_some(deleted),
            errors: Some(errors),
            ..Default::default()
        }))
    }

    /// The source version a copy names, after its `x-amz-copy-source-if-*` conditions.
    pub(super) fn copy_source(
        &self,
        source: &CopySource,
        if_match: Option<&ETagCondition>,
        if_none_match: Option<&ETagCondition>,
        if_modified_since: Option<&Timestamp>,
        if_unmodified_since: Option<&Timestamp>,
    ) -> S3Result<(String, Version)> {
        let CopySource::Bucket {
            bucket,
            key,
            version_id,
        } = source
        else {
            return Err(s3_error!(
                NotImplemented,
                "copy sources must be BUCKET/KEY; access points are not served here"
            ));
        };
        let v = self.readable(bucket, key, version_id.as_deref())?;
        // For a copy, a failed If-None-Match or If-Modified-Since is 412, not 304.
        check_conditions(
            &v,
            if_match,
            if_none_match,
            if_modified_since,
            if_unmodified_since,
        )
        .map_err(|e| {
            if *e.code() == s3s::S3ErrorCode::NotModified {
                s3_error!(
                    PreconditionFailed,
                    "a copy-source precondition did not hold"
                )
            } else {
                e
            }
        })?;
        Ok((bucket.to_string(), v))
    }

    pub(super) async fn copy(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let i = req.input;
        check_key(&i.key)?;
        let (src_bucket, src) = self.copy_source(
            &i.copy_source,
            i.copy_source_if_match.as_ref(),
            i.copy_source_if_none_match.as_ref(),
            i.copy_source_if_modified_since.as_ref(),
            i.copy_source_if_unmodified_since.as_ref(),
        )?;
        let replace_meta = i
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let replace_tags = i
            .tagging_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == TaggingDirective::REPLACE);
        if src_bucket == i.bucket
            && src.key == i.key
            && src.latest
            && !replace_meta
            && !replace_tags
        {
            return Err(s3_error!(
                InvalidRequest,
                "This copy request is illegal because it is trying to copy an object to itself \
                 without changing the object's metadata, storage class, website redirect \
                 location or encryption attributes."
            ));
        }
        let meta = if replace_meta {
            meta_of(
                i.content_type,
                i.content_encoding,
                i.content_disposition,
                i.content_language,
                i.cache_control,
                i.expires,
                i.website_redirect_location,
                i.storage_class.map(|s| s.as_str().to_owned()),
                i.metadata,
            )
        } else {
            src.meta.clone()
        };
        let tags = if replace_tags {
            i.tagging
                .as_deref()
                .map(parse_tagging)
                .transpose()?
                .unwrap_or_default()
        } else {
            src.tags.clone()
        };
        // The copy is one part: composite checksums of the source's parts do not describe it.
        let mut checksums = src.checksums.clone();
        if checksums.kind.as_deref() == Some(ChecksumType::COMPOSITE) {
            checksums = Checksums::default();
        }
        let new = NewVersion {
            blob: src.blob.clone().unwrap_or_default(),
            size: src.size,
            etag: src.etag.clone(),
            meta,
            checksums,
            tags,
            part_sizes: Vec::new(),
        };
        let v = blocking(|| self.index.put(&i.bucket, &i.key, &new, &WriteIf::default()))
            .map_err(|e| refused(e, &i.bucket, Some(&i.key)))?;
        let c = &v.checksums;
        let out = S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(ETag::Strong(v.etag.clone())),
                last_modified: Some(timestamp(v.modified_ns)),
                checksum_crc32: c.crc32.clone(),
                checksum_crc32c: c.crc32c.clone(),
                checksum_crc64nvme: c.crc64nvme.clone(),
                checksum_sha1: c.sha1.clone(),
                checksum_sha256: c.sha256.clone(),
                checksum_type: c.kind.clone().map(ChecksumType::from),
            }),
            copy_source_version_id: version_out(&src),
            version_id: version_out(&v),
            ..Default::default()
        });
        Ok(with_stored(out, &v))
    }
}

/// Fills the fields GET and HEAD share from a stored version.
macro_rules! fill {
    ($out:ident, $v:ident, $with_checksums:expr) => {{
        let m = &$v.meta;
        $out.e_tag = Some(ETag::Strong($v.etag.clone()));
        $out.last_modified = Some(timestamp($v.modified_ns));
        $out.version_id = version_out(&$v);
        $out.content_type = m.content_type.clone();
        $out.content_encoding = m.content_encoding.clone();
        $out.content_disposition = m.content_disposition.clone();
        $out.content_language = m.content_language.clone();
        $out.cache_control = m.cache_control.clone();
        $out.expires = m
            .expires
            .map(|s| timestamp(s.saturating_mul(1_000_000_000)));
        $out.website_redirect_location = m.website_redirect_location.clone();
        $out.storage_class = m.storage_class.clone().map(StorageClass::from);
        $out.metadata = (!m.user.is_empty())
            .then(|| m.user.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
        if $with_checksums {
            let c = &$v.checksums;
            $out.checksum_crc32 = c.crc32.clone();
            $out.checksum_crc32c = c.crc32c.clone();
            $out.checksum_crc64nvme = c.crc64nvme.clone();
            $out.checksum_sha1 = c.sha1.clone();
            $out.checksum_sha256 = c.sha256.clone();
            $out.checksum_type = c.kind.clone().map(ChecksumType::from);
        }
    }};
}
use fill;

pub(super) fn version_out(v: &Version) -> Option<String> {
    (v.version_id != "null").then(|| v.version_id.clone())
}

fn checksums_wanted(mode: Option<&ChecksumMode>) -> bool {
    mode.is_some_and(|m| m.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn meta_of(
    content_type: Option<String>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
    expires: Option<Timestamp>,
    website_redirect_location: Option<String>,
    storage_class: Option<String>,
    metadata: Option<s3s::dto::Metadata>,
) -> Meta {
    Meta {
        content_type,
        content_encoding,
        content_disposition,
        content_language,
        cache_control,
        expires: expires.map(|t| time::OffsetDateTime::from(t).unix_timestamp()),
        website_redirect_location,
        storage_class,
        user: metadata.unwrap_or_default().into_iter().collect(),
    }
}

/// The conditions of a write: `If-None-Match: *` and `If-Match`.
pub(super) fn write_if(
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<WriteIf> {
    let absent = match if_none_match {
        None => false,
        Some(c) if c.is_any() => true,
        Some(_) => {
            return Err(s3_error!(
                NotImplemented,
                "a write's If-None-Match can only be *"
            ))
        }
    };
    let etag = if_match.map(|c| match c.as_etag() {
        Some(e) => e.value().to_owned(),
        None => "*".to_owned(),
    });
    Ok(WriteIf { absent, etag })
}

/// RFC 9110's order: If-Match, then If-Unmodified-Since (only without If-Match), then
/// If-None-Match, then If-Modified-Since (only without If-None-Match).
fn check_conditions(
    v: &Version,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
) -> S3Result<()> {
    let matches =
        |c: &ETagCondition| c.is_any() || c.as_etag().is_some_and(|e| e.value() == v.etag);
    let modified = v.modified_ns.div_euclid(1_000_000_000);
    let secs = |t: &Timestamp| time::OffsetDateTime::from(t.clone()).unix_timestamp();
    if let Some(c) = if_match {
        if !matches(c) {
            return Err(s3_error!(PreconditionFailed, "If-Match did not hold"));
        }
    } else if let Some(t) = if_unmodified_since {
        if modified > secs(t) {
            return Err(s3_error!(
                PreconditionFailed,
                "If-Unmodified-Since did not hold"
            ));
        }
    }
    if let Some(c) = if_none_match {
        if matches(c) {
            return Err(s3_error!(NotModified));
        }
    } else if let Some(t) = if_modified_since {
        if modified <= secs(t) {
            return Err(s3_error!(NotModified));
        }
    }
    Ok(())
}

/// The bytes a read serves, with its Content-Range (None: the whole object) and PartsCount.
struct Span {
    bytes: std::ops::Range<u64>,
    content_range: Option<String>,
    parts_count: Option<i32>,
}

/// The bytes a read serves: a range, a part, or everything.
fn span_of(v: &Version, range: Option<&Range>, part: Option<i32>) -> S3Result<Span> {
    let size = v.size;
    let parts = v.part_sizes.len().max(1) as i32;
    let span = if let Some(n) = part {
        if range.is_some() {
            return Err(s3_error!(
                InvalidRequest,
                "a read takes a Range or a partNumber, not both"
            ));
        }
        if n < 1 || n > parts {
            return Err(s3_error!(
                InvalidRange,
                "the object has {parts} part(s); partNumber {n} is not one of them"
            ));
        }
        if v.part_sizes.is_empty() {
            0..size
        } else {
            let start: u64 = v.part_sizes[..(n - 1) as usize].iter().sum();
            start..start + v.part_sizes[(n - 1) as usize]
        }
    } else if let Some(r) = range {
        r.check(size).map_err(|_| {
            s3_error!(
                InvalidRange,
                "the range is not satisfiable for an object of {size} bytes"
            )
        })?
    } else {
        return Ok(Span {
            bytes: 0..size,
            content_range: None,
            parts_count: None,
        });
    };
    let content_range = (span.start != 0 || span.end != size || part.is_some())
        .then(|| format!("bytes {}-{}/{size}", span.start, span.end.saturating_sub(1)));
    Ok(Span {
        bytes: span,
        content_range,
        parts_count: part.map(|_| parts),
    })
}
