//! The daemon's own state behind the FUSE requests: which job a request belongs to, the open
//! policy (kernel passthrough for a read-only open of known content, userspace for writers), the
//! handles and directory listings it keeps, and the content a writer left at its release. The
//! request adapter is `mod.rs`; the inode table is `crate::inodes`, content `crate::content`.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use fuser::{BackingId, Errno, FileAttr, FileType, Generation, ReplyEntry, Request};
use roar_engine::content::Change;
use roar_store::ContentHash;

use super::{
    attr, dtype, errno, has_sxid, is_reg, log_once, DirEntry, Handle, Open, RoarFs,
    ATTRIBUTION_FAILED, FMODE_EXEC, TTL,
};
use crate::content::Content;
use crate::inodes::{Inodes, Opened, ROOT};
use crate::jobs::{Access, JobKey, Jobs, Unreplied};
use crate::sys;
use crate::sys::file_stat;

impl RoarFs {
    /// `root_fd` is the directory opened (O_PATH) before the mount hides it; `root` its path.
    pub fn new(
        root_fd: std::os::fd::OwnedFd,
        root: PathBuf,
        jobs: Arc<Jobs>,
        db: Option<&Path>,
        keep: Option<crate::Keep>,
    ) -> io::Result<RoarFs> {
        Ok(RoarFs {
            inodes: Inodes::new(root_fd, root)?,
            handles: RwLock::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            content: Content::new(jobs.clone(), db),
            gens: roar_engine::content::Generations::new(),
            jobs,
            passthrough: AtomicBool::new(false),
            dont_mask: AtomicBool::new(false),
            uring: Arc::new(AtomicBool::new(false)),
            keep,
        })
    }

    pub fn inodes(&self) -> &Inodes {
        &self.inodes
    }

    /// Set once FUSE_INIT has negotiated FUSE over io_uring (during the mount).
    pub fn uring(&self) -> Arc<AtomicBool> {
        self.uring.clone()
    }

    pub(super) fn with_fd<T>(
        &self,
        ino: u64,
        f: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> io::Result<T>,
    ) -> Result<T, Errno> {
        self.inodes.with_fd(ino, f).map_err(errno)
    }

    pub(super) fn child_path(&self, parent: u64, name: &OsStr) -> PathBuf {
        self.inodes.path(parent).join(name)
    }

    /// The job of the request's caller. An access that cannot be attributed (the caller's /proc
    /// entries unreadable) fails with that error rather than go unrecorded.
    pub(super) fn job(&self, req: &Request) -> Result<Option<JobKey>, Errno> {
        self.jobs.job_of(req.pid()).map_err(|e| {
            log_once(&ATTRIBUTION_FAILED, || {
                format!(
                    "roarfs: cannot attribute an access by pid {} ({e}); such accesses fail with that error instead of going unrecorded",
                    req.pid()
                )
            });
            errno(e)
        })
    }

    /// The job an open belongs to, known before anything is opened or created. The kernel
    /// opening a program to exec it: the process still shows its old argv, and like `roar run`,
    /// the mount records programs as processes, not as data inputs.
    pub(super) fn open_job(&self, req: &Request, flags: i32) -> Result<Option<JobKey>, Errno> {
        if flags & FMODE_EXEC != 0 {
            return Ok(None);
        }
        self.job(req)
    }

    /// Removes `name` from `parent` after a creation whose reply could not be made: the caller
    /// is told it failed, so nothing it did not get may stay behind unrecorded.
    pub(super) fn undo_create(&self, parent: u64, name: &OsStr) {
        let _ = self.with_fd(parent, |dir| {
            sys::unlink_at(dir, name, 0).or_else(|_| sys::unlink_at(dir, name, libc::AT_REMOVEDIR))
        });
    }

    /// Opens existing node `ino` for an open request by `job`. An `O_TRUNC` open truncates
    /// after the open, as the caller when the file is setuid/setgid ([`super::has_sxid`]): an
    /// unprivileged caller's truncate drops those bits on the backing filesystem, root's keeps
    /// them. The truncate is a change ([`RoarFs::change`]), returned with the file.
    pub(super) fn open_existing(
        &self,
        req: &Request,
        job: Option<JobKey>,
        ino: u64,
        flags: i32,
    ) -> Result<(File, Option<Change>), Errno> {
        let trunc = flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY;
        if !trunc {
            let file = self.inodes.open_file(ino, flags).map_err(errno)?;
            return Ok((file, None));
        }
        let file = self
            .inodes
            .open_file(ino, flags & !libc::O_TRUNC)
            .map_err(errno)?;
        let st = sys::stat_fd(file.as_fd()).map_err(errno)?;
        if !is_reg(&st) {
            return Ok((file, None));
        }
        let change = self.change(ino, job, None);
        let truncate = || file.set_len(0);
        if has_sxid(&st) {
            sys::as_caller(self.caller(req, 0), truncate)
        } else {
            truncate()
        }
        .map_err(errno)?;
        Ok((file, Some(change)))
    }

    /// Counts a change to file `ino` that `by` is about to make (through its writable handle
    /// `own`, if any): call it before the change is made. First the version each other job's
    /// writer left there ends — the one rule for every change that goes through the mount (a
    /// write, a truncate by path, handle or `O_TRUNC` open, an fallocate, a writer served by
    /// passthrough): a handle whose write stream still names the whole file is sealed with that
    /// hash as its job's output (and the bytes kept, `[keep] outputs`), since by its release
    /// (which the kernel sends when it likes, perhaps after the next job's open) the file may
    /// hold another job's content.
    ///
    /// A release settles its handle's version under the same per-file exclusion
    /// ([`roar_engine::content::Generations::settle`]): a change either finds the handle still
    /// open and seals it, or waits until its release has recorded and kept what it left.
    pub(super) fn change(&self, ino: u64, by: Option<JobKey>, own: Option<u64>) -> Change {
        self.gens.change_ending(ino, |now| {
            if self.inodes.writers(ino) > usize::from(own.is_some()) {
                self.seal_versions(ino, by, own, now);
            }
        })
    }

    /// Seals the version every other job's writable handle on `ino` left ([`RoarFs::change`]).
    /// A handle busy with a request of its own is waited for briefly, never blocked on: two
    /// writers changing each other's file at once must not wait on each other's handle.
    fn seal_versions(&self, ino: u64, by: Option<JobKey>, own: Option<u64>, now: u64) {
        let mut others: Vec<_> = {
            let handles = self.handles.read().expect("handles lock");
            handles
                .iter()
                .filter(|(fh, o)| {
                    Some(**fh) != own
                        && o.ino == ino
                        && o.writable
                        && o.job.is_some()
                        && o.job != by
                })
                .map(|(_, o)| o.handle.clone())
                .collect()
        };
        for _ in 0..64 {
            others.retain(|handle| match handle.try_lock() {
                Ok(mut h) => {
                    self.seal(&mut h, now);
                    false
                }
                Err(_) => true,
            });
            if others.is_empty() {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Ends the version handle `h` left, if its stream still names the file's whole content.
    fn seal(&self, h: &mut Handle, now: u64) {
        let Some((at, hash)) = h.stream.as_ref().and_then(|s| s.version()) else {
            return;
        };
        if at != now || h.left.is_some() {
            return;
        }
        h.stream = None;
        let path = self.inodes.path(h.opened.ino);
        if let Some(objects) = self.keeping(h, &path) {
            self.keep_streamed(h, &path, &hash, now, objects);
        }
        h.left = Some(hash);
    }

    /// Where the version `h` leaves at `path` is kept, if it is (`[keep] outputs`).
    fn keeping(&self, h: &Handle, path: &Path) -> Option<&roar_store::objects::Objects> {
        self.keep
            .as_ref()
            .filter(|k| h.job.is_some() && k.rule.wants(path, true))
            .map(|k| &k.objects)
    }

    /// Where the version a job reads at `path` is kept, if it is (`[keep] inputs`).
    fn keeping_input(&self, path: &Path) -> Option<&roar_store::objects::Objects> {
        self.keep
            .as_ref()
            .filter(|k| k.rule.wants(path, false))
            .map(|k| &k.objects)
    }

    pub(super) fn caller(&self, req: &Request, umask: u32) -> sys::Caller {
        sys::Caller {
            pid: req.pid(),
            uid: req.uid(),
            gid: req.gid(),
            umask: if self.dont_mask.load(Ordering::Relaxed) {
                umask
            } else {
                0
            },
        }
    }

    /// Looks up the child `name` of `parent` and gives its entry attributes.
    pub(super) fn lookup_child(
        &self,
        parent: u64,
        name: &OsStr,
    ) -> Result<(FileAttr, Generation), Errno> {
        let (ino, generation, st) = self.inodes.lookup(parent, name).map_err(errno)?;
        Ok((attr(ino, &st), Generation(generation)))
    }

    /// Creates `name` in `parent` as the caller with `make`, calls `made` (which records it)
    /// and only then replies with its attributes (mknod, mkdir, symlink): once the caller has its
    /// reply, another process may act on the name, and its access must come after this one in
    /// the job's record.
    pub(super) fn make_entry(
        &self,
        req: &Request,
        (parent, name): (u64, &OsStr),
        umask: u32,
        reply: ReplyEntry,
        make: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> io::Result<()>,
        made: impl FnOnce(&ReplyEntry),
    ) {
        let caller = self.caller(req, umask);
        if let Err(e) = self.with_fd(parent, |dir| sys::as_caller(caller, || make(dir))) {
            return reply.error(e);
        }
        match self.lookup_child(parent, name) {
            Ok((a, g)) => {
                made(&reply);
                reply.entry(&TTL, &a, g)
            }
            Err(e) => {
                self.undo_create(parent, name);
                reply.error(e)
            }
        }
    }

    /// Opens inode `ino` for a request: records the access and chooses how it is served
    /// ([`Inodes::open`]). Returns the new handle's number and that choice.
    pub(super) fn open_node(
        &self,
        (reply, tid): (&impl Unreplied, u32),
        job: Option<JobKey>,
        ino: u64,
        file: File,
        flags: i32,
        (created, emptied): (bool, Option<Change>),
    ) -> Result<(u64, Opened), Errno> {
        let acc = flags & libc::O_ACCMODE;
        let writable = acc != libc::O_RDONLY;
        let stat = sys::stat_fd(file.as_fd()).ok();
        let is_file = stat.as_ref().is_some_and(is_reg);
        if let (Some(job), Some(st)) = (job, stat.as_ref().filter(|_| is_file)) {
            let path = self.inodes.path(ino);
            // What a write that keeps the old bytes found there (an input if the job did not
            // make them): told before the open is applied, it is the content the open found.
            let keeps = writable && !created && flags & libc::O_TRUNC == 0;
            if keeps && self.jobs.wants_content(job, &path) {
                let mark = self.jobs.mark(job);
                if let Some(before) = self.content.of_path_fd(file.as_fd(), &path) {
                    self.jobs.found(job, &path, ino, before, mark);
                }
            }
            let access = Access::Open {
                path: &path,
                flags,
                created,
                ino,
                stat: st,
            };
            self.jobs.event(reply, tid, job, access);
            if writable {
                self.jobs.writer_opened(job);
                // The content is about to change.
                self.content.forget(st);
            } else if self.jobs.wants_input(job, &path) {
                let mark = self.jobs.mark(job);
                let keep = self.keeping_input(&path);
                if let Some(content) = self.content.at(&file, st, &path, keep) {
                    self.jobs.found(job, &path, ino, content, mark);
                }
            }
        }
        let may_pass = is_file && self.passthrough.load(Ordering::Relaxed);
        let opened = self
            .inodes
            .open(ino, writable, may_pass, stat.as_ref().filter(|_| is_file))
            .map_err(errno)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        // The truncate (or creation) this open made was a change to the file (`emptied`); so is
        // a writer the kernel serves by passthrough, whose writes never reach the daemon.
        if writable && opened.passthrough && emptied.is_none() {
            self.change(ino, job, Some(fh));
        }
        let handle = Handle {
            file,
            opened,
            job,
            writable,
            stream: emptied
                .filter(|_| !opened.passthrough)
                .map(|c| roar_engine::content::Stream::begin(c.after)),
            left: None,
            writers: Vec::new(),
            _backing: None,
        };
        let open = Open {
            ino,
            job,
            writable,
            handle: Arc::new(Mutex::new(handle)),
        };
        self.handles.write().expect("handles lock").insert(fh, open);
        Ok((fh, opened))
    }

    /// Registers (or reuses) the passthrough backing id of `ino` for handle `fh`.
    pub(super) fn attach_backing(
        &self,
        fh: u64,
        ino: u64,
        make: impl FnOnce(&File) -> io::Result<BackingId>,
    ) -> io::Result<Arc<BackingId>> {
        let handle = self
            .handle(fh)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let mut h = handle.lock().expect("handle lock");
        let id = self.inodes.backing_id(ino, || make(&h.file))?;
        h._backing = Some(id.clone());
        Ok(id)
    }

    /// Undoes `open_node` when the reply could not be sent as planned.
    pub(super) fn forget_handle(&self, fh: u64) {
        let Some(open) = self.handles.write().expect("handles lock").remove(&fh) else {
            return;
        };
        let h = open.handle.lock().expect("handle lock");
        self.inodes.close(h.opened, None);
        if let (true, Some(job)) = (h.writable, h.job) {
            self.jobs.writer_released(job);
        }
    }

    /// What a release does once the handle is out of the table: the inode's open count, and a
    /// writer's content recorded when it was the file's last writer.
    pub(super) fn released(&self, handle: &Mutex<Handle>) {
        // A request still running on this handle holds it only briefly: wait for it.
        let mut h = handle.lock().expect("handle lock");
        // The name first: the close can drop the node (a FORGET of an unlinked file may come
        // before its release), and with it the way to the path.
        let path = (h.writable && h.job.is_some()).then(|| self.inodes.path(h.opened.ino));
        let now = (h.writable && !h.opened.passthrough)
            .then(|| sys::stat_fd(h.file.as_fd()).ok())
            .flatten();
        let writers_left = self.inodes.close(h.opened, now.as_ref());
        if let (Some(path), Some(job)) = (path, h.job) {
            self.record_release(&mut h, writers_left, &path, job);
        }
        if h.writable && writers_left == 0 {
            // No writer left to hold a stream: the file's count can start afresh.
            self.gens.forget(h.opened.ino);
        }
    }

    /// How many of the `writers` writable handles still open on `ino` are `job`'s: those can
    /// still change the version this job leaves; another job's writes make that job's version.
    fn writers_of(&self, job: JobKey, ino: u64, writers: usize) -> usize {
        if writers == 0 {
            return 0;
        }
        let handles = self.handles.read().expect("handles lock");
        handles
            .values()
            .filter(|o| o.ino == ino && o.writable && o.job == Some(job))
            .count()
    }

    /// A writer's release, for its job: the content of the file when it was the last writer.
    fn record_release(&self, h: &mut Handle, writers_left: usize, path: &Path, job: JobKey) {
        // Another writable handle of the same job on the same file can still change it (and
        // may be changing it now): the content is taken when the job's last one is released.
        // A file unlinked before this (asynchronous) release by the job itself is not an
        // output (sqlite's journal, pwrite+close+unlink): its unlink already said so, it is not
        // hashed, and the name may already be a new file's (the next journal). One only another
        // process removed (the release can come after the writer exited) is hashed through
        // this handle: its content is the job's.
        let linked = sys::stat_fd(h.file.as_fd()).map_or(true, |st| st.st_nlink > 0);
        let removed_by_job = !linked && self.jobs.unlinked(job, path);
        // Every writable open made the path an output (as under `roar run`, whose observers
        // see opens, not writes): one that wrote nothing leaves the content it found.
        if let Some(left) = h.left.take() {
            // Sealed when another writer was about to change the file: what this job left.
            if !removed_by_job {
                self.jobs
                    .found_in(job, h.opened.ino, left, self.jobs.mark(job));
            }
        } else if self.writers_of(job, h.opened.ino, writers_left) == 0 && !removed_by_job {
            // Content only, of this file under each name the job knows for it: whether a path
            // still exists, or names this file still, is the opens', renames' and unlinks' to say
            // (an unlink or rename racing this release on another thread must win).
            let mark = self.jobs.mark(job);
            if let Some(hash) = self.written_content(h, path) {
                self.jobs.found_in(job, h.opened.ino, hash, mark);
            }
        }
        self.jobs.writer_released(job);
    }

    pub(super) fn handle(&self, fh: u64) -> Option<Arc<Mutex<Handle>>> {
        let handles = self.handles.read().expect("handles lock");
        handles.get(&fh).map(|o| o.handle.clone())
    }

    pub(super) fn list_dir(&self, ino: u64) -> Result<Arc<Vec<DirEntry>>, Errno> {
        let entries = self.with_fd(ino, sys::read_dir)?;
        let dots = [
            (OsString::from("."), ino, FileType::Directory),
            (OsString::from(".."), ROOT, FileType::Directory),
        ];
        Ok(Arc::new(
            dots.into_iter()
                .chain(entries.into_iter().map(|(n, i, t)| (n, i, dtype(t))))
                .collect(),
        ))
    }

    /// The listing of an open directory; offset 0 (a new pass or a rewind) reads it afresh.
    pub(super) fn dir_entries(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
    ) -> Result<Arc<Vec<DirEntry>>, Errno> {
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

    /// The final content of a file whose last writer handle `h` is being released.
    pub(super) fn written_content(&self, h: &mut Handle, path: &Path) -> Option<ContentHash> {
        let size = h.file.metadata().map(|m| m.len()).ok();
        let now = self.gens.now(h.opened.ino);
        // Written from 0 to the end in one go, and nothing else changed it: the stream is the
        // content.
        let streamed = h
            .stream
            .take()
            .zip(size)
            .and_then(|(s, size)| s.finish(now, size));
        let keep = self.keeping(h, path);
        match (streamed, keep) {
            (Some(hash), keep) => {
                if let Ok(st) = sys::stat_fd(h.file.as_fd()) {
                    self.content.remember(file_stat(&st), &hash);
                }
                if let Some(objects) = keep {
                    self.keep_streamed(h, path, &hash, now, objects);
                }
                Some(hash)
            }
            // Hashed by reading: the same read keeps it.
            (None, Some(objects)) => self
                .content
                .of_path_fd_keeping(h.file.as_fd(), path, objects),
            (None, None) => self.content.of_path_fd(h.file.as_fd(), path),
        }
    }

    /// Keeps the version a job left at `path` whose hash the write stream gave (`[keep]
    /// outputs`), unless that content is kept already: copied in the kernel and named by the
    /// stream's hash only if nothing changed the file through the mount since the stream's last
    /// write (its generation is still `now` once the copy is done: the bytes copied are the
    /// bytes hashed). Done as the last writer's handle is released, which the program does not
    /// wait for.
    fn keep_streamed(
        &self,
        h: &Handle,
        path: &Path,
        hash: &ContentHash,
        now: u64,
        objects: &roar_store::objects::Objects,
    ) {
        if !objects.fits(hash.size) || objects.has(&hash.blake3) {
            return;
        }
        let kept = sys::reopen(h.file.as_fd(), libc::O_RDONLY).and_then(|src| {
            let mut taking = objects.begin()?;
            taking.copy_from(&src, hash.size)?;
            let size = src.metadata()?.len();
            if self.gens.now(h.opened.ino) != now || size != hash.size {
                return Err(io::Error::other("changed while it was copied"));
            }
            taking.commit(objects, &hash.blake3)
        });
        if let Err(e) = kept {
            tracing::debug!("roarfs: {} not kept: {e}", path.display());
        }
    }
}
