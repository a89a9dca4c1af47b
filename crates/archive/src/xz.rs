//! xz with random access by blocks. The index at the end of each xz stream lists its blocks
//! (compressed and decoded sizes), so every block's place in the file and in the decoded stream
//! is known before decoding anything. A block is decoded alone as a one-block stream: the
//! stream's own header, the block's bytes, and an index and footer written for it — so liblzma
//! checks the block's integrity check (CRC64, SHA-256) and its sizes as for any xz file.
//!
//! `xz -T0` (the default since xz 5.6) and pixz write many blocks; `xz` single-threaded writes
//! one, whose members are read by decoding from the start (as ratarmount and python-xz do).
//! Restart points inside one block would need a snapshot of the LZMA2 dictionary at each (up
//! to 64 MiB at -9), which liblzma's API cannot restore: not done. What LZMA2 stored as it is
//! (uncompressed chunks: incompressible data) needs no decoding at all ([`stored_runs`]).

use std::io::{self, Read};

use crate::block::Block;
use crate::bytes::{read_at_retry, Bytes, Shared};

const HEADER_MAGIC: [u8; 6] = [0xfd, b'7', b'z', b'X', b'Z', 0];
const FOOTER_MAGIC: [u8; 2] = *b"YZ";
/// The meta of a block: the stream header (12), unpadded size (8), decoded size (8).
const META: usize = 28;

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn read_exact_at(file: &dyn Bytes, buf: &mut [u8], at: u64) -> io::Result<()> {
    if read_at_retry(file, buf, at)? < buf.len() {
        return Err(bad(format!("xz: truncated at byte {at}")));
    }
    Ok(())
}

/// A multibyte integer of the xz format (7 bits per byte, low first), from `b` at `*at`.
fn varint(b: &[u8], at: &mut usize) -> io::Result<u64> {
    let mut v = 0u64;
    for i in 0..9 {
        let byte = *b
            .get(*at)
            .ok_or_else(|| bad("xz: index ends inside a number"))?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad("xz: a number in the index is too long"))
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn crc32(b: &[u8]) -> [u8; 4] {
    crc32fast::hash(b).to_le_bytes()
}

/// The blocks of every stream of the file (concatenated streams, stream padding between them),
/// in file order, read from the streams' indexes (the file is walked from its end).
pub fn blocks(file: &dyn Bytes) -> io::Result<Vec<Block>> {
    let mut end = file.size()?;
    let mut streams = Vec::new();
    while end > 0 {
        // Stream padding: zero bytes in fours before a footer.
        let mut word = [0u8; 4];
        read_exact_at(file, &mut word, end.saturating_sub(4))?;
        if end >= 4 && word == [0; 4] {
            end -= 4;
            continue;
        }
        if end < 24 {
            return Err(bad("xz: no stream footer at the end of the file"));
        }
        let mut footer = [0u8; 12];
        read_exact_at(file, &mut footer, end - 12)?;
        if footer[10..] != FOOTER_MAGIC || crc32(&footer[4..10]) != footer[..4] {
            return Err(bad(format!("xz: no valid stream footer before byte {end}")));
        }
        let backward = u64::from(u32::from_le_bytes([
            footer[4], footer[5], footer[6], footer[7],
        ]));
        let index_len = (backward + 1) * 4;
        let index_at = (end - 12)
            .checked_sub(index_len)
            .ok_or_else(|| bad("xz: the index runs before the start of the file"))?;
        let mut index = vec![0u8; index_len as usize];
        read_exact_at(file, &mut index, index_at)?;
        let records = parse_index(&index)?;
        // Checked: a damaged index's sizes are any numbers.
        let before_file = || bad("xz: the blocks run before the start of the file");
        let padded = records
            .iter()
            .try_fold(12u64, |sum, (u, _)| {
                sum.checked_add(u.checked_next_multiple_of(4)?)
            })
            .ok_or_else(before_file)?;
        let start = index_at.checked_sub(padded).ok_or_else(before_file)?;
        let mut header = [0u8; 12];
        read_exact_at(file, &mut header, start)?;
        if header[..6] != HEADER_MAGIC
            || crc32(&header[6..8]) != header[8..12]
            || header[6..8] != footer[8..10]
        {
            return Err(bad(format!("xz: no stream header at byte {start}")));
        }
        let mut at = start + 12;
        let mut blocks = Vec::with_capacity(records.len());
        for (unpadded, size) in records {
            let mut meta = Vec::with_capacity(META);
            meta.extend_from_slice(&header);
            meta.extend_from_slice(&unpadded.to_le_bytes());
            meta.extend_from_slice(&size.to_le_bytes());
            blocks.push(Block {
                start_bit: at * 8,
                size: Some(size),
                meta,
            });
            at += unpadded.div_ceil(4) * 4;
        }
        streams.push(blocks);
        end = start;
    }
    Ok(streams.into_iter().rev().flatten().collect())
}

/// The stretches of the block at `point` that LZMA2 stored as they are (uncompressed chunks:
/// what it does with incompressible data — images, audio, anything compressed already): their
/// bytes are in the file, readable with no decoding. Found from the chunk headers alone. Empty
/// for a block whose filter is not LZMA2 alone (a BCJ or delta filter changes the bytes), or
/// whose chunk sizes do not add up to the block's (its decoding will say what is wrong).
pub fn stored_runs(file: &dyn Bytes, point: &crate::Point) -> io::Result<Vec<crate::Stored>> {
    let meta = &point.window;
    if meta.len() != META {
        return Err(bad("xz: the access point does not describe a block"));
    }
    let unpadded = u64::from_le_bytes(meta[12..20].try_into().expect("8 bytes"));
    let size = u64::from_le_bytes(meta[20..28].try_into().expect("8 bytes"));
    let start = point.coff;
    let Some(data) = lzma2_data(file, start)? else {
        return Ok(Vec::new());
    };
    let end = start + unpadded;
    let (mut c, mut u) = (data, 0u64);
    let mut runs = Vec::new();
    while c < end {
        let mut h = [0u8; 6];
        let n = read_at_retry(file, &mut h, c)?;
        let be16 = |i: usize| u64::from(u16::from_be_bytes([h[i], h[i + 1]]));
        match h[0] {
            0x00 if n >= 1 => {
                return Ok(if u == size { runs } else { Vec::new() });
            }
            0x01 | 0x02 if n >= 3 => {
                let len = be16(1) + 1;
                runs.push(crate::Stored {
                    uoff: point.uoff + u,
                    coff: c + 3,
                    len,
                });
                (c, u) = (c + 3 + len, u + len);
            }
            0x80..=0xff if n >= 5 => {
                let unpacked = (u64::from(h[0] & 0x1f) << 16 | be16(1)) + 1;
                let header = if h[0] >= 0xc0 { 6 } else { 5 };
                (c, u) = (c + header + be16(3) + 1, u + unpacked);
            }
            _ => return Ok(Vec::new()),
        }
    }
    Ok(Vec::new())
}

/// Where the LZMA2 data of the block at `start` begins, if its one filter is LZMA2.
fn lzma2_data(file: &dyn Bytes, start: u64) -> io::Result<Option<u64>> {
    let mut b0 = [0u8; 1];
    read_exact_at(file, &mut b0, start)?;
    if b0[0] == 0 {
        return Err(bad(format!("xz: no block header at byte {start}")));
    }
    let len = (usize::from(b0[0]) + 1) * 4;
    let mut h = vec![0u8; len];
    read_exact_at(file, &mut h, start)?;
    if crc32(&h[..len - 4]) != h[len - 4..] {
        return Err(bad(format!(
            "xz: the block header at byte {start} is damaged"
        )));
    }
    let flags = h[1];
    if flags & 0x03 != 0 {
        return Ok(None);
    }
    let mut at = 2;
    for present in [0x40, 0x80] {
        if flags & present != 0 {
            varint(&h, &mut at)?;
        }
    }
    let lzma2 = varint(&h, &mut at)? == 0x21;
    Ok(lzma2.then_some(start + len as u64))
}

/// An index's records: (unpadded size, decoded size) of each block.
fn parse_index(index: &[u8]) -> io::Result<Vec<(u64, u64)>> {
    let body = index.len() - 4;
    if index[0] != 0 || crc32(&index[..body]) != index[body..] {
        return Err(bad("xz: the stream index is damaged"));
    }
    let mut at = 1;
    let count = varint(index, &mut at)?;
    let mut records = Vec::with_capacity(count.min(1 << 20) as usize);
    for _ in 0..count {
        let unpadded = varint(index, &mut at)?;
        let size = varint(index, &mut at)?;
        if unpadded < 5 {
            return Err(bad("xz: a block in the index is too small"));
        }
        records.push((unpadded, size));
    }
    if at > body || index[at..body].iter().any(|&b| b != 0) {
        return Err(bad("xz: the stream index is damaged"));
    }
    Ok(records)
}

/// The block at byte `at` whose meta is `meta`, decoded alone.
pub fn open(
    file: &Shared,
    at: u64,
    meta: &[u8],
    check: crate::block::Check,
) -> io::Result<Box<dyn Read + Send>> {
    if meta.len() != META {
        return Err(bad("xz: the access point does not describe a block"));
    }
    let header = &meta[..12];
    let unpadded = u64::from_le_bytes(meta[12..20].try_into().expect("8 bytes"));
    let size = u64::from_le_bytes(meta[20..28].try_into().expect("8 bytes"));
    // The block's index: one record, padded to four bytes, with its CRC32; then the footer
    // that points back at it.
    let mut tail = vec![0u8];
    put_varint(&mut tail, 1);
    put_varint(&mut tail, unpadded);
    put_varint(&mut tail, size);
    while tail.len() % 4 != 0 {
        tail.push(0);
    }
    let crc = crc32(&tail);
    tail.extend_from_slice(&crc);
    let mut back = ((tail.len() / 4 - 1) as u32).to_le_bytes().to_vec();
    back.extend_from_slice(&header[6..8]);
    tail.extend_from_slice(&crc32(&back));
    tail.extend_from_slice(&back);
    tail.extend_from_slice(&FOOTER_MAGIC);
    let block = crate::bytes::Reader::new(file.clone(), at, at + unpadded.div_ceil(4) * 4);
    let stream = io::Cursor::new(header.to_vec())
        .chain(block)
        .chain(io::Cursor::new(tail));
    let flags = match check {
        crate::block::Check::Verify => 0,
        crate::block::Check::Trust => liblzma::stream::IGNORE_CHECK,
    };
    let decoder = liblzma::stream::Stream::new_stream_decoder(u64::MAX, flags)
        .map_err(|e| bad(format!("xz: cannot make a decoder ({e})")))?;
    Ok(Box::new(liblzma::read::XzDecoder::new_stream(
        stream, decoder,
    )))
}
