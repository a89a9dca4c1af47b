//! Building an archive's index in one pass: every member listed, hashed (blake3) and located,
//! access points recorded in compressed streams, and the whole archive hashed alongside (on a
//! second thread).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::bytes::{Bytes, Reader, Shared};
use crate::{blocks, gz, normalize, zst, ArchiveError, Data, Format, Index, Kind, Member, Stored};

/// Reports how many bytes of the archive file have been read (for a progress bar).
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Lists, locates and hashes every member of `archive`.
pub fn scan(archive: &Path, progress: Progress) -> Result<Index, ArchiveError> {
    let io = |source| ArchiveError::Io {
        path: archive.to_owned(),
        source,
    };
    let archive = std::fs::canonicalize(archive).map_err(io)?;
    let io = |source| ArchiveError::Io {
        path: archive.clone(),
        source,
    };
    let file = File::open(&archive).map_err(io)?;
    let owner = Owner::of(&file.metadata().map_err(io)?);
    scan_bytes(archive, Arc::new(file), owner, None, progress)
}

/// Who owns the one member of a plain compressed file (`data.csv.xz` holds `data.csv`): the
/// file it is in.
#[derive(Debug, Clone, Copy)]
pub struct Owner {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
}

impl Owner {
    pub fn of(meta: &std::fs::Metadata) -> Owner {
        use std::os::unix::fs::MetadataExt;
        Owner {
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            mtime: meta.mtime(),
        }
    }
}

/// Lists, locates and hashes every member of the archive in `bytes`, named `archive` (a file's
/// canonical path, or `OUTER!/member` for an archive inside another). `blake3` is the whole
/// archive's hash where it is known already (a member's, from its archive's index); else it is
/// computed alongside, on a second thread.
pub fn scan_bytes(
    archive: PathBuf,
    bytes: Shared,
    owner: Owner,
    blake3: Option<[u8; 32]>,
    progress: Progress,
) -> Result<Index, ArchiveError> {
    let io = |source| ArchiveError::Io {
        path: archive.clone(),
        source,
    };
    let format = Format::detect_in(&*bytes, &archive)?;
    let identity = bytes.identity().map_err(io)?;
    let corrupt = |e: io::Error| match e.kind() {
        io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof | io::ErrorKind::Other => {
            ArchiveError::Corrupt {
                path: archive.clone(),
                why: printable(&e.to_string()),
            }
        }
        _ => ArchiveError::Io {
            path: archive.clone(),
            source: e,
        },
    };
    let (listed, blake3) = std::thread::scope(|s| {
        let whole = s.spawn(|| -> io::Result<[u8; 32]> {
            if let Some(known) = blake3 {
                return Ok(known);
            }
            let mut h = blake3::Hasher::new();
            h.update_reader(Reader::whole(bytes.clone())?)?;
            Ok(*h.finalize().as_bytes())
        });
        let listed = list(&bytes, &archive, format, owner, progress);
        (
            listed,
            whole.join().expect("the archive hash thread panicked"),
        )
    });
    let (members, points, mut stored, skipped) = listed.map_err(corrupt)?;
    let (members, earlier) = last_of_each_path(members);
    stored.extend(stored_runs(&*bytes, format, &points).map_err(corrupt)?);
    let blake3 = blake3.map_err(io)?;
    if bytes.identity().map_err(io)? != identity {
        return Err(ArchiveError::Corrupt {
            path: archive,
            why: "it changed while it was being indexed; try again once nothing writes it".into(),
        });
    }
    Ok(Index {
        archive,
        format,
        identity,
        blake3,
        members,
        earlier,
        stored,
        points,
        skipped,
    })
}

/// The stretches stored as they are, in an xz file's blocks (gzip's come from its scan).
fn stored_runs(bytes: &dyn Bytes, format: Format, points: &[gz::Point]) -> io::Result<Vec<Stored>> {
    if format != Format::TarXz {
        return Ok(Vec::new());
    }
    let mut runs = Vec::new();
    for p in points {
        runs.extend(crate::xz::stored_runs(bytes, p)?);
    }
    Ok(runs)
}

/// `s` on one line of printable characters: what a damaged archive makes a decoder or the tar
/// reader say can quote its bytes (a member name of garbage, control characters).
fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() || c == '\u{fffd}' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Entries not shown, with why.
type Skipped = Vec<(Vec<u8>, String)>;
/// The members, the access points, the stretches stored as they are (gzip's stored blocks).
type Listed = (Vec<Member>, Vec<gz::Point>, Vec<Stored>, Skipped);

fn list(
    file: &Shared,
    archive: &Path,
    format: Format,
    owner: Owner,
    progress: Progress,
) -> io::Result<Listed> {
    let read = Arc::new(AtomicU64::new(0));
    let counted = Counted {
        inner: Reader::whole(file.clone())?,
        read: read.clone(),
    };
    let report = || progress(read.load(Ordering::Relaxed));
    let stream = |scan: &mut dyn Read| list_stream(scan, archive, owner, &report);
    match format {
        Format::Tar => {
            let (m, s) = list_tar(BufReader::with_capacity(1 << 20, counted), false, &report)?;
            Ok((m, Vec::new(), Vec::new(), s))
        }
        Format::TarGz => {
            let mut scan = gz::Scan::new(counted, file.clone())?;
            let (m, s) = stream(&mut scan)?;
            let (points, stored) = scan.into_parts()?;
            Ok((m, points, stored, s))
        }
        Format::TarZst => {
            let mut scan = zst::Scan::new(file.clone(), read.clone())?;
            let (m, s) = stream(&mut scan)?;
            Ok((m, scan.into_points(), Vec::new(), s))
        }
        Format::TarXz | Format::TarBz2 => {
            let codec = blocks::Codec::of(format).expect("a block codec");
            let mut scan = blocks::Scan::new(codec, file.clone(), read.clone())?;
            let (m, s) = stream(&mut scan)?;
            Ok((m, scan.into_points(), Vec::new(), s))
        }
        Format::Zip => {
            let (m, s) = list_zip(file, &report)?;
            Ok((m, Vec::new(), Vec::new(), s))
        }
    }
}

/// The members of a compressed stream, read to its end: a tar's, or — a stream that is not a
/// tar (`data.csv.xz`) — one member, the decompressed file, named as the archive without its
/// compression suffix (`data.csv`), with the archive file's owner, mode and time.
fn list_stream(
    scan: &mut dyn Read,
    archive: &Path,
    owner: Owner,
    report: &dyn Fn(),
) -> io::Result<(Vec<Member>, Skipped)> {
    let mut head = Vec::with_capacity(512);
    (&mut *scan).take(512).read_to_end(&mut head)?;
    let tar = head.len() == 512 && (head.iter().all(|&b| b == 0) || crate::tar_header(&head));
    let mut whole = io::Cursor::new(head).chain(scan);
    if tar {
        // Buffered: the tar reader asks for 512-byte headers, each a call into the codec
        // otherwise.
        let listed = list_tar(BufReader::with_capacity(1 << 20, &mut whole), true, report)?;
        // The rest of the stream (zero blocks after the end of the tar) holds no member, but
        // decoding it checks it is well formed.
        io::copy(&mut whole, &mut io::sink())?;
        return Ok(listed);
    }
    let (blake3, size) = hash_reader(&mut whole)?;
    let member = Member {
        path: plain_name(archive),
        kind: Kind::File,
        mode: owner.mode,
        uid: owner.uid,
        gid: owner.gid,
        mtime: owner.mtime,
        size,
        data: Data::Stream { offset: 0 },
        blake3,
        link: None,
    };
    Ok((vec![member], Vec::new()))
}

/// The name of the file a compressed file holds: its own without the compression suffix.
fn plain_name(archive: &Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let name = archive.file_name().map_or(&b"data"[..], |n| n.as_bytes());
    for suffix in [&b".gz"[..], b".xz", b".bz2", b".zst", b".zstd"] {
        if let Some(stem) = name.strip_suffix(suffix).filter(|s| !s.is_empty()) {
            return stem.to_vec();
        }
    }
    [name, b".decompressed"].concat()
}

struct Counted {
    inner: Reader,
    read: Arc<AtomicU64>,
}

impl Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

fn hash_reader(r: &mut impl Read) -> io::Result<([u8; 32], u64)> {
    let mut h = blake3::Hasher::new();
    let n = io::copy(r, &mut h)?;
    Ok((*h.finalize().as_bytes(), n))
}

/// A tar member's entry before its kind is known: a file of no content, with the header's mode,
/// owner and time.
fn tar_member(path: Vec<u8>, h: &tar::Header, data: Data) -> Member {
    Member {
        path,
        kind: Kind::File,
        mode: h.mode().unwrap_or(0o644) & 0o7777,
        uid: h.uid().unwrap_or(0) as u32,
        gid: h.gid().unwrap_or(0) as u32,
        mtime: h.mtime().unwrap_or(0) as i64,
        size: 0,
        data,
        blake3: [0; 32],
        link: None,
    }
}

/// A regular tar member's hash and size, read whole; an error if the archive ends inside it.
fn hash_tar_file(e: &mut tar::Entry<impl Read>) -> io::Result<([u8; 32], u64)> {
    let size = e.size();
    let (hash, n) = hash_reader(e)?;
    if n != size {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the archive ends inside a member",
        ));
    }
    Ok((hash, size))
}

fn list_tar(
    reader: impl Read,
    stream: bool,
    report: &dyn Fn(),
) -> io::Result<(Vec<Member>, Skipped)> {
    use tar::EntryType as T;
    let mut ar = tar::Archive::new(reader);
    let mut members: Vec<Member> = Vec::new();
    let mut by_path: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut skipped = Vec::new();
    for entry in ar.entries()? {
        let mut e = entry?;
        let raw = e.path_bytes().into_owned();
        let h = e.header();
        let et = h.entry_type();
        if matches!(
            et,
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink
        ) {
            continue;
        }
        let Some(path) = normalize(&raw) else {
            if !matches!(et, T::Directory) {
                skipped.push((raw, "its path leaves the archive's root".into()));
            }
            continue;
        };
        let offset = e.raw_file_position();
        let data = if stream {
            Data::Stream { offset }
        } else {
            Data::Raw { offset }
        };
        let mut m = tar_member(path, h, data);
        match et {
            T::Regular | T::Continuous => (m.blake3, m.size) = hash_tar_file(&mut e)?,
            T::Directory => m.kind = Kind::Dir,
            T::Symlink => {
                let target = e.link_name_bytes().unwrap_or_default().into_owned();
                m.kind = Kind::Symlink;
                m.size = target.len() as u64;
                m.blake3 = *blake3::hash(&target).as_bytes();
                m.link = Some(target);
            }
            T::Link => {
                let target = e.link_name_bytes().unwrap_or_default().into_owned();
                let Some(t) = normalize(&target).and_then(|t| by_path.get(&t)) else {
                    skipped.push((m.path, "a hard link to no member before it".into()));
                    continue;
                };
                let t = &members[*t];
                if t.kind != Kind::File {
                    skipped.push((m.path, "a hard link to a directory or symlink".into()));
                    continue;
                }
                m.size = t.size;
                m.blake3 = t.blake3;
                m.data = t.data;
            }
            T::GNUSparse => {
                skipped.push((m.path, "a sparse file (not supported)".into()));
                continue;
            }
            T::Char | T::Block | T::Fifo => {
                skipped.push((m.path, "a device or fifo".into()));
                continue;
            }
            other => {
                skipped.push((m.path, format!("entry type {:?}", other.as_byte() as char)));
                continue;
            }
        }
        by_path.insert(m.path.clone(), members.len());
        members.push(m);
        if members.len().is_multiple_of(256) {
            report();
        }
    }
    report();
    Ok((members, skipped))
}

fn list_zip(file: &Shared, report: &dyn Fn()) -> io::Result<(Vec<Member>, Skipped)> {
    let zip_err = |e: zip::result::ZipError| match e {
        zip::result::ZipError::Io(e) => e,
        e => io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
    };
    let mut z = zip::ZipArchive::new(Reader::whole(file.clone())?).map_err(zip_err)?;
    let mut members = Vec::new();
    let mut skipped = Vec::new();
    for i in 0..z.len() {
        let f = z.by_index_raw(i).map_err(zip_err)?;
        let raw = f.name().map_err(zip_err)?.as_bytes().to_vec();
        let Some(path) = normalize(&raw) else {
            if !f.is_dir() {
                skipped.push((raw, "its path leaves the archive's root".into()));
            }
            continue;
        };
        if f.encrypted() {
            skipped.push((path, "encrypted".into()));
            continue;
        }
        let kind = if f.is_dir() {
            Kind::Dir
        } else if f.is_symlink() {
            Kind::Symlink
        } else {
            Kind::File
        };
        let offset = f.data_start().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "a member without a local header",
            )
        })?;
        let data = match f.compression() {
            zip::CompressionMethod::Stored => Data::Raw { offset },
            // Deflate is decoded here with zlib (the zip crate's own decoders are not built).
            zip::CompressionMethod::DEFLATE => Data::Deflate {
                offset,
                csize: f.compressed_size(),
            },
            other if kind == Kind::Dir => {
                let _ = other;
                Data::Raw { offset }
            }
            other => {
                skipped.push((
                    path,
                    format!("compressed with {other} (stored and deflate are supported)"),
                ));
                continue;
            }
        };
        let default_mode = if kind == Kind::Dir { 0o755 } else { 0o644 };
        members.push(Member {
            path,
            kind,
            mode: f.unix_mode().map_or(default_mode, |m| m & 0o7777),
            uid: 0,
            gid: 0,
            mtime: f.last_modified().map_or(0, dos_time),
            size: f.size(),
            data,
            blake3: [0; 32],
            link: None,
        });
    }
    drop(z);
    for (i, m) in members.iter_mut().enumerate() {
        if m.kind == Kind::Dir {
            m.size = 0;
            continue;
        }
        let mut content = crate::read::member_reader(&**file, m)?;
        if m.kind == Kind::Symlink {
            let mut target = Vec::new();
            content.read_to_end(&mut target)?;
            m.blake3 = *blake3::hash(&target).as_bytes();
            m.link = Some(target);
            continue;
        }
        let (hash, n) = hash_reader(&mut content)?;
        if n != m.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "member {} holds {n} bytes, its header says {}",
                    String::from_utf8_lossy(&m.path),
                    m.size
                ),
            ));
        }
        m.blake3 = hash;
        if i.is_multiple_of(256) {
            report();
        }
    }
    report();
    Ok((members, skipped))
}

/// A zip (MS-DOS) timestamp, taken as UTC: zip stores local time without a zone.
fn dos_time(t: zip::DateTime) -> i64 {
    let (y, m, d) = (
        i64::from(t.year()),
        i64::from(t.month()),
        i64::from(t.day()),
    );
    // Days from 1970-01-01 to y-m-d (proleptic Gregorian).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + i64::from(t.hour()) * 3600 + i64::from(t.minute()) * 60 + i64::from(t.second())
}

/// A path listed twice keeps its last entry, as extracting the archive would leave it; the
/// earlier entries of a file are kept apart, in archive order, as its older versions.
fn last_of_each_path(members: Vec<Member>) -> (Vec<Member>, Vec<Member>) {
    let mut last: HashMap<&[u8], usize> = HashMap::with_capacity(members.len());
    for (i, m) in members.iter().enumerate() {
        last.insert(&m.path, i);
    }
    if last.len() == members.len() {
        return (members, Vec::new());
    }
    let keep: Vec<bool> = (0..members.len())
        .map(|i| last.get(members[i].path.as_slice()) == Some(&i))
        .collect();
    let (mut kept, mut earlier) = (Vec::with_capacity(last.len()), Vec::new());
    for (m, k) in members.into_iter().zip(keep) {
        if k {
            kept.push(m);
        } else if m.kind == Kind::File {
            earlier.push(m);
        }
    }
    (kept, earlier)
}
