//! The bodies the upstream path wraps: a request body on its way up (`Sent`: fully handed over,
//! the client's faults, trailer checksums) and a response body on its way down (`Idle`: an
//! upstream that goes silent).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use s3s::dto::StreamingBlob;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{S3Error, StdError};
use tokio::sync::oneshot;

type Body = s3s::Body;

/// Why a request body failed, when it was the client's doing.
pub(super) type Fault = Arc<Mutex<Option<S3Error>>>;

/// A request body on its way to the upstream: reports, once, that it was handed over in full (or
/// dropped); notes in `fault` why it failed when that is the client's doing; and with a trailer
/// checksum to verify, holds its last chunk back until the trailer matched, so that an upstream
/// never has a whole body the client's checksum refused.
pub(super) struct Sent {
    inner: StreamingBlob,
    done: Option<oneshot::Sender<()>>,
    fault: Fault,
    trailer: Option<(s3s::checksum::ChecksumHasher, s3s::TrailingHeaders)>,
    held: Option<Bytes>,
    finished: bool,
}

impl Sent {
    pub(super) fn new(
        inner: StreamingBlob,
        done: oneshot::Sender<()>,
        fault: Fault,
        trailer: Option<(s3s::checksum::ChecksumHasher, s3s::TrailingHeaders)>,
    ) -> Sent {
        Sent {
            inner,
            done: Some(done),
            fault,
            trailer,
            held: None,
            finished: false,
        }
    }

    fn signal(&mut self) {
        self.done.take().map(|d| d.send(()));
    }
}

/// Signals `done` when it goes out of scope, after whatever was noted before.
struct SignalOnDrop(Option<oneshot::Sender<()>>);

impl Drop for SignalOnDrop {
    fn drop(&mut self) {
        self.0.take().map(|d| d.send(()));
    }
}

impl Stream for Sent {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.finished {
                return Poll::Ready(this.held.take().map(Ok));
            }
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    let Some((hasher, _)) = &mut this.trailer else {
                        return Poll::Ready(Some(Ok(chunk)));
                    };
                    hasher.update(&chunk);
                    if let Some(previous) = this.held.replace(chunk) {
                        return Poll::Ready(Some(Ok(previous)));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    *this.fault.lock().unwrap() = Some(crate::body::client_body_error(&*e));
                    this.signal();
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    this.finished = true;
                    // The fault is noted before `done` is signalled: the waiter reads it then.
                    let _signal = SignalOnDrop(this.done.take());
                    if let Some((hasher, trailers)) = this.trailer.take() {
                        let mut claimed = crate::embedded::Checksums::default();
                        let computed = crate::embedded::Checksums::from_dto(hasher.finalize());
                        let checked = claimed
                            .add_trailers(Some(&trailers))
                            .and_then(|()| claimed.verify(&computed));
                        if let Err(e) = checked {
                            *this.fault.lock().unwrap() = Some(e);
                            this.held = None;
                            return Poll::Ready(Some(Err(
                                "the trailer checksum does not match the body".into(),
                            )));
                        }
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let (low, high) = self.inner.size_hint();
        let held = usize::from(self.held.is_some());
        (low + held, high.map(|h| h + held))
    }
}

impl ByteStream for Sent {
    /// The inner stream's, plus a chunk held back: a body that reported 0 while it still holds
    /// its last chunk would be taken as ended and never polled again.
    fn remaining_length(&self) -> RemainingLength {
        let held = self.held.as_ref().map_or(0, Bytes::len);
        if held == 0 {
            return self.inner.remaining_length();
        }
        match self.inner.remaining_length().exact() {
            Some(n) => RemainingLength::new_exact(n + held),
            None => RemainingLength::unknown(),
        }
    }
}

/// A response body that fails if the upstream stays silent for longer than `timeout`.
pub(super) struct Idle {
    inner: Body,
    timeout: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl Idle {
    pub(super) fn wrap(inner: hyper::body::Incoming, timeout: Duration) -> StreamingBlob {
        StreamingBlob::new(Idle {
            inner: Body::from(inner),
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        })
    }
}

impl Stream for Idle {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Ready(item) => {
                let next = tokio::time::Instant::now() + this.timeout;
                this.deadline.as_mut().reset(next);
                Poll::Ready(item)
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                    "the upstream sent nothing for {:?} in the middle of a body",
                    this.timeout
                )
                .into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl ByteStream for Idle {
    fn remaining_length(&self) -> RemainingLength {
        self.inner.remaining_length()
    }
}
