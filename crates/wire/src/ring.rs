//! The shared-memory event ring between the shims of all traced processes (producers) and the
//! `roar run` that reads them (the one consumer).
//!
//! roar maps a memfd: a [`RingHeader`] page, then `capacity` bytes of slots. A producer reserves a
//! slot by advancing `head` with a compare-and-swap, marks it reserved (its length and pid), copies
//! the event in and sets the committed bit; no system call unless the ring is full. The consumer
//! reads committed slots in reservation order (one total order across processes), zeroes them and
//! advances `tail`, which frees the space. A slot never wraps: a producer whose slot would cross the
//! end of the area reserves the rest of the area as padding too.
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

use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Environment variable telling the shim where the ring is: `<roar pid>/<fd>`; the shim opens
/// `/proc/<roar pid>/fd/<fd>`, which works even after the program closed every inherited fd.
pub const RING_ENV: &str = "ROAR_INTERNAL_RING";
pub const MAGIC: u64 = u64::from_le_bytes(*b"roarrng2");
/// Bytes before the slot area.
pub const HEADER_SIZE: usize = 4096;
/// The smallest slot area: an Exec event carries up to 32 KiB of argv and must fit twice.
pub const MIN_CAPACITY: u64 = 128 * 1024;

const COMMITTED: u64 = 1;
const PAD: u64 = 2;
const LEN_MASK: u64 = 0xffff_fff8;

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
unsafe impl Sync for Ring {}

/// What the consumer finds at `tail`.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<'a> {
    /// Nothing reserved past the tail.
    Empty,
    /// A producer reserved the next slot and has not committed it yet (`pid` 0: not even marked).
    Pending { pid: i32 },
    /// A committed event; pass `len` to [`Ring::release`] once done with `bytes`.
    Event { bytes: &'a [u8], len: u64 },
    /// Padding up to the end of the area; release it.
    Pad { len: u64 },
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
        let h = self.header();
        let (pos, pad) = loop {
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
                    return false;
                }
                continue;
            }
            if h.head
                .compare_exchange_weak(pos, pos + total, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                break (pos, pad);
            }
        };
        let pid_bits = (pid as u32 as u64) << 32;
        if pad > 0 {
            let off = pos & (self.capacity - 1);
            self.word(off)
                .store(pad | PAD | COMMITTED | pid_bits, Ordering::Release);
        }
        let off = (pos + pad) & (self.capacity - 1);
        let word = self.word(off);
        word.store(need | pid_bits, Ordering::Relaxed);
        let mut at = off as usize + 8;
        for p in parts {
            // SAFETY: the reserved slot [off, off + need) lies inside the area and is ours.
            unsafe { core::ptr::copy_nonoverlapping(p.as_ptr(), self.data.add(at), p.len()) };
            at += p.len();
        }
        word.store(need | pid_bits | COMMITTED, Ordering::Release);
        true
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
        let h = self.header();
        let tail = h.tail.load(Ordering::Relaxed);
        if h.head.load(Ordering::Acquire) == tail {
            return Next::Empty;
        }
        let off = tail & (self.capacity - 1);
        let w = self.word(off).load(Ordering::Acquire);
        let pid = (w >> 32) as i32;
        let len = w & LEN_MASK;
        if w & COMMITTED == 0 || len < 8 || off + len > self.capacity {
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

    /// Consumer: zeroes the `len` bytes at the tail (so a later, differently aligned slot never
    /// reads stale bytes as its word) and frees them.
    pub fn release(&self, len: u64) {
        let h = self.header();
        let tail = h.tail.load(Ordering::Relaxed);
        let off = tail & (self.capacity - 1);
        // SAFETY: the slot lies inside the area and nobody writes it until tail moves past it.
        unsafe { core::ptr::write_bytes(self.data.add(off as usize), 0, len as usize) };
        h.tail.store(tail + len, Ordering::Release);
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
        let mut out = Vec::new();
        loop {
            match r.next() {
                Next::Empty => return out,
                Next::Event { bytes, len } => {
                    out.push(bytes.to_vec());
                    r.release(len);
                }
                Next::Pad { len } => r.release(len),
                Next::Pending { .. } => panic!("nothing is in flight"),
            }
        }
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
        assert_ne!(unsafe { *r.wake_word() }, seen, "the futex word moved");
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
