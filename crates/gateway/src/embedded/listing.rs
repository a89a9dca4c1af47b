//! Listings: prefix, delimiter, markers, continuation tokens and `encoding-type=url`.

use super::index::{self, Index, Version};

/// One page of current objects and common prefixes, in key order.
pub(crate) struct Page {
    pub objects: Vec<Version>,
    pub prefixes: Vec<String>,
    pub truncated: bool,
    /// The last key or common prefix on the page: where the next page starts after.
    pub last: Option<String>,
}

/// The bytes every key starting with `prefix` sorts below: `prefix` followed by 0xFF, a byte no
/// UTF-8 text contains.
pub(crate) fn past(prefix: &str) -> Vec<u8> {
    let mut b = prefix.as_bytes().to_vec();
    b.push(0xFF);
    b
}

/// The common prefix `key` rolls up into, if a delimiter applies to it.
pub(crate) fn rolled_up<'k>(
    key: &'k str,
    prefix: &str,
    delimiter: Option<&str>,
) -> Option<&'k str> {
    let d = delimiter.filter(|d| !d.is_empty())?;
    let rest = key.get(prefix.len()..)?;
    rest.find(d).map(|i| &key[..prefix.len() + i + d.len()])
}

/// Up to `max` entries after `after` (a key or a common prefix already returned).
pub(crate) fn page(
    index: &Index,
    bucket: &str,
    prefix: &str,
    delimiter: Option<&str>,
    after: &str,
    max: usize,
) -> index::Result<Page> {
    const BATCH: usize = 1000;
    let mut page = Page {
        objects: Vec::new(),
        prefixes: Vec::new(),
        truncated: false,
        last: None,
    };
    let mut cursor = after.as_bytes().to_vec();
    // A marker that is itself a common prefix: its keys were all returned with it.
    if let Some(cp) = rolled_up(after, prefix, delimiter) {
        if cp == after {
            cursor = past(cp);
        }
    }
    'batches: loop {
        let batch = index.list_current(bucket, prefix, &cursor, BATCH)?;
        let full = batch.len() == BATCH;
        if batch.is_empty() {
            break;
        }
        for v in batch {
            if page.objects.len() + page.prefixes.len() >= max {
                page.truncated = true;
                break 'batches;
            }
            if let Some(cp) = rolled_up(&v.key, prefix, delimiter) {
                let cp = cp.to_owned();
                cursor = past(&cp);
                page.last = Some(cp.clone());
                page.prefixes.push(cp);
                // Skip the rest of the prefix's keys with a fresh query.
                continue 'batches;
            }
            cursor = v.key.as_bytes().to_vec();
            page.last = Some(v.key.clone());
            page.objects.push(v);
        }
        if !full {
            break;
        }
    }
    Ok(page)
}

/// S3's `encoding-type=url`: every byte but unreserved characters and `/` percent-encoded (so a
/// `+` arrives as `%2B` and decodes the same with or without form semantics).
pub(crate) fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Encodes `s` if the listing asked for `encoding-type=url`.
pub(crate) struct Encoding(pub bool);

impl Encoding {
    pub(crate) fn of(e: Option<&s3s::dto::EncodingType>) -> Encoding {
        Encoding(e.is_some_and(|e| e.as_str().eq_ignore_ascii_case("url")))
    }

    pub(crate) fn apply(&self, s: &str) -> String {
        if self.0 {
            url_encode(s)
        } else {
            s.to_owned()
        }
    }

    pub(crate) fn opt(&self, s: Option<&str>) -> Option<String> {
        s.map(|s| self.apply(s))
    }
}

/// Continuation tokens are the hex of the position they continue after: opaque to clients,
/// exact for any key.
pub(crate) fn token(last: &str) -> String {
    super::blobs::hex(last.as_bytes())
}

pub(crate) fn untoken(token: &str) -> Option<String> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encoding_keeps_slashes_and_encodes_the_rest() {
        assert_eq!(url_encode("a b+c%2F/ü"), "a%20b%2Bc%252F/%C3%BC");
        assert_eq!(url_encode("plain/key-1_2.~"), "plain/key-1_2.~");
    }

    #[test]
    fn tokens_round_trip() {
        for k in ["", "a", "dir/ü+%2F", "\u{10FFFF}"] {
            assert_eq!(untoken(&token(k)).as_deref(), Some(k));
        }
        assert_eq!(untoken("zz"), None);
        assert_eq!(untoken("abc"), None);
    }

    #[test]
    fn roll_up() {
        assert_eq!(rolled_up("a/b/c", "a/", Some("/")), Some("a/b/"));
        assert_eq!(rolled_up("a/b", "a/", Some("/")), None);
        assert_eq!(rolled_up("a/b", "a/", None), None);
        assert_eq!(rolled_up("a/b", "a/", Some("")), None);
        assert_eq!(rolled_up("x--y--z", "", Some("--")), Some("x--"));
    }
}
