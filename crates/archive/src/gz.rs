//! gzip with random access: one pass over the archive records access points (an uncompressed
//! offset, where its deflate block starts in the file, and the 32 KiB of output before it) every
//! [`SPAN`] bytes; a read at any offset resumes at the point before it instead of decompressing
//! from the start. Concatenated gzip members (pigz, bgzip) are followed across.

use std::io::{self, Read};

pub use crate::bytes::read_at_retry;
use crate::bytes::Bytes;
use crate::inflate::{Inflater, GZIP, RAW, WINDOW};

/// Uncompressed bytes between access points: a random read decompresses half of it on average
/// (about 2 ms); the index holds one window (32 KiB) per span.
pub const SPAN: u64 = 1 << 20;

const INPUT: usize = 128 * 1024;

/// Where decoding can resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    /// Offset in the uncompressed stream.
    pub uoff: u64,
    /// Offset in the file of the first byte not yet consumed at this point.
    pub coff: u64,
    /// Bits of the byte before `coff` that belong to the next block (0 to 7).
    pub bits: u8,
    /// The output before `uoff` that the next blocks may refer back to.
    pub window: Vec<u8>,
}

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
    points: Vec<Point>,
    done: bool,
}

impl<R: Read> Scan<R> {
    pub fn new(src: R) -> io::Result<Scan<R>> {
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
            points: Vec::new(),
            done: false,
        })
    }

    /// The access points recorded so far (all of them once the stream has been read to its end).
    pub fn into_points(self) -> Vec<Point> {
        self.points
    }

    fn refill(&mut self) -> io::Result<()> {
        if self.in_pos < self.in_len || self.src_eof {
            return Ok(());
        }
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
            let step = self
                .inf
                .run(&self.input[self.in_pos..self.in_len], out, true)?;
            self.in_pos += step.consumed;
            self.coff += step.consumed as u64;
            self.uoff += step.produced as u64;
            self.remember(&out[..step.produced]);
            let due = self
                .points
                .last()
                .is_none_or(|p| self.uoff - p.uoff >= SPAN);
            if self.inf.at_block_boundary() && due {
                self.points.push(Point {
                    uoff: self.uoff,
                    coff: self.coff,
                    bits: self.inf.pending_bits(),
                    window: self.window(),
                });
            }
            if step.end {
                self.next_member()?;
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

impl Cursor {
    /// A gzip stream resumed at `point`.
    pub fn at_point(file: &dyn Bytes, point: &Point) -> io::Result<Cursor> {
        let mut inf = Inflater::new(RAW)?;
        let next = point.coff;
        if point.bits > 0 {
            let mut b = [0u8];
            file.read_exact_at(&mut b, point.coff - 1)?;
            inf.prime(point.bits, b[0] >> (8 - point.bits))?;
        }
        if !point.window.is_empty() {
            inf.set_dictionary(&point.window)?;
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
            input: vec![0; INPUT],
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
            Some(end) => (end.saturating_sub(self.next) as usize).min(INPUT),
            None => INPUT,
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
        let mut scratch = vec![0u8; 64 * 1024];
        while n > 0 {
            let want = scratch.len().min(n as usize);
            let got = self.read(file, &mut scratch[..want])?;
            if got == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the compressed data ends before the member does",
                ));
            }
            n -= got as u64;
        }
        Ok(())
    }
}
