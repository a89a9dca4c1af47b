//! The upstream backend: every request goes straight to the upstream over one pooled hyper
//! client, re-signed with aws-sigv4 and the upstream's own credentials (never the client's, never
//! logged). The operations the recorder observes are forwarded here one by one (their answers
//! read into s3s's types: `answers.rs`); every other operation — bucket settings, listings,
//! ACLs, tags, multipart bookkeeping — goes through as it came (`plain.rs`), the upstream's
//! answer handed back byte for byte.
//!
//! Forwarding keeps the client's own request headers (ranges, conditions, metadata, checksums)
//! and hands every response header back unchanged, so what the client sees is what the upstream
//! said; only the fields the recorder reads are parsed. Upstream errors keep their status, code
//! and message. A silent upstream fails the request after `--upstream-timeout`: waiting for a
//! response (once the request body is sent) and between two chunks of a body.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use aws_credential_types::Credentials;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use s3s::dto::*;

use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};
use tokio::sync::oneshot;

mod answers;
pub(crate) mod plain;
mod streams;

use streams::{Fault, Idle, Sent};

mod headers;
mod observed;

use headers::*;

/// The upstream as the recorder sees it.
pub(crate) struct Upstream {
    direct: Arc<Direct>,
}

/// `identities`: the upstream keys each client access key signs with (`--credentials` lines of
/// four fields); a key without one uses the gateway's own, from the environment or a profile.
pub(crate) async fn connect(
    url: &str,
    region: &str,
    timeout: Duration,
    identities: &HashMap<String, (String, String)>,
) -> anyhow::Result<Upstream> {
    let base: http::Uri = url
        .parse()
        .ok()
        .filter(|u: &http::Uri| {
            matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
        })
        .with_context(|| {
            format!("--upstream {url:?} is not an http(s) URL; give one like http://127.0.0.1:9000")
        })?;
    let own = crate::credentials::load();
    if own.is_none() && identities.is_empty() {
        anyhow::bail!(
            "no credentials for the upstream {base}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
        );
    }
    let mut direct = Direct::new(&base, region, timeout, own)?;
    direct.identities = identities
        .iter()
        .map(|(client, (access, secret))| {
            let c = Credentials::new(access, secret, None, None, "roar-gateway");
            (client.clone(), c)
        })
        .collect();
    Ok(Upstream {
        direct: Arc::new(direct),
    })
}

impl Upstream {
    /// The route that takes every operation the recorder has nothing to record for.
    pub(crate) fn plain_route(&self, hosts: crate::host::Hosts) -> plain::Plain {
        plain::Plain::new(Arc::clone(&self.direct), hosts)
    }
}

type Body = s3s::Body;

/// What a forwarded request carries.
enum Payload {
    None,
    /// The client's body, of this length, streamed through unread (its aws-chunked trailer's
    /// checksum checked first).
    Client(StreamingBlob, u64),
    /// A body made here (an XML document s3s parsed and wrote again): its own Content-MD5;
    /// with `body_checksums`, the client's `x-amz-checksum-*` headers described the client's
    /// body and are dropped (DeleteObjects), else they are the operation's own parameters
    /// (CompleteMultipartUpload's whole-object checksum) and stay.
    Made {
        body: Bytes,
        body_checksums: bool,
    },
}

pub(crate) struct Direct {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    /// `scheme://authority`, and the path prefix objects live under (empty, or `/prefix`).
    origin: String,
    prefix: String,
    host: HeaderValue,
    region: String,
    timeout: Duration,
    /// The gateway's own upstream identity, if it has one.
    own: Option<Credentials>,
    /// Each client access key's own upstream identity, where it has one.
    identities: HashMap<String, Credentials>,
}

impl Direct {
    pub(crate) fn new(
        base: &http::Uri,
        region: &str,
        timeout: Duration,
        own: Option<Credentials>,
    ) -> anyhow::Result<Direct> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?;
        // Trust roots are only loaded for an https upstream: a plain-http one must not need them.
        let tls = if base.scheme_str() == Some("https") {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                anyhow::bail!(
                    "no trusted CA certificates for the upstream {base}: install ca-certificates or set SSL_CERT_FILE"
                );
            }
            tls.with_root_certificates(roots)
        } else {
            tls.with_root_certificates(rustls::RootCertStore::empty())
        }
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        // Without it small requests wait for the upstream's delayed ACK.
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout.min(Duration::from_secs(5))));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        let authority = base.authority().context("the upstream URL has no host")?;
        Ok(Direct {
            client,
            origin: format!("{}://{authority}", base.scheme_str().unwrap_or("http")),
            prefix: base.path().trim_end_matches('/').to_owned(),
            host: HeaderValue::from_str(authority.as_str())?,
            region: region.to_owned(),
            timeout,
            own,
            identities: HashMap::new(),
        })
    }

    /// Who a request goes upstream as: the client key's own identity, else the gateway's. A
    /// client never acts upstream with another client's rights.
    fn identity(&self, client: Option<&s3s::auth::Credentials>) -> S3Result<Credentials> {
        let own = client.and_then(|c| self.identities.get(&c.access_key));
        own.or(self.own.as_ref()).cloned().ok_or_else(|| {
            S3Error::with_message(
                S3ErrorCode::AccessDenied,
                "this access key has no upstream identity at this gateway (give it one in --credentials: ACCESS SECRET UPSTREAM_ACCESS UPSTREAM_SECRET)",
            )
        })
    }

    /// The upstream URL of `bucket` (and `key`), path style, with the client's `query` minus
    /// what belonged to its own signature.
    fn url(&self, bucket: Option<&str>, key: Option<&str>, query: Option<&str>) -> String {
        let mut url = format!("{}{}/", self.origin, self.prefix);
        if let Some(bucket) = bucket {
            url.push_str(&encode(bucket, false));
            if let Some(key) = key {
                url.push('/');
                url.push_str(&encode(key, true));
            }
        }
        if let Some(query) = forwarded_query(query) {
            url.push('?');
            url.push_str(&query);
        }
        url
    }

    /// The client's headers that go upstream, with the upstream's Host.
    fn headers(&self, client: &HeaderMap) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, self.host.clone());
        for (name, value) in client {
            if let Some(value) = forwarded_header(name, value) {
                headers.append(name.clone(), value);
            }
        }
        headers
    }

    /// Sends one recorded operation's request upstream (`key` None: the bucket itself).
    /// Returns the response once its headers arrived with a success status; an error status
    /// becomes that S3 error.
    async fn send<T>(
        &self,
        method: Method,
        req: &S3Request<T>,
        bucket: &str,
        key: Option<&str>,
        payload: Payload,
    ) -> S3Result<http::Response<hyper::body::Incoming>> {
        let url = self.url(Some(bucket), key, req.uri.query());
        let mut headers = self.headers(&req.headers);
        let fault = Fault::default();
        let (body, sent) = match payload {
            Payload::None => (Body::empty(), None),
            Payload::Client(blob, length) => {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
                let (tx, rx) = oneshot::channel();
                // A checksum announced as an aws-chunked trailer (the trailer itself is not
                // forwarded) is checked before the upstream gets any of the body.
                let trailer = match &req.trailing_headers {
                    Some(t) if req.headers.contains_key("x-amz-trailer") => Some((
                        crate::embedded::wanted_checksums(
                            &crate::embedded::Checksums::default(),
                            None,
                            &req.headers,
                        )?,
                        t.clone(),
                    )),
                    _ => None,
                };
                // Checked whole before any of it goes up (`streams::spooled` says why).
                let blob = match trailer {
                    Some(t) => streams::spooled(blob, t).await?,
                    None => blob,
                };
                (
                    Body::from(StreamingBlob::new(Sent::new(blob, tx, fault.clone()))),
                    Some(rx),
                )
            }
            Payload::Made {
                body,
                body_checksums,
            } => {
                if body_checksums {
                    let client_checksums: Vec<HeaderName> = headers
                        .keys()
                        .filter(|n| {
                            n.as_str().starts_with("x-amz-checksum-")
                                || n.as_str() == "x-amz-sdk-checksum-algorithm"
                        })
                        .cloned()
                        .collect();
                    for n in client_checksums {
                        headers.remove(n);
                    }
                }
                let md5 = <md5::Md5 as md5::Digest>::digest(&body);
                let md5 = base64_simd::STANDARD.encode_to_string(md5);
                headers.insert("content-md5", HeaderValue::from_str(&md5).unwrap());
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
                (Body::from(body), None)
            }
        };
        let identity = self.identity(req.credentials.as_ref())?;
        let response = self
            .exchange(&identity, &method, &url, headers, body, sent, fault)
            .await?;
        self.checked(&method, response).await
    }

    /// Signs and sends one request and waits for its response's headers (whatever the status).
    /// `sent` fires when a streamed client body is all sent; `fault` then holds the client's
    /// own error, if its body failed.
    #[allow(clippy::too_many_arguments)]
    async fn exchange(
        &self,
        identity: &Credentials,
        method: &Method,
        url: &str,
        mut headers: HeaderMap,
        body: Body,
        sent: Option<oneshot::Receiver<()>>,
        fault: Fault,
    ) -> S3Result<http::Response<hyper::body::Incoming>> {
        self.sign(identity, method, url, &mut headers)?;
        let mut request = http::Request::new(body);
        *request.method_mut() = method.clone();
        *request.uri_mut() = url.parse().map_err(|e| invalid(format!("{e}")))?;
        *request.headers_mut() = headers;
        let response = self.client.request(request);
        tokio::pin!(response);
        // A request body takes as long as the client takes to send it; the upstream's silence
        // only counts from when it has the whole request.
        let result = async {
            if let Some(sent) = sent {
                tokio::select! {
                    r = &mut response => return connected(r),
                    _ = sent => {}
                }
                // The client's body failed: drop the upstream request (the upstream never gets
                // the whole body) rather than wait for hyper to notice.
                if let Some(client) = fault.lock().unwrap().take() {
                    return Err(client);
                }
            }
            match tokio::time::timeout(self.timeout, response).await {
                Ok(r) => connected(r),
                Err(_) => Err(unavailable(format!(
                    "the upstream did not answer within {:?}",
                    self.timeout
                ))),
            }
        }
        .await;
        // A request that failed because of the client's body fails with the client's error.
        let client = fault.lock().unwrap().take();
        match (result, client) {
            (Err(_), Some(client)) => Err(client),
            (result, _) => result,
        }
    }

    /// One object request of roar's own, not a client's (`objects_remote`): GET, HEAD, or PUT
    /// of a file's first `len` bytes. The answer's headers, or the upstream's error.
    pub(crate) async fn own(
        &self,
        method: Method,
        bucket: &str,
        key: &str,
        file: Option<(tokio::fs::File, u64)>,
    ) -> S3Result<http::Response<hyper::body::Incoming>> {
        let url = self.url(Some(bucket), Some(key), None);
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, self.host.clone());
        let body = match file {
            Some((file, len)) => {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
                Body::from(streams::file_body(file, len))
            }
            None => Body::empty(),
        };
        let identity = self.identity(None)?;
        let response = self
            .exchange(
                &identity,
                &method,
                &url,
                headers,
                body,
                None,
                Fault::default(),
            )
            .await?;
        self.checked(&method, response).await
    }

    /// A response body that fails when the upstream stays silent past the timeout.
    pub(crate) fn body(&self, body: hyper::body::Incoming) -> StreamingBlob {
        Idle::wrap(body, self.timeout)
    }

    /// The whole body of a (small) answer, within the upstream timeout between chunks.
    async fn read_body(&self, body: hyper::body::Incoming, limit: usize) -> S3Result<Vec<u8>> {
        use futures::StreamExt;
        let mut stream = Idle::wrap(body, self.timeout);
        let mut all = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| unavailable(format!("lost the upstream: {e}")))?;
            all.extend_from_slice(&chunk);
            if all.len() > limit {
                return Err(unavailable(format!(
                    "the upstream's answer is larger than {limit} bytes"
                )));
            }
        }
        Ok(all)
    }

    fn sign(
        &self,
        identity: &Credentials,
        method: &Method,
        url: &str,
        headers: &mut HeaderMap,
    ) -> S3Result<()> {
        use aws_sigv4::http_request::{
            sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
            SigningSettings, UriPathNormalizationMode,
        };
        let identity = identity.clone().into();
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        // The path is encoded once, here; S3 signs it as sent.
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(S3Error::internal_error)?
            .into();
        let mut pairs = Vec::with_capacity(headers.len());
        for (name, value) in headers.iter() {
            let value = value.to_str().map_err(|_| {
                invalid(format!(
                    "header {name} is not visible ASCII and cannot be re-signed"
                ))
            })?;
            pairs.push((name.as_str(), value));
        }
        // Bodies stream through unread: the upstream gets UNSIGNED-PAYLOAD (over TLS for
        // https upstreams); the client's own payload signature was verified on the way in.
        let signable = SignableRequest::new(
            method.as_str(),
            url,
            pairs.into_iter(),
            SignableBody::UnsignedPayload,
        )
        .map_err(|e| invalid(format!("cannot sign the upstream request: {e}")))?;
        let (instructions, _) = sign(signable, &params)
            .map_err(S3Error::internal_error)?
            .into_parts();
        let (signed, _query) = instructions.into_parts();
        for h in signed {
            let value = HeaderValue::from_str(h.value()).map_err(S3Error::internal_error)?;
            headers.insert(HeaderName::from_static(h.name()), value);
        }
        Ok(())
    }

    async fn checked(
        &self,
        method: &Method,
        response: http::Response<hyper::body::Incoming>,
    ) -> S3Result<http::Response<hyper::body::Incoming>> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let (parts, body) = response.into_parts();
        let text = if *method == Method::HEAD {
            Vec::new()
        } else {
            read_error_body(body, self.timeout).await
        };
        Err(upstream_error(status, &parts.headers, &text))
    }
}

/// A response's headers, or why there is none.
fn connected(
    result: Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error>,
) -> S3Result<http::Response<hyper::body::Incoming>> {
    result.map_err(|e| {
        let what = if e.is_connect() {
            "cannot connect to"
        } else {
            "lost"
        };
        unavailable(format!("{what} the upstream: {}", error_chain(&e)))
    })
}

impl Payload {
    /// A client's streamed body (PutObject, UploadPart). S3 needs its length up front, and
    /// refuses a body without one.
    fn client(body: Option<StreamingBlob>, content_length: Option<i64>) -> S3Result<Payload> {
        let length = content_length
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| {
                S3Error::with_message(
                    S3ErrorCode::MissingContentLength,
                    "You must provide the Content-Length HTTP header.",
                )
            })?;
        Ok(Payload::Client(
            body.unwrap_or_else(|| Body::empty().into()),
            length,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_encoded_once_as_sigv4_signs_them() {
        assert_eq!(
            encode("in/a b+(c)=ü&.bin", true),
            "in/a%20b%2B%28c%29%3D%C3%BC%26.bin"
        );
        assert_eq!(encode("a/b", false), "a%2Fb");
        assert_eq!(encode("A-z_0.9~", true), "A-z_0.9~");
    }

    #[test]
    fn the_clients_signature_stays_behind() {
        assert_eq!(
            forwarded_query(Some(
                "versionId=3&X-Amz-Signature=ab&x-id=GetObject&partNumber=2"
            )),
            Some("versionId=3&partNumber=2".into())
        );
        assert_eq!(forwarded_query(Some("x-id=PutObject")), None);
        let v = HeaderValue::from_static("v");
        for own in [
            "x-amz-date",
            "x-amz-content-sha256",
            "authorization",
            "host",
            "content-length",
            "x-amz-decoded-content-length",
        ] {
            assert!(
                forwarded_header(&HeaderName::from_static(own), &v).is_none(),
                "{own}"
            );
        }
        for kept in [
            "x-amz-meta-owner",
            "range",
            "if-none-match",
            "content-type",
            "x-amz-checksum-crc32",
        ] {
            assert!(
                forwarded_header(&HeaderName::from_static(kept), &v).is_some(),
                "{kept}"
            );
        }
        let chunked = HeaderValue::from_static("aws-chunked, gzip");
        assert_eq!(
            forwarded_header(&header::CONTENT_ENCODING, &chunked),
            Some(HeaderValue::from_static("gzip"))
        );
        let only = HeaderValue::from_static("aws-chunked");
        assert_eq!(forwarded_header(&header::CONTENT_ENCODING, &only), None);
    }

    #[test]
    fn upstream_errors_keep_status_code_and_message() {
        let body =
            b"<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>gone</Message></Error>";
        let e = upstream_error(StatusCode::NOT_FOUND, &HeaderMap::new(), body);
        assert_eq!(e.code(), &S3ErrorCode::NoSuchKey);
        assert_eq!(e.message(), Some("gone"));
        assert_eq!(e.status_code(), Some(StatusCode::NOT_FOUND));
        let head = upstream_error(StatusCode::PRECONDITION_FAILED, &HeaderMap::new(), b"");
        assert_eq!(head.code(), &S3ErrorCode::PreconditionFailed);
        let odd = upstream_error(
            StatusCode::CONFLICT,
            &HeaderMap::new(),
            b"<Error><Code>SlowDownPlease</Code></Error>",
        );
        assert_eq!(odd.code().as_str(), "SlowDownPlease");
        assert_eq!(odd.status_code(), Some(StatusCode::CONFLICT));
    }
}
