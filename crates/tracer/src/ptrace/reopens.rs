//! Re-reads without an exit stop.
//!
//! A training loop opens the same files every epoch, and under ptrace every open costs two
//! stops (SEMANTICS.md "ptrace"). The exit stop is there to learn what the open got: whether it
//! succeeded and which file it opened. When the same program has already opened the same path
//! with the same flags for reading only, and the path still names exactly the file it got then
//! (device, inode, size, mtime, ctime, as `stat(2)` from the tracer sees it at entry), the open
//! will get that file again. So it is recorded at its entry stop, with that identity, and the
//! tracee runs on without the exit stop. The event is the one the exit stop would have made, with
//! the same pid, so steps and processes are attributed as before.
//!
//! "The same program" is an image: a process's threads, and the children it forked that have not
//! exec'd (dataloader and multiprocessing workers), share the credentials, root and mount
//! namespace the open depends on. An exec starts a new image. A different file at the path, no
//! file, a change of mode or content, any change the job makes at the path or a directory above
//! it: each takes both stops again, as a first open does. What the entry cannot see is a failure
//! `stat` does not predict (no free descriptor, a `setuid` in the program since): such an open is
//! recorded although it failed, as a read the image had already made.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use roar_store::FileStat;

use crate::collect::HashMap;
use crate::event::Event;

/// Remembered opens beyond which the table starts over: it costs memory per distinct path, and a
/// job that opens more distinct files than this gains little from it.
const CAPACITY: usize = 1 << 16;

/// A successful read-only open of a path by one image.
struct Read {
    image: u64,
    flags: i32,
    stat: FileStat,
}

pub struct Reopens {
    by_path: HashMap<PathBuf, Vec<Read>>,
    /// The image each thread runs; threads not in it take both stops.
    images: HashMap<i32, u64>,
    next_image: u64,
    len: usize,
}

/// Opens that read and change nothing: no write access, no creation, truncation or O_PATH.
fn plain_read(flags: i32) -> bool {
    flags & libc::O_ACCMODE == libc::O_RDONLY
        && flags & (libc::O_CREAT | libc::O_TRUNC | libc::O_PATH | libc::O_TMPFILE) == 0
}

impl Reopens {
    /// For a run whose first process is `root`.
    pub fn new(root: i32) -> Reopens {
        Reopens {
            by_path: HashMap::default(),
            images: HashMap::from_iter([(root, 0)]),
            next_image: 1,
            len: 0,
        }
    }

    /// The identity to record an open at `path` with, at its entry, when it repeats an open this
    /// thread's image already made of the same file; `None` when the open needs its exit stop.
    pub fn repeat(&self, tid: i32, path: &Path, flags: i32) -> Option<FileStat> {
        if !plain_read(flags) {
            return None;
        }
        let image = *self.images.get(&tid)?;
        let earlier = self
            .by_path
            .get(path)?
            .iter()
            .find(|r| r.image == image && r.flags == flags)?;
        let now = if flags & libc::O_NOFOLLOW != 0 {
            std::fs::symlink_metadata(path)
        } else {
            std::fs::metadata(path)
        }
        .ok()?;
        let stat = FileStat::from_metadata(&now);
        (now.is_file() && stat == earlier.stat).then_some(stat)
    }

    /// A thread or process `child` that `parent` made: it runs the parent's image until it execs.
    /// A child already seen (its first stops can beat the parent's event, even its exec) keeps
    /// the image it has.
    pub fn forked(&mut self, parent: i32, child: i32) {
        let image = self.image(parent);
        self.images.entry(child).or_insert(image);
    }

    /// A thread that exits: whatever runs under its id next is not known.
    pub fn exited(&mut self, tid: i32) {
        self.images.remove(&tid);
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
            } if plain_read(*flags) => {
                let image = self.image(*pid);
                self.remember(image, path, *flags, *stat);
            }
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
            Event::Exec { pid, .. } => {
                let image = self.fresh();
                self.images.insert(*pid, image);
            }
            _ => {}
        }
    }

    fn fresh(&mut self) -> u64 {
        self.next_image += 1;
        self.next_image - 1
    }

    /// The image `tid` runs, a new one if it is not known yet.
    fn image(&mut self, tid: i32) -> u64 {
        if let Some(image) = self.images.get(&tid) {
            return *image;
        }
        let image = self.fresh();
        self.images.insert(tid, image);
        image
    }

    fn remember(&mut self, image: u64, path: &Path, flags: i32, stat: FileStat) {
        if let Some(reads) = self.by_path.get_mut(path) {
            match reads
                .iter_mut()
                .find(|r| r.image == image && r.flags == flags)
            {
                Some(r) => {
                    r.stat = stat;
                    return;
                }
                None if self.len < CAPACITY => {
                    reads.push(Read { image, flags, stat });
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
        self.by_path
            .insert(path.to_owned(), vec![Read { image, flags, stat }]);
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

    fn exec(pid: i32) -> Event {
        Event::Exec {
            pid,
            ppid: 1,
            exe: PathBuf::new(),
            argv: Vec::new(),
            cwd: PathBuf::new(),
            stdio: Default::default(),
            pipes: Default::default(),
            ts_ns: 0,
        }
    }

    #[test]
    fn only_the_same_images_read_only_open_of_the_same_file_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"one").unwrap();
        let mut r = Reopens::new(7);
        let ro = libc::O_RDONLY | libc::O_CLOEXEC;
        assert!(r.repeat(7, &a, ro).is_none(), "a first open: both stops");
        r.saw(&open(7, &a, ro));
        assert!(r.repeat(7, &a, ro).is_some());
        assert!(
            r.repeat(8, &a, ro).is_none(),
            "a thread not known to run the image"
        );
        r.forked(7, 8);
        assert!(
            r.repeat(8, &a, ro).is_some(),
            "a thread or fork of the image"
        );
        r.saw(&exec(8));
        assert!(r.repeat(8, &a, ro).is_none(), "after its exec");
        r.forked(7, 8);
        assert!(
            r.repeat(8, &a, ro).is_none(),
            "a late fork event changes nothing"
        );
        assert!(
            r.repeat(7, &a, ro).is_some(),
            "the parent's image is the same"
        );
        assert!(r.repeat(7, &a, libc::O_RDONLY).is_none(), "other flags");
        assert!(r.repeat(7, &a, libc::O_RDWR).is_none(), "a write");
        r.exited(7);
        assert!(
            r.repeat(7, &a, ro).is_none(),
            "a tid used again after an exit"
        );
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
        let mut r = Reopens::new(7);
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
