//! The namespace requests: names made (mknod, mkdir, symlink, link), moved (rename, with
//! `RENAME_NOREPLACE` and `RENAME_EXCHANGE`) and removed (unlink, rmdir), each recorded for its
//! job before the reply.

use super::*;

impl RoarFs {
    #[allow(clippy::too_many_arguments)] // fuser's request, unpacked as the trait gives it
    pub(super) fn on_mknod(
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

    pub(super) fn on_mkdir(
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

    pub(super) fn on_unlink(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
    ) {
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

    pub(super) fn on_rmdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
    ) {
        match self.with_fd(parent.0, |dir| {
            sys::unlink_at(dir, name, libc::AT_REMOVEDIR)
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    pub(super) fn on_symlink(
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

    #[allow(clippy::too_many_arguments)] // fuser's request, unpacked as the trait gives it
    pub(super) fn on_rename(
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

    pub(super) fn on_link(
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
}
