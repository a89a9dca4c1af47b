//! The upstream backend. Object GET, HEAD and PUT — the requests data jobs make by the thousand —
//! go straight to the upstream over one pooled hyper client, re-signed with aws-sigv4 and the
//! upstream's own credentials (never the client's, never logged); every other operation goes
//! through s3s-aws's proxy over an aws-sdk-s3 client, which maps the whole S3 API.
//!
//! The direct path forwards the client's own request headers (ranges, conditions, metadata,
//! checksums) and hands every response header back unchanged, so what the client sees is what the
//! upstream said; only the fields the recorder reads are parsed. Upstream errors keep their
//! status, code and message. A silent upstream fails the request after `--upstream-timeout`:
//! waiting for a response (once the request body is sent) and between two chunks of a body.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use aws_config::environment::credentials::EnvironmentVariableCredentialsProvider;
use aws_config::meta::credentials::CredentialsProviderChain;
use aws_config::profile::ProfileFileCredentialsProvider;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    StalledStreamProtectionConfig,
};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use s3s::dto::*;

use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};
use tokio::sync::oneshot;

mod streams;

use streams::{Fault, Idle, Sent};

/// The upstream as the recorder sees it: direct object reads and writes, the SDK for the rest.
pub(crate) struct Upstream {
    direct: Direct,
    sdk: s3s_aws::Proxy,
}

pub(crate) async fn connect(
    url: &str,
    region: &str,
    timeout: Duration,
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
    // The usual sources, in the usual order; nothing that would wait on a metadata endpoint.
    let credentials = SharedCredentialsProvider::new(
        CredentialsProviderChain::first_try(
            "Environment",
            EnvironmentVariableCredentialsProvider::new(),
        )
        .or_else("Profile", ProfileFileCredentialsProvider::builder().build()),
    );
    let first = credentials.provide_credentials().await.map_err(|_| {
        anyhow::anyhow!(
            "no credentials for the upstream {base}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
        )
    })?;
    let direct = Direct::new(&base, region, timeout, credentials.clone(), first)?;
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .endpoint_url(url)
        .force_path_style(true)
        .credentials_provider(credentials)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(timeout.min(Duration::from_secs(5)))
                .read_timeout(timeout)
                .build(),
        )
        // Streamed bodies cannot be replayed; one retry covers a dropped idle connection.
        .retry_config(RetryConfig::standard().with_max_attempts(2))
        // The client's own checksums travel as headers; the SDK adds none of its own.
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        // The read timeout above already bounds a silent upstream; the SDK's own throughput
        // monitor would add a timer check to every chunk of every body.
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
        .build();
    Ok(Upstream {
        direct,
        sdk: s3s_aws::Proxy::from(aws_sdk_s3::Client::from_conf(config)),
    })
}

type Body = s3s::Body;

struct Direct {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    /// `scheme://authority`, and the path prefix objects live under (empty, or `/prefix`).
    origin: String,
    prefix: String,
    host: HeaderValue,
    region: String,
    timeout: Duration,
    credentials: SharedCredentialsProvider,
    cached: Mutex<Credentials>,
}

/// Credentials that expire within this are fetched again before signing.
const REFRESH_BEFORE: Duration = Duration::from_secs(60);

impl Direct {
    fn new(
        base: &http::Uri,
        region: &str,
        timeout: Duration,
        credentials: SharedCredentialsProvider,
        first: Credentials,
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
            credentials,
            cached: Mutex::new(first),
        })
    }

    async fn credentials(&self) -> S3Result<Credentials> {
        let cached = self.cached.lock().unwrap().clone();
        let fresh = cached
            .expiry()
            .is_none_or(|at| at > SystemTime::now() + REFRESH_BEFORE);
        if fresh {
            return Ok(cached);
        }
        let renewed = self.credentials.provide_credentials().await.map_err(|e| {
            S3Error::with_message(
                S3ErrorCode::InternalError,
                format!("the gateway's upstream credentials expired and could not be renewed: {e}"),
            )
        })?;
        *self.cached.lock().unwrap() = renewed.clone();
        Ok(renewed)
    }

    /// Sends one object request upstream: the client's forwardable headers and query, signed
    /// for the upstream, with `body` (of `length` bytes) for a PUT. Returns the response once
    /// its headers arrived with a success status; an error status becomes that S3 error.
    async fn send<T>(
        &self,
        method: Method,
        req: &S3Request<T>,
        bucket: &str,
        key: &str,
        body: Option<(StreamingBlob, u64)>,
    ) -> S3Result<http::Response<hyper::body::Incoming>> {
        let mut url = format!("{}{}/{}/", self.origin, self.prefix, encode(bucket, false));
        url.push_str(&encode(key, true));
        if let Some(query) = forwarded_query(req.uri.query()) {
            url.push('?');
            url.push_str(&query);
        }
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, self.host.clone());
        for (name, value) in &req.headers {
            if let Some(value) = forwarded_header(name, value) {
                headers.append(name.clone(), value);
            }
        }
        let fault = Fault::default();
        let (body, sent) = match body {
            Some((blob, length)) => {
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
            None => (Body::empty(), None),
        };
        self.sign(&method, &url, &mut headers).await?;
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
                    r = &mut response => return self.checked(&method, r).await,
                    _ = sent => {}
                }
                // The client's body failed: drop the upstream request (the upstream never gets
                // the whole body) rather than wait for hyper to notice.
                if let Some(client) = fault.lock().unwrap().take() {
                    return Err(client);
                }
            }
            match tokio::time::timeout(self.timeout, response).await {
                Ok(r) => self.checked(&method, r).await,
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

    async fn sign(&self, method: &Method, url: &str, headers: &mut HeaderMap) -> S3Result<()> {
        use aws_sigv4::http_request::{
            sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
            SigningSettings, UriPathNormalizationMode,
        };
        let identity = self.credentials().await?.into();
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
        result: Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error>,
    ) -> S3Result<http::Response<hyper::body::Incoming>> {
        let response = result.map_err(|e| {
            let what = if e.is_connect() {
                "cannot connect to"
            } else {
                "lost"
            };
            unavailable(format!("{what} the upstream: {}", error_chain(&e)))
        })?;
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

/// Percent-encodes an S3 bucket or key for a path: everything but RFC 3986 unreserved
/// characters (and `/` between key segments), the form SigV4 signs.
fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The client's query minus what belonged to its own signature (presigned URLs) and the SDK's
/// operation hint.
fn forwarded_query(query: Option<&str>) -> Option<String> {
    let kept: Vec<&str> = query?
        .split('&')
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or_default();
            !name.is_empty() && !name.starts_with("X-Amz-") && name != "x-id"
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// The request headers that mean something to the object operation itself, as they go
/// upstream; the client's signature, the framing of its body and hop-by-hop headers stay here.
fn forwarded_header(name: &HeaderName, value: &HeaderValue) -> Option<HeaderValue> {
    let n = name.as_str();
    if let Some(amz) = n.strip_prefix("x-amz-") {
        let own = matches!(
            amz,
            "date"
                | "content-sha256"
                | "security-token"
                | "decoded-content-length"
                | "trailer"
                | "sdk-checksum-algorithm"
                | "user-agent"
        );
        return (!own).then(|| value.clone());
    }
    match n {
        // `aws-chunked` described the client's framing, which ends here.
        "content-encoding" => {
            let kept: Vec<&str> = value
                .to_str()
                .ok()?
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("aws-chunked"))
                .collect();
            (!kept.is_empty()).then(|| HeaderValue::from_str(&kept.join(", ")).ok())?
        }
        "range"
        | "if-match"
        | "if-none-match"
        | "if-modified-since"
        | "if-unmodified-since"
        | "content-type"
        | "content-md5"
        | "content-language"
        | "content-disposition"
        | "cache-control"
        | "expires" => Some(value.clone()),
        _ => None,
    }
}

/// The upstream's response headers as the client gets them: all but the connection's own.
fn returned_headers(upstream: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(upstream.len());
    for (name, value) in upstream {
        let hop = matches!(
            name.as_str(),
            "connection"
                | "keep-alive"
                | "proxy-connection"
                | "transfer-encoding"
                | "te"
                | "trailer"
                | "upgrade"
                | "content-length"
        );
        if !hop {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn etag(headers: &HeaderMap) -> Option<ETag> {
    headers
        .get(header::ETAG)
        .and_then(|v| ETag::parse_http_header(v.as_bytes()).ok())
}

fn content_length(headers: &HeaderMap) -> Option<i64> {
    header_str(headers, "content-length").and_then(|v| v.parse().ok())
}

fn invalid(msg: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, msg)
}

fn unavailable(msg: String) -> S3Error {
    tracing::warn!("{msg}");
    let mut e = S3Error::with_message(S3ErrorCode::ServiceUnavailable, msg);
    e.set_status_code(StatusCode::BAD_GATEWAY);
    e
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Error bodies are small XML documents; anything past this is not read.
const ERROR_BODY_LIMIT: usize = 64 << 10;

async fn read_error_body(body: hyper::body::Incoming, timeout: Duration) -> Vec<u8> {
    use futures::StreamExt;
    let mut stream = Idle::wrap(body, timeout);
    let mut text = Vec::new();
    while let Some(Ok(chunk)) = stream.next().await {
        text.extend_from_slice(&chunk);
        if text.len() > ERROR_BODY_LIMIT {
            break;
        }
    }
    text
}

/// The upstream's error as the client's: same status, same code and message when the body
/// has them (HEAD answers have no body: the status alone names the error).
fn upstream_error(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> S3Error {
    let text = String::from_utf8_lossy(body);
    let field = |tag: &str| {
        let open = format!("<{tag}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find(&format!("</{tag}>"))? + start;
        Some(text[start..end].to_owned())
    };
    let code = field("Code")
        .and_then(|c| S3ErrorCode::from_bytes(c.as_bytes()))
        .unwrap_or(match status {
            StatusCode::NOT_MODIFIED => S3ErrorCode::NotModified,
            StatusCode::NOT_FOUND => S3ErrorCode::NoSuchKey,
            StatusCode::FORBIDDEN => S3ErrorCode::AccessDenied,
            StatusCode::PRECONDITION_FAILED => S3ErrorCode::PreconditionFailed,
            StatusCode::RANGE_NOT_SATISFIABLE => S3ErrorCode::InvalidRange,
            _ => S3ErrorCode::Custom(status.as_str().into()),
        });
    let mut e = match field("Message") {
        Some(m) => S3Error::with_message(code, m),
        None => S3Error::new(code),
    };
    e.set_status_code(status);
    if let Some(id) = header_str(headers, "x-amz-request-id") {
        e.set_request_id(id);
    }
    // 304 and 412 carry the object's validators, which conditional clients read.
    let mut kept = HeaderMap::new();
    for name in [header::ETAG, header::LAST_MODIFIED] {
        if let Some(v) = headers.get(&name) {
            kept.insert(name, v.clone());
        }
    }
    if !kept.is_empty() {
        e.set_headers(kept);
    }
    e
}

/// The operations that go through the SDK, unchanged.
macro_rules! via_sdk {
    ( passthrough { $( $op:ident : $input:ident => $output:ident ; )* } ) => {
        #[async_trait::async_trait]
        impl S3 for Upstream {
            $(
                async fn $op(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.sdk.$op(req).await
                }
            )*

            async fn get_object(
                &self,
                req: S3Request<GetObjectInput>,
            ) -> S3Result<S3Response<GetObjectOutput>> {
                let (bucket, key) = (&req.input.bucket, &req.input.key);
                let resp = self.direct.send(Method::GET, &req, bucket, key, None).await?;
                let (parts, body) = resp.into_parts();
                let h = &parts.headers;
                let output = GetObjectOutput {
                    body: Some(Idle::wrap(body, self.direct.timeout)),
                    content_length: content_length(h),
                    content_range: header_str(h, "content-range").map(str::to_owned),
                    e_tag: etag(h),
                    version_id: header_str(h, "x-amz-version-id").map(str::to_owned),
                    ..Default::default()
                };
                let mut resp = S3Response::new(output);
                resp.status = Some(parts.status);
                resp.headers = returned_headers(h);
                Ok(resp)
            }

            async fn head_object(
                &self,
                req: S3Request<HeadObjectInput>,
            ) -> S3Result<S3Response<HeadObjectOutput>> {
                let (bucket, key) = (&req.input.bucket, &req.input.key);
                let resp = self.direct.send(Method::HEAD, &req, bucket, key, None).await?;
                let h = resp.headers();
                let output = HeadObjectOutput {
                    content_length: content_length(h),
                    e_tag: etag(h),
                    version_id: header_str(h, "x-amz-version-id").map(str::to_owned),
                    ..Default::default()
                };
                let mut out = S3Response::new(output);
                out.status = Some(resp.status());
                out.headers = returned_headers(h);
                Ok(out)
            }

            async fn put_object(
                &self,
                mut req: S3Request<PutObjectInput>,
            ) -> S3Result<S3Response<PutObjectOutput>> {
                // S3 needs the length up front; a body of unknown length goes the SDK's way,
                // which refuses it as S3 would.
                let Some(length) = req.input.content_length.and_then(|n| u64::try_from(n).ok())
                else {
                    return self.sdk.put_object(req).await;
                };
                let body = req.input.body.take().unwrap_or_else(|| Body::empty().into());
                let (bucket, key) = (&req.input.bucket, &req.input.key);
                let resp = self
                    .direct
                    .send(Method::PUT, &req, bucket, key, Some((body, length)))
                    .await?;
                let h = resp.headers();
                let output = PutObjectOutput {
                    e_tag: etag(h),
                    version_id: header_str(h, "x-amz-version-id").map(str::to_owned),
                    ..Default::default()
                };
                let mut out = S3Response::new(output);
                out.headers = returned_headers(h);
                Ok(out)
            }
        }
    };
}

with_plain_ops!(via_sdk {
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
    delete_object: DeleteObjectInput => DeleteObjectOutput;
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
    copy_object: CopyObjectInput => CopyObjectOutput;
    upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
    upload_part: UploadPartInput => UploadPartOutput;
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
});

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
