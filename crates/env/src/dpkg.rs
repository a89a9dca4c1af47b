//! Debian packages: which installed package owns a file (`/var/lib/dpkg/info/*.list`), at which
//! version (`/var/lib/dpkg/status`). The index is rebuilt when the status file changes (every
//! install, upgrade or removal rewrites it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use roar_store::Package;

pub const SOURCE: &str = "dpkg";

/// The dpkg database under `root` (`/` outside tests).
pub fn admin_dir(root: &Path) -> PathBuf {
    root.join("var/lib/dpkg")
}

pub fn stamp(admin: &Path) -> Option<String> {
    crate::stamp_of(&admin.join("status"))
}

/// Installed packages (`name` and `name:arch`) -> version.
fn installed(admin: &Path) -> HashMap<String, (String, String)> {
    let text = std::fs::read_to_string(admin.join("status")).unwrap_or_default();
    let mut out = HashMap::new();
    for stanza in text.split("\n\n") {
        let mut name = None;
        let mut version = None;
        let mut arch = None;
        let mut ok = false;
        for line in stanza.lines() {
            if let Some(v) = line.strip_prefix("Package: ") {
                name = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("Version: ") {
                version = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("Architecture: ") {
                arch = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("Status: ") {
                ok = v.trim().ends_with(" installed");
            }
        }
        if let (Some(n), Some(v), true) = (name, version, ok) {
            let entry = (n.to_owned(), v.to_owned());
            if let Some(a) = arch {
                out.insert(format!("{n}:{a}"), entry.clone());
            }
            out.insert(n.to_owned(), entry);
        }
    }
    out
}

/// Every file of every installed package: path -> package.
pub fn index(admin: &Path) -> Vec<(Vec<u8>, Package)> {
    let versions = installed(admin);
    let Ok(dir) = std::fs::read_dir(admin.join("info")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let file = entry.file_name();
        let Some(pkg) = file.to_str().and_then(|f| f.strip_suffix(".list")) else {
            continue;
        };
        let Some((name, version)) = versions.get(pkg) else {
            continue;
        };
        let Ok(list) = std::fs::read(entry.path()) else {
            continue;
        };
        let package = Package {
            kind: "dpkg".into(),
            name: name.clone(),
            version: version.clone(),
            installer: None,
            location: None,
            commit: None,
        };
        for line in list.split(|b| *b == b'\n') {
            // Directories are listed too (and kept: only files are ever looked up).
            if line.len() > 1 {
                out.push((line.to_vec(), package.clone()));
            }
        }
    }
    out
}

/// The names a file may be listed under: as opened, resolved (`real`: its path with every
/// symlink resolved, if it exists), and across the /usr merge (`/lib/x.so` is `/usr/lib/x.so` on
/// merged systems; packages list either).
pub fn candidates(path: &Path, real: Option<PathBuf>) -> Vec<PathBuf> {
    let mut out = vec![path.to_owned()];
    if let Some(real) = real.filter(|r| r != path) {
        out.push(real);
    }
    let n = out.len();
    for i in 0..n {
        let p = out[i].clone();
        for (merged, plain) in [
            ("/usr/lib/", "/lib/"),
            ("/usr/lib64/", "/lib64/"),
            ("/usr/bin/", "/bin/"),
            ("/usr/sbin/", "/sbin/"),
        ] {
            let s = p.to_string_lossy();
            if let Some(rest) = s.strip_prefix(merged) {
                out.push(PathBuf::from(format!("{plain}{rest}")));
            } else if let Some(rest) = s.strip_prefix(plain) {
                out.push(PathBuf::from(format!("{merged}{rest}")));
            }
        }
    }
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_database() {
        let dir = tempfile::tempdir().unwrap();
        let admin = dir.path();
        std::fs::create_dir_all(admin.join("info")).unwrap();
        std::fs::write(
            admin.join("status"),
            "Package: libsqlite3-0\nStatus: install ok installed\nArchitecture: amd64\nVersion: 3.40.1-2\n\nPackage: gone\nStatus: deinstall ok config-files\nVersion: 1\n",
        )
        .unwrap();
        std::fs::write(
            admin.join("info/libsqlite3-0:amd64.list"),
            "/.\n/usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6\n",
        )
        .unwrap();
        std::fs::write(admin.join("info/gone.list"), "/usr/bin/gone\n").unwrap();
        let idx = index(admin);
        assert_eq!(idx.len(), 2);
        assert_eq!(idx[1].1.name, "libsqlite3-0");
        assert_eq!(idx[1].1.version, "3.40.1-2");
        assert!(stamp(admin).is_some());
    }

    #[test]
    fn usr_merge_candidates() {
        let c = candidates(
            Path::new("/nonexistent-lib/../lib/x86_64-linux-gnu/libz.so.1"),
            None,
        );
        assert!(c.contains(&PathBuf::from(
            "/nonexistent-lib/../lib/x86_64-linux-gnu/libz.so.1"
        )));
        let c = candidates(Path::new("/lib/zz-not-there.so"), None);
        assert!(c.contains(&PathBuf::from("/usr/lib/zz-not-there.so")));
    }
}
