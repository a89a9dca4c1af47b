//! bzip2 with random access by blocks, and inside them. Every bzip2 block (100–900 kB of input)
//! decodes on its own, but blocks start at any bit, marked only by a 48-bit magic number (and
//! the stream's end by another), with no index: the file is searched for both magics at every
//! bit offset (`memchr`'s SIMD search for the five bytes a magic fixes at each of the eight
//! shifts, then the bits at either end checked). A block is decoded by [`crate::bz2block`],
//! which on the index pass checks it against its CRC — so a magic number that merely occurs
//! inside compressed data (about once in 2^48 bits) cannot pass for a block boundary unnoticed:
//! the block it would cut fails its check — and notes where its inverse transform can restart
//! (access points inside the block, whose meta is the block's plus a [`Restart`]). Randomised
//! blocks go to the library as a one-block stream written around the block's bits.
//! Concatenated streams (pbzip2, lbzip2) are followed from one to the next.

use std::io::{self, Read};

use crate::block::{Block, Check, Inner};
use crate::bytes::{read_at_retry, Bytes};
use crate::bz2block::{self, Restart, Unsupported, Walk, RESTART_LEN};

const BLOCK_MAGIC: u64 = 0x3141_5926_5359;
const END_MAGIC: u64 = 0x1772_4538_5090;
/// The meta of a block: the stream's level ('1'..'9'), its first and its end bit.
const META: usize = 17;
/// Bytes searched at a time.
const CHUNK: usize = 8 << 20;

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// A magic number placed at bit shift `s` of a 7-byte window: the five bytes it fixes
/// (window bytes 1 to 5), and the bits it fixes of bytes 0 and 6 (value, mask).
struct Shifted {
    needle: [u8; 5],
    first: (u8, u8),
    last: (u8, u8),
}

fn shifted(magic: u64, s: u32) -> Shifted {
    let v = magic << (8 - s);
    let byte = |k: u32| (v >> (8 * (6 - k))) as u8;
    Shifted {
        needle: [byte(1), byte(2), byte(3), byte(4), byte(5)],
        first: (byte(0), 0xffu8 >> s),
        // The top `s` bits of byte 6.
        last: (byte(6), (0xff00u16 >> s) as u8),
    }
}

/// Every bit offset in the file where `BLOCK_MAGIC` (false) or `END_MAGIC` (true) starts, in
/// order.
fn magics(file: &dyn Bytes) -> io::Result<Vec<(u64, bool)>> {
    let pats: Vec<(Shifted, u32, bool)> = [(BLOCK_MAGIC, false), (END_MAGIC, true)]
        .into_iter()
        .flat_map(|(m, end)| (0..8).map(move |s| (shifted(m, s), s, end)))
        .collect();
    let finders: Vec<memchr::memmem::Finder> = pats
        .iter()
        .map(|(p, ..)| memchr::memmem::Finder::new(&p.needle).into_owned())
        .collect();
    let len = file.size()?;
    let mut found = Vec::new();
    // `buf[0]` is the byte at file offset `base`; windows that cross a chunk's end are found
    // in the next chunk, which starts 6 bytes before it.
    let mut buf = vec![0u8; CHUNK + 6];
    let mut base = 0u64;
    while base < len {
        let want = buf.len().min((len - base) as usize);
        let n = read_at_retry(file, &mut buf[..want], base)?;
        if n < want {
            return Err(bad("bzip2: the file shrank while it was read"));
        }
        let chunk = &buf[..n];
        for ((p, s, end), finder) in pats.iter().zip(&finders) {
            for j in finder.find_iter(chunk) {
                // Window byte 1 is at j: byte 0 at j - 1, byte 6 at j + 5.
                let Some(b0) = j.checked_sub(1).map(|i| chunk[i]) else {
                    continue;
                };
                let b6 = chunk.get(j + 5).copied().unwrap_or(0);
                if b0 & p.first.1 == p.first.0 & p.first.1
                    && (p.last.1 == 0 || (j + 5 < n && b6 & p.last.1 == p.last.0 & p.last.1))
                {
                    found.push(((base + j as u64 - 1) * 8 + u64::from(*s), *end));
                }
            }
        }
        if base + (n as u64) >= len {
            break;
        }
        base += (n - 6) as u64;
    }
    found.sort_unstable();
    found.dedup();
    Ok(found)
}

/// The blocks of every stream of the file, in order.
pub fn blocks(file: &dyn Bytes) -> io::Result<Vec<Block>> {
    let len = file.size()?;
    let marks = magics(file)?;
    let mut blocks = Vec::new();
    let mut at = 0u64;
    let mut m = 0;
    while at < len {
        let mut head = [0u8; 4];
        if read_at_retry(file, &mut head, at)? < 4
            || &head[..3] != b"BZh"
            || !(b'1'..=b'9').contains(&head[3])
        {
            return Err(bad(format!("bzip2: no stream header at byte {at}")));
        }
        let mut bit = (at + 4) * 8;
        loop {
            while marks.get(m).is_some_and(|&(b, _)| b < bit) {
                m += 1;
            }
            match marks.get(m) {
                Some(&(b, false)) if b == bit => {
                    // The block runs to the next mark: its own magic is 48 bits long.
                    let end = marks[m + 1..]
                        .iter()
                        .find(|&&(b, _)| b >= bit + 48)
                        .map(|&(b, _)| b)
                        .ok_or_else(|| bad("bzip2: the last stream has no end"))?;
                    let mut meta = Vec::with_capacity(META);
                    meta.push(head[3]);
                    meta.extend_from_slice(&bit.to_le_bytes());
                    meta.extend_from_slice(&end.to_le_bytes());
                    blocks.push(Block {
                        start_bit: bit,
                        size: None,
                        meta,
                    });
                    bit = end;
                }
                Some(&(b, true)) if b == bit => {
                    // The end magic, the stream's CRC, then padding to a byte.
                    at = (bit + 80).div_ceil(8);
                    break;
                }
                _ => return Err(bad(format!("bzip2: no block at bit {bit}"))),
            }
        }
    }
    Ok(blocks)
}

/// Bits appended to a byte vector, most significant first.
#[derive(Default)]
struct Bits {
    out: Vec<u8>,
    /// Bits used of the last byte (0: it is full, or there is none).
    used: u32,
}

impl Bits {
    fn push(&mut self, v: u64, n: u32) {
        for i in (0..n).rev() {
            let bit = (v >> i) & 1 == 1;
            if self.used == 0 {
                self.out.push(0);
            }
            if bit {
                *self.out.last_mut().expect("pushed above") |= 0x80 >> self.used;
            }
            self.used = (self.used + 1) % 8;
        }
    }

    /// `n` bits of `src`, starting at its bit `shift` (0 to 7).
    fn copy(&mut self, src: &[u8], shift: u32, n: u64) {
        debug_assert_eq!(self.used, 0, "copied onto a byte boundary");
        let whole = (n / 8) as usize;
        self.out.reserve(whole + 1);
        for i in 0..whole {
            let hi = src[i] << shift;
            let lo = if shift == 0 {
                0
            } else {
                src[i + 1] >> (8 - shift)
            };
            self.out.push(hi | lo);
        }
        let rest = (n % 8) as u32;
        if rest > 0 {
            let at = whole * 8 + shift as usize;
            let word = u16::from(src[at / 8]) << 8 | u16::from(*src.get(at / 8 + 1).unwrap_or(&0));
            let v = (word << (at % 8)) >> (16 - rest);
            self.push(u64::from(v), rest);
        }
    }
}

/// Where a block is, from an access point's meta: its stream's level, its first and end bit,
/// and the walk's state to start from when the point is inside the block.
struct Located {
    level: u8,
    start: u64,
    end: u64,
    restart: Option<Restart>,
}

fn located(meta: &[u8]) -> io::Result<Located> {
    let restart = match meta.len() {
        META => None,
        n if n == META + RESTART_LEN => Some(
            Restart::from_bytes(&meta[META..])
                .ok_or_else(|| bad("bzip2: the access point's restart is damaged"))?,
        ),
        _ => return Err(bad("bzip2: the access point does not describe a block")),
    };
    let start = u64::from_le_bytes(meta[1..9].try_into().expect("8 bytes"));
    let end = u64::from_le_bytes(meta[9..17].try_into().expect("8 bytes"));
    if end < start + 80 || end - start > 8 * (64 << 20) {
        return Err(bad("bzip2: the access point describes no block"));
    }
    Ok(Located {
        level: meta[0],
        start,
        end,
        restart,
    })
}

/// Whether the access point with this meta is a block's start (not a point inside one).
pub fn starts_block(meta: &[u8]) -> bool {
    meta.len() == META
}

/// The block's bytes from the byte its first bit is in (one byte more at the end, for the bit
/// reader), and that bit's place in the first byte.
fn block_bytes(file: &dyn Bytes, at: &Located) -> io::Result<(Vec<u8>, u32)> {
    let first = at.start / 8;
    let mut src = vec![0u8; (at.end.div_ceil(8) - first) as usize + 1];
    let n = read_at_retry(file, &mut src, first)?;
    if (n as u64) < at.end.div_ceil(8) - first {
        return Err(bad("bzip2: the file ends inside a block"));
    }
    Ok((src, (at.start % 8) as u32))
}

/// The block whose meta is `meta`, decoded from the access point (its start, or a restart
/// inside it). The file is read at once; the decoding waits for the first read.
pub fn open(file: &dyn Bytes, meta: &[u8], check: Check) -> io::Result<Box<dyn Read + Send>> {
    let at = located(meta)?;
    let (src, shift) = block_bytes(file, &at)?;
    Ok(Box::new(OneBlock {
        state: State::Compressed { src, shift, check },
        at,
    }))
}

/// A block decoded whole, with the walk's state noted inside it: its bytes, and the meta of each
/// access point inside it with the bytes before that point. The codec checks the block's CRC.
pub fn decode_whole(file: &dyn Bytes, meta: &[u8]) -> io::Result<(Vec<u8>, Inner)> {
    let at = located(meta)?;
    let (src, shift) = block_bytes(file, &at)?;
    let mut out = Vec::new();
    match bz2block::column(&src, shift, at.level).map_err(|e| named(&at, e))? {
        Ok(col) => {
            let mut walk = Walk::start(col, true, true);
            walk.read_to_end(&mut out).map_err(|e| named(&at, e))?;
            let inner = (walk.marks().into_iter())
                .map(|(off, r)| (off, [&meta[..META], &r.to_bytes()[..]].concat()))
                .collect();
            Ok((out, inner))
        }
        Err(Unsupported) => {
            library(&at, &src, shift).read_to_end(&mut out)?;
            Ok((out, Vec::new()))
        }
    }
}

fn named(at: &Located, e: io::Error) -> io::Error {
    bad(format!(
        "bzip2: the block at bit {} does not decode ({e})",
        at.start
    ))
}

/// A block: its compressed bytes until the first read, then the decoding.
struct OneBlock {
    state: State,
    at: Located,
}

enum State {
    Compressed {
        src: Vec<u8>,
        shift: u32,
        check: Check,
    },
    Walking(Box<Walk>),
    Library(Checked),
    Failed,
}

impl OneBlock {
    fn decode(&mut self, src: &[u8], shift: u32, check: Check) -> io::Result<State> {
        let col = bz2block::column(src, shift, self.at.level).map_err(|e| named(&self.at, e))?;
        Ok(match (col, self.at.restart) {
            (Ok(col), None) => {
                State::Walking(Box::new(Walk::start(col, check == Check::Verify, false)))
            }
            (Ok(col), Some(r)) => State::Walking(Box::new(
                Walk::resume(col, r).map_err(|e| named(&self.at, e))?,
            )),
            (Err(Unsupported), None) => State::Library(library(&self.at, src, shift)),
            (Err(Unsupported), Some(_)) => {
                return Err(bad(format!(
                    "bzip2: the block at bit {} has a restart point but is randomised",
                    self.at.start
                )))
            }
        })
    }
}

impl Read for OneBlock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if matches!(self.state, State::Compressed { .. }) {
            if let State::Compressed { src, shift, check } =
                std::mem::replace(&mut self.state, State::Failed)
            {
                self.state = self.decode(&src, shift, check)?;
            }
        }
        match &mut self.state {
            State::Walking(w) => w.read(buf).map_err(|e| named(&self.at, e)),
            State::Library(l) => l.read(buf),
            State::Compressed { .. } | State::Failed => Err(bad(format!(
                "bzip2: the block at bit {} failed to decode before",
                self.at.start
            ))),
        }
    }
}

/// The block decoded by the library, as a one-block stream: the stream header, the block's bits
/// shifted onto a byte, the end-of-stream magic and, as the stream's CRC, the block's own.
fn library(at: &Located, src: &[u8], shift: u32) -> Checked {
    let mut bits = Bits::default();
    bits.out.extend_from_slice(b"BZh");
    bits.out.push(at.level);
    bits.copy(src, shift, at.end - at.start);
    // The block's CRC follows its magic: a one-block stream's CRC is the block's.
    let mut crc = Bits::default();
    crc.copy(src, shift, 80);
    let crc = u32::from_be_bytes(crc.out[6..10].try_into().expect("4 bytes"));
    bits.push(END_MAGIC, 48);
    bits.push(u64::from(crc), 32);
    Checked {
        dec: bzip2::read::BzDecoder::new(io::Cursor::new(bits.out)),
        start: at.start,
    }
}

/// A block's decoder whose errors say which block could not be decoded.
struct Checked {
    dec: bzip2::read::BzDecoder<io::Cursor<Vec<u8>>>,
    start: u64,
}

impl Read for Checked {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.dec.read(buf).map_err(|e| {
            bad(format!(
                "bzip2: the block at bit {} does not decode ({e})",
                self.start
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_copied_from_any_shift() {
        let src = [0b1010_1100, 0b0101_0011, 0b1111_0000];
        for shift in 0..8 {
            for n in 0..(24 - u64::from(shift)) {
                let mut b = Bits::default();
                b.copy(&src, shift, n);
                let mut want = Bits::default();
                for i in 0..n {
                    let at = u64::from(shift) + i;
                    let bit = (src[(at / 8) as usize] >> (7 - at % 8)) & 1;
                    want.push(u64::from(bit), 1);
                }
                assert_eq!(b.out, want.out, "shift {shift}, {n} bits");
            }
        }
    }

    /// splitmix64: seeded, no crate.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Seeded data in the shapes bzip2's stages treat apart: random bytes (every move-to-front
    /// position), text, runs of one byte of every length around the run-length stage's 4 and
    /// its count's 255, stretches of zeros (long runs of RUNA/RUNB), a one-byte alphabet.
    fn generated(rng: &mut Rng, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let words: Vec<Vec<u8>> = (0..50)
            .map(|_| {
                (0..1 + rng.below(8))
                    .map(|_| b'a' + rng.below(26) as u8)
                    .collect()
            })
            .collect();
        let one_byte = rng.below(8) == 0;
        while out.len() < len {
            let n = 1 + rng.below(4_000) as usize;
            match rng.below(if one_byte { 1 } else { 5 }) {
                0 => out.extend(std::iter::repeat_n(b'x', 1 + rng.below(600) as usize)),
                1 => out.extend((0..n).map(|_| rng.next() as u8)),
                2 => (0..n / 4).for_each(|_| {
                    out.extend_from_slice(&words[rng.below(50) as usize]);
                    out.push(b' ');
                }),
                3 => out.extend(std::iter::repeat_n(0u8, n * 10)),
                _ => {
                    let b = rng.next() as u8;
                    out.extend(std::iter::repeat_n(
                        b,
                        [3, 4, 5, 258, 259, 260][rng.below(6) as usize],
                    ));
                }
            }
        }
        out.truncate(len);
        out
    }

    fn compressed(data: &[u8], level: u32, dir: &std::path::Path) -> std::fs::File {
        use std::io::Write;
        let mut enc = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::new(level));
        enc.write_all(data).unwrap();
        let path = dir.join("f.bz2");
        std::fs::write(&path, enc.finish().unwrap()).unwrap();
        std::fs::File::open(&path).unwrap()
    }

    fn read_all(file: &std::fs::File, meta: &[u8], check: Check) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        open(file, meta, check)?.read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn every_block_decodes_to_the_input_from_its_start_and_from_every_restart_inside_it() {
        let dir = tempfile::tempdir().unwrap();
        let seeds = std::env::var("ROAR_BZ2_SEEDS").map_or(40, |v| v.parse().unwrap());
        let (mut blocks_seen, mut restarts) = (0, 0);
        for seed in 0..seeds {
            let mut rng = Rng(seed);
            let level = 1 + (seed % 9) as u32;
            let len =
                [1, 5, 1_000, 150_000, 400_000][rng.below(5) as usize] + rng.below(99) as usize;
            let data = generated(&mut rng, len);
            let f = compressed(&data, level, dir.path());
            let mut base = 0;
            for block in blocks(&f).unwrap() {
                let (bytes, inner) = decode_whole(&f, &block.meta).unwrap();
                let end = base + bytes.len();
                assert!(
                    bytes == data[base..end],
                    "seed {seed}: block at {base} differs"
                );
                let streamed = read_all(&f, &block.meta, Check::Verify).unwrap();
                assert!(
                    streamed == bytes,
                    "seed {seed}: block at {base} streamed differs"
                );
                for (off, meta) in inner {
                    let from = read_all(&f, &meta, Check::Trust).unwrap();
                    let want = &data[base + off as usize..end];
                    assert!(
                        from == want,
                        "seed {seed}: restart {off} of the block at {base}"
                    );
                    restarts += 1;
                }
                base = end;
                blocks_seen += 1;
            }
            assert_eq!(
                base,
                data.len(),
                "seed {seed}: the blocks hold all the input"
            );
        }
        assert!(
            seeds < 40 || (blocks_seen > 40 && restarts > 40),
            "{blocks_seen} blocks, {restarts} restarts"
        );
    }

    #[test]
    fn a_damaged_block_is_an_error_never_a_panic_or_other_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Rng(7);
        let data: Vec<u8> = (0..300_000).map(|_| rng.next() as u8).collect();
        let f = compressed(&data, 1, dir.path());
        let path = dir.path().join("f.bz2");
        let good = std::fs::read(&path).unwrap();
        let list = blocks(&f).unwrap();
        let mut starts = vec![0];
        for block in &list {
            let n = read_all(&f, &block.meta, Check::Verify).unwrap().len();
            starts.push(starts.last().unwrap() + n);
        }
        let (mut errors, mut trials) = (0, 0);
        for _ in 0..300 {
            let mut bad = good.clone();
            for _ in 0..1 + rng.below(2) {
                // Past the stream header and the first block's magic: the index is the good
                // file's, as a file changed under it would find.
                let at = 10 + rng.below(bad.len() as u64 - 10) as usize;
                bad[at] ^= 1 << rng.below(8);
            }
            std::fs::write(&path, &bad).unwrap();
            let f = std::fs::File::open(&path).unwrap();
            for (block, &base) in list.iter().zip(&starts) {
                trials += 1;
                let read = std::panic::catch_unwind(|| read_all(&f, &block.meta, Check::Verify));
                let Ok(out) = read.expect("a damaged block panicked the decoder") else {
                    errors += 1;
                    continue;
                };
                assert!(
                    out == data[base..base + out.len()],
                    "damaged bytes passed as good"
                );
            }
        }
        assert!(list.len() >= 3, "{} blocks", list.len());
        assert!(errors > 0 && errors < trials, "{errors} errors in {trials}");
    }

    #[test]
    fn a_magic_is_found_at_every_bit_offset() {
        let dir = tempfile::tempdir().unwrap();
        for at in [8u64, 13, 100, 8 * 1000 + 7] {
            let mut bits = Bits::default();
            bits.push(0x5a5a, (at as u32).min(16));
            for _ in 16..at {
                bits.push(0, 1);
            }
            bits.push(BLOCK_MAGIC, 48);
            // Ones after it: a check of bits the magic does not fix would fail on them.
            bits.push(0xffff, 16);
            let path = dir.path().join("f");
            std::fs::write(&path, &bits.out).unwrap();
            let found = magics(&std::fs::File::open(&path).unwrap()).unwrap();
            assert_eq!(found, [(at, false)], "at bit {at}");
        }
    }
}
