//! The upstream's credentials, from where the AWS tools look for them, in their order: the
//! environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), then the
//! profile `AWS_PROFILE` (else `default`) in the shared credentials file
//! (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`), then in the config file
//! (`AWS_CONFIG_FILE`, else `~/.aws/config`, where it is `[profile NAME]`). Nothing that would
//! wait on a metadata endpoint. Static keys: read once, never logged.

use std::path::{Path, PathBuf};

use aws_credential_types::Credentials;

/// The first source that has both keys; None when none has.
pub(crate) fn load() -> Option<Credentials> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let (Some(id), Some(secret)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        return Some(make(id, secret, var("AWS_SESSION_TOKEN")));
    }
    let profile = var("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let home = var("HOME").map(PathBuf::from);
    let file = |env: &str, default: &str| {
        var(env)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(default)))
    };
    let credentials = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
    let config = file("AWS_CONFIG_FILE", ".aws/config");
    let config_section = match profile.as_str() {
        "default" => "default".to_owned(),
        p => format!("profile {p}"),
    };
    [(credentials, profile.clone()), (config, config_section)]
        .into_iter()
        .find_map(|(path, section)| from_file(path.as_deref()?, &section))
}

fn make(id: String, secret: String, token: Option<String>) -> Credentials {
    Credentials::new(id, secret, token, None, "roar")
}

fn from_file(path: &Path, section: &str) -> Option<Credentials> {
    let text = std::fs::read_to_string(path).ok()?;
    let keys = section_keys(&text, section);
    let get = |k: &str| {
        keys.iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.clone())
    };
    Some(make(
        get("aws_access_key_id")?,
        get("aws_secret_access_key")?,
        get("aws_session_token"),
    ))
}

/// The `key = value` lines of `[section]` in an INI file (names lower-cased, values trimmed;
/// comments and other sections skipped).
fn section_keys(text: &str, section: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut keys = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.split_whitespace().collect::<Vec<_>>().join(" ") == section;
            continue;
        }
        if let (true, Some((k, v))) = (inside, line.split_once('=')) {
            keys.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_is_read_from_its_section_only() {
        let text = "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n\n\
                    # a comment\n[profile  team]\nAWS_ACCESS_KEY_ID=T\naws_secret_access_key = TS \n\
                    aws_session_token = TOK\n[other]\naws_access_key_id = O\n";
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, text).unwrap();
        let team = from_file(&path, "profile team").unwrap();
        assert_eq!(team.access_key_id(), "T");
        assert_eq!(team.secret_access_key(), "TS");
        assert_eq!(team.session_token(), Some("TOK"));
        let default = from_file(&path, "default").unwrap();
        assert_eq!(default.access_key_id(), "D");
        assert_eq!(default.session_token(), None);
        // A section without both keys gives nothing.
        assert!(from_file(&path, "other").is_none());
        assert!(from_file(&path, "missing").is_none());
    }
}
