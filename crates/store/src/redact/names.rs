//! Which names say their value is a secret: environment variables, command-line options and the
//! `name=value` pairs inside strings (DSNs, connection strings, query strings, headers).
//!
//! Names are split into words (`_`, `-`, `.`, camelCase: `AccountKey` is ACCOUNT KEY). A few
//! words are secret wherever they appear inside a word (PASSWORD, SECRET, TOKEN, ...); short
//! ambiguous ones count only as whole words, and for options only in the compounds that mean a
//! credential (`--api-key` is, `--key` is an S3 key or a sort key and is not).

/// Secret as any part of a word: `DBPASSWORD`, `MYSECRET`, `X_AUTHTOKEN`.
const STRONG: &[&str] = &[
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "SECRET",
    "TOKEN",
    "CREDENTIAL",
    "APIKEY",
    "COOKIE",
];

/// Words that contain a strong word and mean something else.
const NOT_STRONG: &[&str] = &["TOKENIZER", "TOKENIZERS", "TOKENIZE", "TOKENIZED", "TOKENS"];

/// Secret as whole words of a variable or pair name (`FOO_KEY`, `AccountKey`, `Pwd`).
const ENV_WORDS: &[&str] = &[
    "KEY",
    "AUTH",
    "AUTHORIZATION",
    "PRIVATE",
    "SESSION",
    "PASS",
    "PW",
    "PWD",
    "SIG",
    "SIGNATURE",
    "SAS",
    "CREDS",
];

/// Secret as whole words of an option name (`--pass`, `--auth`, `--sig`).
const OPTION_WORDS: &[&str] = &[
    "PASS",
    "PW",
    "PWD",
    "AUTH",
    "AUTHORIZATION",
    "SIG",
    "SIGNATURE",
    "SAS",
    "CREDS",
];

/// `KEY` is secret in an option name only after one of these (`--api-key`, `--account-key`).
const KEY_QUALIFIERS: &[&str] = &[
    "API",
    "ACCESS",
    "SECRET",
    "ACCOUNT",
    "PRIVATE",
    "SIGNING",
    "ENCRYPTION",
    "MASTER",
    "LICENSE",
    "AUTH",
    "SHARED",
    "APP",
    "CLIENT",
    "SERVICE",
    "STORAGE",
    "SUBSCRIPTION",
];

/// An option whose last word is one of these names where a secret is, not the secret:
/// `--token-file`, `--password-stdin`, `--secret-id`.
const REFERENCE_WORDS: &[&str] = &[
    "FILE",
    "PATH",
    "DIR",
    "ENV",
    "VAR",
    "NAME",
    "ID",
    "PROMPT",
    "STDIN",
    "FD",
    "HELPER",
    "COMMAND",
    "CMD",
    "TYPE",
    "LENGTH",
    "LEN",
    "URL",
    "URI",
    "ENDPOINT",
    "MODE",
    "POLICY",
    "COUNT",
    "SIZE",
    "TTL",
    "EXPIRY",
    "EXPIRES",
    "LIFETIME",
    "TIMEOUT",
    "REGION",
    "ALGORITHM",
    "HEADER",
    "LIMIT",
];

/// The last word of a variable (or pair) name that says it holds where a secret is or a measure
/// of one: `SSL_KEY_PATH`, `TOKEN_COUNT`, `SESSION_TIMEOUT`. Narrower than [`REFERENCE_WORDS`]:
/// `VAULT_SECRET_ID` and `AUTH_HEADER` hold credentials.
const ENV_REFERENCE_WORDS: &[&str] = &[
    "FILE",
    "PATH",
    "DIR",
    "COUNT",
    "LEN",
    "LENGTH",
    "SIZE",
    "LIMIT",
    "TTL",
    "TIMEOUT",
    "EXPIRY",
    "EXPIRES",
    "LIFETIME",
    "TYPE",
    "MODE",
    "ALGORITHM",
    "REGION",
    "MAX",
    "MIN",
    "NAME",
    "POLICY",
    "ENDPOINT",
    "ARN",
    "HOST",
    "PORT",
    "USER",
    "USERNAME",
    "EMAIL",
    "VERSION",
    "ENABLED",
    "REQUIRED",
    "FORMAT",
    "PROVIDER",
    "BACKEND",
    "SCOPE",
    "SCOPES",
];

/// An option that starts with one of these is a switch about a secret, not one that takes it:
/// `--no-password`, `--ask-pass`.
const SWITCH_WORDS: &[&str] = &[
    "NO", "ASK", "PROMPT", "SKIP", "REQUIRE", "SHOW", "ENABLE", "DISABLE", "GENERATE", "PRINT",
    "LIST", "USE", "ALLOW",
];

/// Variables whose names match a secret word but hold no secret.
const HARMLESS_ENV: &[&str] = &[
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
    "PWD",
    "OLDPWD",
    "TOKENIZERS_PARALLELISM",
];

/// Where a name was found: the rules for options are narrower (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// An environment variable or a `name=value` pair inside a string.
    Env,
    /// A command-line option, without its dashes.
    Option,
}

/// The upper-cased words of a name: split on anything not alphanumeric and where a lower-case
/// letter is followed by an upper-case one.
pub fn words(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if !c.is_ascii_alphanumeric() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            prev_lower = false;
            continue;
        }
        if c.is_ascii_uppercase() && prev_lower && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        cur.push(c.to_ascii_uppercase());
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn strong(word: &str) -> bool {
    !NOT_STRONG.contains(&word) && STRONG.iter().any(|s| word.contains(s))
}

/// Whether the built-in rules say `name` holds a secret.
pub fn builtin_secret(name: &str, kind: NameKind) -> bool {
    let words = words(name);
    match kind {
        NameKind::Env => {
            // Exact: variables are case-sensitive, and `Pwd=` in a connection string is a password.
            if HARMLESS_ENV.contains(&name) {
                return false;
            }
            // `AWS_SHARED_CREDENTIALS_FILE`, `SSL_KEY_PATH`: where a secret is, not the secret;
            // `TOKEN_COUNT`, `SESSION_TIMEOUT`: a measure of one.
            if words.len() > 1
                && words
                    .last()
                    .is_some_and(|w| ENV_REFERENCE_WORDS.contains(&w.as_str()))
            {
                return false;
            }
            words
                .iter()
                .any(|w| strong(w) || ENV_WORDS.contains(&w.as_str()))
        }
        NameKind::Option => {
            let (Some(first), Some(last)) = (words.first(), words.last()) else {
                return false;
            };
            if words.len() > 1
                && (REFERENCE_WORDS.contains(&last.as_str())
                    || SWITCH_WORDS.contains(&first.as_str()))
            {
                return false;
            }
            words.iter().enumerate().any(|(i, w)| {
                strong(w)
                    || OPTION_WORDS.contains(&w.as_str())
                    || (w == "KEY" && i > 0 && KEY_QUALIFIERS.contains(&words[i - 1].as_str()))
            })
        }
    }
}

/// Whether option `name` names where a value is, not a value (`--token-file`, `--version-id`):
/// its value is never taken for a secret by its looks.
pub fn reference(name: &str) -> bool {
    words(name)
        .last()
        .is_some_and(|w| REFERENCE_WORDS.contains(&w.as_str()) || w == "HASH" || w == "DIGEST")
}

/// Names that hold a secret only sometimes (`--key` is an S3 key or an API key): their value is
/// redacted when it looks generated ([`super::values::high_entropy`]).
pub fn weak_secret(name: &str) -> bool {
    words(name)
        .iter()
        .any(|w| matches!(w.as_str(), "KEY" | "HMAC" | "SALT" | "NONCE"))
}

/// `*` matches any run of characters; everything else matches itself, ignoring ASCII case.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ni < n.len() {
        if pi < p.len() && p[pi] != b'*' && p[pi].eq_ignore_ascii_case(&n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|b| *b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_on_separators_and_camel_case() {
        assert_eq!(words("AccountKey"), ["ACCOUNT", "KEY"]);
        assert_eq!(words("--api-key"), ["API", "KEY"]);
        assert_eq!(
            words("AWS_SECRET_ACCESS_KEY"),
            ["AWS", "SECRET", "ACCESS", "KEY"]
        );
        assert_eq!(words("db.password"), ["DB", "PASSWORD"]);
    }

    #[test]
    fn env_names() {
        for n in [
            "AWS_SECRET_ACCESS_KEY",
            "GITHUB_TOKEN",
            "DBPASSWORD",
            "OPENAI_API_KEY",
            "AccountKey",
            "Pwd",
            "MY_SESSION",
            "SharedAccessSignature",
        ] {
            assert!(builtin_secret(n, NameKind::Env), "{n}");
        }
        for n in [
            "HOME",
            "MONKEY",
            "TOKENIZERS_PARALLELISM",
            "PWD",
            "AWS_SHARED_CREDENTIALS_FILE",
            "SSH_AUTH_SOCK",
            "KEYTIMEOUT",
            "TOKEN_COUNT",
            "PASSWORD_POLICY",
            "SECRET_NAME",
            "TOKEN_TYPE",
        ] {
            assert!(!builtin_secret(n, NameKind::Env), "{n}");
        }
    }

    #[test]
    fn option_names() {
        for n in [
            "password",
            "token",
            "secret",
            "api-key",
            "apikey",
            "access-key",
            "client-secret",
            "auth",
            "pass",
            "http-password",
            "passphrase",
        ] {
            assert!(builtin_secret(n, NameKind::Option), "{n}");
        }
        for n in [
            "key",
            "sort-key",
            "token-file",
            "password-stdin",
            "no-password",
            "secret-id",
            "tokenizer",
            "max-tokens",
            "bucket",
            "passes",
        ] {
            assert!(!builtin_secret(n, NameKind::Option), "{n}");
        }
    }

    #[test]
    fn globs() {
        assert!(glob_match("MY_*", "my_thing"));
        assert!(glob_match("*_CODE", "LICENSE_CODE"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b", "axxc"));
        assert!(glob_match("*", ""));
    }
}
