//! Whether the shim will still be there after an exec: a statically linked program has no dynamic
//! loader to load it, and the loader ignores `LD_PRELOAD` for a program that gains privileges
//! (setuid/setgid to another id). Such an exec is reported before it happens, so roar can say the
//! job's record misses that program's files instead of recording less in silence.
//!
//! No allocation (this runs inside exec hooks, possibly in a vfork child): raw syscalls into stack
//! buffers.

use core::ffi::{c_char, c_int};

use crate::{cstr, PATH_MAX};

/// Why a program cannot be followed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unfollowable {
    Static = 1,
    SetId = 2,
    /// Not a program: the process set up io_uring (src/syscall.c).
    Ring = 3,
}

/// ELF64 program header type of the interpreter (the dynamic loader).
const PT_INTERP: u32 = 3;
/// Program headers read at most (a typical binary has ~13).
const MAX_PHDRS: usize = 64;
const PHDR_SIZE: usize = 56;

fn openat(path: &[u8]) -> c_int {
    // SAFETY: `path` is NUL-terminated (callers pass C strings or our own terminated buffers).
    unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        ) as c_int
    }
}

fn pread_exact(fd: c_int, buf: &mut [u8], at: u64) -> bool {
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::syscall(libc::SYS_pread64, fd, buf.as_mut_ptr(), buf.len(), at) };
    n == buf.len() as i64
}

/// The verdict on the file at `path` (NUL-terminated), or None when the shim follows it (or it is
/// not a program it can judge: a script's interpreter is judged when it is exec'd in turn).
pub(crate) fn judge(path: &[u8]) -> Option<Unfollowable> {
    let fd = openat(path);
    if fd < 0 {
        return None;
    }
    let verdict = judge_fd(fd);
    // SAFETY: closing the fd opened above (a raw close: our close hook guards our socket only).
    unsafe { libc::syscall(libc::SYS_close, fd) };
    verdict
}

fn judge_fd(fd: c_int) -> Option<Unfollowable> {
    // SAFETY: stat is plain old data, filled by the kernel.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: a valid fd and out-pointer.
    if unsafe { libc::syscall(libc::SYS_fstat, fd, &mut st) } != 0 {
        return None;
    }
    // SAFETY: no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let setuid = st.st_mode & libc::S_ISUID != 0 && st.st_uid != uid;
    let setgid =
        st.st_mode & libc::S_ISGID != 0 && st.st_mode & libc::S_IXGRP != 0 && st.st_gid != gid;
    if setuid || setgid {
        return Some(Unfollowable::SetId);
    }
    let mut head = [0u8; 64];
    if !pread_exact(fd, &mut head, 0) || &head[..4] != b"\x7fELF" || head[4] != 2 {
        return None;
    }
    let phoff = u64::from_le_bytes([
        head[0x20], head[0x21], head[0x22], head[0x23], head[0x24], head[0x25], head[0x26],
        head[0x27],
    ]);
    let phentsize = u16::from_le_bytes([head[0x36], head[0x37]]) as usize;
    let phnum = (u16::from_le_bytes([head[0x38], head[0x39]]) as usize).min(MAX_PHDRS);
    if !(4..=PHDR_SIZE * 2).contains(&phentsize) {
        return None;
    }
    let mut table = [0u8; MAX_PHDRS * PHDR_SIZE * 2];
    let len = phentsize * phnum;
    if !pread_exact(fd, &mut table[..len], phoff) {
        return None;
    }
    let has_interp = table[..len]
        .chunks(phentsize)
        .any(|ph| u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) == PT_INTERP);
    (!has_interp).then_some(Unfollowable::Static)
}

/// The file `execvp` would run for `file` (NUL-terminated, no `/`), searching the PATH of `envp`
/// ("/bin:/usr/bin" without one), written NUL-terminated into `out`; None if nothing executable.
pub(crate) unsafe fn search_path<'a>(
    file: &[u8],
    envp: *const *const c_char,
    out: &'a mut [u8; PATH_MAX],
) -> Option<&'a [u8]> {
    let name = file.strip_suffix(b"\0").unwrap_or(file);
    let mut path: &[u8] = b"/bin:/usr/bin";
    if !envp.is_null() {
        let mut i = 0;
        // SAFETY: envp is a NULL-terminated array of C strings (exec's own argument).
        unsafe {
            while !(*envp.add(i)).is_null() {
                let e = cstr(*envp.add(i));
                if let Some(v) = e.strip_prefix(b"PATH=") {
                    path = v;
                    break;
                }
                i += 1;
            }
        }
    }
    for dir in path.split(|b| *b == b':') {
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        let total = dir.len() + 1 + name.len();
        if total + 1 > out.len() {
            continue;
        }
        out[..dir.len()].copy_from_slice(dir);
        out[dir.len()] = b'/';
        out[dir.len() + 1..total].copy_from_slice(name);
        out[total] = 0;
        // SAFETY: a NUL-terminated path in our buffer.
        let ok = unsafe { libc::syscall(libc::SYS_access, out.as_ptr(), libc::X_OK) == 0 };
        if ok {
            return Some(&out[..=total]);
        }
    }
    None
}
