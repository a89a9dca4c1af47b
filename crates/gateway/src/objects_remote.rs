//! The team's kept versions on S3-compatible storage (`objects = "s3://BUCKET/PREFIX"` of a
//! `[remotes.NAME]`): `roar push` sends the blobs the bucket does not hold, a query that needs a
//! version this machine does not keep fetches it. A blob is `PREFIX/XY/<blake3>`, the local
//! layout (`roar_store::objects`); one fetched is checked against its name before it is kept.
//! Credentials come from the environment or the AWS profile, never from the config.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use http::Method;
use roar_store::objects::Objects;

use crate::upstream::Direct;

/// A bucket (and prefix) holding a team's blobs.
pub struct ObjectRemote {
    client: Direct,
    bucket: String,
    prefix: String,
    rt: tokio::runtime::Runtime,
}

/// How long the storage may stay silent (connecting, or between two chunks of a body).
const TIMEOUT: Duration = Duration::from_secs(60);

impl ObjectRemote {
    /// `url` is `s3://BUCKET[/PREFIX]`; `endpoint` an S3-compatible service's URL (none: AWS).
    pub fn connect(url: &str, endpoint: Option<&str>, region: &str) -> anyhow::Result<Self> {
        let rest = url
            .strip_prefix("s3://")
            .with_context(|| format!("objects = {url:?} is not an s3://BUCKET/PREFIX URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        anyhow::ensure!(!bucket.is_empty(), "objects = {url:?} names no bucket");
        let credentials = crate::credentials::load().with_context(|| {
            format!("no credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE")
        })?;
        let endpoint = match endpoint {
            Some(e) => e.to_owned(),
            None => format!("https://s3.{region}.amazonaws.com"),
        };
        let base: http::Uri = endpoint
            .parse()
            .ok()
            .filter(|u: &http::Uri| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
            })
            .with_context(|| format!("objects endpoint {endpoint:?} is not an http(s) URL"))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // The client's connection pool belongs to the runtime it first runs on: made inside it.
        let client =
            rt.block_on(async { Direct::new(&base, region, TIMEOUT, Some(credentials)) })?;
        Ok(ObjectRemote {
            client,
            bucket: bucket.to_owned(),
            prefix: prefix.trim_end_matches('/').to_owned(),
            rt,
        })
    }

    fn key(&self, blake3: &str) -> String {
        let fan = blake3.get(..2).unwrap_or("00");
        match self.prefix.as_str() {
            "" => format!("{fan}/{blake3}"),
            p => format!("{p}/{fan}/{blake3}"),
        }
    }

    /// Whether the bucket holds blob `blake3`.
    pub fn has(&self, blake3: &str) -> anyhow::Result<bool> {
        let key = self.key(blake3);
        self.rt.block_on(async {
            match self
                .client
                .own(Method::HEAD, &self.bucket, &key, None)
                .await
            {
                Ok(_) => Ok(true),
                Err(e) if e.status_code() == Some(http::StatusCode::NOT_FOUND) => Ok(false),
                Err(e) => Err(failed("reach", &self.bucket, &key, e)),
            }
        })
    }

    /// Sends the local blob `blake3` (`path`).
    pub fn put(&self, blake3: &str, path: &Path) -> anyhow::Result<()> {
        let key = self.key(blake3);
        self.rt.block_on(async {
            let file = tokio::fs::File::open(path).await?;
            let len = file.metadata().await?.len();
            self.client
                .own(Method::PUT, &self.bucket, &key, Some((file, len)))
                .await
                .map_err(|e| failed("send", &self.bucket, &key, e))?;
            Ok(())
        })
    }

    /// Fetches blob `blake3` into `objects`, checked against its name. False: the bucket does
    /// not hold it.
    pub fn fetch(&self, objects: &Objects, blake3: &str) -> anyhow::Result<bool> {
        use futures::StreamExt;
        let key = self.key(blake3);
        self.rt.block_on(async {
            let response = match self.client.own(Method::GET, &self.bucket, &key, None).await {
                Ok(r) => r,
                Err(e) if e.status_code() == Some(http::StatusCode::NOT_FOUND) => return Ok(false),
                Err(e) => return Err(failed("fetch", &self.bucket, &key, e)),
            };
            let mut body = self.client.body(response.into_body());
            let mut taking = objects.begin()?;
            let mut hasher = blake3::Hasher::new();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| {
                    anyhow::anyhow!("fetching s3://{}/{key} failed half-way: {e}", self.bucket)
                })?;
                hasher.update(&chunk);
                taking.write(&chunk);
            }
            let got = hasher.finalize().to_hex();
            anyhow::ensure!(
                got.as_str() == blake3,
                "s3://{}/{key} holds other bytes (blake3 {got}); not kept",
                self.bucket
            );
            taking.commit(objects, blake3)?;
            Ok(true)
        })
    }
}

fn failed(what: &str, bucket: &str, key: &str, e: s3s::S3Error) -> anyhow::Error {
    let said = e.message().unwrap_or_else(|| e.code().as_str());
    anyhow::anyhow!("cannot {what} s3://{bucket}/{key}: {said}")
}
