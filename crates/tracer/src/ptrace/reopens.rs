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
//! "The same program" is an image: the processes whose opens succeed or fail alike. A process
//! that execs joins the image of every process that exec'd with the same access context: file
//! system uid and gid, supplementary groups, effective capabilities, root directory, mount
//! namespace and security label (`/proc/TID/status`, `root`, `ns/mnt`, `attr/current`, read at the
//! exec stop, when the new program's credentials are in place). So the second Python of a run
//! finds its standard library known, and the hundredth compiler its headers. Threads and children
//! forked without exec run their parent's image. A different file at the path, no file, a change
//! of mode or content, any change the job makes at the path or a directory above it: each takes
//! both stops again, as a first open does. What the entry cannot see is a failure `stat` does not
//! predict (no free descriptor, a `setuid` or `unshare` in the program since its exec): such an
//! open is recorded although it failed, as a read of a file its image had already read.
#![allow(unsafe_code)]

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use roar_store::FileStat;

use crate::collect::{HashMap, HashSet};
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

#[derive(Default)]
pub struct Reopens {
    by_path: HashMap<PathBuf, Vec<Read>>,
    /// The image each thread runs; threads not in it take both stops.
    images: HashMap<i32, u64>,
    /// The image of each access context seen at an exec.
    contexts: HashMap<String, u64>,
    /// Directories above remembered paths (some perhaps no longer): only a rename or removal of
    /// one of these looks through the table, so renaming files into place costs nothing.
    dirs: HashSet<PathBuf>,
    next_image: u64,
    len: usize,
}

/// What decides whether an open of an existing file succeeds, besides the file: the fields of
/// `/proc/TID/status` that hold the credentials, the root, the mount namespace, the LSM label.
/// `None` if any of it cannot be read.
fn access_context(tid: i32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let mut ctx = String::new();
    for key in ["Uid:", "Gid:", "Groups:", "CapEff:"] {
        ctx.push_str(status.lines().find(|l| l.starts_with(key))?);
        ctx.push('\n');
    }
    for link in ["root", "ns/mnt"] {
        let target = std::fs::read_link(format!("/proc/{tid}/{link}")).ok()?;
        ctx.push_str(&target.to_string_lossy());
        ctx.push('\n');
    }
    // No LSM that labels tasks: EINVAL, and the label is empty.
    match std::fs::read(format!("/proc/{tid}/attr/current")) {
        Ok(label) => ctx.push_str(&String::from_utf8_lossy(&label)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
        Err(_) => return None,
    }
    Some(ctx)
}

/// Opens that read and change nothing: no write access, no creation, truncation or O_PATH.
fn plain_read(flags: i32) -> bool {
    flags & libc::O_ACCMODE == libc::O_RDONLY
        && flags & (libc::O_CREAT | libc::O_TRUNC | libc::O_PATH | libc::O_TMPFILE) == 0
}

impl Reopens {
    /// A thread that exec'd (and is stopped there): it joins the image of its access context.
    pub fn exec(&mut self, tid: i32) {
        let image = match access_context(tid) {
            Some(ctx) => match self.contexts.get(&ctx) {
                Some(image) => *image,
                None => {
                    let image = self.fresh();
                    self.contexts.insert(ctx, image);
                    image
                }
            },
            None => self.fresh(),
        };
        self.images.insert(tid, image);
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
            self.dirs.clear();
            self.len = 0;
        }
        self.by_path
            .insert(path.to_owned(), vec![Read { image, flags, stat }]);
        self.len += 1;
        // Once a directory is in, so are those above it.
        let mut dir = path.parent();
        while let Some(d) = dir {
            if !self.dirs.insert(d.to_owned()) {
                break;
            }
            dir = d.parent();
        }
    }

    fn forget_path(&mut self, path: &Path) {
        if let Some(reads) = self.by_path.remove(path) {
            self.len -= reads.len();
        }
    }

    /// A path and, if it is a directory, everything under it.
    fn forget_tree(&mut self, path: &Path) {
        self.forget_path(path);
        if !self.dirs.remove(path) {
            return;
        }
        let prefix = path.as_os_str().as_bytes();
        let under = |p: &Path| {
            let p = p.as_os_str().as_bytes();
            p.len() > prefix.len() && p.starts_with(prefix) && p[prefix.len()] == b'/'
        };
        self.by_path.retain(|p, _| !under(p));
        self.len = self.by_path.values().map(Vec::len).sum();
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

    /// A process of its own, stopped only by its end: a real tid for `Reopens::exec` to read.
    fn sleeper(uid: Option<u32>) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        if let Some(uid) = uid {
            cmd.uid(uid);
        }
        cmd.spawn().unwrap()
    }

    #[test]
    fn only_the_same_images_read_only_open_of_the_same_file_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"one").unwrap();
        let me = std::process::id() as i32;
        let mut r = Reopens::default();
        r.exec(me);
        let ro = libc::O_RDONLY | libc::O_CLOEXEC;
        assert!(r.repeat(me, &a, ro).is_none(), "a first open: both stops");
        r.saw(&open(me, &a, ro));
        assert!(r.repeat(me, &a, ro).is_some());
        assert!(r.repeat(me, &a, libc::O_RDONLY).is_none(), "other flags");
        assert!(r.repeat(me, &a, libc::O_RDWR).is_none(), "a write");

        // Threads and forks run their parent's image; an exec changes it.
        let fake = i32::MAX - 1;
        assert!(r.repeat(fake, &a, ro).is_none(), "a thread not known yet");
        r.forked(me, fake);
        assert!(
            r.repeat(fake, &a, ro).is_some(),
            "a thread or fork of the image"
        );
        r.exec(fake);
        assert!(
            r.repeat(fake, &a, ro).is_none(),
            "an exec whose context is unknown"
        );
        r.forked(me, fake);
        assert!(
            r.repeat(fake, &a, ro).is_none(),
            "a late fork event changes nothing"
        );
        r.exited(fake);

        // A program exec'd with the same credentials, root and namespace: the same image.
        let mut same = sleeper(None);
        r.exec(same.id() as i32);
        assert!(
            r.repeat(same.id() as i32, &a, ro).is_some(),
            "same access context"
        );
        let _ = same.kill();
        let _ = same.wait();
        // Another user: not (only root can start one).
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let mut other = sleeper(Some(65534));
            r.exec(other.id() as i32);
            assert!(
                r.repeat(other.id() as i32, &a, ro).is_none(),
                "another uid is another image"
            );
            let _ = other.kill();
            let _ = other.wait();
        }
        r.exited(me);
        assert!(
            r.repeat(me, &a, ro).is_none(),
            "a tid used again after an exit"
        );
        r.saw(&open(me, &a, ro));
        assert!(r.repeat(me, &a, ro).is_some());
        // A change of content with the same size: the ctime moves (multigrain timestamps).
        std::fs::write(&a, b"two").unwrap();
        assert!(r.repeat(me, &a, ro).is_none(), "changed behind the job");
        r.saw(&open(me, &a, ro));
        r.saw(&Event::Truncate {
            pid: 9,
            path: a.clone(),
            ts_ns: 0,
        });
        assert!(r.repeat(me, &a, ro).is_none(), "changed by the job");
    }

    #[test]
    fn a_moved_directory_forgets_what_was_read_under_it() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("d");
        std::fs::create_dir(&sub).unwrap();
        let (a, b) = (sub.join("a"), dir.path().join("d2"));
        std::fs::write(&a, b"one").unwrap();
        std::fs::write(&b, b"x").unwrap();
        let me = std::process::id() as i32;
        let mut r = Reopens::default();
        r.exec(me);
        r.saw(&open(me, &a, libc::O_RDONLY));
        r.saw(&open(me, &b, libc::O_RDONLY));
        r.saw(&Event::Rename {
            pid: 9,
            from: sub.clone(),
            to: dir.path().join("e"),
            ts_ns: 0,
        });
        assert!(r.repeat(me, &a, libc::O_RDONLY).is_none());
        assert!(
            r.repeat(me, &b, libc::O_RDONLY).is_some(),
            "d2 is not under d"
        );
        assert_eq!(r.len, 1);

        // Two levels down, the directory above the parent moves; then a file renamed into place
        // over a path read before.
        let deep = dir.path().join("g/h");
        std::fs::create_dir_all(&deep).unwrap();
        let c = deep.join("c");
        std::fs::write(&c, b"deep").unwrap();
        r.saw(&open(me, &c, libc::O_RDONLY));
        r.saw(&open(me, &a, libc::O_RDONLY));
        assert!(r.repeat(me, &c, libc::O_RDONLY).is_some());
        r.saw(&Event::Rename {
            pid: 9,
            from: dir.path().join("g"),
            to: dir.path().join("g2"),
            ts_ns: 0,
        });
        assert!(r.repeat(me, &c, libc::O_RDONLY).is_none(), "under g/h");
        assert!(r.repeat(me, &a, libc::O_RDONLY).is_some());
        r.saw(&Event::Rename {
            pid: 9,
            from: dir.path().join("tmp"),
            to: b.clone(),
            ts_ns: 0,
        });
        assert!(r.repeat(me, &b, libc::O_RDONLY).is_none(), "replaced");
        assert!(r.repeat(me, &a, libc::O_RDONLY).is_some());
    }
}
