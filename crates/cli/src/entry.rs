//! roar's process entry: `main` as the C runtime calls it, doing what Rust's runtime does around
//! `fn main` that roar relies on, and not the rest.
//!
//! Rust's start also asks glibc where the main thread's stack is, to name a stack overflow in its
//! message (for the main thread glibc reads and parses /proc/self/maps), and sets up an alternate
//! signal stack it tears down at exit: 0.2-0.35 ms of every roar start on the VMs measured
//! (bench/NOTES.md). Without it, a stack overflow on roar's main thread is a plain SIGSEGV instead
//! of a "has overflowed its stack" line and SIGABRT; a panic still prints its message and exits
//! 101.
#![allow(unsafe_code)]

/// The exit status of a roar command. (std's `ExitCode` cannot be read back into the status
/// `main` returns.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitCode(u8);

impl ExitCode {
    pub const SUCCESS: ExitCode = ExitCode(0);
}

impl From<u8> for ExitCode {
    fn from(code: u8) -> ExitCode {
        ExitCode(code)
    }
}

#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    standard_fds_open();
    // As Rust's runtime does: a write to a closed pipe is an EPIPE error roar handles, not a
    // signal that kills it (report commands put SIGPIPE back, main.rs). A command roar runs
    // starts with it as roar was started (roar_tracer's launch).
    // SAFETY: a signal disposition set before any thread is started.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let code = std::panic::catch_unwind(crate::roar_main).map_or(101, |c| i32::from(c.0));
    // Flushes stdout on the way out, as Rust's runtime does after `fn main`.
    std::process::exit(code)
}

/// Opens /dev/null on each standard fd that is closed, as Rust's runtime does: a file roar opens
/// must never become its stdin, stdout or stderr. (roar_tracer reads which were closed before
/// this, for the command.)
#[cfg(not(test))]
fn standard_fds_open() {
    for fd in 0..3 {
        // SAFETY: F_GETFD on any integer is safe; EBADF says it is not open.
        let closed = unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF);
        // SAFETY: opening a path from a NUL-terminated literal; the lowest free fd is `fd`, as the
        // ones below it are open.
        if closed && unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) } != fd {
            std::process::abort();
        }
    }
}
