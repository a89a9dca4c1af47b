//! Compressed streams made of blocks that decode on their own — xz blocks (`xz -T0`, pixz),
//! bzip2 blocks (every bzip2 file: 100–900 kB of input each) — read with random access: every
//! block start is an access point, and a block is decoded as a complete stream of its own
//! ([`crate::xz`], [`crate::bz2`] write that stream around the block's bytes, so the codec's own
//! integrity checks run on every block read). An access point's `window` holds what decoding
//! its block alone needs (its codec's [`Block::meta`]).

use std::collections::VecDeque;
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use crate::bytes::{Bytes, Shared};
use crate::gz::Point;

/// A block of the file, before decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Where it starts in the file, in bits (xz blocks start on a byte).
    pub start_bit: u64,
    /// Its decoded size when the file says so before decoding (xz's index), else None.
    pub size: Option<u64>,
    /// What decoding it alone needs, kept as the access point's `window`.
    pub meta: Vec<u8>,
}

/// One codec of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Xz,
    Bz2,
}

/// Whether a block's integrity check is verified as it is decoded: on the index pass, always
/// (every block once); for a read of members, xz's is not (it re-hashes the block's bytes up to
/// the member at every random read: an eighth of the decoding), as no stored member's bytes are
/// checked either — a change to the file is caught by its identity at each open. bzip2 checks
/// each block's CRC as part of decoding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Verify,
    Trust,
}

impl Codec {
    /// The block codec of an archive format, if it has one.
    pub fn of(format: crate::Format) -> Option<Codec> {
        match format {
            crate::Format::TarXz => Some(Codec::Xz),
            crate::Format::TarBz2 => Some(Codec::Bz2),
            _ => None,
        }
    }

    /// The file's blocks, in order.
    pub fn blocks(self, file: &dyn Bytes) -> io::Result<Vec<Block>> {
        match self {
            Codec::Xz => crate::xz::blocks(file),
            Codec::Bz2 => crate::bz2::blocks(file),
        }
    }

    /// The decoded bytes of the block at `point`, alone.
    fn open(self, file: &Shared, point: &Point, check: Check) -> io::Result<Box<dyn Read + Send>> {
        match self {
            Codec::Xz => crate::xz::open(file, point.coff, &point.window, check),
            Codec::Bz2 => crate::bz2::open(file, &point.window),
        }
    }
}

fn point(block: &Block, uoff: u64) -> Point {
    Point {
        uoff,
        coff: block.start_bit / 8,
        bits: (block.start_bit % 8) as u8,
        window: block.meta.clone(),
    }
}

/// The decompressed stream, block by block, recording each block's start as an access point.
/// Blocks are decoded ahead on worker threads where each fits in memory ([`Ahead`]): the index
/// pass is bound by decoding, and blocks decode independently.
pub struct Scan {
    codec: Codec,
    file: Shared,
    blocks: Vec<Block>,
    next: usize,
    cur: Option<(Box<dyn Read + Send>, Option<u64>, u64)>,
    uoff: u64,
    points: Vec<Point>,
    /// How much of the file has been read, updated at each block.
    read: Arc<AtomicU64>,
    ahead: Option<Ahead>,
}

/// The most one block may decode to for it to be decoded ahead, whole, in memory: an xz block
/// says its size in the index (`xz -T0` writes 3x the dictionary: 24 MiB at -6, pixz 8 MiB); a
/// bzip2 block decodes to at most ~46 MB (900 kB of runs of 4 expanded to 255 each).
const AHEAD_MAX_BLOCK: u64 = 64 << 20;

impl Scan {
    pub fn new(codec: Codec, file: Shared, read: Arc<AtomicU64>) -> io::Result<Scan> {
        let blocks = codec.blocks(&file)?;
        let bounded = blocks
            .iter()
            .all(|b| b.size.map_or(codec == Codec::Bz2, |s| s <= AHEAD_MAX_BLOCK));
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
        let ahead = (bounded && blocks.len() > 1 && workers > 1)
            .then(|| Ahead::start(codec, &file, &blocks, workers));
        Ok(Scan {
            codec,
            file,
            blocks,
            next: 0,
            cur: None,
            uoff: 0,
            points: Vec::new(),
            read,
            ahead,
        })
    }

    pub fn into_points(self) -> Vec<Point> {
        self.points
    }

    /// The decoded bytes of the next block (at `point`): from the workers, or decoded here.
    fn open_block(&mut self, point: &Point) -> io::Result<Box<dyn Read + Send>> {
        match self.ahead.as_mut() {
            Some(ahead) => Ok(Box::new(io::Cursor::new(ahead.next()?))),
            None => self.codec.open(&self.file, point, Check::Verify),
        }
    }
}

/// A block's decoded bytes, from a worker.
type Decoded = io::Result<Vec<u8>>;
/// A worker's job: a block's access point, and where its bytes go.
type Job = (Point, mpsc::SyncSender<Decoded>);

/// Blocks decoded on worker threads, each whole into memory, handed over in file order; at most
/// `workers + 1` are in flight (decoding or decoded and not yet taken). Dropped, the workers end
/// after the block each is decoding.
struct Ahead {
    /// Jobs for the workers.
    work: Option<mpsc::Sender<Job>>,
    /// The blocks not yet handed out, each with its result to come, in order.
    pending: VecDeque<mpsc::Receiver<Decoded>>,
    /// Access points of the blocks not yet given to a worker.
    queue: VecDeque<Point>,
}

impl Ahead {
    fn start(codec: Codec, file: &Shared, blocks: &[Block], workers: usize) -> Ahead {
        let (work, jobs) = mpsc::channel::<Job>();
        let jobs = Arc::new(Mutex::new(jobs));
        for _ in 0..workers {
            let (jobs, file) = (jobs.clone(), file.clone());
            std::thread::spawn(move || loop {
                let job = jobs.lock().expect("the block queue").recv();
                let Ok((point, done)) = job else {
                    return;
                };
                let decoded = codec
                    .open(&file, &point, Check::Verify)
                    .and_then(|mut dec| {
                        let mut out = Vec::new();
                        dec.read_to_end(&mut out).map(|_| out)
                    });
                // The scan may be gone (an error elsewhere): nothing is waiting then.
                let _ = done.send(decoded);
            });
        }
        let mut ahead = Ahead {
            work: Some(work),
            pending: VecDeque::new(),
            // The uncompressed offset is the scan's to set: a worker needs only where the block
            // is and how to decode it.
            queue: blocks.iter().map(|b| point(b, 0)).collect(),
        };
        for _ in 0..=workers {
            ahead.hand_out();
        }
        ahead
    }

    /// Gives the next block to a worker, if any is left.
    fn hand_out(&mut self) {
        let (Some(point), Some(work)) = (self.queue.pop_front(), self.work.as_ref()) else {
            return;
        };
        let (done, result) = mpsc::sync_channel(1);
        if work.send((point, done)).is_ok() {
            self.pending.push_back(result);
        }
    }

    /// The next block's decoded bytes, in file order.
    fn next(&mut self) -> io::Result<Vec<u8>> {
        let result = self.pending.pop_front().ok_or_else(|| {
            io::Error::other("a block was asked for beyond the last one handed out")
        })?;
        self.hand_out();
        result
            .recv()
            .map_err(|_| io::Error::other("a block decoder thread ended without its block"))?
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        // Closing the queue ends each worker at its next job.
        self.work = None;
    }
}

impl Read for Scan {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.cur.is_none() {
                let Some(block) = self.blocks.get(self.next) else {
                    return Ok(0);
                };
                let size = block.size;
                self.next += 1;
                self.read.store(block.start_bit / 8, Ordering::Relaxed);
                let point = point(block, self.uoff);
                let dec = self.open_block(&point)?;
                self.cur = Some((dec, size, 0));
                self.points.push(point);
            }
            let (dec, size, got) = self.cur.as_mut().expect("a block is open");
            let n = dec.read(out)?;
            if n == 0 && !out.is_empty() {
                if size.is_some_and(|s| s != *got) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "block {} decodes to {got} bytes where the index says {}",
                            self.next - 1,
                            size.unwrap_or(0)
                        ),
                    ));
                }
                self.cur = None;
                continue;
            }
            *got += n as u64;
            self.uoff += n as u64;
            return Ok(n);
        }
    }
}

/// Decoding positioned at a block start, reading on through the blocks after it.
pub struct Cursor {
    codec: Codec,
    file: Shared,
    /// The access points from the one decoding started at; `next` indexes the block after the
    /// current one.
    points: Vec<Point>,
    next: usize,
    dec: Option<Box<dyn Read + Send>>,
    uoff: u64,
}

impl Cursor {
    /// At the access point `points[0]`, the points after it the blocks to read on into.
    pub fn at_point(codec: Codec, file: Shared, points: &[Point]) -> io::Result<Cursor> {
        let first = points.first().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "no access point in the index")
        })?;
        Ok(Cursor {
            codec,
            dec: Some(codec.open(&file, first, Check::Trust)?),
            uoff: first.uoff,
            file,
            points: points.to_vec(),
            next: 1,
        })
    }

    pub fn offset(&self) -> u64 {
        self.uoff
    }

    pub fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(dec) = self.dec.as_mut() else {
                return Ok(0);
            };
            let n = dec.read(out)?;
            if n == 0 && !out.is_empty() {
                self.dec = match self.points.get(self.next) {
                    Some(p) => Some(self.codec.open(&self.file, p, Check::Trust)?),
                    None => None,
                };
                self.next += 1;
                continue;
            }
            self.uoff += n as u64;
            return Ok(n);
        }
    }

    pub fn skip(&mut self, mut n: u64) -> io::Result<()> {
        // Whole blocks are passed over without decoding: the next access point says where the
        // stream is after them.
        while let Some(p) = self.points.get(self.next) {
            if p.uoff > self.uoff + n {
                break;
            }
            n -= p.uoff - self.uoff;
            self.uoff = p.uoff;
            self.dec = Some(self.codec.open(&self.file, p, Check::Trust)?);
            self.next += 1;
        }
        if n == 0 {
            // Every read of a member read front to back: no buffer to allocate.
            return Ok(());
        }
        let mut buf = vec![0u8; 64 * 1024];
        while n > 0 {
            let want = buf.len().min(n as usize);
            match self.read(&mut buf[..want])? {
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the compressed data ends before the member does",
                    ))
                }
                k => n -= k as u64,
            }
        }
        Ok(())
    }
}
