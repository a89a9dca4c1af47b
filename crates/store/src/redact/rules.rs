//! gitleaks' maintained rule set (`rules/gitleaks/`, compiled in by `build.rs`): vendor token
//! formats and keyword-in-context assignments, applied to every string the value rules scan. A
//! rule runs only on a string holding one of its keywords (one pass over static tables finds them),
//! and its regex is compiled the first time that happens. What a match redacts is its secret
//! group, unless the rule's entropy floor or an allowlist (the rule's or the file's global one:
//! stopwords, template placeholders, system paths) says it is not a secret — as gitleaks decides.

use std::ops::Range;
use std::sync::OnceLock;

use regex_automata::meta::Regex;
use regex_automata::util::captures::Captures;
use regex_automata::util::syntax;

pub(super) struct Rule {
    pub id: &'static str,
    regex: &'static str,
    /// The capture group holding the secret; 0: the first that took part, else the match.
    group: usize,
    /// Shannon entropy (bits per byte) the secret must reach; 0: none.
    entropy: f64,
    allow: &'static [Allow],
}

pub(super) struct Allow {
    regexes: &'static [&'static str],
    /// What the regexes are matched against: `secret`, `match` or `line`.
    target: &'static str,
    stopwords: &'static [&'static str],
    /// Every kind given must hold (gitleaks' `condition = "AND"`), not any.
    all: bool,
    /// Holds only for paths: never here.
    never: bool,
}

include!(concat!(env!("OUT_DIR"), "/gitleaks_rules.rs"));

/// The gate's hash of three lower-case bytes (the same as `build.rs`'s).
fn gram_bit(g: u32) -> usize {
    (g.wrapping_mul(2_654_435_761) >> 17) as usize & 0x7fff
}

/// Which rules `s` may hold a secret of: those with a keyword in `s` (ASCII case ignored), and
/// those without keywords. One pass over `s` with static tables: nothing is built at run time.
fn gated(s: &[u8]) -> Vec<bool> {
    let mut hit = vec![false; RULES.len()];
    for r in ALWAYS {
        hit[usize::from(*r)] = true;
    }
    let mut mark = |k: usize| {
        for r in KEYWORDS[k].1 {
            hit[usize::from(*r)] = true;
        }
    };
    let at = |i: usize, k: usize| {
        let word = KEYWORDS[k].0;
        s.len() - i >= word.len() && s[i..i + word.len()].eq_ignore_ascii_case(word)
    };
    for i in 0..s.len() {
        for k in SHORT {
            if at(i, usize::from(*k)) {
                mark(usize::from(*k));
            }
        }
        if i + 3 > s.len() {
            continue;
        }
        let lower = |b: u8| u32::from(b.to_ascii_lowercase());
        let g = (lower(s[i]) << 16) | (lower(s[i + 1]) << 8) | lower(s[i + 2]);
        let bit = gram_bit(g);
        if GRAM_BITS[bit >> 6] & (1 << (bit & 63)) == 0 {
            continue;
        }
        if let Ok(e) = BY_GRAM.binary_search_by_key(&g, |e| e.0) {
            for k in BY_GRAM[e].1 {
                if at(i, usize::from(*k)) {
                    mark(usize::from(*k));
                }
            }
        }
    }
    hit
}

/// A rule's regex: Thompson NFA and PikeVM only. Building the faster engines too cost ~3x the
/// time (~130 us a rule against ~45), paid in each run that needs the rule, for a search over a
/// few hundred bytes.
fn build(pattern: &str) -> Option<Regex> {
    Regex::builder()
        .configure(
            Regex::config()
                .onepass(false)
                .backtrack(false)
                .dfa(false)
                .hybrid(false),
        )
        .syntax(syntax::Config::new().unicode(false).utf8(false))
        .build(pattern)
        .ok()
}

/// Rule `i`'s regex, compiled on first use; None if it does not compile (the rule-file test
/// keeps that from happening unnoticed).
pub(super) fn regex(i: usize) -> Option<&'static Regex> {
    static COMPILED: OnceLock<Vec<OnceLock<Option<Regex>>>> = OnceLock::new();
    let cells = COMPILED.get_or_init(|| RULES.iter().map(|_| OnceLock::new()).collect());
    cells[i]
        .get_or_init(|| {
            let re = build(RULES[i].regex);
            if re.is_none() {
                tracing::warn!("the secret rule {} does not compile; skipped", RULES[i].id);
            }
            re
        })
        .as_ref()
}

/// An allowlist's regex, compiled once.
fn allow_regex(pattern: &'static str) -> Option<&'static Regex> {
    static COMPILED: OnceLock<std::sync::Mutex<Vec<(&'static str, &'static Regex)>>> =
        OnceLock::new();
    let cache = COMPILED.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, re)) = cache.iter().find(|(p, _)| *p == pattern) {
        return Some(re);
    }
    let re: &'static Regex = Box::leak(Box::new(build(pattern)?));
    cache.push((pattern, re));
    Some(re)
}

/// Shannon entropy of `b`, in bits per byte.
pub(super) fn entropy(b: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for c in b {
        counts[*c as usize] += 1;
    }
    let n = b.len() as f64;
    counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = f64::from(*c) / n;
            -p * p.log2()
        })
        .sum()
}

impl Allow {
    fn holds(&self, secret: &[u8], matched: &[u8], line: &[u8]) -> bool {
        if self.never {
            return false;
        }
        let target = match self.target {
            "match" => matched,
            "line" => line,
            _ => secret,
        };
        let by_regex = (!self.regexes.is_empty()).then(|| {
            self.regexes
                .iter()
                .any(|r| allow_regex(r).is_some_and(|re| re.is_match(target)))
        });
        let by_word = (!self.stopwords.is_empty()).then(|| {
            let lower = secret.to_ascii_lowercase();
            self.stopwords
                .iter()
                .any(|w| lower.windows(w.len()).any(|x| x == w.as_bytes()))
        });
        let kinds = [by_regex, by_word].into_iter().flatten();
        if self.all {
            kinds.into_iter().all(|k| k)
        } else {
            kinds.into_iter().any(|k| k)
        }
    }
}

/// The secret of one match of `rule`: its group's range in the string.
fn secret_of(rule: &Rule, caps: &Captures) -> Option<Range<usize>> {
    let m = if rule.group > 0 {
        caps.get_group(rule.group)
    } else {
        (1..caps.group_len())
            .find_map(|g| caps.get_group(g))
            .or_else(|| caps.get_group(0))
    }?;
    Some(m.range())
}

/// Widens `r` to the characters of `s` it touches (rules match bytes).
fn on_chars(s: &str, mut r: Range<usize>) -> Range<usize> {
    while r.start > 0 && !s.is_char_boundary(r.start) {
        r.start -= 1;
    }
    while r.end < s.len() && !s.is_char_boundary(r.end) {
        r.end += 1;
    }
    r
}

/// A path or a list of them (`/etc/ssl/certs/ca.crt`, `PATH=/usr/bin:/bin`), alone or as the
/// value of `NAME=`: no rule of the set is about one (gitleaks allows system paths globally),
/// and environments are full of them — `SSL_CERT_FILE` would open the gate of `curl` and
/// `vault` rules (`s.`) in every run. A part that looks generated is not a path's.
fn path_like(b: &[u8]) -> bool {
    let value = match b.iter().position(|c| *c == b'=') {
        Some(eq)
            if eq > 0
                && b[..eq]
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || *c == b'_') =>
        {
            &b[eq + 1..]
        }
        _ => b,
    };
    let rooted = value.starts_with(b"/") || value.starts_with(b"~/") || value.starts_with(b"./");
    rooted
        && value
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || b"/._:+,-".contains(c))
        && value.split(|c| *c == b'/' || *c == b':').all(|part| {
            part.len() < 20 || !std::str::from_utf8(part).is_ok_and(super::values::generated)
        })
}

/// The ranges of `s` that a rule of the set says are secrets.
pub(super) fn spans(s: &str, out: &mut Vec<Range<usize>>) {
    let bytes = s.as_bytes();
    if path_like(bytes) {
        return;
    }
    let hit = gated(bytes);
    for (i, rule) in RULES.iter().enumerate().filter(|(i, _)| hit[*i]) {
        let Some(re) = regex(i) else { continue };
        for caps in re.captures_iter(bytes) {
            let Some(range) = secret_of(rule, &caps) else {
                continue;
            };
            let secret = &bytes[range.clone()];
            if secret.is_empty() || (rule.entropy > 0.0 && entropy(secret) < rule.entropy) {
                continue;
            }
            let matched = caps.get_match().map_or(secret, |m| &bytes[m.range()]);
            let allowed = std::iter::once(&GLOBAL)
                .chain(rule.allow)
                .any(|a| a.holds(secret, matched, bytes));
            if !allowed {
                out.push(on_chars(s, range));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_file_is_the_one_its_source_names_and_every_rule_compiles() {
        use sha2::Digest;
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/rules/gitleaks");
        let file = std::fs::read(format!("{dir}/gitleaks.toml")).unwrap();
        let source = std::fs::read_to_string(format!("{dir}/SOURCE")).unwrap();
        let sum: String = sha2::Sha256::digest(&file)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(
            source.lines().any(|l| l == format!("sha256 {sum}")),
            "rules/gitleaks/gitleaks.toml is not the file SOURCE names: run scripts/update-secret-rules.sh"
        );
        assert!(RULES.len() > 200, "{} rules", RULES.len());
        for (k, (word, _)) in KEYWORDS.iter().enumerate() {
            let hit = gated(word);
            assert!(
                KEYWORDS[k].1.iter().all(|r| hit[usize::from(*r)]),
                "{word:?} opens no gate"
            );
        }
        let broken: Vec<&str> = (0..RULES.len())
            .filter(|i| regex(*i).is_none())
            .map(|i| RULES[i].id)
            .collect();
        assert!(broken.is_empty(), "rules that do not compile: {broken:?}");
    }

    fn found(s: &str) -> Vec<&str> {
        let mut out = Vec::new();
        spans(s, &mut out);
        out.into_iter().map(|r| &s[r]).collect()
    }

    #[test]
    fn vendor_formats_and_keyword_contexts() {
        let age = "AGE-SECRET-KEY-1QQPZRY9X8GF2TVDW0S3JN54KHCE6MUA7LQPZRY9X8GF2TVDW0S3JN54KHC";
        assert_eq!(found(age), [age]);
        let pscale = "pscale_tkn_8fGh2JkL9mNpQ3rStUvWxYz4A5bCdEfGhIjKlMnOpQr";
        assert!(!found(pscale).is_empty(), "{pscale}");
        for harmless in [
            "/usr/local/lib/python3.12/site-packages",
            "sk-learn-baseline",
            "9b74c9897bac770ffc029102a200c5de5d5b7e3f",
            "token_count=12",
        ] {
            assert!(
                found(harmless).is_empty(),
                "{harmless}: {:?}",
                found(harmless)
            );
        }
    }
}
