//! Content generations: when a hash taken while a file was written may name the version it left.
//!
//! Every change an observer sees to a file (a write through any handle, a truncate by path or by
//! handle, an `O_TRUNC` open, an fallocate, a copy into it, a writer whose writes it cannot see)
//! moves the file's generation on by one ([`Generations::change`]). A [`Stream`] hashes the bytes
//! written through one handle while they come sequentially from offset 0; it names the file's
//! content only if every change since it began was one of its own writes — the generation it
//! last moved is still the file's — and it covered the whole file. Anything else (another
//! handle's write, a truncate by path, an mmap write landing elsewhere, another job's write) leaves
//! the stream's hash unused: the version is then hashed from the file itself, or left unknown.
//! Never a hash of bytes that were not the file's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::HashMap;

/// Each file's generation, by an identity the observer chooses (the mount's inode number).
#[derive(Debug, Default)]
pub struct Generations {
    by_file: Mutex<HashMap<u64, u64>>,
    /// Source of fresh generations: a file forgotten and seen again never reuses a number.
    next: AtomicU64,
    /// Per file, held while a version is settled ([`Generations::settle`]) or ended by a change
    /// ([`Generations::change_ending`]): one at a time.
    settling: Mutex<HashMap<u64, Arc<Mutex<()>>>>,
}

/// A change to a file, as [`Generations::change`] numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    /// The file's generation just before the change.
    pub before: u64,
    /// Its generation once changed.
    pub after: u64,
}

impl Generations {
    pub fn new() -> Generations {
        Generations {
            by_file: Mutex::new(HashMap::default()),
            next: AtomicU64::new(1),
            settling: Mutex::new(HashMap::default()),
        }
    }

    /// Runs `f` while no change to `file` can be counted: a version settled in it (hashed,
    /// copied and checked against the generation) is the file's content throughout.
    pub fn settle<T>(&self, file: u64, f: impl FnOnce() -> T) -> T {
        let lock = self
            .settling
            .lock()
            .expect("settling lock")
            .entry(file)
            .or_default()
            .clone();
        let r = {
            let _held = lock.lock().expect("settle lock");
            f()
        };
        let mut settling = self.settling.lock().expect("settling lock");
        // Nobody else holds or waits for it (the map's reference and ours): it can go.
        if Arc::strong_count(&lock) == 2 {
            settling.remove(&file);
        }
        r
    }

    /// Counts a change to `file` about to be made, once `end` has ended the versions other
    /// writers left in it (it runs with the file's generation, settled: nothing else changes
    /// the file or settles a version in it meanwhile).
    pub fn change_ending(&self, file: u64, end: impl FnOnce(u64)) -> Change {
        self.settle(file, || {
            end(self.now(file));
            self.change(file)
        })
    }

    /// The generation of `file` now.
    pub fn now(&self, file: u64) -> u64 {
        let mut map = self.by_file.lock().expect("generations lock");
        *map.entry(file)
            .or_insert_with(|| self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Records a change to `file` (call it before the change is made, so that a stream that
    /// reads the generation after the change cannot miss it).
    pub fn change(&self, file: u64) -> Change {
        let fresh = self.next.fetch_add(1, Ordering::Relaxed);
        let mut map = self.by_file.lock().expect("generations lock");
        let before = *map.entry(file).or_insert(fresh);
        let after = self.next.fetch_add(1, Ordering::Relaxed);
        map.insert(file, after);
        Change { before, after }
    }

    /// `file` is gone (its last name and handle): its number may be another file's next.
    pub fn forget(&self, file: u64) {
        self.by_file.lock().expect("generations lock").remove(&file);
    }
}

/// The hash of what one handle wrote, while it may still be the file's content.
#[derive(Debug)]
pub struct Stream {
    hasher: blake3::Hasher,
    /// Bytes hashed: the offset the next write must start at.
    next: u64,
    /// The file's generation after this stream's last change; `None` once the stream is broken.
    seen: Option<u64>,
}

impl Stream {
    /// A stream over a file that is empty at generation `now` (created, or truncated by the open
    /// that made the handle: that change must be counted before `now` is read).
    pub fn begin(now: u64) -> Stream {
        Stream {
            hasher: blake3::Hasher::new(),
            next: 0,
            seen: Some(now),
        }
    }

    /// A write of `data` at `offset` through this stream's handle, numbered `change`. The stream
    /// goes on only if nothing else changed the file since its last write and the bytes land
    /// where it left off.
    pub fn write(&mut self, offset: u64, data: &[u8], change: Change) {
        match self.seen {
            Some(seen) if seen == change.before && offset == self.next => {
                self.hasher.update(data);
                self.next += data.len() as u64;
                self.seen = Some(change.after);
            }
            _ => self.seen = None,
        }
    }

    /// A change through this stream's handle that is not a write it can follow (a truncate to
    /// its own length keeps it, anything else breaks it).
    pub fn resized(&mut self, size: u64, change: Change) {
        match self.seen {
            Some(seen) if seen == change.before && size == self.next => {
                self.seen = Some(change.after)
            }
            _ => self.seen = None,
        }
    }

    /// Whether the stream still follows the file.
    pub fn intact(&self) -> bool {
        self.seen.is_some()
    }

    /// The version this stream's handle left at its last change, with that change's generation:
    /// while the stream is intact, its hash is the whole file's content at that generation,
    /// whatever changed the file after it. What [`Stream::finish`] gives once the file is known
    /// to be still at that generation; what a version ends with when another writer is about to
    /// change the file (the mount seals it then, [`Generations::change`] not yet called).
    pub fn version(&self) -> Option<(u64, roar_store::ContentHash)> {
        self.seen.map(|seen| {
            (
                seen,
                roar_store::ContentHash {
                    blake3: self.hasher.finalize().to_hex().to_string(),
                    sha256: None,
                    size: self.next,
                },
            )
        })
    }

    /// The file's content as the stream saw it: only if the file is still at the generation of
    /// the stream's last change (`now`) and `size` bytes long, exactly what was hashed.
    pub fn finish(self, now: u64, size: u64) -> Option<roar_store::ContentHash> {
        self.version()
            .filter(|(seen, v)| *seen == now && v.size == size)
            .map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b3(data: &[u8]) -> String {
        blake3::hash(data).to_hex().to_string()
    }

    #[test]
    fn a_sequential_stream_names_the_content_it_wrote() {
        let g = Generations::new();
        let mut s = Stream::begin(g.change(7).after);
        s.write(0, b"hello ", g.change(7));
        s.write(6, b"world", g.change(7));
        let h = s.finish(g.now(7), 11).expect("intact");
        assert_eq!(h.blake3, b3(b"hello world"));
    }

    #[test]
    fn a_write_through_another_handle_leaves_the_stream_unused() {
        // The repro: 1000 bytes through one handle, one byte at 5 through another.
        let g = Generations::new();
        let mut s = Stream::begin(g.change(1).after);
        s.write(0, &[b'A'; 1000], g.change(1));
        g.change(1); // pwrite(g, "B", 5) through a second handle
        assert_eq!(s.finish(g.now(1), 1000), None);
    }

    #[test]
    fn a_change_racing_a_write_breaks_the_stream_whichever_comes_first() {
        let g = Generations::new();
        let mut s = Stream::begin(g.change(1).after);
        let mine = g.change(1);
        let other = g.change(1);
        s.write(0, b"x", mine);
        assert_eq!(s.finish(g.now(1), 1), None, "another change after mine");
        let mut s = Stream::begin(g.change(2).after);
        g.change(2);
        s.write(0, b"x", g.change(2));
        assert!(!s.intact(), "another change before mine");
        let _ = other;
    }

    #[test]
    fn out_of_order_writes_and_truncates_break_the_stream() {
        let g = Generations::new();
        let mut s = Stream::begin(g.change(1).after);
        s.write(0, b"abc", g.change(1));
        s.write(1, b"B", g.change(1)); // an mmap write landing inside what was written
        assert!(!s.intact());
        let mut s = Stream::begin(g.change(2).after);
        s.write(0, b"abc", g.change(2));
        s.resized(3, g.change(2)); // ftruncate to its own length keeps it
        assert!(s.intact());
        s.resized(1, g.change(2));
        assert!(!s.intact());
    }

    #[test]
    fn the_version_a_stream_left_stays_known_after_another_writer_changes_the_file() {
        let g = Generations::new();
        let mut s = Stream::begin(g.change(1).after);
        s.write(0, b"one\n", g.change(1));
        let (at, left) = s.version().expect("intact");
        assert_eq!(
            (at, left.blake3.as_str()),
            (g.now(1), b3(b"one\n").as_str())
        );
        g.change(1); // another job's O_TRUNC open
        assert_eq!(s.version().map(|(_, v)| v.blake3), Some(b3(b"one\n")));
        assert_eq!(s.finish(g.now(1), 0), None, "no longer the file's content");
        let mut s = Stream::begin(g.change(2).after);
        s.write(3, b"x", g.change(2));
        assert_eq!(
            s.version(),
            None,
            "a broken stream left no version it knows"
        );
    }

    #[test]
    fn a_change_waits_for_a_version_being_settled() {
        let g = Arc::new(Generations::new());
        let mut s = Stream::begin(g.change(1).after);
        s.write(0, b"one", g.change(1));
        let (tx, rx) = std::sync::mpsc::channel();
        let settled = std::thread::scope(|scope| {
            let settler = scope.spawn(|| {
                g.settle(1, || {
                    tx.send(()).unwrap();
                    let now = g.now(1);
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    // Copied in the meantime: the generation must not have moved.
                    g.now(1) == now
                })
            });
            rx.recv().unwrap();
            g.change_ending(1, |_| {});
            settler.join().unwrap()
        });
        assert!(settled, "a change was counted while a version was settled");
        assert!(g.settling.lock().unwrap().is_empty(), "nothing left held");
    }

    #[test]
    fn a_stream_shorter_than_the_file_is_not_its_content() {
        let g = Generations::new();
        let mut s = Stream::begin(g.change(1).after);
        s.write(0, b"abc", g.change(1));
        assert_eq!(s.finish(g.now(1), 10), None);
    }

    #[test]
    fn a_forgotten_file_seen_again_gets_a_generation_no_stream_knows() {
        let g = Generations::new();
        let mut s = Stream::begin(g.change(1).after);
        s.write(0, b"abc", g.change(1));
        g.forget(1);
        assert_eq!(s.finish(g.now(1), 3), None);
    }
}
