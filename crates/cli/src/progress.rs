//! A line on a terminal while roar hashes for longer than a second (a 2 GiB output written just
//! before the command exited takes seconds): how much it has read so far. Nothing when stderr is
//! not a terminal, and nothing for work that ends within the second.

use std::io::{IsTerminal, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Runs `f`; if it takes more than a second and stderr is a terminal, shows `roar: hashing WHAT:
/// N MiB read (S s)` meanwhile, updated five times a second and cleared at the end.
pub fn while_hashing<T>(what: &str, f: impl FnOnce() -> T) -> T {
    if !std::io::stderr().is_terminal() {
        return f();
    }
    let (done, wait) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let start = Instant::now();
            let base = roar_store::hash::big_bytes_read();
            // ROAR_PROGRESS_AFTER_MS: after how long the line appears (tests make it 0).
            let after = std::env::var("ROAR_PROGRESS_AFTER_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1000);
            if wait.recv_timeout(Duration::from_millis(after))
                != Err(mpsc::RecvTimeoutError::Timeout)
            {
                return;
            }
            let mut err = std::io::stderr();
            loop {
                let read = roar_store::hash::big_bytes_read() - base;
                let _ = write!(
                    err,
                    "\r\x1b[2Kroar: hashing {what}: {} read ({} s)",
                    crate::fmt::size(read),
                    start.elapsed().as_secs()
                );
                let _ = err.flush();
                if wait.recv_timeout(Duration::from_millis(200))
                    != Err(mpsc::RecvTimeoutError::Timeout)
                {
                    let _ = write!(err, "\r\x1b[2K");
                    let _ = err.flush();
                    return;
                }
            }
        });
        let out = f();
        drop(done);
        out
    })
}
