//! Decoding positioned in a gzip file: a stream resumed at an access point ([`Point`], found by
//! [`crate::gz::Scan`]), or one raw deflate stream (a zip member) between two file offsets.

use std::io;

use crate::bytes::{read_at_retry, Bytes};
use crate::inflate::{Inflater, GZIP, RAW, WINDOW};

/// Compressed input read at a time when resuming: a random read decodes tens of KiB.
const INPUT: usize = 32 * 1024;

/// Compressed input read at a time for a zip member, read from its start to its end.
const MEMBER_INPUT: usize = 128 * 1024;

/// Where decoding can resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    /// Offset in the uncompressed stream.
    pub uoff: u64,
    /// Offset in the file of the first byte not yet consumed at this point.
    pub coff: u64,
    /// Bits of the byte before `coff` that belong to the next block (0 to 7).
    pub bits: u8,
    /// The output before `uoff` that the next blocks may refer back to (gzip: as one zstd
    /// frame; xz and bzip2 keep their own restart state here).
    pub window: Vec<u8>,
    /// A point inside a deflate block: the bit of the file where the block's header begins
    /// (read again to rebuild its codes); `coff` and `bits` then place a code in the block.
    pub block: Option<u64>,
}

/// A bit position of the file as a [`Point`]'s `coff` and `bits`: the byte after the one the
/// bit is in, and how many bits of that byte are from the bit on.
pub fn split_bit(at: u64) -> (u64, u8) {
    let coff = at.div_ceil(8);
    (coff, (coff * 8 - at) as u8)
}

/// Decoding positioned in a compressed file: a gzip stream resumed at an access point, or one
/// raw deflate stream (a zip member) between two file offsets.
pub struct Cursor {
    inf: Inflater,
    input: Vec<u8>,
    in_pos: usize,
    in_len: usize,
    /// Where the next input comes from in the file.
    next: u64,
    /// Where the compressed data ends (a zip member), or None (to the end of the file).
    limit: Option<u64>,
    /// Following gzip members: after a raw stream ends, skip its trailer and read on.
    gzip: bool,
    /// Decoding raw deflate (resumed mid-member): the member's trailer is not consumed by zlib.
    raw_mode: bool,
    uoff: u64,
    done: bool,
}

/// Feeds `inf` the `bits` bits before file offset `coff`.
fn prime_at(file: &dyn Bytes, inf: &mut Inflater, coff: u64, bits: u8) -> io::Result<()> {
    if bits > 0 {
        let mut b = [0u8];
        file.read_exact_at(&mut b, coff - 1)?;
        inf.prime(bits, b[0] >> (8 - bits))?;
    }
    Ok(())
}

/// Reads the header of the deflate block that begins at bit `block` of the file into `inf`,
/// which then decodes that block's codes.
fn read_header(file: &dyn Bytes, inf: &mut Inflater, block: u64) -> io::Result<()> {
    let (mut at, bits) = split_bit(block);
    prime_at(file, inf, at, bits)?;
    // A dynamic block's header is at most ~300 bytes.
    let mut buf = [0u8; 512];
    let mut none = [0u8; 0];
    loop {
        let n = read_at_retry(file, &mut buf, at)?;
        let step = inf.run(&buf[..n], &mut none, true)?;
        at += step.consumed as u64;
        if inf.at_header_end() {
            return Ok(());
        }
        if step.consumed == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "no deflate block header where the index has one",
            ));
        }
    }
}

impl Cursor {
    /// A gzip stream resumed at `point`.
    pub fn at_point(file: &dyn Bytes, point: &Point) -> io::Result<Cursor> {
        if point.window.is_empty() {
            return Cursor::resume(file, point, &[]);
        }
        // Taken out while in use, not borrowed: resuming reads `file`, which may be a member of
        // another gzip archive, resumed on this thread in turn.
        let (mut zstd, mut window) = match WINDOWS.take() {
            Some(held) => held,
            None => (zstd::bulk::Decompressor::new()?, Vec::new()),
        };
        window.resize(WINDOW, 0);
        let n = zstd.decompress_to_buffer(&point.window[..], &mut window[..])?;
        let cursor = Cursor::resume(file, point, &window[..n]);
        WINDOWS.set(Some((zstd, window)));
        cursor
    }

    /// A gzip stream resumed at `point` with `window` (uncompressed) before it.
    pub fn resume(file: &dyn Bytes, point: &Point, window: &[u8]) -> io::Result<Cursor> {
        let mut inf = Inflater::new(RAW)?;
        let next = point.coff;
        if let Some(block) = point.block {
            read_header(file, &mut inf, block)?;
            inf.drop_held_bits()?;
        }
        prime_at(file, &mut inf, point.coff, point.bits)?;
        if !window.is_empty() {
            inf.set_dictionary(window)?;
        }
        Ok(Cursor {
            inf,
            input: vec![0; INPUT],
            in_pos: 0,
            in_len: 0,
            next,
            limit: None,
            gzip: true,
            raw_mode: true,
            uoff: point.uoff,
            done: false,
        })
    }

    /// One raw deflate stream stored in `[start, end)` of the file.
    pub fn deflate(start: u64, end: u64) -> io::Result<Cursor> {
        Ok(Cursor {
            inf: Inflater::new(RAW)?,
            input: vec![0; MEMBER_INPUT],
            in_pos: 0,
            in_len: 0,
            next: start,
            limit: Some(end),
            gzip: false,
            raw_mode: true,
            uoff: 0,
            done: false,
        })
    }

    /// The uncompressed offset the next read starts at.
    pub fn offset(&self) -> u64 {
        self.uoff
    }

    fn refill(&mut self, file: &dyn Bytes) -> io::Result<bool> {
        if self.in_pos < self.in_len {
            return Ok(true);
        }
        let want = match self.limit {
            Some(end) => (end.saturating_sub(self.next) as usize).min(self.input.len()),
            None => self.input.len(),
        };
        let n = read_at_retry(file, &mut self.input[..want], self.next)?;
        self.next += n as u64;
        self.in_pos = 0;
        self.in_len = n;
        Ok(n > 0)
    }

    /// The uncompressed bytes from [`Cursor::offset`]; 0 at the end of the data.
    pub fn read(&mut self, file: &dyn Bytes, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.done || out.is_empty() {
                return Ok(0);
            }
            let more = self.refill(file)?;
            let step = self
                .inf
                .run(&self.input[self.in_pos..self.in_len], out, false)?;
            self.in_pos += step.consumed;
            self.uoff += step.produced as u64;
            if step.end {
                self.end_of_stream(file)?;
            } else if !more && step.produced == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the compressed data is truncated",
                ));
            }
            if step.produced > 0 {
                return Ok(step.produced);
            }
        }
    }

    /// A raw stream ended: a zip member is done; in gzip, the member's trailer (8 bytes) is
    /// skipped and the next member, if any, is read with its header.
    fn end_of_stream(&mut self, file: &dyn Bytes) -> io::Result<()> {
        if !self.gzip {
            self.done = true;
            return Ok(());
        }
        let at = self.next - (self.in_len - self.in_pos) as u64;
        // Resumed in raw mode the trailer is still ahead; in gzip mode inflate consumed it.
        let after = if self.raw_mode { at + 8 } else { at };
        self.next = after;
        self.in_pos = 0;
        self.in_len = 0;
        let mut magic = [0u8; 2];
        if read_at_retry(file, &mut magic, after)? < 2 || magic != [0x1f, 0x8b] {
            // The end, or the zero padding `Scan` accepts there.
            self.done = true;
            return Ok(());
        }
        self.raw_mode = false;
        self.inf.reset(GZIP)
    }

    /// Skips `n` uncompressed bytes.
    pub fn skip(&mut self, file: &dyn Bytes, mut n: u64) -> io::Result<()> {
        // Taken out while in use, as the window above: skipping in a nested archive skips in the
        // one that holds it.
        let mut scratch = SCRATCH.take();
        if scratch.is_empty() {
            scratch = vec![0; 64 * 1024];
        }
        let skipped = self.skip_into(file, &mut n, &mut scratch);
        SCRATCH.set(scratch);
        skipped
    }

    fn skip_into(&mut self, file: &dyn Bytes, n: &mut u64, scratch: &mut [u8]) -> io::Result<()> {
        while *n > 0 {
            let want = scratch.len().min(*n as usize);
            let got = self.read(file, &mut scratch[..want])?;
            if got == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the compressed data ends before the member does",
                ));
            }
            *n -= got as u64;
        }
        Ok(())
    }
}

/// A decompression context and room for a window, reused by the resumes on a thread (a fresh
/// zstd context per read cost ~7 % of a random member's read).
type Windows = Option<(zstd::bulk::Decompressor<'static>, Vec<u8>)>;

thread_local! {
    static WINDOWS: std::cell::RefCell<Windows> = const { std::cell::RefCell::new(None) };
    /// Where skipped output goes, allocated once per thread.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}
