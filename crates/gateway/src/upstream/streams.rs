//! The bodies the upstream path wraps: a request body on its way up (`Sent`: fully handed over,
//! the client's faults; `spooled`: a body checked whole before it goes up) and a response body
//! on its way down (`Idle`: an upstream that goes silent).

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
/// dropped), and notes in `fault` why it failed when that is the client's doing.
pub(super) struct Sent {
    inner: StreamingBlob,
    done: Option<oneshot::Sender<()>>,
    fault: Fault,
}

impl Sent {
    pub(super) fn new(inner: StreamingBlob, done: oneshot::Sender<()>, fault: Fault) -> Sent {
        Sent {
            inner,
            done: Some(done),
            fault,
        }
    }

    fn signal(&mut self) {
        self.done.take().map(|d| d.send(()));
    }
}

impl Stream for Sent {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(chunk))) => Poll::Ready(Some(Ok(chunk))),
            Poll::Ready(Some(Err(e))) => {
                // The fault is noted before `done` is signalled: the waiter reads it then.
                *this.fault.lock().unwrap() = Some(crate::body::client_body_error(&*e));
                this.signal();
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.signal();
                Poll::Ready(None)
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl ByteStream for Sent {
    fn remaining_length(&self) -> RemainingLength {
        self.inner.remaining_length()
    }
}

/// A body whose trailer checksum is only known at its end, taken whole (into an unnamed temp
/// file) and checked before the upstream gets a byte of it. Holding back the last chunk is not
/// enough: an upstream may keep what it got of a body whose connection dropped (versitygw commits
/// it), so a body roar refuses must never start on its way up. Err: the client's error (its body
/// failed, or its checksum does not match). The cost is the overlap of the client's upload with
/// the upstream's (bench/s3.sh measures it); memory stays one chunk.
pub(super) async fn spooled(
    mut blob: StreamingBlob,
    (mut hasher, trailers): (s3s::checksum::ChecksumHasher, s3s::TrailingHeaders),
) -> Result<StreamingBlob, S3Error> {
    use futures::StreamExt;
    use tokio::io::{AsyncSeekExt, AsyncWriteExt};
    // Up to IN_MEMORY bytes are held in memory; past it, everything goes to the file.
    const IN_MEMORY: usize = 1 << 20;
    let mut held: Vec<Bytes> = Vec::new();
    let mut held_len = 0;
    let mut file: Option<tokio::fs::File> = None;
    while let Some(chunk) = blob.next().await {
        let chunk = chunk.map_err(|e| crate::body::client_body_error(&*e))?;
        hasher.update(&chunk);
        if file.is_none() && held_len + chunk.len() <= IN_MEMORY {
            held_len += chunk.len();
            held.push(chunk);
            continue;
        }
        if file.is_none() {
            let std_file = tokio::task::spawn_blocking(tempfile::tempfile)
                .await
                .map_err(S3Error::internal_error)?
                .map_err(S3Error::internal_error)?;
            let mut f = tokio::fs::File::from_std(std_file);
            for c in held.drain(..) {
                f.write_all(&c).await.map_err(S3Error::internal_error)?;
            }
            file = Some(f);
        }
        let f = file.as_mut().expect("made above");
        f.write_all(&chunk).await.map_err(S3Error::internal_error)?;
    }
    let mut claimed = crate::embedded::Checksums::default();
    let computed = crate::embedded::Checksums::from_dto(hasher.finalize());
    claimed.add_trailers(Some(&trailers))?;
    claimed.verify(&computed)?;
    let Some(mut file) = file else {
        let chunks = futures::stream::iter(held.into_iter().map(Ok::<_, StdError>));
        return Ok(StreamingBlob::new(Held {
            inner: Box::pin(chunks),
            left: held_len,
        }));
    };
    file.flush().await.map_err(S3Error::internal_error)?;
    let length = file
        .seek(std::io::SeekFrom::End(0))
        .await
        .map_err(S3Error::internal_error)?;
    file.seek(std::io::SeekFrom::Start(0))
        .await
        .map_err(S3Error::internal_error)?;
    Ok(StreamingBlob::new(FromFile { file, left: length }))
}

/// A spooled body held in memory.
struct Held {
    inner: Pin<Box<dyn Stream<Item = Result<Bytes, StdError>> + Send + Sync>>,
    left: usize,
}

impl Stream for Held {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let item = this.inner.as_mut().poll_next(cx);
        if let Poll::Ready(Some(Ok(c))) = &item {
            this.left -= c.len();
        }
        item
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ByteStream for Held {
    fn remaining_length(&self) -> RemainingLength {
        RemainingLength::new_exact(self.left)
    }
}

/// A spooled body read back, in chunks of up to 1 MiB.
struct FromFile {
    file: tokio::fs::File,
    left: u64,
}

impl Stream for FromFile {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.left == 0 {
            return Poll::Ready(None);
        }
        let mut buf = vec![0u8; this.left.min(1 << 20) as usize];
        let mut read = tokio::io::ReadBuf::new(&mut buf);
        match tokio::io::AsyncRead::poll_read(Pin::new(&mut this.file), cx, &mut read) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(Ok(())) => {
                let n = read.filled().len();
                if n == 0 {
                    return Poll::Ready(Some(Err("the spooled body ended early".into())));
                }
                this.left -= n as u64;
                buf.truncate(n);
                Poll::Ready(Some(Ok(Bytes::from(buf))))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ByteStream for FromFile {
    fn remaining_length(&self) -> RemainingLength {
        RemainingLength::new_exact(self.left as usize)
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

/// A file's first `len` bytes as a request body (roar's own uploads: `objects_remote`).
pub(super) fn file_body(file: tokio::fs::File, len: u64) -> StreamingBlob {
    StreamingBlob::new(FromFile { file, left: len })
}
