//! The upstream backend: s3s-aws's proxy over an aws-sdk-s3 client, which re-signs every request
//! with aws-sigv4 and the upstream's own credentials (never the client's, never logged).

use std::time::Duration;

use anyhow::Context;
use aws_config::environment::credentials::EnvironmentVariableCredentialsProvider;
use aws_config::meta::credentials::CredentialsProviderChain;
use aws_config::profile::ProfileFileCredentialsProvider;
use aws_credential_types::provider::ProvideCredentials;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    StalledStreamProtectionConfig,
};

pub(crate) async fn proxy(
    url: &str,
    region: &str,
    timeout: Duration,
) -> anyhow::Result<s3s_aws::Proxy> {
    let parsed: http::Uri = url
        .parse()
        .ok()
        .filter(|u: &http::Uri| {
            matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
        })
        .with_context(|| {
            format!("--upstream {url:?} is not an http(s) URL; give one like http://127.0.0.1:9000")
        })?;
    // The usual sources, in the usual order; nothing that would wait on a metadata endpoint.
    let credentials = CredentialsProviderChain::first_try(
        "Environment",
        EnvironmentVariableCredentialsProvider::new(),
    )
    .or_else("Profile", ProfileFileCredentialsProvider::builder().build());
    credentials.provide_credentials().await.map_err(|_| {
        anyhow::anyhow!(
            "no credentials for the upstream {parsed}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
        )
    })?;
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
    Ok(s3s_aws::Proxy::from(aws_sdk_s3::Client::from_conf(config)))
}
