//! The team's kept versions on S3-compatible storage (`objects = "s3://BUCKET/PREFIX"` of a
//! `[remotes.NAME]`): `roar push` sends the blobs the bucket does not hold, a query that needs a
//! version this machine does not keep fetches it. A blob is `PREFIX/XY/<blake3>`, the local
//! layout (`roar_store::objects`); one fetched is checked against its name before it is kept.
//! Credentials come from the environment or the AWS profile, never from the config.

use std::path::Path;

use anyhow::Context;
use aws_config::environment::credentials::EnvironmentVariableCredentialsProvider;
use aws_config::meta::credentials::CredentialsProviderChain;
use aws_config::profile::ProfileFileCredentialsProvider;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_sdk_s3::config::{BehaviorVersion, Region};
use roar_store::objects::Objects;

/// A bucket (and prefix) holding a team's blobs.
pub struct ObjectRemote {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
    rt: tokio::runtime::Runtime,
}

impl ObjectRemote {
    /// `url` is `s3://BUCKET[/PREFIX]`; `endpoint` an S3-compatible service's URL (none: AWS).
    pub fn connect(url: &str, endpoint: Option<&str>, region: &str) -> anyhow::Result<Self> {
        let rest = url
            .strip_prefix("s3://")
            .with_context(|| format!("objects = {url:?} is not an s3://BUCKET/PREFIX URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        anyhow::ensure!(!bucket.is_empty(), "objects = {url:?} names no bucket");
        let credentials = SharedCredentialsProvider::new(
            CredentialsProviderChain::first_try(
                "Environment",
                EnvironmentVariableCredentialsProvider::new(),
            )
            .or_else("Profile", ProfileFileCredentialsProvider::builder().build()),
        );
        let mut config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region.to_owned()))
            .force_path_style(true)
            .credentials_provider(credentials);
        if let Some(e) = endpoint {
            config = config.endpoint_url(e);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(ObjectRemote {
            client: aws_sdk_s3::Client::from_conf(config.build()),
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
                .head_object()
                .bucket(&self.bucket)
                .key(&key)
                .send()
                .await
            {
                Ok(_) => Ok(true),
                Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => Ok(false),
                Err(e) => Err(anyhow::anyhow!(
                    "cannot reach s3://{}/{key}: {}",
                    self.bucket,
                    aws_sdk_s3::error::DisplayErrorContext(e)
                )),
            }
        })
    }

    /// Sends the local blob `blake3` (`path`).
    pub fn put(&self, blake3: &str, path: &Path) -> anyhow::Result<()> {
        let key = self.key(blake3);
        self.rt.block_on(async {
            let body = aws_sdk_s3::primitives::ByteStream::from_path(path).await?;
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(&key)
                .body(body)
                .send()
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "cannot send s3://{}/{key}: {}",
                        self.bucket,
                        aws_sdk_s3::error::DisplayErrorContext(e)
                    )
                })?;
            Ok(())
        })
    }

    /// Fetches blob `blake3` into `objects`, checked against its name. False: the bucket does
    /// not hold it.
    pub fn fetch(&self, objects: &Objects, blake3: &str) -> anyhow::Result<bool> {
        let key = self.key(blake3);
        self.rt.block_on(async {
            let got = self
                .client
                .get_object()
                .bucket(&self.bucket)
                .key(&key)
                .send()
                .await;
            let mut body = match got {
                Ok(o) => o.body,
                Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => {
                    return Ok(false)
                }
                Err(e) => {
                    return Err(anyhow::anyhow!(
                        "cannot fetch s3://{}/{key}: {}",
                        self.bucket,
                        aws_sdk_s3::error::DisplayErrorContext(e)
                    ))
                }
            };
            let mut taking = objects.begin()?;
            let mut hasher = blake3::Hasher::new();
            while let Some(chunk) = body.try_next().await? {
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
