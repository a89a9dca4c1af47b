//! `roar config list|get|set` over `.roar/config.toml` (comments and layout kept, every change
//! validated as `roar run` would load it), and `roar completions` / `roar man`.

use std::io::Write;

use anyhow::Context;
use clap::Subcommand;
use roar_store::Project;

use crate::config::Config;

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Every setting with its value (the file's, else the default).
    List,
    /// One setting's value, e.g. `roar config get s3.region`.
    Get { key: String },
    /// Change one setting in .roar/config.toml, keeping the file's comments; the value is TOML
    /// (`true`, `["*.log", "tmp/**"]`) or else taken as a string.
    Set { key: String, value: String },
}

/// The settings, as dotted keys, in the order `list` prints them.
const KEYS: &[&str] = &[
    "hash",
    "tracer",
    "ignore",
    "s3.enabled",
    "s3.upstream",
    "s3.region",
    "env.diff",
    "env.packages",
    "redact.names",
    "redact.allow",
    "redact.patterns",
];

fn value_of(config: &Config, key: &str) -> Option<toml_edit::Value> {
    let arr = |v: &[String]| toml_edit::Value::Array(v.iter().collect());
    Some(match key {
        "hash" => config.hash.as_str().into(),
        "tracer" => config.tracer.as_str().into(),
        "ignore" => arr(&config.ignore),
        "s3.enabled" => config.s3.enabled.into(),
        "s3.upstream" => config.s3.upstream.as_deref().unwrap_or("").into(),
        "s3.region" => config.s3.region.as_str().into(),
        "env.diff" => config.env.diff.into(),
        "env.packages" => config.env.packages.into(),
        "redact.names" => arr(&config.redact.names),
        "redact.allow" => arr(&config.redact.allow),
        "redact.patterns" => arr(&config.redact.patterns),
        _ => return None,
    })
}

fn unknown(key: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "unknown setting {key:?}; the settings are {}",
        KEYS.join(", ")
    )
}

/// A value as `get` prints it: strings bare, everything else as TOML.
fn shown(v: &toml_edit::Value) -> String {
    match v.as_str() {
        Some(s) => s.to_owned(),
        None => v.to_string().trim().to_owned(),
    }
}

pub fn config(command: ConfigCommand, json: bool) -> anyhow::Result<()> {
    let project = crate::project()?;
    match command {
        ConfigCommand::List => {
            // `ignore` is shown as written, not as resolved against the project root.
            let config = Config::load(&project)?;
            let written = written_ignore(&project)?;
            let mut out = std::io::stdout().lock();
            let mut map = serde_json::Map::new();
            for key in KEYS {
                let mut v = value_of(&config, key).expect("a known key");
                if *key == "ignore" {
                    v = toml_edit::Value::Array(written.iter().collect());
                }
                if json {
                    let j = match v.as_str() {
                        Some(s) => serde_json::Value::from(s),
                        None => match v.as_bool() {
                            Some(b) => serde_json::Value::from(b),
                            None => serde_json::Value::from(
                                v.as_array()
                                    .map(|a| {
                                        a.iter()
                                            .filter_map(|x| x.as_str())
                                            .map(str::to_owned)
                                            .collect::<Vec<_>>()
                                    })
                                    .unwrap_or_default(),
                            ),
                        },
                    };
                    map.insert((*key).to_owned(), j);
                } else {
                    writeln!(out, "{key} = {}", v.to_string().trim())?;
                }
            }
            if json {
                crate::fmt::print_json(&map)?;
            }
        }
        ConfigCommand::Get { key } => {
            let config = Config::load(&project)?;
            let v = if key == "ignore" {
                toml_edit::Value::Array(written_ignore(&project)?.iter().collect())
            } else {
                value_of(&config, &key).ok_or_else(|| unknown(&key))?
            };
            println!("{}", shown(&v));
        }
        ConfigCommand::Set { key, value } => set(&project, &key, &value)?,
    }
    Ok(())
}

/// The `ignore` list as the file has it (Config holds it resolved to absolute globs).
fn written_ignore(project: &Project) -> anyhow::Result<Vec<String>> {
    let doc = document(project)?;
    Ok(doc
        .get("ignore")
        .and_then(|i| i.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default())
}

pub(crate) fn document(project: &Project) -> anyhow::Result<toml_edit::DocumentMut> {
    let path = project.config_path();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => roar_store::DEFAULT_CONFIG.to_owned(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    // Loading first gives the one-line error for a broken file.
    Config::load(project)?;
    text.parse()
        .map_err(|e: toml_edit::TomlError| anyhow::anyhow!("{}: {}", path.display(), e.message()))
}

fn set(project: &Project, key: &str, value: &str) -> anyhow::Result<()> {
    if !KEYS.contains(&key) {
        return Err(unknown(key));
    }
    let mut doc = document(project)?;
    // TOML if it parses as a value, else the text as a string (`roar config set tracer ptrace`).
    let parsed: toml_edit::Value = value
        .parse()
        .unwrap_or_else(|_| toml_edit::Value::from(value));
    let item = toml_edit::value(parsed);
    match key.split_once('.') {
        Some((table, name)) => {
            if !doc.contains_table(table) {
                doc.insert(table, toml_edit::Item::Table(toml_edit::Table::new()));
            }
            doc[table][name] = item;
        }
        None => doc[key] = item,
    }
    write_document(project, &doc).map_err(|e| anyhow::anyhow!("{key} = {value}: {e}"))
}

/// Replaces the config file with `doc`, if it loads exactly as `roar run` would load it.
pub(crate) fn write_document(
    project: &Project,
    doc: &toml_edit::DocumentMut,
) -> anyhow::Result<()> {
    let text = doc.to_string();
    Config::parse(&text, project).map_err(|e| anyhow::anyhow!("line {e}"))?;
    let path = project.config_path();
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, &text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
}
