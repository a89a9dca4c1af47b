//! Archives as datasets: tar, tar.gz, tar.zst, tar.xz, tar.bz2 and zip read as trees of members,
//! each with its content hash, for `roar mount ARCHIVE DIR`.
//!
//! - [`scan`]: one pass over an archive lists its members, hashes each (blake3) and records
//!   where its bytes are, plus access points into compressed streams.
//! - [`cache`]: that index, kept in a SQLite file beside the project's store and reused while
//!   the archive is unchanged (same size, mtime, ctime, inode, device).
//! - [`read`]: a member's bytes at any offset: `pread` for stored members, decoding from the
//!   nearest access point for compressed ones.
//! - [`gz`], [`gzwindow`], [`zst`], [`inflate`]: random access into gzip (zran, with sparse
//!   windows) and zstd (frames).
//! - [`blocks`], [`xz`], [`bz2`]: random access into xz and bzip2 (their blocks).
//! - [`mounted`]: how a mounted member tells `roar run` what it is (an extended attribute).

pub mod block;
pub mod blocks;
pub mod bytes;
pub mod bz2;
pub mod bz2block;
pub mod cache;
pub mod gz;
pub mod gzcursor;
pub mod gzwindow;
pub mod inflate;
pub mod mounted;
pub mod nested;
pub mod read;
pub mod scan;
pub mod xz;
pub mod zst;

use std::path::{Path, PathBuf};

pub use gz::Point;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is not an archive roar can mount ({why}); it mounts tar, tar.gz, tar.zst, tar.xz, tar.bz2 and zip"
    )]
    Unsupported { path: PathBuf, why: String },
    #[error("{path} is damaged: {why}")]
    Corrupt { path: PathBuf, why: String },
    #[error("the archive index {path} cannot be used")]
    Cache {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
}

/// How the archive is stored, told by its first bytes (never by its name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Tar,
    TarGz,
    TarZst,
    TarXz,
    TarBz2,
    Zip,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Tar => "tar",
            Format::TarGz => "tar.gz",
            Format::TarZst => "tar.zst",
            Format::TarXz => "tar.xz",
            Format::TarBz2 => "tar.bz2",
            Format::Zip => "zip",
        }
    }

    fn from_name(s: &str) -> Option<Format> {
        [
            Format::Tar,
            Format::TarGz,
            Format::TarZst,
            Format::TarXz,
            Format::TarBz2,
            Format::Zip,
        ]
        .into_iter()
        .find(|f| f.name() == s)
    }

    /// Reads the first bytes of `path`. A gzip or zstd file is taken for a compressed tar; the
    /// scan says so if its content is not one.
    pub fn detect(path: &Path) -> Result<Format, ArchiveError> {
        let file = std::fs::File::open(path).map_err(|source| ArchiveError::Io {
            path: path.to_owned(),
            source,
        })?;
        Format::detect_in(&file, path)
    }

    /// [`Format::detect`] of the bytes of `path` (a file, or an archive's member).
    pub fn detect_in(bytes: &dyn bytes::Bytes, path: &Path) -> Result<Format, ArchiveError> {
        let mut head = vec![0u8; 512];
        let n = bytes::read_at_retry(bytes, &mut head, 0).map_err(|source| ArchiveError::Io {
            path: path.to_owned(),
            source,
        })?;
        head.truncate(n);
        let unsupported = |why: &str| ArchiveError::Unsupported {
            path: path.to_owned(),
            why: why.to_owned(),
        };
        if head.starts_with(&[0x1f, 0x8b]) {
            Ok(Format::TarGz)
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) || starts_skippable(&head) {
            // A skippable frame first: pzstd's frame table, the seekable format's.
            Ok(Format::TarZst)
        } else if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
            Ok(Format::Zip)
        } else if head.len() == 512 && tar_header(&head) {
            Ok(Format::Tar)
        } else if head.starts_with(b"BZh") && head.get(3).is_some_and(|l| (b'1'..=b'9').contains(l))
        {
            Ok(Format::TarBz2)
        } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
            Ok(Format::TarXz)
        } else if head.is_empty() {
            Err(unsupported("the file is empty"))
        } else {
            Err(unsupported("unknown format"))
        }
    }
}

/// A zstd skippable frame (magic 0x184D2A50 to 0x184D2A5F, little-endian).
fn starts_skippable(h: &[u8]) -> bool {
    h.len() >= 8 && h[1..4] == [0x2a, 0x4d, 0x18] && h[0] & 0xf0 == 0x50
}

/// A tar header: POSIX's magic, or (pre-POSIX, v7) its checksum field matches its bytes.
fn tar_header(h: &[u8]) -> bool {
    &h[257..262] == b"ustar" || tar_checksum_ok(h)
}

/// A pre-POSIX (v7) tar header: its checksum field matches the sum of its bytes.
fn tar_checksum_ok(h: &[u8]) -> bool {
    let field = String::from_utf8_lossy(&h[148..156]);
    let Ok(want) = u32::from_str_radix(field.trim_matches(|c: char| c == '\0' || c == ' '), 8)
    else {
        return false;
    };
    let sum: u32 = h
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(b)
            }
        })
        .sum();
    sum == want
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// Where a member's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// Stored as they are at this offset of the archive file (tar; zip without compression).
    Raw { offset: u64 },
    /// At this offset of the archive's decompressed stream (tar.gz, tar.zst, tar.xz, tar.bz2).
    Stream { offset: u64 },
    /// A zip member compressed with deflate: `csize` bytes at `offset` of the archive file.
    Deflate { offset: u64, csize: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Relative, `/`-separated, without `.` or empty components; never `..`.
    pub path: Vec<u8>,
    pub kind: Kind,
    /// Permission bits (with setuid, setgid, sticky), without the file type.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub size: u64,
    pub data: Data,
    /// blake3 of the content (of the target, for a symlink).
    pub blake3: [u8; 32],
    /// A symlink's target.
    pub link: Option<Vec<u8>>,
}

/// `len` bytes of the decompressed stream at `uoff`, stored as they are at `coff` of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub uoff: u64,
    pub coff: u64,
    pub len: u64,
}

/// The identity of the archive file the index was built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub ino: u64,
    pub dev: u64,
}

impl Identity {
    pub fn of(meta: &std::fs::Metadata) -> Identity {
        use std::os::unix::fs::MetadataExt;
        Identity {
            size: meta.size(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
            ino: meta.ino(),
            dev: meta.dev(),
        }
    }
}

/// Everything known of one archive.
#[derive(Debug, Clone)]
pub struct Index {
    /// The archive's canonical path.
    pub archive: PathBuf,
    pub format: Format,
    pub identity: Identity,
    /// blake3 of the whole archive file: the archive version the members came from.
    pub blake3: [u8; 32],
    /// In archive order; a path given twice keeps its last entry (what extraction leaves).
    pub members: Vec<Member>,
    /// The earlier entries of file paths given more than once, in archive order: the versions
    /// extraction overwrites. Entry `members.len() + i` is `earlier[i]` ([`Index::entry`]).
    pub earlier: Vec<Member>,
    /// Access points into the decompressed stream (tar.gz, tar.zst), by uncompressed offset.
    pub points: Vec<Point>,
    /// Stretches of the decompressed stream stored in the file as they are (xz's uncompressed
    /// LZMA2 chunks, deflate's stored blocks), by uncompressed offset: read with `pread`,
    /// nothing decoded.
    pub stored: Vec<Stored>,
    /// Entries not shown, and why (`..` in the path, devices, sparse files, other methods).
    pub skipped: Vec<(Vec<u8>, String)>,
}

impl Index {
    /// Entry `i`: a member, or past them an earlier version ([`Index::earlier`]).
    pub fn entry(&self, i: usize) -> &Member {
        match self.members.get(i) {
            Some(m) => m,
            None => &self.earlier[i - self.members.len()],
        }
    }

    /// The earlier versions of each file path given more than once, oldest first, as entries
    /// ([`Index::entry`]).
    pub fn earlier_by_path(&self) -> std::collections::HashMap<&[u8], Vec<usize>> {
        let mut out: std::collections::HashMap<&[u8], Vec<usize>> = Default::default();
        for (i, e) in self.earlier.iter().enumerate() {
            out.entry(&e.path).or_default().push(self.members.len() + i);
        }
        out
    }

    /// The name entry `i` is shown and recorded under: a member's path; an earlier version's
    /// `PATH.versions/K` (`K` from 1, the oldest).
    pub fn entry_name(&self, i: usize) -> Vec<u8> {
        let e = self.entry(i);
        if i < self.members.len() {
            return e.path.clone();
        }
        let k = (self.earlier[..i - self.members.len()].iter())
            .filter(|o| o.path == e.path)
            .count();
        [&e.path[..], format!(".versions/{}", k + 1).as_bytes()].concat()
    }

    /// The file shown at `name`: a member, or a version named as [`Index::entry_name`] says
    /// (the last version is the member itself).
    pub fn file_named(&self, name: &[u8]) -> Option<&Member> {
        let file = |p: &[u8]| {
            (self.members.iter())
                .rfind(|m| m.path == p)
                .filter(|m| m.kind == Kind::File)
        };
        if let Some(m) = file(name) {
            return Some(m);
        }
        let at = name.windows(10).rposition(|w| w == b".versions/")?;
        let (path, k) = (&name[..at], &name[at + 10..]);
        let k: usize = std::str::from_utf8(k).ok()?.parse().ok()?;
        let older: Vec<&Member> = self.earlier.iter().filter(|e| e.path == path).collect();
        match k.checked_sub(1)? {
            i if i < older.len() => Some(older[i]),
            i if i == older.len() && !older.is_empty() => file(path),
            _ => None,
        }
    }

    /// The artifact path of a member: `ARCHIVE!/path/in/archive`.
    pub fn member_path(&self, member: &Member) -> PathBuf {
        member_path(&self.archive, &member.path)
    }

    /// The most a read may have to decode before reaching its offset: the longest stretch of the
    /// decompressed stream between two access points (0 for stored members).
    pub fn longest_stretch(&self) -> u64 {
        let Some(last) = self.points.last() else {
            return 0;
        };
        let end = self
            .members
            .iter()
            .map(|m| match m.data {
                Data::Stream { offset } => offset + m.size,
                _ => 0,
            })
            .max()
            .unwrap_or(last.uoff);
        self.points
            .windows(2)
            .map(|w| w[1].uoff - w[0].uoff)
            .chain([end.saturating_sub(last.uoff)])
            .max()
            .unwrap_or(0)
    }

    /// The last access point at or before `uoff` for which `pred` holds.
    pub fn point_before_where(&self, uoff: u64, pred: impl Fn(&Point) -> bool) -> Option<&Point> {
        let i = self.points.partition_point(|p| p.uoff <= uoff);
        self.points[..i].iter().rev().find(|p| pred(p))
    }

    /// The last access point at or before `uoff`.
    pub fn point_before(&self, uoff: u64) -> Option<&Point> {
        self.points_from(uoff).first()
    }

    /// Where the `len` decompressed bytes at `uoff` are in the file, if all of them are stored
    /// as they are: (file offset, length) pieces, in order.
    pub fn stored_at(&self, uoff: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        let mut i = self.stored.partition_point(|s| s.uoff + s.len <= uoff);
        let (mut at, end) = (uoff, uoff + len);
        let mut pieces = Vec::new();
        while at < end {
            let s = self.stored.get(i).filter(|s| s.uoff <= at)?;
            let n = (s.uoff + s.len).min(end) - at;
            pieces.push((s.coff + (at - s.uoff), n));
            at += n;
            i += 1;
        }
        Some(pieces)
    }

    /// The access points from the last one at or before `uoff` on (empty if there is none).
    pub fn points_from(&self, uoff: u64) -> &[Point] {
        let i = self.points.partition_point(|p| p.uoff <= uoff);
        i.checked_sub(1).map_or(&[], |i| &self.points[i..])
    }
}

/// `ARCHIVE!/member`: how a member is named in the record.
pub fn member_path(archive: &Path, member: &[u8]) -> PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let mut p = archive.as_os_str().as_bytes().to_vec();
    p.extend_from_slice(b"!/");
    p.extend_from_slice(member);
    PathBuf::from(std::ffi::OsString::from_vec(p))
}

/// Splits `ARCHIVE!/member` at its first `!/` whose left side is an existing file.
pub fn split_member_path(p: &Path) -> Option<(PathBuf, Vec<u8>)> {
    use std::os::unix::ffi::OsStrExt;
    let b = p.as_os_str().as_bytes();
    let mut from = 0;
    while let Some(i) = b[from..].windows(2).position(|w| w == b"!/") {
        let at = from + i;
        let archive = Path::new(std::ffi::OsStr::from_bytes(&b[..at]));
        if archive.is_file() {
            return Some((archive.to_owned(), b[at + 2..].to_vec()));
        }
        from = at + 2;
    }
    None
}

/// A member path as the archive gives it, made relative and clean; None if it leaves the
/// archive's root (`..`) or names the root itself.
pub fn normalize(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::with_capacity(raw.len());
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return None,
            p => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(p);
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_paths_are_relative_and_never_leave_the_root() {
        assert_eq!(normalize(b"./a//b/"), Some(b"a/b".to_vec()));
        assert_eq!(normalize(b"/abs/x"), Some(b"abs/x".to_vec()));
        assert_eq!(normalize(b"a/../../etc/passwd"), None);
        assert_eq!(normalize(b"./"), None);
        assert_eq!(
            normalize(b"we ird\n/na\xffme"),
            Some(b"we ird\n/na\xffme".to_vec())
        );
    }

    #[test]
    fn a_member_path_splits_at_the_archive_that_exists() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("x!/y.tar");
        std::fs::create_dir_all(a.parent().unwrap()).unwrap();
        std::fs::write(&a, b"").unwrap();
        let p = member_path(&a, b"in/side!/z");
        let (archive, member) = split_member_path(&p).unwrap();
        assert_eq!(archive, a);
        assert_eq!(member, b"in/side!/z");
        assert!(split_member_path(&dir.path().join("nothing!/here")).is_none());
    }
}
