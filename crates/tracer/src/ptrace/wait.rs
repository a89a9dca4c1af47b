//! Waiting for the next stop of the traced processes: `waitpid`, looked for without sleeping
//! for a short window first while stops come faster than a wake-up costs (issue 65;
//! `roar_spin`). A syscall's exit stop follows its entry stop by the syscall's own time, often a
//! few microseconds, where sleeping in `waitpid` costs the tracer a cross-CPU wake-up of tens.
//! One window per kind of stop served last: what follows an entry (its exit) is not what
//! follows an exit (the program's own work until its next file syscall).
//! `ROAR_PTRACE_POLL_US` sets the largest window (0: never poll).
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

/// The largest window, in µs, unless `ROAR_PTRACE_POLL_US` says otherwise.
const POLL_MAX_US: u64 = 200;

/// The kinds of stop the windows are kept by.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stop {
    /// A filtered syscall's entry (seccomp).
    Entry = 0,
    /// A syscall's exit.
    Exit = 1,
    /// Anything else: forks, execs, signals.
    Other = 2,
}

impl Stop {
    /// The kind of stop `waitpid` reported as `status`.
    pub(super) fn of(status: i32) -> Stop {
        let (sig, event) = (libc::WSTOPSIG(status), status >> 16);
        match (libc::WIFSTOPPED(status), sig, event) {
            (true, libc::SIGTRAP, libc::PTRACE_EVENT_SECCOMP) => Stop::Entry,
            (true, s, 0) if s == libc::SIGTRAP | 0x80 => Stop::Exit,
            _ => Stop::Other,
        }
    }
}

/// `waitpid(-1)` for every traced process, polling first while stops come fast.
pub(super) struct Waiter {
    windows: Option<roar_spin::Windows<3>>,
    /// When the tracer last resumed a process (finished serving a stop).
    free_since: Instant,
}

impl Waiter {
    pub(super) fn new() -> Self {
        let max = std::env::var("ROAR_PTRACE_POLL_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(POLL_MAX_US);
        Waiter {
            windows: (max > 0).then(|| roar_spin::Windows::new(Duration::from_micros(max))),
            free_since: Instant::now(),
        }
    }

    /// The next process that stopped or ended, and its status (`waitpid`'s -1 on an error,
    /// with errno set).
    pub(super) fn next(&mut self, status: &mut i32) -> i32 {
        let Some(windows) = &mut self.windows else {
            return wait(status, 0);
        };
        let until = self.free_since + Duration::from_nanos(windows.current());
        let pid = roar_spin::poll(until, || {
            let pid = wait(status, libc::WNOHANG);
            (pid != 0).then_some(pid)
        });
        let pid = pid.unwrap_or_else(|| wait(status, 0));
        windows.waited(u64::try_from(self.free_since.elapsed().as_nanos()).unwrap_or(u64::MAX));
        pid
    }

    /// The stop `status` was served (its process resumed): the tracer is free from now.
    pub(super) fn served(&mut self, status: i32) {
        if let Some(windows) = &mut self.windows {
            windows.after(Stop::of(status) as usize);
            self.free_since = Instant::now();
        }
    }
}

fn wait(status: &mut i32, flags: i32) -> i32 {
    // SAFETY: waitpid with a valid out-pointer.
    unsafe { libc::waitpid(-1, status, libc::__WALL | flags) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_are_told_apart_by_kind() {
        let stopped = |sig: i32, event: i32| (event << 16) | (sig << 8) | 0x7f;
        assert!(matches!(
            Stop::of(stopped(libc::SIGTRAP, libc::PTRACE_EVENT_SECCOMP)),
            Stop::Entry
        ));
        assert!(matches!(
            Stop::of(stopped(libc::SIGTRAP | 0x80, 0)),
            Stop::Exit
        ));
        assert!(matches!(
            Stop::of(stopped(libc::SIGTRAP, libc::PTRACE_EVENT_FORK)),
            Stop::Other
        ));
        assert!(matches!(Stop::of(0), Stop::Other), "an exit");
    }
}
