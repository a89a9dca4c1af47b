//! Attribute requests: setattr (mode, owner, size, times; a size change is a content change)
//! and the extended attributes, passed through to the backing file.

use super::*;

impl RoarFs {
    #[allow(clippy::too_many_arguments)] // fuser's request, unpacked as the trait gives it
    pub(super) fn on_setattr(
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

    #[allow(clippy::too_many_arguments)] // fuser's request, unpacked as the trait gives it
    pub(super) fn on_setxattr(
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

    pub(super) fn on_getxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        let mut buf = vec![0u8; size as usize];
        match self.with_fd(ino.0, |fd| sys::xattr(fd, sys::Xattr::Get(name, &mut buf))) {
            Ok(n) if size == 0 => reply.size(n as u32),
            Ok(n) => reply.data(&buf[..n]),
            Err(e) => reply.error(e),
        }
    }

    pub(super) fn on_listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let mut buf = vec![0u8; size as usize];
        match self.with_fd(ino.0, |fd| sys::xattr(fd, sys::Xattr::List(&mut buf))) {
            Ok(n) if size == 0 => reply.size(n as u32),
            Ok(n) => reply.data(&buf[..n]),
            Err(e) => reply.error(e),
        }
    }

    pub(super) fn on_removexattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
    ) {
        match self.with_fd(ino.0, |fd| sys::xattr(fd, sys::Xattr::Remove(name))) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
