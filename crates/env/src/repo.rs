//! Where a git repository keeps its files, and what its files say without running git: the
//! commit HEAD names, the branch, and the remote's URL (its credentials stripped).

use std::path::{Path, PathBuf};

use roar_store::GitState;

/// Where a repository keeps its files: `git_dir` (HEAD, per worktree) and `common` (refs,
/// packed-refs, config: shared by linked worktrees).
#[derive(Debug, Clone)]
pub struct Repo {
    pub root: PathBuf,
    pub(crate) git_dir: PathBuf,
    pub(crate) common: PathBuf,
}

impl Repo {
    /// The repository whose work tree holds `dir`, if any.
    pub fn find(dir: &Path) -> Option<Repo> {
        let root = dir.ancestors().find(|d| d.join(".git").exists())?;
        let dot = root.join(".git");
        let git_dir = if dot.is_file() {
            // A linked worktree or a submodule: `gitdir: PATH`.
            let text = std::fs::read_to_string(&dot).ok()?;
            let target = Path::new(text.strip_prefix("gitdir:")?.trim());
            root.join(target)
        } else {
            dot
        };
        let common = match std::fs::read_to_string(git_dir.join("commondir")) {
            Ok(c) => git_dir.join(c.trim()),
            Err(_) => git_dir.clone(),
        };
        Some(Repo {
            root: root.to_owned(),
            git_dir,
            common,
        })
    }

    /// Commit, branch and remote, from the repository's files. `None` when they cannot be read
    /// that way (a ref store other than files, say): then `git` is asked.
    pub fn head(&self) -> Option<GitState> {
        let head = std::fs::read_to_string(self.git_dir.join("HEAD")).ok()?;
        let head = head.trim();
        let (commit, branch) = match head.strip_prefix("ref:") {
            Some(r) => {
                let r = r.trim();
                // The reftable backend leaves this placeholder in HEAD.
                if r == "refs/heads/.invalid" {
                    return None;
                }
                let branch = r.strip_prefix("refs/heads/").map(str::to_owned);
                (self.resolve(r), branch)
            }
            None if is_oid(head) => (Some(head.to_owned()), None),
            None => return None,
        };
        let remote = self.remote_url(branch.as_deref());
        Some(before_the_job(commit, branch, remote))
    }

    fn resolve(&self, name: &str) -> Option<String> {
        for dir in [&self.git_dir, &self.common] {
            if let Ok(s) = std::fs::read_to_string(dir.join(name)) {
                let s = s.trim();
                if let Some(next) = s.strip_prefix("ref:") {
                    return self.resolve(next.trim());
                }
                return is_oid(s).then(|| s.to_owned());
            }
        }
        let packed = std::fs::read_to_string(self.common.join("packed-refs")).ok()?;
        packed.lines().find_map(|line| {
            let (oid, r) = line.split_once(' ')?;
            (r == name && is_oid(oid)).then(|| oid.to_owned())
        })
    }

    /// The URL of `branch`'s remote, else of `origin`, else of the only remote; without
    /// credentials.
    fn remote_url(&self, branch: Option<&str>) -> Option<String> {
        let config = std::fs::read_to_string(self.common.join("config")).ok()?;
        let sections = parse_config(&config);
        let get = |section: &str, key: &str| {
            sections
                .iter()
                .find(|(s, k, _)| s == section && k.eq_ignore_ascii_case(key))
                .map(|(_, _, v)| v.clone())
        };
        let remote = branch
            .and_then(|b| get(&format!("branch \"{b}\""), "remote"))
            .filter(|r| r != ".")
            .unwrap_or_else(|| "origin".to_owned());
        let url = get(&format!("remote \"{remote}\""), "url").or_else(|| {
            let urls: Vec<_> = sections
                .iter()
                .filter(|(s, k, _)| s.starts_with("remote \"") && k.eq_ignore_ascii_case("url"))
                .collect();
            (urls.len() == 1).then(|| urls[0].2.clone())
        })?;
        Some(strip_credentials(&url))
    }
}

pub(crate) fn is_oid(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `(section, key, value)` of a git config file: enough of the format for `[remote "x"] url`
/// and `[branch "y"] remote` (quoted values, comments; no includes).
fn parse_config(text: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let Some(end) = rest.rfind(']') else { continue };
            let head = rest[..end].trim();
            section = match head.split_once(char::is_whitespace) {
                Some((name, sub)) => format!("{} {}", name.to_ascii_lowercase(), sub.trim()),
                None => head.to_ascii_lowercase(),
            };
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let v = value.trim();
        let v = match v.strip_prefix('"') {
            Some(q) => q.split('"').next().unwrap_or(q),
            None => v.split([';', '#']).next().unwrap_or(v).trim_end(),
        };
        out.push((section.clone(), key.trim().to_owned(), v.to_owned()));
    }
    out
}

/// A remote URL without the user and password an https URL may carry (`https://TOKEN@host/x`
/// is a leaked credential); `user@host:path` (scp-like ssh) names an account, not a secret.
pub fn strip_credentials(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rfind('@') {
        Some(at) => {
            let user = &authority[..at];
            let keep_user = scheme.starts_with("ssh") && !user.contains(':');
            if keep_user {
                url.to_owned()
            } else {
                format!("{scheme}://{}{path}", &authority[at + 1..])
            }
        }
        None => url.to_owned(),
    }
}

/// The code state known before the job: whether the tree is dirty (and how) comes after it, from
/// the [`DiffJob`].
pub(crate) fn before_the_job(
    commit: Option<String>,
    branch: Option<String>,
    remote: Option<String>,
) -> GitState {
    GitState {
        commit,
        branch,
        dirty: false,
        remote,
        diff: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_stripped() {
        assert_eq!(
            strip_credentials("https://user:ghp_secret@github.com/o/r.git"),
            "https://github.com/o/r.git"
        );
        assert_eq!(
            strip_credentials("https://ghp_token@github.com/o/r.git"),
            "https://github.com/o/r.git"
        );
        assert_eq!(
            strip_credentials("ssh://git@host:22/o/r.git"),
            "ssh://git@host:22/o/r.git"
        );
        assert_eq!(
            strip_credentials("ssh://git:pw@host/o/r.git"),
            "ssh://host/o/r.git"
        );
        assert_eq!(
            strip_credentials("git@github.com:o/r.git"),
            "git@github.com:o/r.git"
        );
        assert_eq!(strip_credentials("/srv/repo.git"), "/srv/repo.git");
    }

    #[test]
    fn config_sections() {
        let c = "[core]\n\tbare = false\n[remote \"up\"]\n\turl = \"https://h/x\" ; c\n[branch \"main\"]\n\tremote = up\n";
        let s = parse_config(c);
        assert!(s.contains(&("remote \"up\"".into(), "url".into(), "https://h/x".into())));
        assert!(s.contains(&("branch \"main\"".into(), "remote".into(), "up".into())));
    }
}
