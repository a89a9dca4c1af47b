//! What crosses between the client and the upstream: keys encoded as SigV4 signs them, the query
//! and headers forwarded up, the headers handed back, and the upstream's errors as S3 errors with
//! their status, code and message.

use super::*;

/// Percent-encodes an S3 bucket or key for a path: everything but RFC 3986 unreserved
/// characters (and `/` between key segments), the form SigV4 signs.
pub(super) fn encode(s: &str, keep_slash: bool) -> String {
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
pub(super) fn forwarded_query(query: Option<&str>) -> Option<String> {
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
pub(super) fn forwarded_header(name: &HeaderName, value: &HeaderValue) -> Option<HeaderValue> {
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
pub(super) fn returned_headers(upstream: &HeaderMap) -> HeaderMap {
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

pub(super) fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

pub(super) fn etag(headers: &HeaderMap) -> Option<ETag> {
    headers
        .get(header::ETAG)
        .and_then(|v| ETag::parse_http_header(v.as_bytes()).ok())
}

pub(super) fn content_length(headers: &HeaderMap) -> Option<i64> {
    header_str(headers, "content-length").and_then(|v| v.parse().ok())
}

pub(super) fn invalid(msg: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, msg)
}

pub(super) fn unavailable(msg: String) -> S3Error {
    tracing::warn!("{msg}");
    let mut e = S3Error::with_message(S3ErrorCode::ServiceUnavailable, msg);
    e.set_status_code(StatusCode::BAD_GATEWAY);
    e
}

pub(super) use roar_store::error_chain;

/// Error bodies are small XML documents; anything past this is not read.
pub(super) const ERROR_BODY_LIMIT: usize = 64 << 10;

pub(super) async fn read_error_body(body: hyper::body::Incoming, timeout: Duration) -> Vec<u8> {
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
pub(super) fn upstream_error(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> S3Error {
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

pub(super) fn header_of(h: &HeaderMap, name: &str) -> Option<String> {
    header_str(h, name).map(str::to_owned)
}

/// An answer with the upstream's status and every one of its headers.
pub(super) fn answer<T>(output: T, parts: &http::response::Parts) -> S3Response<T> {
    let mut out = S3Response::new(output);
    out.status = Some(parts.status);
    out.headers = returned_headers(&parts.headers);
    out
}

/// XML answers are small; anything past this is not an answer to these operations.
pub(super) const ANSWER_LIMIT: usize = 16 << 20;
