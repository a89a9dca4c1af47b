//! Which process forked which, as the kernel reported it (the proc connector's fork and exec
//! events). A process's parent in /proc is the one it has now: a daemon's double fork (fork,
//! `setsid`, fork again, the middle one exits) leaves the grandchild re-parented to init, with
//! nothing in /proc saying whose it was. SEMANTICS.md keeps a fork that did not exec in its
//! parent's job, so attribution asks here for the parent that forked it.
//!
//! Times are clock ticks of the start-time clock (`/proc/PID/stat` field 22), so a birth can be
//! matched to the process /proc shows now (a pid is reused only after its process is gone).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Births remembered at most: past this the oldest are forgotten all at once (and a process
/// forked before then is attributed by /proc alone, as without events).
const MAX_BIRTHS: usize = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Birth {
    /// The process (thread group) that forked it.
    pub parent: i32,
    /// When, in ticks.
    pub tick: i64,
    /// It exec'd a program since (it is no longer a copy of its parent).
    pub execd: bool,
}

/// What is known of one process's birth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Known {
    Born(Birth),
    /// Its fork event has not been read (the process started after events were complete): not
    /// yet, or never if the reader has drained the socket since the process ran.
    NotYet,
    /// It will never be known (it started before events were complete).
    Never,
}

#[derive(Debug, Default)]
pub(super) struct Births {
    by_pid: HashMap<i32, Birth>,
    /// Every fork since this tick is known (listening began, or events were lost or forgotten).
    /// None until events are read at all.
    complete_since: Option<i64>,
}

impl Births {
    /// Events are read from now (`tick`) on.
    pub fn listening(&mut self, tick: i64) {
        self.complete_since = Some(tick + 1);
    }

    /// Process `parent` forked process `child` at `tick`.
    pub fn forked(&mut self, parent: i32, child: i32, tick: i64) {
        if self.by_pid.len() >= MAX_BIRTHS {
            self.lost(tick);
        }
        self.by_pid.insert(
            child,
            Birth {
                parent,
                tick,
                execd: false,
            },
        );
    }

    /// Process `pid` exec'd a new program.
    pub fn execd(&mut self, pid: i32) {
        if let Some(b) = self.by_pid.get_mut(&pid) {
            b.execd = true;
        }
    }

    /// Events were lost (or forgotten) at `tick`: only forks after it are known.
    pub fn lost(&mut self, tick: i64) {
        self.by_pid.clear();
        self.complete_since = Some(tick + 1);
    }

    /// The birth of `pid`, which /proc shows started at `start`. Not yet known is all this can
    /// say of a fork not read: only the reader, having drained the socket after the process ran
    /// ([`Drains`]), knows it is never coming.
    pub fn of(&self, pid: i32, start: i64) -> Known {
        match self.by_pid.get(&pid) {
            // A fork's event is stamped as the fork ends, after the child's start time was taken:
            // in the same tick, or ticks later when the fork was preempted half-way (a loaded
            // machine; a window of one tick left such daemons out of their jobs). An entry
            // stamped before the start is an earlier process's that had this pid, gone before
            // this one was forked (one tick of slack for the two clocks' rounding: reusing a pid
            // takes a wrap of every pid, never done in 20 ms).
            Some(b) if b.tick + 1 >= start => Known::Born(*b),
            _ if self.complete_since.is_none_or(|since| start < since) => Known::Never,
            _ => Known::NotYet,
        }
    }

    /// The birth of a process gone now (`pid`, known to have started at or before `before`).
    pub fn of_gone(&self, pid: i32, before: i64) -> Option<Birth> {
        self.by_pid.get(&pid).copied().filter(|b| b.tick <= before)
    }
}

/// A waiter's question to the reader of events — "have you read everything the kernel sent
/// before now?" — and the reader's answer. A fork's event is queued before its child first
/// runs, so once the reader has drained the socket after a request arrived, a birth still not
/// known is never coming: a waiter learns it as soon as the reader catches up, not at a timeout.
#[derive(Debug, Default)]
pub(super) struct Drains {
    asked: AtomicU64,
    answered: AtomicU64,
}

impl Drains {
    /// A new question (after the request it is about arrived): its number.
    pub fn ask(&self) -> u64 {
        self.asked.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The reader, before a read that may find the socket empty: the questions it will answer.
    pub fn asked(&self) -> u64 {
        self.asked.load(Ordering::SeqCst)
    }

    /// The reader found the socket empty after reading the questions up to `asked`; every event
    /// read before is in [`Births`] already.
    pub fn drained(&self, asked: u64) {
        self.answered.fetch_max(asked, Ordering::SeqCst);
    }

    /// Whether question `ask` was answered.
    pub fn answers(&self, ask: u64) -> bool {
        self.answered.load(Ordering::SeqCst) >= ask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_is_answered_only_by_a_drain_that_began_after_it() {
        let d = Drains::default();
        let before = d.asked();
        let q = d.ask();
        assert!(!d.answers(q));
        // A drain that began before the question says nothing about it.
        d.drained(before);
        assert!(!d.answers(q));
        let q2 = d.ask();
        let began = d.asked();
        d.drained(began);
        assert!(d.answers(q) && d.answers(q2));
        // Answers never go back (a late reader of an older snapshot).
        d.drained(before);
        assert!(d.answers(q2));
    }

    #[test]
    fn a_birth_is_matched_to_the_process_of_its_tick() {
        let mut b = Births::default();
        assert_eq!(b.of(10, 100), Known::Never, "no events read at all");
        b.listening(50);
        assert_eq!(b.of(10, 40), Known::Never, "started before listening");
        assert_eq!(b.of(10, 100), Known::NotYet);
        b.forked(3, 10, 100);
        let born = Birth {
            parent: 3,
            tick: 100,
            execd: false,
        };
        assert_eq!(b.of(10, 100), Known::Born(born));
        // A later process with the same pid whose fork is not read yet: not known, however far
        // the reader has read (only a drain says never).
        assert_eq!(b.of(10, 200), Known::NotYet);
        b.forked(3, 11, 300);
        assert_eq!(b.of(10, 200), Known::NotYet);
        // A fork preempted half-way is stamped ticks after its child's start.
        b.forked(3, 12, 207);
        assert!(matches!(
            b.of(12, 200),
            Known::Born(Birth { parent: 3, .. })
        ));
        b.execd(10);
        assert!(matches!(
            b.of(10, 100),
            Known::Born(Birth { execd: true, .. })
        ));
        assert_eq!(b.of_gone(10, 99), None, "born after the descendant");
        assert!(b.of_gone(10, 100).is_some());
    }

    #[test]
    fn lost_events_forget_what_was_known() {
        let mut b = Births::default();
        b.listening(0);
        b.forked(3, 10, 100);
        b.lost(150);
        assert_eq!(b.of(10, 100), Known::Never);
        assert_eq!(b.of(11, 151), Known::NotYet);
    }
}
