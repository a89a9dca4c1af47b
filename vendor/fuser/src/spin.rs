//! Taking the next request without sleeping while requests come faster than a wake-up costs
//! (vendored addition; bench/NOTES.md, "Requests per operation and an adaptive poll").
//!
//! A thread that sleeps in `read(/dev/fuse)` is woken by the process that queued a request:
//! on a machine whose idle CPUs halt, that is a cross-CPU wake-up of tens of microseconds, paid
//! again by the reply. When the session's requests come close together (a program opening a
//! file asks OPEN, then IOCTL for `isatty`, then closes it), the thread that served the last
//! one polls the device for a short window before it sleeps, and a request that comes within
//! the window is read without any wake-up.
//!
//! The window (`roar_spin`) adapts to how fast requests have come, one window per kind of
//! request served last, and the poller yields the CPU after every look.
//!
//! While the window is open, one thread is *the reader* — polling, or asleep in `read` once the
//! window has passed — and the others wait here, not in `read`: the kernel wakes a thread
//! asleep in `read` for every request it queues, which is the wake-up polling saves (and that
//! thread may take the request first). The reader serves what it reads itself; if it spends
//! longer than [`HANDOFF`] on one request (hashing a large file, say), a waiting thread becomes
//! the reader, so a slow request holds up the others no longer than that. When the window
//! closes, every thread goes back to `read`, as without polling.

use std::os::fd::AsRawFd;
use std::os::fd::BorrowedFd;
use std::sync::Condvar;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

/// How long the reader may spend on one request before a waiting thread takes its place.
const HANDOFF: Duration = Duration::from_millis(2);

/// Who reads, and what it is doing (the threads' shared part of [`Spin`]).
#[derive(Debug)]
struct Turns {
    /// The reading thread's number; 0: none (every thread reads).
    reader: u64,
    /// Since when the reader has been on one request.
    busy_since: Option<Instant>,
    /// Whether the reader is asleep in `read`.
    asleep: bool,
    /// Whether a waiting thread is timing the reader, and whether it waits for it to wake.
    watched: bool,
    watcher_idle: bool,
    /// The session ended: nobody waits any more.
    ended: bool,
    /// The last number handed to a thread.
    numbered: u64,
    /// By the opcode of the request served last: what follows an OPEN (an IOCTL, at once) is
    /// not what follows a RELEASE (perhaps a long computation).
    windows: roar_spin::Windows<64>,
}

/// What a serving thread does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// A request is there: read it (as the reader).
    Caught,
    /// Read, sleeping until a request comes.
    Block,
}

/// The session's polling state, shared by its serving threads.
#[derive(Debug)]
pub(crate) struct Spin {
    /// The largest window, in ns; 0: never poll.
    max: u64,
    turns: Mutex<Turns>,
    /// Threads waiting while another polls.
    waiting: Condvar,
    /// When the session last finished a request, in ns since `epoch`.
    free_since: AtomicU64,
    epoch: Instant,
    /// Requests read while polling, and polls that ended without one.
    hits: AtomicU64,
    misses: AtomicU64,
}

/// How the polling of a session went: requests caught and windows that ran out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpinStats {
    /// Requests read while polling (each a wake-up saved).
    pub hits: u64,
    /// Windows that ran out without a request (each up to the window's CPU spent).
    pub misses: u64,
}

impl Spin {
    /// Polling for up to `max` (none: never).
    pub(crate) fn new(max: Option<Duration>) -> Self {
        let max = max.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Spin {
            max,
            turns: Mutex::new(Turns {
                reader: 0,
                busy_since: None,
                asleep: false,
                watched: false,
                watcher_idle: false,
                ended: false,
                numbered: 0,
                windows: roar_spin::Windows::new(Duration::from_nanos(max)),
            }),
            waiting: Condvar::new(),
            free_since: AtomicU64::new(0),
            epoch: Instant::now(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A number for a serving thread, for [`Spin::turn`].
    pub(crate) fn thread(&self) -> u64 {
        let mut t = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        t.numbered += 1;
        t.numbered
    }

    /// What thread `me` does before it reads `fd`. While a window is open: as the reader,
    /// polls until a request is there ([`Turn::Caught`]) or the window for what comes after the
    /// last request has passed (then sleeps in `read`: [`Turn::Block`]); otherwise waits while
    /// another thread reads. With every window closed, every thread reads ([`Turn::Block`]).
    pub(crate) fn turn(&self, me: u64, fd: BorrowedFd<'_>) -> Turn {
        if self.max == 0 {
            return Turn::Block;
        }
        let mut t = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let window = t.windows.current();
            if t.ended || !t.windows.any_open() {
                if t.reader != 0 {
                    t.reader = 0;
                    self.waiting.notify_all();
                }
                return Turn::Block;
            }
            if t.reader == 0 || t.reader == me {
                t.reader = me;
                t.busy_since = None;
                t.asleep = false;
                let until = self
                    .free_since
                    .load(Ordering::Relaxed)
                    .saturating_add(window);
                if self.now() < until {
                    drop(t);
                    let caught = self.poll(fd, until);
                    let counter = if caught { &self.hits } else { &self.misses };
                    counter.fetch_add(1, Ordering::Relaxed);
                    t = self.turns.lock().unwrap_or_else(|e| e.into_inner());
                    if t.reader != me {
                        continue;
                    }
                    if caught {
                        t.busy_since = Some(Instant::now());
                        // A watcher waiting for an asleep reader times this one from now.
                        if t.watcher_idle {
                            self.waiting.notify_all();
                        }
                        return Turn::Caught;
                    }
                }
                t.asleep = true;
                return Turn::Block;
            }
            t = self.wait_for_reader(t, me);
        }
    }

    /// Waits while another thread reads; the first to wait also times it, and takes its place
    /// when it has been on one request for longer than [`HANDOFF`]. While the reader sleeps in
    /// `read` there is nothing to time: the watcher waits for it to wake.
    fn wait_for_reader<'a>(
        &self,
        mut t: std::sync::MutexGuard<'a, Turns>,
        me: u64,
    ) -> std::sync::MutexGuard<'a, Turns> {
        if t.watched {
            return self.waiting.wait(t).unwrap_or_else(|e| e.into_inner());
        }
        t.watched = true;
        if t.asleep {
            t.watcher_idle = true;
            t = self.waiting.wait(t).unwrap_or_else(|e| e.into_inner());
            t.watcher_idle = false;
        } else {
            t = self
                .waiting
                .wait_timeout(t, HANDOFF)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        t.watched = false;
        if t.reader != 0 && t.busy_since.is_some_and(|since| since.elapsed() >= HANDOFF) {
            t.reader = me;
            t.busy_since = None;
            t.asleep = false;
            // Another waiting thread times the new reader.
            self.waiting.notify_all();
        }
        t
    }

    /// Polls `fd` until a request is there (true) or `until` (ns since `epoch`) has passed.
    fn poll(&self, fd: BorrowedFd<'_>, until: u64) -> bool {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let until = self.epoch + Duration::from_nanos(until);
        // SAFETY: one valid pollfd, no timeout.
        roar_spin::poll(until, || {
            (unsafe { libc::poll(&mut pfd, 1, 0) } != 0).then_some(())
        })
        .is_some()
    }

    /// The session ended (or this thread's loop did): nobody waits for a reader any more.
    pub(crate) fn end(&self) {
        let mut t = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        t.ended = true;
        t.reader = 0;
        self.waiting.notify_all();
    }

    /// Thread `me` read a request: adapts the window for what comes after the last request
    /// served to how long the session waited for this one.
    pub(crate) fn arrived(&self, me: u64) {
        if self.max == 0 {
            return;
        }
        let waited = self
            .now()
            .saturating_sub(self.free_since.load(Ordering::Relaxed));
        let mut t = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        t.windows.waited(waited);
        if t.reader == me {
            t.busy_since = Some(Instant::now());
            t.asleep = false;
            if t.watcher_idle {
                self.waiting.notify_all();
            }
        }
    }

    /// Thread `me` served a request of opcode `op`: the session is free from now.
    pub(crate) fn served(&self, me: u64, op: u32) {
        if self.max == 0 {
            return;
        }
        self.free_since.store(self.now(), Ordering::Relaxed);
        let mut t = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        t.windows.after(op as usize);
        if t.reader == me {
            t.busy_since = None;
        }
    }

    pub(crate) fn stats(&self) -> SpinStats {
        SpinStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: u32 = 14;

    fn window(spin: &Spin) -> u64 {
        spin.turns.lock().unwrap().windows.current()
    }

    /// Opens the window for what follows an OPEN (the kind the tests serve).
    fn open_window(spin: &Spin, ns: u64) {
        let mut t = spin.turns.lock().unwrap();
        t.windows.after(OPEN as usize);
        t.windows.set(ns);
    }

    #[test]
    fn without_a_maximum_nothing_is_polled() {
        let spin = Spin::new(None);
        spin.served(1, OPEN);
        spin.arrived(1);
        assert_eq!(window(&spin), 0);
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let t = Instant::now();
        assert_eq!(spin.turn(1, std::os::fd::AsFd::as_fd(&a)), Turn::Block);
        assert!(t.elapsed() < Duration::from_millis(5));
        assert_eq!(spin.stats(), SpinStats::default());
    }

    #[test]
    fn a_request_already_there_is_caught_and_a_quiet_device_lets_the_window_run_out() {
        use std::io::Write;
        let spin = Spin::new(Some(Duration::from_millis(2)));
        open_window(&spin, 1_000_000);
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let me = spin.thread();
        spin.served(me, OPEN);
        let t = Instant::now();
        assert_eq!(spin.turn(me, std::os::fd::AsFd::as_fd(&a)), Turn::Block);
        assert!(
            t.elapsed() >= Duration::from_micros(900),
            "polled its window"
        );
        b.write_all(b"x").unwrap();
        spin.served(me, OPEN);
        assert_eq!(spin.turn(me, std::os::fd::AsFd::as_fd(&a)), Turn::Caught);
        assert_eq!(spin.stats(), SpinStats { hits: 1, misses: 1 });
    }

    #[test]
    fn others_wait_while_one_reads_and_take_over_from_a_reader_stuck_on_a_slow_request() {
        use std::io::Write;
        let spin = std::sync::Arc::new(Spin::new(Some(Duration::from_secs(10))));
        open_window(&spin, 5_000_000_000);
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = std::sync::Arc::new(a);
        b.write_all(b"x").unwrap();
        let first = spin.thread();
        spin.served(first, OPEN);
        // The first thread catches the request and stays on it (a slow request).
        assert_eq!(
            spin.turn(first, std::os::fd::AsFd::as_fd(&*a)),
            Turn::Caught
        );
        let (spin2, a2) = (spin.clone(), a.clone());
        let second = std::thread::spawn(move || {
            let me = spin2.thread();
            let t = Instant::now();
            let turn = spin2.turn(me, std::os::fd::AsFd::as_fd(&*a2));
            (me, turn, t.elapsed())
        });
        let (second, turn, waited) = second.join().unwrap();
        assert_eq!(
            turn,
            Turn::Caught,
            "took over the poll, the request still there"
        );
        assert!(waited >= HANDOFF, "waited for the reader first: {waited:?}");
        // The new reader served it quickly; the first thread, done, waits behind it (past
        // HANDOFF: nothing to take over), until the end releases it.
        spin.served(second, OPEN);
        let (spin3, a3) = (spin.clone(), a.clone());
        let back = std::thread::spawn(move || spin3.turn(first, std::os::fd::AsFd::as_fd(&*a3)));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!back.is_finished(), "waits while another reads");
        spin.end();
        assert_eq!(back.join().unwrap(), Turn::Block);
    }

    #[test]
    fn a_reader_that_took_over_and_is_stuck_too_is_taken_over_in_turn() {
        use std::io::Write;
        let spin = std::sync::Arc::new(Spin::new(Some(Duration::from_secs(10))));
        open_window(&spin, 5_000_000_000);
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = std::sync::Arc::new(a);
        b.write_all(b"x").unwrap();
        let first = spin.thread();
        spin.served(first, OPEN);
        assert_eq!(
            spin.turn(first, std::os::fd::AsFd::as_fd(&*a)),
            Turn::Caught
        );
        // Two threads wait; each becomes the reader in turn and never finishes its request.
        let (done, finished) = std::sync::mpsc::channel();
        for _ in 0..2 {
            let (spin, a, done) = (spin.clone(), a.clone(), done.clone());
            std::thread::spawn(move || {
                let me = spin.thread();
                done.send(spin.turn(me, std::os::fd::AsFd::as_fd(&*a)))
                    .unwrap();
            });
        }
        for _ in 0..2 {
            let turn = finished.recv_timeout(Duration::from_secs(5));
            assert_eq!(turn, Ok(Turn::Caught), "each stuck reader is replaced");
        }
    }

    #[test]
    fn a_reader_asleep_in_read_keeps_the_others_waiting_until_the_window_closes() {
        let spin = std::sync::Arc::new(Spin::new(Some(Duration::from_micros(100))));
        open_window(&spin, 50_000);
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = std::sync::Arc::new(a);
        let reader = spin.thread();
        spin.served(reader, OPEN);
        // Nothing comes: the reader's window passes and it goes to sleep in read.
        assert_eq!(
            spin.turn(reader, std::os::fd::AsFd::as_fd(&*a)),
            Turn::Block
        );
        let (spin2, a2) = (spin.clone(), a.clone());
        let other = std::thread::spawn(move || {
            let me = spin2.thread();
            spin2.turn(me, std::os::fd::AsFd::as_fd(&*a2))
        });
        std::thread::sleep(Duration::from_millis(10));
        assert!(!other.is_finished(), "not in read beside the reader");
        // A request after a long gap closes the window; the reader, done, lets everyone read.
        spin.free_since.store(0, Ordering::Relaxed);
        open_window(&spin, roar_spin::START);
        std::thread::sleep(Duration::from_millis(1));
        spin.arrived(reader);
        assert_eq!(window(&spin), 0);
        spin.served(reader, OPEN);
        assert_eq!(
            spin.turn(reader, std::os::fd::AsFd::as_fd(&*a)),
            Turn::Block
        );
        assert_eq!(other.join().unwrap(), Turn::Block);
    }
}
