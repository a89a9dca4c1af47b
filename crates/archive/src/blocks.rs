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

pub use crate::block::{Block, Check, Inner};
use crate::bytes::{Bytes, Shared};
use crate::gz::Point;

/// One codec of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Xz,
    Bz2,
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

    /// The decoded bytes of the block at `point` from there (its start, or a point inside it).
    fn open(self, file: &Shared, point: &Point, check: Check) -> io::Result<Box<dyn Read + Send>> {
        match self {
            Codec::Xz => crate::xz::open(file, point.coff, &point.window, check),
            Codec::Bz2 => crate::bz2::open(file, &point.window, check),
        }
    }

    /// The block at `point` decoded whole and verified, with the access points inside it
    /// (bytes of the block before each, and its meta): bzip2 notes where its walk can restart.
    fn decode_whole(self, file: &Shared, point: &Point) -> Decoded {
        match self {
            Codec::Xz => {
                let mut out = Vec::new();
                self.open(file, point, Check::Verify)?
                    .read_to_end(&mut out)?;
                Ok((out, Vec::new()))
            }
            Codec::Bz2 => crate::bz2::decode_whole(file, &point.window),
        }
    }

    /// Whether `point` is where a block starts (not a point inside one).
    pub fn starts_block(self, point: &Point) -> bool {
        match self {
            Codec::Xz => true,
            Codec::Bz2 => crate::bz2::starts_block(&point.window),
        }
    }
}

fn point(block: &Block, uoff: u64) -> Point {
    Point {
        uoff,
        coff: block.start_bit / 8,
        bits: (block.start_bit % 8) as u8,
        window: block.meta.clone(),
        block: None,
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

    /// The decoded bytes of the next block (at `point`): from the workers, or decoded here
    /// (whole for bzip2, whose blocks are at most ~46 MB and note restart points as they
    /// decode; streamed for xz, whose one block may be the whole file); with the access points
    /// inside it.
    fn open_block(&mut self, point: &Point) -> io::Result<(Box<dyn Read + Send>, Inner)> {
        let (bytes, inner) = match self.ahead.as_mut() {
            Some(ahead) => ahead.next()?,
            None if self.codec == Codec::Bz2 => self.codec.decode_whole(&self.file, point)?,
            None => {
                return Ok((
                    self.codec.open(&self.file, point, Check::Verify)?,
                    Vec::new(),
                ))
            }
        };
        Ok((Box::new(io::Cursor::new(bytes)), inner))
    }
}

/// A block's decoded bytes and the access points inside it, from a worker.
type Decoded = io::Result<(Vec<u8>, Inner)>;
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
                let decoded = codec.decode_whole(&file, &point);
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
    fn next(&mut self) -> Decoded {
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
                let (dec, inner) = self.open_block(&point)?;
                self.cur = Some((dec, size, 0));
                let inside = inner.into_iter().map(|(off, window)| Point {
                    uoff: point.uoff + off,
                    window,
                    ..point.clone()
                });
                let inside: Vec<Point> = inside.collect();
                self.points.push(point);
                self.points.extend(inside);
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
                // The block ended: on into the next one, past the points inside this one.
                self.next = self.next_block();
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

    /// The index of the first point from `next` on that starts a block.
    fn next_block(&self) -> usize {
        let rest = &self.points[self.next.min(self.points.len())..];
        self.next
            + rest
                .iter()
                .take_while(|p| !self.codec.starts_block(p))
                .count()
    }

    pub fn skip(&mut self, mut n: u64) -> io::Result<()> {
        // Within the current block, decoding goes on (its symbols are decoded already); past
        // its end, whole blocks are passed over without decoding: the last access point before
        // the target says where the stream is there.
        let target = self.uoff + n;
        if self
            .points
            .get(self.next_block())
            .is_some_and(|p| p.uoff <= target)
        {
            let last =
                self.next + self.points[self.next..].partition_point(|p| p.uoff <= target) - 1;
            let p = &self.points[last];
            self.dec = Some(self.codec.open(&self.file, p, Check::Trust)?);
            self.uoff = p.uoff;
            self.next = last + 1;
            n = target - p.uoff;
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
