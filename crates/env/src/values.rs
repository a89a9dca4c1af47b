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

/// `bytes` (a parameter file in `format`) with the value at dotted `key` replaced by `value`:
/// typed as the old value was (a string stays a string; otherwise read as the format reads a
/// literal: `5` a number, `true` a boolean). Structured formats are parsed and written again
/// (comments and layout are not kept: this writes a scratch copy); `key = value` files are
/// edited in place. The result is read back: every other value must be as it was.
pub fn set(bytes: &[u8], format: Format, key: &str, value: &str) -> Result<Vec<u8>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "the file is not UTF-8".to_owned())?;
    let before = read(bytes, format);
    if !before.iter().any(|(k, _)| k == key) {
        return Err(format!("it has no value {key}"));
    }
    let path: Vec<&str> = key.split('.').collect();
    let out = match format {
        Format::Json => {
            let mut v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
            let slot = json_slot(&mut v, &path).ok_or("the key names no scalar")?;
            *slot = match slot {
                serde_json::Value::String(_) => serde_json::Value::String(value.into()),
                _ => serde_json::from_str(value)
                    .unwrap_or_else(|_| serde_json::Value::String(value.into())),
            };
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())? + "\n"
        }
        Format::Yaml => {
            let mut docs =
                yaml_rust2::YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
            let doc = docs.first_mut().ok_or("the file is empty")?;
            let slot = yaml_slot(doc, &path).ok_or("the key names no scalar")?;
            *slot = match slot {
                yaml_rust2::Yaml::String(_) => yaml_rust2::Yaml::String(value.into()),
                _ => yaml_rust2::Yaml::from_str(value),
            };
            let mut out = String::new();
            yaml_rust2::YamlEmitter::new(&mut out)
                .dump(doc)
                .map_err(|e| e.to_string())?;
            out.strip_prefix("---\n").unwrap_or(&out).to_owned() + "\n"
        }
        Format::Toml => {
            // toml_edit keeps the file's layout and comments.
            let mut doc: toml_edit::DocumentMut = text
                .parse()
                .map_err(|e: toml_edit::TomlError| e.to_string())?;
            let mut item = doc.as_item_mut();
            for p in &path {
                item = item
                    .as_table_like_mut()
                    .and_then(|t| t.get_mut(p))
                    .ok_or("the key names no scalar")?;
            }
            let old = item.as_value().ok_or("the key names no scalar")?;
            let mut new = match old.is_str() {
                true => toml_edit::Value::from(value),
                false => value
                    .parse::<toml_edit::Value>()
                    .unwrap_or_else(|_| toml_edit::Value::from(value)),
            };
            *new.decor_mut() = old.decor().clone();
            *item = toml_edit::Item::Value(new);
            doc.to_string()
        }
        Format::Ini => set_ini(text, key, value).ok_or("the key names no line")?,
        Format::Csv => return Err("a CSV file holds no parameters".into()),
    };
    let after = read(out.as_bytes(), format);
    let expected: Vec<(String, String)> = before
        .into_iter()
        .map(|(k, v)| {
            if k == key {
                (k, value.to_owned())
            } else {
                (k, v)
            }
        })
        .collect();
    if after != expected {
        return Err(format!("written again it would not read back as {key} = {value} with every other value as it was"));
    }
    Ok(out.into_bytes())
}

fn json_slot<'a>(v: &'a mut serde_json::Value, path: &[&str]) -> Option<&'a mut serde_json::Value> {
    let Some((first, rest)) = path.split_first() else {
        return (!v.is_object() && !v.is_array()).then_some(v);
    };
    let next = match v {
        serde_json::Value::Object(m) => m.get_mut(*first)?,
        serde_json::Value::Array(a) => a.get_mut(first.parse::<usize>().ok()?)?,
        _ => return None,
    };
    json_slot(next, rest)
}

fn yaml_slot<'a>(v: &'a mut yaml_rust2::Yaml, path: &[&str]) -> Option<&'a mut yaml_rust2::Yaml> {
    use yaml_rust2::Yaml;
    let Some((first, rest)) = path.split_first() else {
        return (!matches!(v, Yaml::Hash(_) | Yaml::Array(_))).then_some(v);
    };
    let next = match v {
        Yaml::Hash(h) => h
            .iter_mut()
            .find(|(k, _)| match k {
                Yaml::String(s) | Yaml::Real(s) => s == first,
                Yaml::Integer(i) => i.to_string() == *first,
                Yaml::Boolean(b) => b.to_string() == *first,
                _ => false,
            })
            .map(|(_, v)| v)?,
        Yaml::Array(a) => a.get_mut(first.parse::<usize>().ok()?)?,
        _ => return None,
    };
    yaml_slot(next, rest)
}

/// The `key = value` line of `key` (under its `[section]`) with the new value, quoted as the old
/// one was.
fn set_ini(text: &str, key: &str, value: &str) -> Option<String> {
    let mut section = String::new();
    let mut out = String::with_capacity(text.len() + value.len());
    let mut done = false;
    for line in text.split_inclusive('\n') {
        let t = line.trim();
        if let Some(name) = t.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_owned();
        }
        let body = t.strip_prefix("export ").unwrap_or(t);
        let split = body.split_once('=').or_else(|| body.split_once(':'));
        if let (false, Some((k, v))) = (done || t.starts_with('#') || t.starts_with(';'), split) {
            if self::key(&section, k.trim()) == key {
                let v = v.trim();
                let quote = ['"', '\'']
                    .into_iter()
                    .find(|q| v.len() >= 2 && v.starts_with(*q) && v.ends_with(*q));
                let at = line.find(body).unwrap_or(0) + (body.len() - body.trim_start().len());
                let eq = line[at..].find(['=', ':']).map(|i| at + i + 1)?;
                let lead = &line[..eq];
                let space = if line[eq..].starts_with(' ') { " " } else { "" };
                let end = if line.ends_with('\n') { "\n" } else { "" };
                out.push_str(&match quote {
                    Some(q) => format!("{lead}{space}{q}{value}{q}{end}"),
                    None => format!("{lead}{space}{value}{end}"),
                });
                done = true;
                continue;
            }
        }
        out.push_str(line);
    }
    done.then_some(out)
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
    fn a_value_is_set_in_every_format_and_reads_back() {
        let cases: [(&[u8], Format); 4] = [
            (
                b"model:\n  max_depth: 8\n  name: rf\nlr: 0.1\n",
                Format::Yaml,
            ),
            (
                br#"{"model": {"max_depth": 8, "name": "rf"}, "lr": 0.1}"#,
                Format::Json,
            ),
            (
                b"lr = 0.1\n[model]\nmax_depth = 8\nname = \"rf\"\n",
                Format::Toml,
            ),
            (
                b"# comment\nlr=0.1\n[model]\nmax_depth = 8\nname = 'rf'\n",
                Format::Ini,
            ),
        ];
        for (bytes, format) in cases {
            let out = set(bytes, format, "model.max_depth", "5").unwrap();
            let values = read(&out, format);
            assert!(
                values.contains(&("model.max_depth".into(), "5".into())),
                "{format:?}: {values:?}"
            );
            assert!(
                values.contains(&("lr".into(), "0.1".into())),
                "{format:?}: {values:?}"
            );
            let out = set(bytes, format, "model.name", "gbm").unwrap();
            assert!(
                read(&out, format).contains(&("model.name".into(), "gbm".into())),
                "{format:?}"
            );
            assert!(
                set(bytes, format, "model.depth", "5").is_err(),
                "{format:?}"
            );
        }
        // A line edit keeps everything else byte for byte.
        let ini = b"# comment\nexport LR=0.1\nN = \"3\"\n";
        assert_eq!(
            set(ini, Format::Ini, "N", "4").unwrap(),
            b"# comment\nexport LR=0.1\nN = \"4\"\n"
        );
        assert_eq!(
            set(ini, Format::Ini, "LR", "0.2").unwrap(),
            b"# comment\nexport LR=0.2\nN = \"3\"\n"
        );
    }

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
