//! Waiting for the next event without sleeping while events come faster than a wake-up costs
//! (issue 65; bench/NOTES.md, "Requests per operation and an adaptive poll").
//!
//! On a machine whose idle CPUs halt, a thread asleep until the next event (a FUSE request, a
//! ptrace stop) is woken by a cross-CPU wake-up of tens of microseconds. When events come close
//! together, the waiter looks for the next one for a short window before it sleeps, and one
//! that comes within the window costs no wake-up.
//!
//! The window adapts as KVM's halt-polling does, one window per kind of event that came last
//! (what follows differs by kind: an IOCTL follows an OPEN at once, while after a RELEASE a
//! program may compute for long). Measured from when the waiter was free, an event that came
//! after the window but within the maximum grows it (doubling, from [`START`]) — a longer
//! window would have caught it — and one that came after the maximum shrinks it by a quarter
//! (to nothing below [`START`]): polling there only burnt CPU. (KVM halves; a quarter keeps the
//! window over a burst's short gaps when each burst begins after a long one, as a program's
//! opens between computations do.) The poller yields the CPU after every look
//! (`sched_yield`), so a runnable thread on its CPU always goes first: polling never takes a
//! CPU from a job that needs it.

use std::time::{Duration, Instant};

/// The smallest window worth polling for, in ns.
pub const START: u64 = 10_000;

/// A window for each of `N` kinds of event.
#[derive(Debug, Clone)]
pub struct Windows<const N: usize> {
    /// In ns, by the kind of the event before the wait.
    by_kind: [u64; N],
    /// How many are open.
    open: u32,
    /// The kind of the last event.
    last: usize,
    /// The largest window, in ns.
    max: u64,
}

impl<const N: usize> Windows<N> {
    /// Every window closed, none ever above `max`.
    pub fn new(max: Duration) -> Self {
        Windows {
            by_kind: [0; N],
            open: 0,
            last: 0,
            max: u64::try_from(max.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// The window for what comes after the last event, in ns.
    pub fn current(&self) -> u64 {
        self.by_kind[self.last]
    }

    /// Whether any window is open: events of some kind come faster than the maximum.
    pub fn any_open(&self) -> bool {
        self.open > 0
    }

    /// The last event was of `kind` (kinds past `N` share the last window).
    pub fn after(&mut self, kind: usize) {
        self.last = kind.min(N - 1);
    }

    /// The next event came `waited` ns after the waiter was free: adapts the window for what
    /// comes after the last event's kind.
    pub fn waited(&mut self, waited: u64) {
        let window = next_window(self.current(), waited, self.max);
        self.set(window);
    }

    /// Sets the window for what comes after the last event's kind.
    pub fn set(&mut self, window: u64) {
        let old = std::mem::replace(&mut self.by_kind[self.last], window);
        match (old, window) {
            (0, 1..) => self.open += 1,
            (1.., 0) => self.open -= 1,
            _ => {}
        }
    }
}

/// The window after an event that came `waited` ns after the waiter was free.
pub fn next_window(window: u64, waited: u64, max: u64) -> u64 {
    if waited <= window {
        window
    } else if waited <= max {
        (window * 2).clamp(START, max)
    } else if window * 3 / 4 < START {
        0
    } else {
        window * 3 / 4
    }
}

/// Calls `ready` until it gives something or `until` has passed, yielding the CPU between
/// calls so that a runnable thread on this CPU goes first.
pub fn poll<T>(until: Instant, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
    loop {
        if let Some(got) = ready() {
            return Some(got);
        }
        if Instant::now() >= until {
            return None;
        }
        #[allow(unsafe_code)]
        // SAFETY: no arguments; gives a runnable thread on this CPU its turn.
        unsafe {
            libc::sched_yield()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_grows_while_events_come_fast_and_closes_when_they_stop() {
        let mut w = Windows::<4>::new(Duration::from_micros(50));
        let mut after = |waited: u64| {
            w.waited(waited);
            w.current()
        };
        assert_eq!(after(5_000), START, "an event within the maximum opens it");
        assert_eq!(after(15_000), 2 * START, "one after the window grows it");
        assert_eq!(after(15_000), 2 * START, "one within it leaves it");
        assert_eq!(after(30_000), 4 * START);
        assert_eq!(after(45_000), 50_000, "never past the maximum");
        assert_eq!(after(5_000_000), 37_500, "a long gap shrinks it");
        assert_eq!(after(5_000_000), 28_125);
        assert_eq!(after(20_000), 28_125, "a short gap within it leaves it");
        assert_eq!(after(5_000_000), 21_093);
        assert_eq!(after(5_000_000), 15_819);
        assert_eq!(after(5_000_000), 11_864);
        assert_eq!(after(5_000_000), 0, "and closes it below the start");
    }

    #[test]
    fn each_kind_of_event_has_its_window() {
        let mut w = Windows::<64>::new(Duration::from_micros(200));
        w.after(14);
        w.set(100_000);
        w.after(18);
        assert_eq!(
            w.current(),
            0,
            "what follows one kind is not what follows another"
        );
        assert!(w.any_open());
        w.set(50_000);
        w.set(60_000);
        assert_eq!(w.open, 2);
        w.after(14);
        w.set(0);
        assert_eq!(w.open, 1);
        w.after(1_000);
        assert_eq!(w.last, 63, "kinds past the last share its window");
    }

    #[test]
    fn polling_ends_with_what_came_or_when_the_window_passes() {
        let t = Instant::now();
        assert_eq!(poll(t + Duration::from_millis(2), || None::<()>), None);
        assert!(t.elapsed() >= Duration::from_millis(2));
        let mut n = 0;
        let got = poll(Instant::now() + Duration::from_secs(5), || {
            n += 1;
            (n == 3).then_some(n)
        });
        assert_eq!(got, Some(3));
    }
}
