//! Secrets found inside a string whatever its name: token formats, private keys, credentials in
//! URLs and DSNs, `name=value` pairs with a secret name, HTTP authorization values.

use std::ops::Range;
use std::sync::OnceLock;

use regex_lite::Regex;

use super::names::NameKind;
use super::{Policy, REDACTED};

/// Well-known token formats. Each is checked again by [`random_enough`] so a file called
/// `sk-learn-baseline-experiment` is not a key.
const TOKEN_FORMATS: &str = concat!(
    r"\b(?:",
    r"gh[pousr]_[A-Za-z0-9]{30,}",                           // GitHub
    r"|github_pat_[A-Za-z0-9_]{40,}",                        // GitHub fine-grained
    r"|glpat-[A-Za-z0-9_\-]{20,}",                           // GitLab personal
    r"|gl(?:dt|rt|cbt|ptt|ft|imt|soat)-[A-Za-z0-9_\-]{20,}", // GitLab others
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}",                      // Slack
    r"|xapp-[0-9]-[A-Za-z0-9\-]{10,}",                       // Slack app-level
    r"|(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}",                 // AWS access key ids
    r"|sk-[A-Za-z0-9_\-]{32,}",                              // OpenAI, Anthropic and alike
    r"|hf_[A-Za-z0-9]{30,}",                                 // Hugging Face
    r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}",            // Stripe
    r"|AIza[0-9A-Za-z_\-]{35}",                              // Google API keys
    r"|npm_[A-Za-z0-9]{36}",                                 // npm
    r"|pypi-AgE[A-Za-z0-9_\-]{50,}",                         // PyPI
    r"|dop_v1_[a-f0-9]{64}",                                 // DigitalOcean
    r"|SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}",          // SendGrid
    r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*", // JWT
    r")"
);

/// A PEM private key, up to its END line (or the end of the string when it is cut).
const PEM: &str =
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?s:.)*?(?:-----END[A-Z0-9 ]*PRIVATE KEY-----|$)";

/// `Bearer xyz`, `Basic xyz` anywhere.
const AUTH_SCHEME: &str = r"(?i)\b(?:Bearer|Basic)\s+([A-Za-z0-9._~+/=\-]{8,})";

/// HTTP authorization schemes: the credential follows them.
const SCHEMES: &[&str] = &[
    "bearer",
    "basic",
    "token",
    "digest",
    "negotiate",
    "aws4-hmac-sha256",
];

/// Query parameters that carry a signature or credential under a name the word rules miss.
const QUERY_SECRETS: &[&str] = &["x-amz-credential", "x-goog-credential", "code"];

/// Hosts whose URL path is itself the credential.
const WEBHOOK_HOSTS: &[(&str, &str)] = &[
    ("hooks.slack.com", "/services/"),
    ("discord.com", "/api/webhooks/"),
    ("discordapp.com", "/api/webhooks/"),
    ("outlook.office.com", "/webhook/"),
];

/// Literals one of which every [`TOKEN_FORMATS`] match starts with: a string holding none is
/// not searched (regex-lite has no literal prefilter of its own).
const TOKEN_PREFIXES: &[&str] = &[
    "gh", "glpat-", "gldt-", "glrt-", "glcbt-", "glptt-", "glft-", "glimt-", "glsoat-", "xox",
    "xapp-", "AKIA", "ASIA", "ABIA", "ACCA", "sk-", "hf_", "sk_", "rk_", "AIza", "npm_", "pypi-",
    "dop_v1_", "SG.", "eyJ",
];

/// Each pattern is compiled the first time a string passes its literal prefilter (~50-150 us
/// each): most jobs' argv and environment never need one.
fn compiled(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("a built-in pattern"))
}

static TOKENS: OnceLock<Regex> = OnceLock::new();
static PEM_BLOCK: OnceLock<Regex> = OnceLock::new();
static AUTH: OnceLock<Regex> = OnceLock::new();

/// A token has digits or mixed case, as generated keys do and words and file names rarely do.
fn random_enough(s: &str) -> bool {
    let digits = s.bytes().filter(u8::is_ascii_digit).count();
    let upper = s.bytes().filter(u8::is_ascii_uppercase).count();
    let lower = s.bytes().filter(u8::is_ascii_lowercase).count();
    let classes = [digits, upper, lower].iter().filter(|n| **n > 0).count();
    classes >= 2 && digits + upper > 2
}

/// Looks like a generated credential on its own (a URL's user part, say): long and random.
pub(super) fn token_like(s: &str) -> bool {
    s.len() >= 16
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~+/=".contains(&b))
        && (random_enough(s) || (s.len() >= 24 && s.bytes().all(|b| b.is_ascii_hexdigit())))
}

/// A value that looks generated rather than written: 20+ characters of a token alphabet with
/// high Shannon entropy (random base64 ~4.5+ bits per character, hex ~3.7: 32+ hex digits
/// count), no path or file-name punctuation.
pub(super) fn high_entropy(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 20
        || !b
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || b"+/=_-".contains(c))
    {
        return false;
    }
    if b.len() >= 32 && b.iter().all(u8::is_ascii_hexdigit) {
        return true;
    }
    let mut counts = [0u32; 256];
    for c in b {
        counts[*c as usize] += 1;
    }
    let n = b.len() as f64;
    let bits: f64 = counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = f64::from(*c) / n;
            -p * p.log2()
        })
        .sum();
    bits >= 4.0 && random_enough(s)
}

/// The byte ranges of `s` that hold secrets, unmerged.
fn secret_spans(s: &str, policy: &Policy) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    if s.contains("-----BEGIN") {
        spans.extend(compiled(&PEM_BLOCK, PEM).find_iter(s).map(|m| m.range()));
    }
    if s.len() >= 12 && TOKEN_PREFIXES.iter().any(|t| s.contains(t)) {
        spans.extend(
            compiled(&TOKENS, TOKEN_FORMATS)
                .find_iter(s)
                .filter(|m| random_enough(m.as_str()))
                .map(|m| m.range()),
        );
    }
    if s.contains("://") {
        url_spans(s, policy, &mut spans);
    }
    pair_spans(s, policy, &mut spans);
    let lower_has = |w: &str| {
        s.as_bytes()
            .windows(w.len())
            .any(|x| x.eq_ignore_ascii_case(w.as_bytes()))
    };
    if lower_has("bearer") || lower_has("basic") {
        for c in compiled(&AUTH, AUTH_SCHEME).captures_iter(s) {
            spans.push(c.get(1).expect("credential").range());
        }
    }
    for re in &policy.patterns {
        spans.extend(re.find_iter(s).map(|m| m.range()));
    }
    spans
}

fn name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')
}

/// What may come before a pair's name.
fn pair_start(b: u8) -> bool {
    b.is_ascii_whitespace() || b";&,?{([".contains(&b)
}

/// What ends a pair's value.
fn value_end(b: u8) -> bool {
    b.is_ascii_whitespace() || b";&,\"'})]".contains(&b)
}

/// `name=value`, `name: value`, `"name": "value"` inside a string (at its start or after a
/// separator) whose name is secret: the value, or for `Authorization: Bearer xyz` the rest.
fn pair_spans(s: &str, policy: &Policy, spans: &mut Vec<Range<usize>>) {
    let b = s.as_bytes();
    for (at, &c) in b.iter().enumerate() {
        if c != b'=' && c != b':' {
            continue;
        }
        let quote = |i: usize| i > 0 && matches!(b[i - 1], b'"' | b'\'');
        let mut end = at;
        while end > 0 && b[end - 1].is_ascii_whitespace() {
            end -= 1;
        }
        if quote(end) {
            end -= 1;
        }
        let mut start = end;
        while start > 0 && name_byte(b[start - 1]) {
            start -= 1;
        }
        if start == end || !(b[start].is_ascii_alphabetic() || b[start] == b'_') {
            continue;
        }
        let before = if quote(start) { start - 1 } else { start };
        if before > 0 && !pair_start(b[before - 1]) {
            continue;
        }
        let mut v = at + 1;
        while v < b.len() && b[v].is_ascii_whitespace() {
            v += 1;
        }
        if v < b.len() && matches!(b[v], b'"' | b'\'') {
            v += 1;
        }
        let value_start = v;
        while v < b.len() && !value_end(b[v]) {
            v += 1;
        }
        if v == value_start || !policy.is_secret(&s[start..end], NameKind::Env) {
            continue;
        }
        if SCHEMES.contains(&s[value_start..v].to_ascii_lowercase().as_str()) {
            // `Authorization: Bearer xyz`: the credential is the rest of the string.
            let rest = s[v..].trim_start();
            if !rest.is_empty() {
                spans.push(s.len() - rest.len()..s.len());
            }
        } else {
            spans.push(value_start..v);
        }
    }
}

/// Credentials inside every `scheme://` URL of `s`: the password (or a token-like user), secret
/// query parameters, and the path of webhook URLs.
fn url_spans(s: &str, policy: &Policy, spans: &mut Vec<Range<usize>>) {
    let mut from = 0;
    while let Some(found) = s[from..].find("://") {
        let start = from + found + 3;
        let end = s[start..]
            .find(|c: char| c.is_whitespace() || "\"'<>`".contains(c))
            .map_or(s.len(), |e| start + e);
        from = end.max(start);
        let url = &s[start..end];
        let authority_len = url.find(['/', '?', '#']).unwrap_or(url.len());
        let authority = &url[..authority_len];
        if let Some(at) = authority.rfind('@') {
            let userinfo = &authority[..at];
            match userinfo.find(':') {
                Some(colon) => spans.push(start + colon + 1..start + at),
                None if token_like(userinfo) => spans.push(start..start + at),
                None => {}
            }
        }
        let host = authority.rsplit('@').next().unwrap_or(authority);
        let host = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
        let rest = &url[authority_len..];
        for (webhook, prefix) in WEBHOOK_HOSTS {
            if host == *webhook && rest.starts_with(prefix) && rest.len() > prefix.len() {
                let path_end = rest.find(['?', '#']).unwrap_or(rest.len());
                let at = start + authority_len + prefix.len();
                spans.push(at..start + authority_len + path_end);
            }
        }
        if let Some(q) = rest.find('?') {
            let query_start = start + authority_len + q + 1;
            let query_end = rest[q..]
                .find('#')
                .map_or(end, |h| start + authority_len + q + h);
            let mut at = query_start;
            for param in s[query_start..query_end].split('&') {
                if let Some((name, value)) = param.split_once('=') {
                    let lower = name.to_ascii_lowercase();
                    if !value.is_empty()
                        && (QUERY_SECRETS.contains(&lower.as_str())
                            || policy.is_secret(name, NameKind::Option))
                    {
                        let v = at + name.len() + 1;
                        spans.push(v..v + value.len());
                    }
                }
                at += param.len() + 1;
            }
        }
    }
}

/// `s` with every secret replaced by `<redacted>`, or None when it holds none.
pub fn scrub(s: &str, policy: &Policy) -> Option<String> {
    let mut spans = secret_spans(s, policy);
    spans.retain(|r| !r.is_empty());
    if spans.is_empty() {
        return None;
    }
    spans.sort_by_key(|r| (r.start, std::cmp::Reverse(r.end)));
    let mut out = String::with_capacity(s.len());
    let mut at = 0;
    for r in spans {
        if r.end <= at {
            continue;
        }
        let start = r.start.max(at);
        out.push_str(&s[at..start]);
        if start == r.start {
            out.push_str(REDACTED);
        }
        at = r.end;
    }
    out.push_str(&s[at..]);
    (out != s).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrubbed(s: &str) -> String {
        scrub(s, &Policy::builtin()).unwrap_or_else(|| s.to_owned())
    }

    #[test]
    fn token_formats_anywhere() {
        let gh = "ghp_R2d2C3poAbCdEfGhIjKlMnOpQrStUvWx1234";
        assert_eq!(scrubbed(gh), REDACTED);
        assert_eq!(scrubbed(&format!("x {gh} y")), "x <redacted> y");
        assert_eq!(scrubbed("AKIAIOSFODNN7EXAMPLE"), REDACTED);
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        assert_eq!(scrubbed(jwt), REDACTED);
        for harmless in [
            "sk-learn-baseline-experiment-final-report",
            "models/epoch_004.npy",
            "ghp_short",
            "AKIA is a prefix",
            "task-1234",
        ] {
            assert_eq!(scrubbed(harmless), harmless);
        }
    }

    #[test]
    fn generated_values() {
        assert!(high_entropy("q8F3zT0bLx9vYp2RkWm4sNd7JhGc1Ae5"));
        assert!(high_entropy("9b74c9897bac770ffc029102a200c5de5d5b7e3f"));
        for v in [
            "data/2024/train-0001.parquet",
            "models/m.npy",
            "hello-world-this-is-text",
            "short",
        ] {
            assert!(!high_entropy(v), "{v}");
        }
    }

    #[test]
    fn pem_blocks() {
        let pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n";
        assert_eq!(scrubbed(pem), "<redacted>\n");
        assert_eq!(scrubbed("-----BEGIN RSA PRIVATE KEY-----\nMIIE"), REDACTED);
        let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----";
        assert_eq!(scrubbed(cert), cert);
    }

    #[test]
    fn urls_and_dsns() {
        assert_eq!(
            scrubbed("https://user:pass@host/x"),
            "https://user:<redacted>@host/x"
        );
        assert_eq!(
            scrubbed("postgresql://u:pw@h/db"),
            "postgresql://u:<redacted>@h/db"
        );
        assert_eq!(
            scrubbed("https://0123456789abcdef0123456789abcdef@o1.ingest.sentry.io/42"),
            "https://<redacted>@o1.ingest.sentry.io/42"
        );
        assert_eq!(
            scrubbed("https://hooks.slack.com/services/T000/B000/XXXXXXXX"),
            "https://hooks.slack.com/services/<redacted>"
        );
        assert_eq!(
            scrubbed("https://b.s3.amazonaws.com/k?X-Amz-Credential=AK%2F1&X-Amz-Signature=abc123&x-id=GetObject"),
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=<redacted>&X-Amz-Signature=<redacted>&x-id=GetObject"
        );
        assert_eq!(
            scrubbed("host=h port=5432 password=pw dbname=x"),
            "host=h port=5432 password=<redacted> dbname=x"
        );
        let azure = "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=YWJjZA==;EndpointSuffix=core.windows.net";
        assert_eq!(
            scrubbed(azure),
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=<redacted>;EndpointSuffix=core.windows.net"
        );
        for v in [
            "https://example.com/a:b@c",
            "s3://bucket/key",
            "git@github.com:org/repo.git",
            "http://user@host/",
            "https://example.com/?page=2&sort=name",
        ] {
            assert_eq!(scrubbed(v), v);
        }
    }

    #[test]
    fn authorization_values() {
        assert_eq!(
            scrubbed("Authorization: Bearer xyz.abc-123"),
            "Authorization: Bearer <redacted>"
        );
        assert_eq!(scrubbed("Bearer abcdefgh12"), "Bearer <redacted>");
        assert_eq!(scrubbed("X-Api-Key: 12345"), "X-Api-Key: <redacted>");
        assert_eq!(scrubbed("Content-Type: text/csv"), "Content-Type: text/csv");
        assert_eq!(
            scrubbed(r#"{"user": "me", "password": "hunter2"}"#),
            r#"{"user": "me", "password": "<redacted>"}"#
        );
    }
}
