//! What an archive is read from: positioned reads over a file, or over a member of another
//! archive (an archive inside an archive). The scan, the codecs and the readers see only
//! [`Bytes`], so a nested archive is indexed and read exactly as a file is.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::Identity;

/// Positioned reads of an unchanging sequence of bytes.
pub trait Bytes: Send + Sync {
    /// Reads at `off`; fewer bytes than asked only at the end (or on a short `pread`).
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize>;

    /// How many bytes there are.
    fn size(&self) -> io::Result<u64>;

    /// What the bytes were indexed as: a change means the index no longer describes them.
    fn identity(&self) -> io::Result<Identity>;

    /// A new handle on the same bytes for one sequential reader, where that helps the kernel's
    /// readahead (a file's own open); None where it would not.
    fn reopen(&self) -> Option<Shared> {
        None
    }

    /// Fills `buf` from `off`, or fails with `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        if read_at_retry(self, buf, off)? < buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the data ends early",
            ));
        }
        Ok(())
    }
}

/// Bytes shared between the scan's threads, readers and nested archives.
pub type Shared = Arc<dyn Bytes>;

impl<B: Bytes + ?Sized> Bytes for Arc<B> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        (**self).read_at(buf, off)
    }

    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }

    fn identity(&self) -> io::Result<Identity> {
        (**self).identity()
    }

    fn reopen(&self) -> Option<Shared> {
        (**self).reopen()
    }
}

impl Bytes for File {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, off)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn identity(&self) -> io::Result<Identity> {
        Ok(Identity::of(&self.metadata()?))
    }

    /// A new open of the file behind `self` (not of whatever its path names now).
    fn reopen(&self) -> Option<Shared> {
        use std::os::fd::AsRawFd;
        let file = File::open(format!("/proc/self/fd/{}", self.as_raw_fd())).ok()?;
        Some(Arc::new(file))
    }
}

/// Reads until `buf` is full or the bytes end (retrying short and interrupted reads).
pub fn read_at_retry<B: Bytes + ?Sized>(b: &B, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match b.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A `Read + Seek` over shared bytes from an offset up to an end, by positioned reads (no
/// shared seek position).
pub struct Reader {
    bytes: Shared,
    start: u64,
    pos: u64,
    end: u64,
}

impl Reader {
    pub fn new(bytes: Shared, pos: u64, end: u64) -> Reader {
        Reader {
            bytes,
            start: pos,
            pos,
            end,
        }
    }

    /// All of `bytes`.
    pub fn whole(bytes: Shared) -> io::Result<Reader> {
        let end = bytes.size()?;
        Ok(Reader::new(bytes, 0, end))
    }
}

impl Read for Reader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min(self.end.saturating_sub(self.pos) as usize);
        let n = read_at_retry(&*self.bytes, &mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for Reader {
    /// Positions are relative to the reader's start.
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let len = self.end - self.start;
        let at = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => len.checked_add_signed(d),
            SeekFrom::Current(d) => (self.pos - self.start).checked_add_signed(d),
        }
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start"))?;
        self.pos = self.start + at;
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_reads_and_seeks_within_its_range() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        let f: Shared = Arc::new(File::open(&p).unwrap());
        let mut r = Reader::new(f, 2, 8);
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "234567");
        assert_eq!(r.seek(SeekFrom::End(-2)).unwrap(), 4);
        s.clear();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "67");
        assert!(r.seek(SeekFrom::Current(-10)).is_err());
    }
}
