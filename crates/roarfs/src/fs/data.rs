//! The content requests: open and create (passthrough or userspace, by the open policy), read,
//! write (hashed inline while sequential), flush, release, fsync, fallocate, copy_file_range and
//! lseek.

use super::*;

impl RoarFs {
    pub(super) fn on_open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
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

    #[allow(clippy::too_many_arguments)] // fuser's request, unpacked as the trait gives it
    pub(super) fn on_create(
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

    #[allow(clippy::too_many_arguments)] // fuser's request, unpacked as the trait gives it
    pub(super) fn on_read(
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

    #[allow(clippy::too_many_arguments)] // fuser's request, unpacked as the trait gives it
    pub(super) fn on_write(
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

    pub(super) fn on_flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    #[allow(clippy::too_many_arguments)] // fuser's request, unpacked as the trait gives it
    pub(super) fn on_release(
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

    pub(super) fn on_fsync(
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

    #[allow(clippy::too_many_arguments)] // fuser's request, unpacked as the trait gives it
    pub(super) fn on_fallocate(
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
    #[allow(clippy::too_many_arguments)] // fuser's request, unpacked as the trait gives it
    pub(super) fn on_copy_file_range(
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

    pub(super) fn on_lseek(
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
