//! What the kernel says of a mount point: whether it is a roarfs mount (`/proc/self/mountinfo`),
//! and whether its daemon is gone.

use std::path::Path;

/// Whether `dir` is a mount point of a roarfs filesystem (from /proc/self/mountinfo).
pub(crate) fn is_roarfs_mount(dir: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.to_string_lossy().replace(' ', "\\040");
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-");
        // Fields after "-": filesystem type, source. roarfs mounts as type fuse, source roarfs.
        f.get(4) == Some(&want.as_str())
            && sep.is_some_and(|s| {
                f.get(s + 1).is_some_and(|t| t.starts_with("fuse"))
                    && f.get(s + 2) == Some(&"roarfs")
            })
    })
}

/// ENOTCONN: "transport endpoint is not connected", what a FUSE mount answers once its daemon
/// is gone.
const ENOTCONN: i32 = 107;

/// ECONNABORTED: what requests in flight get while a killed daemon's connection is torn down.
const ECONNABORTED: i32 = 103;

/// Whether `dir` is a FUSE mount whose daemon is gone (it answers ENOTCONN or ECONNABORTED).
pub(crate) fn is_dead(dir: &Path) -> bool {
    matches!(std::fs::metadata(dir), Err(e) if matches!(e.raw_os_error(), Some(ENOTCONN | ECONNABORTED)))
}
