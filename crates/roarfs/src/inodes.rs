//! The inode table: which backing file each of the kernel's node ids stands for.
//!
//! A node names its backing file by a kernel file handle (`name_to_handle_at`), opened for the
//! length of one request with `open_by_handle_at`, so the daemon holds no descriptor per inode
//! and any tree size fits in a fixed descriptor budget (virtiofsd's `--inode-file-handles`). On
//! a filesystem without handles, or below a mount point inside the directory, a node keeps an
//! `O_PATH` fd instead; [`Inodes::scheme`] says which is in use.
//!
//! Node ids are the backing inode numbers, so `st_ino` is the backing file's own and survives a
//! remount. A backing inode number can be reused while the kernel still remembers the old file
//! (unlinked, its FORGET not yet sent): the handle then differs, and the node gets a new
//! generation, which tells the kernel to drop its old inode. Nodes on another device (a mount
//! inside the directory) and the inode numbers 0 and 1 (1 is FUSE's root) get ids from a range
//! real inode numbers do not reach.
//!
//! Memory per known inode: the map entry, its name and a handle of 8-40 bytes; ~300 bytes in all,
//! measured (bench/NOTES.md).

use std::collections::{HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use fuser::BackingId;

use crate::sys;

pub const ROOT: u64 = 1;

/// Node ids for files not named by their own inode number.
const SYNTHETIC_BASE: u64 = 1 << 62;

/// How many inodes keep their passthrough backing id registered between opens. Registering
/// one and releasing it at the last close cost a re-opened file 14 µs of its ~45 (bench/NOTES.md,
/// issue 23); each kept id holds the backing file open in the kernel, so they are bounded.
const WARM_IDS: usize = 1024;

/// Read-only opens of files up to this size are served from the mount's own page cache, not by
/// passthrough. A passthrough read makes the kernel drop the atime it holds, so the `fstat` most
/// programs do after each open (Python's `open` does) costs a GETATTR round trip; a re-read from
/// the mount's page cache asks nothing. The first read of a file comes through the daemon
/// instead (a READ per up to 128 KiB), which passthrough avoids: above this size, passthrough.
/// The daemon drops the backing filesystem's cache of what it served, so such a file is not in
/// memory twice (bench/NOTES.md, issue 23).
pub const CACHED_MAX: i64 = 256 << 10;

/// A backing file's (or directory's) size, mtime and ctime: the state its content was in when
/// the kernel's page cache of the node last matched it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp([i64; 5]);

impl Stamp {
    fn of(st: &libc::stat) -> Stamp {
        Stamp([
            st.st_size,
            st.st_mtime,
            st.st_mtime_nsec,
            st.st_ctime,
            st.st_ctime_nsec,
        ])
    }
}

/// How a node reaches its backing file.
enum Backing {
    Handle(sys::FileHandle),
    /// Shared so a request can use it after the table's lock is released.
    Fd(Arc<OwnedFd>),
}

impl Backing {
    /// Whether `other`, found at the same node id, is the same file.
    fn same_file(&self, other: &Backing) -> bool {
        match (self, other) {
            (Backing::Handle(a), Backing::Handle(b)) => a == b,
            // An O_PATH fd keeps its inode, so its number cannot have been reused.
            _ => true,
        }
    }
}

struct Node {
    backing: Backing,
    generation: u64,
    parent: u64,
    name: OsString,
    nlookup: u64,
    /// The passthrough backing id shared by this inode's passthrough opens.
    backing_id: Weak<BackingId>,
    /// The same id, kept registered after the last of those opens closes, while the inode is
    /// among the [`WARM_IDS`] most recently registered: a re-open then skips registering and
    /// releasing it again.
    kept: Option<Arc<BackingId>>,
    passthrough_opens: usize,
    userspace_opens: usize,
    /// Writable opens among them: the file's content is final once the last one is released.
    writers: usize,
    /// The backing file's state when the kernel's page cache of this node last held exactly its
    /// content; `None` when that is not known (never read through the cache, or written by
    /// passthrough, which bypasses it). For a directory: its state at the last open, no later
    /// than the listing the kernel caches ([`Inodes::open_dir`]).
    cached: Option<Stamp>,
    /// The file's other names seen through the mount (hard links), the latest last: one takes
    /// over when `name` is unlinked, so that an open of the file (which names no path) is never
    /// recorded at a name the file no longer has. Only files with several links have any.
    links: Vec<(u64, OsString)>,
}

impl Node {
    fn new(backing: Backing, generation: u64, parent: u64, name: OsString, nlookup: u64) -> Node {
        Node {
            backing,
            generation,
            parent,
            name,
            nlookup,
            backing_id: Weak::new(),
            kept: None,
            passthrough_opens: 0,
            userspace_opens: 0,
            writers: 0,
            cached: None,
            links: Vec::new(),
        }
    }

    /// The file is (also) `name` in `parent` now; `linked`: it has other names too.
    fn named(&mut self, parent: u64, name: &OsStr, linked: bool) {
        if self.parent == parent && self.name == name {
            return;
        }
        let old = (
            self.parent,
            std::mem::replace(&mut self.name, name.to_owned()),
        );
        self.parent = parent;
        if !linked {
            self.links = Vec::new();
            return;
        }
        self.links
            .retain(|(p, n)| (*p, n.as_os_str()) != (parent, name) && (*p, n) != (old.0, &old.1));
        self.links.push(old);
        if self.links.len() > 16 {
            self.links.remove(0);
        }
    }

    /// `name` in `parent` was unlinked: if it was the file's name, another takes over.
    fn unnamed(&mut self, parent: u64, name: &OsStr) {
        self.links
            .retain(|(p, n)| (*p, n.as_os_str()) != (parent, name));
        if self.parent == parent && self.name == name {
            if let Some((p, n)) = self.links.pop() {
                self.parent = p;
                self.name = n;
            }
        }
    }
}

/// Which scheme keeps backing files reachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Kernel file handles: no descriptor per inode.
    FileHandles,
    /// One `O_PATH` fd per known inode (the backing filesystem has no file handles).
    PathFds,
}

impl Scheme {
    /// The name `roar mount` prints.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::FileHandles => "file-handles",
            Scheme::PathFds => "path-fds",
        }
    }
}

/// One open of a node, as counted for the passthrough/userspace choice.
#[derive(Debug, Clone, Copy)]
pub struct Opened {
    pub ino: u64,
    pub generation: u64,
    pub passthrough: bool,
    pub writable: bool,
    /// Served by the daemon, and the kernel's page cache of the file still holds its content:
    /// the open keeps that cache (`FOPEN_KEEP_CACHE`) instead of dropping it.
    pub keep_cache: bool,
}

pub struct Inodes {
    root: PathBuf,
    nodes: RwLock<HashMap<u64, Node>>,
    /// The inodes whose ids are kept, oldest first (an inode may appear twice: the older entry
    /// then only lets its id go a little early).
    warm: Mutex<VecDeque<u64>>,
    /// (dev, ino) -> node id, for nodes with a synthetic id.
    synthetic: Mutex<HashMap<(u64, u64), u64>>,
    next_synthetic: AtomicU64,
    next_generation: AtomicU64,
    root_dev: u64,
    /// A readable fd of the root (open_by_handle_at refuses `O_PATH` ones).
    mount_fd: File,
    mount_id: i32,
    scheme: Scheme,
}

impl Inodes {
    /// `root_fd` is the directory opened (`O_PATH`) before the mount hid it; `root` its path.
    pub fn new(root_fd: OwnedFd, root: PathBuf) -> io::Result<Inodes> {
        let st = sys::stat_fd(root_fd.as_fd())?;
        let mount_fd = sys::reopen(root_fd.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
        // Handles work only if they can be made and opened again (tmpfs had none on older
        // kernels; some FUSE and network filesystems have none; non-root lacks the capability).
        let probe = sys::FileHandle::of(root_fd.as_fd())
            .and_then(|(h, id)| h.open(mount_fd.as_fd()).map(|_| id));
        let (scheme, mount_id) = match probe {
            Ok(id) => (Scheme::FileHandles, id),
            Err(e) => {
                tracing::warn!(
                    "roarfs: {} has no usable file handles ({e}); keeping one O_PATH fd per known inode",
                    root.display()
                );
                (Scheme::PathFds, -1)
            }
        };
        let root_node = Node::new(Backing::Fd(Arc::new(root_fd)), 0, ROOT, OsString::new(), 1);
        let nodes = HashMap::from([(ROOT, root_node)]);
        Ok(Inodes {
            root,
            nodes: RwLock::new(nodes),
            warm: Mutex::new(VecDeque::new()),
            synthetic: Mutex::new(HashMap::new()),
            next_synthetic: AtomicU64::new(SYNTHETIC_BASE),
            next_generation: AtomicU64::new(1),
            root_dev: st.st_dev,
            mount_fd,
            mount_id,
            scheme,
        })
    }

    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// How many inodes the table holds (the kernel has looked up and not forgotten).
    pub fn known(&self) -> usize {
        self.nodes.read().expect("nodes lock").len()
    }

    /// Runs `f` with an `O_PATH` fd of node `ino` (opened for this call when the node has a
    /// handle).
    pub fn with_fd<T>(
        &self,
        ino: u64,
        f: impl FnOnce(BorrowedFd<'_>) -> io::Result<T>,
    ) -> io::Result<T> {
        // The table's lock is never held while `f` runs: `f` may look up or forget nodes.
        let backing = match &self
            .nodes
            .read()
            .expect("nodes lock")
            .get(&ino)
            .ok_or_else(enoent)?
            .backing
        {
            Backing::Fd(fd) => Ok(fd.clone()),
            Backing::Handle(h) => Err(h.clone()),
        };
        match backing {
            Ok(fd) => f(fd.as_fd()),
            Err(h) => f(h.open(self.mount_fd.as_fd())?.as_fd()),
        }
    }

    /// Opens node `ino` with real access `flags` (straight from its handle when it has one).
    pub fn open_file(&self, ino: u64, flags: i32) -> io::Result<File> {
        let handle = match &self
            .nodes
            .read()
            .expect("nodes lock")
            .get(&ino)
            .ok_or_else(enoent)?
            .backing
        {
            Backing::Handle(h) => Some(h.clone()),
            Backing::Fd(_) => None,
        };
        match handle {
            Some(h) => h.open_file(self.mount_fd.as_fd(), flags),
            None => self.with_fd(ino, |fd| sys::reopen(fd, flags)),
        }
    }

    /// The path of `ino` as programs see it (through the mount).
    pub fn path(&self, ino: u64) -> PathBuf {
        let nodes = self.nodes.read().expect("nodes lock");
        let mut names = Vec::new();
        let mut cur = ino;
        while cur != ROOT {
            let Some(n) = nodes.get(&cur) else { break };
            names.push(n.name.clone());
            cur = n.parent;
        }
        let mut p = self.root.clone();
        for n in names.iter().rev() {
            p.push(n);
        }
        p
    }

    /// The node id a backing file has as its own inode number, when it can have one.
    fn own_number(&self, st: &libc::stat) -> Option<u64> {
        (st.st_dev == self.root_dev && st.st_ino > ROOT && st.st_ino < SYNTHETIC_BASE)
            .then_some(st.st_ino)
    }

    /// The node id of a backing file with status `st` (a synthetic one given if need be).
    fn id_for(&self, st: &libc::stat) -> u64 {
        self.own_number(st).unwrap_or_else(|| {
            *self
                .synthetic
                .lock()
                .expect("synthetic lock")
                .entry((st.st_dev, st.st_ino))
                .or_insert_with(|| self.next_synthetic.fetch_add(1, Ordering::Relaxed))
        })
    }

    /// The node id a backing file has, if it has one, without looking it up.
    pub fn id_of(&self, st: &libc::stat) -> Option<u64> {
        self.own_number(st).or_else(|| {
            self.synthetic
                .lock()
                .expect("synthetic lock")
                .get(&(st.st_dev, st.st_ino))
                .copied()
        })
    }

    /// Looks up (and remembers) the child `name` of `parent`, counting one kernel lookup.
    /// Returns the node id, the generation and the child's status.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> io::Result<(u64, u64, libc::stat)> {
        self.with_fd(parent, |dir| self.lookup_in(parent, dir, name))
    }

    /// [`Inodes::lookup`] with the parent already open as `dir` (a directory listing looks up
    /// all its entries through one descriptor).
    pub fn lookup_in(
        &self,
        parent: u64,
        dir: BorrowedFd<'_>,
        name: &OsStr,
    ) -> io::Result<(u64, u64, libc::stat)> {
        let fd = sys::open_path(dir, name)?;
        let st = sys::stat_fd(fd.as_fd())?;
        let backing = match self.scheme {
            Scheme::FileHandles if st.st_dev == self.root_dev => {
                match sys::FileHandle::of(fd.as_fd()) {
                    Ok((h, id)) if id == self.mount_id => Backing::Handle(h),
                    _ => Backing::Fd(Arc::new(fd)),
                }
            }
            _ => Backing::Fd(Arc::new(fd)),
        };
        let id = self.id_for(&st);
        let mut nodes = self.nodes.write().expect("nodes lock");
        let generation = match nodes.get_mut(&id) {
            Some(node) if node.backing.same_file(&backing) => {
                node.nlookup += 1;
                node.named(parent, name, st.st_nlink > 1);
                node.generation
            }
            Some(node) => {
                // The inode number was reused: the kernel's old inode is stale. Its FORGETs are
                // still to come, so its count stays; the open counts belong to the old file.
                *node = Node::new(
                    backing,
                    self.next_generation.fetch_add(1, Ordering::Relaxed),
                    parent,
                    name.to_owned(),
                    node.nlookup + 1,
                );
                node.generation
            }
            None => {
                nodes.insert(id, Node::new(backing, 0, parent, name.to_owned(), 1));
                0
            }
        };
        Ok((id, generation, st))
    }

    /// The kernel forgot `n` lookups of `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let mut nodes = self.nodes.write().expect("nodes lock");
        if let Some(node) = nodes.get_mut(&ino) {
            node.nlookup = node.nlookup.saturating_sub(n);
            if node.nlookup == 0 && node.passthrough_opens == 0 && node.userspace_opens == 0 {
                // Dropped once the lock is released: its kept backing id is released by ioctl.
                let gone = nodes.remove(&ino);
                drop(nodes);
                drop(gone);
                self.drop_synthetic(ino);
            }
        }
    }

    fn drop_synthetic(&self, ino: u64) {
        if ino >= SYNTHETIC_BASE {
            self.synthetic
                .lock()
                .expect("synthetic lock")
                .retain(|_, id| *id != ino);
        }
    }

    /// A rename moved the file now at `st` to `name` in `parent`: keep its name current
    /// (children follow through their parent link).
    pub fn moved(&self, st: &libc::stat, parent: u64, name: &OsStr) {
        let Some(id) = self.id_of(st) else { return };
        if let Some(n) = self.nodes.write().expect("nodes lock").get_mut(&id) {
            // The old name is gone: not another name of the file.
            n.unnamed(n.parent, &n.name.clone());
            n.named(parent, name, st.st_nlink > 1);
        }
    }

    /// `name` in `parent`, which was the file `st` (with other names: `st_nlink > 1`), was
    /// unlinked: the node keeps a name the file still has.
    pub fn unlinked(&self, st: &libc::stat, parent: u64, name: &OsStr) {
        let Some(id) = self.id_of(st) else { return };
        if let Some(n) = self.nodes.write().expect("nodes lock").get_mut(&id) {
            n.unnamed(parent, name);
        }
    }

    /// Counts an open of `ino` and decides how it is served. An inode is never in passthrough
    /// and userspace mode at once (the kernel refuses that): while it has passthrough opens,
    /// every open uses passthrough; while it has userspace opens, every open is served here.
    /// Otherwise a reader of a file larger than [`CACHED_MAX`] uses passthrough, and so does a
    /// writer only when the inode is already in that mode. `st` is the backing file's state now
    /// (regular files): whether a userspace reader may keep the kernel's page cache.
    pub fn open(
        &self,
        ino: u64,
        writable: bool,
        may_pass: bool,
        st: Option<&libc::stat>,
    ) -> io::Result<Opened> {
        let mut nodes = self.nodes.write().expect("nodes lock");
        let node = nodes.get_mut(&ino).ok_or_else(enoent)?;
        let large = st.is_some_and(|st| st.st_size > CACHED_MAX);
        let passthrough = may_pass
            && (node.passthrough_opens > 0 || !writable && large && node.userspace_opens == 0);
        let mut keep_cache = false;
        if passthrough {
            node.passthrough_opens += 1;
            if writable {
                // The write reaches the backing file around the page cache.
                node.cached = None;
            }
        } else {
            node.userspace_opens += 1;
            if let (false, Some(st)) = (writable, st) {
                // What the cache holds is this content if every change since it was filled went
                // through the cache; otherwise the kernel drops it as this open is answered.
                let now = Stamp::of(st);
                keep_cache = node.cached == Some(now);
                node.cached = Some(now);
            }
        }
        if writable {
            node.writers += 1;
        }
        Ok(Opened {
            ino,
            generation: node.generation,
            passthrough,
            writable,
            keep_cache,
        })
    }

    /// Whether an open of directory `ino` may keep the kernel's cached listing of it: `st`, the
    /// directory now, is as it was at the previous open. The listing the kernel caches is read
    /// after an open, so it is never older than the state remembered then; a change made behind
    /// the mount moves the directory's mtime and ctime, and the kernel drops its listing when
    /// the open is answered without `FOPEN_KEEP_CACHE`. Changes made through the mount the
    /// kernel notices itself (it drops the listing when one of its entries changes).
    pub fn open_dir(&self, ino: u64, st: &libc::stat) -> io::Result<bool> {
        let mut nodes = self.nodes.write().expect("nodes lock");
        let node = nodes.get_mut(&ino).ok_or_else(enoent)?;
        let now = Stamp::of(st);
        let keep = node.cached == Some(now);
        node.cached = Some(now);
        Ok(keep)
    }

    /// How many writable opens inode `ino` has now.
    pub fn writers(&self, ino: u64) -> usize {
        let nodes = self.nodes.read().expect("nodes lock");
        nodes.get(&ino).map_or(0, |n| n.writers)
    }

    /// One open fewer; drops the node once the kernel has forgotten it too. Returns how many
    /// writable opens the inode still has. `st`, the backing file's state at the close of a
    /// userspace writer: every write went through the kernel's page cache, so once the last
    /// writer is gone the cache holds that content.
    pub fn close(&self, o: Opened, st: Option<&libc::stat>) -> usize {
        let mut nodes = self.nodes.write().expect("nodes lock");
        let Some(node) = nodes.get_mut(&o.ino) else {
            return 0;
        };
        if node.generation != o.generation {
            return 0;
        }
        if o.passthrough {
            node.passthrough_opens = node.passthrough_opens.saturating_sub(1);
        } else {
            node.userspace_opens = node.userspace_opens.saturating_sub(1);
        }
        if o.writable {
            node.writers = node.writers.saturating_sub(1);
            if !o.passthrough && node.writers == 0 {
                node.cached = st.map(Stamp::of);
            }
        }
        let writers = node.writers;
        if node.nlookup == 0 && node.passthrough_opens == 0 && node.userspace_opens == 0 {
            let gone = nodes.remove(&o.ino);
            drop(nodes);
            drop(gone);
            self.drop_synthetic(o.ino);
        }
        writers
    }

    /// The passthrough backing id of `ino`, registered with `make` on first use and shared by
    /// the inode's passthrough opens.
    pub fn backing_id(
        &self,
        ino: u64,
        make: impl FnOnce() -> io::Result<BackingId>,
    ) -> io::Result<Arc<BackingId>> {
        let mut nodes = self.nodes.write().expect("nodes lock");
        let node = nodes.get_mut(&ino).ok_or_else(enoent)?;
        if let Some(id) = node.backing_id.upgrade() {
            return Ok(id);
        }
        let id = Arc::new(make()?);
        node.backing_id = Arc::downgrade(&id);
        node.kept = Some(id.clone());
        let mut warm = self.warm.lock().expect("warm lock");
        warm.push_back(ino);
        let evicted = if warm.len() > WARM_IDS {
            warm.pop_front()
                .filter(|old| *old != ino)
                .and_then(|old| nodes.get_mut(&old))
                .and_then(|n| n.kept.take())
        } else {
            None
        };
        drop(warm);
        drop(nodes);
        // Releasing an id is an ioctl: not under the table's lock.
        drop(evicted);
        Ok(id)
    }
}

fn enoent() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}
