//! Hashing a job's outputs while the job is still running.
//!
//! A file a job writes is usually finished long before the job ends (a checkpoint per epoch, one
//! table per pipeline step). Hashed only after the job exits, every byte of it lands on the user's
//! wait. The early hasher sees each event as the backend receives it ([`crate::Tap`]) and hashes
//! every written path once it has been left alone for the racy window, on one thread at nice 10
//! with one core, so it takes the CPU the job leaves idle.
//!
//! Nothing it finds is trusted on its own: after the job, [`crate::collect::hash`] keeps an early
//! hash only if the file still has exactly the identity (device, inode, size, mtime, ctime) it had
//! when hashed — one stat instead of a read — and reads the file again otherwise. Because only
//! files whose last change was older than the racy window are hashed, a later write cannot leave
//! that identity unchanged (the rule the hash cache follows). A wrong guess costs the read it was
//! meant to save, never a wrong hash.
#![allow(unsafe_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use roar_store::hash::{hash_if_settled_keeping, HashOptions, Hashed, Kind, Settled, RACY_NS};
use roar_store::now_ns;

use crate::event::Event;
use crate::ignore::Ignore;
use crate::Tap;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Early hashes by path.
pub type Early = HashMap<OsString, Hashed>;

/// Margin past the racy window before a path is first looked at: its writer is usually still
/// writing right after the open, and a look that finds the file too recent is a wasted open.
const SLACK_NS: i64 = 5_000_000;
/// Cap on how long a path that keeps changing waits between looks.
const MAX_WAIT_NS: i64 = 1_000_000_000;
/// A path written again after its early hash waits twice as long before the next one, up to this
/// many doublings: a log reopened for every line is not read again in full for every line.
const MAX_DOUBLINGS: u32 = 6;

enum Msg {
    Written {
        path: OsString,
        kind: Kind,
        ts_ns: i64,
    },
    Stop,
}

/// The hasher of one run. Its thread starts with the first written path: a run that writes
/// nothing (or nothing before it ends) never pays for starting and joining it.
pub struct EarlyHasher {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

enum State {
    /// Nothing written yet: what the worker will start with.
    Idle(Ignore, HashOptions, Option<KeepOutputs>),
    Running {
        tx: mpsc::Sender<Msg>,
        thread: JoinHandle<Early>,
    },
    /// The thread could not be started (said once, in the log); nothing is hashed early.
    Failed,
}

/// The path an event leaves with new content, if any. Every backend reports opens of regular
/// files only; what a rename or link moved is not known.
fn written(ev: &Event) -> Option<(&Path, Kind, i64)> {
    match ev {
        Event::Open {
            path, flags, ts_ns, ..
        } if flags & libc::O_ACCMODE != libc::O_RDONLY
            || flags & (libc::O_CREAT | libc::O_TRUNC) != 0 =>
        {
            Some((path, Kind::Regular, *ts_ns))
        }
        Event::Truncate { path, ts_ns, .. } => Some((path, Kind::Unknown, *ts_ns)),
        Event::Rename { to, ts_ns, .. } | Event::Link { to, ts_ns, .. } => {
            Some((to, Kind::Unknown, *ts_ns))
        }
        _ => None,
    }
}

/// Where outputs' versions are kept, but for the paths `ignore` names.
pub struct KeepOutputs {
    pub objects: roar_store::objects::Objects,
    pub ignore: Ignore,
}

fn spawn_worker(
    ignore: Ignore,
    opts: HashOptions,
    keep: Option<KeepOutputs>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<State> {
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("roar-early-hash".into())
        .spawn(move || {
            // SAFETY: lowers this thread's own priority; nothing else is touched.
            unsafe {
                let tid = libc::gettid() as libc::id_t;
                libc::setpriority(libc::PRIO_PROCESS, tid, 10);
            }
            Worker {
                ignore,
                opts,
                keep,
                stop,
                pending: HashMap::default(),
                due: BinaryHeap::new(),
                rounds: HashMap::default(),
                done: Early::default(),
            }
            .run(rx)
        })?;
    Ok(State::Running { tx, thread })
}

impl EarlyHasher {
    /// `keep`: the outputs' versions are kept as they are hashed (one read for both).
    pub fn new(ignore: Ignore, opts: HashOptions, keep: Option<KeepOutputs>) -> EarlyHasher {
        EarlyHasher {
            state: Arc::new(Mutex::new(State::Idle(ignore, opts, keep))),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// What the backend calls with each event as it arrives.
    pub fn tap(&self) -> Tap {
        let (state, stop) = (self.state.clone(), self.stop.clone());
        Arc::new(move |ev: &Event| {
            let Some((path, kind, ts_ns)) = written(ev) else {
                return;
            };
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            if let State::Idle(..) = &*state {
                let State::Idle(ignore, opts, keep) = std::mem::replace(&mut *state, State::Failed)
                else {
                    unreachable!("matched above")
                };
                match spawn_worker(ignore, opts, keep, stop.clone()) {
                    Ok(running) => *state = running,
                    Err(e) => tracing::warn!("no early hashing: cannot start its thread: {e}"),
                }
            }
            if let State::Running { tx, .. } = &*state {
                let path = path.as_os_str().to_owned();
                // The worker is gone only after `finish`, when no backend runs any more.
                let _ = tx.send(Msg::Written { path, kind, ts_ns });
            }
        })
    }

    /// Stops hashing (a file being read is finished) and returns what was hashed.
    pub fn finish(self) -> Early {
        self.stop.store(true, Ordering::Relaxed);
        let state = std::mem::replace(
            &mut *self.state.lock().unwrap_or_else(|p| p.into_inner()),
            State::Failed,
        );
        match state {
            State::Running { tx, thread } => {
                let _ = tx.send(Msg::Stop);
                thread.join().unwrap_or_default()
            }
            State::Idle(..) | State::Failed => Early::default(),
        }
    }
}

/// A written path waiting to be hashed: when it is next looked at, how long it waits after that
/// if it is still changing then, and whether it is known to be a regular file.
struct Pending {
    due_ns: i64,
    backoff_ns: i64,
    kind: Kind,
}

struct Worker {
    ignore: Ignore,
    opts: HashOptions,
    keep: Option<KeepOutputs>,
    stop: Arc<AtomicBool>,
    pending: HashMap<OsString, Pending>,
    /// (due, path); an entry whose due time no longer matches `pending` is stale and skipped.
    due: BinaryHeap<Reverse<(i64, OsString)>>,
    /// How many times each path was hashed early.
    rounds: HashMap<OsString, u32>,
    done: Early,
}

impl Worker {
    fn run(mut self, rx: mpsc::Receiver<Msg>) -> Early {
        loop {
            let msg = match self.due.peek() {
                None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                Some(Reverse((due, _))) => {
                    let wait = (*due - now_ns()).max(0) as u64;
                    rx.recv_timeout(Duration::from_nanos(wait))
                }
            };
            match msg {
                Ok(Msg::Written { path, kind, ts_ns }) => self.written(path, kind, ts_ns),
                Ok(Msg::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            while let Some(Reverse((due, _))) = self.due.peek() {
                if *due > now_ns() || self.stop.load(Ordering::Relaxed) {
                    break;
                }
                let Reverse((due, path)) = self.due.pop().expect("peeked");
                if self.pending.get(&path).is_some_and(|p| p.due_ns == due) {
                    self.look(path);
                }
            }
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
        }
        // An event showed new content since its early hash: that hash cannot stand, so the pass
        // after the job reads the file with the other new content rather than finding out by a
        // stat (inside the store's transaction, see `collect::hash`).
        for path in self.pending.keys() {
            self.done.remove(path);
        }
        self.done
    }

    /// Schedules the first look at a path the job just wrote: once the racy window has passed
    /// after this write, doubled for each early hash the path already had (see `MAX_DOUBLINGS`).
    fn written(&mut self, path: OsString, kind: Kind, ts_ns: i64) {
        if self.ignore.is_ignored(Path::new(&path)) {
            return;
        }
        let rounds = self.rounds.get(&path).copied().unwrap_or(0);
        let due_ns = ts_ns + (RACY_NS << rounds.min(MAX_DOUBLINGS)) + SLACK_NS;
        // The latest event says what is at the path now.
        self.schedule(path, due_ns, RACY_NS, kind);
    }

    fn schedule(&mut self, path: OsString, due_ns: i64, backoff_ns: i64, kind: Kind) {
        self.due.push(Reverse((due_ns, path.clone())));
        let pending = Pending {
            due_ns,
            backoff_ns,
            kind,
        };
        self.pending.insert(path, pending);
    }

    fn look(&mut self, path: OsString) {
        let kind = self.pending[&path].kind;
        let keep = self
            .keep
            .as_ref()
            .filter(|k| !k.ignore.is_ignored(Path::new(&path)))
            .map(|k| &k.objects);
        match hash_if_settled_keeping(Path::new(&path), kind, self.opts, keep) {
            Ok(Settled::Hashed(h)) => {
                self.pending.remove(&path);
                *self.rounds.entry(path.clone()).or_default() += 1;
                self.done.insert(path, h);
            }
            Ok(Settled::Recent(stat)) => {
                // Still being written: look again once its last change is out of the window,
                // backing off for a file that keeps changing.
                let now = now_ns();
                let backoff = self.pending[&path].backoff_ns;
                let settles = stat.mtime_ns.max(stat.ctime_ns) + RACY_NS + SLACK_NS;
                let next = (backoff * 2).min(MAX_WAIT_NS);
                self.schedule(path, settles.max(now + backoff), next, kind);
            }
            // Gone, renamed away, not a regular file, or changed during the read: the pass after
            // the job decides.
            Err(_) => {
                self.pending.remove(&path);
                self.done.remove(&path);
            }
        }
    }
}
