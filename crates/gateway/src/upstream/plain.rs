//! The operations the recorder has nothing to record for — bucket settings, listings, ACLs,
//! tags, retention, multipart bookkeeping, ... — go to the upstream as they came, after s3s
//! checked the client's signature: same method, bucket, key, query, operation headers and body,
//! re-signed for the upstream, and the upstream's answer (status, headers, body, errors
//! included) handed back byte for byte. So every operation the upstream knows works through the
//! gateway, without a client library that knows them all.
//!
//! Which requests those are is decided by [`is_plain`], from what routes an S3 request: the
//! method, whether the path names an object, and the query's subresource. It errs one way only:
//! anything that could be a read or write of an object's content goes to the recorder (where an
//! operation it does not know fails as NotImplemented, loudly), never around it.

use std::sync::Arc;

use bytes::Bytes;
use http::{Extensions, HeaderMap, Method, Uri};
use s3s::route::S3Route;
use s3s::{Body, S3Request, S3Response, S3Result};

use super::{Direct, Idle};
use crate::host::Hosts;

/// The subresources that make a request on an object path something other than a read or
/// write of its content.
const OBJECT_PLAIN: &[&str] = &[
    "acl",
    "tagging",
    "retention",
    "legal-hold",
    "attributes",
    "torrent",
    "restore",
    "select",
    "uploads",
];

/// Whether the request goes around the recorder, straight upstream.
pub(crate) fn is_plain(
    method: &Method,
    bucket: Option<&str>,
    key: Option<&str>,
    query: Option<&str>,
    headers: &HeaderMap,
) -> bool {
    let names: Vec<&str> = query
        .unwrap_or_default()
        .split('&')
        .map(|pair| pair.split('=').next().unwrap_or_default())
        .filter(|n| !n.is_empty())
        .collect();
    let has = |n: &str| names.contains(&n);
    match (bucket, key) {
        (None, _) => true,
        (Some(_), None) => {
            let form = headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|t| t.to_ascii_lowercase().starts_with("multipart/form-data"));
            // DeleteObjects and the browser's POST upload write objects.
            !(*method == Method::POST && (has("delete") || form))
        }
        (Some(_), Some(_)) => {
            OBJECT_PLAIN.iter().any(|n| has(n))
                // ListParts.
                || ((*method == Method::GET || *method == Method::HEAD) && has("uploadId"))
        }
    }
}

/// The bucket and key a request names: the Host's bucket (virtual-hosted style) or the path's
/// first segment, the rest of the path (decoded) the key.
fn target<'a>(
    hosts: &Hosts,
    uri: &'a Uri,
    headers: &'a HeaderMap,
) -> Option<(Option<String>, Option<String>)> {
    let path = percent_decode(uri.path())?;
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()));
    let rest = path.strip_prefix('/').unwrap_or(&path);
    let (bucket, key) = match host.and_then(|h| hosts.bucket(h)) {
        Some(b) => (Some(b.to_owned()), rest),
        None => match rest.split_once('/') {
            Some((b, k)) => (Some(b.to_owned()), k),
            None => ((!rest.is_empty()).then(|| rest.to_owned()), ""),
        },
    };
    let key = (!key.is_empty()).then(|| key.to_owned());
    Some((bucket.filter(|b| !b.is_empty()), key))
}

fn percent_decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

/// The route (installed only in front of an upstream).
pub(crate) struct Plain {
    direct: Arc<Direct>,
    hosts: Hosts,
}

impl Plain {
    pub(crate) fn new(direct: Arc<Direct>, hosts: Hosts) -> Plain {
        Plain { direct, hosts }
    }
}

/// The plain operations' bodies are small documents (a policy is at most 20 KiB, a select
/// request or a lifecycle a few); a body past this is refused.
const BODY_LIMIT: usize = 16 << 20;

#[async_trait::async_trait]
impl S3Route for Plain {
    fn is_match(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        _: &mut Extensions,
    ) -> bool {
        match target(&self.hosts, uri, headers) {
            Some((bucket, key)) => is_plain(
                method,
                bucket.as_deref(),
                key.as_deref(),
                uri.query(),
                headers,
            ),
            // A path that does not decode goes to s3s, which says what is wrong with it.
            None => false,
        }
    }

    async fn call(&self, req: S3Request<Body>) -> S3Result<S3Response<Body>> {
        let Some((bucket, key)) = target(&self.hosts, &req.uri, &req.headers) else {
            return Err(super::invalid(
                "the request's path is not valid UTF-8".into(),
            ));
        };
        let identity = self.direct.identity(req.credentials.as_ref())?;
        let body = collect(req.input).await?;
        let url = self
            .direct
            .url(bucket.as_deref(), key.as_deref(), req.uri.query());
        let mut headers = self.direct.headers(&req.headers);
        // A checksum the client sent as an aws-chunked trailer goes up as a header: the
        // upstream checks the body it describes.
        if let Some(trailer) = &req.trailing_headers {
            trailer.read(|t| {
                for (name, value) in t {
                    if name.as_str().starts_with("x-amz-checksum-") {
                        headers.insert(name.clone(), value.clone());
                    }
                }
            });
        }
        headers.insert(http::header::CONTENT_LENGTH, body.len().into());
        let empty = body.is_empty();
        let body = if empty {
            Body::empty()
        } else {
            Body::from(body)
        };
        let resp = self
            .direct
            .exchange(
                &identity,
                &req.method,
                &url,
                headers,
                body,
                None,
                Default::default(),
            )
            .await?;
        let (parts, body) = resp.into_parts();
        let mut out = S3Response::new(Body::from(Idle::wrap(body, self.direct.timeout)));
        out.status = Some(parts.status);
        out.headers = super::returned_headers(&parts.headers);
        Ok(out)
    }
}

async fn collect(mut body: Body) -> S3Result<Bytes> {
    use futures::StreamExt;
    let mut all = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| super::invalid(format!("the request body: {e}")))?;
        all.extend_from_slice(&chunk);
        if all.len() > BODY_LIMIT {
            return Err(s3s::S3Error::with_message(
                s3s::S3ErrorCode::EntityTooLarge,
                format!("this operation's body is larger than {BODY_LIMIT} bytes"),
            ));
        }
    }
    Ok(all.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(method: Method, uri: &str, host: &str, content_type: Option<&str>) -> bool {
        let hosts = Hosts::new(&["s3.example".to_owned()]);
        let uri: Uri = uri.parse().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, host.parse().unwrap());
        if let Some(t) = content_type {
            headers.insert(http::header::CONTENT_TYPE, t.parse().unwrap());
        }
        let (bucket, key) = target(&hosts, &uri, &headers).unwrap();
        is_plain(
            &method,
            bucket.as_deref(),
            key.as_deref(),
            uri.query(),
            &headers,
        )
    }

    #[test]
    fn reads_and_writes_of_object_content_go_to_the_recorder() {
        let h = "127.0.0.1:9000";
        for (method, uri) in [
            (Method::GET, "/b/k"),
            (Method::GET, "/b/dir/k?versionId=3&partNumber=1"),
            (Method::HEAD, "/b/k"),
            (Method::PUT, "/b/k"),
            (Method::PUT, "/b/k?partNumber=2&uploadId=u"),
            (Method::DELETE, "/b/k?versionId=v"),
            (Method::DELETE, "/b/k?uploadId=u"),
            (Method::POST, "/b/k?uploadId=u"),
            (Method::POST, "/b?delete"),
            (Method::POST, "/b?delete="),
            (Method::GET, "/b/k?x-id=GetObject&unknown-subresource"),
            (Method::GET, "/b/%61cl"),
        ] {
            assert!(!classify(method.clone(), uri, h, None), "{method} {uri}");
        }
        assert!(!classify(
            Method::POST,
            "/b",
            h,
            Some("multipart/form-data; boundary=x")
        ));
        // Virtual-hosted: the bucket is the Host's, the whole path the key.
        assert!(!classify(Method::GET, "/k", "b.s3.example", None));
        assert!(!classify(Method::POST, "/?delete", "b.s3.example", None));
    }

    #[test]
    fn everything_else_goes_straight_upstream() {
        let h = "127.0.0.1:9000";
        for (method, uri) in [
            (Method::GET, "/"),
            (Method::GET, "/b"),
            (Method::GET, "/b/"),
            (Method::GET, "/b?list-type=2&prefix=a"),
            (Method::PUT, "/b"),
            (Method::PUT, "/b?versioning"),
            (Method::DELETE, "/b"),
            (Method::HEAD, "/b"),
            (Method::GET, "/b/k?acl"),
            (Method::PUT, "/b/k?tagging"),
            (Method::GET, "/b/k?retention"),
            (Method::PUT, "/b/k?legal-hold"),
            (Method::GET, "/b/k?attributes"),
            (Method::POST, "/b/k?uploads"),
            (Method::POST, "/b/k?restore"),
            (Method::POST, "/b/k?select&select-type=2"),
            (Method::GET, "/b/k?uploadId=u"),
        ] {
            assert!(classify(method.clone(), uri, h, None), "{method} {uri}");
        }
        assert!(classify(Method::GET, "/", "b.s3.example", None));
        assert!(classify(Method::GET, "/k?tagging", "b.s3.example", None));
    }
}
