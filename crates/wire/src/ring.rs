//! The shared-memory event ring between the shims of all traced processes (producers) and the
//! `roar run` that reads them (the one consumer).
//!
//! roar maps a memfd: a [`RingHeader`] page, then `capacity` bytes of slots. A producer reserves a
//! slot by advancing `head` with a compare-and-swap, marks it (its length and pid) with a second
//! compare-and-swap on the slot's first word, copies the event in and sets the committed bit; no
//! system call unless the ring is full. The consumer reads committed slots in reservation order
//! (one total order across processes), frees them and advances `tail`. A slot never wraps: a
//! producer whose slot would cross the end of the area reserves the rest of the area as padding too.
//!
//! A producer can be killed anywhere in that sequence (`kill -9`, a pool's SIGTERM, the OOM
//! killer), and nothing after its slot may be lost for it:
//! - killed after marking: the slot says who and how long; once that pid is gone (or the run is
//!   over) the consumer frees it and reads on.
//! - killed between reserving and marking: the slot's words are still *free words* (below). Once
//!   the run is over, or the tail has been stuck on them for long, the consumer takes the free
//!   words at the tail back, one compare-and-swap each, up to the next marked word: that is the
//!   dead slot (and any other slot not marked yet). A producer that was only slow, not dead, then
//!   fails to mark its slot and sends the event another way (the shim's datagram), so a wrong
//!   guess loses nothing. Producers touch the pages of a slot before reserving it, so the fault in
//!   which a signal is usually delivered comes before the reservation, not after it.
//!
//! Free words: every 8-byte word of unused slot space holds the lap (`position / capacity`) in
//! which it will next be used, in its high half, and zero in its low half; a marked slot word
//! always has a non-zero length there. Freed space is rewritten with the next lap, so a stale
//! producer's compare-and-swap can never succeed on a word from another lap. A fresh (zeroed)
//! mapping is lap 0 throughout.
//!
//! Waking the consumer: it does not poll. Between drains it sleeps on the futex word `wake` (in
//! this shared mapping) for up to a timer's length, after setting `asleep`. A producer that leaves
//! an eighth of the ring or more unread, or finds the ring full, and sees `asleep` set, clears it,
//! bumps `wake` and makes one FUTEX_WAKE: one system call per batch, none while roar is awake.
//!
//! Slot word (the first 8 bytes of a slot): bits 0..32 the slot length including the word (a
//! multiple of 8, so the low 3 bits carry the flags), bits 32..64 the producer's pid. Zero means
//! "not reserved yet" — or, once the run is over, that the producer died between reserving and
//! marking, which loses the rest of the ring (reported, never guessed at).
#![allow(unsafe_code)]

use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Environment variable telling the shim where the ring is: `<roar pid>/<fd>`; the shim opens
/// `/proc/<roar pid>/fd/<fd>`, which works even after the program closed every inherited fd.
pub const RING_ENV: &str = "ROAR_INTERNAL_RING";
pub const MAGIC: u64 = u64::from_le_bytes(*b"roarrng3");
/// Bytes before the slot area.
pub const HEADER_SIZE: usize = 4096;
/// The smallest slot area: an Exec event carries up to 32 KiB of argv and must fit twice.
pub const MIN_CAPACITY: u64 = 128 * 1024;

const COMMITTED: u64 = 1;
const PAD: u64 = 2;
const LEN_MASK: u64 = 0xffff_fff8;
/// Producers fault in a slot's pages in steps of this (the smallest page size).
const PAGE: u64 = 4096;

#[repr(C)]
pub struct RingHeader {
    pub magic: u64,
    /// Bytes in the slot area, a power of two.
    pub capacity: u64,
    /// The consumer: producers stop waiting for space once it is gone.
    pub owner_pid: i64,
    /// 1 while the consumer sleeps (or is about to) on `wake`.
    asleep: AtomicU32,
    /// The futex word the consumer sleeps on; bumped by whoever wakes it.
    wake: AtomicU32,
    _reserved: [u64; 4],
    /// Bytes reserved by producers since the start (never wraps in practice: 2^64).
    head: AtomicU64,
    _line2: [u64; 7],
    /// Bytes the consumer has released.
    tail: AtomicU64,
    _line3: [u64; 7],
}

const _: () = assert!(core::mem::size_of::<RingHeader>() <= HEADER_SIZE);

/// A mapped ring: `base` points at the header, followed by the slot area.
#[derive(Clone, Copy)]
pub struct Ring {
    hdr: *const RingHeader,
    data: *mut u8,
    capacity: u64,
}

// SAFETY: all shared state is reached through atomics; slot bytes are written only by the producer
// that reserved them and read only after their committed bit is seen with Acquire.
unsafe impl Send for Ring {}
// SAFETY: as for Send: shared use goes through the atomics, slots by the protocol above.
unsafe impl Sync for Ring {}

/// What the consumer finds at `tail`.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<'a> {
    /// Nothing reserved past the tail.
    Empty,
    /// A producer reserved the next slot and has not committed it yet (`pid` 0: not even marked;
    /// see [`Ring::skip_unmarked`]).
    Pending { pid: i32 },
    /// A committed event; pass `len` to [`Ring::release`] once done with `bytes`.
    Event { bytes: &'a [u8], len: u64 },
    /// Padding up to the end of the area; release it.
    Pad { len: u64 },
}

/// A slot a producer has reserved: `pad` bytes of padding at `pos`, then `need` bytes.
#[derive(Clone, Copy)]
struct Reserved {
    pos: u64,
    pad: u64,
    need: u64,
}

fn align8(n: u64) -> u64 {
    (n + 7) & !7
}

impl Ring {
    /// Initialises a freshly mapped, zeroed region of `HEADER_SIZE + capacity` bytes.
    ///
    /// # Safety
    /// `base` must point to such a writable mapping, 8-byte aligned, that outlives every use.
    pub unsafe fn create(base: *mut u8, capacity: u64, owner_pid: i64) -> Ring {
        debug_assert!(capacity.is_power_of_two() && capacity >= MIN_CAPACITY);
        let hdr = base as *mut RingHeader;
        // SAFETY: per the contract, the header fits and nobody else uses the region yet.
        unsafe {
            (*hdr).capacity = capacity;
            (*hdr).owner_pid = owner_pid;
            (*hdr).head.store(0, Ordering::Relaxed);
            (*hdr).tail.store(0, Ordering::Relaxed);
            core::ptr::write_volatile(core::ptr::addr_of_mut!((*hdr).magic), MAGIC);
        }
        Ring {
            hdr,
            data: base.wrapping_add(HEADER_SIZE),
            capacity,
        }
    }

    /// Checks a mapping made by [`Ring::create`] in another process; `len` is the mapping's size.
    ///
    /// # Safety
    /// `base` must point to a readable and writable mapping of `len` bytes, 8-byte aligned.
    pub unsafe fn attach(base: *mut u8, len: usize) -> Option<Ring> {
        if len < HEADER_SIZE {
            return None;
        }
        let hdr = base as *const RingHeader;
        // SAFETY: the header lies within the mapping.
        let (magic, capacity) = unsafe { ((*hdr).magic, (*hdr).capacity) };
        let fits = capacity.is_power_of_two()
            && capacity >= MIN_CAPACITY
            && HEADER_SIZE as u64 + capacity <= len as u64;
        (magic == MAGIC && fits).then(|| Ring {
            hdr,
            data: base.wrapping_add(HEADER_SIZE),
            capacity,
        })
    }

    pub fn owner_pid(&self) -> i64 {
        // SAFETY: the header is mapped for the ring's lifetime.
        unsafe { (*self.hdr).owner_pid }
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: as above.
        unsafe { &*self.hdr }
    }

    fn word(&self, offset: u64) -> &AtomicU64 {
        // SAFETY: offsets are multiples of 8 below capacity, inside the mapping.
        unsafe { &*(self.data.add(offset as usize) as *const AtomicU64) }
    }

    /// Producer: writes one event made of `parts`. `wait` is called while the ring is full and
    /// returns false to give up (the consumer is gone). Returns false if the event was not
    /// written: it does not fit in the ring at all, or `wait` gave up.
    pub fn write(&self, pid: i32, parts: &[&[u8]], wait: &mut dyn FnMut() -> bool) -> bool {
        let body: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let need = align8(8 + body);
        if need > self.capacity / 2 || need > LEN_MASK {
            return false;
        }
        match self.reserve(need, wait) {
            Some(slot) => self.fill(slot, pid, parts),
            None => false,
        }
    }

    /// Reserves `need` bytes (and the padding before them, if they would cross the end).
    fn reserve(&self, need: u64, wait: &mut dyn FnMut() -> bool) -> Option<Reserved> {
        let h = self.header();
        loop {
            let pos = h.head.load(Ordering::Relaxed);
            let off = pos & (self.capacity - 1);
            let to_end = self.capacity - off;
            let pad = if need > to_end { to_end } else { 0 };
            let total = pad + need;
            let tail = h.tail.load(Ordering::Acquire);
            if tail > pos {
                // `pos` is stale: other producers reserved, and roar read, past it since.
                continue;
            }
            if pos + total - tail > self.capacity {
                if !wait() {
                    return None;
                }
                continue;
            }
            self.touch(off, total);
            if h.head
                .compare_exchange_weak(pos, pos + total, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Some(Reserved { pos, pad, need });
            }
        }
    }

    /// Marks a reserved slot, copies the event in and commits it. False if the consumer took
    /// the slot back first (we were stopped for long between reserving and marking): the caller
    /// sends the event another way.
    fn fill(&self, slot: Reserved, pid: i32, parts: &[&[u8]]) -> bool {
        let Reserved { pos, pad, need } = slot;
        let pid_bits = (pid as u32 as u64) << 32;
        if pad > 0 && !self.mark(pos, pad | PAD | COMMITTED | pid_bits) {
            return false;
        }
        if !self.mark(pos + pad, need | pid_bits) {
            return false;
        }
        let off = (pos + pad) & (self.capacity - 1);
        let mut at = off as usize + 8;
        for p in parts {
            // SAFETY: the reserved slot [off, off + need) lies inside the area and is ours.
            unsafe { core::ptr::copy_nonoverlapping(p.as_ptr(), self.data.add(at), p.len()) };
            at += p.len();
        }
        self.word(off)
            .store(need | pid_bits | COMMITTED, Ordering::Release);
        true
    }

    /// The free word for position `pos` (see the module doc).
    fn free_word(&self, pos: u64) -> u64 {
        ((pos >> self.capacity.trailing_zeros()) as u32 as u64) << 32
    }

    /// Marks the slot at `pos` as ours: its word goes from free to `value`.
    fn mark(&self, pos: u64, value: u64) -> bool {
        self.word(pos & (self.capacity - 1))
            .compare_exchange(
                self.free_word(pos),
                value,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Faults in the pages of `len` bytes from `off` (wrapping at the end of the area).
    fn touch(&self, off: u64, len: u64) {
        let mut at = off & !(PAGE - 1);
        while at < off + len {
            // SAFETY: a read of a byte inside the area (`at` is taken modulo its size).
            unsafe { core::ptr::read_volatile(self.data.add((at & (self.capacity - 1)) as usize)) };
            at += PAGE;
        }
    }

    /// Writes the free words of the lap after `pos`'s over `len` bytes from `pos` (one lap).
    fn free(&self, pos: u64, len: u64) {
        let next = self.free_word(pos + self.capacity);
        let off = pos & (self.capacity - 1);
        for i in (0..len).step_by(8) {
            self.word(off + i).store(next, Ordering::Relaxed);
        }
    }

    /// Bytes reserved and not yet released.
    fn unread(&self) -> u64 {
        let h = self.header();
        h.head
            .load(Ordering::SeqCst)
            .saturating_sub(h.tail.load(Ordering::Acquire))
    }

    /// Producer, after a write (`full`: while waiting for space): whether the consumer must be
    /// woken now. If so the caller makes one FUTEX_WAKE on [`Ring::wake_word`].
    pub fn wake_needed(&self, full: bool) -> bool {
        let h = self.header();
        // Pairs with the consumer's store to `asleep` before it looks at the ring.
        fence(Ordering::SeqCst);
        if h.asleep.load(Ordering::Relaxed) == 0 || !(full || self.unread() >= self.capacity / 8) {
            return false;
        }
        if h.asleep.swap(0, Ordering::AcqRel) == 0 {
            return false; // another producer wakes it
        }
        h.wake.fetch_add(1, Ordering::Release);
        true
    }

    /// The futex word: FUTEX_WAKE it after [`Ring::wake_needed`], FUTEX_WAIT on it after
    /// [`Ring::sleep_begin`]. The mapping is shared between processes: not a private futex.
    pub fn wake_word(&self) -> *const u32 {
        self.header().wake.as_ptr()
    }

    /// Consumer: announces it is going to sleep. Returns the value to FUTEX_WAIT on, or None if
    /// it should not sleep (an eighth of the ring is already unread). Call [`Ring::sleep_end`]
    /// once awake.
    pub fn sleep_begin(&self) -> Option<u32> {
        let h = self.header();
        let seen = h.wake.load(Ordering::Acquire);
        h.asleep.store(1, Ordering::SeqCst);
        if self.unread() >= self.capacity / 8 {
            h.asleep.store(0, Ordering::Relaxed);
            return None;
        }
        Some(seen)
    }

    pub fn sleep_end(&self) {
        self.header().asleep.store(0, Ordering::Relaxed);
    }

    /// Anyone: wakes the consumer whether or not it sleeps (roar itself, once the run is over).
    pub fn wake_always(&self) {
        let h = self.header();
        h.asleep.store(0, Ordering::Relaxed);
        h.wake.fetch_add(1, Ordering::Release);
    }

    /// Consumer: what is at the tail.
    pub fn next(&self) -> Next<'_> {
        self.at(self.tail())
    }

    /// Consumer: where the tail is (a position that only grows: everything before it is read).
    pub fn tail(&self) -> u64 {
        self.header().tail.load(Ordering::Relaxed)
    }

    /// Consumer: what is at `pos`, at or past the tail, without freeing anything: a consumer
    /// that must keep what it read somewhere first (roar's journal) reads ahead, then frees up
    /// to where it kept ([`Ring::release_to`]).
    pub fn at(&self, pos: u64) -> Next<'_> {
        let h = self.header();
        if h.head.load(Ordering::Acquire) <= pos {
            return Next::Empty;
        }
        let off = pos & (self.capacity - 1);
        let w = self.word(off).load(Ordering::Acquire);
        let len = w & LEN_MASK;
        if len == 0 {
            return Next::Pending { pid: 0 };
        }
        let pid = (w >> 32) as i32;
        if w & COMMITTED == 0 || off + len > self.capacity {
            return Next::Pending { pid };
        }
        if w & PAD != 0 {
            return Next::Pad { len };
        }
        // SAFETY: committed (Acquire above) bytes of the slot, inside the area.
        let bytes = unsafe {
            core::slice::from_raw_parts(self.data.add(off as usize + 8), (len - 8) as usize)
        };
        Next::Event { bytes, len }
    }

    /// The length of the pending slot at the tail, if its producer got as far as marking it.
    pub fn pending_len(&self) -> Option<u64> {
        let off = self.header().tail.load(Ordering::Relaxed) & (self.capacity - 1);
        let len = self.word(off).load(Ordering::Acquire) & LEN_MASK;
        (len >= 8 && off + len <= self.capacity).then_some(len)
    }

    /// Consumer: frees the `len` bytes of the slot at the tail (rewritten as free words, so a
    /// later, differently aligned slot never reads stale bytes as its word).
    pub fn release(&self, len: u64) {
        let h = self.header();
        let tail = h.tail.load(Ordering::Relaxed);
        self.free(tail, len);
        h.tail.store(tail + len, Ordering::Release);
    }

    /// Consumer: frees every slot before `pos` (a position [`Ring::at`] read up to: a slot
    /// boundary at or past the tail, at most the head).
    pub fn release_to(&self, pos: u64) {
        let h = self.header();
        let mut tail = h.tail.load(Ordering::Relaxed);
        while tail < pos {
            // Freed words carry their lap: one lap at a time.
            let lap_end = (tail / self.capacity + 1) * self.capacity;
            let end = pos.min(lap_end);
            self.free(tail, end - tail);
            tail = end;
        }
        h.tail.store(tail, Ordering::Release);
    }

    /// Consumer: takes back the unmarked words at the tail, up to the next marked word or the
    /// head: slots reserved by producers that never marked them (see the module doc). Call it
    /// only once such a producer must be dead. Returns the bytes freed (0 if the slot at the tail
    /// was marked meanwhile).
    pub fn skip_unmarked(&self) -> u64 {
        let h = self.header();
        let tail = h.tail.load(Ordering::Relaxed);
        let head = h.head.load(Ordering::Acquire);
        let mut pos = tail;
        while pos < head {
            let taken = self.word(pos & (self.capacity - 1)).compare_exchange(
                self.free_word(pos),
                self.free_word(pos + self.capacity),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
            if taken.is_err() {
                break;
            }
            pos += 8;
        }
        h.tail.store(pos, Ordering::Release);
        pos - tail
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    fn ring(buf: &mut Vec<u64>) -> Ring {
        // SAFETY: the buffer is zeroed, aligned and big enough.
        unsafe { Ring::create(buf.as_mut_ptr().cast(), MIN_CAPACITY, 1) }
    }

    fn drain(r: &Ring) -> Vec<Vec<u8>> {
        drain_with(r, |_| panic!("nothing is in flight"))
    }

    /// Every event at the tail, `pending` called for a slot not committed.
    fn drain_with(r: &Ring, pending: impl Fn(i32)) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            match r.next() {
                Next::Empty => return out,
                Next::Event { bytes, len } => {
                    out.push(bytes.to_vec());
                    r.release(len);
                }
                Next::Pad { len } => r.release(len),
                Next::Pending { pid } => pending(pid),
            }
        }
    }

    /// Read ahead of the tail in batches, freed only after each batch (as roar keeps a batch in
    /// its journal first): every event once, in order, across wraps, with producers refilling
    /// what each batch frees.
    #[test]
    fn a_consumer_reading_ahead_frees_whole_batches() {
        let mut buf = vec![0u64; (HEADER_SIZE + MIN_CAPACITY as usize) / 8];
        let r = ring(&mut buf);
        let (mut sent, mut got) = (0u32, Vec::new());
        for round in 0..200u32 {
            while r.write(
                3,
                &[
                    &sent.to_le_bytes(),
                    &[7u8; 300][..(round as usize * 37) % 300],
                ],
                &mut || false,
            ) {
                sent += 1;
            }
            let mut pos = r.tail();
            let mut batch = 0;
            loop {
                match r.at(pos) {
                    Next::Event { bytes, len } => {
                        got.push(u32::from_le_bytes(bytes[..4].try_into().unwrap()));
                        pos += len;
                    }
                    Next::Pad { len } => pos += len,
                    Next::Empty => break,
                    Next::Pending { .. } => panic!("nothing is in flight"),
                }
                batch += 1;
                if batch == 50 + round as usize % 70 {
                    break;
                }
            }
            r.release_to(pos);
            assert_eq!(r.tail(), pos);
        }
        let rest = drain(&r);
        got.extend(
            rest.iter()
                .map(|b| u32::from_le_bytes(b[..4].try_into().unwrap())),
        );
        assert_eq!(got, (0..sent).collect::<Vec<_>>());
    }

    #[test]
    fn events_come_back_in_order_across_many_wraps() {
        let mut buf = vec![0u64; (HEADER_SIZE + MIN_CAPACITY as usize) / 8];
        let r = ring(&mut buf);
        let mut sent = 0u32;
        for round in 0..50 {
            let mut expect = Vec::new();
            for i in 0..(100 + round) {
                let body = vec![(i % 251) as u8; 100 + (i as usize * 13) % 900];
                assert!(r.write(7, &[&sent.to_le_bytes(), &body], &mut || false));
                let mut e = sent.to_le_bytes().to_vec();
                e.extend_from_slice(&body);
                expect.push(e);
                sent += 1;
            }
            let got = drain(&r);
            assert_eq!(got.len(), expect.len());
            for (g, e) in got.iter().zip(&expect) {
                // Slots are padded to 8 bytes: the event is a prefix.
                assert_eq!(&g[..e.len()], &e[..]);
            }
        }
    }

    #[test]
    fn a_full_ring_waits_and_an_oversized_event_is_refused() {
        let mut buf = vec![0u64; (HEADER_SIZE + MIN_CAPACITY as usize) / 8];
        let r = ring(&mut buf);
        let big = vec![1u8; 4000];
        let mut waits = 0;
        let mut n = 0;
        while r.write(1, &[&big], &mut || {
            waits += 1;
            false
        }) {
            n += 1;
        }
        assert_eq!(
            waits, 1,
            "the producer asked to wait once the ring was full"
        );
        assert_eq!(n, MIN_CAPACITY as usize / 4008);
        assert_eq!(drain(&r).len(), n);
        assert!(r.write(1, &[&big], &mut || false), "space is back");
        let huge = vec![0u8; MIN_CAPACITY as usize];
        assert!(!r.write(1, &[&huge], &mut || true));
    }

    #[test]
    fn a_sleeping_consumer_is_woken_once_per_batch_and_an_awake_one_never() {
        let mut buf = vec![0u64; (HEADER_SIZE + MIN_CAPACITY as usize) / 8];
        let r = ring(&mut buf);
        let event = vec![7u8; 1000];
        let batch = MIN_CAPACITY as usize / 8 / 1008 + 1;
        // Awake: no producer ever asks for a wake-up.
        for _ in 0..batch {
            assert!(r.write(1, &[&event], &mut || true));
            assert!(!r.wake_needed(false));
        }
        assert_eq!(drain(&r).len(), batch);
        let seen = r.sleep_begin().expect("an empty ring lets it sleep");
        let mut wakes = 0;
        for i in 0..2 * batch {
            assert!(r.write(1, &[&event], &mut || true));
            if r.wake_needed(false) {
                wakes += 1;
                assert!(
                    i + 1 >= batch,
                    "woken after {} events, before an eighth",
                    i + 1
                );
            }
        }
        assert_eq!(wakes, 1, "one wake-up for the batch");
        // SAFETY: the word lies in the ring's mapping, alive while `r` is.
        let word = unsafe { *r.wake_word() };
        assert_ne!(word, seen, "the futex word moved");
        assert!(r.sleep_begin().is_none(), "an eighth unread: no sleeping");
        r.sleep_end();
        // A full ring wakes a sleeper whatever the threshold.
        drain(&r);
        assert!(r.sleep_begin().is_some());
        assert!(r.wake_needed(true));
    }

    #[test]
    fn a_reserved_but_uncommitted_slot_is_pending() {
        let mut buf = vec![0u64; (HEADER_SIZE + MIN_CAPACITY as usize) / 8];
        let r = ring(&mut buf);
        // A producer that reserved 16 bytes and marked them, then died.
        r.header().head.store(16, Ordering::Relaxed);
        assert_eq!(r.next(), Next::Pending { pid: 0 });
        assert_eq!(r.pending_len(), None);
        r.word(0).store(16 | (42u64 << 32), Ordering::Relaxed);
        assert_eq!(r.next(), Next::Pending { pid: 42 });
        assert_eq!(r.pending_len(), Some(16));
        r.release(16);
        assert_eq!(r.next(), Next::Empty);
    }

    #[test]
    fn a_producer_killed_before_marking_loses_its_own_slot_only() {
        let mut buf = vec![0u64; (HEADER_SIZE + MIN_CAPACITY as usize) / 8];
        let r = ring(&mut buf);
        // Go round the ring a few times first, so the free words are not all of lap 0.
        for round in 0..3u8 {
            let body = vec![round; MIN_CAPACITY as usize / 3];
            assert!(r.write(1, &[&body], &mut || false));
            drain(&r);
        }
        // Reserved, then killed: nothing in the slot says so.
        let dead = r.reserve(48, &mut || false).unwrap();
        for i in 0..5u8 {
            assert!(r.write(2, &[&[i; 20]], &mut || false));
        }
        // A slot reserved after the dead one and not marked yet is taken back with it.
        let slow = r.reserve(24, &mut || false).unwrap();
        assert!(r.write(3, &[&[9; 8]], &mut || false));
        assert_eq!(r.next(), Next::Pending { pid: 0 });
        assert_eq!(r.skip_unmarked(), dead.need + dead.pad);
        let got = drain_skipping(&r);
        assert_eq!(got.len(), 6, "every event after the dead slot");
        assert!(got[..5]
            .iter()
            .enumerate()
            .all(|(i, e)| e[..20] == [i as u8; 20]));
        assert_eq!(got[5][..8], [9; 8]);
        // The slow producer comes back: its slot is gone, it says so and writes nothing.
        assert!(!r.fill(slow, 4, &[&[7; 8]]));
        assert_eq!(r.next(), Next::Empty);
        assert!(r.write(5, &[&[5; 8]], &mut || false), "the ring goes on");
        assert_eq!(drain(&r).len(), 1);
    }

    /// Like `drain`, taking back unmarked slots as a consumer does at the end of a run.
    fn drain_skipping(r: &Ring) -> Vec<Vec<u8>> {
        drain_with(r, |pid| match pid {
            0 => assert!(r.skip_unmarked() > 0),
            _ => r.release(r.pending_len().unwrap()),
        })
    }

    /// A real process writing events as fast as it can, killed at random points (so in the middle
    /// of every step of a write, over the rounds), then the consumer's end-of-run pass: the
    /// killed process's events come back in order up to the one it was killed in, and every
    /// event written after it by another process comes back whole.
    #[test]
    fn producers_killed_at_random_points_lose_nothing_after_their_own_last_event() {
        let len = HEADER_SIZE + MIN_CAPACITY as usize;
        // SAFETY: a fresh shared anonymous mapping (zeroed), unmapped at the end.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        // SAFETY: as above.
        let r = unsafe { Ring::create(base.cast(), MIN_CAPACITY, 1) };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ std::process::id() as u64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut unmarked, mut uncommitted) = (0, 0);
        for round in 0..300u32 {
            // SAFETY: the child only writes to the shared ring and spins; it never returns.
            let child = unsafe { libc::fork() };
            if child == 0 {
                let mut i = 0u32;
                loop {
                    let body = [round.to_le_bytes(), i.to_le_bytes()];
                    let filler = [0xabu8; 200];
                    let n = (i % 200) as usize;
                    r.write(7, &[&body[0], &body[1], &filler[..n]], &mut || {
                        // SAFETY: no preconditions.
                        unsafe { libc::sched_yield() };
                        true
                    });
                    i = i.wrapping_add(1);
                }
            }
            let mut seen = Seen {
                round,
                next_i: 0,
                after: Vec::new(),
                unmarked: 0,
                uncommitted: 0,
            };
            // Read while the child writes, then kill it at a random moment.
            let spins = rand() % 20_000;
            for _ in 0..spins {
                if let Next::Event { bytes, len } = r.next() {
                    seen.event(bytes);
                    r.release(len);
                }
            }
            // SAFETY: our own child.
            unsafe {
                libc::kill(child, libc::SIGKILL);
                libc::waitpid(child, core::ptr::null_mut(), 0);
            }
            let after: Vec<u32> = (0..(rand() % 40) as u32).collect();
            for a in &after {
                // A full ring is read as by a consumer that knows the killed process is gone.
                let body = [u32::MAX.to_le_bytes(), a.to_le_bytes()];
                assert!(r.write(8, &[&body[0], &body[1]], &mut || {
                    seen.drain(&r);
                    true
                }));
            }
            seen.drain(&r);
            assert_eq!(
                seen.after, after,
                "round {round}: every event after the kill"
            );
            unmarked += seen.unmarked;
            uncommitted += seen.uncommitted;
        }
        std::eprintln!("killed before marking {unmarked} times, before committing {uncommitted}");
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(base, len) };
    }

    /// What the consumer of the kill loop has read in one round.
    struct Seen {
        round: u32,
        /// The killed process's next event number.
        next_i: u32,
        /// The survivor's events (written after the kill).
        after: Vec<u32>,
        unmarked: u32,
        uncommitted: u32,
    }

    impl Seen {
        fn event(&mut self, bytes: &[u8]) {
            let rd = u32::from_le_bytes(bytes[..4].try_into().unwrap());
            let i = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
            if rd == u32::MAX {
                self.after.push(i);
                return;
            }
            assert!(
                self.after.is_empty(),
                "the killed process wrote after its death"
            );
            assert_eq!(
                (rd, i),
                (self.round, self.next_i),
                "the killed process's events in order"
            );
            assert!(bytes[8..8 + (i % 200) as usize].iter().all(|b| *b == 0xab));
            self.next_i += 1;
        }

        /// Reads everything there is, every producer but the survivor being gone.
        fn drain(&mut self, r: &Ring) {
            loop {
                match r.next() {
                    Next::Empty => return,
                    Next::Event { bytes, len } => {
                        self.event(bytes);
                        r.release(len);
                    }
                    Next::Pad { len } => r.release(len),
                    Next::Pending { pid: 0 } => {
                        self.unmarked += 1;
                        assert!(r.skip_unmarked() > 0);
                    }
                    Next::Pending { pid } => {
                        assert_eq!(pid, 7);
                        self.uncommitted += 1;
                        r.release(r.pending_len().unwrap());
                    }
                }
            }
        }
    }

    #[test]
    fn concurrent_producers_lose_nothing_and_keep_their_own_order() {
        let mut buf = vec![0u64; (HEADER_SIZE + MIN_CAPACITY as usize) / 8];
        let r = ring(&mut buf);
        const THREADS: u32 = 4;
        const EACH: u32 = 20_000;
        let mut seen = vec![0u32; THREADS as usize];
        std::thread::scope(|s| {
            for t in 0..THREADS {
                s.spawn(move || {
                    for i in 0..EACH {
                        let pad = vec![t as u8; (i % 300) as usize];
                        let ok = r.write(
                            t as i32,
                            &[&t.to_le_bytes(), &i.to_le_bytes(), &pad],
                            &mut || {
                                std::thread::yield_now();
                                true
                            },
                        );
                        assert!(ok);
                    }
                });
            }
            let mut done = 0;
            while done < THREADS * EACH {
                match r.next() {
                    Next::Event { bytes, len } => {
                        let t = u32::from_le_bytes(bytes[..4].try_into().unwrap());
                        let i = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
                        assert_eq!(seen[t as usize], i, "thread {t} out of order");
                        assert!(bytes[8..8 + (i % 300) as usize]
                            .iter()
                            .all(|b| *b == t as u8));
                        seen[t as usize] += 1;
                        done += 1;
                        r.release(len);
                    }
                    Next::Pad { len } => r.release(len),
                    Next::Empty | Next::Pending { .. } => std::thread::yield_now(),
                }
            }
        });
        assert_eq!(seen, vec![EACH; THREADS as usize]);
        assert_eq!(r.next(), Next::Empty);
    }
}
