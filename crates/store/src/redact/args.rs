//! Secrets in a command line: options whose name says secret (`--password X`, `--token=X`,
//! `-storepass X`), the password options of well-known tools (`mysql -pX`, `sshpass -p X`,
//! `curl -u user:X`), and — in every argument, and in every word of an argument that is itself a
//! command line (`sh -c '...'`) — whatever [`super::values`] finds.

use std::ops::Range;

use super::names::{reference, weak_secret, NameKind};
use super::values::{generated, high_entropy};
use super::{Policy, REDACTED};

/// How a tool's short option carries a password.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Carries {
    /// Only attached (`mysql -pX`; a bare `-p` prompts).
    Attached,
    /// Attached or in the next argument.
    Either,
    /// `user:password` (or `user%password`), attached or next: only the password goes.
    UserPass(char),
    /// Only in the next argument, after the flag exactly (`openssl enc -k PW`; `-kfile` names a
    /// file).
    Next,
}

/// (tools, short option, how) for the tools that take passwords on the command line.
const SHORT_OPTIONS: &[(&[&str], &str, Carries)] = &[
    (
        &[
            "mysql",
            "mysqldump",
            "mysqladmin",
            "mysqlimport",
            "mysqlshow",
            "mysqlcheck",
            "mysqlpump",
            "mysqlslap",
            "mariadb",
            "mariadb-dump",
            "mariadb-admin",
            "7z",
            "7za",
            "7zr",
        ],
        "-p",
        Carries::Attached,
    ),
    (
        &[
            "sshpass",
            "mongo",
            "mongosh",
            "mongodump",
            "mongorestore",
            "mongoexport",
            "mongoimport",
        ],
        "-p",
        Carries::Either,
    ),
    (
        &["zip", "unzip", "zipcloak", "sqlcmd", "bcp"],
        "-P",
        Carries::Either,
    ),
    (&["redis-cli"], "-a", Carries::Either),
    (&["openssl"], "-k", Carries::Next),
    // New and old passphrase.
    (&["ssh-keygen"], "-N", Carries::Either),
    (&["ssh-keygen"], "-P", Carries::Either),
    (
        &[
            "ldapsearch",
            "ldapadd",
            "ldapmodify",
            "ldapdelete",
            "ldapmodrdn",
            "ldapcompare",
            "ldapwhoami",
            "ldappasswd",
            "ldapexop",
        ],
        "-w",
        Carries::Either,
    ),
    // ldappasswd's new and old password.
    (&["ldappasswd"], "-s", Carries::Either),
    (&["ldappasswd"], "-a", Carries::Either),
    (
        &["mosquitto_pub", "mosquitto_sub", "mosquitto_rr"],
        "-P",
        Carries::Either,
    ),
    // An encrypted password, still a credential to crack.
    (&["useradd", "usermod"], "-p", Carries::Either),
    (&["rabbitmqadmin"], "-p", Carries::Either),
    (&["unrar", "rar"], "-p", Carries::Attached),
    (&["curl"], "-u", Carries::UserPass(':')),
    (&["curl"], "-U", Carries::UserPass(':')),
    (&["smbclient", "rpcclient"], "-U", Carries::UserPass('%')),
    (
        &["docker", "podman", "buildah", "skopeo", "helm", "oras"],
        "-p",
        Carries::Either,
    ),
];

/// Long options holding `user:password`.
const USER_PASS_OPTIONS: &[&str] = &["user", "proxy-user", "creds", "src-creds", "dest-creds"];

/// Single-dash long options of Java and OpenSSL tools that take passwords.
const DASH_PASSWORDS: &[&str] = &[
    "pass",
    "passin",
    "passout",
    "storepass",
    "keypass",
    "srcstorepass",
    "deststorepass",
    "srckeypass",
    "destkeypass",
];

/// Words that end one command inside a shell string.
fn separator(w: &str) -> bool {
    matches!(w, ";" | "&&" | "||" | "|" | "&") || w.ends_with(';')
}

fn basename(w: &str) -> &str {
    w.rsplit('/').next().unwrap_or(w)
}

/// The known tools named earlier in the command that `words[i]` belongs to.
fn tools_before<'a>(words: &'a [&'a str], i: usize) -> impl Iterator<Item = &'a str> + 'a {
    let start = words[..i]
        .iter()
        .rposition(|w| separator(w))
        .map_or(0, |p| p + 1);
    words[start..i].iter().map(|w| basename(w))
}

fn short_rule(words: &[&str], i: usize) -> Option<(&'static str, Carries)> {
    let w = words[i];
    for tool in tools_before(words, i) {
        for (tools, flag, how) in SHORT_OPTIONS {
            let flag_fits = if *how == Carries::Next {
                w == *flag
            } else {
                w.starts_with(flag)
            };
            if tools.contains(&tool) && flag_fits {
                let docker_like =
                    matches!(*flag, "-p") && *how == Carries::Either && tools.contains(&"docker");
                // `docker run -p 8080:80` publishes a port; only `docker login -p` is a password.
                if docker_like && !words[..i].contains(&"login") {
                    continue;
                }
                return Some((flag, *how));
            }
        }
    }
    None
}

/// Looks like the next option rather than a value: `--x`, or a single short flag `-v`.
fn option_like(w: &str) -> bool {
    w.starts_with("--") || (w.len() == 2 && w.starts_with('-') && w != "--")
}

fn user_pass(value: &str, sep: char) -> Option<String> {
    let (user, pass) = value.split_once(sep)?;
    (!pass.is_empty()).then(|| format!("{user}{sep}{REDACTED}"))
}

/// Replacement for each word the option rules redact (None: left to the value rules).
fn option_rules(policy: &Policy, words: &[&str]) -> Vec<Option<String>> {
    let mut out: Vec<Option<String>> = vec![None; words.len()];
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        // How the argument after this one is treated.
        let mut next: Option<Option<char>> = None;
        if let Some(opt) = w.strip_prefix("--").filter(|o| !o.is_empty()) {
            match opt.split_once('=') {
                Some((name, value)) if !value.is_empty() => {
                    if USER_PASS_OPTIONS.contains(&name) {
                        out[i] = user_pass(value, ':').map(|v| format!("--{name}={v}"));
                    } else if policy.is_secret(name, NameKind::Option)
                        || (weak_secret(name) && high_entropy(value))
                        || (!reference(name) && generated(value))
                    {
                        out[i] = Some(format!("--{name}={REDACTED}"));
                    }
                }
                Some(_) => {}
                None if USER_PASS_OPTIONS.contains(&opt) => next = Some(Some(':')),
                None if policy.is_secret(opt, NameKind::Option) => next = Some(None),
                None if weak_secret(opt) && words.get(i + 1).is_some_and(|v| high_entropy(v)) => {
                    next = Some(None)
                }
                // Whatever the option, a value that looks generated (`--cfg-x <AWS secret>`).
                None if !reference(opt) && words.get(i + 1).is_some_and(|v| generated(v)) => {
                    next = Some(None)
                }
                None => {}
            }
        } else if w.len() > 1 && w.starts_with('-') {
            if let Some((flag, how)) = short_rule(words, i) {
                let attached = &w[flag.len()..];
                match how {
                    _ if attached.is_empty() && how != Carries::Attached => {
                        next = Some(match how {
                            Carries::UserPass(sep) => Some(sep),
                            _ => None,
                        });
                    }
                    _ if attached.is_empty() => {}
                    Carries::UserPass(sep) => {
                        out[i] = user_pass(attached, sep).map(|v| format!("{flag}{v}"));
                    }
                    _ => out[i] = Some(format!("{flag}{REDACTED}")),
                }
            } else {
                let opt = &w[1..];
                let (name, value) = opt.split_once('=').unwrap_or((opt, ""));
                // Not split at case changes: `-pPW` is a cluster of short options, not "p PW".
                let lower = name.to_ascii_lowercase();
                let secret = name.len() > 1
                    && (DASH_PASSWORDS.contains(&lower.as_str())
                        || policy.is_secret(&lower, NameKind::Option));
                if secret && !value.is_empty() {
                    out[i] = Some(format!("-{name}={REDACTED}"));
                } else if secret {
                    next = Some(None);
                }
            }
        } else if w.len() > "pass:".len() && w.starts_with("pass:") {
            // OpenSSL's `pass:PASSWORD` (env:, file: and fd: name where it is).
            out[i] = Some(format!("pass:{REDACTED}"));
        } else if w == "set" && i + 2 < words.len() && policy.is_secret(words[i + 1], NameKind::Env)
        {
            // `aws configure set aws_secret_access_key X`, `git config set`-like forms.
            out[i + 2] = Some(REDACTED.to_owned());
            i += 3;
            continue;
        }
        if let Some(sep) = next {
            if let Some(v) = words.get(i + 1).filter(|v| !option_like(v)) {
                out[i + 1] = Some(match sep {
                    Some(sep) => user_pass(v, sep).unwrap_or_else(|| (*v).to_owned()),
                    None => REDACTED.to_owned(),
                });
                i += 2;
                continue;
            }
        }
        i += 1;
    }
    positional_rules(words, &mut out);
    out
}

/// The words of the command `words[i]` is the program of, up to the next separator.
fn command_at<'a>(words: &'a [&'a str], i: usize) -> Range<usize> {
    let end = words[i..]
        .iter()
        .position(|w| separator(w))
        .map_or(words.len(), |p| i + p);
    i + 1..end
}

/// Secrets that are positional arguments of well-known tools: `htpasswd -b FILE USER PW` (and
/// `-nb USER PW`: the last argument), `vault login TOKEN`, `sqlplus USER/PW@DB`; and any bare
/// argument of 32+ characters that looks generated — even one that starts with dashes, as
/// URL-safe base64 can (`--AN0-hQzN1a...`): no option's name looks generated (an option with a
/// value, `--name=VALUE`, is the option rules' to judge).
fn positional_rules(words: &[&str], out: &mut [Option<String>]) {
    for (i, w) in words.iter().enumerate() {
        let args = command_at(words, i);
        match basename(w) {
            "htpasswd" => {
                let batch = words[args.clone()]
                    .iter()
                    .any(|a| a.starts_with('-') && !a.starts_with("--") && a.contains('b'));
                if batch && args.len() >= 2 {
                    out[args.end - 1] = Some(REDACTED.to_owned());
                }
            }
            "vault" if words.get(i + 1) == Some(&"login") => {
                if let Some(t) = (i + 2..args.end).find(|j| !words[*j].starts_with('-')) {
                    if !words[t].contains('=') {
                        out[t] = Some(REDACTED.to_owned());
                    }
                }
            }
            "sqlplus" | "sqlldr" | "expdp" | "impdp" | "exp" | "imp" => {
                for j in args.clone() {
                    let a = words[j].split_once('/').filter(|(u, _)| {
                        !u.is_empty()
                            && u.bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b"_$#.".contains(&b))
                    });
                    if let Some((user, rest)) = a {
                        let (pass, db) = rest.split_once('@').map_or((rest, ""), |(p, d)| (p, d));
                        if !pass.is_empty() && !rest.starts_with('/') {
                            let db = if db.is_empty() {
                                String::new()
                            } else {
                                format!("@{db}")
                            };
                            out[j] = Some(format!("{user}/{REDACTED}{db}"));
                        }
                    }
                }
            }
            _ => {}
        }
        // The value of an option naming where a value is (`--version-id X`); not the word after
        // `--name=VALUE`, which has its value already (and whose value's last letters may spell
        // `Id` by chance).
        let of_reference = i > 0
            && words[i - 1]
                .strip_prefix("--")
                .is_some_and(|o| !o.contains('=') && reference(o));
        if out[i].is_none()
            && !(w.starts_with("--") && w.contains('='))
            && !of_reference
            && w.len() >= 32
            && generated(w)
        {
            out[i] = Some(REDACTED.to_owned());
        }
    }
}

/// Whitespace-separated words of `s`, as byte ranges.
fn word_spans(s: &str) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut start = None;
    for (i, c) in s.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(st)) => {
                spans.push(st..i);
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(st) = start {
        spans.push(st..s.len());
    }
    spans
}

/// One argument (or any text that may hold a command line): the option rules over its words,
/// then the value rules over the result. None when nothing is secret.
pub(super) fn text(policy: &Policy, s: &str) -> Option<String> {
    let spans = word_spans(s);
    let mut current = None;
    if spans.len() > 1 {
        let words: Vec<&str> = spans.iter().map(|r| &s[r.clone()]).collect();
        let repl = option_rules(policy, &words);
        if repl.iter().any(Option::is_some) {
            let mut out = String::with_capacity(s.len());
            let mut at = 0;
            for (r, new) in spans.iter().zip(repl) {
                if let Some(new) = new {
                    out.push_str(&s[at..r.start]);
                    out.push_str(&new);
                    at = r.end;
                }
            }
            out.push_str(&s[at..]);
            current = Some(out);
        }
    }
    let base = current.as_deref().unwrap_or(s);
    match super::values::scrub(base, policy) {
        Some(v) => Some(v),
        None => current,
    }
}

/// A whole argv: the option rules over the arguments, then [`text`] over each one.
pub(super) fn argv(policy: &Policy, args: &[String]) -> Vec<Option<String>> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut out = option_rules(policy, &words);
    for (i, a) in args.iter().enumerate() {
        let base = out[i].clone();
        let redacted = text(policy, base.as_deref().unwrap_or(a));
        if redacted.is_some() {
            out[i] = redacted;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn red(args: &[&str]) -> Vec<String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        argv(&Policy::builtin(), &args)
            .into_iter()
            .zip(&args)
            .map(|(r, a)| r.unwrap_or_else(|| a.clone()))
            .collect()
    }

    #[test]
    fn secret_options_in_every_form() {
        assert_eq!(
            red(&["app", "--password", "hunter2"]),
            ["app", "--password", REDACTED]
        );
        assert_eq!(red(&["app", "--token=abc"]), ["app", "--token=<redacted>"]);
        assert_eq!(
            red(&["app", "--api-key", "k", "--key", "data/x.csv"]),
            ["app", "--api-key", REDACTED, "--key", "data/x.csv"]
        );
        assert_eq!(
            red(&["app", "--key", "q8F3zT0bLx9vYp2RkWm4sNd7JhGc1Ae5"]),
            ["app", "--key", REDACTED]
        );
        assert_eq!(
            red(&[
                "app",
                "--hmac-salt=9b74c9897bac770ffc029102a200c5de5d5b7e3f"
            ]),
            ["app", "--hmac-salt=<redacted>"]
        );
        assert_eq!(
            red(&["mysql", "-u", "root", "-pPW", "db"]),
            ["mysql", "-u", "root", "-p<redacted>", "db"]
        );
        assert_eq!(red(&["mysql", "-p", "db"]), ["mysql", "-p", "db"]);
        assert_eq!(
            red(&["sshpass", "-p", "PW", "ssh", "h"]),
            ["sshpass", "-p", REDACTED, "ssh", "h"]
        );
        assert_eq!(
            red(&["curl", "-u", "me:pw", "https://h/"]),
            ["curl", "-u", "me:<redacted>", "https://h/"]
        );
        assert_eq!(
            red(&["curl", "-H", "Authorization: Bearer xyz"]),
            ["curl", "-H", "Authorization: Bearer <redacted>"]
        );
        assert_eq!(
            red(&["keytool", "-storepass", "changeit"]),
            ["keytool", "-storepass", REDACTED]
        );
        assert_eq!(
            red(&["java", "-Ddb.password=pw", "-jar", "x.jar"]),
            ["java", "-Ddb.password=<redacted>", "-jar", "x.jar"]
        );
        assert_eq!(red(&["tool", "-pPW", "next"]), ["tool", "-pPW", "next"]);
        assert_eq!(
            red(&["openssl", "enc", "-pass", "pass:pw"]),
            ["openssl", "enc", "-pass", REDACTED]
        );
        assert_eq!(
            red(&["env", "AWS_SECRET_ACCESS_KEY=abc", "cmd"]),
            ["env", "AWS_SECRET_ACCESS_KEY=<redacted>", "cmd"]
        );
        assert_eq!(
            red(&["aws", "configure", "set", "aws_secret_access_key", "abc"]),
            ["aws", "configure", "set", "aws_secret_access_key", REDACTED]
        );
        assert_eq!(
            red(&["docker", "run", "-p", "8080:80", "img"]),
            ["docker", "run", "-p", "8080:80", "img"]
        );
        assert_eq!(
            red(&["docker", "login", "-p", "pw", "reg"]),
            ["docker", "login", "-p", REDACTED, "reg"]
        );
    }

    #[test]
    fn positional_secrets_of_well_known_tools() {
        let aws = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq3m8Pq2Lk";
        for (args, want) in [
            (
                &["openssl", "enc", "-k", "pw", "-in", "a"][..],
                &["openssl", "enc", "-k", REDACTED, "-in", "a"][..],
            ),
            (
                &["openssl", "enc", "-kfile", "k.txt"],
                &["openssl", "enc", "-kfile", "k.txt"],
            ),
            (
                &["ssh-keygen", "-N", "pw", "-f", "k"],
                &["ssh-keygen", "-N", REDACTED, "-f", "k"],
            ),
            (
                &["htpasswd", "-b", "f", "u", "pw"],
                &["htpasswd", "-b", "f", "u", REDACTED],
            ),
            (
                &["htpasswd", "-nbB", "u", "pw"],
                &["htpasswd", "-nbB", "u", REDACTED],
            ),
            (&["htpasswd", "-c", "f", "u"], &["htpasswd", "-c", "f", "u"]),
            (
                &["ldapsearch", "-x", "-w", "pw"],
                &["ldapsearch", "-x", "-w", REDACTED],
            ),
            (&["vault", "login", "tok"], &["vault", "login", REDACTED]),
            (
                &["vault", "login", "-method=userpass", "username=me"],
                &["vault", "login", "-method=userpass", "username=me"],
            ),
            (
                &["sqlplus", "scott/tiger@orcl", "@/x/y.sql"],
                &["sqlplus", "scott/<redacted>@orcl", "@/x/y.sql"],
            ),
            (&["app", "--cfg", aws], &["app", "--cfg", REDACTED]),
            (&["app", aws, "x"], &["app", REDACTED, "x"]),
            (
                &["app", "data/train-0001.parquet", "HelloWorld2024ProjectRun"],
                &["app", "data/train-0001.parquet", "HelloWorld2024ProjectRun"],
            ),
            (&["app", "--version-id", aws], &["app", "--version-id", aws]),
        ] {
            assert_eq!(red(args), want, "{args:?}");
        }
        let long = "Zq8F3zT0bLx9vYp2RkWm4sNd7JhGc1Ae5Uo6Ii";
        assert_eq!(red(&["app", long]), ["app", REDACTED]);
        // URL-safe base64 may begin with dashes; an option's name is never generated.
        let dashed = "--AN0-hQzN1aXXwnzYHAXGytQofYjuQm";
        assert_eq!(red(&["app", "--cfg", dashed]), ["app", "--cfg", REDACTED]);
        let after_pair = ["app", "--endpoint-cfg=sq0atp-x0Rm3vQ_p7LkId", long];
        assert_eq!(red(&after_pair)[2], REDACTED);
        let named = ["app", "--enable-experimental-feature-XYZ-2024", "--fp16"];
        assert_eq!(red(&named), named);
    }

    #[test]
    fn switches_and_references_keep_their_neighbours() {
        for args in [
            &["docker", "login", "--password-stdin", "reg"][..],
            &["app", "--token-file", "tok.txt"],
            &["app", "--no-password", "x"],
            &["app", "--password", "--verbose"],
            &["python", "train.py", "--lr", "0.1", "--max-tokens", "512"],
        ] {
            assert_eq!(red(args), args);
        }
    }

    #[test]
    fn command_lines_inside_arguments() {
        assert_eq!(
            red(&[
                "sh",
                "-c",
                "mysql -u root -phunter2 db && app --password  pw2 | tee x"
            ]),
            [
                "sh",
                "-c",
                "mysql -u root -p<redacted> db && app --password  <redacted> | tee x"
            ]
        );
    }
}
