//! Which paths never become inputs or outputs: the built-in list plus the project's globs.
//!
//! Glob syntax: `*` matches within one path component, `**` across components, `?` one byte.

use std::path::Path;

/// Runtime noise: kernel filesystems, shared libraries and interpreters' own code and caches.
pub const DEFAULT_IGNORES: &[&str] = &[
    "/proc/**",
    "/sys/**",
    "/dev/**",
    "/run/**",
    "/etc/ld.so.cache",
    "/etc/ld.so.preload",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/gai.conf",
    "/lib/**",
    "/lib64/**",
    "/usr/lib/**",
    "/usr/lib64/**",
    "/usr/libexec/**",
    "/usr/share/locale/**",
    "/usr/share/zoneinfo/**",
    "/usr/local/lib/**",
    "**/lib/python3*/**",
    "**/site-packages/**",
    "**/dist-packages/**",
    "**/__pycache__/**",
    "**/*.pyc",
    "**/*.so",
    "**/*.so.*",
    "/etc/ssl/**",
    "/etc/ca-certificates/**",
    "/usr/share/ca-certificates/**",
    "**/.pyenv/libexec/**",
    "**/.pyenv/plugins/**",
    "**/.pyenv/pyenv.d/**",
    "**/.pyenv/shims/**",
    "**/.pyenv/version",
    "**/.roar/**",
    "**/.git/**",
];

#[derive(Debug, Clone)]
pub struct Ignore {
    globs: Vec<Vec<u8>>,
}

impl Ignore {
    pub fn new(extra: &[String]) -> Ignore {
        let globs = DEFAULT_IGNORES
            .iter()
            .map(|g| g.as_bytes().to_vec())
            .chain(extra.iter().map(|g| g.as_bytes().to_vec()))
            .collect();
        Ignore { globs }
    }

    pub fn is_ignored(&self, path: &Path) -> bool {
        let p = crate::event::bytes(path);
        self.globs.iter().any(|g| glob_match(g, p))
    }
}

pub fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    match pat.first() {
        None => s.is_empty(),
        Some(b'*') if pat.get(1) == Some(&b'*') => {
            let rest = &pat[2..];
            // `**/` may also match nothing at all.
            let rest_after_slash = rest.strip_prefix(b"/").unwrap_or(rest);
            if glob_match(rest_after_slash, s) {
                return true;
            }
            (0..s.len())
                .any(|i| glob_match(rest, &s[i + 1..]) || glob_match(rest_after_slash, &s[i + 1..]))
        }
        Some(b'*') => {
            let rest = &pat[1..];
            for i in 0..=s.len() {
                if glob_match(rest, &s[i..]) {
                    return true;
                }
                if s.get(i) == Some(&b'/') {
                    break;
                }
            }
            false
        }
        Some(b'?') => !s.is_empty() && s[0] != b'/' && glob_match(&pat[1..], &s[1..]),
        Some(c) => s.first() == Some(c) && glob_match(&pat[1..], &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match(b"/proc/**", b"/proc/self/status"));
        assert!(glob_match(
            b"**/__pycache__/**",
            b"/w/pkg/__pycache__/m.cpython-311.pyc"
        ));
        assert!(glob_match(
            b"**/*.so.*",
            b"/usr/lib/x86_64-linux-gnu/libc.so.6"
        ));
        assert!(glob_match(
            b"**/lib/python3*/**",
            b"/root/.pyenv/versions/3.11.7/lib/python3.11/os.py"
        ));
        assert!(glob_match(b"/data/*.tmp", b"/data/a.tmp"));
        assert!(!glob_match(b"/data/*.tmp", b"/data/sub/a.tmp"));
        assert!(!glob_match(b"/proc/**", b"/process/x"));
        assert!(!Ignore::new(&[]).is_ignored(Path::new("/work/data/train.csv")));
        assert!(Ignore::new(&["**/*.log".into()]).is_ignored(Path::new("/w/run.log")));
    }
}
