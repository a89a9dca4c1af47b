//! Strings from the record (paths, argv, names: any bytes a program chose) turned into text for
//! a terminal, a script, a graph or a message. One rule under all of them: the characters a
//! terminal acts on or that reorder what is shown ([`unsafe_char`]: C0, DEL, C1, the Unicode
//! bidirectional controls) and bytes that are not UTF-8 never reach an output as they are; each
//! form writes them as an escape it can map back. The forms:
//!
//! - [`shown`]: a single string on a terminal. Unsafe characters are escaped C-style inside
//!   double quotes, as `git` shows such paths (`"inj\ntouch PWNED #"`); anything else is left as
//!   it is.
//! - [`visible`]: prose that quotes such strings (an error message): the escapes without quotes.
//! - [`dot_string`]: a Graphviz string: the escaped text, so a label (and the SVG Graphviz makes
//!   of it) shows the escapes, never the bytes; the SVG stays well-formed XML.
//! - [`shell_quote`] / [`shell_join`]: a command as a user would type it into bash, safe on a
//!   terminal: plain words bare, others single-quoted, control bytes as `$'\n'` segments (GNU
//!   `ls` does the same).
//! - [`script_word`]: a word of a POSIX `sh` script, byte for byte: single quotes hold every byte
//!   but NUL literally in every shell, and an unsafe byte comes from `printf` (`"$(printf
//!   '\033')"`), so the script recreates names exactly and shows no control byte when printed.

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

/// Text with every unsafe character written as its escape and nothing quoted: a message that
/// names recorded strings stays one line and acts on no terminal.
pub fn visible(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            push_escape(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A Graphviz double-quoted string whose label shows `s` with its unsafe characters escaped (as
/// [`shown`] writes them, backslashes doubled so the text maps back to `s`). Every backslash is
/// escaped for Graphviz too: no `\n`, `\l` or `\N` of a name acts in a label.
pub fn dot_string(s: &str) -> String {
    format!("\"{}\"", dot_escaped(s))
}

/// The inside of [`dot_string`]: to be put between double quotes, alone or beside other text.
pub fn dot_escaped(s: &str) -> String {
    let mut text = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => text.push_str("\\\\"),
            c if unsafe_char(c) => push_escape(&mut text, c),
            c => text.push(c),
        }
    }
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out
}

/// JSON as serde_json writes it (pretty or compact), with every unsafe character a `\uXXXX`
/// escape: serde_json escapes C0 itself, not DEL, C1 or the bidirectional controls. A parser
/// reads the same values; a terminal shown the JSON acts on nothing in it.
pub fn write_json<W: std::io::Write, T: serde::Serialize + ?Sized>(
    out: W,
    value: &T,
    pretty: bool,
) -> serde_json::Result<()> {
    if pretty {
        let f = SafeJson(serde_json::ser::PrettyFormatter::new());
        value.serialize(&mut serde_json::Serializer::with_formatter(out, f))
    } else {
        let f = SafeJson(serde_json::ser::CompactFormatter);
        value.serialize(&mut serde_json::Serializer::with_formatter(out, f))
    }
}

/// [`write_json`] into a string.
pub fn json_string<T: serde::Serialize + ?Sized>(value: &T) -> String {
    let mut out = Vec::new();
    write_json(&mut out, value, false).expect("a value serde_json can write");
    String::from_utf8(out).expect("JSON is UTF-8")
}

/// A serde_json formatter that writes unsafe characters in strings as escapes; the rest is the
/// wrapped formatter's.
struct SafeJson<F>(F);

macro_rules! delegate {
    ($($name:ident $(($arg:ident: $ty:ty))?),* $(,)?) => {$(
        fn $name<W: ?Sized + std::io::Write>(&mut self, w: &mut W $(, $arg: $ty)?) -> std::io::Result<()> {
            self.0.$name(w $(, $arg)?)
        }
    )*};
}

impl<F: serde_json::ser::Formatter> serde_json::ser::Formatter for SafeJson<F> {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (at, c) in fragment.char_indices() {
            if unsafe_char(c) {
                w.write_all(&fragment.as_bytes()[start..at])?;
                write!(w, "\\u{:04x}", c as u32)?;
                start = at + c.len_utf8();
            }
        }
        w.write_all(&fragment.as_bytes()[start..])
    }

    delegate!(
        begin_array,
        end_array,
        begin_array_value(first: bool),
        end_array_value,
        begin_object,
        end_object,
        begin_object_key(first: bool),
        end_object_key,
        begin_object_value,
        end_object_value,
    );
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
/// holds): plain words bare, the rest in single quotes with `'` as `'\''`, and each run of
/// unsafe characters (or bytes that are not UTF-8) as `"$(printf '\ooo...')"` — `printf` and
/// command substitution are POSIX (dash has no `$'...'`); a newline, the one byte command
/// substitution would drop at the end, is safe to print and stays literal.
pub fn script_word(b: &[u8]) -> Vec<u8> {
    if plain(b) {
        return b.to_vec();
    }
    let mut out = Vec::with_capacity(b.len() + 2);
    let mut raw: Vec<u8> = Vec::new();
    let flush = |out: &mut Vec<u8>, raw: &mut Vec<u8>| {
        if raw.is_empty() {
            return;
        }
        out.extend_from_slice(b"\"$(printf '");
        for byte in raw.drain(..) {
            out.extend_from_slice(format!("\\{byte:03o}").as_bytes());
        }
        out.extend_from_slice(b"')\"");
    };
    let quoted = |out: &mut Vec<u8>, raw: &mut Vec<u8>, text: &[u8]| {
        flush(out, raw);
        out.push(b'\'');
        for &byte in text {
            if byte == b'\'' {
                out.extend_from_slice(b"'\\''");
            } else {
                out.push(byte);
            }
        }
        out.push(b'\'');
    };
    for chunk in b.utf8_chunks() {
        let mut safe = String::new();
        for c in chunk.valid().chars() {
            if unsafe_char(c) && c != '\n' {
                if !safe.is_empty() {
                    quoted(&mut out, &mut raw, std::mem::take(&mut safe).as_bytes());
                }
                let mut buf = [0u8; 4];
                raw.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            } else {
                safe.push(c);
            }
        }
        if !safe.is_empty() {
            quoted(&mut out, &mut raw, safe.as_bytes());
        }
        raw.extend_from_slice(chunk.invalid());
    }
    flush(&mut out, &mut raw);
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
    fn a_script_word_is_exact_in_sh_and_safe_to_print() {
        let names: Vec<Vec<u8>> = vec![
            b"plain".to_vec(),
            b"a b".to_vec(),
            b"it's".to_vec(),
            b"inj\ntouch PWNED #".to_vec(),
            b"\x1b]0;title\x07\x1b[31mred".to_vec(),
            b"end\n".to_vec(),
            b"\xff\xfe".to_vec(),
            "c1\u{9b}31m bidi\u{202e}x".as_bytes().to_vec(),
            (1..=255u8).filter(|b| *b != b'/').collect(),
        ];
        for name in &names {
            let word = script_word(name);
            let printable = String::from_utf8(word.clone()).expect("UTF-8");
            assert!(
                !printable.chars().any(|c| unsafe_char(c) && c != '\n'),
                "{printable:?}"
            );
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(std::ffi::OsStr::from_bytes(
                    &[b"printf %s ", word.as_slice()].concat(),
                ))
                .output()
                .expect("sh");
            assert_eq!(out.stdout, *name, "{printable}");
        }
    }

    #[test]
    fn json_is_the_same_values_with_no_unsafe_character() {
        let value = serde_json::json!({"p": "a\u{9b}31m\u{202e}\x1b\x7f.csv", "n": [1, "é"]});
        for pretty in [false, true] {
            let mut out = Vec::new();
            write_json(&mut out, &value, pretty).unwrap();
            let text = String::from_utf8(out).unwrap();
            assert!(!text.chars().any(|c| unsafe_char(c) && c != '\n'), "{text}");
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(&text).unwrap(),
                value
            );
        }
    }

    #[test]
    fn a_dot_string_shows_escapes_and_maps_back() {
        assert_eq!(dot_string("a.csv"), r#""a.csv""#);
        assert_eq!(dot_string("q\"x"), r#""q\"x""#);
        assert_eq!(dot_string("a\\nb"), r#""a\\\\nb""#);
        assert_eq!(dot_string("t\x1b]0;x\x07"), r#""t\\e]0;x\\x07""#);
        assert_ne!(
            dot_string("a\x1b"),
            dot_string("a\\e"),
            "distinct names stay distinct"
        );
        assert_eq!(visible("bad \x1b[2J name"), r"bad \e[2J name");
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
