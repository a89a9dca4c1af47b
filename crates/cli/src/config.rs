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
    /// What `roar run` records of the environment.
    pub env: EnvConfig,
    /// What else is redacted from command lines and environments (the writer applies it).
    pub redact: roar_store::redact::RedactConfig,
    /// Where a job is cut into steps.
    pub steps: StepsConfig,
    /// Team stores (`roar remote add`), by name.
    pub remotes: std::collections::BTreeMap<String, RemoteConfig>,
    /// Which file versions are kept in the object store (`roar checkout`, `roar reproduce`).
    pub keep: KeepConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeepConfig {
    /// Keep the version of every job output.
    pub outputs: bool,
    /// Which inputs' versions: "untracked" (inside the project and not tracked by git: what git
    /// cannot give back), "all" (inside the project), "none".
    pub inputs: String,
    /// Paths whose versions are never kept (globs, as `ignore`).
    pub ignore: Vec<String>,
    /// Versions bigger than this are not kept (bytes; 0: no limit).
    pub max_file_bytes: u64,
    /// The object store's size: past it, `roar gc` (started after each `roar run` when a budget
    /// is set) lets the least recently used versions go, but for pinned ones (`roar pin`) and S3
    /// object bodies (bytes; 0: no budget).
    pub budget_bytes: u64,
}

impl Default for KeepConfig {
    fn default() -> Self {
        KeepConfig {
            outputs: true,
            inputs: "untracked".into(),
            ignore: Vec::new(),
            max_file_bytes: 0,
            budget_bytes: 0,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// `postgres://USER@HOST:PORT/DATABASE`, never with a password.
    pub url: String,
    /// Push in the background after every `roar run` (default true).
    #[serde(default = "yes")]
    pub auto_push: bool,
    /// Where the team's kept versions live: `s3://BUCKET[/PREFIX]` (`roar push` sends the ones
    /// the bucket lacks; a version this machine does not keep is fetched from there).
    #[serde(default)]
    pub objects: Option<String>,
    /// The S3-compatible service holding `objects` (its URL; none: AWS).
    #[serde(default)]
    pub objects_endpoint: Option<String>,
    /// The region `objects` is signed for (default us-east-1).
    #[serde(default)]
    pub objects_region: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StepsConfig {
    /// Programs whose children begin steps (`name`, or `prefix*`); `[]`: every job is one step.
    pub drivers: Vec<String>,
}

impl Default for StepsConfig {
    fn default() -> Self {
        StepsConfig {
            drivers: roar_tracer::steps::DEFAULT_DRIVERS
                .iter()
                .map(|d| d.to_string())
                .collect(),
        }
    }
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
    /// Buckets of the embedded store every `--credentials` key may use, whoever made them
    /// (otherwise a bucket a key made is that key's alone).
    pub shared: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvConfig {
    /// Keep a dirty tree's `git diff HEAD` (false: record only that it is dirty).
    pub diff: bool,
    /// Record the packages a job used.
    pub packages: bool,
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            diff: true,
            packages: true,
        }
    }
}

impl Default for S3Config {
    fn default() -> Self {
        S3Config {
            enabled: false,
            upstream: None,
            region: "us-east-1".into(),
            shared: Vec::new(),
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
            env: EnvConfig::default(),
            redact: Default::default(),
            steps: StepsConfig::default(),
            remotes: Default::default(),
            keep: KeepConfig::default(),
        }
    }
}

impl Config {
    /// The redaction rules of `[redact]` (checked when the config was loaded; the built-in rules
    /// alone if they were not).
    pub fn policy(&self) -> roar_store::redact::Policy {
        roar_store::redact::Policy::new(&self.redact).unwrap_or_default()
    }

    pub fn load(project: &Project) -> anyhow::Result<Config> {
        let path = project.config_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        Config::parse(&text, project).map_err(|e| anyhow::anyhow!("{}:{e}", path.display()))
    }

    /// Parses and checks a config file's text; an error is one line, `LINE: what is wrong` (the
    /// caller puts the file's path before it).
    pub fn parse(text: &str, project: &Project) -> anyhow::Result<Config> {
        let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
        let mut config: Config = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(s.start)).unwrap_or(1);
            let src = text.lines().nth(line - 1).unwrap_or_default().trim();
            anyhow::anyhow!(
                "{line}: {} (in `{src}`); fix it, or delete the file to use the defaults",
                e.message().trim_end_matches('\n').replace('\n', "; ")
            )
        })?;
        // Errors found after parsing point at the key's line.
        let at = |key: &str| {
            text.lines()
                .position(|l| l.trim_start().starts_with(key))
                .map_or(1, |i| i + 1)
        };
        if !matches!(config.hash.as_str(), "blake3" | "sha256") {
            anyhow::bail!(
                "{}: hash = {:?} is not supported; use \"blake3\" or \"sha256\"",
                at("hash"),
                config.hash
            );
        }
        if !matches!(
            config.tracer.as_str(),
            "auto" | "preload" | "ptrace" | "ebpf"
        ) {
            anyhow::bail!(
                "{}: tracer = {:?} is not a tracer; use \"auto\", \"preload\", \"ptrace\" or \"ebpf\"",
                at("tracer"),
                config.tracer
            );
        }
        let mut resolved = Vec::with_capacity(config.ignore.len());
        for g in &config.ignore {
            resolved.push(
                resolve_glob(g, &project.root)
                    .map_err(|why| anyhow::anyhow!("{}: ignore glob {g:?} {why}", at("ignore")))?,
            );
        }
        config.ignore = resolved;
        if !matches!(config.keep.inputs.as_str(), "untracked" | "all" | "none") {
            anyhow::bail!(
                "{}: keep.inputs = {:?} is not a choice; use \"untracked\", \"all\" or \"none\"",
                at("inputs"),
                config.keep.inputs
            );
        }
        let mut resolved = Vec::with_capacity(config.keep.ignore.len());
        for g in &config.keep.ignore {
            resolved.push(resolve_glob(g, &project.root).map_err(|why| {
                anyhow::anyhow!("{}: [keep] ignore glob {g:?} {why}", at("ignore"))
            })?);
        }
        config.keep.ignore = resolved;
        if let Some(bad) = config
            .steps
            .drivers
            .iter()
            .find(|d| d.is_empty() || d.contains('/') || d.trim_end_matches('*').contains('*'))
        {
            anyhow::bail!(
                "{}: steps driver {bad:?} is not a program name; use a name like \"make\" or a prefix like \"python*\"",
                at("drivers")
            );
        }
        for (name, remote) in &config.remotes {
            roar_team::Remote::check_url(&remote.url).map_err(|why| {
                anyhow::anyhow!(
                    "{}: remote {name:?}: {why}",
                    at(&format!("[remotes.{name}]"))
                )
            })?;
        }
        roar_store::redact::Policy::new(&config.redact)
            .map_err(|e| anyhow::anyhow!("{}: {e}", at("[redact]")))?;
        Ok(config)
    }

    pub fn sha256(&self) -> bool {
        self.hash == "sha256"
    }

    /// The configured remote called `name`.
    pub fn remote(&self, name: &str) -> Option<roar_team::Remote> {
        self.remotes.get(name).map(|r| roar_team::Remote {
            name: name.to_owned(),
            url: r.url.clone(),
        })
    }
}

/// An `ignore` glob as recorded paths are matched: like .gitignore, a glob without `/` matches
/// a name anywhere (`*.log` is `**/*.log`), one starting with `/` is absolute, any other is
/// relative to the project root (`data/tmp/**`). Refuses globs that can never mean what was meant.
pub fn resolve_glob(glob: &str, root: &std::path::Path) -> Result<String, &'static str> {
    if glob.is_empty() {
        return Err("is empty");
    }
    if glob.contains('\0') {
        return Err("contains a NUL byte");
    }
    if glob
        .split('/')
        .any(|part| part.contains("**") && part != "**")
    {
        return Err("uses `**` inside a name: `**` must be a whole path component (`a/**/b`)");
    }
    if glob.starts_with('/') {
        return Ok(glob.to_owned());
    }
    let glob = glob.strip_prefix("./").unwrap_or(glob);
    if glob.starts_with("../") || glob.split('/').any(|p| p == "..") {
        return Err("goes above the project with `..`; use an absolute path");
    }
    if !glob.contains('/') {
        return Ok(format!("**/{glob}"));
    }
    if glob.starts_with("**/") {
        return Ok(glob.to_owned());
    }
    Ok(format!("{}/{glob}", root.display()))
}
