//! Multipart uploads of the embedded store. Each part is a blob of its own; completing an upload
//! checks the client's part list against the stored parts (order, ETags, checksums, the 5 MiB
//! minimum), writes the object as one new blob (so an object is always one blob named by its
//! blake3, as lineage names it) and makes it the key's current version in one transaction.

use md5::Digest as _;
use s3s::checksum::ChecksumHasher;
use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result};

use super::blobs::Written;
use super::body::{self, blocking};
use super::index::{random_id, Checksums, NewVersion, Part, Upload};
use super::objects::{meta_of, version_out, write_if};
use super::tags::parse_tagging;
use super::{check_key, internal, refused, timestamp, with_stored, Embedded};

/// S3's smallest part but the last.
const MIN_PART: u64 = 5 << 20;
const MAX_PART_NUMBER: i32 = 10_000;

impl Embedded {
    pub(super) async fn create_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let i = req.input;
        check_key(&i.key)?;
        let algorithm = i
            .checksum_algorithm
            .as_ref()
            .map(|a| a.as_str().to_ascii_uppercase());
        // Refuses an algorithm name it does not know.
        body::wanted(
            &Checksums::default(),
            i.checksum_algorithm.as_ref(),
            &http::HeaderMap::new(),
        )?;
        let kind = i.checksum_type.as_ref().map(|t| t.as_str().to_owned());
        let upload = Upload {
            upload_id: random_id(),
            bucket: i.bucket.clone(),
            key: i.key.clone(),
            initiated_ns: roar_store::now_ns(),
            meta: meta_of(
                i.content_type,
                i.content_encoding,
                i.content_disposition,
                i.content_language,
                i.cache_control,
                i.expires,
                i.website_redirect_location,
                i.storage_class.map(|s| s.as_str().to_owned()),
                i.metadata,
            ),
            checksum_algorithm: algorithm.clone(),
            checksum_type: kind.clone(),
            tags: i
                .tagging
                .as_deref()
                .map(parse_tagging)
                .transpose()?
                .unwrap_or_default(),
        };
        blocking(|| self.index.create_upload(&upload)).map_err(|e| refused(e, &i.bucket, None))?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(upload.upload_id),
            checksum_algorithm: algorithm.map(ChecksumAlgorithm::from),
            checksum_type: kind.map(ChecksumType::from),
            ..Default::default()
        }))
    }

    pub(super) async fn put_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let mut i = req.input;
        check_part_number(i.part_number)?;
        let upload = blocking(|| self.index.upload(&i.bucket, &i.key, &i.upload_id))
            .map_err(|e| refused(e, &i.bucket, Some(&i.key)))?;
        let mut claimed = Checksums::claimed([
            i.checksum_crc32.take(),
            i.checksum_crc32c.take(),
            i.checksum_crc64nvme.take(),
            i.checksum_sha1.take(),
            i.checksum_sha256.take(),
        ]);
        let algorithm = i.checksum_algorithm.clone().or_else(|| {
            upload
                .checksum_algorithm
                .clone()
                .map(ChecksumAlgorithm::from)
        });
        let hasher = body::wanted(&claimed, algorithm.as_ref(), &req.headers)?;
        let written = body::receive(&self.blobs, i.body.take(), hasher).await?;
        claimed.add_trailers(req.trailing_headers.as_ref())?;
        body::verify_length(i.content_length, &written)?;
        body::verify_md5(i.content_md5.as_deref(), &written)?;
        let computed = Checksums::from_dto(written.checksums.clone());
        claimed.verify(&computed)?;
        let part = self.keep_part(
            &i.bucket,
            &i.key,
            &i.upload_id,
            i.part_number,
            written,
            computed,
        )?;
        let c = &part.checksums;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(ETag::Strong(part.etag.clone())),
            checksum_crc32: c.crc32.clone(),
            checksum_crc32c: c.crc32c.clone(),
            checksum_crc64nvme: c.crc64nvme.clone(),
            checksum_sha1: c.sha1.clone(),
            checksum_sha256: c.sha256.clone(),
            ..Default::default()
        }))
    }

    pub(super) async fn copy_part(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let i = req.input;
        check_part_number(i.part_number)?;
        let upload = blocking(|| self.index.upload(&i.bucket, &i.key, &i.upload_id))
            .map_err(|e| refused(e, &i.bucket, Some(&i.key)))?;
        let (_, src) = self.copy_source(
            &i.copy_source,
            i.copy_source_if_match.as_ref(),
            i.copy_source_if_none_match.as_ref(),
            i.copy_source_if_modified_since.as_ref(),
            i.copy_source_if_unmodified_since.as_ref(),
        )?;
        let span = match i.copy_source_range.as_deref() {
            None => 0..src.size,
            Some(r) => copy_range(r, src.size)?,
        };
        let hasher = body::wanted(
            &Checksums::default(),
            upload
                .checksum_algorithm
                .clone()
                .map(ChecksumAlgorithm::from)
                .as_ref(),
            &http::HeaderMap::new(),
        )?;
        let source_blob = src.blob.clone().unwrap_or_default();
        let written = blocking(|| {
            self.blobs
                .copy_range(&source_blob, span.start, span.end - span.start, hasher)
        })
        .map_err(internal)?;
        let computed = Checksums::from_dto(written.checksums.clone());
        let part = self.keep_part(
            &i.bucket,
            &i.key,
            &i.upload_id,
            i.part_number,
            written,
            computed,
        )?;
        let c = &part.checksums;
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(ETag::Strong(part.etag.clone())),
                last_modified: Some(timestamp(part.modified_ns)),
                checksum_crc32: c.crc32.clone(),
                checksum_crc32c: c.crc32c.clone(),
                checksum_crc64nvme: c.crc64nvme.clone(),
                checksum_sha1: c.sha1.clone(),
                checksum_sha256: c.sha256.clone(),
            }),
            copy_source_version_id: version_out(&src),
            ..Default::default()
        }))
    }

    /// Keeps a verified part body as a blob and the part in the index.
    fn keep_part(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        number: i32,
        written: Written,
        checksums: Checksums,
    ) -> S3Result<Part> {
        let (size, etag, md5) = (written.size, written.md5_hex(), written.md5.to_vec());
        let committing = self.blobs.committing().map_err(internal)?;
        let blob = blocking(|| written.keep(&self.blobs)).map_err(internal)?;
        let part = Part {
            number,
            blob,
            size,
            etag,
            md5,
            checksums,
            modified_ns: roar_store::now_ns(),
        };
        blocking(|| self.index.put_part(bucket, key, upload_id, &part))
            .map_err(|e| refused(e, bucket, Some(key)))?;
        drop(committing);
        Ok(part)
    }

    pub(super) async fn parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let i = req.input;
        let max = i.max_parts.map_or(1000, |n| n.clamp(0, 1000) as usize);
        let after = i.part_number_marker.unwrap_or(0);
        let upload = blocking(|| self.index.upload(&i.bucket, &i.key, &i.upload_id))
            .map_err(|e| refused(e, &i.bucket, Some(&i.key)))?;
        let mut parts = blocking(|| {
            self.index
                .parts(&i.bucket, &i.key, &i.upload_id, after, max + 1)
        })
        .map_err(|e| refused(e, &i.bucket, Some(&i.key)))?;
        let truncated = parts.len() > max;
        parts.truncate(max);
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(i.upload_id),
            max_parts: Some(max as i32),
            part_number_marker: i.part_number_marker,
            is_truncated: Some(truncated),
            next_part_number_marker: truncated.then(|| parts.last().map(|p| p.number)).flatten(),
            checksum_algorithm: upload.checksum_algorithm.map(ChecksumAlgorithm::from),
            checksum_type: upload.checksum_type.map(ChecksumType::from),
            parts: Some(
                parts
                    .iter()
                    .map(|p| s3s::dto::Part {
                        part_number: Some(p.number),
                        e_tag: Some(ETag::Strong(p.etag.clone())),
                        size: Some(p.size as i64),
                        last_modified: Some(timestamp(p.modified_ns)),
                        checksum_crc32: p.checksums.crc32.clone(),
                        checksum_crc32c: p.checksums.crc32c.clone(),
                        checksum_crc64nvme: p.checksums.crc64nvme.clone(),
                        checksum_sha1: p.checksums.sha1.clone(),
                        checksum_sha256: p.checksums.sha256.clone(),
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    pub(super) async fn uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let i = req.input;
        let prefix = i.prefix.clone().unwrap_or_default();
        let max = i.max_uploads.map_or(1000, |n| n.clamp(0, 1000) as usize);
        let key_marker = i.key_marker.clone().unwrap_or_default();
        let id_marker = i.upload_id_marker.clone().unwrap_or_default();
        // Without an upload-id marker, the key marker's own uploads are past.
        let id_after = if i.upload_id_marker.is_some() {
            id_marker.as_str()
        } else {
            "\u{7f}"
        };
        let mut found = blocking(|| {
            self.index
                .uploads(&i.bucket, &prefix, key_marker.as_bytes(), id_after, max + 1)
        })
        .map_err(|e| refused(e, &i.bucket, None))?;
        let truncated = found.len() > max;
        found.truncate(max);
        let enc = super::listing::Encoding::of(i.encoding_type.as_ref());
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(i.bucket),
            prefix: Some(enc.apply(&prefix)),
            key_marker: i.key_marker.as_deref().map(|k| enc.apply(k)),
            upload_id_marker: i.upload_id_marker,
            max_uploads: Some(max as i32),
            is_truncated: Some(truncated),
            next_key_marker: truncated
                .then(|| found.last().map(|u| enc.apply(&u.key)))
                .flatten(),
            next_upload_id_marker: truncated
                .then(|| found.last().map(|u| u.upload_id.clone()))
                .flatten(),
            uploads: Some(
                found
                    .iter()
                    .map(|u| MultipartUpload {
                        key: Some(enc.apply(&u.key)),
                        upload_id: Some(u.upload_id.clone()),
                        initiated: Some(timestamp(u.initiated_ns)),
                        checksum_algorithm: u
                            .checksum_algorithm
                            .clone()
                            .map(ChecksumAlgorithm::from),
                        checksum_type: u.checksum_type.clone().map(ChecksumType::from),
                        ..Default::default()
                    })
                    .collect(),
            ),
            encoding_type: i.encoding_type,
            ..Default::default()
        }))
    }

    pub(super) async fn abort(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let i = req.input;
        blocking(|| self.index.abort(&i.bucket, &i.key, &i.upload_id))
            .map_err(|e| refused(e, &i.bucket, Some(&i.key)))?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    pub(super) async fn complete(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let i = req.input;
        let upload = blocking(|| self.index.upload(&i.bucket, &i.key, &i.upload_id))
            .map_err(|e| refused(e, &i.bucket, Some(&i.key)))?;
        let stored = blocking(|| {
            self.index
                .parts(&i.bucket, &i.key, &i.upload_id, 0, MAX_PART_NUMBER as usize)
        })
        .map_err(|e| refused(e, &i.bucket, Some(&i.key)))?;
        let asked = i
            .multipart_upload
            .as_ref()
            .and_then(|m| m.parts.as_ref())
            .filter(|p| !p.is_empty())
            .ok_or_else(|| s3_error!(MalformedXML, "the request names no parts"))?;
        let parts = chosen_parts(asked, &stored)?;
        let total: u64 = parts.iter().map(|p| p.size).sum();
        if let Some(n) = i.mpu_object_size {
            if u64::try_from(n).ok() != Some(total) {
                return Err(s3_error!(
                    InvalidRequest,
                    "x-amz-mp-object-size says {n} bytes; the parts hold {total}"
                ));
            }
        }
        let algorithm = upload.checksum_algorithm.clone();
        let full_object = upload.checksum_type.as_deref() == Some(ChecksumType::FULL_OBJECT)
            || algorithm.as_deref() == Some("CRC64NVME");
        let mut full_hasher = ChecksumHasher::default();
        if full_object {
            full_hasher = body::wanted(
                &Checksums::default(),
                algorithm.clone().map(ChecksumAlgorithm::from).as_ref(),
                &http::HeaderMap::new(),
            )?;
        }
        let blobs: Vec<String> = parts.iter().map(|p| p.blob.clone()).collect();
        let written = blocking(|| self.blobs.concat(&blobs, full_hasher)).map_err(internal)?;
        let checksums = object_checksums(algorithm.as_deref(), full_object, &written, &parts)?;
        let claimed = Checksums::claimed([
            i.checksum_crc32.clone(),
            i.checksum_crc32c.clone(),
            i.checksum_crc64nvme.clone(),
            i.checksum_sha1.clone(),
            i.checksum_sha256.clone(),
        ]);
        claimed.verify(&checksums)?;
        let etag = multipart_etag(&parts);
        let cond = write_if(i.if_match.as_ref(), i.if_none_match.as_ref())?;
        let committing = self.blobs.committing().map_err(internal)?;
        let blob = blocking(|| written.keep(&self.blobs)).map_err(internal)?;
        let new = NewVersion {
            blob,
            size: total,
            etag,
            meta: upload.meta.clone(),
            checksums,
            tags: upload.tags.clone(),
            part_sizes: parts.iter().map(|p| p.size).collect(),
        };
        let v = blocking(|| {
            self.index
                .complete(&i.bucket, &i.key, &i.upload_id, &new, &cond)
        })
        .map_err(|e| refused(e, &i.bucket, Some(&i.key)))?;
        drop(committing);
        let c = &v.checksums;
        let out = S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(i.bucket.clone()),
            key: Some(i.key.clone()),
            location: Some(format!("/{}/{}", i.bucket, i.key)),
            e_tag: Some(ETag::Strong(v.etag.clone())),
            version_id: version_out(&v),
            checksum_crc32: c.crc32.clone(),
            checksum_crc32c: c.crc32c.clone(),
            checksum_crc64nvme: c.crc64nvme.clone(),
            checksum_sha1: c.sha1.clone(),
            checksum_sha256: c.sha256.clone(),
            checksum_type: c.kind.clone().map(ChecksumType::from),
            ..Default::default()
        });
        Ok(with_stored(out, &v))
    }
}

/// The checksums an object completed from `parts` carries, by the upload's `algorithm`: of the
/// whole object (`full_object`: hashed as the parts were joined into `written`), or of the parts'
/// checksums (composite).
fn object_checksums(
    algorithm: Option<&str>,
    full_object: bool,
    written: &super::blobs::Written,
    parts: &[Part],
) -> S3Result<Checksums> {
    let mut checksums = match (algorithm, full_object) {
        (_, true) => Checksums::from_dto(written.checksums.clone()),
        (Some(a), false) => composite(a, parts)?,
        (None, false) => Checksums::default(),
    };
    if algorithm.is_some() {
        let kind = if full_object {
            ChecksumType::FULL_OBJECT
        } else {
            ChecksumType::COMPOSITE
        };
        checksums.kind = Some(kind.to_owned());
    }
    Ok(checksums)
}

/// A multipart object's ETag: the MD5 of its parts' MD5s, and how many parts there were.
fn multipart_etag(parts: &[Part]) -> String {
    let mut md5s = md5::Md5::new();
    for p in parts {
        md5s.update(&p.md5);
    }
    format!("{}-{}", super::blobs::hex(&md5s.finalize()), parts.len())
}

fn check_part_number(n: i32) -> S3Result<()> {
    if !(1..=MAX_PART_NUMBER).contains(&n) {
        return Err(s3_error!(
            InvalidArgument,
            "part numbers run from 1 to {MAX_PART_NUMBER}, not {n}"
        ));
    }
    Ok(())
}

/// The stored parts the client's list names, after S3's checks.
fn chosen_parts(asked: &[CompletedPart], stored: &[Part]) -> S3Result<Vec<Part>> {
    let mut out: Vec<Part> = Vec::with_capacity(asked.len());
    let mut previous = 0;
    for a in asked {
        let n = a
            .part_number
            .ok_or_else(|| s3_error!(MalformedXML, "a part in the list has no PartNumber"))?;
        if n <= previous {
            return Err(s3_error!(
                InvalidPartOrder,
                "the list of parts must be in ascending order of part number"
            ));
        }
        previous = n;
        let Some(p) = stored.iter().find(|p| p.number == n) else {
            return Err(s3_error!(InvalidPart, "part {n} was never uploaded"));
        };
        if let Some(e) = &a.e_tag {
            if e.value() != p.etag {
                return Err(s3_error!(
                    InvalidPart,
                    "part {n} has ETag {:?}, not {:?}",
                    p.etag,
                    e.value()
                ));
            }
        } else {
            return Err(s3_error!(
                InvalidPart,
                "part {n} is listed without its ETag"
            ));
        }
        let claimed = Checksums::claimed([
            a.checksum_crc32.clone(),
            a.checksum_crc32c.clone(),
            a.checksum_crc64nvme.clone(),
            a.checksum_sha1.clone(),
            a.checksum_sha256.clone(),
        ]);
        for ((name, c), (_, s)) in claimed.fields().into_iter().zip(p.checksums.fields()) {
            if let (Some(c), Some(s)) = (c, s) {
                if c != s {
                    return Err(s3_error!(
                        InvalidPart,
                        "part {n}'s {name} checksum is {s}, not {c}"
                    ));
                }
            }
        }
        out.push(p.clone());
    }
    if let Some((i, small)) = out[..out.len() - 1]
        .iter()
        .enumerate()
        .find(|(_, p)| p.size < MIN_PART)
    {
        return Err(s3_error!(
            EntityTooSmall,
            "part {} ({} of the list) has {} bytes; every part but the last needs at least {MIN_PART}",
            small.number,
            i + 1,
            small.size
        ));
    }
    Ok(out)
}

/// A composite checksum: the algorithm over the parts' raw checksums, then `-N`.
fn composite(algorithm: &str, parts: &[Part]) -> S3Result<Checksums> {
    let mut raw = Vec::new();
    for p in parts {
        let field = p
            .checksums
            .fields()
            .into_iter()
            .find(|(name, _)| *name == algorithm)
            .and_then(|(_, v)| v.clone())
            .ok_or_else(|| {
                s3_error!(
                    InvalidRequest,
                    "part {} was uploaded without the upload's {algorithm} checksum",
                    p.number
                )
            })?;
        raw.extend(
            base64_simd::STANDARD
                .decode_to_vec(&field)
                .map_err(|_| internal("a stored part checksum is not base64"))?,
        );
    }
    let mut h = body::wanted(
        &Checksums::default(),
        Some(&ChecksumAlgorithm::from(algorithm.to_owned())),
        &http::HeaderMap::new(),
    )?;
    h.update(&raw);
    let mut c = Checksums::from_dto(h.finalize());
    let n = parts.len();
    for (_, v) in [
        ("", &mut c.crc32),
        ("", &mut c.crc32c),
        ("", &mut c.crc64nvme),
        ("", &mut c.sha1),
        ("", &mut c.sha256),
    ] {
        if let Some(s) = v {
            s.push_str(&format!("-{n}"));
        }
    }
    Ok(c)
}

/// `bytes=FIRST-LAST` of a copy source of `size` bytes.
fn copy_range(r: &str, size: u64) -> S3Result<std::ops::Range<u64>> {
    let bad = || {
        s3_error!(
            InvalidArgument,
            "x-amz-copy-source-range must be bytes=FIRST-LAST, not {r:?}"
        )
    };
    let spec = r.strip_prefix("bytes=").ok_or_else(bad)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let (first, last): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if first > last || last >= size {
        return Err(s3_error!(
            InvalidRange,
            "the copy range {r} does not fit a source of {size} bytes"
        ));
    }
    Ok(first..last + 1)
}
