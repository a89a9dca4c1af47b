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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            hash: "blake3".into(),
            tracer: "auto".into(),
            ignore: Vec::new(),
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
        Ok(config)
    }

    pub fn sha256(&self) -> bool {
        self.hash == "sha256"
    }
}
