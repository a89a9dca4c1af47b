//! Listings of the embedded store — ListObjects v1 and v2, ListObjectVersions — with prefix,
//! delimiter, markers, continuation tokens and `encoding-type=url`.

use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result};

use super::body::blocking;
use super::index::{self, Index, Version};
use super::{refused, timestamp, Embedded};

/// One page of current objects and common prefixes, in key order.
pub(crate) struct Page {
    pub objects: Vec<Version>,
    pub prefixes: Vec<String>,
    pub truncated: bool,
    /// The last key or common prefix on the page: where the next page starts after.
    pub last: Option<String>,
}

/// The bytes every key starting with `prefix` sorts below: `prefix` followed by 0xFF, a byte no
/// UTF-8 text contains.
pub(crate) fn past(prefix: &str) -> Vec<u8> {
    let mut b = prefix.as_bytes().to_vec();
    b.push(0xFF);
    b
}

/// The common prefix `key` rolls up into, if a delimiter applies to it.
pub(crate) fn rolled_up<'k>(
    key: &'k str,
    prefix: &str,
    delimiter: Option<&str>,
) -> Option<&'k str> {
    let d = delimiter.filter(|d| !d.is_empty())?;
    let rest = key.get(prefix.len()..)?;
    rest.find(d).map(|i| &key[..prefix.len() + i + d.len()])
}

/// Up to `max` entries after `after` (a key or a common prefix already returned).
pub(crate) fn page(
    index: &Index,
    bucket: &str,
    prefix: &str,
    delimiter: Option<&str>,
    after: &str,
    max: usize,
) -> index::Result<Page> {
    const BATCH: usize = 1000;
    let mut page = Page {
        objects: Vec::new(),
        prefixes: Vec::new(),
        truncated: false,
        last: None,
    };
    // No keys asked for: none given, and nothing cut short (S3 answers IsTruncated=false).
    if max == 0 {
        return Ok(page);
    }
    let mut cursor = after.as_bytes().to_vec();
    // A marker that is itself a common prefix: its keys were all returned with it.
    if let Some(cp) = rolled_up(after, prefix, delimiter) {
        if cp == after {
            cursor = past(cp);
        }
    }
    'batches: loop {
        let batch = index.list_current(bucket, prefix, &cursor, BATCH)?;
        let full = batch.len() == BATCH;
        if batch.is_empty() {
            break;
        }
        for v in batch {
            if page.objects.len() + page.prefixes.len() >= max {
                page.truncated = true;
                break 'batches;
            }
            if let Some(cp) = rolled_up(&v.key, prefix, delimiter) {
                let cp = cp.to_owned();
                cursor = past(&cp);
                page.last = Some(cp.clone());
                page.prefixes.push(cp);
                // Skip the rest of the prefix's keys with a fresh query.
                continue 'batches;
            }
            cursor = v.key.as_bytes().to_vec();
            page.last = Some(v.key.clone());
            page.objects.push(v);
        }
        if !full {
            break;
        }
    }
    Ok(page)
}

/// S3's `encoding-type=url`: every byte but unreserved characters and `/` percent-encoded (so a
/// `+` arrives as `%2B` and decodes the same with or without form semantics).
pub(crate) fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Encodes `s` if the listing asked for `encoding-type=url`.
pub(crate) struct Encoding(pub bool);

impl Encoding {
    pub(crate) fn of(e: Option<&s3s::dto::EncodingType>) -> Encoding {
        Encoding(e.is_some_and(|e| e.as_str().eq_ignore_ascii_case("url")))
    }

    pub(crate) fn apply(&self, s: &str) -> String {
        if self.0 {
            url_encode(s)
        } else {
            s.to_owned()
        }
    }

    pub(crate) fn opt(&self, s: Option<&str>) -> Option<String> {
        s.map(|s| self.apply(s))
    }
}

/// Continuation tokens are the hex of the position they continue after: opaque to clients,
/// exact for any key.
pub(crate) fn token(last: &str) -> String {
    super::blobs::hex(last.as_bytes())
}

pub(crate) fn untoken(token: &str) -> Option<String> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

impl Embedded {
    pub(super) async fn list_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let i = req.input;
        let prefix = i.prefix.clone().unwrap_or_default();
        let after = match &i.continuation_token {
            Some(t) => untoken(t).ok_or_else(|| {
                s3_error!(
                    InvalidArgument,
                    "the continuation token is not one this store gave out"
                )
            })?,
            None => i.start_after.clone().unwrap_or_default(),
        };
        let max = max_keys(i.max_keys);
        let page = blocking(|| {
            page(
                &self.index,
                &i.bucket,
                &prefix,
                i.delimiter.as_deref(),
                &after,
                max,
            )
        })
        .map_err(|e| refused(e, &i.bucket, None))?;
        let enc = Encoding::of(i.encoding_type.as_ref());
        let key_count = (page.objects.len() + page.prefixes.len()) as i32;
        let owner = i
            .fetch_owner
            .unwrap_or(false)
            .then(|| self.owner(&i.bucket));
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: Some(enc.apply(&prefix)),
            delimiter: enc.opt(i.delimiter.as_deref().filter(|d| !d.is_empty())),
            start_after: enc.opt(i.start_after.as_deref()),
            max_keys: Some(max as i32),
            key_count: Some(key_count),
            continuation_token: i.continuation_token,
            is_truncated: Some(page.truncated),
            next_continuation_token: page
                .truncated
                .then(|| page.last.as_deref().map(token))
                .flatten(),
            contents: Some(
                page.objects
                    .iter()
                    .map(|v| object_entry(v, &enc, owner.as_ref()))
                    .collect(),
            ),
            common_prefixes: Some(prefixes_out(&page.prefixes, &enc)),
            encoding_type: i.encoding_type,
            ..Default::default()
        }))
    }

    /// Who owns the objects of `bucket`: its owner (S3's "bucket owner enforced"), the member key
    /// that made it, else the project.
    fn owner(&self, bucket: &str) -> Owner {
        let id = self
            .owner_of(bucket)
            .flatten()
            .unwrap_or_else(|| PROJECT_OWNER.to_owned());
        Owner {
            display_name: Some(id.clone()),
            id: Some(id),
        }
    }

    pub(super) async fn list_v1(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let i = req.input;
        let prefix = i.prefix.clone().unwrap_or_default();
        let after = i.marker.clone().unwrap_or_default();
        let max = max_keys(i.max_keys);
        let page = blocking(|| {
            page(
                &self.index,
                &i.bucket,
                &prefix,
                i.delimiter.as_deref(),
                &after,
                max,
            )
        })
        .map_err(|e| refused(e, &i.bucket, None))?;
        let enc = Encoding::of(i.encoding_type.as_ref());
        // ListObjects (v1) names every object's owner.
        let owner = self.owner(&i.bucket);
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(i.bucket),
            prefix: Some(enc.apply(&prefix)),
            delimiter: enc.opt(i.delimiter.as_deref().filter(|d| !d.is_empty())),
            marker: Some(enc.apply(&after)),
            max_keys: Some(max as i32),
            is_truncated: Some(page.truncated),
            next_marker: page
                .truncated
                .then(|| page.last.as_deref().map(|l| enc.apply(l)))
                .flatten(),
            contents: Some(
                page.objects
                    .iter()
                    .map(|v| object_entry(v, &enc, Some(&owner)))
                    .collect(),
            ),
            common_prefixes: Some(prefixes_out(&page.prefixes, &enc)),
            encoding_type: i.encoding_type,
            ..Default::default()
        }))
    }

    pub(super) async fn list_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let i = req.input;
        let prefix = i.prefix.clone().unwrap_or_default();
        let max = max_keys(i.max_keys);
        let delimiter = i.delimiter.as_deref();
        let key_marker = i.key_marker.clone().unwrap_or_default();
        let mut after_seq = match (&i.key_marker, &i.version_id_marker) {
            (Some(k), Some(vid)) if !vid.is_empty() => {
                blocking(|| self.index.seq_of(&i.bucket, k, vid))
                    .map_err(|e| refused(e, &i.bucket, None))?
            }
            _ => None,
        };
        let mut cursor = key_marker.as_bytes().to_vec();
        if let Some(cp) = rolled_up(&key_marker, &prefix, delimiter) {
            if cp == key_marker {
                cursor = past(cp);
            }
        }
        let (mut versions, mut markers, mut prefixes) = (Vec::new(), Vec::new(), Vec::new());
        let mut last: Option<(String, Option<String>)> = None;
        let mut truncated = false;
        'batches: loop {
            let batch = blocking(|| {
                self.index
                    .list_versions(&i.bucket, &prefix, &cursor, after_seq.take(), 1000)
            })
            .map_err(|e| refused(e, &i.bucket, None))?;
            if batch.is_empty() {
                break;
            }
            let full = batch.len() == 1000;
            for v in batch {
                if versions.len() + markers.len() + prefixes.len() >= max {
                    // MaxKeys=0 asks for nothing: nothing was cut short.
                    truncated = max > 0;
                    break 'batches;
                }
                if let Some(cp) = rolled_up(&v.key, &prefix, delimiter) {
                    let cp = cp.to_owned();
                    cursor = past(&cp);
                    last = Some((cp.clone(), None));
                    prefixes.push(cp);
                    continue 'batches;
                }
                cursor = v.key.as_bytes().to_vec();
                after_seq = Some(v.seq);
                last = Some((v.key.clone(), Some(v.version_id.clone())));
                if v.delete_marker {
                    markers.push(v);
                } else {
                    versions.push(v);
                }
            }
            if !full {
                break;
            }
        }
        let enc = Encoding::of(i.encoding_type.as_ref());
        let (next_key, next_vid) = match (truncated, last) {
            (true, Some((k, vid))) => (Some(enc.apply(&k)), vid),
            _ => (None, None),
        };
        Ok(S3Response::new(ListObjectVersionsOutput {
            name: Some(i.bucket),
            prefix: Some(enc.apply(&prefix)),
            delimiter: enc.opt(delimiter.filter(|d| !d.is_empty())),
            key_marker: i.key_marker.as_deref().map(|k| enc.apply(k)),
            version_id_marker: i.version_id_marker,
            max_keys: Some(max as i32),
            is_truncated: Some(truncated),
            next_key_marker: next_key,
            next_version_id_marker: next_vid,
            versions: Some(versions.iter().map(|v| version_entry(v, &enc)).collect()),
            delete_markers: Some(markers.iter().map(|v| marker_entry(v, &enc)).collect()),
            common_prefixes: Some(prefixes_out(&prefixes, &enc)),
            encoding_type: i.encoding_type,
            ..Default::default()
        }))
    }
}

fn max_keys(asked: Option<i32>) -> usize {
    asked.map_or(1000, |n| n.clamp(0, 1000) as usize)
}

/// The owner named for the project's buckets (made with a project key).
const PROJECT_OWNER: &str = "roar-project";

/// A version in a ListObjectVersions answer.
fn version_entry(v: &Version, enc: &Encoding) -> ObjectVersion {
    ObjectVersion {
        key: Some(enc.apply(&v.key)),
        version_id: Some(v.version_id.clone()),
        is_latest: Some(v.latest),
        e_tag: Some(ETag::Strong(v.etag.clone())),
        size: Some(v.size as i64),
        last_modified: Some(timestamp(v.modified_ns)),
        storage_class: Some(ObjectVersionStorageClass::from(
            ObjectVersionStorageClass::STANDARD.to_owned(),
        )),
        ..Default::default()
    }
}

/// A delete marker in a ListObjectVersions answer.
fn marker_entry(v: &Version, enc: &Encoding) -> DeleteMarkerEntry {
    DeleteMarkerEntry {
        key: Some(enc.apply(&v.key)),
        version_id: Some(v.version_id.clone()),
        is_latest: Some(v.latest),
        last_modified: Some(timestamp(v.modified_ns)),
        ..Default::default()
    }
}

fn object_entry(v: &Version, enc: &Encoding, owner: Option<&Owner>) -> Object {
    Object {
        owner: owner.cloned(),
        key: Some(enc.apply(&v.key)),
        e_tag: Some(ETag::Strong(v.etag.clone())),
        size: Some(v.size as i64),
        last_modified: Some(timestamp(v.modified_ns)),
        storage_class: Some(ObjectStorageClass::from(
            v.meta
                .storage_class
                .clone()
                .unwrap_or_else(|| ObjectStorageClass::STANDARD.to_owned()),
        )),
        checksum_type: v.checksums.kind.clone().map(ChecksumType::from),
        ..Default::default()
    }
}

fn prefixes_out(prefixes: &[String], enc: &Encoding) -> Vec<CommonPrefix> {
    prefixes
        .iter()
        .map(|p| CommonPrefix {
            prefix: Some(enc.apply(p)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encoding_keeps_slashes_and_encodes_the_rest() {
        assert_eq!(url_encode("a b+c%2F/ü"), "a%20b%2Bc%252F/%C3%BC");
        assert_eq!(url_encode("plain/key-1_2.~"), "plain/key-1_2.~");
    }

    #[test]
    fn tokens_round_trip() {
        for k in ["", "a", "dir/ü+%2F", "\u{10FFFF}"] {
            assert_eq!(untoken(&token(k)).as_deref(), Some(k));
        }
        assert_eq!(untoken("zz"), None);
        assert_eq!(untoken("abc"), None);
    }

    #[test]
    fn roll_up() {
        assert_eq!(rolled_up("a/b/c", "a/", Some("/")), Some("a/b/"));
        assert_eq!(rolled_up("a/b", "a/", Some("/")), None);
        assert_eq!(rolled_up("a/b", "a/", None), None);
        assert_eq!(rolled_up("a/b", "a/", Some("")), None);
        assert_eq!(rolled_up("x--y--z", "", Some("--")), Some("x--"));
    }
}
