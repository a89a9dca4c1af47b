//! Directory listings: opendir (the kernel may keep a listing while the directory is unchanged,
//! `FOPEN_CACHE_DIR`), readdir and readdirplus from the handle's snapshot, releasedir.

use super::*;

impl RoarFs {
    /// The kernel caches each directory's listing (`FOPEN_CACHE_DIR`), kept between opens
    /// while the directory is unchanged ([`Inodes::open_dir`]): a re-listing asks no READDIR.
    pub(super) fn on_opendir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _flags: OpenFlags,
        reply: ReplyOpen,
    ) {
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

    pub(super) fn on_readdir(
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

    pub(super) fn on_readdirplus(
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

    pub(super) fn on_releasedir(
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
}
