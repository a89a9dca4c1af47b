//! How many requests of each kind the kernel sent a session (vendored addition: a filesystem
//! reports requests per operation beside its benchmarks' times, so a change is judged by a
//! number that does not depend on how fast the machine wakes up).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use crate::spin::Spin;

/// The opcodes counted one by one (those [`NAMES`] names); anything else is counted as `OTHER`.
const KINDS: usize = NAMES.len();

/// Counts of the requests a session received, by kind, shared by every thread serving it.
#[derive(Debug)]
pub(crate) struct Requests {
    counts: [AtomicU64; KINDS],
    other: AtomicU64,
}

/// A session's counters, shared with its serving threads: a handle the filesystem's owner reads
/// while the session runs ([`crate::Session::stats`]).
#[derive(Debug, Clone)]
pub struct Stats {
    pub(crate) requests: Arc<Requests>,
    pub(crate) spin: Arc<Spin>,
}

impl Stats {
    pub(crate) fn new(poll_max: Option<std::time::Duration>) -> Self {
        Stats {
            requests: Arc::default(),
            spin: Arc::new(Spin::new(poll_max)),
        }
    }

    /// The kinds of request received so far, each with its count, in opcode order.
    pub fn requests(&self) -> Vec<RequestCount> {
        self.requests.counts()
    }

    /// How polling for requests went (`Config::poll_max`).
    pub fn polls(&self) -> crate::SpinStats {
        self.spin.stats()
    }
}

/// One kind of request and how many came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestCount {
    /// The opcode's name without `FUSE_`: `OPEN`, `GETATTR`, ...
    pub name: &'static str,
    /// How many the session received.
    pub count: u64,
    /// Whether the process behind the request waits for its reply. False for the kinds the
    /// kernel sends without waiting (FORGET, BATCH_FORGET, RELEASE, RELEASEDIR, INTERRUPT); READ
    /// and WRITE count as waited for, though a readahead or a writeback may not be.
    pub waited: bool,
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            other: AtomicU64::new(0),
        }
    }
}

impl Requests {
    /// Counts one request of opcode `op`.
    pub(crate) fn count(&self, op: u32) {
        let slot = self.counts.get(op as usize).unwrap_or(&self.other);
        slot.fetch_add(1, Ordering::Relaxed);
    }

    /// The kinds received so far, each with its count, in opcode order.
    pub(crate) fn counts(&self) -> Vec<RequestCount> {
        self.counts
            .iter()
            .enumerate()
            .map(|(op, n)| (name(op as u32), n.load(Ordering::Relaxed)))
            .chain([("OTHER", self.other.load(Ordering::Relaxed))])
            .filter(|&(_, count)| count > 0)
            .map(|(name, count)| RequestCount {
                name,
                count,
                waited: !matches!(
                    name,
                    "FORGET" | "BATCH_FORGET" | "RELEASE" | "RELEASEDIR" | "INTERRUPT"
                ),
            })
            .collect()
    }
}

/// The name of FUSE opcode `op` (include/uapi/linux/fuse.h); "" for the numbers FUSE skips.
fn name(op: u32) -> &'static str {
    NAMES.get(op as usize).copied().unwrap_or("OTHER")
}

/// FUSE's opcodes by number (include/uapi/linux/fuse.h).
const NAMES: [&str; 52] = [
    "",
    "LOOKUP",
    "FORGET",
    "GETATTR",
    "SETATTR",
    "READLINK",
    "SYMLINK",
    "",
    "MKNOD",
    "MKDIR",
    "UNLINK",
    "RMDIR",
    "RENAME",
    "LINK",
    "OPEN",
    "READ",
    "WRITE",
    "STATFS",
    "RELEASE",
    "",
    "FSYNC",
    "SETXATTR",
    "GETXATTR",
    "LISTXATTR",
    "REMOVEXATTR",
    "FLUSH",
    "INIT",
    "OPENDIR",
    "READDIR",
    "RELEASEDIR",
    "FSYNCDIR",
    "GETLK",
    "SETLK",
    "SETLKW",
    "ACCESS",
    "CREATE",
    "INTERRUPT",
    "BMAP",
    "DESTROY",
    "IOCTL",
    "POLL",
    "NOTIFY_REPLY",
    "BATCH_FORGET",
    "FALLOCATE",
    "READDIRPLUS",
    "RENAME2",
    "LSEEK",
    "COPY_FILE_RANGE",
    "SETUPMAPPING",
    "REMOVEMAPPING",
    "SYNCFS",
    "TMPFILE",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_kind_and_said_whether_waited_for() {
        let r = Requests::default();
        for op in [14, 14, 39, 18, 3, 200] {
            r.count(op);
        }
        let got: Vec<(&str, u64, bool)> = r
            .counts()
            .iter()
            .map(|c| (c.name, c.count, c.waited))
            .collect();
        assert_eq!(
            got,
            [
                ("GETATTR", 1, true),
                ("OPEN", 2, true),
                ("RELEASE", 1, false),
                ("IOCTL", 1, true),
                ("OTHER", 1, true),
            ]
        );
    }
}
