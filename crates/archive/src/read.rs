//! A member's bytes at any offset. Stored members are read with `pread` from the archive;
//! members of a compressed stream by decoding from the access point before the offset; deflated
//! zip members from their start. A reader keeps its decoder between reads, so reading a member
//! front to back decodes it once.

use std::fs::File;
use std::io::{self, Read};
use std::sync::{Arc, Mutex};

use crate::bytes::{read_at_retry, Bytes, Shared};
use crate::gz;
use crate::{blocks, zst, Data, Format, Index, Member};

/// An indexed archive, open for reading members.
pub struct Source {
    pub index: Index,
    file: Shared,
    /// Decoders of the compressed stream left by readers that are done, each positioned where
    /// its reader stopped: a member further on starts from there instead of from an access point
    /// (reading members in archive order, as WebDataset loaders do, decodes the stream once).
    parked: Mutex<Vec<Decoder>>,
    /// How many decoders are kept ([`parked_limit`]).
    parked_limit: usize,
}

/// Roughly the memory parked decoders may hold together.
const PARKED_BYTES: u64 = 64 << 20;

/// How many decoders to keep for `index`'s archive: as many as [`PARKED_BYTES`] holds, each
/// taken to hold up to one stretch between access points (an xz or bzip2 block: its decoded
/// window), a zstd window (8 MiB by default), or gzip's 32 KiB and buffers (counted as 1 MiB);
/// 4 to 64. Random reads spread over many blocks find a decoder already inside their block
/// more often the more are kept (1,000 random members of 500 xz blocks of 1 MiB: 3.95 s with 4,
/// 3.40 s with 64).
fn parked_limit(index: &Index) -> usize {
    let per = match index.format {
        Format::TarXz => index.longest_stretch(),
        // The inverse transform's table: 4 bytes per symbol, up to 900,000 symbols a block.
        Format::TarBz2 => 3_600_000,
        Format::TarZst => 8 << 20,
        _ => 1 << 20,
    };
    (PARKED_BYTES / per.max(1 << 20)).clamp(4, 64) as usize
}

impl Source {
    /// Opens the archive the index describes; an error if it is no longer that file.
    pub fn open(index: Index) -> io::Result<Source> {
        let file = File::open(&index.archive)?;
        Source::over(index, Arc::new(file))
    }

    /// The archive the index describes, read from `bytes` (a file, or a member of another
    /// archive); an error if they are no longer what was indexed.
    pub fn over(index: Index, bytes: Shared) -> io::Result<Source> {
        let source = Source {
            parked_limit: parked_limit(&index),
            index,
            file: bytes,
            parked: Mutex::new(Vec::new()),
        };
        if source.changed() {
            return Err(io::Error::other(format!(
                "{} changed since it was indexed",
                source.index.archive.display()
            )));
        }
        Ok(source)
    }

    /// Whether the archive file is no longer what was indexed (rewritten in place or replaced
    /// data under the same inode): its members cannot be served as recorded.
    pub fn changed(&self) -> bool {
        self.file
            .identity()
            .map_or(true, |now| now != self.index.identity)
    }

    /// A reader of entry `member` (a member, or an earlier version: [`Index::entry`]), starting
    /// from the best parked decoder if one is behind it.
    pub fn reader(&self, member: usize) -> MemberReader {
        let member = self.index.entry(member).clone();
        // A stored member gets its own open of the archive (the same inode, through /proc): the
        // kernel's readahead follows each reader's sequential reads instead of seeing every
        // reader's offsets interleaved on one shared descriptor.
        let own = match member.data {
            Data::Raw { .. } => self.file.reopen(),
            _ => None,
        };
        let mut decoder = Decoder::None;
        if let Data::Stream { offset } = member.data {
            let mut parked = self.parked.lock().expect("parked decoders");
            let best = (0..parked.len())
                .filter(|&i| self.worth_reusing(&parked[i], offset))
                .max_by_key(|&i| parked[i].offset());
            if let Some(i) = best {
                decoder = parked.remove(i);
            }
        }
        MemberReader {
            member,
            decoder,
            own,
        }
    }

    /// Takes back a reader that is done, keeping its decoder for a later member.
    pub fn park(&self, reader: MemberReader) {
        if matches!(reader.member.data, Data::Stream { .. }) {
            self.park_decoder(reader.decoder);
        }
    }

    /// How many decoders are parked for later members.
    pub fn parked(&self) -> usize {
        self.parked.lock().expect("parked decoders").len()
    }

    /// Keeps a decoder of the compressed stream for a later member.
    fn park_decoder(&self, decoder: Decoder) {
        if !matches!(
            decoder,
            Decoder::Inflate(_) | Decoder::Zstd(_) | Decoder::Blocks(_)
        ) {
            return;
        }
        let mut parked = self.parked.lock().expect("parked decoders");
        if parked.len() >= self.parked_limit {
            // The one parked longest ago (kept in the order they were parked).
            parked.remove(0);
        }
        parked.push(decoder);
    }

    /// Whether decoding on from `decoder` to `target` costs less than from the access point
    /// before `target`. A decoder inside a bzip2 block is reused anywhere later in the block:
    /// opening at a point inside it would decode the block's symbols again, walking on does not.
    fn worth_reusing(&self, decoder: &Decoder, target: u64) -> bool {
        let point = match blocks::Codec::of(self.index.format) {
            Some(codec) => self
                .index
                .point_before_where(target, |p| codec.starts_block(p)),
            None => self.index.point_before(target),
        }
        .map_or(0, |p| p.uoff);
        let at = decoder.offset();
        at <= target && at >= point
    }
}

enum Decoder {
    None,
    Inflate(gz::Cursor),
    Zstd(zst::Cursor),
    Blocks(blocks::Cursor),
}

impl Decoder {
    fn offset(&self) -> u64 {
        match self {
            Decoder::Inflate(c) => c.offset(),
            Decoder::Zstd(c) => c.offset(),
            Decoder::Blocks(c) => c.offset(),
            Decoder::None => 0,
        }
    }
}

/// Reads one member; keeps its decoder positioned after the last read.
pub struct MemberReader {
    member: Member,
    decoder: Decoder,
    /// The reader's own open of the archive, for stored members.
    own: Option<Shared>,
}

impl MemberReader {
    /// Fills `buf` from offset `off` of the member, short only at its end.
    pub fn read_at(&mut self, src: &Source, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let m = &self.member;
        if off >= m.size {
            return Ok(0);
        }
        let len = buf.len().min((m.size - off) as usize);
        let buf = &mut buf[..len];
        let file = &src.file;
        match m.data {
            Data::Raw { offset } => {
                read_at_retry(&**self.own.as_ref().unwrap_or(file), buf, offset + off)
            }
            Data::Stream { offset } => {
                let target = offset + off;
                if let Some(pieces) = src.index.stored_at(target, buf.len() as u64) {
                    // Stored as they are (incompressible data in xz or gzip): nothing to decode.
                    return read_pieces(&**self.own.as_ref().unwrap_or(file), &pieces, buf);
                }
                let positioned = !matches!(self.decoder, Decoder::None)
                    && src.worth_reusing(&self.decoder, target);
                if !positioned {
                    let point = src.index.point_before(target).ok_or_else(|| {
                        io::Error::new(io::ErrorKind::InvalidData, "no access point in the index")
                    })?;
                    self.decoder = match src.index.format {
                        Format::TarZst => {
                            Decoder::Zstd(zst::Cursor::at_point(file.clone(), point)?)
                        }
                        Format::TarXz | Format::TarBz2 => {
                            let codec = blocks::Codec::of(src.index.format).expect("a block codec");
                            let points = src.index.points_from(target);
                            Decoder::Blocks(blocks::Cursor::at_point(codec, file.clone(), points)?)
                        }
                        _ => Decoder::Inflate(gz::Cursor::at_point(&**file, point)?),
                    };
                }
                let n = fill(&mut self.decoder, file, target, buf)?;
                if off + n as u64 == m.size {
                    // Read to its end: the decoder is parked now, not when the handle is released
                    // (a release comes late, after the next member's open, as FUSE sends it), so
                    // the next member read in archive order decodes on from here.
                    src.park_decoder(std::mem::replace(&mut self.decoder, Decoder::None));
                }
                Ok(n)
            }
            Data::Deflate { offset, csize } => {
                let restart = match &self.decoder {
                    Decoder::Inflate(c) => c.offset() > off,
                    _ => true,
                };
                if restart {
                    self.decoder = Decoder::Inflate(gz::Cursor::deflate(offset, offset + csize)?);
                }
                fill(&mut self.decoder, file, off, buf)
            }
        }
    }
}

/// Fills `buf` from the (file offset, length) pieces that hold its bytes.
fn read_pieces(file: &dyn Bytes, pieces: &[(u64, u64)], buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    for &(at, len) in pieces {
        let to = &mut buf[n..n + len as usize];
        if read_at_retry(file, to, at)? < to.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the archive ends before the member does",
            ));
        }
        n += len as usize;
    }
    Ok(n)
}

/// Moves the decoder to `target` and fills `buf` from there.
fn fill(decoder: &mut Decoder, file: &dyn Bytes, target: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    match decoder {
        Decoder::Inflate(c) => {
            c.skip(file, target - c.offset())?;
            while n < buf.len() {
                match c.read(file, &mut buf[n..])? {
                    0 => break,
                    k => n += k,
                }
            }
        }
        Decoder::Zstd(c) => {
            c.skip(target - c.offset())?;
            while n < buf.len() {
                match c.read(&mut buf[n..])? {
                    0 => break,
                    k => n += k,
                }
            }
        }
        Decoder::Blocks(c) => {
            c.skip(target - c.offset())?;
            while n < buf.len() {
                match c.read(&mut buf[n..])? {
                    0 => break,
                    k => n += k,
                }
            }
        }
        Decoder::None => unreachable!("a decoder is set before filling"),
    }
    if n < buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the archive ends before the member does",
        ));
    }
    Ok(n)
}

/// The bytes of a stored or deflated member from its start (the zip scan hashes through it).
pub fn member_reader<'a>(file: &'a dyn Bytes, m: &Member) -> io::Result<Box<dyn Read + 'a>> {
    match m.data {
        Data::Raw { offset } => Ok(Box::new(Pread {
            file,
            pos: offset,
            end: offset + m.size,
        })),
        Data::Deflate { offset, csize } => Ok(Box::new(Inflating {
            file,
            cursor: gz::Cursor::deflate(offset, offset + csize)?,
        })),
        Data::Stream { .. } => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a member of a compressed stream is read through its index",
        )),
    }
}

struct Pread<'a> {
    file: &'a dyn Bytes,
    pos: u64,
    end: u64,
}

impl Read for Pread<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min(self.end.saturating_sub(self.pos) as usize);
        let n = read_at_retry(self.file, &mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

struct Inflating<'a> {
    file: &'a dyn Bytes,
    cursor: gz::Cursor,
}

impl Read for Inflating<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.cursor.read(self.file, buf)
    }
}
