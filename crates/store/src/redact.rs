//! Which parts of a job's environment are stored: credentials never are.
//!
//! A variable is redacted when its name looks like a credential (`*SECRET*`, `*TOKEN*`,
//! `*PASSWORD*`, `*PASSWD*`, `*KEY*`, `*CREDENTIAL*`, `*PRIVATE*`, `*AUTH*`, AWS credentials),
//! except a short list of well-known harmless names. Values of any variable that embed a password
//! in a URL (`scheme://user:pass@host`) keep the URL with the password redacted.

use std::collections::BTreeMap;
use std::ffi::OsString;

pub const REDACTED: &str = "<redacted>";

const SECRET_WORDS: &[&str] = &[
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "PASSWD",
    "KEY",
    "CREDENTIAL",
    "PRIVATE",
    "AUTH",
    "COOKIE",
    "SESSION",
];

/// Names that match a secret word but hold no secret.
const HARMLESS: &[&str] = &[
    "SSH_AUTH_SOCK",
    "XAUTHORITY",
    "KEYTIMEOUT",
    "GPG_AGENT_INFO",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_PROFILE",
    "XDG_SESSION_ID",
    "XDG_SESSION_TYPE",
    "XDG_SESSION_CLASS",
    "XDG_SESSION_DESKTOP",
    "DESKTOP_SESSION",
    "PYTHONHASHSEED",
];

/// Variables that are noise for provenance and only make every job record bigger.
const DROPPED: &[&str] = &["LS_COLORS", "LD_PRELOAD", "_"];

pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if HARMLESS.contains(&upper.as_str()) {
        return false;
    }
    SECRET_WORDS.iter().any(|w| upper.contains(w))
}

/// Redacts the password of any `scheme://user:password@host` inside `value`.
pub fn redact_url_password(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(scheme_end) = rest.find("://") {
        let (head, tail) = rest.split_at(scheme_end + 3);
        out.push_str(head);
        let authority_end = tail.find(['/', '?', '#', ' ']).unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match (authority.rfind('@'), authority.find(':')) {
            (Some(at), Some(colon)) if colon < at => {
                out.push_str(&authority[..colon + 1]);
                out.push_str(REDACTED);
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[authority_end..];
    }
    out.push_str(rest);
    out
}

/// The environment as it is stored for a job.
pub fn filter_env(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> BTreeMap<String, String> {
    vars.into_iter()
        .filter_map(|(k, v)| {
            let k = k.to_string_lossy().into_owned();
            if DROPPED.contains(&k.as_str()) || k.starts_with("ROAR_INTERNAL_") {
                return None;
            }
            let v = if is_secret_name(&k) {
                REDACTED.to_owned()
            } else {
                redact_url_password(&v.to_string_lossy())
            };
            Some((k, v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_redacted_and_harmless_names_kept() {
        let env = filter_env(
            [
                ("AWS_SECRET_ACCESS_KEY", "abc"),
                ("AWS_ACCESS_KEY_ID", "AKIA"),
                ("AWS_SESSION_TOKEN", "t"),
                ("GITHUB_TOKEN", "ghp"),
                ("DB_PASSWORD", "pw"),
                ("OPENAI_API_KEY", "sk"),
                ("SSH_AUTH_SOCK", "/tmp/agent"),
                ("AWS_REGION", "eu-west-1"),
                ("HOME", "/root"),
                ("DATABASE_URL", "postgres://me:hunter2@db:5432/x"),
                ("LS_COLORS", "rs=0"),
            ]
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        for k in [
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ACCESS_KEY_ID",
            "AWS_SESSION_TOKEN",
            "GITHUB_TOKEN",
            "DB_PASSWORD",
            "OPENAI_API_KEY",
        ] {
            assert_eq!(env[k], REDACTED, "{k}");
        }
        assert_eq!(env["SSH_AUTH_SOCK"], "/tmp/agent");
        assert_eq!(env["AWS_REGION"], "eu-west-1");
        assert_eq!(env["HOME"], "/root");
        assert_eq!(env["DATABASE_URL"], "postgres://me:<redacted>@db:5432/x");
        assert!(!env.contains_key("LS_COLORS"));
    }

    #[test]
    fn urls_without_password_are_untouched() {
        for v in [
            "https://example.com/a:b@c",
            "s3://bucket/key",
            "plain",
            "http://user@host/",
        ] {
            assert_eq!(redact_url_password(v), v);
        }
    }
}
