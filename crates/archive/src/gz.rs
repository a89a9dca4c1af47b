//! gzip with random access: one pass over the archive records access points (an uncompressed
//! offset, where its deflate block starts in the file, and the 32 KiB of output before it, kept
//! sparse: [`crate::gzwindow`]) every [`SPAN`] of decoding; a read at any offset resumes at the
//! point before it
//! instead of decompressing from the start. The same pass notes the stored blocks (deflate's
//! way of keeping incompressible data: images, anything compressed already), whose bytes are in
//! the file as they are: a read that falls wholly in them is a `pread`, nothing decoded.
//! Concatenated gzip members (pigz, bgzip) are followed across.
#![allow(unsafe_code)]

use std::io::{self, Read};

pub use crate::bytes::read_at_retry;
use crate::bytes::Shared;
use crate::gzcursor::split_bit;
pub use crate::gzcursor::{Cursor, Point};
use crate::gzwindow::Compactor;
use crate::inflate::{Inflater, GZIP, WINDOW};
use crate::Stored;

/// Decoding between access points, in uncompressed bytes of compressed blocks: a random read
/// decodes half of it on average. Output of stored blocks counts [`STORED_WEIGHT`] times less
/// (copied, not decoded). The index holds one window per point, sparse and compressed
/// ([`crate::gzwindow`]): a few hundred bytes where the data refers back little, up to 32 KiB.
pub const SPAN: u64 = 64 << 10;

// A point's window is made sparse from the 32 KiB of output after it, taken from the index pass
// before the next point is due.
const _: () = assert!(SPAN >= WINDOW as u64);

/// How much cheaper passing through a stored block is than decoding as many bytes.
const STORED_WEIGHT: u64 = 8;

/// [`SPAN`] in the units of `Scan::cost`.
const DUE: u64 = SPAN * STORED_WEIGHT;

const INPUT: usize = 128 * 1024;

/// The decompressed stream of a gzip file, recording access points as it is read.
pub struct Scan<R> {
    src: R,
    src_eof: bool,
    inf: Inflater,
    input: Vec<u8>,
    in_pos: usize,
    in_len: usize,
    coff: u64,
    uoff: u64,
    /// The last WINDOW bytes of output, as a ring.
    ring: Vec<u8>,
    ring_at: usize,
    /// The 8 bytes consumed before `input[0]`: a block's header may straddle a refill.
    before: [u8; 8],
    /// Where the block being read began: the file offset after its first bit's byte and how many
    /// bits of that byte are its (as [`Point::coff`] and [`Point::bits`]).
    block_at: Option<(u64, u8)>,
    /// The block being read is a stored one.
    in_stored: bool,
    stored: Vec<Stored>,
    /// Decoding since the last access point, in eighths of a byte decoded (a byte of a stored
    /// block is one, [`STORED_WEIGHT`]).
    cost: u64,
    /// The last point, with its real window, until the output after it is known.
    pending: Option<(Point, Vec<u8>)>,
    any_point: bool,
    /// A point is due inside a block: inflate is given one byte of room at a time, so it stops
    /// where [`Inflater::mark`] is exact, until it stops between two codes.
    stepping: bool,
    compact: Compactor,
    done: bool,
}

impl<R: Read> Scan<R> {
    /// The stream read from `src`; `file` is the same bytes, read at random to make the access
    /// points' windows sparse.
    pub fn new(src: R, file: Shared) -> io::Result<Scan<R>> {
        Ok(Scan {
            src,
            src_eof: false,
            inf: Inflater::new(GZIP)?,
            input: vec![0; INPUT],
            in_pos: 0,
            in_len: 0,
            coff: 0,
            uoff: 0,
            ring: Vec::with_capacity(WINDOW),
            ring_at: 0,
            before: [0; 8],
            block_at: None,
            in_stored: false,
            stored: Vec::new(),
            cost: 0,
            pending: None,
            any_point: false,
            stepping: false,
            compact: Compactor::start(file)?,
            done: false,
        })
    }

    /// The access points and stored blocks recorded so far (all of them once the stream has been
    /// read to its end).
    pub fn into_parts(mut self) -> io::Result<(Vec<Point>, Vec<Stored>)> {
        self.hand_over_pending()?;
        Ok((self.compact.finish()?, self.stored))
    }

    /// Gives the pending point to the compactor: with the output after it when that is whole
    /// (32 KiB of it, or the rest of the stream).
    fn hand_over_pending(&mut self) -> io::Result<()> {
        if let Some((point, after)) = self.pending.take() {
            let whole = after.len() == WINDOW || self.done;
            self.compact.send(point, whole.then_some(after))?;
        }
        Ok(())
    }

    /// Keeps the output after the pending point, up to 32 KiB, then hands it over.
    fn follow_pending(&mut self, out: &[u8]) -> io::Result<()> {
        if let Some((_, after)) = &mut self.pending {
            let n = out.len().min(WINDOW - after.len());
            after.extend_from_slice(&out[..n]);
            if after.len() == WINDOW {
                self.hand_over_pending()?;
            }
        }
        Ok(())
    }

    fn refill(&mut self) -> io::Result<()> {
        if self.in_pos < self.in_len || self.src_eof {
            return Ok(());
        }
        let mut last = [0u8; 16];
        last[..8].copy_from_slice(&self.before);
        let k = self.in_len.min(8);
        last[8..8 + k].copy_from_slice(&self.input[self.in_len - k..self.in_len]);
        self.before.copy_from_slice(&last[k..k + 8]);
        let n = loop {
            match self.src.read(&mut self.input) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => break r?,
            }
        };
        self.in_pos = 0;
        self.in_len = n;
        self.src_eof = n == 0;
        Ok(())
    }

    fn remember(&mut self, out: &[u8]) {
        let tail = &out[out.len().saturating_sub(WINDOW)..];
        // Fill the ring first, then overwrite its oldest bytes in at most two copies.
        let fill = tail.len().min(WINDOW - self.ring.len());
        self.ring.extend_from_slice(&tail[..fill]);
        let mut rest = &tail[fill..];
        while !rest.is_empty() {
            let n = rest.len().min(WINDOW - self.ring_at);
            self.ring[self.ring_at..self.ring_at + n].copy_from_slice(&rest[..n]);
            self.ring_at = (self.ring_at + n) % WINDOW;
            rest = &rest[n..];
        }
    }

    /// The consumed byte at file offset `at`, if it is still at hand (the buffer, and the 8
    /// bytes before it).
    fn consumed(&self, at: u64) -> Option<u8> {
        let start = self.coff - self.in_pos as u64;
        if at >= start {
            return self.input[..self.in_pos]
                .get((at - start) as usize)
                .copied();
        }
        let back = start - at;
        (back <= 8).then(|| self.before[8 - back as usize])
    }

    /// The length of the block whose header began at `block_at` and ends at the current
    /// position, if it is a stored block: its 3 header bits say so (type 00), the length and its
    /// complement that follow at the next byte boundary agree, and they end where inflate stopped.
    fn stored_block(&self, (coff, bits): (u64, u8)) -> Option<u64> {
        let p = coff * 8 - u64::from(bits);
        let lo = self.consumed(p / 8)?;
        let hi = if p % 8 > 5 {
            self.consumed(p / 8 + 1)?
        } else {
            0
        };
        let header = (u16::from(lo) | u16::from(hi) << 8) >> (p % 8);
        let lengths = (p + 3).div_ceil(8);
        if (header >> 1) & 3 != 0 || lengths + 4 != self.coff {
            return None;
        }
        let b = |i: u64| self.consumed(lengths + i);
        let len = u16::from_le_bytes([b(0)?, b(1)?]);
        let nlen = u16::from_le_bytes([b(2)?, b(3)?]);
        (len == !nlen).then_some(u64::from(len))
    }

    /// An access point here, at `coff` and `bits` of the file (inside the block whose header
    /// begins at bit `block`, if given).
    fn make_point(&mut self, coff: u64, bits: u8, block: Option<u64>) -> io::Result<()> {
        self.any_point = true;
        self.cost = 0;
        self.stepping = false;
        // Whole already: SPAN is at least the 32 KiB that follow a point.
        self.hand_over_pending()?;
        let point = Point {
            uoff: self.uoff,
            coff,
            bits,
            window: self.window(),
            block,
        };
        self.pending = Some((point, Vec::with_capacity(WINDOW)));
        Ok(())
    }

    /// After a step of inflate that stopped at a block's end or a header's: an access point when
    /// one is due; a stored block's place in the file.
    fn note_block(&mut self) -> io::Result<()> {
        if self.inf.at_block_boundary() {
            self.block_at = Some((self.coff, self.inf.pending_bits()));
            self.in_stored = false;
            if !self.any_point || self.cost >= DUE {
                self.make_point(self.coff, self.inf.pending_bits(), None)?;
            }
        } else if self.inf.at_header_end() {
            let len = self.block_at.and_then(|at| self.stored_block(at));
            self.in_stored = len.is_some();
            if let Some(len @ 1..) = len {
                self.stored.push(Stored {
                    uoff: self.uoff,
                    coff: self.coff,
                    len,
                });
            }
        }
        Ok(())
    }

    /// A point due inside a compressed block: first one step with little room (so the next
    /// mark is exact), then one at the first stop between two codes. Stored blocks wait for
    /// their end (passing through them costs little).
    fn point_inside_block(&mut self) -> io::Result<()> {
        let due = self.any_point && self.cost >= DUE && !self.in_stored;
        let Some((coff, bits)) = self.block_at.filter(|_| due) else {
            self.stepping = false;
            return Ok(());
        };
        if !self.stepping {
            self.stepping = true;
            return Ok(());
        }
        // Between blocks (None) the boundary makes the point; inside a match, step on.
        let Some((back, 0)) = self.inf.mark() else {
            return Ok(());
        };
        let code = self.coff * 8 - self.inf.held_bits() - back;
        let (code_coff, code_bits) = split_bit(code);
        self.make_point(code_coff, code_bits, Some(coff * 8 - u64::from(bits)))
    }

    fn window(&self) -> Vec<u8> {
        if self.ring.len() < WINDOW {
            return self.ring.clone();
        }
        let mut w = Vec::with_capacity(WINDOW);
        w.extend_from_slice(&self.ring[self.ring_at..]);
        w.extend_from_slice(&self.ring[..self.ring_at]);
        w
    }

    /// After the end of a gzip member: another member follows, or the file ends (zero padding
    /// after the last member is accepted, as gzip does).
    fn next_member(&mut self) -> io::Result<()> {
        self.refill()?;
        if self.in_pos == self.in_len {
            self.done = true;
            return Ok(());
        }
        if self.input[self.in_pos] == 0x1f {
            return self.inf.reset(GZIP);
        }
        // Anything else must be zeros to the end, checked as it streams by.
        loop {
            if self.input[self.in_pos..self.in_len].iter().any(|&b| b != 0) {
                break;
            }
            self.in_pos = self.in_len;
            self.refill()?;
            if self.src_eof {
                self.done = true;
                return Ok(());
            }
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "not gzip data after the member ending at byte {}",
                self.coff
            ),
        ))
    }
}

impl<R: Read> Read for Scan<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.done || out.is_empty() {
                return Ok(0);
            }
            self.refill()?;
            // No further than where the next point is due, so points are SPAN apart whatever
            // the reader's buffer.
            let per_byte = if self.in_stored { 1 } else { STORED_WEIGHT };
            // (Due already, a stored block is read to its end: no point inside one.)
            let due_in = match DUE.checked_sub(self.cost) {
                Some(left @ 1..) => left.div_ceil(per_byte) as usize,
                _ => usize::MAX,
            };
            let room = if self.stepping {
                1
            } else {
                out.len().min(due_in)
            };
            let step = self.inf.run(
                &self.input[self.in_pos..self.in_len],
                &mut out[..room],
                true,
            )?;
            self.in_pos += step.consumed;
            self.coff += step.consumed as u64;
            self.uoff += step.produced as u64;
            self.cost += step.produced as u64 * per_byte;
            self.remember(&out[..step.produced]);
            self.follow_pending(&out[..step.produced])?;
            self.note_block()?;
            self.point_inside_block()?;
            if step.end {
                self.block_at = None;
                self.next_member()?;
                if self.done {
                    self.hand_over_pending()?;
                }
            } else if step.consumed == 0 && step.produced == 0 && self.src_eof {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the gzip stream is truncated",
                ));
            }
            if step.produced > 0 {
                return Ok(step.produced);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libz_sys as z;
    use std::io::Write;

    /// Text-like runs, random runs and zeros in turns of 1 KiB to `longest`: blocks of every
    /// kind, stored ones starting at every bit offset.
    fn mixed(mut seed: u64, len: usize, longest: u64) -> Vec<u8> {
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let run = 1024 + (next() % longest) as usize;
            let kind = next() % 3;
            for _ in 0..run {
                let r = next();
                out.push(match kind {
                    0 => b"abcdefgh ,.0123"[(r % 15) as usize],
                    1 => r as u8,
                    _ => 0,
                });
            }
        }
        out.truncate(len);
        out
    }

    /// `plain` gzipped by zlib at `level`, fully flushed (an empty stored block, the stream
    /// byte-aligned) after every `flush` bytes.
    fn gzip(plain: &[u8], level: i32, flush: usize) -> Vec<u8> {
        let mut strm = crate::inflate::blank_stream();
        let size = std::mem::size_of::<z::z_stream>() as i32;
        // SAFETY: the stream is boxed (zlib keeps a pointer to it) and its fields are valid.
        let rc = unsafe {
            z::deflateInit2_(
                &mut *strm,
                level,
                z::Z_DEFLATED,
                31,
                8,
                0,
                z::zlibVersion(),
                size,
            )
        };
        assert_eq!(rc, z::Z_OK);
        let mut out = vec![0u8; plain.len() + plain.len() / 8 + 4096];
        let mut at = 0;
        for (i, chunk) in plain.chunks(flush).enumerate() {
            let last = (i + 1) * flush >= plain.len();
            strm.next_in = chunk.as_ptr().cast_mut();
            strm.avail_in = chunk.len() as u32;
            strm.next_out = out[at..].as_mut_ptr();
            strm.avail_out = (out.len() - at) as u32;
            let mode = if last { z::Z_FINISH } else { z::Z_FULL_FLUSH };
            // SAFETY: next_in and next_out point into live buffers of the lengths given.
            let rc = unsafe { z::deflate(&mut *strm, mode) };
            assert!(rc == z::Z_OK || rc == z::Z_STREAM_END, "deflate: {rc}");
            assert_eq!(strm.avail_in, 0);
            at = out.len() - strm.avail_out as usize;
        }
        // SAFETY: initialised above, ended once.
        unsafe { z::deflateEnd(&mut *strm) };
        out.truncate(at);
        out
    }

    /// Scans `gz`, checks the stream against `plain`, every stored block's bytes against the
    /// file, and a read from every access point; the points (those inside blocks apart) and the
    /// bytes found stored.
    fn check(gz: &[u8], plain: &[u8]) -> ((usize, usize), u64) {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(gz).unwrap();
        let shared: Shared = std::sync::Arc::new(file.try_clone().unwrap());
        let mut scan = Scan::new(gz, shared).unwrap();
        let mut out = Vec::new();
        scan.read_to_end(&mut out).unwrap();
        assert!(out == plain, "the scan's output differs");
        let (points, stored) = scan.into_parts().unwrap();
        let mut stored_bytes = 0;
        for s in &stored {
            let (c, u, n) = (s.coff as usize, s.uoff as usize, s.len as usize);
            assert_eq!(
                &gz[c..c + n],
                &plain[u..u + n],
                "stored block at {}",
                s.uoff
            );
            stored_bytes += s.len;
        }
        for p in &points {
            let mut cursor = Cursor::at_point(&file, p).unwrap();
            let mut got = vec![0u8; 70_000.min(plain.len() - p.uoff as usize)];
            let mut n = 0;
            while n < got.len() {
                n += cursor.read(&file, &mut got[n..]).unwrap();
            }
            assert!(
                got == plain[p.uoff as usize..][..n],
                "read from the point at {}",
                p.uoff
            );
        }
        let inside = points.iter().filter(|p| p.block.is_some()).count();
        ((points.len() - inside, inside), stored_bytes)
    }

    /// Points as dense as decoding cost asks: one at most a code (258 bytes) after the SPAN is
    /// reached, inside blocks as between them.
    fn assert_dense((between, inside): (usize, usize), len: u64, stored: u64, what: &str) {
        let cost = len - stored + stored / STORED_WEIGHT;
        let points = (between + inside) as u64;
        assert!(
            points >= cost / (SPAN + 258),
            "{what}: {points} points for {cost} bytes of decoding"
        );
        assert!(inside > 0, "{what}: no point inside a block");
    }

    #[test]
    fn stored_blocks_are_found_where_they_are_and_every_point_resumes() {
        let plain = mixed(7, 3 << 20, 40 << 10);
        let third = plain.len() as u64 / 3;
        // zlib-ng's level 1 writes fixed-code blocks only, random bytes too: no stored blocks.
        for (level, flush) in [(0, 1 << 30), (6, 1 << 30), (9, 100_003), (6, 7_777)] {
            let (points, stored) = check(&gzip(&plain, level, flush), &plain);
            eprintln!(
                "zlib level {level}, flushed every {flush}: {points:?} points, {stored} stored"
            );
            if level == 0 {
                // Everything stored; an access point only every SPAN * STORED_WEIGHT, never
                // inside a stored block.
                assert_eq!(stored, plain.len() as u64);
                let most = plain.len() as u64 / (SPAN * STORED_WEIGHT) + 1;
                assert!(points.0 as u64 <= most && points.1 == 0, "{points:?}");
            } else {
                // The random runs are kept stored: about a third of the data.
                assert!(
                    stored > third / 2 && stored < third * 2,
                    "level {level}: {stored}"
                );
                assert_dense(
                    points,
                    plain.len() as u64,
                    stored,
                    &format!("level {level}"),
                );
            }
        }
    }

    /// What most .tar.gz files are made by: GNU gzip, whose deflate is not zlib's.
    #[test]
    fn gnu_gzip_output_at_every_level() {
        let plain = mixed(9, 2 << 20, 400 << 10);
        let third = plain.len() as u64 / 3;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p"), &plain).unwrap();
        for level in ["-1", "-6", "-9"] {
            let out = std::process::Command::new("gzip")
                .args([level, "-c", "p"])
                .current_dir(dir.path())
                .output()
                .expect("gzip");
            assert!(out.status.success());
            let (points, stored) = check(&out.stdout, &plain);
            eprintln!("gzip {level}: {points:?} points, {stored} stored");
            assert!(
                stored > third / 2 && stored < third * 2,
                "gzip {level}: {stored}"
            );
            assert_dense(points, plain.len() as u64, stored, &format!("gzip {level}"));
        }
    }

    #[test]
    fn two_gzip_members_are_one_stream_with_stored_blocks_in_both() {
        let plain = mixed(11, 2 << 20, 400 << 10);
        let (a, b) = plain.split_at(800_000);
        let gz = [gzip(a, 6, 1 << 30), gzip(b, 9, 50_000)].concat();
        let (_, stored) = check(&gz, &plain);
        assert!(stored > 0);
    }
}
