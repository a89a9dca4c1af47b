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
//! where an earlier one has a file replaces the file. With `--recursive`, an archive inside
//! another is a directory where its member was (a later layer). A folder given among them is a
//! layer too ([`Folder`]): its files are served from it and recorded by their own paths. Reads
//! are served by the daemon: stored members with `pread` from the archive, compressed ones by
//! decoding from the access point before the offset. Kernel passthrough cannot serve them: it
//! maps offsets one to one onto a backing file, and a member starts in the middle of its
//! archive. The kernel keeps what was read of a member in its page cache across opens (an
//! archive never changes while mounted); a folder's files are read again at each open.

use std::collections::HashMap;
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
use roar_archive::read::MemberReader;
use roar_archive::{Kind, Member};
use roar_store::ContentHash;

use crate::folder::Folder;
use crate::jobs::{JobKey, Jobs};
use tree::{Node, What};

mod tree;

/// Nothing changes an archive while it is mounted: the kernel may keep names and attributes.
const TTL: Duration = Duration::from_secs(3600);

/// A folder's files may change: their attributes are asked again after this.
const FOLDER_TTL: Duration = Duration::from_secs(1);

/// One layer of the union: an archive (perhaps inside another), or a folder.
pub enum Layer {
    Archive(Placed),
    Folder(Folder),
}

/// `__FMODE_EXEC`: the kernel opening a file to exec it (a program, not data).
const FMODE_EXEC: i32 = 0x20;

/// One tree over the union of the archives' members; inode numbers are positions in it, the
/// same on every mount of the same archives.
pub struct ArchiveFs {
    nodes: Vec<Node>,
    /// Each directory's link count (2 plus its subdirectories), counted once.
    dir_links: Vec<u32>,
    /// A file's `NAME.versions/` directory, by the file's inode.
    versions: HashMap<u64, u64>,
    layers: Vec<Layer>,
    jobs: Arc<Jobs>,
    handles: Mutex<HashMap<u64, Arc<Mutex<Handle>>>>,
    next_fh: AtomicU64,
    mounted: SystemTime,
    changed_logged: AtomicBool,
    attribution_logged: AtomicBool,
}

enum Handle {
    Member {
        source: usize,
        reader: Box<MemberReader>,
    },
    File(std::fs::File),
}

impl ArchiveFs {
    pub fn new(layers: Vec<Layer>, jobs: Arc<Jobs>) -> ArchiveFs {
        let (nodes, dir_links, versions) = tree::build(&layers);
        ArchiveFs {
            nodes,
            dir_links,
            versions,
            layers,
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
        match &self.layers[s] {
            Layer::Archive(p) => p.source.index.entry(m),
            Layer::Folder(f) => &f.entries[m],
        }
    }

    /// How long the kernel may keep what it was told of `ino`.
    fn ttl(&self, ino: u64) -> Duration {
        match self.nodes[ino as usize - 1].what {
            What::Member { source, .. } if matches!(self.layers[source], Layer::Folder(_)) => {
                FOLDER_TTL
            }
            _ => TTL,
        }
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
                let now = match &self.layers[*source] {
                    Layer::Folder(f) => f.now(*member),
                    Layer::Archive(_) => None,
                };
                match now {
                    // A folder's file as it is now.
                    Some(n) => {
                        use std::os::unix::fs::MetadataExt;
                        let perm = if m.kind == Kind::Symlink {
                            perm
                        } else {
                            n.mode() & 0o7777
                        };
                        (kind, perm, n.size(), 1, (n.uid(), n.gid()), ts(n.mtime()))
                    }
                    None => (kind, perm, m.size, 1, (m.uid, m.gid), ts(m.mtime)),
                }
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
    fn member_ref(&self, p: &Placed, m: usize) -> roar_archive::mounted::MemberRef {
        let index = &p.source.index;
        let member = index.entry(m);
        let mut archives = vec![Version::of(index)];
        archives.extend(p.within.iter().cloned());
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
    fn record_read(&self, job: JobKey, r: roar_archive::mounted::MemberRef) {
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

    /// What a job reading file `m` of layer `s` records: the member (and its archives), or the
    /// folder's file with what it holds now (`file`, open).
    fn identify(
        &self,
        s: usize,
        m: usize,
        file: Option<&std::fs::File>,
    ) -> Result<roar_archive::mounted::MemberRef, Errno> {
        match (&self.layers[s], file) {
            (Layer::Archive(p), _) => Ok(self.member_ref(p, m)),
            (Layer::Folder(f), Some(file)) => {
                let hash = f.content(m, file).map_err(|e| {
                    tracing::error!("roarfs: {e}");
                    Errno::EIO
                })?;
                let mut b3 = [0u8; 32];
                hex::decode_to_slice(&hash.blake3, &mut b3).map_err(|_| Errno::EIO)?;
                Ok(roar_archive::mounted::MemberRef {
                    path: f.path(m),
                    blake3: b3,
                    size: hash.size,
                    archives: Vec::new(),
                })
            }
            (Layer::Folder(_), None) => Err(Errno::EIO),
        }
    }

    /// A handle on file `m` of layer `s`: an archive member's reader, or the folder's file.
    fn handle(&self, s: usize, m: usize) -> Result<Handle, Errno> {
        match &self.layers[s] {
            Layer::Archive(p) if p.source.changed() => {
                // What the index says of its members is no longer true: serving bytes that may
                // not match the hash recorded for them would put a false record in the store.
                if !self.changed_logged.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        "roarfs: {} changed since it was mounted; its members fail with EIO until it is mounted again",
                        p.source.index.archive.display()
                    );
                }
                Err(Errno::EIO)
            }
            Layer::Archive(p) => Ok(Handle::Member {
                source: s,
                reader: Box::new(p.source.reader(m)),
            }),
            Layer::Folder(f) => f.open(m).map(Handle::File).map_err(Errno::from),
        }
    }

    fn open_member(&self, req: &Request, s: usize, m: usize, flags: i32) -> Result<u64, Errno> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(Errno::EROFS);
        }
        let handle = self.handle(s, m)?;
        if flags & FMODE_EXEC == 0 {
            match self.jobs.job_of(req.pid()) {
                Ok(Some(job)) => {
                    let file = match &handle {
                        Handle::File(f) => Some(f),
                        Handle::Member { .. } => None,
                    };
                    self.record_read(job, self.identify(s, m, file)?);
                }
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
        self.handles
            .lock()
            .expect("handles lock")
            .insert(fh, Arc::new(Mutex::new(handle)));
        Ok(fh)
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
            Some(ino) => reply.entry(&self.ttl(ino), &self.attr(ino), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.node(ino) {
            Ok(_) => reply.attr(&self.ttl(ino.0), &self.attr(ino.0)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.node(ino).map(|n| &n.what) {
            Ok(What::Member { source, member }) => match &self.layers[*source] {
                Layer::Folder(f) => match std::fs::read_link(f.path(*member)) {
                    Ok(target) => reply.data(target.as_os_str().as_bytes()),
                    Err(e) => reply.error(Errno::from(e)),
                },
                Layer::Archive(_) => match &self.member(*source, *member).link {
                    Some(target) => reply.data(target),
                    None => reply.error(Errno::EINVAL),
                },
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
        // An archive never changes while mounted: what the kernel cached stays valid. A
        // folder's file may have: it is read again.
        let keep = match self.layers[s] {
            Layer::Archive(_) => FopenFlags::FOPEN_KEEP_CACHE,
            Layer::Folder(_) => FopenFlags::empty(),
        };
        match self.open_member(req, s, m, flags.0) {
            Ok(fh) => reply.opened(FileHandle(fh), keep),
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
        let mut buf = vec![0u8; size as usize];
        let read = match &mut *h {
            Handle::Member { source, reader } => {
                let Layer::Archive(p) = &self.layers[*source] else {
                    unreachable!("a member handle is on an archive")
                };
                (reader.read_at(&p.source, offset, &mut buf))
                    .map_err(|e| (e, p.source.index.archive.clone()))
            }
            Handle::File(f) => roar_archive::bytes::read_at_retry(f, &mut buf, offset)
                .map_err(|e| (e, std::path::PathBuf::from("a folder's file"))),
        };
        match read {
            Ok(n) => reply.data(&buf[..n]),
            Err((e, what)) => {
                tracing::error!("roarfs: reading {}: {e}", what.display());
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
            if let Handle::Member { source, reader } = h.into_inner().expect("handle lock") {
                if let Layer::Archive(p) = &self.layers[source] {
                    p.source.park(*reader);
                }
            }
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
        let file = match &self.layers[s] {
            Layer::Folder(f) => match f.open(m) {
                Ok(file) => Some(file),
                Err(e) => return reply.error(Errno::from(e)),
            },
            Layer::Archive(_) => None,
        };
        let value = match self.identify(s, m, file.as_ref()) {
            Ok(r) => r.encode(),
            Err(e) => return reply.error(e),
        };
        if size == 0 {
            reply.size(value.len() as u32);
        } else if (size as usize) < value.len() {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(&value);
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bytes: u64 = (self.layers.iter())
            .map(|l| match l {
                Layer::Archive(p) if p.within.is_empty() => p.source.index.identity.size,
                _ => 0,
            })
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
