//! What roarfs knows of backing files' content: hashes by file identity, from files written
//! through the mount (hashed from the write stream, so exact), from the project's hash cache, or
//! hashed now by reading the file.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::{Arc, Mutex};

use roar_store::hash::{hash_open_file_keeping, HashOptions};
use roar_store::objects::Objects;
use roar_store::{ContentHash, FileStat};

use crate::jobs::Jobs;
use crate::sys::{self, file_stat};

pub struct Content {
    known: Mutex<HashMap<(u64, u64), (FileStat, ContentHash)>>,
    store: Mutex<Option<roar_store::hash::Connection>>,
    jobs: Arc<Jobs>,
}

impl Content {
    pub fn new(jobs: Arc<Jobs>, db: Option<&Path>) -> Content {
        Content {
            known: Mutex::new(HashMap::new()),
            store: Mutex::new(db.and_then(|db| roar_store::open(db, false).ok())),
            jobs,
        }
    }

    fn cached(&self, stat: &FileStat) -> Option<ContentHash> {
        let known = self.known.lock().expect("content lock");
        if let Some((k, h)) = known.get(&(stat.dev, stat.ino)) {
            if k == stat {
                return Some(h.clone());
            }
        }
        drop(known);
        let guard = self.store.lock().expect("store lock");
        let hash = roar_store::hash::cache_get(guard.as_ref()?, stat, HashOptions::default())?;
        drop(guard);
        // Remembered: the next open of the same file asks no query of the store.
        self.remember(*stat, &hash);
        Some(hash)
    }

    /// Remembers the content of the file that has identity `stat`.
    pub fn remember(&self, stat: FileStat, hash: &ContentHash) {
        self.known
            .lock()
            .expect("content lock")
            .insert((stat.dev, stat.ino), (stat, hash.clone()));
    }

    /// The content of backing inode (dev, ino) is about to change.
    pub fn forget(&self, st: &libc::stat) {
        self.known
            .lock()
            .expect("content lock")
            .remove(&(st.st_dev, st.st_ino));
    }

    /// The content of an open file: from the caches, else hashed now (and remembered).
    pub fn of(&self, file: &File, path: &Path) -> Option<ContentHash> {
        let st = sys::stat_fd(file.as_fd()).ok()?;
        self.at(file, &st, path, None)
    }

    /// [`Content::of_path_fd`], the version kept in `objects` by the read that hashes it.
    pub fn of_path_fd_keeping(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        path: &Path,
        objects: &Objects,
    ) -> Option<ContentHash> {
        let file = sys::reopen(fd, libc::O_RDONLY).ok()?;
        let st = sys::stat_fd(file.as_fd()).ok()?;
        self.at(&file, &st, path, Some(objects))
    }

    /// [`Content::of`] for a file already stat'ed as `st`, kept in `keep` (if given) by the read
    /// that hashes it; a content known already is kept by a read of its own (named by what that
    /// read found), unless kept before. A file that changes while it is hashed has no content to
    /// give (None), as when it could not be read.
    pub fn at(
        &self,
        file: &File,
        st: &libc::stat,
        path: &Path,
        keep: Option<&Objects>,
    ) -> Option<ContentHash> {
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        if let Some(h) = self.cached(&file_stat(st)) {
            if let Some(objects) = keep.filter(|o| o.fits(h.size) && !o.has(&h.blake3)) {
                if let Err(e) = roar_store::hash::keep_open(objects, file, path, false) {
                    tracing::debug!("roarfs: {} not kept: {e}", path.display());
                }
            }
            return Some(h);
        }
        self.hash_now(file, path, keep)
    }

    /// Hashes `file` now (kept in `keep` as it is read), remembers it and tells the store's
    /// hash cache.
    fn hash_now(&self, file: &File, path: &Path, keep: Option<&Objects>) -> Option<ContentHash> {
        let keep = keep.filter(|o| file.metadata().is_ok_and(|m| o.fits(m.len())));
        // A file changed while it was read (another handle still writing it) is read again,
        // a few times; then its content is unknown rather than wrong.
        let hashed = (0..3)
            .find_map(|_| {
                let mut taking = keep.and_then(|o| o.begin().ok());
                let r = hash_open_file_keeping(file, path, HashOptions::default(), taking.as_mut());
                match r {
                    Ok(h) => {
                        if let (Some(t), Some(o)) = (taking, keep) {
                            if let Err(e) = t.commit(o, &h.hash.blake3) {
                                tracing::debug!("roarfs: {} not kept: {e}", path.display());
                            }
                        }
                        Some(Ok(h))
                    }
                    Err(roar_store::hash::HashError::Changed { .. }) => None,
                    Err(e) => Some(Err(e)),
                }
            })?
            .ok()?;
        self.remember(hashed.stat, &hashed.hash);
        let _ = self.jobs.writer().cache(vec![roar_store::CacheEntry {
            stat: hashed.stat,
            hash: hashed.hash.clone(),
            hashed_ns: hashed.read_ns,
        }]);
        Some(hashed.hash)
    }

    /// The content of the file an `O_PATH` fd names, read through a fresh read-only open.
    pub fn of_path_fd(&self, fd: std::os::fd::BorrowedFd<'_>, path: &Path) -> Option<ContentHash> {
        sys::reopen(fd, libc::O_RDONLY)
            .ok()
            .and_then(|f| self.of(&f, path))
    }
}
