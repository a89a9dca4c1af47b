//! conda environments: which conda package owns a file below an environment's prefix, from
//! `PREFIX/conda-meta/*.json` (`name`, `version`, `build`, `channel`, `files` relative to the
//! prefix). This is where an ML job's non-Python libraries come from (CUDA, cuDNN, MKL,
//! libstdc++ of the environment); the Python distributions of a conda environment are found
//! through their dist-info like any other (INSTALLER says `conda`).

use std::path::{Path, PathBuf};

use roar_store::Package;

/// The conda environment `dir` lies in: the nearest ancestor (itself included, at most a few
/// levels up: `lib/`, `lib/python3.11/`, `bin/`) holding a `conda-meta` directory.
pub fn prefix_of(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .take(4)
        .find(|d| d.join("conda-meta").is_dir())
        .map(Path::to_owned)
}

/// The identity of an environment's package list: installing or removing a package changes the
/// `conda-meta` directory.
pub fn stamp(prefix: &Path) -> Option<String> {
    crate::stamp_of(&prefix.join("conda-meta"))
}

/// Every file of every package of the environment: absolute path -> package.
pub fn index(prefix: &Path) -> Vec<(Vec<u8>, Package)> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(dir) = std::fs::read_dir(prefix.join("conda-meta")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let Some(meta) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        else {
            continue;
        };
        let (Some(name), Some(version)) = (meta["name"].as_str(), meta["version"].as_str()) else {
            continue;
        };
        let channel = meta["channel"]
            .as_str()
            .or_else(|| meta["schannel"].as_str())
            .map(channel_name);
        let package = Package {
            kind: "conda".into(),
            name: name.into(),
            version: match meta["build"].as_str() {
                Some(build) if !build.is_empty() => format!("{version}={build}"),
                _ => version.into(),
            },
            installer: Some(match channel {
                Some(c) => format!("conda:{c}"),
                None => "conda".into(),
            }),
            location: Some(prefix.to_string_lossy().into_owned()),
            commit: None,
        };
        for f in meta["files"].as_array().into_iter().flatten() {
            if let Some(rel) = f.as_str() {
                out.push((
                    prefix.join(rel).as_os_str().as_bytes().to_vec(),
                    package.clone(),
                ));
            }
        }
    }
    out
}

/// `https://conda.anaconda.org/nvidia/linux-64` -> `nvidia`; `conda-forge` stays.
fn channel_name(url: &str) -> String {
    let mut parts: Vec<&str> = url.trim_end_matches('/').split('/').collect();
    let platform =
        |p: &str| p == "noarch" || ["linux-", "osx-", "win-"].iter().any(|s| p.starts_with(s));
    if parts.len() > 1 && parts.last().is_some_and(|p| platform(p)) {
        parts.pop();
    }
    parts.last().copied().unwrap_or(url).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conda_environment_is_indexed_from_conda_meta() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("envs/train");
        std::fs::create_dir_all(prefix.join("conda-meta")).unwrap();
        std::fs::create_dir_all(prefix.join("lib/python3.11/site-packages")).unwrap();
        std::fs::write(
            prefix.join("conda-meta/libcublas-12.1.3.1-0.json"),
            r#"{"name": "libcublas", "version": "12.1.3.1", "build": "0",
                "channel": "https://conda.anaconda.org/nvidia/linux-64",
                "files": ["lib/libcublas.so.12", "lib/libcublasLt.so.12"]}"#,
        )
        .unwrap();
        std::fs::write(prefix.join("conda-meta/history"), "not json").unwrap();
        assert_eq!(
            prefix_of(&prefix.join("lib/python3.11/site-packages")),
            Some(prefix.clone())
        );
        assert_eq!(prefix_of(&prefix.join("lib")), Some(prefix.clone()));
        assert_eq!(prefix_of(dir.path()), None);
        let idx = index(&prefix);
        assert_eq!(idx.len(), 2);
        let (key, p) = &idx[0];
        assert!(key.ends_with(b"lib/libcublas.so.12") || key.ends_with(b"lib/libcublasLt.so.12"));
        assert_eq!(p.kind, "conda");
        assert_eq!(p.name, "libcublas");
        assert_eq!(p.version, "12.1.3.1=0");
        assert_eq!(p.installer.as_deref(), Some("conda:nvidia"));
        assert_eq!(channel_name("conda-forge"), "conda-forge");
        assert_eq!(
            channel_name("https://conda.anaconda.org/conda-forge/noarch/"),
            "conda-forge"
        );
        assert!(stamp(&prefix).is_some());
    }
}
