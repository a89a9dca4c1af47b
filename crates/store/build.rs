//! Compiles gitleaks' rule file (`rules/gitleaks/gitleaks.toml`, taken from upstream by
//! `scripts/update-secret-rules.sh`) into a table of string constants: no TOML is parsed when
//! roar runs, and a rule's regex is compiled only once a string holds one of its keywords.

use std::fmt::Write as _;

use serde::Deserialize;

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    allowlist: Allow,
    #[serde(default)]
    rules: Vec<Rule>,
}

#[derive(Deserialize)]
struct Rule {
    id: String,
    regex: Option<String>,
    #[serde(rename = "secretGroup", default)]
    secret_group: u32,
    #[serde(default)]
    entropy: f64,
    #[serde(default)]
    keywords: Vec<String>,
    /// A rule for files of one kind only (by path): roar scans command lines, not files.
    path: Option<String>,
    #[serde(default)]
    allowlists: Vec<Allow>,
}

#[derive(Deserialize, Default)]
struct Allow {
    #[serde(default)]
    regexes: Vec<String>,
    #[serde(rename = "regexTarget", default)]
    regex_target: Option<String>,
    #[serde(default)]
    stopwords: Vec<String>,
    #[serde(default)]
    condition: Option<String>,
    #[serde(default)]
    paths: Vec<String>,
}

fn allow(a: &Allow) -> String {
    let all = a.condition.as_deref() == Some("AND");
    format!(
        "Allow {{ regexes: &{:?}, target: {:?}, stopwords: &{:?}, all: {all}, never: {} }}",
        a.regexes,
        a.regex_target.as_deref().unwrap_or("secret"),
        a.stopwords
            .iter()
            .map(|w| w.to_ascii_lowercase())
            .collect::<Vec<_>>(),
        // Only paths (a file kind), or AND with paths: never holds here, where there is no path.
        (a.regexes.is_empty() && a.stopwords.is_empty()) || (all && !a.paths.is_empty()),
    )
}

/// Rules roar's own rules do better: `generic-api-key` is a secret-sounding name followed by a
/// value, which the name rules (`src/redact/names.rs`) and pair rules decide with the whole name
/// (`TOKEN_COUNT` is not a secret); its regex alone took ~0.6 ms to compile, in every run whose
/// environment names a key.
const SKIPPED: &[&str] = &["generic-api-key"];

/// The hash of a keyword's first three (lower-case) bytes into the gate's bitmap: the same
/// function as `gram_bit` in `src/redact/rules.rs` (a test there checks every keyword passes).
fn gram_bit(g: u32) -> usize {
    (g.wrapping_mul(2_654_435_761) >> 17) as usize & 0x7fff
}

fn gram(k: &[u8]) -> u32 {
    (u32::from(k[0]) << 16) | (u32::from(k[1]) << 8) | u32::from(k[2])
}

fn main() {
    let source = "rules/gitleaks/gitleaks.toml";
    println!("cargo:rerun-if-changed={source}");
    let text = std::fs::read_to_string(source).expect("the gitleaks rule file");
    let file: File = toml::from_str(&text).expect("gitleaks.toml as gitleaks writes it");
    let mut out = String::from("pub(super) static RULES: &[Rule] = &[\n");
    let mut keywords: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
    let mut always = Vec::new();
    let mut n = 0;
    for r in &file.rules {
        let Some(regex) = r.regex.as_ref().filter(|_| r.path.is_none()) else {
            continue;
        };
        if SKIPPED.contains(&r.id.as_str()) {
            continue;
        }
        if r.keywords.is_empty() {
            always.push(n);
        }
        for k in &r.keywords {
            keywords.entry(k.to_ascii_lowercase()).or_default().push(n);
        }
        n += 1;
        let allows: Vec<String> = r.allowlists.iter().map(allow).collect();
        writeln!(
            out,
            "    Rule {{ id: {:?}, regex: {:?}, group: {}, entropy: {:?}, allow: &[{}] }},",
            r.id,
            regex,
            r.secret_group,
            r.entropy,
            allows.join(", ")
        )
        .unwrap();
    }
    out.push_str("];\n");
    writeln!(
        out,
        "pub(super) static GLOBAL: Allow = {};",
        allow(&file.allowlist)
    )
    .unwrap();
    gate(&mut out, &keywords, &always);
    let dest = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("gitleaks_rules.rs");
    std::fs::write(dest, out).unwrap();
}

/// The keyword gate: every keyword with its rules; those of 3+ bytes by their first three
/// (sorted, for a binary search) behind a bitmap of those; the shorter ones apart.
fn gate(
    out: &mut String,
    keywords: &std::collections::BTreeMap<String, Vec<usize>>,
    always: &[usize],
) {
    let list: Vec<(&String, &Vec<usize>)> = keywords.iter().collect();
    out.push_str("pub(super) static KEYWORDS: &[(&[u8], &[u16])] = &[\n");
    for (k, rules) in &list {
        writeln!(out, "    (b{k:?}, &{rules:?}),").unwrap();
    }
    out.push_str("];\n");
    let mut by_gram: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    let mut short = Vec::new();
    let mut bits = vec![0u64; 512];
    for (i, (k, _)) in list.iter().enumerate() {
        if k.len() < 3 {
            short.push(i);
            continue;
        }
        let g = gram(k.as_bytes());
        by_gram.entry(g).or_default().push(i);
        let bit = gram_bit(g);
        bits[bit >> 6] |= 1 << (bit & 63);
    }
    out.push_str("pub(super) static BY_GRAM: &[(u32, &[u16])] = &[\n");
    for (g, ks) in &by_gram {
        writeln!(out, "    ({g}, &{ks:?}),").unwrap();
    }
    out.push_str("];\n");
    writeln!(out, "pub(super) static SHORT: &[u16] = &{short:?};").unwrap();
    writeln!(out, "pub(super) static ALWAYS: &[u16] = &{always:?};").unwrap();
    writeln!(out, "pub(super) static GRAM_BITS: [u64; 512] = {bits:?};").unwrap();
}
