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

mod state;

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
        blksize: (st.st_blksize as u32).max(BLKSIZE),
        flags: 0,
    }
}

fn is_reg(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// A time setattr asks for, as utimensat(2) takes it: None to leave it, `Some(None)` for now.
fn timespec_of(t: Option<TimeOrNow>) -> Option<Option<libc::timespec>> {
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
}

/// A regular file with a setuid or setgid bit: what a write, a truncate, a chown or an `O_TRUNC`
/// open by an unprivileged caller may have to drop. The daemon runs those operations with the
/// caller's ids ([`sys::as_caller`]), so the backing filesystem drops exactly what it would for
/// the caller (the kernel leaves it to the daemon: `FUSE_HANDLE_KILLPRIV_V2`).
fn has_sxid(st: &libc::stat) -> bool {
    is_reg(st) && st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0
}

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
        let left: Vec<_> = self
            .handles
            .write()
            .expect("handles lock")
            .drain()
            .map(|(_, h)| h)
            .collect();
        if !left.is_empty() {
            tracing::info!(
                "roarfs: {} handle(s) without a release from the kernel released at the end",
                left.len()
            );
        }
        for open in left {
            self.released(&open.handle);
        }
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // ROAR_MOUNT_PASSTHROUGH=0 serves every read here too (a kernel whose passthrough
        // misbehaves; the tests of the userspace data path).
        let wanted = std::env::var_os("ROAR_MOUNT_PASSTHROUGH").is_none_or(|v| v != "0");
        if wanted && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok() {
            // Backing files live on the directory's own filesystem: one level of stacking.
            if config.set_max_stack_depth(1).is_ok() {
                self.passthrough.store(true, Ordering::Relaxed);
            }
        }
        // Listings with attributes only where the program then stats what it listed (ls -l, not
        // find): each entry costs the kernel a lookup here, and round trips are what a FUSE
        // mount pays for. Lookups in one directory may run in parallel.
        let _ = config.add_capabilities(
            InitFlags::FUSE_DO_READDIRPLUS
                | InitFlags::FUSE_READDIRPLUS_AUTO
                | InitFlags::FUSE_PARALLEL_DIROPS,
        );
        // ACLs: the kernel checks them (it reads them through getxattr) and leaves the umask to
        // the backing filesystem, which applies a default ACL instead where there is one.
        if config.add_capabilities(InitFlags::FUSE_POSIX_ACL).is_err() {
            tracing::warn!("roarfs: the kernel does not offer FUSE_POSIX_ACL: ACLs are not enforced through the mount");
        }
        // `open(O_TRUNC)` reaches us as one open with O_TRUNC, not an open the kernel follows
        // with a truncate: without it an overwrite (`echo x > f`, `cp a f`) first opens the old
        // content for writing, and that content would count as the job's input.
        if config
            .add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC)
            .is_err()
        {
            tracing::warn!("roarfs: the kernel does not offer FUSE_ATOMIC_O_TRUNC: overwrites may be recorded as reads of the old content");
        }
        // The daemon drops setuid/setgid bits itself (`has_sxid`), so the kernel remembers per
        // inode that a file has nothing to drop (SB_NOSEC) instead of asking GETXATTR
        // security.capability before every write(2).
        if config
            .add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
            .is_err()
        {
            tracing::info!("roarfs: the kernel does not offer FUSE_HANDLE_KILLPRIV_V2: every write asks for security.capability first");
        }
        if config.add_capabilities(InitFlags::FUSE_DONT_MASK).is_ok() {
            self.dont_mask.store(true, Ordering::Relaxed);
        }
        // ROAR_MOUNT_URING=1: requests through per-CPU io_uring queues where the kernel offers
        // them (Linux 6.14+ with `enable_uring` set), served on the CPU of the process that made
        // them. Faster for streams of requests (`ls -lR`, small files), but the scheduler then
        // moves a job between CPUs at replies, which costs jobs that compute between opens more
        // CPU (bench/NOTES.md): asked for, not the default.
        let uring = std::env::var_os("ROAR_MOUNT_URING").is_some_and(|v| v == "1");
        if uring {
            match config.add_capabilities(InitFlags::FUSE_OVER_IO_URING) {
                Ok(_) => self.uring.store(true, Ordering::Relaxed),
                Err(_) => tracing::warn!("roarfs: ROAR_MOUNT_URING=1 but the kernel does not offer FUSE over io_uring (Linux 6.14+, /sys/module/fuse/parameters/enable_uring): serving /dev/fuse"),
            }
        }
        Ok(())
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
        let job = match size.map(|_| self.job(req)).transpose() {
            Ok(job) => job.flatten(),
            Err(e) => return reply.error(e),
        };
        let caller = self.caller(req, 0);
        let result = self.with_fd(ino.0, |fd| {
            if let Some(mode) = mode {
                sys::chmod_fd(fd, mode)?;
            }
            // A chown or truncate of a setuid/setgid file runs as the caller: what it drops of
            // those bits is what the backing filesystem drops for that caller.
            let sxid = (uid.is_some() || gid.is_some() || size.is_some())
                && sys::stat_fd(fd).is_ok_and(|st| has_sxid(&st));
            let as_caller = |f: &mut dyn FnMut() -> io::Result<()>| {
                if sxid {
                    sys::as_caller(caller, f)
                } else {
                    f()
                }
            };
            // chown(f, -1, -1) arrives with nothing to set (or only ctime): it changes ctime,
            // which the same call on the backing file does.
            let only_ctime = mode.is_none()
                && size.is_none()
                && atime.is_none()
                && mtime.is_none()
                && (ctime.is_some() || fh.is_none());
            if uid.is_some() || gid.is_some() || only_ctime {
                as_caller(&mut || sys::chown_fd(fd, uid, gid))?;
            }
            if let Some(size) = size {
                let change = self.change(ino.0, job, fh.map(|fh| fh.0));
                match fh.and_then(|fh| self.handle(fh.0)) {
                    Some(h) => {
                        let mut h = h.lock().expect("handle lock");
                        h.left = None;
                        let r = as_caller(&mut || h.file.set_len(size));
                        match (&r, h.stream.as_mut()) {
                            (Ok(()), Some(s)) => s.resized(size, change),
                            _ => h.stream = None,
                        }
                        r?
                    }
                    None => as_caller(&mut || sys::truncate_fd(fd, size))?,
                }
            }
            if atime.is_some() || mtime.is_some() {
                sys::utimens_fd(fd, timespec_of(atime), timespec_of(mtime))?;
            }
            let st = sys::stat_fd(fd)?;
            // A truncate is a write: the content changed.
            if let (Some(job), Some(_)) = (job, size) {
                let path = self.inodes.path(ino.0);
                // Through a handle, the file may live elsewhere by now (renamed over, removed):
                // then nothing happened at the path.
                if fh.is_none() || self.jobs.names(job, &path, ino.0) {
                    self.jobs
                        .event(&reply, req.pid(), job, Access::Truncate(&path));
                }
                // By path: what it left (through a handle, the handle's release says).
                if fh.is_none() {
                    let mark = self.jobs.mark(job);
                    if let Some(content) = self.content.of_path_fd(fd, &path) {
                        self.jobs.found(job, &path, ino.0, content, mark);
                    }
                }
            }
            Ok(st)
        });
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
        let make = |dir: BorrowedFd<'_>| sys::mknod_at(dir, name, mode, rdev);
        self.make_entry(req, (parent.0, name), umask, reply, make, |_| ());
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
        let make = |dir: BorrowedFd<'_>| sys::mkdir_at(dir, name, mode);
        self.make_entry(req, (parent.0, name), umask, reply, make, |_| ());
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let job = match self.job(req) {
            Ok(job) => job,
            Err(e) => return reply.error(e),
        };
        let result = self.with_fd(parent.0, |dir| {
            // What is unlinked: a job's regular files and symlinks are recorded, and a file with
            // other names keeps one in the node table.
            let st = sys::open_path(dir, name).and_then(|fd| sys::stat_fd(fd.as_fd()));
            sys::unlink_at(dir, name, 0).map(|()| st.ok())
        });
        match result {
            Ok(st) => {
                if let Some(st) = st.as_ref().filter(|st| st.st_nlink > 1) {
                    self.inodes.unlinked(st, parent.0, name);
                }
                let recorded = job.is_some()
                    && st.is_some_and(|st| {
                        is_reg(&st) || st.st_mode & libc::S_IFMT == libc::S_IFLNK
                    });
                if let (true, Some(job)) = (recorded, job) {
                    let path = self.child_path(parent.0, name);
                    self.jobs
                        .event(&reply, req.pid(), job, Access::Unlink(&path));
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
        let job = match self.job(req) {
            Ok(job) => job,
            Err(e) => return reply.error(e),
        };
        let make = |dir: BorrowedFd<'_>| sys::symlink_at(target.as_os_str(), dir, link_name);
        // A name the job made, as under `roar run`: a temp if it removes it again (configure's
        // `conftest.sym`). Kept, it is recorded without content (docs/SEMANTICS.md).
        let made = |reply: &ReplyEntry| {
            if let Some(job) = job {
                let path = self.child_path(parent.0, link_name);
                self.jobs
                    .event(reply, req.pid(), job, Access::Symlink(&path));
            }
        };
        self.make_entry(req, (parent.0, link_name), 0, reply, make, made);
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
        let job = match self.job(req) {
            Ok(job) => job,
            Err(e) => return reply.error(e),
        };
        let (from, to) = (
            self.child_path(parent.0, name),
            self.child_path(newparent.0, newname),
        );
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        let result = self.with_fd(parent.0, |a| {
            let moved = sys::open_path(a, name).ok();
            self.inodes.with_fd(newparent.0, |b| {
                // A file with other names replaced here loses this one.
                let replaced = (!exchange)
                    .then(|| sys::open_path(b, newname).and_then(|f| sys::stat_fd(f.as_fd())))
                    .and_then(Result::ok)
                    .filter(|st| st.st_nlink > 1);
                sys::rename_at(a, name, b, newname, flags.bits()).map(|()| (moved, replaced))
            })
        });
        let moved = match result {
            Ok((moved, replaced)) => {
                if let Some(st) = replaced {
                    self.inodes.unlinked(&st, newparent.0, newname);
                }
                moved
            }
            Err(e) => return reply.error(e),
        };
        let Some(st) = moved.as_ref().and_then(|fd| sys::stat_fd(fd.as_fd()).ok()) else {
            return reply.ok();
        };
        let fd = moved.as_ref().expect("stat'ed").as_fd();
        self.inodes.moved(&st, newparent.0, newname);
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR && !exchange {
            // What the moved directory holds below each name, asked of it (not of the mount).
            let holds = |rest: &Path| {
                sys::open_path(fd, rest.as_os_str())
                    .and_then(|f| sys::stat_fd(f.as_fd()))
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT != libc::S_IFDIR)
            };
            self.jobs.moved_dir(&from, &to, holds);
        }
        // A symbolic link the job made moves as a file does (`roar run` records its rename too).
        let symlink = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
        if let (true, Some(job)) = (is_reg(&st) || symlink, job) {
            let back = exchange
                .then(|| self.with_fd(parent.0, |dir| sys::open_path(dir, name)).ok())
                .flatten();
            let back_st = back.as_ref().and_then(|b| sys::stat_fd(b.as_fd()).ok());
            if let Some(back_st) = &back_st {
                self.inodes.moved(back_st, parent.0, name);
            }
            // What each name held before the move, where the job does not know it yet: a
            // pre-existing file renamed away unread is an input with these bytes.
            let held = [
                (&from, Some(fd), Some(&st)),
                (&to, back.as_ref().map(|b| b.as_fd()), back_st.as_ref()),
            ];
            for (path, fd, st) in held {
                let st = st.filter(|st| is_reg(st));
                let (Some(fd), Some(id)) = (fd, st.and_then(|st| self.inodes.id_of(st))) else {
                    continue;
                };
                if self.jobs.wants_content(job, path) {
                    let mark = self.jobs.mark(job);
                    if let Some(content) = self.content.of_path_fd(fd, path) {
                        self.jobs.found(job, path, id, content, mark);
                    }
                }
            }
            let access = Access::Rename {
                from: &from,
                to: &to,
                exchange,
            };
            self.jobs.event(&reply, req.pid(), job, access);
        }
        reply.ok();
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let job = match self.job(req) {
            Ok(job) => job,
            Err(e) => return reply.error(e),
        };
        // The existing name, before the new one becomes the inode's name here.
        let source = self.inodes.path(ino.0);
        let r = self.with_fd(ino.0, |f| {
            self.inodes
                .with_fd(newparent.0, |dir| sys::link_at(f, dir, newname))
        });
        match r.and_then(|_| self.lookup_child(newparent.0, newname)) {
            Ok((a, g)) => {
                // A new name the job made, with the linked file's content (`roar run` records a
                // link the same way).
                if let (Some(job), FileType::RegularFile) = (job, a.kind) {
                    let path = self.child_path(newparent.0, newname);
                    let access = Access::Link {
                        from: &source,
                        to: &path,
                    };
                    self.jobs.event(&reply, req.pid(), job, access);
                    if self.jobs.wants_content(job, &path) {
                        let mark = self.jobs.mark(job);
                        let content = self
                            .with_fd(ino.0, |f| Ok(self.content.of_path_fd(f, &path)))
                            .ok()
                            .flatten();
                        if let Some(content) = content {
                            self.jobs.found(job, &path, ino.0, content, mark);
                        }
                    }
                }
                reply.entry(&TTL, &a, g)
            }
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let job = match self.open_job(req, flags.0) {
            Ok(job) => job,
            Err(e) => return reply.error(e),
        };
        let (file, truncation) = match self.open_existing(req, job, ino.0, flags.0) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        match self.open_node(
            (&reply, req.pid()),
            job,
            ino.0,
            file,
            flags.0,
            (false, truncation),
        ) {
            Ok((fh, o)) if !o.passthrough => reply.opened(FileHandle(fh), open_flags(&o)),
            Ok((fh, _)) => match self.attach_backing(fh, ino.0, |f| reply.open_backing(f)) {
                Ok(id) => reply.opened_passthrough(FileHandle(fh), OPEN_FLAGS, &id),
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
        let job = match self.open_job(req, flags) {
            Ok(job) => job,
            Err(e) => return reply.error(e),
        };
        let caller = self.caller(req, umask);
        let file = match self.with_fd(parent.0, |dir| {
            sys::as_caller(caller, || sys::create_at(dir, name, flags, mode))
        }) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let (a, g) = match self.lookup_child(parent.0, name) {
            Ok(x) => x,
            Err(e) => {
                self.undo_create(parent.0, name);
                return reply.error(e);
            }
        };
        // A new file: no other handle has a version of it to end.
        let made = (flags & libc::O_ACCMODE != libc::O_RDONLY).then(|| self.gens.change(a.ino.0));
        match self.open_node((&reply, req.pid()), job, a.ino.0, file, flags, (true, made)) {
            Ok((fh, o)) if !o.passthrough => {
                reply.created(&TTL, &a, g, FileHandle(fh), open_flags(&o))
            }
            Ok((fh, _)) => match self.attach_backing(fh, a.ino.0, |f| reply.open_backing(f)) {
                Ok(id) => reply.created_passthrough(&TTL, &a, g, FileHandle(fh), OPEN_FLAGS, &id),
                Err(e) => {
                    self.forget_handle(fh);
                    self.inodes.forget(a.ino.0, 1);
                    self.undo_create(parent.0, name);
                    reply.error(errno(e));
                }
            },
            Err(e) => {
                self.inodes.forget(a.ino.0, 1);
                self.undo_create(parent.0, name);
                reply.error(e)
            }
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
        if !h.writable {
            // These bytes are in the mount's page cache now (the kernel keeps it between opens
            // while the file is unchanged, `Inodes::open`): the backing filesystem's copy would
            // hold the same file in memory a second time. Advice only: failing changes nothing.
            let _ = sys::drop_cached(h.file.as_fd(), offset, n);
        }
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
        let Some(h) = self.handle(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let mut h = h.lock().expect("handle lock");
        // Its job's version goes on (or is mixed with another's now): a sealed one is no more.
        h.left = None;
        if let Some(job) = h.job.filter(|_| !h.writers.contains(&req.pid())) {
            h.writers.push(req.pid());
            self.jobs.writing(req.pid(), job);
        }
        // O_APPEND: the backing fd appends by itself; the kernel's offset is advisory then.
        let write = || {
            if flags.0 & libc::O_APPEND != 0 {
                use std::io::Write;
                (&h.file).write_all(data)
            } else {
                h.file.write_all_at(data, offset)
            }
        };
        // Counted before the bytes land: a stream that reads the generation after them cannot
        // miss the change.
        let change = self.change(h.opened.ino, h.job, Some(fh.0));
        // A caller without CAP_FSETID writing to a setuid/setgid file: the bits it drops.
        let r = if wf.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            && sys::stat_fd(h.file.as_fd()).is_ok_and(|st| has_sxid(&st))
        {
            sys::as_caller(self.caller(req, 0), write)
        } else {
            write()
        };
        match r {
            Ok(()) => {
                match h.stream.as_mut() {
                    // Where an append lands is the backing file's to say: not followed.
                    Some(s) if flags.0 & libc::O_APPEND == 0 => s.write(offset, data, change),
                    _ => h.stream = None,
                }
                reply.written(data.len() as u32);
            }
            Err(e) => {
                // Some bytes may have landed.
                h.stream = None;
                reply.error(errno(e))
            }
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
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
        // Settled as one: a change to the file waits, or finds the handle still open and seals
        // what it left (`RoarFs::change`).
        self.gens.settle(ino.0, || {
            let open = self.handles.write().expect("handles lock").remove(&fh.0);
            if let Some(open) = open {
                self.released(&open.handle);
            }
        });
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

    /// The kernel caches each directory's listing (`FOPEN_CACHE_DIR`), kept between opens
    /// while the directory is unchanged ([`Inodes::open_dir`]): a re-listing asks no READDIR.
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let keep = self.with_fd(ino.0, |fd| {
            let st = sys::stat_fd(fd)?;
            if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
            }
            self.inodes.open_dir(ino.0, &st)
        });
        match keep {
            Ok(keep) => reply.opened(
                FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed)),
                if keep {
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::FOPEN_CACHE_DIR
                },
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
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = match self.dir_entries(ino.0, fh.0, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        let result = self.with_fd(ino.0, |dir| {
            let dir_attr = attr(ino.0, &sys::stat_fd(dir)?);
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
                let Ok((child, generation, st)) = self.inodes.lookup_in(ino.0, dir, name) else {
                    continue;
                };
                let a = attr(child, &st);
                if reply.add(a.ino, next, name, &TTL, &a, Generation(generation)) {
                    self.inodes.forget(child, 1);
                    break;
                }
            }
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
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
        self.change(h.opened.ino, h.job, Some(fh.0));
        h.left = None;
        match sys::fallocate(&h.file, mode, offset, length) {
            Ok(()) => {
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
