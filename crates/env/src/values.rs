//! Parameters and metrics that live in files: the values of a parameter file a job read
//! (`params.yaml`, `config.json`, Hydra's `conf/*.yaml`, `.env`) and of a metrics file it wrote
//! (`metrics.json`, `scores.yaml`, the last row of `metrics.csv`), flattened to dotted keys
//! (`model.max_depth`, `layers.0`). Which files are which is decided by name, like DVC's
//! `params.yaml` and `metrics.json`; the content is the version the job read or wrote, so these
//! are read from the kept versions (`crates/store/src/objects.rs`), never from the working tree
//! as it is now.

use std::path::Path;

/// The formats read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
    Toml,
    /// `key = value` lines: INI sections as key prefixes, `.env` files.
    Ini,
    /// A header and rows: the last row is the summary.
    Csv,
}

/// Files bigger than this are not parameters or metrics (a dataset named `config.json`).
pub const MAX_BYTES: u64 = 1 << 20;

fn format_of(name: &str) -> Option<Format> {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("json") => Some(Format::Json),
        Some("yaml" | "yml") => Some(Format::Yaml),
        Some("toml") => Some(Format::Toml),
        Some("ini" | "cfg" | "env") => Some(Format::Ini),
        Some("csv") => Some(Format::Csv),
        _ if name == ".env" => Some(Format::Ini),
        _ => None,
    }
}

fn stem(name: &str) -> String {
    name.rsplit_once('.')
        .map_or(name, |(s, _)| s)
        .to_ascii_lowercase()
}

/// Whether a file a job read at `path` holds parameters, and in which format: `params.*`,
/// `*params*`, `hparams*`, `config*`, `*.env`, and any YAML under a `conf/` or `configs/`
/// directory (Hydra's layout). CSV is never a parameter file.
pub fn param_file(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_str()?;
    let format = format_of(name).filter(|f| *f != Format::Csv)?;
    let s = stem(name);
    let hydra = format == Format::Yaml
        && path
            .components()
            .any(|c| matches!(c.as_os_str().to_str(), Some("conf" | "configs" | "config")));
    let named = s.contains("params") || s.starts_with("config") || name == ".env";
    (named || hydra || format == Format::Ini && name.ends_with(".env")).then_some(format)
}

/// Whether a file a job wrote at `path` holds metrics: `metrics*`, `*metrics*`, `scores*`,
/// `eval*` and `results*` in JSON, YAML or CSV.
pub fn metrics_file(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_str()?;
    let format = format_of(name)?;
    if !matches!(format, Format::Json | Format::Yaml | Format::Csv) {
        return None;
    }
    let s = stem(name);
    let named = s.contains("metrics")
        || s.starts_with("scores")
        || s.starts_with("eval")
        || s.starts_with("results");
    named.then_some(format)
}

/// The values of `bytes` in `format`, as (dotted key, value) in the file's order; scalars only
/// (a list is indexed: `layers.0`). Nothing if it does not parse.
pub fn read(bytes: &[u8], format: Format) -> Vec<(String, String)> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    match format {
        Format::Json => {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
                flatten_json("", &v, &mut out);
            }
        }
        Format::Yaml => {
            if let Ok(docs) = yaml_rust2::YamlLoader::load_from_str(text) {
                for doc in &docs {
                    flatten_yaml("", doc, &mut out);
                }
            }
        }
        Format::Toml => {
            if let Ok(v) = text.parse::<toml::Table>() {
                flatten_toml("", &toml::Value::Table(v), &mut out);
            }
        }
        Format::Ini => read_ini(text, &mut out),
        Format::Csv => read_csv(text, &mut out),
    }
    out
}

fn key(prefix: &str, k: &str) -> String {
    if prefix.is_empty() {
        k.to_owned()
    } else {
        format!("{prefix}.{k}")
    }
}

fn flatten_json(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    use serde_json::Value;
    match v {
        Value::Object(m) => m
            .iter()
            .for_each(|(k, v)| flatten_json(&key(prefix, k), v, out)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| flatten_json(&key(prefix, &i.to_string()), v, out)),
        Value::String(s) if !prefix.is_empty() => out.push((prefix.to_owned(), s.clone())),
        Value::Null => {}
        v if !prefix.is_empty() => out.push((prefix.to_owned(), v.to_string())),
        _ => {}
    }
}

fn flatten_yaml(prefix: &str, v: &yaml_rust2::Yaml, out: &mut Vec<(String, String)>) {
    use yaml_rust2::Yaml;
    let scalar = |s: String| (!prefix.is_empty()).then(|| (prefix.to_owned(), s));
    let pair = match v {
        Yaml::Hash(h) => {
            for (k, v) in h {
                let k = match k {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    Yaml::Real(r) => r.clone(),
                    _ => continue,
                };
                flatten_yaml(&key(prefix, &k), v, out);
            }
            None
        }
        Yaml::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                flatten_yaml(&key(prefix, &i.to_string()), v, out);
            }
            None
        }
        Yaml::String(s) | Yaml::Real(s) => scalar(s.clone()),
        Yaml::Integer(i) => scalar(i.to_string()),
        Yaml::Boolean(b) => scalar(b.to_string()),
        _ => None,
    };
    out.extend(pair);
}

fn flatten_toml(prefix: &str, v: &toml::Value, out: &mut Vec<(String, String)>) {
    use toml::Value;
    match v {
        Value::Table(t) => t
            .iter()
            .for_each(|(k, v)| flatten_toml(&key(prefix, k), v, out)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| flatten_toml(&key(prefix, &i.to_string()), v, out)),
        _ if prefix.is_empty() => {}
        Value::String(s) => out.push((prefix.to_owned(), s.clone())),
        Value::Integer(i) => out.push((prefix.to_owned(), i.to_string())),
        Value::Float(f) => out.push((prefix.to_owned(), f.to_string())),
        Value::Boolean(b) => out.push((prefix.to_owned(), b.to_string())),
        Value::Datetime(d) => out.push((prefix.to_owned(), d.to_string())),
    }
}

/// `[section]` headers prefix the keys under them; `export KEY=value` and quotes as in `.env`.
fn read_ini(text: &str, out: &mut Vec<(String, String)>) {
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_owned();
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((k, v)) = line.split_once('=').or_else(|| line.split_once(':')) else {
            continue;
        };
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            .unwrap_or(v);
        out.push((key(&section, k.trim()), v.to_owned()));
    }
}

/// A CSV's header with its last row (the summary a training loop appends last).
fn read_csv(text: &str, out: &mut Vec<(String, String)>) {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let Some(header) = lines.next() else { return };
    let Some(last) = lines.next_back() else {
        return;
    };
    for (k, v) in header.split(',').zip(last.split(',')) {
        out.push((k.trim().to_owned(), v.trim().to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_told_by_name() {
        for p in [
            "params.yaml",
            "a/train_params.json",
            "hparams.toml",
            "config.yml",
            "conf/model/rf.yaml",
            ".env",
            "x/prod.env",
        ] {
            assert!(param_file(Path::new(p)).is_some(), "{p}");
        }
        for p in ["data.json", "model.pkl", "params.csv", "src/main.py"] {
            assert!(param_file(Path::new(p)).is_none(), "{p}");
        }
        for p in [
            "metrics.json",
            "eval/scores.yaml",
            "train_metrics.csv",
            "results.json",
        ] {
            assert!(metrics_file(Path::new(p)).is_some(), "{p}");
        }
        assert!(metrics_file(Path::new("params.json")).is_none());
    }

    #[test]
    fn nested_keys_are_flattened_in_every_format() {
        let yaml = b"model:\n  max_depth: 8\n  layers: [64, 32]\nlr: 0.1\nname: rf\n";
        assert_eq!(
            read(yaml, Format::Yaml),
            [
                ("model.max_depth".into(), "8".into()),
                ("model.layers.0".into(), "64".into()),
                ("model.layers.1".into(), "32".into()),
                ("lr".into(), "0.1".into()),
                ("name".into(), "rf".into()),
            ]
        );
        let json = br#"{"acc": 0.91, "per_class": {"a": 0.9}}"#;
        assert_eq!(
            read(json, Format::Json),
            [
                ("acc".into(), "0.91".into()),
                ("per_class.a".into(), "0.9".into())
            ]
        );
        let toml = b"seed = 7\n[model]\ndepth = 3\n";
        assert_eq!(
            read(toml, Format::Toml),
            [
                ("model.depth".into(), "3".into()),
                ("seed".into(), "7".into())
            ]
        );
        let ini = b"export LR=0.1\n[train]\nepochs = \"5\"\n";
        assert_eq!(
            read(ini, Format::Ini),
            [
                ("LR".into(), "0.1".into()),
                ("train.epochs".into(), "5".into())
            ]
        );
        let csv = b"epoch,loss\n1,0.9\n2,0.5\n";
        assert_eq!(
            read(csv, Format::Csv),
            [("epoch".into(), "2".into()), ("loss".into(), "0.5".into())]
        );
        assert!(read(b"{not json", Format::Json).is_empty());
    }
}
