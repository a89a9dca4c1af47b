//! Strings from the record (paths, argv, names: any bytes a program chose) turned into text for
//! a terminal or code for a shell. Three forms:
//!
//! - [`shown`]: a single string on a terminal. Control characters (C0, DEL, C1) and the Unicode
//!   bidirectional overrides are escaped C-style inside double quotes, as `git` shows such paths
//!   (`"inj\ntouch PWNED #"`); anything else is left as it is.
//! - [`shell_quote`] / [`shell_join`]: a command as a user would type it into bash, safe on a
//!   terminal: plain words bare, others single-quoted, control bytes as `$'\n'` segments (GNU
//!   `ls` does the same).
//! - [`script_word`]: a word of a POSIX `sh` script, byte for byte: single quotes hold every byte
//!   but NUL literally in every shell, so the script recreates names exactly.

use std::borrow::Cow;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

/// Characters a terminal would act on or that reorder what is shown.
pub fn unsafe_char(c: char) -> bool {
    c.is_control() // C0, DEL and C1
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A string for a terminal: as it is, or double-quoted with its unsafe characters escaped.
pub fn shown(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if unsafe_char(c) => push_escape(&mut out, c),
            c => out.push(c),
        }
    }
    out.push('"');
    Cow::Owned(out)
}

fn push_escape(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        '\x1b' => out.push_str("\\e"),
        c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
        c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
    }
}

fn plain(b: &[u8]) -> bool {
    !b.is_empty()
        && b.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(b))
}

/// One word as bash would need it typed, safe to print: see the module docs.
pub fn shell_quote_bytes(b: &[u8]) -> String {
    if plain(b) {
        // SAFETY-free: plain bytes are ASCII.
        return String::from_utf8_lossy(b).into_owned();
    }
    let mut out = String::with_capacity(b.len() + 2);
    let mut quoted = false; // inside a '...' segment
    let open = |out: &mut String, quoted: &mut bool| {
        if !*quoted {
            out.push('\'');
            *quoted = true;
        }
    };
    let close = |out: &mut String, quoted: &mut bool| {
        if *quoted {
            out.push('\'');
            *quoted = false;
        }
    };
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            if unsafe_char(c) {
                close(&mut out, &mut quoted);
                // Escapes of the UTF-8 bytes: bash's $'\u..' depends on the locale.
                let mut buf = [0u8; 4];
                out.push_str("$'");
                for byte in c.encode_utf8(&mut buf).bytes() {
                    match byte {
                        b'\n' => out.push_str("\\n"),
                        b'\t' => out.push_str("\\t"),
                        b'\r' => out.push_str("\\r"),
                        byte => out.push_str(&format!("\\x{byte:02x}")),
                    }
                }
                out.push('\'');
            } else if c == '\'' {
                close(&mut out, &mut quoted);
                out.push_str("\\'");
            } else {
                open(&mut out, &mut quoted);
                out.push(c);
            }
        }
        if !chunk.invalid().is_empty() {
            close(&mut out, &mut quoted);
            out.push_str("$'");
            for byte in chunk.invalid() {
                out.push_str(&format!("\\x{byte:02x}"));
            }
            out.push('\'');
        }
    }
    close(&mut out, &mut quoted);
    if out.is_empty() {
        out.push_str("''");
    }
    out
}

pub fn shell_quote(s: &str) -> String {
    shell_quote_bytes(s.as_bytes())
}

/// argv as bash would need it typed, safe to print.
pub fn shell_join(argv: &[OsString]) -> String {
    argv.iter()
        .map(|a| shell_quote_bytes(a.as_bytes()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One word of a POSIX `sh` script, exact for every byte but NUL (which no argument or path
/// holds): plain words bare, the rest in single quotes with `'` as `'\''`.
pub fn script_word(b: &[u8]) -> Vec<u8> {
    if plain(b) {
        return b.to_vec();
    }
    let mut out = Vec::with_capacity(b.len() + 2);
    out.push(b'\'');
    for &byte in b {
        if byte == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(byte);
        }
    }
    out.push(b'\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_escapes_what_a_terminal_acts_on() {
        assert_eq!(shown("data/x.csv"), "data/x.csv");
        assert_eq!(shown("inj\ntouch PWNED #"), r#""inj\ntouch PWNED #""#);
        assert_eq!(shown("a\x1b[31mred"), r#""a\e[31mred""#);
        assert_eq!(shown("évil\u{202e}txt.exe"), r#""évil\u{202e}txt.exe""#);
        assert_eq!(shown("caf\u{e9}"), "caf\u{e9}");
    }

    #[test]
    fn shell_quote_is_bash_input_and_terminal_safe() {
        assert_eq!(shell_quote("plain/x.csv"), "plain/x.csv");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("inj\ntouch"), r"'inj'$'\n''touch'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote_bytes(b"a\xffb"), r"'a'$'\xff''b'");
        for b in 1..=255u8 {
            let q = shell_quote_bytes(&[b'x', b]);
            assert!(!q.bytes().any(|c| c < 0x20 || c == 0x7f), "{b}: {q:?}");
        }
    }
}
