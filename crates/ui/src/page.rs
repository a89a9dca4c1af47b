//! The page of `roar ui` and `roar dag --html`: one HTML file with its script and style inlined
//! (compiled into the binary: nothing is fetched at build or view time), and the data it shows
//! when that is embedded (the caller reads it: `roar`'s `page_data.rs`).
//!
//! The page reads the same JSON the commands print: `roar dag --json` for the graph, `roar show
//! JOB --json` for a job's details, `roar status --json` for what is stale or modified, `roar diff
//! A B --json` for two jobs side by side. Served, it fetches them from `roar ui`; written to a
//! file, they are embedded in it.

use serde::Serialize;

const TEMPLATE: &str = include_str!("index.html");
const STYLE: &str = include_str!("app.css");
const SCRIPT: &str = include_str!("app.js");

/// What the page is told before it reads any data.
#[derive(Serialize)]
pub struct Config<'a> {
    /// `server` (fetch from roar ui, live) or `file` (everything embedded).
    pub mode: &'static str,
    /// The project root: paths below it are shown relative.
    pub root: &'a str,
    /// Directories with this many files of one role of one job start collapsed (as in `roar dag`).
    pub collapse_at: usize,
    /// When the embedded data was read (file mode), in ns since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generated_ns: Option<i64>,
}

/// JSON inside `<script type="application/json">`: `<` escaped so no string can close the tag.
fn script_json<T: Serialize>(value: &T) -> String {
    roar_store::quote::json_string(value).replace('<', "\\u003c")
}

/// What the page may load. A written file may not connect anywhere at all.
const CSP_SERVED: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'";
const CSP_FILE: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'";

pub fn csp(config: &Config) -> &'static str {
    if config.mode == "file" {
        CSP_FILE
    } else {
        CSP_SERVED
    }
}

/// The template with its `{{MARKERS}}` filled in one pass: nothing inserted is searched again, so
/// a recorded path that spells a marker stays a path.
pub fn html<T: Serialize>(config: &Config, data: Option<&T>) -> String {
    let data = match data {
        Some(d) => script_json(d),
        None => "null".into(),
    };
    let config_json = script_json(config);
    let fill = |marker: &str| -> &str {
        match marker {
            "CSP" => csp(config),
            "STYLE" => STYLE,
            "CONFIG" => &config_json,
            "DATA" => &data,
            "SCRIPT" => SCRIPT,
            _ => unreachable!("unknown marker {{{{{marker}}}}} in index.html"),
        }
    };
    let mut out = String::with_capacity(TEMPLATE.len() + STYLE.len() + SCRIPT.len() + data.len());
    let mut rest = TEMPLATE;
    while let Some(start) = rest.find("{{") {
        let end = start
            + rest[start..]
                .find("}}")
                .expect("markers in index.html are closed");
        out.push_str(&rest[..start]);
        out.push_str(fill(&rest[start + 2..end]));
        rest = &rest[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mode: &'static str, root: &str) -> String {
        html(
            &Config {
                mode,
                root,
                collapse_at: 6,
                generated_ns: None,
            },
            None::<&()>,
        )
    }

    #[test]
    fn every_marker_is_filled_once_and_inserted_text_is_not_searched() {
        // A recorded path may spell a marker: it stays what it is.
        let page = config("server", "/p/{{SCRIPT}}/</script>");
        assert!(!page.contains("{{CSP}}") && !page.contains("{{STYLE}}"));
        assert_eq!(page.matches(SCRIPT).count(), 1);
        assert!(page.contains("/p/{{SCRIPT}}/\\u003c/script>"));
        assert_eq!(page.matches("</script>").count(), 3);
    }

    #[test]
    fn a_written_file_may_not_connect() {
        assert!(config("file", "/p").contains(CSP_FILE));
        assert!(
            !CSP_FILE.contains("connect-src"),
            "default-src 'none' covers it"
        );
        assert!(config("server", "/p").contains("connect-src 'self'"));
    }
}
