//! One bzip2 block decoded by roar's own code, so that a read can start inside it.
//!
//! A block is the Burrows–Wheeler transform of up to 900 kB, move-to-front and Huffman coded.
//! Decoding has two halves. The symbols (Huffman codes, move-to-front, runs of zeros) give the
//! transform's last column, which must be whole before any byte is known. Then the inverse
//! transform walks that column one output byte at a time, each step a jump to an unpredictable
//! place in a table of 4 bytes per symbol (3.6 MB at `-9`): the larger half of the work, and
//! the half a read can shorten. The walk's state after any number of steps is four numbers
//! ([`Restart`]), so the index pass, which decodes every block anyway, notes it every
//! [`MARK_EVERY`] bytes of output, and a read starts walking at the note before its member
//! instead of at the block's start. libbz2 (and `libbz2-rs-sys`, its Rust port, which roar
//! used before) decodes a block only from its start, with nothing to note: this is why roar
//! has a decoder of its own for bzip2 (measured in bench/NOTES.md, "bzip2 blocks walked from
//! inside").
//!
//! Blocks in the "randomised" form only bzip2 0.9.0 wrote (1998) are not decoded here
//! ([`Unsupported`]); [`crate::bz2`] hands those to the library.

use std::io;

/// Bytes of output between two notes of the walk's state in a block.
pub const MARK_EVERY: u64 = 64 << 10;
/// The bytes of a [`Restart`].
pub const RESTART_LEN: usize = 10;

const BLOCK_MAGIC: u64 = 0x3141_5926_5359;
const RUN_A: u16 = 0;
const RUN_B: u16 = 1;
const GROUP: u32 = 50;
const MAX_CODE: u32 = 20;
/// Bits a Huffman code is looked up by at once; longer codes take the slow path.
const LUT_BITS: u32 = 11;

/// The block is in a form this decoder does not read (a randomised block).
#[derive(Debug)]
pub struct Unsupported;

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a randomised block (bzip2 0.9.0)")
    }
}

impl std::error::Error for Unsupported {}

/// What is wrong, said inside [`crate::bz2`]'s "the block at bit N does not decode (...)".
fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// Bits read most significant first, from a bit offset of a byte slice; past its end, zeros
/// (counted, so a block cut short is an error, not a decoding of zeros).
struct Bits<'a> {
    src: &'a [u8],
    next: usize,
    /// The next bits, at the top.
    buf: u64,
    have: u32,
}

impl<'a> Bits<'a> {
    fn new(src: &'a [u8], shift: u32) -> Bits<'a> {
        let mut b = Bits {
            src,
            next: 0,
            buf: 0,
            have: 0,
        };
        b.refill();
        b.consume(shift);
        b
    }

    /// At least 57 bits in `buf`.
    #[inline]
    fn refill(&mut self) {
        if let Some(w) = self.src.get(self.next..self.next + 8) {
            let w = u64::from_be_bytes(w.try_into().expect("8 bytes"));
            // Bits below the ones counted are the next byte's own: or-ing them in again at
            // the next refill changes nothing.
            self.buf |= w >> self.have;
            let take = (63 - self.have) / 8;
            self.next += take as usize;
            self.have += take * 8;
            return;
        }
        while self.have <= 56 {
            let b = self.src.get(self.next).copied().unwrap_or(0);
            self.buf |= u64::from(b) << (56 - self.have);
            self.next += 1;
            self.have += 8;
        }
    }

    #[inline]
    fn peek(&self, n: u32) -> u32 {
        (self.buf >> (64 - n)) as u32
    }

    #[inline]
    fn consume(&mut self, n: u32) {
        self.buf <<= n;
        self.have -= n;
    }

    /// `n` (1 to 32) bits.
    fn take(&mut self, n: u32) -> u32 {
        self.refill();
        let v = self.peek(n);
        self.consume(n);
        v
    }

    fn bit(&mut self) -> bool {
        self.take(1) == 1
    }

    /// Whether more bits were taken than the slice holds.
    fn overran(&self) -> bool {
        (self.next as u64) * 8 - u64::from(self.have) > (self.src.len() as u64) * 8
    }
}

/// One Huffman table of a block: a lookup of the first [`LUT_BITS`] bits, and canonical
/// ranges by length for longer codes.
struct Table {
    /// symbol << 5 | length, or 0 where the code is longer than `LUT_BITS`.
    lut: Vec<u16>,
    /// Per length: the first code, how many codes, where their symbols start in `perm`.
    first: [u32; MAX_CODE as usize + 1],
    count: [u32; MAX_CODE as usize + 1],
    at: [u32; MAX_CODE as usize + 1],
    perm: Vec<u16>,
    max_len: u32,
}

impl Table {
    fn new(lengths: &[u8]) -> io::Result<Table> {
        let mut count = [0u32; MAX_CODE as usize + 1];
        for &l in lengths {
            count[l as usize] += 1;
        }
        let (mut first, mut at) = ([0u32; MAX_CODE as usize + 1], [0u32; MAX_CODE as usize + 1]);
        let (mut code, mut index) = (0u32, 0u32);
        for len in 1..=MAX_CODE as usize {
            first[len] = code;
            at[len] = index;
            code += count[len];
            index += count[len];
            if code > 1 << len {
                return Err(bad("a Huffman table has more codes than fit"));
            }
            code <<= 1;
        }
        let mut perm = Vec::with_capacity(lengths.len());
        for len in 1..=MAX_CODE as u8 {
            perm.extend((0..lengths.len() as u16).filter(|&s| lengths[s as usize] == len));
        }
        let mut lut = vec![0u16; 1 << LUT_BITS];
        for len in 1..=LUT_BITS {
            for k in 0..count[len as usize] {
                let sym = perm[(at[len as usize] + k) as usize];
                let c = (first[len as usize] + k) << (LUT_BITS - len);
                let entry = sym << 5 | len as u16;
                lut[c as usize..(c + (1 << (LUT_BITS - len))) as usize].fill(entry);
            }
        }
        let max_len = lengths.iter().copied().max().unwrap_or(0).into();
        Ok(Table {
            lut,
            first,
            count,
            at,
            perm,
            max_len,
        })
    }

    /// The next symbol; `bits` holds at least `MAX_CODE` bits.
    #[inline]
    fn decode(&self, bits: &mut Bits) -> io::Result<u16> {
        let e = self.lut[bits.peek(LUT_BITS) as usize];
        if e != 0 {
            bits.consume(u32::from(e & 31));
            return Ok(e >> 5);
        }
        for len in LUT_BITS + 1..=self.max_len {
            let c = bits.peek(len);
            let k = c.wrapping_sub(self.first[len as usize]);
            if k < self.count[len as usize] {
                bits.consume(len);
                return Ok(self.perm[(self.at[len as usize] + k) as usize]);
            }
        }
        Err(bad("a Huffman code matches no symbol"))
    }
}

/// A block's symbols decoded: the inverse transform's table, ready to walk.
pub struct Column {
    /// Per symbol: the byte (low 8 bits) and the next symbol's index (above).
    tt: Vec<u32>,
    orig: u32,
    /// The block's CRC, as stored.
    pub crc: u32,
}

/// Where a walk of a block stands: the next symbol, steps taken, and the run-length state of
/// the output (the last byte and how many times it came in a row, 4 meaning a count is next).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restart {
    pos: u32,
    steps: u32,
    prev: u8,
    run: u8,
}

impl Restart {
    pub fn to_bytes(self) -> [u8; RESTART_LEN] {
        let mut b = [0u8; RESTART_LEN];
        b[..4].copy_from_slice(&self.pos.to_le_bytes());
        b[4..8].copy_from_slice(&self.steps.to_le_bytes());
        b[8] = self.prev;
        b[9] = self.run;
        b
    }

    pub fn from_bytes(b: &[u8]) -> Option<Restart> {
        (b.len() == RESTART_LEN && b[9] <= 4).then(|| Restart {
            pos: u32::from_le_bytes(b[..4].try_into().expect("4 bytes")),
            steps: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            prev: b[8],
            run: b[9],
        })
    }
}

/// Decodes the symbols of the block whose magic starts at bit `shift` of `src`, of a stream of
/// level `level` ('1' to '9').
pub fn column(src: &[u8], shift: u32, level: u8) -> io::Result<Result<Column, Unsupported>> {
    let mut bits = Bits::new(src, shift);
    let magic = u64::from(bits.take(24)) << 24 | u64::from(bits.take(24));
    if magic != BLOCK_MAGIC {
        return Err(bad("no block magic where the index says a block starts"));
    }
    let crc = bits.take(32);
    if bits.bit() {
        return Ok(Err(Unsupported));
    }
    let orig = bits.take(24);
    let alphabet = used_bytes(&mut bits)?;
    let groups = bits.take(3) as usize;
    if !(2..=6).contains(&groups) {
        return Err(bad("a block has a table count outside 2 to 6"));
    }
    let selectors = selectors(&mut bits, groups)?;
    let tables = (0..groups)
        .map(|_| Table::new(&code_lengths(&mut bits, alphabet.len() + 2)?))
        .collect::<io::Result<Vec<_>>>()?;
    let max = usize::from(level.wrapping_sub(b'0')) * 100_000;
    let tt = symbols(&mut bits, &alphabet, &selectors, &tables, max)?;
    if bits.overran() {
        return Err(bad("a block ends before its last symbol"));
    }
    if orig as usize >= tt.len() {
        return Err(bad("a block's origin is outside it"));
    }
    Ok(Ok(Column {
        tt: transform(tt),
        orig,
        crc,
    }))
}

/// The bytes the block uses, in order.
fn used_bytes(bits: &mut Bits) -> io::Result<Vec<u8>> {
    let ranges = bits.take(16);
    let mut used = Vec::with_capacity(256);
    for i in 0..16u32 {
        if ranges & (0x8000 >> i) != 0 {
            let set = bits.take(16);
            used.extend(
                (0..16u32)
                    .filter(|j| set & (0x8000 >> j) != 0)
                    .map(|j| (i * 16 + j) as u8),
            );
        }
    }
    if used.is_empty() {
        return Err(bad("a block uses no byte"));
    }
    Ok(used)
}

/// Which table each group of 50 symbols uses.
fn selectors(bits: &mut Bits, groups: usize) -> io::Result<Vec<u8>> {
    let n = bits.take(15) as usize;
    if n == 0 {
        return Err(bad("a block has no selector"));
    }
    let mut order: Vec<u8> = (0..groups as u8).collect();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut j = 0usize;
        while bits.bit() {
            j += 1;
            if j >= groups {
                return Err(bad("a selector names no table"));
            }
        }
        let t = order[j];
        order.copy_within(0..j, 1);
        order[0] = t;
        out.push(t);
    }
    // libbz2 1.0.8 reads up to 32767 and uses the first 18002 (what 900 kB can need).
    out.truncate(18_002);
    Ok(out)
}

/// One table's code lengths, delta coded.
fn code_lengths(bits: &mut Bits, symbols: usize) -> io::Result<Vec<u8>> {
    let mut len = bits.take(5);
    let mut out = Vec::with_capacity(symbols);
    for _ in 0..symbols {
        loop {
            if !(1..=MAX_CODE).contains(&len) {
                return Err(bad("a code length is outside 1 to 20"));
            }
            if !bits.bit() {
                break;
            }
            if bits.bit() {
                len -= 1;
            } else {
                len += 1;
            }
        }
        out.push(len as u8);
    }
    Ok(out)
}

/// The transform's last column, one byte per symbol (in the low bits of each `u32`).
fn symbols(
    bits: &mut Bits,
    alphabet: &[u8],
    selectors: &[u8],
    tables: &[Table],
    max: usize,
) -> io::Result<Vec<u32>> {
    let eob = alphabet.len() as u16 + 1;
    let mut mtf = [0u8; 256];
    mtf[..alphabet.len()].copy_from_slice(alphabet);
    let mut out: Vec<u32> = Vec::with_capacity(max);
    let (mut run, mut run_bit) = (0usize, 1usize);
    let mut chosen = selectors.iter();
    let (mut table, mut left) = (&tables[0], 0u32);
    loop {
        if left == 0 {
            let t = chosen
                .next()
                .ok_or_else(|| bad("a block has more groups than selectors"))?;
            table = &tables[*t as usize];
            left = GROUP;
        }
        left -= 1;
        if bits.have < MAX_CODE {
            bits.refill();
        }
        let sym = table.decode(bits)?;
        if sym == RUN_A || sym == RUN_B {
            if run_bit > 1 << 21 {
                return Err(bad("a run of zeros is too long"));
            }
            run += run_bit << sym;
            run_bit <<= 1;
            continue;
        }
        if run > 0 {
            if out.len() + run > max {
                return Err(bad("a block is longer than its level allows"));
            }
            out.resize(out.len() + run, u32::from(mtf[0]));
            (run, run_bit) = (0, 1);
        }
        if sym == eob {
            return Ok(out);
        }
        if sym > eob {
            return Err(bad("a symbol is outside the block's alphabet"));
        }
        // memmove beat moving 16 bytes at a time here (15.1 s against 19.8-20.3 s for 1,000
        // random members of bench/archive.sh's tar.bz2).
        let k = usize::from(sym - 1);
        let b = mtf[k];
        mtf.copy_within(0..k, 1);
        mtf[0] = b;
        if out.len() == max {
            return Err(bad("a block is longer than its level allows"));
        }
        out.push(u32::from(b));
    }
}

/// The last column turned into the inverse transform's links: each symbol's byte stays in the
/// low 8 bits, the index of the symbol that follows it in the output goes above.
fn transform(mut tt: Vec<u32>) -> Vec<u32> {
    let mut counts = [0u32; 256];
    for &t in &tt {
        counts[(t & 0xff) as usize] += 1;
    }
    let mut next = [0u32; 256];
    let mut sum = 0;
    for (n, c) in next.iter_mut().zip(counts) {
        *n = sum;
        sum += c;
    }
    for i in 0..tt.len() {
        let b = (tt[i] & 0xff) as usize;
        tt[next[b] as usize] |= (i as u32) << 8;
        next[b] += 1;
    }
    tt
}

/// The output of a block from a [`Restart`], with the walk's state noted on the way if asked.
pub struct Walk {
    col: Column,
    at: Restart,
    /// Repeats of `at.prev` still to write (a count read, not yet written out).
    pending: u32,
    /// Bytes written since the block's start.
    out: u64,
    crc: Option<crc_fast::Digest>,
    marks: Option<Vec<(u64, Restart)>>,
}

impl Walk {
    /// From the block's start; `verify`: the output is checked against the block's CRC at its
    /// end; `mark`: the walk's state is noted every [`MARK_EVERY`] bytes.
    pub fn start(col: Column, verify: bool, mark: bool) -> Walk {
        let pos = col.tt[col.orig as usize] >> 8;
        let at = Restart {
            pos,
            steps: 0,
            prev: 0,
            run: 0,
        };
        Walk {
            col,
            at,
            pending: 0,
            out: 0,
            crc: verify.then(|| crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Bzip2)),
            marks: mark.then(Vec::new),
        }
    }

    /// From a noted state (no CRC check: the bytes before it are not seen).
    pub fn resume(col: Column, at: Restart) -> io::Result<Walk> {
        if at.steps as usize > col.tt.len() || at.pos as usize >= col.tt.len().max(1) {
            return Err(bad("a restart point is outside its block"));
        }
        Ok(Walk {
            col,
            at,
            pending: 0,
            out: 0,
            crc: None,
            marks: None,
        })
    }

    /// The states noted, each with the bytes of output before it.
    pub fn marks(&mut self) -> Vec<(u64, Restart)> {
        self.marks.take().unwrap_or_default()
    }

    /// Fills `buf` with the next bytes; 0 at the block's end.
    fn fill(&mut self, buf: &mut [u8]) -> usize {
        let n = self.col.tt.len() as u32;
        let tt = &self.col.tt[..];
        let mut at = self.at;
        let mut i = 0;
        while i < buf.len() {
            if self.pending > 0 {
                let k = (self.pending as usize).min(buf.len() - i);
                buf[i..i + k].fill(at.prev);
                i += k;
                self.pending -= k as u32;
                continue;
            }
            if at.steps == n {
                break;
            }
            if let Some(marks) = self.marks.as_mut() {
                let out = self.out + i as u64;
                if out >= marks.last().map_or(0, |m| m.0) + MARK_EVERY {
                    marks.push((out, at));
                }
            }
            let t = tt[at.pos as usize];
            let b = t as u8;
            at.pos = t >> 8;
            at.steps += 1;
            if at.run == 4 {
                self.pending = u32::from(b);
                at.run = 0;
            } else {
                buf[i] = b;
                i += 1;
                if at.run > 0 && b == at.prev {
                    at.run += 1;
                } else {
                    (at.prev, at.run) = (b, 1);
                }
            }
        }
        self.at = at;
        self.out += i as u64;
        if let Some(crc) = self.crc.as_mut() {
            crc.update(&buf[..i]);
        }
        i
    }
}

impl io::Read for Walk {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.fill(buf);
        if n == 0 && !buf.is_empty() {
            if let Some(crc) = self.crc.take() {
                if crc.finalize() as u32 != self.col.crc {
                    return Err(bad("a block's bytes do not match its CRC"));
                }
            }
        }
        Ok(n)
    }
}
