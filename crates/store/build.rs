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

fn main() {
    let source = "rules/gitleaks/gitleaks.toml";
    println!("cargo:rerun-if-changed={source}");
    let text = std::fs::read_to_string(source).expect("the gitleaks rule file");
    let file: File = toml::from_str(&text).expect("gitleaks.toml as gitleaks writes it");
    let mut out = String::from("pub(super) static RULES: &[Rule] = &[\n");
    for r in &file.rules {
        let Some(regex) = r.regex.as_ref().filter(|_| r.path.is_none()) else {
            continue;
        };
        let allows: Vec<String> = r.allowlists.iter().map(allow).collect();
        writeln!(
            out,
            "    Rule {{ id: {:?}, regex: {:?}, group: {}, entropy: {:?}, keywords: &{:?}, allow: &[{}] }},",
            r.id,
            regex,
            r.secret_group,
            r.entropy,
            r.keywords.iter().map(|k| k.to_ascii_lowercase()).collect::<Vec<_>>(),
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
    let dest = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("gitleaks_rules.rs");
    std::fs::write(dest, out).unwrap();
}
