//! What a running gateway lets its owner change and wait for: the access keys it accepts (a
//! `roar run` that reuses a standalone gateway gets a key of its own for the run's lifetime) and
//! the requests still in flight per key (a run takes its accesses only once its own requests are
//! over: a client has the last byte of a read slightly before the gateway records it).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use s3s::auth::{S3Auth, SecretKey};
use s3s::{s3_error, S3Result};

/// The access keys clients may sign with; changeable while the gateway serves. A key is the
/// project's (the one the gateway made, the ones lent to `roar run --s3`: the store's owner,
/// who may use every bucket) or a *member's* (a `--credentials` key: a principal of its own,
/// `access.rs`).
#[derive(Clone, Default)]
pub(crate) struct Keys(Arc<RwLock<HashMap<String, (SecretKey, bool)>>>);

impl Keys {
    /// A project key.
    pub(crate) fn add(&self, access: &str, secret: &str) {
        self.insert(access, secret, false);
    }

    /// A member's key.
    pub(crate) fn add_member(&self, access: &str, secret: &str) {
        self.insert(access, secret, true);
    }

    fn insert(&self, access: &str, secret: &str, member: bool) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(access.to_owned(), (secret.into(), member));
    }

    /// Whether `access` is a member's key (an unknown key is no one's).
    pub(crate) fn is_member(&self, access: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(access)
            .is_some_and(|(_, member)| *member)
    }

    fn remove(&self, access: &str) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(access);
    }
}

#[async_trait::async_trait]
impl S3Auth for Keys {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self
            .0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(access_key)
        {
            Some((s, _)) => Ok(s.clone()),
            None => Err(s3_error!(
                InvalidAccessKeyId,
                "this gateway does not know the key"
            )),
        }
    }
}

/// Requests in flight per access key, from arrival until their response body is dropped (sent,
/// or abandoned by the client), and the background hashing their accesses wait for.
#[derive(Default)]
pub(crate) struct Inflight {
    count: Mutex<HashMap<String, usize>>,
    idle: Condvar,
}

/// One request in flight; dropping it ends it.
pub(crate) struct InflightGuard {
    inflight: Arc<Inflight>,
    key: String,
}

impl Inflight {
    pub(crate) fn start(self: &Arc<Self>, key: String) -> InflightGuard {
        *self
            .count
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default() += 1;
        InflightGuard {
            inflight: Arc::clone(self),
            key,
        }
    }

    /// Waits until nothing signed with `key` is in flight; false if `deadline` came first.
    fn wait_idle(&self, key: &str, deadline: Instant) -> bool {
        let mut count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        while count.get(key).is_some_and(|n| *n > 0) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            count = self
                .idle
                .wait_timeout(count, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let mut count = self
            .inflight
            .count
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = count.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                count.remove(&self.key);
                self.inflight.idle.notify_all();
            }
        }
    }
}

/// The access key a request claims, read before s3s verifies it (only to count it in flight):
/// from the `Authorization` header's `Credential=KEY/…`, or a presigned URL's `X-Amz-Credential`.
pub(crate) fn claimed_key<B>(req: &http::Request<B>) -> Option<String> {
    if let Some(auth) = req.headers().get(http::header::AUTHORIZATION) {
        let auth = auth.to_str().ok()?;
        let rest = &auth[auth.find("Credential=")? + "Credential=".len()..];
        return Some(rest.split('/').next()?.to_owned());
    }
    let query = req.uri().query()?;
    query.split('&').find_map(|kv| {
        let v = kv.strip_prefix("X-Amz-Credential=")?;
        let end = v.find("%2F").or_else(|| v.find('/')).unwrap_or(v.len());
        Some(v[..end].to_owned())
    })
}

/// A response body that keeps its request counted in flight until it is dropped.
pub(crate) struct Counted<B> {
    pub(crate) body: B,
    pub(crate) _guard: Option<InflightGuard>,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A handle on a running gateway's keys and requests, usable from any thread.
#[derive(Clone)]
pub struct Control {
    pub(crate) keys: Keys,
    pub(crate) inflight: Arc<Inflight>,
}

impl Control {
    /// Accepts signatures made with this pair from now on.
    pub fn add_key(&self, access: &str, secret: &str) {
        self.keys.add(access, secret);
    }

    /// Refuses the key from now on (403 InvalidAccessKeyId); requests already verified go on.
    pub fn remove_key(&self, access: &str) {
        self.keys.remove(access);
    }

    /// Waits until no request signed with `access` is in flight and its background hashing is
    /// done, so every access made with the key has reached the sink. False after `limit`.
    pub fn settle(&self, access: &str, limit: Duration) -> bool {
        self.inflight.wait_idle(access, Instant::now() + limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(auth: Option<&str>, uri: &str) -> http::Request<()> {
        let mut b = http::Request::builder().uri(uri);
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn the_claimed_key_comes_from_the_header_or_a_presigned_query() {
        let signed = "AWS4-HMAC-SHA256 Credential=ROARABC/20261122/us-east-1/s3/aws4_request, \
                      SignedHeaders=host, Signature=00";
        assert_eq!(
            claimed_key(&req(Some(signed), "/b/k")).as_deref(),
            Some("ROARABC")
        );
        let presigned = "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=ROARXYZ%2F20261122%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=00";
        assert_eq!(
            claimed_key(&req(None, presigned)).as_deref(),
            Some("ROARXYZ")
        );
        assert_eq!(claimed_key(&req(None, "/b/k")), None);
    }

    #[test]
    fn settle_waits_for_the_keys_own_requests_only() {
        let control = Control {
            keys: Keys::default(),
            inflight: Arc::default(),
        };
        let other = control.inflight.start("other".into());
        let mine = control.inflight.start("mine".into());
        assert!(!control.settle("mine", Duration::from_millis(20)));
        let ended = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(mine);
        });
        assert!(control.settle("mine", Duration::from_secs(10)));
        ended.join().unwrap();
        drop(other);
        assert!(control.settle("other", Duration::from_millis(1)));
    }
}
