//! A mount's state file (`.roar/mounts/<tag>.json`: its directory and daemon) and whether that
//! daemon still serves it: alive, exiting, or dead with its mount left behind (then cleared).

use super::*;

#[derive(Serialize, Deserialize)]
pub(super) struct State {
    pub(super) dir: PathBuf,
    pub(super) pid: i32,
    pub(super) started_ns: i64,
    /// The archives mounted on `dir` (none for a directory mount).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) archives: Vec<PathBuf>,
}

/// An absolute, lexically normalised path, without touching the filesystem (a dead FUSE mount
/// cannot be canonicalised).
pub(super) fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let cwd = std::env::current_dir()?;
    Ok(roar_tracer::event::join_normalize(
        cwd.as_os_str().as_bytes(),
        p.as_os_str().as_bytes(),
    ))
}

pub(super) fn state_dir(project: &Project) -> PathBuf {
    project.dir().join("mounts")
}

pub(super) fn tag(dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    blake3::hash(dir.as_os_str().as_bytes()).to_hex()[..16].to_owned()
}

pub(super) fn state_path(project: &Project, dir: &Path) -> PathBuf {
    state_dir(project).join(format!("{}.json", tag(dir)))
}

pub(super) fn read_state(path: &Path) -> Option<State> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Running and not on its way out. A zombie counts as gone (where no init reaps orphans, the
/// daemon stays one), and so does a process that has been sent SIGKILL or whose main thread is
/// exiting: right after `kill -9` the daemon can still look alive for a while, its mount still
/// answering from the kernel's caches, and a `roar mount` at that moment must see a dead mount.
/// A worker thread that ends on its own is not the process ending (the daemon's threads end
/// before it records its last jobs).
pub(super) fn alive(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let dir = task.path();
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let fields: Vec<&str> = rest.split(' ').collect();
        let main = task.file_name().to_str() == Some(&pid.to_string());
        // Fields from the state on: state, ppid, pgrp, session, tty, tpgid, flags.
        let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0);
        let ended = matches!(fields.first(), Some(&("Z" | "X" | "x")));
        if main && (ended || flags & PF_EXITING != 0) {
            return false;
        }
        if sigkill_pending(&dir) {
            return false;
        }
        any |= !ended;
    }
    any
}

/// Whether process `pid` is over: gone, or a zombie (its files closed).
pub(super) fn exited(pid: i32) -> bool {
    use procfs::FromRead;
    procfs::process::Stat::from_file(format!("/proc/{pid}/stat"))
        .map_or(true, |stat| matches!(stat.state, 'Z' | 'X'))
}

/// The kernel's "this task is exiting" flag (include/linux/sched.h).
pub(super) const PF_EXITING: u64 = 0x4;

/// Whether SIGKILL waits for the task (its own pending set or its process's).
pub(super) fn sigkill_pending(task: &Path) -> bool {
    let Ok(status) = std::fs::read_to_string(task.join("status")) else {
        return false;
    };
    status.lines().any(|l| {
        let mask = l
            .strip_prefix("SigPnd:")
            .or_else(|| l.strip_prefix("ShdPnd:"));
        mask.and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & (1 << (libc::SIGKILL - 1)) != 0)
    })
}

/// A roarfs mount whose daemon is gone (or going): the mount answers ENOTCONN or ECONNABORTED,
/// or the daemon its state file names is no longer running. Known at once after a kill, not
/// only once the kernel has noticed.
pub(super) fn is_dead_mount(dir: &Path, project: &Project) -> bool {
    if is_dead(dir) {
        return true;
    }
    is_roarfs_mount(dir) && read_state(&state_path(project, dir)).is_none_or(|s| !alive(s.pid))
}

/// Clears a dead mount (its daemon was killed) so DIR shows its own contents again.
pub(super) fn clear_dead(dir: &Path, project: &Project) -> anyhow::Result<bool> {
    if !is_dead_mount(dir, project) {
        return Ok(false);
    }
    roar_roarfs::sys::umount_detach(dir)
        .with_context(|| format!("cannot unmount the dead mount on {}", dir.display()))?;
    // Its journals are recovered next: wait (a little) until it has let go of them, as a
    // killed process does once it has closed its files.
    if let Some(s) = read_state(&state_path(project, dir)) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !exited(s.pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let _ = std::fs::remove_file(state_path(project, dir));
    eprintln!(
        "roar: {} had a dead roarfs mount (transport endpoint is not connected: its daemon was killed); unmounted it, the directory's files are untouched",
        dir.display()
    );
    Ok(true)
}
