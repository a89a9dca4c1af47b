//! Re-reads without an exit stop.
//!
//! A training loop opens the same files every epoch, and under ptrace every open costs two
//! stops (SEMANTICS.md "ptrace"). The exit stop is there to learn what the open got: whether it
//! succeeded and which file it opened. For a read-only open that the same thread has already made
//! of the same path with the same flags, that answer adds nothing to the record: the path is
//! already read (and its prior content already an input or not), and the step is the thread's
//! own. All a second read changes is the path's last access time.
//!
//! So such an open is recorded at its entry stop, and the tracee runs on without the exit stop,
//! when the path still names a regular file with exactly the identity (device, inode, size, mtime,
//! ctime) the earlier open got, as `stat(2)` from the tracer sees it at entry. Anything else (a
//! different file at the path, no file, a change of mode or content since, a new thread that
//! reuses a tid, an exec) takes both stops, as a first open does.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use roar_store::FileStat;

use crate::collect::HashMap;
use crate::event::Event;

/// Remembered opens beyond which the table starts over: it costs memory per distinct path, and a
/// job that opens more distinct files than this gains little from it.
const CAPACITY: usize = 1 << 16;

/// A successful read-only open of a path by one thread.
struct Read {
    tid: i32,
    /// The thread's generation when it opened the path: an exec or exit bumps it.
    generation: u64,
    flags: i32,
    stat: FileStat,
}

#[derive(Default)]
pub struct Reopens {
    by_path: HashMap<PathBuf, Vec<Read>>,
    generations: HashMap<i32, u64>,
    len: usize,
}

/// Opens that read and change nothing: no write access, no creation, truncation or O_PATH.
fn plain_read(flags: i32) -> bool {
    flags & libc::O_ACCMODE == libc::O_RDONLY
        && flags & (libc::O_CREAT | libc::O_TRUNC | libc::O_PATH | libc::O_TMPFILE) == 0
}

impl Reopens {
    /// The identity to record an open at `path` with, at its entry, when it repeats an open this
    /// thread already made of the same file; `None` when the open needs its exit stop.
    pub fn repeat(&self, tid: i32, path: &Path, flags: i32) -> Option<FileStat> {
        if !plain_read(flags) {
            return None;
        }
        let generation = self.generation(tid);
        let earlier = self
            .by_path
            .get(path)?
            .iter()
            .find(|r| r.tid == tid && r.generation == generation && r.flags == flags)?;
        let now = if flags & libc::O_NOFOLLOW != 0 {
            std::fs::symlink_metadata(path)
        } else {
            std::fs::metadata(path)
        }
        .ok()?;
        let stat = FileStat::from_metadata(&now);
        (now.is_file() && stat == earlier.stat).then_some(stat)
    }

    /// Learns from an event: a read-only open to remember, or a change that ends what is known.
    pub fn saw(&mut self, ev: &Event) {
        match ev {
            Event::Open {
                pid,
                path,
                flags,
                stat: Some(stat),
                ..
            } if plain_read(*flags) => self.remember(*pid, path, *flags, *stat),
            Event::Open { path, .. }
            | Event::Truncate { path, .. }
            | Event::Unlink { path, .. }
            | Event::Symlink { path, .. }
            | Event::Mkdir { path, .. } => self.forget_path(path),
            Event::Link { to, .. } => self.forget_path(to),
            Event::Rename { from, to, .. } => {
                self.forget_tree(from);
                self.forget_tree(to);
            }
            Event::Exchange { a, b, .. } => {
                self.forget_tree(a);
                self.forget_tree(b);
            }
            Event::Rmdir { path, .. } => self.forget_tree(path),
            Event::Exec { pid, .. } | Event::Exit { pid, .. } => self.forget_thread(*pid),
            _ => {}
        }
    }

    /// A thread that exits or execs: nothing it opened counts for what runs under its id next.
    pub fn forget_thread(&mut self, tid: i32) {
        *self.generations.entry(tid).or_default() += 1;
    }

    fn generation(&self, tid: i32) -> u64 {
        self.generations.get(&tid).copied().unwrap_or_default()
    }

    fn remember(&mut self, tid: i32, path: &Path, flags: i32, stat: FileStat) {
        let generation = self.generation(tid);
        if let Some(reads) = self.by_path.get_mut(path) {
            match reads.iter_mut().find(|r| r.tid == tid && r.flags == flags) {
                Some(r) => {
                    r.generation = generation;
                    r.stat = stat;
                    return;
                }
                None if self.len < CAPACITY => {
                    reads.push(Read {
                        tid,
                        generation,
                        flags,
                        stat,
                    });
                    self.len += 1;
                    return;
                }
                None => {}
            }
        }
        if self.len >= CAPACITY {
            self.by_path.clear();
            self.len = 0;
        }
        self.by_path.insert(
            path.to_owned(),
            vec![Read {
                tid,
                generation,
                flags,
                stat,
            }],
        );
        self.len += 1;
    }

    fn forget_path(&mut self, path: &Path) {
        if let Some(reads) = self.by_path.remove(path) {
            self.len -= reads.len();
        }
    }

    /// A path and, if it is a directory, everything under it.
    fn forget_tree(&mut self, path: &Path) {
        self.forget_path(path);
        let prefix = path.as_os_str().as_bytes();
        let under = |p: &Path| {
            let p = p.as_os_str().as_bytes();
            p.len() > prefix.len() && p.starts_with(prefix) && p[prefix.len()] == b'/'
        };
        if self.by_path.keys().any(|p| under(p)) {
            self.by_path.retain(|p, _| !under(p));
            self.len = self.by_path.values().map(Vec::len).sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(tid: i32, path: &Path, flags: i32) -> Event {
        let meta = std::fs::metadata(path).unwrap();
        Event::Open {
            pid: tid,
            path: path.to_owned(),
            flags,
            stat: Some(FileStat::from_metadata(&meta)),
            ts_ns: 0,
        }
    }

    #[test]
    fn only_the_same_threads_read_only_open_of_the_same_file_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"one").unwrap();
        let mut r = Reopens::default();
        let ro = libc::O_RDONLY | libc::O_CLOEXEC;
        assert!(
            r.repeat(7, &a, ro).is_none(),
            "a first open takes both stops"
        );
        r.saw(&open(7, &a, ro));
        assert!(r.repeat(7, &a, ro).is_some());
        assert!(r.repeat(8, &a, ro).is_none(), "another thread");
        assert!(r.repeat(7, &a, libc::O_RDONLY).is_none(), "other flags");
        assert!(r.repeat(7, &a, libc::O_RDWR).is_none(), "a write");
        r.forget_thread(7);
        assert!(r.repeat(7, &a, ro).is_none(), "after an exec or exit");
        r.saw(&open(7, &a, ro));
        assert!(r.repeat(7, &a, ro).is_some());
        // A change of content with the same size: the ctime moves (multigrain timestamps).
        std::fs::write(&a, b"two").unwrap();
        assert!(r.repeat(7, &a, ro).is_none(), "changed behind the job");
        r.saw(&open(7, &a, ro));
        r.saw(&Event::Truncate {
            pid: 9,
            path: a.clone(),
            ts_ns: 0,
        });
        assert!(r.repeat(7, &a, ro).is_none(), "changed by the job");
    }

    #[test]
    fn a_moved_directory_forgets_what_was_read_under_it() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("d");
        std::fs::create_dir(&sub).unwrap();
        let (a, b) = (sub.join("a"), dir.path().join("d2"));
        std::fs::write(&a, b"one").unwrap();
        std::fs::write(&b, b"x").unwrap();
        let mut r = Reopens::default();
        r.saw(&open(7, &a, libc::O_RDONLY));
        r.saw(&open(7, &b, libc::O_RDONLY));
        r.saw(&Event::Rename {
            pid: 9,
            from: sub.clone(),
            to: dir.path().join("e"),
            ts_ns: 0,
        });
        assert!(r.repeat(7, &a, libc::O_RDONLY).is_none());
        assert!(
            r.repeat(7, &b, libc::O_RDONLY).is_some(),
            "d2 is not under d"
        );
        assert_eq!(r.len, 1);
    }
}
