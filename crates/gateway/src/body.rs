//! Bodies hashed as they stream through: a wrapper that feeds every chunk to blake3 and reports
//! once, at the end of the stream (with the hash) or when it is dropped or fails first (without).
//! A body of known length ends with its last byte: hyper stops polling a response once it has
//! sent Content-Length bytes, so waiting for the stream's own end would miss every full GET.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use s3s::dto::StreamingBlob;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::StdError;

/// The content of a body that was read to its end.
#[derive(Debug, Clone)]
pub(crate) struct Digest {
    pub blake3: String,
    pub size: u64,
}

/// What a wrapper computes over the bytes that go through it.
pub(crate) trait Summarize: Send + Sync + Unpin + 'static {
    type Out: Send + 'static;
    fn update(&mut self, chunk: &[u8]);
    /// The summary of `size` bytes, all of the body.
    fn finish(&mut self, size: u64) -> Option<Self::Out>;
}

impl Summarize for blake3::Hasher {
    type Out = Digest;

    fn update(&mut self, chunk: &[u8]) {
        blake3::Hasher::update(self, chunk);
    }

    fn finish(&mut self, size: u64) -> Option<Digest> {
        Some(Digest {
            blake3: self.finalize().to_hex().to_string(),
            size,
        })
    }
}

/// A digest known already (the embedded store names blobs by it): only the bytes are counted, to
/// know that the client got them all.
struct Known(Option<Digest>);

impl Summarize for Known {
    type Out = Digest;

    fn update(&mut self, _chunk: &[u8]) {}

    fn finish(&mut self, _size: u64) -> Option<Digest> {
        self.0.take()
    }
}

type OnEnd<T> = Box<dyn FnOnce(Option<T>) + Send + Sync>;

pub(crate) struct Hashing<S: Summarize> {
    inner: StreamingBlob,
    sum: S,
    size: u64,
    expected: Option<u64>,
    on_end: Option<OnEnd<S::Out>>,
}

impl Hashing<blake3::Hasher> {
    /// Wraps `inner`, whose length is `expected` if known (else the stream's own exact length,
    /// if it has one); `on_end` is called exactly once: with the digest once all bytes went
    /// through, with `None` if the stream failed or was dropped before (a client that went away).
    pub(crate) fn wrap(
        inner: StreamingBlob,
        expected: Option<u64>,
        on_end: impl FnOnce(Option<Digest>) + Send + Sync + 'static,
    ) -> StreamingBlob {
        Hashing::with(inner, expected, blake3::Hasher::new(), on_end)
    }

    /// Like `wrap`, for a body whose object's digest is `known`: `on_end` gets `known` once the
    /// body went through whole (a range of the object ends when its own length went through).
    pub(crate) fn wrap_known(
        inner: StreamingBlob,
        expected: Option<u64>,
        known: Digest,
        on_end: impl FnOnce(Option<Digest>) + Send + Sync + 'static,
    ) -> StreamingBlob {
        Hashing::with(inner, expected, Known(Some(known)), on_end)
    }
}

impl<S: Summarize> Hashing<S> {
    /// Like `wrap`, summarizing with `sum`.
    pub(crate) fn with(
        inner: StreamingBlob,
        expected: Option<u64>,
        sum: S,
        on_end: impl FnOnce(Option<S::Out>) + Send + Sync + 'static,
    ) -> StreamingBlob {
        let expected = expected.or(inner.remaining_length().exact().map(|n| n as u64));
        let mut hashing = Hashing {
            inner,
            sum,
            size: 0,
            expected,
            on_end: Some(Box::new(on_end)),
        };
        if expected == Some(0) {
            hashing.complete();
        }
        StreamingBlob::new(hashing)
    }

    fn end(&mut self, out: Option<S::Out>) {
        if let Some(f) = self.on_end.take() {
            f(out);
        }
    }

    fn complete(&mut self) {
        let out = self.sum.finish(self.size);
        self.end(out);
    }
}

impl<S: Summarize> Stream for Hashing<S> {
    type Item = Result<bytes::Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_next(cx);
        match &polled {
            Poll::Ready(Some(Ok(chunk))) => {
                this.sum.update(chunk);
                this.size += chunk.len() as u64;
                if this.expected == Some(this.size) {
                    this.complete();
                }
            }
            Poll::Ready(None) => match this.expected {
                Some(n) if n != this.size => this.end(None),
                _ => this.complete(),
            },
            Poll::Ready(Some(Err(_))) => this.end(None),
            Poll::Pending => {}
        }
        polled
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<S: Summarize> ByteStream for Hashing<S> {
    fn remaining_length(&self) -> RemainingLength {
        self.inner.remaining_length()
    }
}

impl<S: Summarize> Drop for Hashing<S> {
    fn drop(&mut self) {
        self.end(None);
    }
}

/// Hashes a whole body, for objects the gateway reads itself (multipart results, copies).
pub(crate) async fn digest(mut body: StreamingBlob) -> Result<Digest, StdError> {
    use futures::StreamExt;
    let mut hasher = blake3::Hasher::new();
    let mut size = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        hasher.update(&chunk);
        size += chunk.len() as u64;
    }
    Ok(Digest {
        blake3: hasher.finalize().to_hex().to_string(),
        size,
    })
}

/// The S3 error for a request body that failed while being read: a payload that does not match
/// its signed SHA-256 is the client's fault (400 XAmzContentSHA256Mismatch, which SDKs do not
/// retry), as is a chunk signature that does not verify (403) or a body that ends early (400).
pub(crate) fn client_body_error(
    e: &(dyn std::error::Error + Send + Sync + 'static),
) -> s3s::S3Error {
    use s3s::{S3Error, S3ErrorCode};
    // s3s does not export its stream error types: their Display names the variant.
    let text = e.to_string();
    match () {
        _ if text.contains("Sha256Mismatch") => {
            let mut err = S3Error::with_message(
                S3ErrorCode::Custom("XAmzContentSHA256Mismatch".into()),
                "the body does not match the x-amz-content-sha256 it was signed with",
            );
            err.set_status_code(http::StatusCode::BAD_REQUEST);
            err
        }
        _ if text.contains(CLIENT_SILENT) => {
            let mut err = S3Error::with_message(
                S3ErrorCode::RequestTimeout,
                "your socket connection to the server was not read from or written to within the timeout period",
            );
            err.set_status_code(http::StatusCode::BAD_REQUEST);
            err
        }
        _ if text.contains("SignatureMismatch") => S3Error::with_message(
            S3ErrorCode::SignatureDoesNotMatch,
            "a chunk of the aws-chunked body does not match its signature",
        ),
        _ => S3Error::with_message(
            S3ErrorCode::IncompleteBody,
            format!("the request body broke off: {text}"),
        ),
    }
}

/// What `Idle` fails a body with.
const CLIENT_SILENT: &str = "the client sent nothing for too long (RequestTimeout)";

/// A request body that fails once the client stays silent for `timeout` (before its first byte
/// or between two): a client cannot hold a request, and what it announced, open forever.
pub(crate) struct Idle {
    inner: hyper::body::Incoming,
    timeout: std::time::Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl Idle {
    pub(crate) fn new(inner: hyper::body::Incoming, timeout: std::time::Duration) -> Idle {
        Idle {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }
}

impl http_body::Body for Idle {
    type Data = bytes::Bytes;
    type Error = StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, StdError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(frame)) => {
                let next = tokio::time::Instant::now() + this.timeout;
                this.deadline.as_mut().reset(next);
                Poll::Ready(Some(frame.map_err(StdError::from)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(CLIENT_SILENT.into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
