//! What of a job's command line and environment is stored: secrets never are.
//!
//! Every job reaches the store through [`crate::Writer`], which passes it through the store's
//! [`Policy`] first — so `roar run` (every backend), the mount and the gateway share one rule and
//! no secret reaches the database, its WAL or any output. A secret becomes `<redacted>`:
//!
//! - a variable whose *name* says secret ([`names`]: `*TOKEN*`, `*PASSWORD*`, `*_KEY`, ...);
//! - an option whose name says secret, and the password options of well-known tools ([`args`]:
//!   `--password X`, `--token=X`, `mysql -pX`, `curl -u user:X`, `-storepass X`);
//! - anywhere, a value that *looks* like one ([`values`]: token formats, JWTs, PEM private keys,
//!   credentials in URLs and DSNs, `name=value` pairs with a secret name, `Bearer` values);
//! - whatever `[redact]` in `.roar/config.toml` adds (`names`, `patterns`), minus `allow`.

mod args;
mod names;
mod rules;
mod values;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

use regex_lite::Regex;
use serde::Deserialize;

pub use names::NameKind;

use crate::model::JobRecord;

pub const REDACTED: &str = "<redacted>";

/// Variables that are noise for provenance and only make every job record bigger.
const DROPPED: &[&str] = &["LS_COLORS", "LD_PRELOAD", "_"];

/// `[redact]` in `.roar/config.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedactConfig {
    /// More names whose values are secrets: variables, options (without dashes) and `name=value`
    /// pairs; `*` matches anything, case is ignored.
    pub names: Vec<String>,
    /// Names that are never secret by name (their values are still checked for token shapes).
    pub allow: Vec<String>,
    /// Regular expressions: every match is redacted wherever it appears.
    pub patterns: Vec<String>,
}

/// The redaction rules of one store: the built-in ones plus the project's `[redact]`.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    names: Vec<String>,
    allow: Vec<String>,
    patterns: Vec<Regex>,
    /// The last environments redacted, as given and as redacted, with how many values changed
    /// ([`Policy::remembering`]).
    recent: Option<std::sync::Arc<std::sync::Mutex<Vec<Remembered>>>>,
}

type Remembered = (BTreeMap<String, String>, BTreeMap<String, String>, usize);

/// Environments a remembering policy keeps.
const RECENT_ENVS: usize = 4;

/// Only `[redact]` of the config file; the CLI checks the rest.
#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    redact: Option<toml::Value>,
}

impl Policy {
    /// The built-in rules alone.
    pub fn builtin() -> Policy {
        Policy::default()
    }

    pub fn new(config: &RedactConfig) -> Result<Policy, String> {
        let patterns = config
            .patterns
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|e| {
                    format!("[redact] patterns: {p:?} is not a regular expression ({e})")
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Policy {
            names: config.names.clone(),
            allow: config.allow.clone(),
            patterns,
            recent: None,
        })
    }

    /// This policy, remembering the last few environments it redacted: for a long-lived writer
    /// (the resident recorder) that sees the same environment twice per job (its running row,
    /// then its record) and from every run of one shell. Redacting ~40 variables is ~0.04 ms;
    /// comparing them with one remembered is ~1 µs. Redaction is a function of the rules and the
    /// environment alone, so a remembered answer is the answer.
    pub fn remembering(mut self) -> Policy {
        self.recent = Some(Default::default());
        self
    }

    /// The rules for the store whose config file is `config` (`.roar/config.toml`): its
    /// `[redact]` section when it has a valid one, the built-in rules otherwise (the CLI reports
    /// an invalid config before any job is recorded).
    pub fn for_config(config: &Path) -> Policy {
        let Ok(text) = std::fs::read_to_string(config) else {
            return Policy::builtin();
        };
        let section = toml::from_str::<ConfigFile>(&text)
            .ok()
            .and_then(|c| c.redact)
            .and_then(|v| v.try_into::<RedactConfig>().ok());
        match section.map(|c| Policy::new(&c)) {
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                tracing::warn!(
                    "{}: {e}; using the built-in redaction rules",
                    config.display()
                );
                Policy::builtin()
            }
            None => Policy::builtin(),
        }
    }

    /// Whether a value under `name` is a secret, whatever it looks like.
    pub fn is_secret(&self, name: &str, kind: NameKind) -> bool {
        let bare = name.trim_start_matches('-');
        if self.allow.iter().any(|g| names::glob_match(g, bare)) {
            return false;
        }
        self.names.iter().any(|g| names::glob_match(g, bare)) || names::builtin_secret(bare, kind)
    }

    /// `s` with every secret the value rules find redacted, or None when it holds none.
    pub fn scrub(&self, s: &str) -> Option<String> {
        args::text(self, s)
    }

    /// Redacts an argv in place; returns how many arguments changed.
    pub fn argv(&self, argv: &mut [OsString]) -> usize {
        let text: Vec<String> = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let mut changed = 0;
        for (a, new) in argv.iter_mut().zip(args::argv(self, &text)) {
            if let Some(new) = new.filter(|n| a.as_encoded_bytes() != n.as_bytes()) {
                *a = new.into();
                changed += 1;
            }
        }
        changed
    }

    /// Redacts an environment in place: a secret name hides the whole value, any other value is
    /// scrubbed. Returns how many values changed.
    pub fn env(&self, env: &mut BTreeMap<String, String>) -> usize {
        let Some(recent) = &self.recent else {
            return self.redact_env(env);
        };
        let lock = || recent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, redacted, changed)) = lock().iter().find(|(given, ..)| given == env) {
            env.clone_from(redacted);
            return *changed;
        }
        let given = env.clone();
        let changed = self.redact_env(env);
        let mut recent = lock();
        if recent.len() == RECENT_ENVS {
            recent.remove(0);
        }
        recent.push((given, env.clone(), changed));
        changed
    }

    fn redact_env(&self, env: &mut BTreeMap<String, String>) -> usize {
        let mut changed = 0;
        for (k, v) in env.iter_mut() {
            let new = if self.is_secret(k, NameKind::Env) || values::generated(v) {
                (!redacted_already(v)).then(|| REDACTED.to_owned())
            } else {
                self.env_value(k, v)
            };
            if let Some(new) = new {
                *v = new;
                changed += 1;
            }
        }
        changed
    }

    /// A variable's value with what the value rules find in `NAME=value` redacted: the rules
    /// that need a keyword before the secret (`TWILIO_SID=...`) see the name too.
    fn env_value(&self, name: &str, value: &str) -> Option<String> {
        let line = format!("{name}={value}");
        let scrubbed = values::scrub(&line, self)?;
        Some(match scrubbed.strip_prefix(&line[..name.len() + 1]) {
            Some(rest) => rest.to_owned(),
            // A rule took part of the name with the value: the whole value goes.
            None => REDACTED.to_owned(),
        })
    }

    /// Whether a patch (`git diff --binary`) adds a line holding a secret. Only added lines
    /// count (removed and context lines are already in the repository's history); binary
    /// patches are encoded data, not text to scan.
    pub fn patch_has_secret(&self, patch: &[u8]) -> bool {
        let mut binary = false;
        for line in patch.split(|b| *b == b'\n') {
            if line.starts_with(b"diff --git ") {
                binary = false;
            } else if line == b"GIT binary patch" {
                binary = true;
            } else if !binary
                && line.starts_with(b"+")
                && !line.starts_with(b"+++ ")
                && self.scrub(&String::from_utf8_lossy(&line[1..])).is_some()
            {
                return true;
            }
        }
        false
    }

    /// Everything of a job that may hold a secret: its name, argv, every process's and step's
    /// argv, its environment, its git remote, and its dirty tree's diff (not kept when an added
    /// line holds a secret: a redacted patch would no longer apply). Paths are not: they name the
    /// files the lineage is about.
    pub fn job(&self, job: &mut JobRecord) -> usize {
        let mut changed = self.argv(&mut job.argv) + self.env(&mut job.env);
        for p in &mut job.processes {
            changed += self.argv(&mut p.argv);
        }
        for s in &mut job.steps {
            changed += self.argv(&mut s.argv);
        }
        if let Some(new) = job.name.as_deref().and_then(|n| self.scrub(n)) {
            job.name = Some(new);
            changed += 1;
        }
        if let Some(git) = job.git.as_mut() {
            if let Some(new) = git.remote.as_deref().and_then(|r| self.scrub(r)) {
                git.remote = Some(new);
                changed += 1;
            }
        }
        if let Some(env) = job.environment.as_mut() {
            if env
                .diff
                .as_deref()
                .is_some_and(|d| self.patch_has_secret(d))
            {
                env.diff = None;
                if let Some(git) = job.git.as_mut() {
                    git.diff = None;
                }
                changed += 1;
            }
        }
        changed
    }
}

/// A value that is nothing but what redaction writes (`<redacted>`, or a redacted PEM block's
/// `<redacted>` and newline): redacting it again changes nothing, and an audit finds nothing.
fn redacted_already(v: &str) -> bool {
    !v.trim().is_empty() && v.split(REDACTED).all(|rest| rest.trim().is_empty())
}

/// The environment as it is handed to the writer (which redacts it): without roar's own
/// variables and noise.
pub fn collect_env(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> BTreeMap<String, String> {
    vars.into_iter()
        .filter_map(|(k, v)| {
            let k = k.to_string_lossy().into_owned();
            if DROPPED.contains(&k.as_str()) || k.starts_with("ROAR_INTERNAL_") {
                return None;
            }
            Some((k, v.to_string_lossy().into_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A remembering policy answers every environment as a fresh one does: repeated ones from
    /// what it remembers, others (more than it keeps, and ones differing in one value) anew.
    #[test]
    fn a_remembering_policy_redacts_as_a_fresh_one() {
        let config = RedactConfig {
            names: vec!["LAB_*".into()],
            ..Default::default()
        };
        let fresh = Policy::new(&config).unwrap();
        let remembering = Policy::new(&config).unwrap().remembering();
        let env = |i: usize, token: &str| -> BTreeMap<String, String> {
            [
                ("HOME", "/root".to_owned()),
                ("PATH", format!("/opt/{i}/bin:/usr/bin")),
                ("LAB_CODE", "plain".to_owned()),
                (
                    "GITHUB_TOKEN",
                    "ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5".to_owned(),
                ),
                ("DATABASE_URL", format!("postgres://u:{token}@db/x")),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
        };
        let order = [0, 1, 0, 2, 3, 4, 5, 0, 5, 5, 1];
        for (round, i) in order.into_iter().enumerate() {
            for token in ["hunter2hunter2", "s3cr3tpassw0rd"] {
                let (mut a, mut b) = (env(i, token), env(i, token));
                let changed = (fresh.env(&mut a), remembering.env(&mut b));
                assert_eq!(changed.0, changed.1, "round {round}: env {i}");
                assert_eq!(a, b, "round {round}: env {i}");
                assert_eq!(b["LAB_CODE"], REDACTED);
                assert!(!b["DATABASE_URL"].contains(token), "{b:?}");
            }
        }
        let kept = remembering.recent.as_ref().unwrap().lock().unwrap().len();
        assert_eq!(kept, RECENT_ENVS);
    }

    #[test]
    fn patches_are_scanned_in_their_added_text_lines_only() {
        let p = Policy::builtin();
        let diff =
            |body: &str| format!("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n{body}");
        assert!(!p.patch_has_secret(diff("-lr = 0.1\n+lr = 0.01\n").as_bytes()));
        assert!(p.patch_has_secret(
            diff("+token = \"ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5\"\n").as_bytes()
        ));
        // Removed or context lines are in the history already.
        assert!(!p.patch_has_secret(
            diff("-password=hunter2hunter2\n+password_file=/run/x\n").as_bytes()
        ));
        // Base85 data of a binary patch is not text.
        let binary =
            "diff --git a/w.bin b/w.bin\nGIT binary patch\nliteral 7\nOcmZQzVDN(HU;qFB\n\n";
        assert!(!p.patch_has_secret(binary.as_bytes()));
        // Text after a binary patch is scanned again.
        let both = format!(
            "{binary}{}",
            diff("+api_key = \"q8F3zT0bLx9vYp2RkWm4sNd7JhGc1Ae5\"\n")
        );
        assert!(p.patch_has_secret(both.as_bytes()));
    }

    #[test]
    fn credentials_are_redacted_and_harmless_names_kept() {
        let mut env = collect_env(
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
                ("X", "ghp_R2d2C3poAbCdEfGhIjKlMnOpQrStUvWx1234"),
                ("Y", "hello"),
            ]
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        Policy::builtin().env(&mut env);
        for k in [
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ACCESS_KEY_ID",
            "AWS_SESSION_TOKEN",
            "GITHUB_TOKEN",
            "DB_PASSWORD",
            "OPENAI_API_KEY",
            "X",
        ] {
            assert_eq!(env[k], REDACTED, "{k}");
        }
        assert_eq!(env["SSH_AUTH_SOCK"], "/tmp/agent");
        assert_eq!(env["AWS_REGION"], "eu-west-1");
        assert_eq!(env["HOME"], "/root");
        assert_eq!(env["Y"], "hello");
        assert_eq!(env["DATABASE_URL"], "postgres://me:<redacted>@db:5432/x");
        assert!(!env.contains_key("LS_COLORS"));
    }

    #[test]
    fn the_config_adds_and_allows() {
        let p = Policy::new(&RedactConfig {
            names: vec!["LICENSE_*".into(), "seed".into()],
            allow: vec!["MY_TOKEN_COUNT".into()],
            patterns: vec!["corp-[0-9a-f]{8}".into()],
        })
        .unwrap();
        let mut env: BTreeMap<String, String> = [
            ("LICENSE_CODE", "x1"),
            ("MY_TOKEN_COUNT", "12"),
            ("NOTE", "uses corp-deadbeef here"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
        p.env(&mut env);
        assert_eq!(env["LICENSE_CODE"], REDACTED);
        assert_eq!(env["MY_TOKEN_COUNT"], "12");
        assert_eq!(env["NOTE"], "uses <redacted> here");
        let mut argv: Vec<OsString> = ["app", "--seed", "7"].map(OsString::from).into();
        p.argv(&mut argv);
        assert_eq!(argv[2], REDACTED);
        assert!(Policy::new(&RedactConfig {
            patterns: vec!["(".into()],
            ..Default::default()
        })
        .unwrap_err()
        .contains("not a regular expression"));
    }

    #[test]
    fn redaction_is_idempotent() {
        let p = Policy::builtin();
        let mut argv: Vec<OsString> = ["app", "--password", "pw", "https://u:p@h/", "-pX"]
            .map(OsString::from)
            .into();
        p.argv(&mut argv);
        let once = argv.clone();
        assert_eq!(p.argv(&mut argv), 0, "{argv:?}");
        assert_eq!(argv, once);
    }
}
