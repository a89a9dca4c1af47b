//! The FUSE filesystem: a passthrough of the directory it is mounted over that reports every
//! open, write, rename and unlink to [`Jobs`]. Each method unpacks the request, does the backing
//! syscall through [`Inodes`] and replies; content hashing is [`Content`]'s; the state behind the
//! requests (attribution, the open policy, handles, listings) is in `state.rs`.
//!
//! Data path: a read-only open of a file larger than
//! [`CACHED_MAX`](crate::inodes::CACHED_MAX) is served by kernel FUSE passthrough, so reads never
//! enter this process; a smaller file is read through the mount's own page cache, kept between
//! opens while the backing file is unchanged. A writable open goes
//! through userspace: a file written sequentially from offset 0 is hashed from the write stream,
//! which names the file's content only if it saw every change to the file (the engine's content
//! generations, `roar_engine::content`: every write, truncate and fallocate through any handle is
//! counted); any other write pattern is hashed from the file after the last writer releases it
//! (see [`Inodes::open`] for how the two modes share an inode).
//!
//! Creation (create, mknod, mkdir, symlink) runs as the caller ([`sys::as_caller`]): the kernel
//! sends the full mode and the caller's umask (FUSE_DONT_MASK), so umask, default ACLs, setgid
//! directories and setuid bits come out as on the backing filesystem; so do a write, truncate,
//! chown or `O_TRUNC` open of a setuid/setgid file ([`has_sxid`]), which drop what the backing
//! filesystem drops for the caller (FUSE_HANDLE_KILLPRIV_V2). POSIX ACLs are enforced by the
//! kernel (FUSE_POSIX_ACL), which reads them through getxattr.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use roar_engine::content::{Generations, Stream};
use roar_store::ContentHash;

use crate::content::Content;
use crate::inodes::{Inodes, Opened};
use crate::jobs::{Access, JobKey, Jobs, Unreplied};
use crate::sys;

mod attrs;
mod convert;
mod data;
mod dirs;
mod names;
mod session;
mod state;

use convert::*;

/// How long the kernel keeps names (found and not found) and attributes without asking again.
/// Nothing reaches the backing tree except through this mount (it is mounted in place, over
/// the directory), and every change made through it the kernel applies to its caches itself:
/// a create replaces a cached "no such file", a passthrough write drops the size and times it
/// holds. So the cache is long: a re-open of a known file asks no LOOKUP, and GETATTR only where
/// the kernel dropped what it held (a read drops the atime). What reaches the backing files
/// another way is seen within this time (docs/SEMANTICS.md, "Kernel caches").
const TTL: Duration = Duration::from_secs(60);

/// Open replies: no FLUSH request at each close (the daemon has nothing to do then; a writable
/// handle's content is taken at RELEASE, which the kernel sends without making close wait).
const OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_NOFLUSH;

/// The flags of an open served by the daemon: it keeps the kernel's page cache of the file when
/// that cache still holds the file's content ([`Inodes::open`]).
fn open_flags(o: &Opened) -> FopenFlags {
    if o.keep_cache {
        OPEN_FLAGS | FopenFlags::FOPEN_KEEP_CACHE
    } else {
        OPEN_FLAGS
    }
}

/// The preferred I/O size the mount reports (`st_blksize`, at least): programs size their
/// buffers by it (Python's buffered files, glibc's stdio), and every write(2) to the mount is a
/// round trip to the daemon, so a Python loop of small writes reaches it in 128 KiB pieces, not
/// the backing filesystem's 4 KiB (as roarfs's archives and most network filesystems report).
const BLKSIZE: u32 = 128 << 10;

/// `__FMODE_EXEC`: set in the open flags FUSE receives when the kernel opens a file to exec it.
const FMODE_EXEC: i32 = 0x20;

struct Handle {
    file: File,
    opened: Opened,
    job: Option<JobKey>,
    writable: bool,
    /// blake3 of everything written so far, while the writes are sequential from offset 0 and
    /// nothing else changed the file.
    stream: Option<Stream>,
    /// The version this handle's job left, sealed when another job (or a process outside every
    /// job) was about to change the file while this handle was still open ([`RoarFs::change`]):
    /// the job's output, whatever the file holds by this handle's release.
    left: Option<ContentHash>,
    /// The threads that wrote through it (a shell's `> out` is written by the command it ran).
    writers: Vec<u32>,
    _backing: Option<Arc<BackingId>>,
}

type DirEntry = (OsString, u64, FileType);

/// An open handle in the daemon's table, with what never changes about it readable without its
/// lock (which a request holds while it runs).
#[derive(Clone)]
struct Open {
    ino: u64,
    job: Option<JobKey>,
    writable: bool,
    handle: Arc<Mutex<Handle>>,
}

pub struct RoarFs {
    inodes: Inodes,
    handles: RwLock<HashMap<u64, Open>>,
    /// Directory listings, read once per opendir (and again on rewind) and served by offset.
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    next_fh: AtomicU64,
    jobs: Arc<Jobs>,
    content: Content,
    /// Which versions jobs read and leave are kept, and where (`[keep]`).
    keep: Option<crate::Keep>,
    /// Every change to a file's content through the mount, counted (what a write stream's hash
    /// is checked against).
    gens: Generations,
    passthrough: AtomicBool,
    /// The kernel leaves the umask to us (FUSE_DONT_MASK granted).
    dont_mask: AtomicBool,
    /// FUSE over io_uring negotiated: requests are served on their caller's CPU.
    uring: Arc<AtomicBool>,
}

// The replies of the requests that record an access (`Jobs::event` takes one unsent).
impl Unreplied for ReplyAttr {}
impl Unreplied for ReplyCreate {}
impl Unreplied for ReplyEmpty {}
impl Unreplied for ReplyEntry {}
impl Unreplied for ReplyOpen {}

static ATTRIBUTION_FAILED: AtomicBool = AtomicBool::new(false);

/// Logs `msg` the first time `flag` is raised only: a failure that repeats per request must not
/// grow the mount's log per request.
fn log_once(flag: &AtomicBool, msg: impl FnOnce() -> String) {
    if !flag.swap(true, Ordering::Relaxed) {
        tracing::error!("{}", msg());
    }
}

impl Filesystem for RoarFs {
    /// Runs once the session has ended and every request thread has returned. The kernel does
    /// not wait for the release of a file closed just before an unmount, nor of the last file of
    /// a detached mount: when the connection ends it drops them unsent. Their handles are still
    /// here and are released now, the same way, so what their writers left is recorded.
    fn destroy(&mut self) {
        self.on_destroy()
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        self.on_init(_req, config)
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_child(parent.0, name) {
            Ok((a, g)) => reply.entry(&TTL, &a, g),
            // Node id 0: "no such file", cached like a name that exists (programs probe for
            // files that are not there: imports, configs, make's implicit rules).
            Err(Errno::ENOENT) => {
                // SAFETY: `stat` is plain data; all zeros is a valid value.
                #[allow(unsafe_code)]
                let none: libc::stat = unsafe { std::mem::zeroed() };
                reply.entry(&TTL, &attr(0, &none), Generation(0))
            }
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes.forget(ino.0, nlookup);
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
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.on_setattr(
            req, ino, mode, uid, gid, size, atime, mtime, ctime, fh, _crtime, _chgtime, _bkuptime,
            _flags, reply,
        )
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
        self.on_mknod(req, parent, name, mode, umask, rdev, reply)
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
        self.on_mkdir(req, parent, name, mode, umask, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.on_unlink(req, parent, name, reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.on_rmdir(_req, parent, name, reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.on_symlink(req, parent, link_name, target, reply)
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
        self.on_rename(req, parent, name, newparent, newname, flags, reply)
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.on_link(req, ino, newparent, newname, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.on_open(req, ino, flags, reply)
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
        self.on_create(req, parent, name, mode, umask, flags, reply)
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
        self.on_read(_req, _ino, fh, offset, size, _flags, _lock, reply)
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        wf: WriteFlags,
        flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.on_write(req, _ino, fh, offset, data, wf, flags, _lock, reply)
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.on_flush(_req, _ino, _fh, _lock, reply)
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.on_release(_req, ino, fh, _flags, _lock, _flush, reply)
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.on_fsync(_req, _ino, fh, datasync, reply)
    }

    /// The kernel caches each directory's listing (`FOPEN_CACHE_DIR`), kept between opens
    /// while the directory is unchanged ([`Inodes::open_dir`]): a re-listing asks no READDIR.
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.on_opendir(_req, ino, _flags, reply)
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.on_readdir(_req, ino, fh, offset, reply)
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.on_readdirplus(_req, ino, fh, offset, reply)
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.on_releasedir(_req, _ino, fh, _flags, reply)
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
        self.on_setxattr(_req, ino, name, value, flags, _position, reply)
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.on_getxattr(_req, ino, name, size, reply)
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.on_listxattr(_req, ino, size, reply)
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.on_removexattr(_req, ino, name, reply)
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
        self.on_fallocate(_req, _ino, fh, offset, length, mode, reply)
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
        self.on_copy_file_range(
            _req,
            _ino_in,
            _fh_in,
            _offset_in,
            _ino_out,
            _fh_out,
            _offset_out,
            _len,
            _flags,
            reply,
        )
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
        self.on_lseek(_req, _ino, fh, offset, whence, reply)
    }

    /// No ioctl is passed through (the backing fd is the daemon's, not the caller's); ENOTTY,
    /// as for a file that has none, and no log line (Python probes one on every open).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }
}
