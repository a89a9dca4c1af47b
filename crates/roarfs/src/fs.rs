//! The FUSE filesystem: a passthrough of the directory it is mounted over, reached through an fd
//! opened before the mount, that reports every open, write, rename and unlink to [`Jobs`].
//!
//! Inodes: one `O_PATH` fd per inode, deduplicated by the backing (dev, ino), with the inode's
//! parent and name kept only to name it in records; renamed parents do not break children.
//!
//! Data path: a read-only open of a file whose content is known (hashed at open, or cached) is
//! served by kernel FUSE passthrough, so reads never enter this process. A writable open goes
//! through userspace: a file written sequentially from offset 0 is hashed from the write stream;
//! any other write pattern is hashed from the file after the last writer releases it. An inode
//! is never in both modes at once (the kernel refuses that): while it has passthrough opens,
//! writers use passthrough too and are hashed after release; while it has userspace opens,
//! readers use userspace too.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use roar_store::hash::{hash_open_file, HashOptions};
use roar_store::{ContentHash, FileStat, Ops};

use crate::jobs::{JobKey, Jobs};
use crate::sys;

const TTL: Duration = Duration::from_secs(1);

/// `__FMODE_EXEC`: set in the open flags FUSE receives when the kernel opens a file to exec it.
const FMODE_EXEC: i32 = 0x20;

struct Node {
    fd: OwnedFd,
    parent: u64,
    name: OsString,
    nlookup: u64,
    backing: (u64, u64),
    /// The passthrough backing id shared by this inode's passthrough opens.
    backing_id: Weak<BackingId>,
    passthrough_opens: usize,
    userspace_opens: usize,
}

struct Handle {
    file: File,
    ino: u64,
    job: Option<JobKey>,
    writable: bool,
    /// blake3 of everything written so far, while the writes are sequential from offset 0.
    stream: Option<(blake3::Hasher, u64)>,
    wrote: bool,
    /// Served by kernel passthrough: reads and writes never reach this process.
    passthrough: bool,
    _backing: Option<Arc<BackingId>>,
}

/// Known content of backing files, by identity: files written through the mount are hashed as
/// they are written, so this is exact for them (every write passes through here).
type DirEntry = (OsString, u64, FileType);

type ContentCache = HashMap<(u64, u64), (FileStat, ContentHash)>;

pub struct RoarFs {
    root: PathBuf,
    nodes: RwLock<HashMap<u64, Node>>,
    by_backing: Mutex<HashMap<(u64, u64), u64>>,
    next_ino: AtomicU64,
    handles: RwLock<HashMap<u64, Arc<Mutex<Handle>>>>,
    /// Directory listings, read once per opendir (and again on rewind) and served by offset.
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    next_fh: AtomicU64,
    jobs: Arc<Jobs>,
    content: Mutex<ContentCache>,
    store_cache: Mutex<Option<roar_store::hash::Connection>>,
    passthrough: std::sync::atomic::AtomicBool,
}

fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

fn ts(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH
    }
}

fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn attr(ino: u64, st: &libc::stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: ts(st.st_atime, st.st_atime_nsec),
        mtime: ts(st.st_mtime, st.st_mtime_nsec),
        ctime: ts(st.st_ctime, st.st_ctime_nsec),
        crtime: ts(st.st_ctime, st.st_ctime_nsec),
        kind: kind(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

fn file_stat(st: &libc::stat) -> FileStat {
    FileStat {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size as u64,
        mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
        ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
    }
}

impl RoarFs {
    /// `root_fd` is the directory opened (O_PATH) before the mount hides it; `root` its path.
    pub fn new(
        root_fd: OwnedFd,
        root: PathBuf,
        jobs: Arc<Jobs>,
        db: Option<&Path>,
    ) -> io::Result<RoarFs> {
        let st = sys::stat_fd(root_fd.as_fd())?;
        let backing = (st.st_dev, st.st_ino);
        let mut nodes = HashMap::new();
        nodes.insert(
            1,
            Node {
                fd: root_fd,
                parent: 1,
                name: OsString::new(),
                nlookup: 1,
                backing,
                backing_id: Weak::new(),
                passthrough_opens: 0,
                userspace_opens: 0,
            },
        );
        let store_cache = db.and_then(|db| roar_store::open(db, false).ok());
        Ok(RoarFs {
            root,
            nodes: RwLock::new(nodes),
            by_backing: Mutex::new(HashMap::from([(backing, 1)])),
            next_ino: AtomicU64::new(2),
            handles: RwLock::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            jobs,
            content: Mutex::new(HashMap::new()),
            store_cache: Mutex::new(store_cache),
            passthrough: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Runs `f` with the `O_PATH` fd of inode `ino`.
    fn with_fd<T>(
        &self,
        ino: u64,
        f: impl FnOnce(BorrowedFd<'_>) -> io::Result<T>,
    ) -> Result<T, Errno> {
        let nodes = self.nodes.read().expect("nodes lock");
        let node = nodes.get(&ino).ok_or(Errno::ENOENT)?;
        f(node.fd.as_fd()).map_err(errno)
    }

    /// The path of `ino` as programs see it (through the mount).
    fn path(&self, ino: u64) -> PathBuf {
        let nodes = self.nodes.read().expect("nodes lock");
        let mut names = Vec::new();
        let mut cur = ino;
        while cur != 1 {
            let Some(n) = nodes.get(&cur) else { break };
            names.push(n.name.clone());
            cur = n.parent;
        }
        let mut p = self.root.clone();
        for n in names.iter().rev() {
            p.push(n);
        }
        p
    }

    fn child_path(&self, parent: u64, name: &OsStr) -> PathBuf {
        self.path(parent).join(name)
    }

    /// Looks up (and remembers) the child `name` of `parent`, counting one kernel lookup.
    fn lookup_child(&self, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        let fd = self.with_fd(parent, |dir| sys::open_path(dir, name))?;
        let st = sys::stat_fd(fd.as_fd()).map_err(errno)?;
        let backing = (st.st_dev, st.st_ino);
        let mut by_backing = self.by_backing.lock().expect("backing lock");
        let mut nodes = self.nodes.write().expect("nodes lock");
        if let Some(&ino) = by_backing.get(&backing) {
            if let Some(node) = nodes.get_mut(&ino) {
                node.nlookup += 1;
                node.parent = parent;
                node.name = name.to_owned();
                return Ok(attr(ino, &st));
            }
        }
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        nodes.insert(
            ino,
            Node {
                fd,
                parent,
                name: name.to_owned(),
                nlookup: 1,
                backing,
                backing_id: Weak::new(),
                passthrough_opens: 0,
                userspace_opens: 0,
            },
        );
        by_backing.insert(backing, ino);
        Ok(attr(ino, &st))
    }

    /// Creates `name` in `parent` with `make`, gives it to the caller and replies with its
    /// attributes (mknod, mkdir, symlink).
    fn make_entry(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        reply: ReplyEntry,
        make: impl FnOnce(BorrowedFd<'_>) -> io::Result<()>,
    ) {
        let made = self
            .with_fd(parent, make)
            .and_then(|_| self.lookup_child(parent, name))
            .map(|a| {
                self.chown_to_caller(req, a.ino.0);
                self.with_fd(a.ino.0, sys::stat_fd)
                    .map(|st| attr(a.ino.0, &st))
                    .unwrap_or(a)
            });
        match made {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    /// After creating something as root, give it to the caller (as a real filesystem would).
    fn chown_to_caller(&self, req: &Request, ino: u64) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 && (req.uid() != 0 || req.gid() != 0) {
            let _ = self.with_fd(ino, |fd| {
                sys::chown_fd(fd, Some(req.uid()), Some(req.gid()))
            });
        }
    }

    fn cached_content(&self, stat: &FileStat) -> Option<ContentHash> {
        let content = self.content.lock().expect("content lock");
        if let Some((known, h)) = content.get(&(stat.dev, stat.ino)) {
            if known == stat {
                return Some(h.clone());
            }
        }
        drop(content);
        let guard = self.store_cache.lock().expect("store lock");
        roar_store::hash::cache_get(guard.as_ref()?, stat, HashOptions::default())
    }

    fn remember(&self, stat: FileStat, hash: &ContentHash) {
        self.content
            .lock()
            .expect("content lock")
            .insert((stat.dev, stat.ino), (stat, hash.clone()));
    }

    /// The content of an open file: from the caches, else hashed now (and remembered).
    fn content_of(&self, file: &File, path: &Path) -> Option<ContentHash> {
        let st = sys::stat_fd(file.as_fd()).ok()?;
        self.content_at(file, &st, path)
    }

    /// [`RoarFs::content_of`] for a file already stat'ed as `st`.
    fn content_at(&self, file: &File, st: &libc::stat, path: &Path) -> Option<ContentHash> {
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        if let Some(h) = self.cached_content(&file_stat(st)) {
            return Some(h);
        }
        let hashed = hash_open_file(file, path, HashOptions::default()).ok()?;
        self.remember(hashed.stat, &hashed.hash);
        let _ = self.jobs.writer().cache(vec![roar_store::CacheEntry {
            stat: hashed.stat,
            hash: hashed.hash.clone(),
            hashed_ns: hashed.read_ns,
        }]);
        Some(hashed.hash)
    }

    /// Opens inode `ino` for a request and replies, choosing passthrough or userspace.
    fn open_node(
        &self,
        req: &Request,
        ino: u64,
        file: File,
        flags: i32,
        created: bool,
    ) -> Result<(u64, bool), Errno> {
        let acc = flags & libc::O_ACCMODE;
        let writable = acc != libc::O_RDONLY;
        // The kernel opening a program to exec it: the process still shows its old argv, and
        // like `roar run`, the mount records programs as processes, not as data inputs.
        let job = if flags & FMODE_EXEC != 0 {
            None
        } else {
            self.jobs.job_of(req.pid())
        };
        let stat = sys::stat_fd(file.as_fd()).ok();
        let is_file = stat
            .as_ref()
            .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG);
        if let (Some(job), Some(st)) = (job, stat.as_ref().filter(|_| is_file)) {
            let path = self.path(ino);
            if writable {
                // The content before the job touched it is an input when the write keeps it.
                let keeps = !created && flags & libc::O_TRUNC == 0;
                let before = if keeps {
                    sys::reopen(file.as_fd(), libc::O_RDONLY)
                        .ok()
                        .and_then(|f| self.content_of(&f, &path))
                } else {
                    None
                };
                self.jobs.with_file(job, &path, |st| {
                    st.ops.insert(Ops::WRITE);
                    if created {
                        st.ops.insert(Ops::CREATE);
                    }
                    if flags & libc::O_TRUNC != 0 {
                        st.ops.insert(Ops::TRUNCATE);
                    }
                    if keeps && !st.job_made && !st.read_prior {
                        st.read_prior = true;
                        st.input = before;
                    }
                    st.job_made = true;
                    st.exists = true;
                });
                self.jobs.writer_opened(job);
                // Invalidate: the content is about to change.
                self.content
                    .lock()
                    .expect("content lock")
                    .remove(&(st.st_dev, st.st_ino));
            } else {
                let content = self.content_at(&file, st, &path);
                self.jobs.with_file(job, &path, |st| {
                    st.ops.insert(Ops::READ);
                    if !st.job_made && !st.read_prior {
                        st.read_prior = true;
                        st.input = content;
                    }
                });
            }
        }
        let mut use_passthrough = false;
        {
            let mut nodes = self.nodes.write().expect("nodes lock");
            let node = nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
            if is_file && self.passthrough.load(Ordering::Relaxed) {
                use_passthrough = if writable {
                    node.passthrough_opens > 0
                } else {
                    node.userspace_opens == 0
                };
            }
            if use_passthrough {
                node.passthrough_opens += 1;
            } else {
                node.userspace_opens += 1;
            }
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let stream = (writable && (created || flags & libc::O_TRUNC != 0) && !use_passthrough)
            .then(|| (blake3::Hasher::new(), 0));
        let handle = Handle {
            file,
            ino,
            job,
            writable,
            stream,
            wrote: created || flags & libc::O_TRUNC != 0,
            passthrough: use_passthrough,
            _backing: None,
        };
        self.handles
            .write()
            .expect("handles lock")
            .insert(fh, Arc::new(Mutex::new(handle)));
        Ok((fh, use_passthrough))
    }

    /// Registers (or reuses) the passthrough backing id of `ino` for handle `fh`.
    fn attach_backing(
        &self,
        fh: u64,
        ino: u64,
        make: impl FnOnce(&File) -> io::Result<BackingId>,
    ) -> io::Result<Arc<BackingId>> {
        let handle = self
            .handle(fh)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let mut h = handle.lock().expect("handle lock");
        let mut nodes = self.nodes.write().expect("nodes lock");
        let node = nodes
            .get_mut(&ino)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let id = match node.backing_id.upgrade() {
            Some(id) => id,
            None => {
                let id = Arc::new(make(&h.file)?);
                node.backing_id = Arc::downgrade(&id);
                id
            }
        };
        h._backing = Some(id.clone());
        Ok(id)
    }

    /// Undoes `open_node` when the reply could not be sent as planned.
    fn forget_handle(&self, fh: u64) {
        let Some(handle) = self.handles.write().expect("handles lock").remove(&fh) else {
            return;
        };
        let h = handle.lock().expect("handle lock");
        self.close_on_node(&h);
        if let (true, Some(job)) = (h.writable, h.job) {
            self.jobs.writer_released(job);
        }
    }

    /// One open of `h.ino` fewer; drops the inode once the kernel has forgotten it too.
    fn close_on_node(&self, h: &Handle) {
        let mut forgotten = None;
        {
            let mut nodes = self.nodes.write().expect("nodes lock");
            if let Some(node) = nodes.get_mut(&h.ino) {
                if h.passthrough {
                    node.passthrough_opens = node.passthrough_opens.saturating_sub(1);
                } else {
                    node.userspace_opens = node.userspace_opens.saturating_sub(1);
                }
                if node.nlookup == 0 && node.passthrough_opens == 0 && node.userspace_opens == 0 {
                    forgotten = Some(node.backing);
                    nodes.remove(&h.ino);
                }
            }
        }
        // Lock order is by_backing before nodes everywhere, so this waits until nodes is released.
        if let Some(backing) = forgotten {
            let mut by_backing = self.by_backing.lock().expect("backing lock");
            if by_backing.get(&backing) == Some(&h.ino) {
                by_backing.remove(&backing);
            }
        }
    }

    fn handle(&self, fh: u64) -> Option<Arc<Mutex<Handle>>> {
        self.handles.read().expect("handles lock").get(&fh).cloned()
    }

    fn list_dir(&self, ino: u64) -> Result<Arc<Vec<DirEntry>>, Errno> {
        let entries = self.with_fd(ino, sys::read_dir)?;
        let dots = [
            (OsString::from("."), ino, FileType::Directory),
            (OsString::from(".."), 1, FileType::Directory),
        ];
        Ok(Arc::new(
            dots.into_iter()
                .chain(entries.into_iter().map(|(n, i, t)| (n, i, dtype(t))))
                .collect(),
        ))
    }

    /// The listing of an open directory; offset 0 (a new pass or a rewind) reads it afresh.
    fn dir_entries(&self, ino: u64, fh: u64, offset: u64) -> Result<Arc<Vec<DirEntry>>, Errno> {
        let cached = self.dirs.lock().expect("dirs lock").get(&fh).cloned();
        match cached {
            Some(e) if offset > 0 => Ok(e),
            _ => {
                let e = self.list_dir(ino)?;
                self.dirs.lock().expect("dirs lock").insert(fh, e.clone());
                Ok(e)
            }
        }
    }
}

impl Filesystem for RoarFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok() {
            // Backing files live on the directory's own filesystem: one level of stacking.
            if config.set_max_stack_depth(1).is_ok() {
                self.passthrough.store(true, Ordering::Relaxed);
            }
        }
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_child(parent.0, name) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if ino.0 == 1 {
            return;
        }
        let mut by_backing = self.by_backing.lock().expect("backing lock");
        let mut nodes = self.nodes.write().expect("nodes lock");
        if let Some(node) = nodes.get_mut(&ino.0) {
            node.nlookup = node.nlookup.saturating_sub(nlookup);
            if node.nlookup == 0 && node.passthrough_opens == 0 && node.userspace_opens == 0 {
                let node = nodes.remove(&ino.0).expect("present");
                if by_backing.get(&node.backing) == Some(&ino.0) {
                    by_backing.remove(&node.backing);
                }
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = match fh.and_then(|fh| self.handle(fh.0)) {
            Some(h) => sys::stat_fd(h.lock().expect("handle lock").file.as_fd()).map_err(errno),
            None => self.with_fd(ino.0, sys::stat_fd),
        };
        match st {
            Ok(st) => reply.attr(&TTL, &attr(ino.0, &st)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let conv = |t: Option<TimeOrNow>| {
            t.map(|t| match t {
                TimeOrNow::Now => None,
                TimeOrNow::SpecificTime(t) => {
                    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
                    Some(libc::timespec {
                        tv_sec: d.as_secs() as i64,
                        tv_nsec: d.subsec_nanos() as i64,
                    })
                }
            })
        };
        let result = self.with_fd(ino.0, |fd| {
            if let Some(mode) = mode {
                sys::chmod_fd(fd, mode)?;
            }
            if uid.is_some() || gid.is_some() {
                sys::chown_fd(fd, uid, gid)?;
            }
            if let Some(size) = size {
                match fh.and_then(|fh| self.handle(fh.0)) {
                    Some(h) => {
                        let mut h = h.lock().expect("handle lock");
                        h.file.set_len(size)?;
                        h.wrote = true;
                        if h.stream.as_ref().is_some_and(|(_, n)| *n != size) {
                            h.stream = None;
                        }
                    }
                    None => sys::truncate_fd(fd, size)?,
                }
            }
            if atime.is_some() || mtime.is_some() {
                sys::utimens_fd(fd, conv(atime), conv(mtime))?;
            }
            sys::stat_fd(fd)
        });
        if size.is_some() && result.is_ok() {
            // A truncate is a write: the content changed.
            if let Some(job) = self.jobs.job_of(req.pid()) {
                let path = self.path(ino.0);
                let content = self
                    .with_fd(ino.0, |fd| sys::reopen(fd, libc::O_RDONLY))
                    .ok()
                    .and_then(|f| self.content_of(&f, &path));
                self.jobs.with_file(job, &path, |st| {
                    st.ops.insert(Ops::TRUNCATE);
                    st.job_made = true;
                    st.exists = true;
                    st.output = content;
                });
            }
        }
        match result {
            Ok(st) => reply.attr(&TTL, &attr(ino.0, &st)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.with_fd(ino.0, sys::readlink_fd) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.make_entry(req, parent.0, name, reply, |dir| {
            sys::mknod_at(dir, name, mode & !umask, rdev)
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.make_entry(req, parent.0, name, reply, |dir| {
            sys::mkdir_at(dir, name, mode & !umask)
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        // Only a job's regular files are recorded; the extra stat is paid only for them.
        let job = self.jobs.job_of(req.pid()).filter(|_| {
            self.with_fd(parent.0, |dir| {
                sys::open_path(dir, name).and_then(|fd| sys::stat_fd(fd.as_fd()))
            })
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
        });
        match self.with_fd(parent.0, |dir| sys::unlink_at(dir, name, 0)) {
            Ok(()) => {
                if let Some(job) = job {
                    self.jobs
                        .with_file(job, &self.child_path(parent.0, name), |st| {
                            st.ops.insert(Ops::UNLINK);
                            st.exists = false;
                        });
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.with_fd(parent.0, |dir| {
            sys::unlink_at(dir, name, libc::AT_REMOVEDIR)
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.make_entry(req, parent.0, link_name, reply, |dir| {
            sys::symlink_at(target.as_os_str(), dir, link_name)
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (from, to) = (
            self.child_path(parent.0, name),
            self.child_path(newparent.0, newname),
        );
        let moved = self.with_fd(parent.0, |dir| sys::open_path(dir, name)).ok();
        let result = {
            let nodes = self.nodes.read().expect("nodes lock");
            match (nodes.get(&parent.0), nodes.get(&newparent.0)) {
                (Some(a), Some(b)) => {
                    sys::rename_at(a.fd.as_fd(), name, b.fd.as_fd(), newname, flags.bits())
                        .map_err(errno)
                }
                _ => Err(Errno::ENOENT),
            }
        };
        if let Err(e) = result {
            reply.error(e);
            return;
        }
        // Keep the renamed inode's name current (children follow through their parent link).
        if let Some(fd) = &moved {
            if let Ok(st) = sys::stat_fd(fd.as_fd()) {
                let key = (st.st_dev, st.st_ino);
                if let Some(&ino) = self.by_backing.lock().expect("backing lock").get(&key) {
                    if let Some(n) = self.nodes.write().expect("nodes lock").get_mut(&ino) {
                        n.parent = newparent.0;
                        n.name = newname.to_owned();
                    }
                }
                let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
                if st.st_mode & libc::S_IFMT == libc::S_IFDIR && !exchange {
                    self.jobs.rename_dir(&from, &to);
                }
                if let (true, Some(job)) = (
                    st.st_mode & libc::S_IFMT == libc::S_IFREG,
                    self.jobs.job_of(req.pid()),
                ) {
                    let content = || {
                        sys::reopen(fd.as_fd(), libc::O_RDONLY)
                            .ok()
                            .and_then(|f| self.content_of(&f, &to))
                    };
                    self.jobs.rename(job, &from, &to, content);
                    if exchange {
                        let back = self.with_fd(parent.0, |dir| sys::open_path(dir, name)).ok();
                        let content = || {
                            back.as_ref()
                                .and_then(|fd| sys::reopen(fd.as_fd(), libc::O_RDONLY).ok())
                                .and_then(|f| self.content_of(&f, &from))
                        };
                        self.jobs.with_file(job, &from, |st| {
                            st.ops.insert(Ops::RENAME);
                            st.job_made = true;
                            st.exists = true;
                            st.output = content();
                        });
                    }
                }
            }
        }
        reply.ok();
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = {
            let nodes = self.nodes.read().expect("nodes lock");
            match (nodes.get(&ino.0), nodes.get(&newparent.0)) {
                (Some(n), Some(p)) => {
                    sys::link_at(n.fd.as_fd(), p.fd.as_fd(), newname).map_err(errno)
                }
                _ => Err(Errno::ENOENT),
            }
        };
        match r.and_then(|_| self.lookup_child(newparent.0, newname)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let file = match self.with_fd(ino.0, |fd| sys::reopen(fd, flags.0)) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        match self.open_node(req, ino.0, file, flags.0, false) {
            Ok((fh, false)) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Ok((fh, true)) => match self.attach_backing(fh, ino.0, |f| reply.open_backing(f)) {
                Ok(id) => reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id),
                Err(e) => {
                    self.forget_handle(fh);
                    reply.error(errno(e));
                }
            },
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let file = match self.with_fd(parent.0, |dir| {
            sys::create_at(dir, name, flags, mode & !umask)
        }) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let a = match self.lookup_child(parent.0, name) {
            Ok(a) => a,
            Err(e) => return reply.error(e),
        };
        self.chown_to_caller(req, a.ino.0);
        let a = self
            .with_fd(a.ino.0, sys::stat_fd)
            .map(|st| attr(a.ino.0, &st))
            .unwrap_or(a);
        match self.open_node(req, a.ino.0, file, flags, true) {
            Ok((fh, false)) => {
                reply.created(&TTL, &a, Generation(0), FileHandle(fh), FopenFlags::empty())
            }
            Ok((fh, true)) => match self.attach_backing(fh, a.ino.0, |f| reply.open_backing(f)) {
                Ok(id) => reply.created_passthrough(
                    &TTL,
                    &a,
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                    &id,
                ),
                Err(e) => {
                    self.forget_handle(fh);
                    reply.error(errno(e));
                }
            },
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
        let Some(h) = self.handle(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let h = h.lock().expect("handle lock");
        let mut buf = vec![0u8; size as usize];
        let mut n = 0;
        while n < buf.len() {
            match h.file.read_at(&mut buf[n..], offset + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(errno(e)),
            }
        }
        reply.data(&buf[..n]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _wf: WriteFlags,
        flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(h) = self.handle(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let mut h = h.lock().expect("handle lock");
        // O_APPEND: the backing fd appends by itself; the kernel's offset is advisory then.
        let r = if flags.0 & libc::O_APPEND != 0 {
            use std::io::Write;
            (&h.file).write_all(data)
        } else {
            h.file.write_all_at(data, offset)
        };
        match r {
            Ok(()) => {
                h.wrote = true;
                let sequential = flags.0 & libc::O_APPEND == 0
                    && h.stream.as_ref().is_some_and(|(_, next)| *next == offset);
                if sequential {
                    let (hasher, next) = h.stream.as_mut().expect("checked");
                    hasher.update(data);
                    *next += data.len() as u64;
                } else {
                    h.stream = None;
                }
                reply.written(data.len() as u32);
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
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
        let Some(handle) = self.handles.write().expect("handles lock").remove(&fh.0) else {
            return reply.ok();
        };
        reply.ok();
        // A request still running on this handle holds it only briefly: wait for it.
        let mut h = handle.lock().expect("handle lock");
        self.close_on_node(&h);
        if !h.writable {
            return;
        }
        let Some(job) = h.job else { return };
        if h.wrote || h.passthrough {
            let path = self.path(h.ino);
            let size = h.file.metadata().map(|m| m.len()).ok();
            let hash = match h.stream.take() {
                // Written from 0 to the end in one go: the stream is the content.
                Some((hasher, n)) if Some(n) == size => {
                    let hash = ContentHash {
                        blake3: hasher.finalize().to_hex().to_string(),
                        sha256: None,
                        size: n,
                    };
                    if let Ok(st) = sys::stat_fd(h.file.as_fd()) {
                        self.remember(file_stat(&st), &hash);
                    }
                    Some(hash)
                }
                _ => sys::reopen(h.file.as_fd(), libc::O_RDONLY)
                    .ok()
                    .and_then(|f| self.content_of(&f, &path)),
            };
            self.jobs.with_file(job, &path, |st| {
                st.output = hash;
                st.exists = true;
            });
        }
        self.jobs.writer_released(job);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let Some(h) = self.handle(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let h = h.lock().expect("handle lock");
        let r = if datasync {
            h.file.sync_data()
        } else {
            h.file.sync_all()
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.with_fd(ino.0, |fd| {
            sys::reopen(fd, libc::O_RDONLY | libc::O_DIRECTORY)
        }) {
            Ok(_) => reply.opened(
                FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed)),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.dir_entries(ino.0, fh.0, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        for (i, (name, backing_ino, kind)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo((*backing_ino).max(2)), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = match self.dir_entries(ino.0, fh.0, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        let dir_attr = match self.with_fd(ino.0, sys::stat_fd) {
            Ok(st) => attr(ino.0, &st),
            Err(e) => return reply.error(e),
        };
        for (i, (name, _, _)) in entries.iter().enumerate().skip(offset as usize) {
            let next = (i + 1) as u64;
            // "." and ".." are not looked up (the kernel does not count them).
            if name == "." || name == ".." {
                if reply.add(
                    dir_attr.ino,
                    next,
                    name,
                    &Duration::ZERO,
                    &dir_attr,
                    Generation(0),
                ) {
                    break;
                }
                continue;
            }
            // Every other entry returned with attributes counts as a lookup for the kernel.
            let Ok(a) = self.lookup_child(ino.0, name) else {
                continue;
            };
            if reply.add(a.ino, next, name, &TTL, &a, Generation(0)) {
                self.forget(req, a.ino, 1);
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.lock().expect("dirs lock").remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        match self.with_fd(ino.0, sys::statvfs_fd) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        match self.with_fd(ino.0, |fd| {
            sys::xattr(fd, sys::Xattr::Set(name, value, flags))
        }) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let mut buf = vec![0u8; size as usize];
        match self.with_fd(ino.0, |fd| sys::xattr(fd, sys::Xattr::Get(name, &mut buf))) {
            Ok(n) if size == 0 => reply.size(n as u32),
            Ok(n) => reply.data(&buf[..n]),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let mut buf = vec![0u8; size as usize];
        match self.with_fd(ino.0, |fd| sys::xattr(fd, sys::Xattr::List(&mut buf))) {
            Ok(n) if size == 0 => reply.size(n as u32),
            Ok(n) => reply.data(&buf[..n]),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.with_fd(ino.0, |fd| sys::xattr(fd, sys::Xattr::Remove(name))) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions makes the kernel check modes; existence is all that is left.
        match self.with_fd(ino.0, sys::stat_fd) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let Some(h) = self.handle(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let mut h = h.lock().expect("handle lock");
        match sys::fallocate(&h.file, mode, offset, length) {
            Ok(()) => {
                h.wrote = true;
                h.stream = None;
                reply.ok();
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Not offered: the kernel then copies with read and write, which is where content is hashed.
    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let Some(h) = self.handle(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let h = h.lock().expect("handle lock");
        match sys::lseek(&h.file, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(errno(e)),
        }
    }
}

fn dtype(t: u8) -> FileType {
    match t {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}
