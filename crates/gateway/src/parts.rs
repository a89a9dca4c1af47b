//! A multipart object's blake3 from its parts, without reading the object back.
//!
//! BLAKE3 is a tree hash: an object whose parts are complete subtrees of its tree can be hashed
//! part by part and the parts' chaining values merged (`blake3::hazmat`). That holds when every
//! part but the last has the same size S, S is a power of two multiple of the 1 KiB chunk (the
//! aws CLI's and boto3's 8 MiB default qualifies), and the last is no longer than S. A part can
//! only be hashed as a subtree if its offset in the object is known when its first byte arrives:
//! part 1 is at 0; part n at (n-1)·S once S is known (from part n itself, when its size is a
//! power-of-two multiple of the chunk, or from another part of the upload seen before). At
//! completion the assumed offsets are checked against the parts the client listed; any
//! mismatch (odd sizes, gaps in the numbering, a re-uploaded part) gives `None`, and the caller
//! reads the object back instead.

use std::collections::HashMap;
use std::sync::Mutex;

use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};

use crate::body::Summarize;

/// One part hashed as the subtree at `offset` of its object.
#[derive(Debug, Clone)]
pub(crate) struct PartHash {
    pub offset: u64,
    pub size: u64,
    pub cv: ChainingValue,
    /// The part's own blake3 when it starts the object (a one-part object's hash).
    pub root: Option<String>,
}

/// Hashes a part at a given offset. A part longer than the largest subtree that can start at its
/// offset is no subtree: it is then not hashed further (blake3 would panic) and gives `None`.
pub(crate) struct PartHasher {
    hasher: blake3::Hasher,
    offset: u64,
    /// Bytes the subtree at `offset` may hold (None: any number, at offset 0).
    room: Option<u64>,
    fits: bool,
}

impl PartHasher {
    pub(crate) fn at(offset: u64) -> PartHasher {
        let mut hasher = blake3::Hasher::new();
        // Offsets come from part numbers times a power-of-two multiple of the chunk length.
        let aligned = offset.is_multiple_of(CHUNK);
        if aligned {
            hasher.set_input_offset(offset);
        }
        PartHasher {
            hasher,
            offset,
            room: blake3::hazmat::max_subtree_len(offset),
            fits: aligned,
        }
    }
}

impl Summarize for PartHasher {
    type Out = PartHash;

    fn update(&mut self, chunk: &[u8]) {
        if !self.fits {
            return;
        }
        if let Some(room) = &mut self.room {
            let n = chunk.len() as u64;
            if n > *room {
                self.fits = false;
                return;
            }
            *room -= n;
        }
        self.hasher.update(chunk);
    }

    fn finish(&mut self, size: u64) -> Option<PartHash> {
        // An empty subtree is never valid.
        if size == 0 || !self.fits {
            return None;
        }
        Some(PartHash {
            offset: self.offset,
            size,
            cv: self.hasher.finalize_non_root(),
            root: (self.offset == 0).then(|| self.hasher.finalize().to_hex().to_string()),
        })
    }
}

const CHUNK: u64 = blake3::CHUNK_LEN as u64;

/// Whether a part of `size` bytes can be the common part size S.
fn tree_aligned(size: u64) -> bool {
    size >= CHUNK && size.is_power_of_two()
}

/// (blake3 hex, size) of the object made of `parts` in order, if they form its tree.
pub(crate) fn combine(parts: &[PartHash]) -> Option<(String, u64)> {
    let first = parts.first()?;
    let total: u64 = parts.iter().map(|p| p.size).sum();
    if parts.len() == 1 {
        return Some((first.root.clone()?, total));
    }
    let s = first.size;
    if !tree_aligned(s) {
        return None;
    }
    let (last, full) = parts.split_last()?;
    if full.iter().any(|p| p.size != s) || last.size > s {
        return None;
    }
    if parts
        .iter()
        .enumerate()
        .any(|(i, p)| p.offset != i as u64 * s)
    {
        return None;
    }
    let split = parts_left(total, s);
    let left = merge(&parts[..split], s);
    let right = merge(&parts[split..], s);
    Some((
        merge_subtrees_root(&left, &right, Mode::Hash)
            .to_hex()
            .to_string(),
        total,
    ))
}

/// How many parts of size `s` the left subtree of `len` bytes holds.
fn parts_left(len: u64, s: u64) -> usize {
    // len > s here, so the split is a power of two >= s: a whole number of parts.
    (left_subtree_len(len) / s) as usize
}

/// The non-root chaining value of consecutive parts (each a subtree of `s` bytes but the last).
fn merge(parts: &[PartHash], s: u64) -> ChainingValue {
    if parts.len() == 1 {
        return parts[0].cv;
    }
    let len: u64 = parts.iter().map(|p| p.size).sum();
    let split = parts_left(len, s);
    merge_subtrees_non_root(
        &merge(&parts[..split], s),
        &merge(&parts[split..], s),
        Mode::Hash,
    )
}

/// What the recorder knows of the uploads in progress: the part size S once seen, the parts seen
/// with a size that cannot be S (only the last part may), and each part's subtree hash by part
/// number (with the ETag it was answered with).
#[derive(Default)]
pub(crate) struct Uploads {
    inner: Mutex<HashMap<String, Upload>>,
    /// Wakes parts waiting to learn S whenever a part of any upload starts.
    started: tokio::sync::Notify,
}

#[derive(Default)]
struct Upload {
    part_size: Option<u64>,
    odd: Vec<i32>,
    parts: HashMap<i32, (PartHash, Option<String>)>,
}

/// Uploads never completed nor aborted are forgotten past this many.
const MAX_UPLOADS: usize = 10_000;

/// How long a part whose offset depends on a part size not seen yet waits for another part of
/// its upload to start (clients upload parts concurrently: the last, short part often starts
/// first).
const WAIT_FOR_PART_SIZE: std::time::Duration = std::time::Duration::from_millis(500);

enum Offset {
    Known(u64),
    Unknown,
    Never,
}

impl Uploads {
    /// Where part `number` of `len` bytes (if known) starts in its object, if that can be known
    /// before its bytes arrive; waits (briefly) for another part to tell the part size.
    pub(crate) async fn offset(
        &self,
        upload_id: &str,
        number: i32,
        len: Option<u64>,
    ) -> Option<u64> {
        let deadline = tokio::time::Instant::now() + WAIT_FOR_PART_SIZE;
        let mut first = true;
        loop {
            let started = self.started.notified();
            tokio::pin!(started);
            started.as_mut().enable();
            match self.try_offset(upload_id, number, len, first) {
                Offset::Known(o) => return Some(o),
                Offset::Never => return None,
                Offset::Unknown => {}
            }
            first = false;
            if tokio::time::timeout_at(deadline, started).await.is_err() {
                return None;
            }
        }
    }

    fn try_offset(&self, upload_id: &str, number: i32, len: Option<u64>, first: bool) -> Offset {
        let mut all = self.inner.lock().unwrap();
        if all.len() >= MAX_UPLOADS && !all.contains_key(upload_id) {
            all.clear();
        }
        let up = all.entry(upload_id.to_owned()).or_default();
        if first {
            match len {
                Some(n) if tree_aligned(n) => {
                    up.part_size.get_or_insert(n);
                }
                _ => up.odd.push(number),
            }
            self.started.notify_waiters();
        }
        let Some(index) = u64::try_from(number).ok().and_then(|n| n.checked_sub(1)) else {
            return Offset::Never;
        };
        if index == 0 {
            return Offset::Known(0);
        }
        // Two parts that cannot be S: they cannot both be the last.
        if up.odd.iter().any(|&n| n != up.odd[0]) {
            return Offset::Never;
        }
        match up.part_size {
            Some(s) => index.checked_mul(s).map_or(Offset::Never, Offset::Known),
            None => Offset::Unknown,
        }
    }

    pub(crate) fn done(&self, upload_id: &str, number: i32, part: PartHash, etag: Option<String>) {
        let mut all = self.inner.lock().unwrap();
        all.entry(upload_id.to_owned())
            .or_default()
            .parts
            .insert(number, (part, etag));
    }

    /// Ends an upload; the parts the client listed (number, ETag), in order, as hashed.
    pub(crate) fn finish(
        &self,
        upload_id: &str,
        listed: &[(i32, Option<String>)],
    ) -> Option<Vec<PartHash>> {
        let up = self.inner.lock().unwrap().remove(upload_id)?;
        listed
            .iter()
            .map(|(n, etag)| {
                let (hash, seen) = up.parts.get(n)?;
                let same = match (etag, seen) {
                    (Some(a), Some(b)) => a.trim_matches('"') == b.trim_matches('"'),
                    _ => false,
                };
                same.then(|| hash.clone())
            })
            .collect()
    }

    pub(crate) fn forget(&self, upload_id: &str) {
        self.inner.lock().unwrap().remove(upload_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn hashed(object: &[u8], s: usize) -> Vec<PartHash> {
        object
            .chunks(s)
            .enumerate()
            .filter_map(|(i, part)| {
                let mut h = PartHasher::at((i * s) as u64);
                h.update(part);
                h.finish(part.len() as u64)
            })
            .collect()
    }

    #[test]
    fn merged_parts_give_the_objects_blake3() {
        let k = 1024;
        for (len, s) in [
            (8 * k, k),
            (8 * k + 1, k),
            (5 * k + 7, 2 * k),
            (3 * 8192 * k + 12345, 8192 * k),
            (2 * 16384 * k, 16384 * k),
            (16 * k, 16 * k),
            (9 * 4 * k - 1, 4 * k),
            (1, k),
            (2 * k + 1, k),
        ] {
            let object = data(len);
            let parts = hashed(&object, s);
            let (got, size) = combine(&parts).unwrap();
            assert_eq!(
                got,
                blake3::hash(&object).to_hex().to_string(),
                "len {len}, parts of {s}"
            );
            assert_eq!(size, len as u64);
        }
    }

    #[test]
    fn layouts_that_are_not_subtrees_are_refused() {
        let k = 1024;
        // Parts of 3 KiB are not a power of two; the ones past the first do not even fit the
        // subtree at their offset (hashing stops there instead of panicking).
        assert!(combine(&hashed(&data(10 * k), 3 * k)).is_none());
        let mut h = PartHasher::at(3 * k as u64);
        h.update(&data(3 * k));
        assert!(h.finish(3 * k as u64).is_none());
        // A middle part of another size.
        let object = data(6 * k);
        let mut parts = hashed(&object[..4 * k], 2 * k);
        let mut h = PartHasher::at(4 * k as u64);
        h.update(&object[4 * k..5 * k]);
        parts.push(h.finish(k as u64).unwrap());
        let mut h = PartHasher::at(5 * k as u64);
        h.update(&object[5 * k..]);
        parts.push(h.finish(k as u64).unwrap());
        assert!(combine(&parts).is_none());
        // A part hashed at the wrong offset (a gap in the numbering).
        let mut parts = hashed(&data(4 * k), 2 * k);
        parts[1].offset = 4 * k as u64;
        assert!(combine(&parts).is_none());
    }

    #[tokio::test]
    async fn offsets_wait_briefly_for_the_part_size() {
        let u = std::sync::Arc::new(Uploads::default());
        // The last part starts first: it learns S when part 1 starts.
        let waiting = {
            let u = std::sync::Arc::clone(&u);
            tokio::spawn(async move { u.offset("a", 3, Some(1000)).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(u.offset("a", 1, Some(8 << 20)).await, Some(0));
        assert_eq!(waiting.await.unwrap(), Some(16 << 20));
        assert_eq!(u.offset("a", 2, Some(8 << 20)).await, Some(8 << 20));
        // Nobody tells S: given up after the wait.
        assert_eq!(u.offset("b", 2, Some(1000)).await, None);
        // Two odd sizes: no wait at all.
        assert_eq!(u.offset("c", 1, Some(1001)).await, Some(0));
        assert_eq!(u.offset("c", 2, Some(1000)).await, None);
        assert_eq!(u.offset("d", 0, Some(8 << 20)).await, None);
    }
}
