//! Journals whose writer is gone (orphans), found, claimed and read back for recovery; a claim
//! by an observer that will take a journal over; reading a journal's records.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use roar_store::job_bytes::Bytes;

use super::*;

/// A claim on a journal by an observer that will take it over when its writer dies (the eBPF
/// helper): while it is held, the journal is no orphan even if its writer is gone, so no
/// recovery starts between the writer's death and the takeover. The kernel drops it with the
/// process that holds it.
#[derive(Debug)]
pub struct Claim {
    path: PathBuf,
    _file: File,
}

pub(super) fn claim_path(journal: &Path) -> PathBuf {
    let mut p = journal.as_os_str().to_owned();
    p.push(".claim");
    PathBuf::from(p)
}

impl Claim {
    /// Claims the journal at `journal`.
    pub fn take(journal: &Path) -> io::Result<Claim> {
        let path = claim_path(journal);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&path)?;
        lock(&file, true)?;
        Ok(Claim { path, _file: file })
    }

    /// The claim is over (the takeover ended, or the writer ended normally).
    pub fn release(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether someone holds a claim on the journal at `journal`.
pub(super) fn claimed(journal: &Path) -> bool {
    let Ok(file) = std::fs::File::open(claim_path(journal)) else {
        return false;
    };
    // SAFETY: flock on a descriptor we own.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

/// A journal whose writer is gone, locked by this process until dropped.
#[derive(Debug)]
pub struct Orphan {
    pub path: PathBuf,
    pub writer: Writer,
    pub records: Vec<Record>,
    /// Bytes at the end that are not whole records (a crash inside a write).
    pub torn: usize,
    /// When the journal was last written: the job was last observed then.
    pub last_write_ns: i64,
    _lock: File,
}

impl Orphan {
    /// The job is in the store: the journal goes (its lock with it).
    pub fn remove(self) {
        remove(&self.path);
    }
}

/// The suffix of a journal being made (`.NAME.journal.new`), not yet locked and headed.
pub(super) const NEW: &str = ".new";

/// A journal left half-made (its writer died between making the file and renaming it into
/// place) is removed once it is this old: it holds nothing observed.
pub(super) const STALE_NEW_SECS: u64 = 3600;

/// Removes the half-made journals among `entries` older than [`STALE_NEW_SECS`].
pub(super) fn remove_stale_new(entries: &[PathBuf]) {
    for p in entries {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        let half_made = name
            .strip_suffix(NEW)
            .is_some_and(|n| n.ends_with(".journal"));
        if !(name.starts_with('.') && half_made) {
            continue;
        }
        let old = std::fs::metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > STALE_NEW_SECS);
        if old {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Removes the journal at `path`, and the claim on it that a killed claimant left.
pub fn remove(path: &Path) {
    let _ = std::fs::remove_file(claim_path(path));
    let _ = std::fs::remove_file(path);
}

/// The journals in `dir` whose writers are gone, each locked for its recovery. Journals still
/// being written (and ones another recovery holds) are left alone. Nothing at all (not even a
/// directory read) when `dir` does not exist.
pub fn orphans(dir: &Path) -> Vec<Orphan> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    remove_stale_new(&entries);
    let mut found: Vec<Orphan> = entries
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "journal"))
        .filter_map(|p| match open_orphan(&p) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!("journal {}: {e}", p.display());
                None
            }
        })
        .collect();
    // Recovered in the order their jobs began (ids follow it).
    found.sort_by_key(|o| (job_started(o), o.path.clone()));
    found
}

pub(super) fn job_started(o: &Orphan) -> i64 {
    o.records
        .iter()
        .find_map(|r| match r {
            Record::Job(j) => Some(j.started_ns),
            _ => None,
        })
        .unwrap_or(i64::MAX)
}

/// The journal at `path` if its writer is gone (`Ok(None)`: still written, or being recovered).
pub fn open_orphan(path: &Path) -> io::Result<Option<Orphan>> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match lock(&file, false) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => return Ok(None),
        Err(e) => return Err(e),
    }
    // Taken after another recovery finished and removed it: nothing left to do. Claimed: an
    // observer takes it over (its writer died, the job goes on).
    if !path.exists() || claimed(path) {
        return Ok(None);
    }
    let read = read(&file)?;
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    Ok(Some(Orphan {
        path: path.to_owned(),
        writer: read.writer,
        records: read.records,
        torn: read.torn,
        last_write_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        _lock: file,
    }))
}

/// A whole journal file, read.
pub(super) struct Contents {
    pub(super) writer: Writer,
    pub(super) records: Vec<Record>,
    /// Where its last whole record ends (what follows is space allocated ahead, or torn).
    pub(super) end: usize,
    /// Bytes after `end` that are not space allocated ahead (zeros): a record a crash tore.
    pub(super) torn: usize,
}

pub(super) fn read(mut file: &File) -> io::Result<Contents> {
    let mut bytes = Vec::with_capacity(file.metadata()?.len() as usize);
    file.read_to_end(&mut bytes)?;
    let Some((writer, sum, body)) = header(&bytes) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a roar journal (or written by a newer roar)",
        ));
    };
    let (records, rest) = parse_as(sum, body);
    let tail = &body[body.len() - rest..];
    let torn = if tail.iter().all(|b| *b == 0) {
        0
    } else {
        rest
    };
    Ok(Contents {
        writer,
        records,
        end: bytes.len() - rest,
        torn,
    })
}

pub(super) fn header(bytes: &[u8]) -> Option<(Writer, Sum, &[u8])> {
    let magics = [(MAGIC, Sum::Crc32), (MAGIC_V1, Sum::Blake3)];
    if bytes.len() <= MAGIC.len() && magics.iter().any(|(m, _)| m.starts_with(bytes)) {
        // Its writer died between making the file and its first write: nothing was observed.
        return Some((Writer::Run, Sum::Crc32, &[]));
    }
    let (rest, sum) = magics
        .iter()
        .find_map(|(m, sum)| Some((bytes.strip_prefix(m.as_slice())?, *sum)))?;
    let writer = match rest.first()? {
        0 => Writer::Run,
        1 => Writer::Mount,
        2 => Writer::Gateway,
        _ => return None,
    };
    Some((writer, sum, &rest[1..]))
}

/// The whole records framed in `bytes`, and how many bytes after them are not one.
pub fn parse(bytes: &[u8]) -> (Vec<Record>, usize) {
    parse_as(Sum::Crc32, bytes)
}

pub(super) fn parse_as(sum_kind: Sum, mut bytes: &[u8]) -> (Vec<Record>, usize) {
    let mut out = Vec::new();
    while bytes.len() >= FRAME {
        let len = u32::from_le_bytes(bytes[..4].try_into().expect("4")) as usize;
        let sum = u32::from_le_bytes(bytes[4..8].try_into().expect("4"));
        if len > MAX_RECORD || bytes.len() < FRAME + len {
            break;
        }
        let body = &bytes[FRAME..FRAME + len];
        if checksum_as(sum_kind, body) != sum {
            break;
        }
        let mut input = body;
        match Record::get(&mut input) {
            Ok(r) if input.is_empty() => out.push(r),
            _ => break,
        }
        bytes = &bytes[FRAME + len..];
    }
    (out, bytes.len())
}
