//! Python distributions: which installed distribution a file below a site directory belongs to,
//! from each distribution's `*.dist-info` (METADATA, INSTALLER, RECORD, direct_url.json) or
//! `*.egg-info` (PKG-INFO, top_level.txt).
//!
//! An index maps the first component of a path below the site directory (`numpy`, `six.py`) to
//! its distribution; where several distributions share one (namespace packages: `google/`), the
//! first two components. Editable installs map their source directory (`editable:/src/pkg`).
//! Files every interpreter start reads (`*.pth`, an editable install's finder) and the metadata
//! directories themselves are no evidence of use: they are left out.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use roar_store::Package;

pub const EDITABLE: &[u8] = b"editable:";

/// The site directory `path` lies in and the path below it.
pub fn site_of(path: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut site = PathBuf::new();
    let mut comps = path.components();
    for c in comps.by_ref() {
        site.push(c);
        if let Component::Normal(n) = c {
            if n == "site-packages" || n == "dist-packages" {
                let rest: PathBuf = comps.collect();
                return (!rest.as_os_str().is_empty()).then_some((site, rest));
            }
        }
    }
    None
}

/// The identity of a site directory's listing: a distribution installed or removed changes it.
pub fn stamp(site: &Path) -> Option<String> {
    crate::stamp_of(site)
}

/// The keys to look `rest` (a path below the site directory) up by, most specific first.
pub fn keys(rest: &Path) -> Vec<Vec<u8>> {
    let parts: Vec<&[u8]> = rest
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.as_bytes()),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    if parts.len() >= 2 {
        out.push([parts[0], b"/", parts[1]].concat());
    }
    if let Some(first) = parts.first() {
        out.push(first.to_vec());
    }
    out
}

/// Whether a file below the site directory says nothing about which distributions a job used.
pub fn is_startup_noise(rest: &Path) -> bool {
    let first = rest.components().next();
    let Some(Component::Normal(first)) = first else {
        return true;
    };
    let f = first.as_bytes();
    f.ends_with(b".pth")
        || f.starts_with(b"__editable__")
        || f.ends_with(b".dist-info")
        || f.ends_with(b".egg-info")
        || f.ends_with(b".egg-link")
        || f == b"__pycache__"
        || f == b"_distutils_hack"
}

/// Reads every distribution in `site`: index entries key -> package.
pub fn index(site: &Path) -> Vec<(Vec<u8>, Package)> {
    let Ok(dir) = std::fs::read_dir(site) else {
        return Vec::new();
    };
    let mut owners: HashMap<Vec<u8>, Vec<usize>> = HashMap::new();
    let mut pairs: HashMap<Vec<u8>, Vec<usize>> = HashMap::new();
    let mut dists: Vec<Package> = Vec::new();
    let mut editable: Vec<(PathBuf, usize)> = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name();
        let name = name.as_bytes();
        let path = entry.path();
        let (pkg, files) = if name.ends_with(b".dist-info") {
            match dist_info(site, &path) {
                Some(x) => x,
                None => continue,
            }
        } else if name.ends_with(b".egg-info") {
            match egg_info(site, &path) {
                Some(x) => x,
                None => continue,
            }
        } else {
            continue;
        };
        let i = dists.len();
        if let Some(src) = pkg
            .location
            .clone()
            .filter(|_| pkg.commit.is_some() || is_editable(&path))
        {
            editable.push((PathBuf::from(src), i));
        }
        dists.push(pkg);
        for f in files {
            if is_startup_noise(&f) || f.components().next() == Some(Component::ParentDir) {
                continue;
            }
            let ks = keys(&f);
            if let Some(first) = ks.last() {
                push_unique(owners.entry(first.clone()).or_default(), i);
            }
            if ks.len() == 2 {
                push_unique(pairs.entry(ks[0].clone()).or_default(), i);
            }
        }
    }
    let mut out = Vec::new();
    for (key, who) in &owners {
        if who.len() == 1 {
            out.push((key.clone(), dists[who[0]].clone()));
        }
    }
    for (key, who) in pairs {
        let first = key.split(|b| *b == b'/').next().unwrap_or(&key).to_vec();
        if who.len() == 1 && owners.get(&first).is_some_and(|o| o.len() > 1) {
            out.push((key, dists[who[0]].clone()));
        }
    }
    for (src, i) in editable {
        out.push((
            [EDITABLE, src.as_os_str().as_bytes()].concat(),
            dists[i].clone(),
        ));
    }
    out.sort();
    out
}

fn push_unique(v: &mut Vec<usize>, i: usize) {
    if !v.contains(&i) {
        v.push(i);
    }
}

fn is_editable(dist_info: &Path) -> bool {
    std::fs::read_to_string(dist_info.join("direct_url.json"))
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .is_some_and(|v| v["dir_info"]["editable"] == serde_json::Value::Bool(true))
}

/// `Name` and `Version` from a METADATA / PKG-INFO header.
fn name_version(text: &str) -> Option<(String, String)> {
    let mut name = None;
    let mut version = None;
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("Name:") {
            name.get_or_insert_with(|| v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("Version:") {
            version.get_or_insert_with(|| v.trim().to_owned());
        }
    }
    Some((name?, version?))
}

fn dist_info(site: &Path, dir: &Path) -> Option<(Package, Vec<PathBuf>)> {
    let (name, version) = name_version(&std::fs::read_to_string(dir.join("METADATA")).ok()?)?;
    let installer = installer(dir);
    let mut location = Some(site.to_string_lossy().into_owned());
    let mut commit = None;
    if is_editable(dir) {
        let url = std::fs::read_to_string(dir.join("direct_url.json"))
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .and_then(|v| v["url"].as_str().map(str::to_owned));
        if let Some(src) = url.as_deref().and_then(|u| u.strip_prefix("file://")) {
            let src = percent_decode(src);
            commit = crate::git::Repo::find(Path::new(&src))
                .and_then(|r| r.head())
                .and_then(|g| g.commit);
            location = Some(src);
        }
    }
    let record = std::fs::read_to_string(dir.join("RECORD")).unwrap_or_default();
    let files = record
        .lines()
        .filter_map(record_path)
        .map(PathBuf::from)
        .collect();
    Some((
        Package {
            kind: "python".into(),
            name,
            version,
            installer,
            location,
            commit,
        },
        files,
    ))
}

/// Who installed the distribution (`INSTALLER`: pip, uv, conda, poetry...).
fn installer(meta_dir: &Path) -> Option<String> {
    std::fs::read_to_string(meta_dir.join("INSTALLER"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The path field of a RECORD line (CSV: a path holding a comma is quoted).
fn record_path(line: &str) -> Option<String> {
    if let Some(rest) = line.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    out.push('"');
                    chars.next();
                } else {
                    return Some(out);
                }
            } else {
                out.push(c);
            }
        }
        None
    } else {
        line.split(',')
            .next()
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
    }
}

fn egg_info(site: &Path, dir: &Path) -> Option<(Package, Vec<PathBuf>)> {
    let meta = if dir.is_dir() {
        std::fs::read_to_string(dir.join("PKG-INFO")).ok()?
    } else {
        // A single-file egg-info (distutils).
        std::fs::read_to_string(dir).ok()?
    };
    let (name, version) = name_version(&meta)?;
    let files = std::fs::read_to_string(dir.join("top_level.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .flat_map(|l| [PathBuf::from(l), PathBuf::from(format!("{l}.py"))])
        .collect();
    Some((
        Package {
            kind: "python".into(),
            name,
            version,
            installer: installer(dir),
            location: Some(site.to_string_lossy().into_owned()),
            commit: None,
        },
        files,
    ))
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_and_keys() {
        let (site, rest) =
            site_of(Path::new("/v/lib/python3.11/site-packages/numpy/core/x.py")).unwrap();
        assert_eq!(site, Path::new("/v/lib/python3.11/site-packages"));
        assert_eq!(rest, Path::new("numpy/core/x.py"));
        assert_eq!(keys(&rest), vec![b"numpy/core".to_vec(), b"numpy".to_vec()]);
        assert!(site_of(Path::new("/usr/lib/python3/dist-packages")).is_none());
    }

    #[test]
    fn record_lines() {
        assert_eq!(
            record_path("numpy/__init__.py,sha256=x,12").as_deref(),
            Some("numpy/__init__.py")
        );
        assert_eq!(
            record_path("\"a,b.py\",sha256=x,1").as_deref(),
            Some("a,b.py")
        );
        assert_eq!(percent_decode("/src/my%20pkg"), "/src/my pkg");
    }

    fn dist(site: &Path, name: &str, version: &str, files: &[&str]) {
        let d = site.join(format!("{name}-{version}.dist-info"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("METADATA"),
            format!(
                "Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\nName: not-this\n"
            ),
        )
        .unwrap();
        std::fs::write(d.join("INSTALLER"), "pip\n").unwrap();
        let mut record: String = files.iter().map(|f| format!("{f},sha256=x,1\n")).collect();
        record.push_str(&format!(
            "{name}-{version}.dist-info/RECORD,,\n../../../bin/{name},,\n"
        ));
        std::fs::write(d.join("RECORD"), record).unwrap();
    }

    #[test]
    fn namespace_packages_split_on_two_components() {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path();
        dist(site, "protobuf", "4.25.0", &["google/protobuf/__init__.py"]);
        dist(
            site,
            "googleapis-common-protos",
            "1.6",
            &["google/api/http.py", "google/rpc/x.py"],
        );
        dist(site, "six", "1.16.0", &["six.py", "zz.pth"]);
        let idx: HashMap<Vec<u8>, Package> = index(site).into_iter().collect();
        let name = |k: &str| idx.get(k.as_bytes()).map(|p| p.name.clone());
        assert_eq!(name("google/protobuf").as_deref(), Some("protobuf"));
        assert_eq!(
            name("google/api").as_deref(),
            Some("googleapis-common-protos")
        );
        assert_eq!(name("google"), None);
        assert_eq!(name("six.py").as_deref(), Some("six"));
        assert_eq!(name("zz.pth"), None);
        assert_eq!(idx[b"six.py".as_slice()].version, "1.16.0");
        assert_eq!(idx[b"six.py".as_slice()].installer.as_deref(), Some("pip"));
    }
}
