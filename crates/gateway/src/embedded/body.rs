//! Request bodies into blobs and blobs into response bodies.

use std::fs::File;
use std::future::Future;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::StreamExt;
use s3s::checksum::ChecksumHasher;
use s3s::dto::{ChecksumAlgorithm, StreamingBlob};
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{s3_error, S3Error, S3Result, StdError};

use super::blobs::{Blobs, Written};
use super::index::Checksums;
use super::internal;

/// Runs blocking file or database work on a runtime worker without stalling the others.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Writes a request body to a temp file, hashing it; nothing is kept until the caller verifies
/// and keeps the result.
pub(crate) async fn receive(
    blobs: &Blobs,
    body: Option<StreamingBlob>,
    checksums: ChecksumHasher,
) -> S3Result<Written> {
    const BATCH: usize = 1 << 20;
    let mut w = blocking(|| blobs.writer(checksums)).map_err(internal)?;
    let Some(mut body) = body else {
        return w.finish().map_err(internal);
    };
    let mut batch: Vec<u8> = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| crate::body::client_body_error(&*e))?;
        if batch.is_empty() && chunk.len() >= BATCH {
            blocking(|| w.write(&chunk)).map_err(internal)?;
            continue;
        }
        batch.extend_from_slice(&chunk);
        if batch.len() >= BATCH {
            blocking(|| w.write(&batch)).map_err(internal)?;
            batch.clear();
        }
    }
    if !batch.is_empty() {
        blocking(|| w.write(&batch)).map_err(internal)?;
    }
    blocking(|| w.finish()).map_err(internal)
}

/// A hasher for every checksum the client sent or announced (as a header, as the algorithm it
/// uses, or as a trailer to come).
pub(crate) fn wanted(
    claimed: &Checksums,
    algorithm: Option<&ChecksumAlgorithm>,
    headers: &http::HeaderMap,
) -> S3Result<ChecksumHasher> {
    let mut h = ChecksumHasher::default();
    let mut want = |name: &str| -> S3Result<()> {
        match name.to_ascii_uppercase().as_str() {
            "CRC32" => h.crc32 = Some(Default::default()),
            "CRC32C" => h.crc32c = Some(Default::default()),
            "CRC64NVME" => h.crc64nvme = Some(Default::default()),
            "SHA1" => h.sha1 = Some(Default::default()),
            "SHA256" => h.sha256 = Some(Default::default()),
            other => {
                return Err(s3_error!(
                    InvalidArgument,
                    "unknown checksum algorithm {other:?}; use CRC32, CRC32C, CRC64NVME, SHA1 or SHA256"
                ))
            }
        }
        Ok(())
    };
    for (name, value) in claimed.fields() {
        if value.is_some() {
            want(name)?;
        }
    }
    if let Some(a) = algorithm {
        want(a.as_str())?;
    }
    if let Some(trailer) = headers.get("x-amz-trailer").and_then(|v| v.to_str().ok()) {
        for t in trailer.split(',') {
            if let Some(name) = t
                .trim()
                .to_ascii_lowercase()
                .strip_prefix("x-amz-checksum-")
            {
                want(name)?;
            }
        }
    }
    Ok(h)
}

impl Checksums {
    pub(crate) fn fields(&self) -> [(&'static str, &Option<String>); 5] {
        [
            ("CRC32", &self.crc32),
            ("CRC32C", &self.crc32c),
            ("CRC64NVME", &self.crc64nvme),
            ("SHA1", &self.sha1),
            ("SHA256", &self.sha256),
        ]
    }

    /// The checksums a request claims: CRC32, CRC32C, CRC64NVME, SHA1, SHA256.
    pub(crate) fn claimed(
        [crc32, crc32c, crc64nvme, sha1, sha256]: [Option<String>; 5],
    ) -> Checksums {
        Checksums {
            crc32,
            crc32c,
            crc64nvme,
            sha1,
            sha256,
            kind: None,
        }
    }

    pub(crate) fn from_dto(c: s3s::dto::Checksum) -> Checksums {
        Checksums {
            crc32: c.checksum_crc32,
            crc32c: c.checksum_crc32c,
            crc64nvme: c.checksum_crc64nvme,
            sha1: c.checksum_sha1,
            sha256: c.checksum_sha256,
            kind: None,
        }
    }

    /// Adds the checksums a client sent in an aws-chunked trailer.
    pub(crate) fn add_trailers(&mut self, trailers: Option<&s3s::TrailingHeaders>) -> S3Result<()> {
        let Some(map) = trailers.and_then(s3s::TrailingHeaders::take) else {
            return Ok(());
        };
        for (name, slot) in [
            ("x-amz-checksum-crc32", &mut self.crc32),
            ("x-amz-checksum-crc32c", &mut self.crc32c),
            ("x-amz-checksum-crc64nvme", &mut self.crc64nvme),
            ("x-amz-checksum-sha1", &mut self.sha1),
            ("x-amz-checksum-sha256", &mut self.sha256),
        ] {
            if let Some(v) = map.get(name) {
                let v = v
                    .to_str()
                    .map_err(|_| s3_error!(InvalidArgument, "trailer {name} is not text"))?;
                *slot = Some(v.to_owned());
            }
        }
        Ok(())
    }

    /// BadDigest unless every checksum the client claimed is the one computed.
    pub(crate) fn verify(&self, computed: &Checksums) -> S3Result<()> {
        for ((name, claimed), (_, got)) in self.fields().into_iter().zip(computed.fields()) {
            if let Some(claimed) = claimed {
                if Some(claimed) != got.as_ref() {
                    return Err(s3_error!(
                        BadDigest,
                        "the {name} checksum you specified ({claimed}) did not match what we received ({})",
                        got.as_deref().unwrap_or("none")
                    ));
                }
            }
        }
        Ok(())
    }
}

/// BadDigest unless the body's MD5 is the Content-MD5 the client sent.
pub(crate) fn verify_md5(content_md5: Option<&str>, written: &Written) -> S3Result<()> {
    let Some(claimed) = content_md5 else {
        return Ok(());
    };
    let decoded = base64_simd::STANDARD
        .decode_to_vec(claimed.trim())
        .map_err(|_| s3_error!(InvalidDigest, "Content-MD5 {claimed:?} is not base64"))?;
    if decoded != written.md5 {
        return Err(s3_error!(
            BadDigest,
            "the Content-MD5 you specified did not match what we received"
        ));
    }
    Ok(())
}

/// IncompleteBody when a declared length and the bytes received differ.
pub(crate) fn verify_length(declared: Option<i64>, written: &Written) -> S3Result<()> {
    match declared {
        // Zero also stands for "not known" after aws-chunked decoding.
        Some(n) if n > 0 && u64::try_from(n).ok() != Some(written.size) => Err(s3_error!(
            IncompleteBody,
            "the body has {} bytes where Content-Length said {n}",
            written.size
        )),
        _ => Ok(()),
    }
}

/// Bytes `start..end` of a blob, read a block ahead on the blocking pool: the next block is
/// being read while the client takes this one, and no runtime thread waits on the disk.
pub(crate) struct BlobStream {
    file: Arc<File>,
    /// Where the next block to read starts.
    pos: u64,
    end: u64,
    /// Bytes not yet handed to the client.
    left: u64,
    reading: Option<tokio::task::JoinHandle<std::io::Result<Bytes>>>,
}

impl BlobStream {
    pub(crate) fn blob(file: File, start: u64, end: u64) -> StreamingBlob {
        let mut s = BlobStream {
            file: Arc::new(file),
            pos: start,
            end,
            left: end - start,
            reading: None,
        };
        s.read_next();
        StreamingBlob::new(s)
    }

    fn read_next(&mut self) {
        const BLOCK: u64 = 2 << 20;
        if self.pos >= self.end {
            return;
        }
        let (file, at, n) = (
            Arc::clone(&self.file),
            self.pos,
            (self.end - self.pos).min(BLOCK) as usize,
        );
        self.pos += n as u64;
        self.reading = Some(tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; n];
            let mut got = 0;
            while got < n {
                match file.read_at(&mut buf[got..], at + got as u64)? {
                    0 => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "the stored object ended early",
                        ))
                    }
                    k => got += k,
                }
            }
            Ok(Bytes::from(buf))
        }));
    }
}

impl futures::Stream for BlobStream {
    type Item = Result<Bytes, StdError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(reading) = self.reading.as_mut() else {
            return Poll::Ready(None);
        };
        let done = match Pin::new(reading).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(done) => done,
        };
        self.reading = None;
        match done {
            Ok(Ok(block)) => {
                self.left -= block.len() as u64;
                self.read_next();
                Poll::Ready(Some(Ok(block)))
            }
            Ok(Err(e)) => Poll::Ready(Some(Err(Box::new(e)))),
            Err(e) => Poll::Ready(Some(Err(Box::new(e)))),
        }
    }
}

impl ByteStream for BlobStream {
    fn remaining_length(&self) -> RemainingLength {
        RemainingLength::new_exact(self.left as usize)
    }
}

pub(crate) fn not_found_blob(e: &std::io::Error) -> S3Error {
    internal(format!("an object's stored body is missing: {e}"))
}
