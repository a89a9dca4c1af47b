//! Archives inside archives (`roar mount --recursive`): a member that is itself an archive is
//! indexed from its bytes in the outer archive ([`MemberBytes`]) and mounted as a directory of
//! the same name. Its members are named through every level, `OUTER!/inner.tar!/x.jpg`, and a
//! job that reads one records every enclosing archive's version as well.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::bytes::{Bytes, Shared};
use crate::cache::{self, Origin};
use crate::read::{MemberReader, Source};
use crate::scan::{Owner, Progress};
use crate::{ArchiveError, Identity, Index, Kind, Member};

/// How deep archives inside archives are followed.
pub const MAX_DEPTH: usize = 8;

/// A member's bytes, read through its archive (decoding it where the archive is compressed).
pub struct MemberBytes {
    source: Arc<Source>,
    member: usize,
    identity: Identity,
    /// Readers left positioned by earlier reads: sequential reads decode on from them.
    idle: Mutex<Vec<MemberReader>>,
}

impl MemberBytes {
    pub fn new(source: Arc<Source>, member: usize) -> MemberBytes {
        let identity = identity_of(&source.index.members[member]);
        MemberBytes {
            source,
            member,
            identity,
            idle: Mutex::new(Vec::new()),
        }
    }
}

/// A member's identity: its size and time, and its content, whose hash's first 8 bytes stand
/// where a file has its inode number (an index of other content under the same name is never
/// reused).
fn identity_of(m: &Member) -> Identity {
    Identity {
        size: m.size,
        mtime_ns: m.mtime.saturating_mul(1_000_000_000),
        ctime_ns: 0,
        ino: u64::from_le_bytes(m.blake3[..8].try_into().expect("8 bytes")),
        dev: 0,
    }
}

/// Readers kept for later reads of one member.
const IDLE: usize = 4;

impl Bytes for MemberBytes {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
        let kept = self.idle.lock().expect("idle readers").pop();
        let mut reader = kept.unwrap_or_else(|| self.source.reader(self.member));
        let n = reader.read_at(&self.source, off, buf);
        let mut idle = self.idle.lock().expect("idle readers");
        if idle.len() < IDLE {
            idle.push(reader);
        }
        n
    }

    fn size(&self) -> std::io::Result<u64> {
        Ok(self.identity.size)
    }

    fn identity(&self) -> std::io::Result<Identity> {
        if self.source.changed() {
            return Err(std::io::Error::other(format!(
                "{} changed since it was indexed",
                self.source.index.archive.display()
            )));
        }
        Ok(self.identity)
    }
}

/// An archive's version, as a job's record names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub path: PathBuf,
    pub blake3: [u8; 32],
    pub size: u64,
}

impl Version {
    pub fn of(index: &Index) -> Version {
        Version {
            path: index.archive.clone(),
            blake3: index.blake3,
            size: index.identity.size,
        }
    }
}

/// An archive of a mounted tree: where its root is in the tree (empty for an archive given on
/// the command line, `a/b.tar` for one found at that member), and the archives it is inside,
/// innermost first.
pub struct Placed {
    pub at: Vec<u8>,
    pub source: Arc<Source>,
    pub within: Vec<Version>,
}

/// What happened to one archive found inside another, for the caller to report.
pub enum Found<'a> {
    Indexed(&'a Index, Origin),
    /// Left as a plain member: not an archive roar reads, damaged, or too deep.
    Left(PathBuf, ArchiveError),
}

/// Whether a member's name says it is an archive worth opening (the content decides after).
pub fn named_like_an_archive(path: &[u8]) -> bool {
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    let lower = name.to_ascii_lowercase();
    [
        &b".tar"[..],
        b".tar.gz",
        b".tgz",
        b".tar.zst",
        b".tzst",
        b".tar.xz",
        b".txz",
        b".tar.bz2",
        b".tbz",
        b".tbz2",
        b".zip",
    ]
    .iter()
    .any(|s| lower.len() > s.len() && lower.ends_with(s))
}

/// `top` and, depth first, every archive inside it (each followed by the archives inside it),
/// their indexes kept in `dir`. An inner archive that cannot be read stays a plain member and is
/// reported through `found`, as is every index built or reused.
pub fn expand(
    top: Source,
    dir: &Path,
    progress: Progress,
    found: &mut dyn FnMut(Found),
) -> Vec<Placed> {
    expand_at(top, Vec::new(), dir, progress, found)
}

/// [`expand`] for an archive shown as the directory `at` of the tree (an archive file in a
/// folder of the union).
pub fn expand_at(
    top: Source,
    at: Vec<u8>,
    dir: &Path,
    progress: Progress,
    found: &mut dyn FnMut(Found),
) -> Vec<Placed> {
    let mut out = Vec::new();
    let within = Vec::new();
    place(Arc::new(top), at, within, dir, progress, found, &mut out);
    out
}

fn place(
    source: Arc<Source>,
    at: Vec<u8>,
    within: Vec<Version>,
    dir: &Path,
    progress: Progress,
    found: &mut dyn FnMut(Found),
    out: &mut Vec<Placed>,
) {
    let mut inner = Vec::new();
    let index = &source.index;
    for (i, m) in index.members.iter().enumerate() {
        if m.kind != Kind::File || !named_like_an_archive(&m.path) {
            continue;
        }
        let name = index.member_path(m);
        if within.len() + 1 >= MAX_DEPTH {
            let why = format!("archives are followed {MAX_DEPTH} levels deep");
            found(Found::Left(name.clone(), too_deep(&name, why)));
            continue;
        }
        match open_inner(&source, i, &name, dir, progress) {
            Ok((s, origin)) => {
                found(Found::Indexed(&s.index, origin));
                inner.push((i, s));
            }
            Err(e) => found(Found::Left(name, e)),
        }
    }
    let mut deeper = within.clone();
    deeper.insert(0, Version::of(index));
    out.push(Placed {
        at: at.clone(),
        source: source.clone(),
        within,
    });
    for (i, s) in inner {
        let m = &source.index.members[i].path;
        let at = if at.is_empty() {
            m.clone()
        } else {
            [&at[..], b"/", m].concat()
        };
        place(Arc::new(s), at, deeper.clone(), dir, progress, found, out);
    }
}

fn too_deep(name: &Path, why: String) -> ArchiveError {
    ArchiveError::Unsupported {
        path: name.to_owned(),
        why,
    }
}

/// Member `i` of `outer` opened as an archive.
fn open_inner(
    outer: &Arc<Source>,
    i: usize,
    name: &Path,
    dir: &Path,
    progress: Progress,
) -> Result<(Source, Origin), ArchiveError> {
    let m = &outer.index.members[i];
    let bytes: Shared = Arc::new(MemberBytes::new(outer.clone(), i));
    let owner = Owner {
        mode: m.mode,
        uid: m.uid,
        gid: m.gid,
        mtime: m.mtime,
    };
    let (index, origin) = cache::open_in(name, bytes.clone(), owner, m.blake3, dir, progress)?;
    let source = Source::over(index, bytes).map_err(|source| ArchiveError::Io {
        path: name.to_owned(),
        source,
    })?;
    Ok((source, origin))
}

/// Members named through archives inside an archive (`inner.tar!/x.jpg`), each inner archive
/// opened once, from its index in `dir`.
pub struct Lookup {
    top: Arc<Source>,
    dir: PathBuf,
    opened: std::collections::HashMap<PathBuf, Arc<Source>>,
}

impl Lookup {
    pub fn new(index: Index, dir: &Path) -> std::io::Result<Lookup> {
        Ok(Lookup {
            top: Arc::new(Source::open(index)?),
            dir: dir.to_owned(),
            opened: Default::default(),
        })
    }

    /// The file member at `member`, following `!/` into archives inside archives; None if
    /// there is none.
    pub fn file(&mut self, member: &[u8]) -> Option<Member> {
        let mut source = self.top.clone();
        let mut rest = member;
        for _ in 0..MAX_DEPTH {
            let files = |p: &[u8]| {
                let i = source.index.members.iter().rposition(|m| m.path == p)?;
                (source.index.members[i].kind == Kind::File).then_some(i)
            };
            if let Some(m) = source.index.file_named(rest) {
                return Some(m.clone());
            }
            // The first `!/` whose left side is a file member: the archive to go into.
            let (i, after) = (0..rest.len().saturating_sub(1))
                .filter(|&at| &rest[at..at + 2] == b"!/")
                .find_map(|at| Some((files(&rest[..at])?, at + 2)))?;
            let name = source.index.member_path(&source.index.members[i]);
            let inner = match self.opened.get(&name) {
                Some(s) => s.clone(),
                None => {
                    let (s, _) = open_inner(&source, i, &name, &self.dir, &|_| {}).ok()?;
                    let s = Arc::new(s);
                    self.opened.insert(name, s.clone());
                    s
                }
            };
            source = inner;
            rest = &rest[after..];
        }
        None
    }
}
