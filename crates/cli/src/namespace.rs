//! Running a command in a mount namespace of its own where some paths show other files: how
//! `roar reproduce --run` puts a scratch worktree over the tree (the job sees its recorded paths)
//! and `roar run @N --set` puts a scratch copy of a parameter file over the user's (the user's
//! file is never written). Root gets a mount namespace; anyone else a user namespace too.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use anyhow::Context;

/// Arranges for `cmd`, once started, to see each `(source, target)` bind-mounted over `target`
/// (a file over a file, a directory over a directory), in its own mount namespace, then to
/// change to `chdir` if given (after the mounts: it may be under a target).
pub fn with_binds(
    cmd: &mut Command,
    binds: &[(&Path, &Path)],
    chdir: Option<&Path>,
) -> anyhow::Result<()> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).context("a path with a NUL byte");
    let binds: Vec<(CString, CString)> = binds
        .iter()
        .map(|(s, t)| Ok((c(s)?, c(t)?)))
        .collect::<anyhow::Result<_>>()?;
    let chdir = chdir.map(c).transpose()?;
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let uid_map = format!("{uid} {uid} 1\n").into_bytes();
    let gid_map = format!("{gid} {gid} 1\n").into_bytes();
    // SAFETY: between fork and exec only system calls on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let own_users = uid != 0;
            let flags = libc::CLONE_NEWNS | if own_users { libc::CLONE_NEWUSER } else { 0 };
            if libc::unshare(flags) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if own_users {
                write_proc(c"/proc/self/setgroups", b"deny");
                write_proc(c"/proc/self/uid_map", &uid_map);
                write_proc(c"/proc/self/gid_map", &gid_map);
            }
            let none = std::ptr::null();
            if libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                none.cast(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            for (source, target) in &binds {
                let flags = libc::MS_BIND | libc::MS_REC;
                if libc::mount(source.as_ptr(), target.as_ptr(), none, flags, none.cast()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(dir) = &chdir {
                if libc::chdir(dir.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(())
}

/// Writes `bytes` to a /proc file of this process (between fork and exec: no allocation).
unsafe fn write_proc(path: &std::ffi::CStr, bytes: &[u8]) {
    // SAFETY: open/write/close on a NUL-terminated path and a live buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, bytes.as_ptr().cast(), bytes.len());
            libc::close(fd);
        }
    }
}
