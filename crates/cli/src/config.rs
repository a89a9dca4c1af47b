//! `.roar/config.toml`: the project's settings, with defaults for every key.

use anyhow::Context;
use roar_store::Project;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// "blake3" or "sha256" (sha256 is recorded in addition to blake3).
    pub hash: String,
    /// Default tracer for `roar run`.
    pub tracer: String,
    /// Extra ignore globs.
    pub ignore: Vec<String>,
    /// The S3 gateway of `roar run` and `roar gateway`.
    pub s3: S3Config,
    /// What else is redacted from command lines and environments (the writer applies it).
    pub redact: roar_store::redact::RedactConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    /// Start a gateway for every `roar run` (as `--s3` does).
    pub enabled: bool,
    /// Forward to this S3 service instead of the embedded store under `.roar/s3/`.
    pub upstream: Option<String>,
    /// The region clients sign for, and the upstream's.
    pub region: String,
}

impl Default for S3Config {
    fn default() -> Self {
        S3Config {
            enabled: false,
            upstream: None,
            region: "us-east-1".into(),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            hash: "blake3".into(),
            tracer: "auto".into(),
            ignore: Vec::new(),
            s3: S3Config::default(),
            redact: Default::default(),
        }
    }
}

impl Config {
    pub fn load(project: &Project) -> anyhow::Result<Config> {
        let path = project.config_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let config: Config = toml::from_str(&text).with_context(|| {
            format!(
                "{} is not valid; fix it or delete it to use the defaults",
                path.display()
            )
        })?;
        if !matches!(config.hash.as_str(), "blake3" | "sha256") {
            anyhow::bail!(
                "{}: hash = {:?} is not supported; use \"blake3\" or \"sha256\"",
                path.display(),
                config.hash
            );
        }
        roar_store::redact::Policy::new(&config.redact)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Ok(config)
    }

    pub fn sha256(&self) -> bool {
        self.hash == "sha256"
    }
}
