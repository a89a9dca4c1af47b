//! `roar mount ARCHIVE... DIR`: archives served as one read-only tree, each member a file whose
//! content hash is known from the archive's index. Opening a member records it as an input of
//! the caller's job, named `ARCHIVE!/path/in/archive` with the member's hash, together with the
//! archive file itself (the version the member came from). Jobs are found as on a directory
//! mount ([`Jobs`]).
//!
//! A file given more than once in one archive shows its earlier versions in a directory its
//! listing does not show, `NAME.versions/` (`1` the oldest, the last one the file itself), as
//! ratarmount does; reading one records it under that name, `ARCHIVE!/NAME.versions/1`.
//!
//! Several archives are union-mounted: a path present in more than one comes from the last
//! archive given (as extracting them in order would leave it); a directory in a later archive
//! where an earlier one has a file replaces the file. Reads are served by the daemon: stored
//! members with `pread` from the archive, compressed ones by decoding from the access point before
//! the offset. Kernel passthrough cannot serve them: it maps offsets one to one onto a backing
//! file, and a member starts in the middle of its archive. The kernel keeps what was read in its
//! page cache across opens (the tree never changes while mounted).

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};
use roar_archive::nested::{Placed, Version};
use roar_archive::read::{MemberReader, Source};
use roar_archive::{Kind, Member};
use roar_store::ContentHash;

use crate::jobs::{JobKey, Jobs};

/// Nothing changes the tree while it is mounted: the kernel may keep names and attributes.
const TTL: Duration = Duration::from_secs(3600);

/// `__FMODE_EXEC`: the kernel opening a file to exec it (a program, not data).
const FMODE_EXEC: i32 = 0x20;

enum What {
    Dir {
        children: BTreeMap<Vec<u8>, u64>,
        /// The archive's own entry for the directory (its mode, owner, time), if it has one.
        member: Option<(usize, usize)>,
    },
    Member {
        source: usize,
        member: usize,
    },
}

struct Node {
    parent: u64,
    what: What,
}

/// One tree over the union of the archives' members; inode numbers are positions in it, the
/// same on every mount of the same archives.
pub struct ArchiveFs {
    nodes: Vec<Node>,
    /// Each directory's link count (2 plus its subdirectories), counted once.
    dir_links: Vec<u32>,
    /// A file's `NAME.versions/` directory, by the file's inode.
    versions: HashMap<u64, u64>,
    sources: Vec<Arc<Source>>,
    /// For each source, the archives it is inside (innermost first; none for one given).
    within: Vec<Vec<Version>>,
    jobs: Arc<Jobs>,
    handles: Mutex<HashMap<u64, Arc<Mutex<Handle>>>>,
    next_fh: AtomicU64,
    mounted: SystemTime,
    changed_logged: AtomicBool,
    attribution_logged: AtomicBool,
}

struct Handle {
    source: usize,
    reader: MemberReader,
}

impl ArchiveFs {
    pub fn new(placed: Vec<Placed>, jobs: Arc<Jobs>) -> ArchiveFs {
        let mut nodes = vec![Node {
            parent: 1,
            what: What::Dir {
                children: BTreeMap::new(),
                member: None,
            },
        }];
        for (s, p) in placed.iter().enumerate() {
            if !p.at.is_empty() {
                // An archive inside another: a directory where its member was.
                insert(&mut nodes, &p.at, Kind::Dir, None);
            }
            for (m, member) in p.source.index.members.iter().enumerate() {
                let path = if p.at.is_empty() {
                    member.path.clone()
                } else {
                    [&p.at[..], b"/", &member.path].concat()
                };
                insert(&mut nodes, &path, member.kind, Some((s, m)));
            }
        }
        let (sources, within): (Vec<_>, Vec<_>) =
            placed.into_iter().map(|p| (p.source, p.within)).unzip();
        let mut dir_links = vec![0u32; nodes.len()];
        for (i, n) in nodes.iter().enumerate() {
            if let What::Dir { .. } = n.what {
                dir_links[i] += 2;
                if i > 0 {
                    dir_links[n.parent as usize - 1] += 1;
                }
            }
        }
        let versions = add_versions(&mut nodes, &sources);
        // A versions directory is not listed: it adds no link to its parent.
        dir_links.resize(nodes.len(), 2);
        ArchiveFs {
            nodes,
            dir_links,
            versions,
            sources,
            within,
            jobs,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            mounted: SystemTime::now(),
            changed_logged: AtomicBool::new(false),
            attribution_logged: AtomicBool::new(false),
        }
    }

    /// How many files, directories and symlinks the tree holds, the root included.
    pub fn entries(&self) -> usize {
        self.nodes.len()
    }

    fn node(&self, ino: INodeNo) -> Result<&Node, Errno> {
        self.nodes
            .get((ino.0 as usize).wrapping_sub(1))
            .ok_or(Errno::ENOENT)
    }

    fn member(&self, s: usize, m: usize) -> &Member {
        self.sources[s].index.entry(m)
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let node = &self.nodes[ino as usize - 1];
        let ts = |secs: i64| {
            if secs >= 0 {
                UNIX_EPOCH + Duration::from_secs(secs as u64)
            } else {
                UNIX_EPOCH
            }
        };
        let (kind, perm, size, nlink, owner, time) = match &node.what {
            What::Dir { member, .. } => {
                let m = member.map(|(s, m)| self.member(s, m));
                (
                    FileType::Directory,
                    m.map_or(0o755, |m| m.mode),
                    0,
                    self.dir_links[ino as usize - 1],
                    m.map_or((0, 0), |m| (m.uid, m.gid)),
                    m.map_or(self.mounted, |m| ts(m.mtime)),
                )
            }
            What::Member { source, member } => {
                let m = self.member(*source, *member);
                let (kind, perm) = match m.kind {
                    Kind::Symlink => (FileType::Symlink, 0o777),
                    _ => (FileType::RegularFile, m.mode),
                };
                (kind, perm, m.size, 1, (m.uid, m.gid), ts(m.mtime))
            }
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind,
            perm: perm as u16,
            nlink,
            uid: owner.0,
            gid: owner.1,
            rdev: 0,
            blksize: 128 * 1024,
            flags: 0,
        }
    }

    fn kind(&self, ino: u64) -> FileType {
        match &self.nodes[ino as usize - 1].what {
            What::Dir { .. } => FileType::Directory,
            What::Member { source, member } => match self.member(*source, *member).kind {
                Kind::Symlink => FileType::Symlink,
                _ => FileType::RegularFile,
            },
        }
    }

    /// The member's identity, for [`roar_archive::mounted::XATTR`].
    fn member_ref(&self, s: usize, m: usize) -> roar_archive::mounted::MemberRef {
        let index = &self.sources[s].index;
        let member = index.entry(m);
        let mut archives = vec![Version::of(index)];
        archives.extend(self.within[s].iter().cloned());
        roar_archive::mounted::MemberRef {
            // An earlier version is named as it is shown: `PATH.versions/K`.
            path: roar_archive::member_path(&index.archive, &index.entry_name(m)),
            blake3: member.blake3,
            size: member.size,
            archives,
        }
    }

    /// Records the member as read by `job`, with its archive (and each archive that one is
    /// inside).
    fn record_read(&self, job: JobKey, s: usize, m: usize) {
        let r = self.member_ref(s, m);
        let hash = |b3: &[u8; 32], size: u64| ContentHash {
            blake3: roar_store::hash::hex(b3),
            sha256: None,
            size,
        };
        self.jobs.read_known(job, &r.path, hash(&r.blake3, r.size));
        for a in r.archives {
            self.jobs.read_known(job, &a.path, hash(&a.blake3, a.size));
        }
    }

    fn open_member(&self, req: &Request, s: usize, m: usize, flags: i32) -> Result<u64, Errno> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(Errno::EROFS);
        }
        if self.sources[s].changed() {
            // What the index says of its members is no longer true: serving bytes that may not
            // match the hash recorded for them would put a false record in the store.
            if !self.changed_logged.swap(true, Ordering::Relaxed) {
                tracing::error!(
                    "roarfs: {} changed since it was mounted; its members fail with EIO until it is mounted again",
                    self.sources[s].index.archive.display()
                );
            }
            return Err(Errno::EIO);
        }
        if flags & FMODE_EXEC == 0 {
            match self.jobs.job_of(req.pid()) {
                Ok(Some(job)) => self.record_read(job, s, m),
                Ok(None) => {}
                Err(e) => {
                    if !self.attribution_logged.swap(true, Ordering::Relaxed) {
                        tracing::error!(
                            "roarfs: cannot attribute an access by pid {} ({e}); such opens fail with that error instead of going unrecorded",
                            req.pid()
                        );
                    }
                    return Err(Errno::from(e));
                }
            }
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let handle = Handle {
            source: s,
            reader: self.sources[s].reader(m),
        };
        self.handles
            .lock()
            .expect("handles lock")
            .insert(fh, Arc::new(Mutex::new(handle)));
        Ok(fh)
    }
}

/// Adds a hidden `NAME.versions/` directory for each file shown whose archive lists it more than
/// once, holding `1`..`n` (oldest first; `n` is the file shown); gives them by the file's inode.
fn add_versions(nodes: &mut Vec<Node>, sources: &[Arc<Source>]) -> HashMap<u64, u64> {
    let earlier: Vec<_> = sources.iter().map(|s| s.index.earlier_by_path()).collect();
    let mut out = HashMap::new();
    if earlier.iter().all(|e| e.is_empty()) {
        return out;
    }
    for i in 0..nodes.len() {
        let (parent, (s, m)) = match nodes[i].what {
            What::Member { source, member } => (nodes[i].parent, (source, member)),
            What::Dir { .. } => continue,
        };
        let Some(older) = earlier[s].get(sources[s].index.entry(m).path.as_slice()) else {
            continue;
        };
        let dir = nodes.len() as u64 + 1;
        let mut children = BTreeMap::new();
        for k in 0..=older.len() {
            children.insert((k + 1).to_string().into_bytes(), dir + 1 + k as u64);
        }
        nodes.push(Node {
            parent,
            what: What::Dir {
                children,
                member: None,
            },
        });
        for &e in older.iter().chain([&m]) {
            nodes.push(Node {
                parent: dir,
                what: What::Member {
                    source: s,
                    member: e,
                },
            });
        }
        out.insert(i as u64 + 1, dir);
    }
    out
}

/// Adds an entry at `path` to the tree, creating the directories above it: member `m` of
/// archive `s` (`entry`), or with no entry, the directory a nested archive is mounted as.
fn insert(nodes: &mut Vec<Node>, path: &[u8], kind: Kind, entry: Option<(usize, usize)>) {
    let parts: Vec<&[u8]> = path.split(|&b| b == b'/').collect();
    let mut cur = 1u64;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let existing = match &nodes[cur as usize - 1].what {
            What::Dir { children, .. } => children.get(*part).copied(),
            What::Member { .. } => unreachable!("descending only through directories"),
        };
        let dir_here = !last || kind == Kind::Dir;
        let leaf = || match entry {
            Some((source, member)) if !dir_here => What::Member { source, member },
            _ => What::Dir {
                children: BTreeMap::new(),
                member: entry.filter(|_| last),
            },
        };
        match existing {
            None => {
                let ino = nodes.len() as u64 + 1;
                nodes.push(Node {
                    parent: cur,
                    what: leaf(),
                });
                if let What::Dir { children, .. } = &mut nodes[cur as usize - 1].what {
                    children.insert(part.to_vec(), ino);
                }
                cur = ino;
            }
            Some(at) => {
                let node = &mut nodes[at as usize - 1].what;
                match node {
                    What::Dir { .. } if !last => {}
                    What::Dir { children, .. } if !dir_here && !children.is_empty() => {
                        tracing::warn!(
                            "roarfs: {} is a file in a later archive and a directory with entries in an earlier one; the directory is kept",
                            roar_store::quote::shown(&String::from_utf8_lossy(path))
                        );
                        return;
                    }
                    // A directory's own entry taken; a directory without one keeps none.
                    What::Dir { member, .. } if dir_here => {
                        if entry.is_some() {
                            *member = entry;
                        }
                    }
                    // The later entry wins (a file replaced by a file, a directory or the
                    // directories above a later member).
                    _ => *node = leaf(),
                }
                cur = at;
            }
        }
    }
}

impl Filesystem for ArchiveFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let child = match self.node(parent).map(|n| &n.what) {
            Ok(What::Dir { children, .. }) => {
                (children.get(name.as_bytes()).copied()).or_else(|| {
                    let file = name.as_bytes().strip_suffix(b".versions")?;
                    self.versions.get(children.get(file)?).copied()
                })
            }
            Ok(What::Member { .. }) => return reply.error(Errno::ENOTDIR),
            Err(e) => return reply.error(e),
        };
        match child {
            Some(ino) => reply.entry(&TTL, &self.attr(ino), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.node(ino) {
            Ok(_) => reply.attr(&TTL, &self.attr(ino.0)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.node(ino).map(|n| &n.what) {
            Ok(What::Member { source, member }) => match &self.member(*source, *member).link {
                Some(target) => reply.data(target),
                None => reply.error(Errno::EINVAL),
            },
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let (s, m) = match self.node(ino).map(|n| &n.what) {
            Ok(What::Member { source, member }) => (*source, *member),
            Ok(What::Dir { .. }) => return reply.error(Errno::EISDIR),
            Err(e) => return reply.error(e),
        };
        match self.open_member(req, s, m, flags.0) {
            // The content never changes while mounted: what the kernel cached stays valid.
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(h) = self
            .handles
            .lock()
            .expect("handles lock")
            .get(&fh.0)
            .cloned()
        else {
            return reply.error(Errno::EBADF);
        };
        let mut h = h.lock().expect("handle lock");
        let source = &self.sources[h.source];
        let mut buf = vec![0u8; size as usize];
        match h.reader.read_at(source, offset, &mut buf) {
            Ok(n) => reply.data(&buf[..n]),
            Err(e) => {
                tracing::error!("roarfs: reading {}: {e}", source.index.archive.display());
                reply.error(Errno::EIO)
            }
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let handle = self.handles.lock().expect("handles lock").remove(&fh.0);
        reply.ok();
        // A read still running on the handle holds it briefly; its decoder is parked after.
        if let Some(h) = handle.and_then(|h| Arc::try_unwrap(h).ok()) {
            let h = h.into_inner().expect("handle lock");
            self.sources[h.source].park(h.reader);
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.node(ino).map(|n| &n.what) {
            Ok(What::Dir { .. }) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Ok(What::Member { .. }) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let node = match self.node(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let What::Dir { children, .. } = &node.what else {
            return reply.error(Errno::ENOTDIR);
        };
        let dots = [
            (ino.0, FileType::Directory, &b"."[..]),
            (node.parent, FileType::Directory, &b".."[..]),
        ];
        let entries = dots.into_iter().chain(
            children
                .iter()
                .map(|(name, &c)| (c, self.kind(c), name.as_slice())),
        );
        for (i, (child, kind, name)) in entries.enumerate().skip(offset as usize) {
            if reply.add(
                INodeNo(child),
                (i + 1) as u64,
                kind,
                OsStr::from_bytes(name),
            ) {
                break;
            }
        }
        reply.ok();
    }

    /// [`roar_archive::mounted::XATTR`] on a file member: what it is, for `roar run`'s tracer.
    /// Nothing else is stored.
    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let (s, m) = match self.node(ino).map(|n| &n.what) {
            Ok(What::Member { source, member }) if name == roar_archive::mounted::XATTR => {
                (*source, *member)
            }
            Ok(_) => return reply.error(Errno::NO_XATTR),
            Err(e) => return reply.error(e),
        };
        if self.member(s, m).kind != Kind::File {
            return reply.error(Errno::NO_XATTR);
        }
        let value = self.member_ref(s, m).encode();
        if size == 0 {
            reply.size(value.len() as u32);
        } else if (size as usize) < value.len() {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(&value);
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bytes: u64 = (self.sources.iter().zip(&self.within))
            .filter(|(_, within)| within.is_empty())
            .map(|(s, _)| s.index.identity.size)
            .sum();
        reply.statfs(
            bytes.div_ceil(4096),
            0,
            0,
            self.nodes.len() as u64,
            0,
            4096,
            255,
            4096,
        );
    }
}
