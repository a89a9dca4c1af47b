//! How a program outside the mount learns that a file it read is an archive member: every member
//! of a `roar mount ARCHIVE DIR` answers the extended attribute [`XATTR`] with its identity
//! (member path, member hash, archive, archive hash). `roar run`'s tracer asks it of the inputs it
//! found under an archive mount, so a traced job records `ARCHIVE!/member` and the archive version,
//! as the mount records for the jobs it attributes itself.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

pub use crate::nested::Version;

/// The attribute name; its value is [`MemberRef::encode`]d.
pub const XATTR: &str = "user.roar.member";

/// A member as the mount knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRef {
    /// `ARCHIVE!/path/in/archive` (`OUTER!/inner.tar!/path` inside a nested archive).
    pub path: PathBuf,
    pub blake3: [u8; 32],
    pub size: u64,
    /// The archive the member is in, then each archive that one is inside (none for a file of a
    /// folder in the union, named by its own path).
    pub archives: Vec<Version>,
}

impl MemberRef {
    /// Fields separated by NUL (which no path holds): path, hash, size, then path, hash, size
    /// of each archive.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        let mut put = |path: &Path, b3: &[u8; 32], size: u64| {
            for field in [
                path.as_os_str().as_bytes(),
                hex(b3).as_bytes(),
                size.to_string().as_bytes(),
            ] {
                v.extend_from_slice(field);
                v.push(0);
            }
        };
        put(&self.path, &self.blake3, self.size);
        for a in &self.archives {
            put(&a.path, &a.blake3, a.size);
        }
        v
    }

    pub fn decode(v: &[u8]) -> Option<MemberRef> {
        let f: Vec<&[u8]> = v.strip_suffix(b"\0")?.split(|&b| b == 0).collect();
        if f.len() < 3 || !f.len().is_multiple_of(3) {
            return None;
        }
        let num = |b: &[u8]| std::str::from_utf8(b).ok()?.parse::<u64>().ok();
        let mut triples = f.chunks_exact(3).map(|t| {
            Some(Version {
                path: PathBuf::from(std::ffi::OsString::from_vec(t[0].to_vec())),
                blake3: unhex(t[1])?,
                size: num(t[2])?,
            })
        });
        let member = triples.next()??;
        let archives = triples.collect::<Option<Vec<Version>>>()?;
        Some(MemberRef {
            path: member.path,
            blake3: member.blake3,
            size: member.size,
            archives,
        })
    }
}

pub fn hex(b: &[u8; 32]) -> String {
    hex::encode(b)
}

fn unhex(s: &[u8]) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

/// The directories archives are mounted on: read-only roarfs mounts in this mount namespace.
pub fn archive_mounts() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in info.split(|&b| b == b'\n') {
        let f: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        let Some(sep) = f.iter().position(|x| *x == b"-") else {
            continue;
        };
        let fuse = f.get(sep + 1).is_some_and(|t| t.starts_with(b"fuse"));
        let roarfs = f.get(sep + 2) == Some(&&b"roarfs"[..]);
        let ro = f
            .get(5)
            .is_some_and(|o| o.split(|&b| b == b',').any(|x| x == b"ro"));
        if fuse && roarfs && ro {
            if let Some(dir) = f.get(4) {
                out.push(PathBuf::from(std::ffi::OsString::from_vec(unescape(dir))));
            }
        }
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`; this undoes it.
pub fn unescape(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// What the mount says of the file at `path`, if it is an archive member.
pub fn member_at(path: &Path) -> Option<MemberRef> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let name = CString::new(XATTR).ok()?;
    // getxattr(2) into `buf`, or (empty) for the value's size.
    let get = |buf: &mut [u8]| {
        // SAFETY: NUL-terminated path and name; the buffer's length is what is passed (a null
        // buffer with size 0 asks the size).
        let n = unsafe {
            libc::getxattr(
                c.as_ptr(),
                name.as_ptr(),
                if buf.is_empty() {
                    std::ptr::null_mut()
                } else {
                    buf.as_mut_ptr().cast()
                },
                buf.len(),
            )
        };
        (n > 0)
            .then_some(n as usize)
            .ok_or_else(std::io::Error::last_os_error)
    };
    let mut buf = vec![0u8; 4096 + path.as_os_str().len() * 2];
    let n = match get(&mut buf) {
        Ok(n) => n,
        // Deeply nested: ask the size, then the value.
        Err(e) if e.raw_os_error() == Some(libc::ERANGE) => {
            buf.resize(get(&mut []).ok()?, 0);
            get(&mut buf).ok()?
        }
        Err(_) => return None,
    };
    MemberRef::decode(&buf[..n])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_reference_survives_encoding() {
        let r = MemberRef {
            path: PathBuf::from("/d/a b.tar!/x/\n1.jpg"),
            blake3: [7; 32],
            size: 12,
            archives: vec![
                Version {
                    path: PathBuf::from("/d/a b.tar!/in.zip"),
                    blake3: [8; 32],
                    size: 99,
                },
                Version {
                    path: PathBuf::from("/d/a b.tar"),
                    blake3: [9; 32],
                    size: 1 << 40,
                },
            ],
        };
        assert_eq!(MemberRef::decode(&r.encode()), Some(r.clone()));
        let mut one = r.clone();
        one.archives.truncate(1);
        assert_eq!(MemberRef::decode(&one.encode()), Some(one));
        // A field short (cut before the last size), or a hash that is not one.
        let e = r.encode();
        let cut = e[..e.len() - 1].iter().rposition(|&b| b == 0).unwrap() + 1;
        assert_eq!(MemberRef::decode(&e[..cut]), None);
        let bad = String::from_utf8_lossy(&e).replacen(&hex(&[7; 32]), &"g".repeat(64), 1);
        assert_eq!(MemberRef::decode(bad.as_bytes()), None);
        assert_eq!(MemberRef::decode(b"junk"), None);
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(br"/a\040b\134c"), b"/a b\\c");
    }
}
