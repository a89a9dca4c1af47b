//! The one event vocabulary: what every observer (the preload shim, ptrace, eBPF, the mount)
//! turns what it saw into, and the only input of the rule in [`crate::classify`].

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use roar_store::FileStat;

/// A program's standard streams of one kind (regular files, or pipes), by (dev, ino).
pub type Stdio = [Option<(u64, u64)>; 3];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A process started a new program image.
    Exec {
        pid: i32,
        ppid: i32,
        exe: PathBuf,
        argv: Vec<OsString>,
        cwd: PathBuf,
        /// The (dev, ino) of its stdin, stdout and stderr when they are regular files.
        stdio: Stdio,
        /// The same for those that are pipes, FIFOs or sockets.
        pipes: Stdio,
        ts_ns: i64,
    },
    /// A process was forked (and has not exec'd yet).
    Fork {
        pid: i32,
        ppid: i32,
        ts_ns: i64,
    },
    /// A process exited.
    Exit {
        pid: i32,
        ts_ns: i64,
    },
    /// A regular file was opened. `stat` is its identity right after the open.
    Open {
        pid: i32,
        path: PathBuf,
        flags: i32,
        stat: Option<FileStat>,
        ts_ns: i64,
    },
    Rename {
        pid: i32,
        from: PathBuf,
        to: PathBuf,
        ts_ns: i64,
    },
    Link {
        pid: i32,
        from: PathBuf,
        to: PathBuf,
        ts_ns: i64,
    },
    Unlink {
        pid: i32,
        path: PathBuf,
        ts_ns: i64,
    },
    Truncate {
        pid: i32,
        path: PathBuf,
        ts_ns: i64,
    },
    Mkdir {
        pid: i32,
        path: PathBuf,
        ts_ns: i64,
    },
    Rmdir {
        pid: i32,
        path: PathBuf,
        ts_ns: i64,
    },
    /// `renameat2(RENAME_EXCHANGE)`: the contents of `a` and `b` swapped places.
    Exchange {
        pid: i32,
        a: PathBuf,
        b: PathBuf,
        ts_ns: i64,
    },
    /// A symbolic link created at `path` (its target is not a path the job used).
    Symlink {
        pid: i32,
        path: PathBuf,
        ts_ns: i64,
    },
    /// The process was about to exec `path`, a program the backend cannot follow (`why`).
    Untraced {
        pid: i32,
        path: PathBuf,
        why: &'static str,
        ts_ns: i64,
    },
}

impl Event {
    /// The process the event is of (its thread group).
    pub fn pid(&self) -> i32 {
        match self {
            Event::Exec { pid, .. }
            | Event::Fork { pid, .. }
            | Event::Exit { pid, .. }
            | Event::Open { pid, .. }
            | Event::Rename { pid, .. }
            | Event::Link { pid, .. }
            | Event::Unlink { pid, .. }
            | Event::Truncate { pid, .. }
            | Event::Mkdir { pid, .. }
            | Event::Rmdir { pid, .. }
            | Event::Symlink { pid, .. }
            | Event::Exchange { pid, .. }
            | Event::Untraced { pid, .. } => *pid,
        }
    }

    pub fn ts_ns(&self) -> i64 {
        match self {
            Event::Exec { ts_ns, .. }
            | Event::Fork { ts_ns, .. }
            | Event::Exit { ts_ns, .. }
            | Event::Open { ts_ns, .. }
            | Event::Rename { ts_ns, .. }
            | Event::Link { ts_ns, .. }
            | Event::Unlink { ts_ns, .. }
            | Event::Truncate { ts_ns, .. }
            | Event::Mkdir { ts_ns, .. }
            | Event::Rmdir { ts_ns, .. }
            | Event::Symlink { ts_ns, .. }
            | Event::Exchange { ts_ns, .. }
            | Event::Untraced { ts_ns, .. } => *ts_ns,
        }
    }
}

/// Joins `base` and `path` (unless `path` is absolute) and removes `.`, `..` and repeated slashes
/// lexically. No filesystem access: symlinks are kept as the program named them.
pub fn join_normalize(base: &[u8], path: &[u8]) -> PathBuf {
    let mut joined = Vec::with_capacity(base.len() + path.len() + 1);
    if path.first() != Some(&b'/') {
        joined.extend_from_slice(base);
        joined.push(b'/');
    }
    joined.extend_from_slice(path);
    let raw = PathBuf::from(OsString::from_vec(joined));
    let mut out = PathBuf::from("/");
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

pub fn bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_and_normalizes() {
        assert_eq!(join_normalize(b"/a/b", b"c"), Path::new("/a/b/c"));
        assert_eq!(join_normalize(b"/a/b", b"../c/./d"), Path::new("/a/c/d"));
        assert_eq!(join_normalize(b"/ignored", b"/x//y/"), Path::new("/x/y"));
        assert_eq!(join_normalize(b"/", b"../../z"), Path::new("/z"));
    }
}
