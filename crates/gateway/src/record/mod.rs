//! The recording layer: an `S3` implementation that hands every request to the backend (the
//! embedded store or the upstream proxy) and reports each *completed* object access to a `Sink`.
//!
//! - PUT: the request body is hashed while the backend consumes it; the write is recorded when
//!   the backend accepted it and the body was read to its end.
//! - GET: the response body is hashed while the client reads it; the read is recorded when the
//!   client got the last byte (a client that goes away mid-body records nothing). A ranged GET
//!   records its range and the object's full hash, known from an earlier access or computed by
//!   reading the object once in the background.
//! - Multipart uploads and copies produce an object the gateway never streamed whole. The embedded
//!   store reports the blake3 it named the object by (a `Stored` response extension); through an
//!   upstream, a multipart object's hash is merged from its parts' BLAKE3 subtrees (`parts.rs`),
//!   and otherwise the result is read back once, in the background, to hash it.
//! - Deletes record the key as deleted. Listings, HEADs and bucket operations are served, not
//!   recorded. Every other operation goes to the backend as it is (`ops.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use s3s::dto::*;
use s3s::{S3Request, S3};

use crate::body::{self, Digest};
use crate::control::{Inflight, InflightGuard};
use crate::parts::Uploads;
use crate::pending::{self, Pending};

mod serve;

/// What a client did to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AccessKind {
    Read,
    Write,
    Delete,
}

/// One completed object access.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Access {
    /// The access key the request was signed with.
    pub access_key: Option<String>,
    pub bucket: String,
    pub key: String,
    pub kind: AccessKind,
    pub version_id: Option<String>,
    pub etag: Option<String>,
    /// blake3 of the whole object, when known (never for deletes).
    pub blake3: Option<String>,
    /// Size of the whole object, when known.
    pub size: Option<u64>,
    /// The byte range served, for ranged reads (`bytes 0-1023/4096`).
    pub range: Option<String>,
    /// When it completed: the backend accepted the write or delete, the client got the last
    /// byte. Accesses reach the sink out of order when one waits for background hashing.
    pub at_ns: i64,
}

/// Where accesses go: a `roar run` collects them for its one job; a standalone gateway turns
/// them into jobs per access key.
pub trait Sink: Send + Sync + 'static {
    fn record(&self, access: Access);

    /// The blake3 and size of an object version recorded before, if the store knows it.
    fn known(&self, _bucket: &str, _key: &str, _etag: &str) -> Option<(String, u64)> {
        None
    }
}

impl Access {
    /// An access that completed now, with nothing known yet about the object's content.
    fn new(access_key: Option<String>, bucket: String, key: String, kind: AccessKind) -> Access {
        Access {
            access_key,
            bucket,
            key,
            kind,
            version_id: None,
            etag: None,
            blake3: None,
            size: None,
            range: None,
            at_ns: roar_store::now_ns(),
        }
    }
}

type ObjectId = (String, String, String);

pub(crate) struct Recorder {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Box<dyn S3>,
    /// The embedded store, which knows every object's blake3 without reading it back.
    store: Option<crate::Embedded>,
    /// Multipart uploads through an upstream: their parts' subtree hashes.
    uploads: Uploads,
    sink: Arc<dyn Sink>,
    /// blake3 and size by (bucket, key, ETag), for objects this gateway streamed whole.
    known: Mutex<HashMap<ObjectId, (String, u64)>>,
    pending: Arc<Pending>,
    inflight: Arc<Inflight>,
}

/// Background work for an access: the gateway's stop waits for it, and so does a run that
/// borrowed the access key (its requests are over only once their accesses are recorded).
struct Background {
    _work: pending::Guard,
    _key: Option<InflightGuard>,
}

impl Recorder {
    pub(crate) fn new(
        inner: Box<dyn S3>,
        store: Option<crate::Embedded>,
        sink: Arc<dyn Sink>,
        pending: Arc<Pending>,
        inflight: Arc<Inflight>,
    ) -> Recorder {
        Recorder {
            shared: Arc::new(Shared {
                inner,
                store,
                uploads: Uploads::default(),
                sink,
                known: Mutex::default(),
                pending,
                inflight,
            }),
        }
    }
}

fn access_key<T>(req: &S3Request<T>) -> Option<String> {
    req.credentials.as_ref().map(|c| c.access_key.clone())
}

fn etag_str(etag: &Option<ETag>) -> Option<String> {
    etag.as_ref().map(|e| e.value().to_owned())
}

impl Shared {
    fn background(&self, access_key: Option<&str>) -> Background {
        Background {
            _work: self.pending.start(),
            _key: access_key.map(|k| self.inflight.start(k.to_owned())),
        }
    }

    fn record(&self, access: Access) {
        if let (Some(etag), Some(b3), Some(size)) = (&access.etag, &access.blake3, access.size) {
            self.known.lock().unwrap().insert(
                (access.bucket.clone(), access.key.clone(), etag.clone()),
                (b3.clone(), size),
            );
        }
        self.sink.record(access);
    }

    fn known(&self, bucket: &str, key: &str, etag: &str) -> Option<(String, u64)> {
        let id = (bucket.to_owned(), key.to_owned(), etag.to_owned());
        if let Some(found) = self.known.lock().unwrap().get(&id) {
            return Some(found.clone());
        }
        if let Some(found) = self
            .store
            .as_ref()
            .and_then(|s| tokio::task::block_in_place(|| s.known(bucket, key, etag)))
        {
            return Some(found);
        }
        self.sink.known(bucket, key, etag)
    }

    /// Reads an object through the backend and hashes it. `etag` pins the version; the ETag
    /// read is returned with the digest.
    async fn digest_object(
        &self,
        bucket: &str,
        key: &str,
        etag: Option<&str>,
    ) -> Option<(Digest, Option<String>)> {
        let mut input = GetObjectInput::builder()
            .bucket(bucket.to_owned())
            .key(key.to_owned());
        if let Some(etag) = etag {
            input = input.if_match(Some(ETagCondition::ETag(ETag::Strong(etag.to_owned()))));
        }
        let input = input.build().ok()?;
        let req = S3Request {
            input,
            method: http::Method::GET,
            uri: http::Uri::from_static("/"),
            headers: http::HeaderMap::new(),
            extensions: http::Extensions::new(),
            credentials: None,
            region: None,
            service: None,
            trailing_headers: None,
        };
        let resp = match self.inner.get_object(req).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("could not read {} back to hash it: {e}", shown(bucket, key));
                return None;
            }
        };
        let etag = etag_str(&resp.output.e_tag);
        let blob = resp.output.body.unwrap_or_else(empty_blob);
        match body::digest(blob).await {
            Ok(d) => Some((d, etag)),
            Err(e) => {
                tracing::warn!("could not read {} back to hash it: {e}", shown(bucket, key));
                None
            }
        }
    }

    /// Records `access` once the object's hash is known, reading the object back in the
    /// background if this gateway has never seen it whole. `pin` is the version's ETag.
    fn record_with_digest(self: &Arc<Self>, mut access: Access, pin: Option<String>) {
        // Unpinned (a copy's source): the embedded store knows its current version's hash.
        if pin.is_none() && access.version_id.is_none() {
            let current = self.store.as_ref().and_then(|s| {
                tokio::task::block_in_place(|| s.current(&access.bucket, &access.key))
            });
            if let Some((etag, b3, size)) = current {
                access.etag = Some(etag);
                access.blake3 = Some(b3);
                access.size = Some(size);
                self.record(access);
                return;
            }
        }
        if let Some((b3, size)) = pin
            .as_deref()
            .and_then(|etag| self.known(&access.bucket, &access.key, etag))
        {
            access.blake3 = Some(b3);
            access.size = Some(size);
            self.record(access);
            return;
        }
        let shared = Arc::clone(self);
        let guard = self.background(access.access_key.as_deref());
        tokio::spawn(async move {
            if let Some((d, etag)) = shared
                .digest_object(&access.bucket, &access.key, pin.as_deref())
                .await
            {
                access.blake3 = Some(d.blake3);
                access.size = Some(d.size);
                access.etag = access.etag.or(etag);
            }
            shared.record(access);
            drop(guard);
        });
    }
}

fn empty_blob() -> StreamingBlob {
    StreamingBlob::from(s3s::Body::empty())
}

/// An object as a log line shows it: keys are the client's and may hold control characters.
fn shown(bucket: &str, key: &str) -> String {
    format!("s3://{}/{}", bucket.escape_debug(), key.escape_debug())
}
