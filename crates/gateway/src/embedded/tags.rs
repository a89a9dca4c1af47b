//! Object tags of the embedded store: GET/PUT/DELETE ?tagging and the `x-amz-tagging` header.

use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result};

use super::body::blocking;
use super::index::Tags;
use super::objects::version_out;
use super::{refused, Embedded};

impl Embedded {
    pub(super) async fn tags(
        &self,
        req: S3Request<GetObjectTaggingInput>,
    ) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        let i = req.input;
        let v = self.readable(&i.bucket, &i.key, i.version_id.as_deref())?;
        Ok(S3Response::new(GetObjectTaggingOutput {
            tag_set: v
                .tags
                .iter()
                .map(|(k, val)| Tag {
                    key: Some(k.clone()),
                    value: Some(val.clone()),
                })
                .collect(),
            version_id: version_out(&v),
        }))
    }

    pub(super) async fn set_tags(
        &self,
        req: S3Request<PutObjectTaggingInput>,
    ) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        let i = req.input;
        let tags: Tags = i
            .tagging
            .tag_set
            .into_iter()
            .map(|t| (t.key.unwrap_or_default(), t.value.unwrap_or_default()))
            .collect();
        check_tags(&tags)?;
        let vid = blocking(|| {
            self.index
                .set_tags(&i.bucket, &i.key, i.version_id.as_deref(), &tags)
        })
        .map_err(|e| refused(e, &i.bucket, Some(&i.key)))?;
        Ok(S3Response::new(PutObjectTaggingOutput {
            version_id: (vid != "null").then_some(vid),
        }))
    }

    pub(super) async fn clear_tags(
        &self,
        req: S3Request<DeleteObjectTaggingInput>,
    ) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        let i = req.input;
        let vid = blocking(|| {
            self.index
                .set_tags(&i.bucket, &i.key, i.version_id.as_deref(), &Tags::new())
        })
        .map_err(|e| refused(e, &i.bucket, Some(&i.key)))?;
        Ok(S3Response::new(DeleteObjectTaggingOutput {
            version_id: (vid != "null").then_some(vid),
        }))
    }
}

/// `x-amz-tagging: k1=v1&k2=v2` (form-encoded).
pub(super) fn parse_tagging(header: &str) -> S3Result<Tags> {
    let mut tags = Tags::new();
    for pair in header.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (form_decode(k), form_decode(v));
        match (k, v) {
            (Some(k), Some(v)) => tags.push((k, v)),
            _ => {
                return Err(s3_error!(
                    InvalidArgument,
                    "x-amz-tagging is not form-encoded"
                ))
            }
        }
    }
    check_tags(&tags)?;
    Ok(tags)
}

fn check_tags(tags: &Tags) -> S3Result<()> {
    if tags.len() > 10 {
        return Err(s3_error!(InvalidTag, "an object can have at most 10 tags"));
    }
    let mut seen = std::collections::HashSet::new();
    for (k, v) in tags {
        if k.is_empty() || k.chars().count() > 128 || v.chars().count() > 256 {
            return Err(s3_error!(
                InvalidTag,
                "tag keys are 1-128 characters and values at most 256"
            ));
        }
        if !seen.insert(k) {
            return Err(s3_error!(InvalidTag, "the tag key {k:?} appears twice"));
        }
    }
    Ok(())
}

fn form_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagging_headers_decode() {
        let t = parse_tagging("a=1&b%2Bc=x+y&empty=").unwrap();
        assert_eq!(
            t,
            vec![
                ("a".into(), "1".into()),
                ("b+c".into(), "x y".into()),
                ("empty".into(), "".into())
            ]
        );
        assert!(parse_tagging("a=%zz").is_err());
        assert!(parse_tagging("a=1&a=2").is_err());
    }
}
