//! The windows of gzip's access points, kept small. A point's window (the 32 KiB of output
//! before it) matters only where the output after it refers back into it, and deflate refers at
//! most 32 KiB back, so only the first 32 KiB after the point can. Which window bytes those are
//! is found with zlib alone, by decoding that stretch twice more with the window replaced by a
//! probe: once by the low byte of each position, once by its high byte. An output byte that came
//! from the window differs from the real output in one probe or the other, and then the two
//! probes spell the position it came from. Those positions keep the window's bytes; every other
//! position gets the low-byte pattern, which compresses to almost nothing (the whole is kept as
//! one zstd frame). The result decodes exactly as the real window does: a position the output
//! took a byte from is either kept, or was not seen to differ — so its real byte *is* the
//! pattern's. (The idea is rapidgzip's sparse windows; it finds them in its own inflater.)
//!
//! Data that refers back little (anything compressed already: images, audio) leaves a window of
//! a few hundred bytes, so access points can be dense. The work runs on a thread of its own
//! beside the index pass ([`Compactor`]).

use std::io;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use crate::bytes::{Bytes, Shared};
use crate::gzcursor::{Cursor, Point};
use crate::inflate::WINDOW;

/// What making windows sparse reuses from one to the next: the probes and a zstd context.
pub struct Sparse {
    low: Vec<u8>,
    high: Vec<u8>,
    zstd: zstd::bulk::Compressor<'static>,
}

/// Output compared this many bytes at a time: most of it is the same in the three decodes.
const RUN: usize = 64;

impl Sparse {
    pub fn new() -> io::Result<Sparse> {
        Ok(Sparse {
            low: (0..WINDOW).map(|i| i as u8).collect(),
            high: (0..WINDOW).map(|i| (i >> 8) as u8).collect(),
            zstd: zstd::bulk::Compressor::new(1)?,
        })
    }

    /// The compressed sparse window of `point`, whose real window is `window`; `after` is the
    /// real output that follows the point, up to [`WINDOW`] bytes (fewer only where the stream
    /// ends), or None to decode it here.
    pub fn window(
        &mut self,
        file: &dyn Bytes,
        point: &Point,
        window: &[u8],
        after: Option<Vec<u8>>,
    ) -> io::Result<Vec<u8>> {
        if window.is_empty() {
            return Ok(Vec::new());
        }
        let real = match after {
            Some(after) => after,
            None => decode(file, point, window, WINDOW)?,
        };
        let (low, high) = (&self.low[..window.len()], &self.high[..window.len()]);
        let by_low = decode(file, point, low, real.len())?;
        let by_high = decode(file, point, high, real.len())?;
        if by_low.len() != real.len() || by_high.len() != real.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the gzip stream decodes differently from the same access point",
            ));
        }
        let mut kept = low.to_vec();
        let runs = real
            .chunks(RUN)
            .zip(by_low.chunks(RUN))
            .zip(by_high.chunks(RUN));
        for ((r, l), h) in runs.filter(|((r, l), h)| r != l || r != h) {
            for ((&r, &l), &h) in r.iter().zip(l).zip(h) {
                if r != l || r != h {
                    let at = usize::from(l) | usize::from(h) << 8;
                    kept[at] = window[at];
                }
            }
        }
        let mut frame = self.zstd.compress(&kept)?;
        // Allocated for the worst case (more than 32 KiB); thousands are kept.
        frame.shrink_to_fit();
        Ok(frame)
    }
}

/// Up to `len` bytes of output after `point`, decoded with `window` before it.
fn decode(file: &dyn Bytes, point: &Point, window: &[u8], len: usize) -> io::Result<Vec<u8>> {
    let mut cursor = Cursor::resume(file, point, window)?;
    let mut out = vec![0u8; len];
    let mut n = 0;
    while n < len {
        match cursor.read(file, &mut out[n..])? {
            0 => break,
            k => n += k,
        }
    }
    out.truncate(n);
    Ok(out)
}

/// An access point with its real window, and the output after it when the index pass has it.
struct Job {
    point: Point,
    after: Option<Vec<u8>>,
}

/// Makes points' windows sparse on a thread beside the index pass, in the order given.
pub struct Compactor {
    tx: Option<SyncSender<Job>>,
    worker: Option<JoinHandle<io::Result<Vec<Point>>>>,
}

/// Points waiting for the worker: bounds the real windows held at once (32 KiB each).
const QUEUE: usize = 64;

impl Compactor {
    pub fn start(file: Shared) -> io::Result<Compactor> {
        let (tx, rx) = sync_channel(QUEUE);
        let worker = std::thread::Builder::new()
            .name("gzip windows".into())
            .spawn(move || compact(&*file, rx))?;
        Ok(Compactor {
            tx: Some(tx),
            worker: Some(worker),
        })
    }

    /// Hands over `point` (its `window` the real one) and the output after it, if known.
    pub fn send(&mut self, point: Point, after: Option<Vec<u8>>) -> io::Result<()> {
        let tx = self.tx.as_ref().expect("a compactor still taking points");
        if tx.send(Job { point, after }).is_err() {
            // The worker stopped on an error: it is what to report.
            return Err(self
                .join()
                .err()
                .unwrap_or_else(|| io::Error::other("the gzip window thread stopped early")));
        }
        Ok(())
    }

    /// Every point handed over, with its window made sparse.
    pub fn finish(mut self) -> io::Result<Vec<Point>> {
        self.join()
    }

    /// Closes the queue (the worker ends once it has drained it) and waits for the worker.
    fn join(&mut self) -> io::Result<Vec<Point>> {
        self.tx = None;
        let worker = self.worker.take().expect("joined once");
        worker
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the gzip window thread panicked")))
    }
}

fn compact(file: &dyn Bytes, rx: Receiver<Job>) -> io::Result<Vec<Point>> {
    let mut points = Vec::new();
    let mut sparse = Sparse::new()?;
    for Job { mut point, after } in rx {
        point.window = sparse.window(file, &point, &point.window, after)?;
        points.push(point);
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A point at the start of a raw deflate stream, with `window` before it.
    fn raw_point(window: &[u8]) -> Point {
        Point {
            uoff: 0,
            coff: 0,
            bits: 0,
            window: window.to_vec(),
            block: None,
        }
    }

    #[test]
    fn a_window_nothing_refers_to_keeps_none_of_its_bytes() {
        // A stored block: five header bytes and the data, nothing referred to.
        let data = b"plain bytes";
        let mut block = vec![1u8, data.len() as u8, 0, !(data.len() as u8), 0xff];
        block.extend_from_slice(data);
        let file = tempfile::tempfile().unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &block, 0).unwrap();
        let window: Vec<u8> = (0..WINDOW).map(|i| (i * 7 + 3) as u8).collect();
        let point = raw_point(&window);
        let kept = zstd::bulk::decompress(
            &Sparse::new()
                .unwrap()
                .window(&file, &point, &window, None)
                .unwrap(),
            WINDOW,
        )
        .unwrap();
        let pattern: Vec<u8> = (0..WINDOW).map(|i| i as u8).collect();
        assert_eq!(kept, pattern);
    }
}
