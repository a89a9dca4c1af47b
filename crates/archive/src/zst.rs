//! zstd with random access by frames: every frame starts a new decoder, so each frame start is
//! an access point (no window needed). A file made by `zstd` alone is one frame (a read decodes
//! from the start); `zstd --long -T0`, pzstd and the seekable format give many.

use std::io::{self, BufReader, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::bytes::{read_at_retry, Bytes, Reader, Shared};
use crate::gz::Point;

const MAGIC: u32 = 0xFD2F_B528;

/// The zstd frames of the file, as (offset, compressed length); skippable frames left out.
pub fn frames(file: &dyn Bytes) -> io::Result<Vec<(u64, u64)>> {
    let len = file.size()?;
    let bad = |at: u64, what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not zstd data at byte {at}: {what}"),
        )
    };
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < len {
        let mut head = [0u8; 8];
        if read_at_retry(file, &mut head, at)? < 5 {
            return Err(bad(at, "truncated frame header"));
        }
        let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        if (0x184D_2A50..=0x184D_2A5F).contains(&magic) {
            let size = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
            at += 8 + u64::from(size);
            continue;
        }
        if magic != MAGIC {
            if at > 0 && head.iter().all(|&b| b == 0) {
                break;
            }
            return Err(bad(at, "no frame magic"));
        }
        let fhd = head[4];
        let single_segment = fhd & 0x20 != 0;
        let checksum = fhd & 0x04 != 0;
        let dict_len = [0u64, 1, 2, 4][usize::from(fhd & 3)];
        let fcs_len = [u64::from(single_segment), 2, 4, 8][usize::from(fhd >> 6)];
        let mut p = at + 5 + u64::from(!single_segment) + dict_len + fcs_len;
        loop {
            let mut b = [0u8; 3];
            if read_at_retry(file, &mut b, p)? < 3 {
                return Err(bad(p, "truncated block header"));
            }
            let h = u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
            let last = h & 1 != 0;
            let size = u64::from(h >> 3);
            p += 3 + match (h >> 1) & 3 {
                0 | 2 => size,
                1 => 1,
                _ => return Err(bad(p, "reserved block type")),
            };
            if last {
                break;
            }
        }
        if checksum {
            p += 4;
        }
        if p > len {
            return Err(bad(at, "the frame runs past the end of the file"));
        }
        out.push((at, p - at));
        at = p;
    }
    Ok(out)
}

type Decoder = zstd::stream::read::Decoder<'static, BufReader<Reader>>;

/// The decompressed stream of a zstd file, frame by frame, recording each frame's start.
pub struct Scan {
    file: Shared,
    frames: Vec<(u64, u64)>,
    next: usize,
    cur: Option<Decoder>,
    uoff: u64,
    points: Vec<Point>,
    /// How much of the file has been read, updated at each frame.
    read: Arc<AtomicU64>,
}

impl Scan {
    pub fn new(file: Shared, read: Arc<AtomicU64>) -> io::Result<Scan> {
        let frames = frames(&file)?;
        Ok(Scan {
            file,
            frames,
            next: 0,
            cur: None,
            uoff: 0,
            points: Vec::new(),
            read,
        })
    }

    pub fn into_points(self) -> Vec<Point> {
        self.points
    }
}

impl Read for Scan {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.cur.is_none() {
                let Some(&(at, len)) = self.frames.get(self.next) else {
                    return Ok(0);
                };
                self.next += 1;
                self.read.store(at, Ordering::Relaxed);
                self.points.push(Point {
                    uoff: self.uoff,
                    coff: at,
                    bits: 0,
                    window: Vec::new(),
                    block: None,
                });
                let src = Reader::new(self.file.clone(), at, at + len);
                self.cur = Some(Decoder::new(src)?.single_frame());
            }
            let n = self.cur.as_mut().expect("a frame is open").read(out)?;
            if n == 0 && !out.is_empty() {
                self.cur = None;
                continue;
            }
            self.uoff += n as u64;
            return Ok(n);
        }
    }
}

/// Decoding positioned at a frame start, reading on through the frames after it.
pub struct Cursor {
    dec: Decoder,
    uoff: u64,
}

impl Cursor {
    pub fn at_point(file: Shared, point: &Point) -> io::Result<Cursor> {
        let end = file.size()?;
        Ok(Cursor {
            dec: Decoder::new(Reader::new(file, point.coff, end))?,
            uoff: point.uoff,
        })
    }

    pub fn offset(&self) -> u64 {
        self.uoff
    }

    pub fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.dec.read(out)?;
        self.uoff += n as u64;
        Ok(n)
    }

    pub fn skip(&mut self, n: u64) -> io::Result<()> {
        let got = io::copy(&mut (&mut self.dec).take(n), &mut io::sink())?;
        self.uoff += got;
        if got < n {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the compressed data ends before the member does",
            ));
        }
        Ok(())
    }
}
