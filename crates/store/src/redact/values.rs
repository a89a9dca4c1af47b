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
    super::rules::entropy(b) >= 4.0 && random_enough(s)
}

/// A value that looks generated whatever name it has (an environment variable, the value of an
/// option or a `name=value` pair): 20+ characters of a base64 alphabet holding upper case, lower
/// case and digits at ~4 bits per character, as cloud secrets without a prefix are (AWS's 40).
/// Hashes stay readable: hex (with or without dashes: UUIDs), and the base64 digests with their
/// padding or an `sha256-` prefix (SRI, Docker); so do words, paths, numbers and versions.
pub(super) fn generated(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 20
        || b.len() > 4096
        || !b
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || b"+/=_-".contains(c))
        || b.iter().all(|c| c.is_ascii_hexdigit() || *c == b'-')
        || base64_digest(s)
    {
        return false;
    }
    let has = |f: fn(&u8) -> bool| b.iter().any(f);
    let long = b.len() >= 32;
    has(u8::is_ascii_uppercase)
        && has(u8::is_ascii_lowercase)
        && (long || has(u8::is_ascii_digit))
        // `my-Model_v2-Final-2024-Run-17` is words, not a token; so is `ResNet50ImageNetV2`.
        && !plain_words(b)
        && !wordy(b)
        // Below the 1-in-1,000 entropy of random base64 of that length (4.09 bits at 32
        // characters, 3.74 at 24): a generated value is almost never missed for its entropy.
        && super::rules::entropy(b) >= if long { 3.8 } else { 3.4 }
}

/// Whether most of `b` is words between separators: each part a word (`Final`, `model`), a
/// number (`2024`), or a word and a number (`v2`, `Run17`) — as names are written and
/// generated values (`Wn0WTsOvNK6kcQ_uQ-c_9_GF1iI0zhl`) are not.
fn plain_words(b: &[u8]) -> bool {
    let plain = |w: &[u8]| {
        let letters = w.iter().take_while(|c| c.is_ascii_alphabetic()).count();
        let (word, digits) = w.split_at(letters);
        let capitalised = word.iter().skip(1).all(u8::is_ascii_lowercase)
            || word.iter().all(u8::is_ascii_uppercase);
        capitalised && digits.iter().all(u8::is_ascii_digit)
    };
    let in_plain: usize = b
        .split(|c| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty() && plain(w))
        .map(<[u8]>::len)
        .sum();
    in_plain * 4 >= b.len() * 3
}

/// Whether `b` reads as words run together (`TrainingRun2024NovemberFinal`): nearly half of it
/// in runs of 4+ lower-case letters, which random base64 of 20+ characters has about once in a
/// thousand draws.
pub(super) fn wordy(b: &[u8]) -> bool {
    let mut in_words = 0;
    for run in b.split(|c| !c.is_ascii_lowercase()) {
        if run.len() >= 4 {
            in_words += run.len();
        }
    }
    in_words * 100 >= b.len() * 45
}

/// Names of hash algorithms: `sha256-...` and `md5_...` are digests, not tokens.
const DIGEST_NAMES: &[&str] = &[
    "md5", "sha", "sha1", "sha224", "sha256", "sha384", "sha512", "blake2b", "blake2s", "blake3",
    "crc32", "xxh64", "xxh3", "git", "commit", "sum",
];

/// Tokens in the style most services mint them, whatever the service: a short word, a
/// separator, and a long generated body (`sbp_<40 hex>`, `NRAK-<27>`, `sl.<135>`,
/// `acme_live_<32>`), anywhere in a string. A new vendor needs no new rule. The body must be
/// 24+ characters with a digit, ~3.5 bits per character and long runs between separators (so
/// `my-Model_v2-Final-2024-Run-17` is words); a hex body counts only after `_` (`commit-<sha>`
/// and UUIDs are hashes and ids), never after a digest's name.
fn prefixed_spans(s: &str, spans: &mut Vec<Range<usize>>) {
    let b = s.as_bytes();
    let token_byte = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-');
    let mut at = 0;
    while at < b.len() {
        if !token_byte(b[at]) {
            at += 1;
            continue;
        }
        let start = at;
        while at < b.len() && token_byte(b[at]) {
            at += 1;
        }
        if prefixed_token(&s[start..at]) {
            spans.push(start..at);
        }
    }
}

/// Whether `run` (a maximal run of letters, digits, `_`, `.` and `-`) is a prefixed token.
fn prefixed_token(run: &str) -> bool {
    let b = run.as_bytes();
    let letters = b.iter().take_while(|c| c.is_ascii_alphabetic()).count();
    if !(2..=12).contains(&letters) || letters >= b.len() || !b"_.-".contains(&b[letters]) {
        return false;
    }
    if DIGEST_NAMES.contains(&run[..letters].to_ascii_lowercase().as_str()) {
        return false;
    }
    let body = &b[letters + 1..];
    let is_sep = |c: &u8| b"_.-".contains(c);
    let segments = body.split(is_sep).filter(|w| !w.is_empty()).count().max(1);
    let hex = body.iter().all(|c| c.is_ascii_hexdigit() || is_sep(c));
    body.len() >= 24
        && body.iter().any(u8::is_ascii_digit)
        && body.iter().any(u8::is_ascii_alphabetic)
        && body.len() / segments >= 8
        && (!hex || b[letters] == b'_')
        // Below the 1-in-1,000 entropy of random hex (3.27 bits at 40) and URL-safe base64
        // (3.74 at 24) bodies.
        && super::rules::entropy(body) >= if hex { 3.0 } else { 3.3 }
}

/// The base64 of a digest's bytes (MD5, SHA-1, SHA-256/384/512) with its padding, or a
/// `sha256-`-style prefixed one.
fn base64_digest(s: &str) -> bool {
    let prefixed = ["sha1-", "sha256-", "sha384-", "sha512-", "md5-"]
        .iter()
        .any(|p| s.starts_with(p));
    let padded = matches!(
        (s.len(), s.trim_end_matches('=').len()),
        (24, 22) | (28, 27) | (44, 43) | (88, 86)
    );
    prefixed || (padded && s.ends_with('='))
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
    super::rules::spans(s, &mut spans);
    prefixed_spans(s, &mut spans);
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

/// What may come before a pair's name (`--from-literal=password=x` has one after `=`).
fn pair_start(b: u8) -> bool {
    b.is_ascii_whitespace() || b";&,?{([=".contains(&b)
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
        let dashes = start;
        // `-Djavax.net.ssl.keyStorePassword=x`: the name after the option's dashes (and D).
        while start < end && b[start] == b'-' {
            start += 1;
        }
        if start == dashes + 1 && start + 1 < end && b[start] == b'D' {
            start += 1;
        }
        if start == end || !(b[start].is_ascii_alphabetic() || b[start] == b'_') {
            continue;
        }
        let before = if quote(dashes) { dashes - 1 } else { dashes };
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
        let value = &s[value_start..v];
        // Base64's padding (`...SG46C==`) is no pair: a generated "name" is no name.
        if value.bytes().all(|c| c == b'=') || generated(&s[start..end]) {
            continue;
        }
        let named = policy.is_secret(&s[start..end], NameKind::Env);
        if v == value_start || !(named || generated(value)) {
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

#[cfg(test)]
mod generated_tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// A generated key as the corpus test draws them: every class of the alphabet present,
    /// not reading as words run together.
    fn draw(rng: &mut Rng, alphabet: &[u8], n: usize) -> String {
        loop {
            let s: Vec<u8> = (0..n)
                .map(|_| alphabet[rng.below(alphabet.len())])
                .collect();
            let has = |f: fn(&u8) -> bool| s.iter().any(f);
            if has(u8::is_ascii_uppercase)
                && has(u8::is_ascii_lowercase)
                && has(u8::is_ascii_digit)
                && !wordy(&s)
            {
                return String::from_utf8(s).unwrap();
            }
        }
    }

    #[test]
    fn generated_keys_of_every_length_are_found_and_names_are_not() {
        let b64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let url = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut rng = Rng(0x9e3779b97f4a7c15);
        let mut missed = Vec::new();
        for round in 0..20_000 {
            let alphabet: &[u8] = if round % 2 == 0 { b64 } else { url };
            let len = 20 + round % 69;
            let key = draw(&mut rng, alphabet, len);
            if !generated(&key) && !base64_digest(&key) {
                missed.push(key);
            }
        }
        assert!(
            missed.is_empty(),
            "{} of 20000 missed: {:?}",
            missed.len(),
            &missed[..missed.len().min(8)]
        );
        for name in [
            "HelloWorld2024ProjectRun",
            "my-Model_v2-Final-2024-Run-17-x",
            "TrainingRun2024NovemberFinal",
            "DataPipelineV2ProductionCluster01",
            "ResNet50ImageNetPretrainedWeightsV2",
            "550e8400-e29b-41d4-a716-446655440000",
            "9b74c9897bac770ffc029102a200c5de5d5b7e3f",
            "sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=",
        ] {
            assert!(!generated(name), "{name}");
        }
    }

    /// A base64 digest's padding is not `NAME=VALUE`, whatever the digest spells (`...MckPwSG46C==`
    /// holds `Pw`, a password's name).
    #[test]
    fn base64_digests_are_kept_whatever_they_spell() {
        let b64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let policy = Policy::builtin();
        let mut rng = Rng(0x5ec2e75);
        let mut redacted = Vec::new();
        for round in 0..20_000 {
            let digest = match round % 3 {
                0 => format!("{}==", draw(&mut rng, b64, 22)),
                1 => format!("{}=", draw(&mut rng, b64, 43)),
                _ => format!("sha256-{}=", draw(&mut rng, b64, 43)),
            };
            if scrub(&digest, &policy).is_some() {
                redacted.push(digest);
            }
        }
        assert!(
            redacted.is_empty(),
            "{} of 20000 redacted: {:?}",
            redacted.len(),
            &redacted[..redacted.len().min(8)]
        );
        assert_eq!(scrub("RSAcfXTCEyCaMckPwSG46C==", &policy), None);
        assert_eq!(
            scrub("DB_Pw=hunter2", &policy).as_deref(),
            Some("DB_Pw=<redacted>")
        );
    }
}
