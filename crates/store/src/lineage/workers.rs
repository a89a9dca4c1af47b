//! A lineage walk on more than one core. The walk goes level by level (the nodes the level
//! before points at: a run's ranks, the producers of their inputs), and a wide level's nodes are
//! read by several connections of the same store at once, each on a thread of its own with a
//! read transaction and a memo of its own. At a team store's scale a lineage has levels of 65
//! and 114 jobs, and reading their rows is nearly all of its time.
//!
//! Every connection must read the same snapshot, or a node could be read as it was before a
//! commit and its producer as it was after. A connection opened later sees the snapshot of its
//! first read, never an older one, so the walk notes the store's data version before its read
//! transaction begins and after it ends: unchanged, no commit came between any two snapshots
//! the connections read; changed (a writer committed during the walk), the walk is read again on
//! this connection alone.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A level this wide or wider is read by more than one connection: below it, opening another
/// connection (~0.3 ms) would cost more than it saves.
const PARALLEL_FROM: usize = 8;

/// At most this many more connections, whatever the cores (each holds a page cache).
const MAX_TWINS: usize = 3;

/// What a walk reads nodes with: the store's own connection and memo and, from the first wide
/// level, more connections with theirs.
pub(super) struct Readers<'s> {
    main: &'s Store,
    memo: Memo,
    /// Twins may be opened: the walk owns its read transaction and noted the data version.
    may_twin: bool,
    twins: Vec<(Store, Memo)>,
}

impl<'s> Readers<'s> {
    pub(super) fn new(main: &'s Store, outputs: Outputs, may_twin: bool) -> Readers<'s> {
        Readers {
            main,
            memo: Memo {
                outputs,
                ..Memo::default()
            },
            may_twin,
            twins: Vec::new(),
        }
    }

    /// Whether another connection read any node (the data version must then be checked).
    pub(super) fn used_twins(&self) -> bool {
        !self.twins.is_empty()
    }

    /// The nodes of one level, in its order.
    pub(super) fn nodes(&mut self, level: &[Node]) -> rusqlite::Result<Vec<Step>> {
        if self.may_twin && level.len() >= PARALLEL_FROM {
            self.may_twin = false;
            self.open_twins();
        }
        if self.twins.is_empty() {
            let (main, memo) = (self.main, &mut self.memo);
            return level.iter().map(|&n| main.node(n, memo)).collect();
        }
        let next = AtomicUsize::new(0);
        // Each worker takes the next node not yet taken: nodes differ in size (a dataset's
        // ingest writes 500 files, a rank reads a few).
        let work = |store: &Store, memo: &mut Memo| -> rusqlite::Result<Vec<(usize, Step)>> {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&node) = level.get(i) else {
                    return Ok(done);
                };
                done.push((i, store.node(node, memo)?));
            }
        };
        let (main, memo, twins) = (self.main, &mut self.memo, &mut self.twins);
        let results: Vec<rusqlite::Result<Vec<(usize, Step)>>> = std::thread::scope(|s| {
            let work = &work;
            let handles: Vec<_> = twins
                .iter_mut()
                .map(|(store, memo)| s.spawn(move || work(store, memo)))
                .collect();
            let mut results = vec![work(main, memo)];
            results.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a lineage reader panicked")),
            );
            results
        });
        let mut steps: Vec<Option<Step>> = (0..level.len()).map(|_| None).collect();
        for done in results {
            for (i, step) in done? {
                steps[i] = Some(step);
            }
        }
        Ok(steps
            .into_iter()
            .map(|s| s.expect("every node of the level read"))
            .collect())
    }

    /// Opens up to one connection per other core. One that cannot be opened (a read-only
    /// directory, no memory) leaves the walk to the connections it has.
    fn open_twins(&mut self) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        for _ in 1..cores.min(MAX_TWINS + 1) {
            match self.main.twin() {
                Some(store) => {
                    let memo = Memo {
                        outputs: self.memo.outputs,
                        ..Memo::default()
                    };
                    self.twins.push((store, memo));
                }
                None => break,
            }
        }
    }
}

impl Store {
    /// Another read connection to this store, hiding the same paths, in a read transaction of
    /// its own (its snapshot is taken at its first read).
    fn twin(&self) -> Option<Store> {
        let conn = crate::db::open_reader(&self.path).ok()?;
        let mut twin = Store {
            conn,
            path: self.path.clone(),
            noise: None,
        };
        twin.hide_shared(self.noise.clone()).ok()?;
        // Ended when the twin is dropped (a read transaction: nothing to keep).
        twin.conn.execute_batch("BEGIN").ok()?;
        Some(twin)
    }
}

/// The store's data version as this connection sees it: changed by any commit of another
/// connection since the last time it was asked (SQLite's `PRAGMA data_version`).
pub(super) fn data_version(conn: &rusqlite::Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get(0))
}
