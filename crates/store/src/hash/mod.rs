//! Content hashing: blake3 (always) and sha256 (on request), files in parallel across cores,
//! big files across cores too, and the hash cache that skips files that did not change.
//!
//! A cache entry is trusted only if the file's timestamps are older than the moment it was hashed
//! by more than [`RACY_NS`]: a write landing in the same timestamp tick as the hash would otherwise
//! leave size and times unchanged and the stale entry would look valid (git's "racily clean" rule).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub use rusqlite::Connection;
use sha2::Digest;

use crate::model::{now_ns, ContentHash, FileStat};
use crate::objects::{Objects, Taking};

mod batch;
pub use batch::{
    cache_get, hash_paths, hash_paths_keeping, hash_paths_on_this_thread, Batch, Keeping, Prior,
};

/// How far apart a file's ctime and its hashing time must be for the cache entry to be trusted.
pub const RACY_NS: i64 = 20_000_000;

/// Small files are read through one 64 KiB buffer; bigger ones in [`BIG_CHUNK`] pieces, each
/// hashed on every core. Files are read, never memory-mapped: a mapping of a file that another
/// process truncates while it is hashed raises SIGBUS and would kill whoever hashes it (the mount's
/// daemon, `roar run`), where a read just returns fewer bytes and the identity re-check says so.
const READ_BUF: usize = 64 * 1024;
const BIG_CHUNK: usize = 8 << 20;

#[derive(Debug, Clone, Copy, Default)]
pub struct HashOptions {
    /// Compute sha256 as well as blake3.
    pub sha256: bool,
}

/// One file's hash, with the identity it had when hashed.
#[derive(Debug, Clone)]
pub struct Hashed {
    pub hash: ContentHash,
    pub stat: FileStat,
    pub from_cache: bool,
    /// When the read began; what the cache compares timestamps against.
    pub read_ns: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum HashError {
    #[error("cannot hash {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot hash {path}: not a regular file")]
    NotAFile { path: PathBuf },
    #[error("{path} changed while it was being hashed")]
    Changed { path: PathBuf },
}

/// Hashes one open file. Returns the identity of the file as of before the read; fails with
/// [`HashError::Changed`] if that identity moved during the read.
pub fn hash_open_file(file: &File, path: &Path, opts: HashOptions) -> Result<Hashed, HashError> {
    hash_open_file_keeping(file, path, opts, None)
}

/// [`hash_open_file`], copying the bytes it reads into `tee` (a version being kept).
pub fn hash_open_file_keeping(
    file: &File,
    path: &Path,
    opts: HashOptions,
    tee: Option<&mut Taking>,
) -> Result<Hashed, HashError> {
    let read_ns = now_ns();
    let meta = file.metadata().map_err(|source| HashError::Io {
        path: path.to_owned(),
        source,
    })?;
    if !meta.is_file() {
        return Err(HashError::NotAFile {
            path: path.to_owned(),
        });
    }
    hash_as(
        file,
        path,
        FileStat::from_metadata(&meta),
        read_ns,
        opts,
        Cores::All,
        tee,
    )
}
/// Keeps the content of the file at `path` in `objects` (one read, hashed as it is copied) and
/// returns its hash.
pub fn keep_file(objects: &Objects, path: &Path, sha256: bool) -> io::Result<ContentHash> {
    keep_open(objects, &File::open(path)?, path, sha256)
}

/// [`keep_file`] for a file open for reading (`path` names it in errors).
pub fn keep_open(
    objects: &Objects,
    file: &File,
    path: &Path,
    sha256: bool,
) -> io::Result<ContentHash> {
    let mut taking = objects.begin()?;
    let opts = HashOptions { sha256 };
    let hashed =
        hash_open_file_keeping(file, path, opts, Some(&mut taking)).map_err(io::Error::other)?;
    taking.commit(objects, &hashed.hash.blake3)?;
    Ok(hashed.hash)
}

/// Whether one big file is hashed on every core (blake3's rayon mode) or on the calling thread.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cores {
    All,
    One,
}

/// What [`hash_if_settled`] found.
#[derive(Debug)]
pub enum Settled {
    /// Hashed, and trustworthy for as long as the file keeps this identity.
    Hashed(Hashed),
    /// Changed within the racy window before now: hashing it now could not be trusted later.
    Recent(FileStat),
}

/// What the caller of [`hash_if_settled`] knows of the kind of file at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file when it was last seen (a tracer saw it opened as one): opened directly.
    Regular,
    /// Anything: stat first and open only a regular file. Opening a FIFO that the job is about
    /// to use, even for an instant, could hand its writer a reader that then goes away.
    Unknown,
}

/// Hashes `path` on the calling thread only if its last change is older than the racy window,
/// so that the result stays valid for as long as the file's identity (`stat`) is unchanged: what
/// `roar run` uses to hash a job's outputs while the job is still running. A file changed more
/// recently is not read.
pub fn hash_if_settled(path: &Path, kind: Kind, opts: HashOptions) -> Result<Settled, HashError> {
    hash_if_settled_keeping(path, kind, opts, None)
}

/// [`hash_if_settled`], keeping the version it hashes in `keep` (one read for both).
pub fn hash_if_settled_keeping(
    path: &Path,
    kind: Kind,
    opts: HashOptions,
    keep: Option<&Objects>,
) -> Result<Settled, HashError> {
    let read_ns = now_ns();
    let io_err = |source| HashError::Io {
        path: path.to_owned(),
        source,
    };
    let settled = |meta: &std::fs::Metadata| {
        if !meta.is_file() {
            return Err(HashError::NotAFile {
                path: path.to_owned(),
            });
        }
        let stat = FileStat::from_metadata(meta);
        Ok((!racy(&stat, read_ns), stat))
    };
    if kind == Kind::Unknown {
        if let (false, stat) = settled(&std::fs::metadata(path).map_err(io_err)?)? {
            return Ok(Settled::Recent(stat));
        }
    }
    // Checked (again) on the open file: the path may have been replaced in between.
    let file = open_nonblocking(path).map_err(io_err)?;
    match settled(&file.metadata().map_err(io_err)?)? {
        (false, stat) => Ok(Settled::Recent(stat)),
        (true, stat) => {
            hash_kept(&file, path, stat, read_ns, opts, Cores::One, keep).map(Settled::Hashed)
        }
    }
}

/// [`hash_as`], and the bytes read kept in `keep` under the hash they have. A copy that cannot
/// be kept (a full disk) is reported once; the hash stands.
fn hash_kept(
    file: &File,
    path: &Path,
    stat: FileStat,
    read_ns: i64,
    opts: HashOptions,
    cores: Cores,
    keep: Option<&Objects>,
) -> Result<Hashed, HashError> {
    let Some(objects) = keep.filter(|o| o.fits(stat.size)) else {
        return hash_as(file, path, stat, read_ns, opts, cores, None);
    };
    let mut taking = objects.begin().map_err(keep_failed).ok();
    let hashed = hash_as(file, path, stat, read_ns, opts, cores, taking.as_mut())?;
    if let Some(t) = taking {
        let _ = t.commit(objects, &hashed.hash.blake3).map_err(keep_failed);
    }
    Ok(hashed)
}

fn keep_failed(e: io::Error) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| tracing::warn!("cannot keep a version in the object store: {e}"));
}

/// Bytes of big files (more than one read buffer) this process has hashed so far, counted per
/// chunk as they are read: what a progress line shows while one big file takes seconds.
static BIG_BYTES_READ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// See [`BIG_BYTES_READ`].
pub fn big_bytes_read() -> u64 {
    BIG_BYTES_READ.load(std::sync::atomic::Ordering::Relaxed)
}

/// Hashes `file`, known (by a stat taken after `read_ns`) to have identity `stat`. Reads exactly
/// `stat.size` bytes and re-checks the identity afterwards: open, read, fstat, close per small file.
/// `tee` gets a copy of what is read (or a clone made now, after the stat).
fn hash_as(
    file: &File,
    path: &Path,
    stat: FileStat,
    read_ns: i64,
    opts: HashOptions,
    cores: Cores,
    mut tee: Option<&mut Taking>,
) -> Result<Hashed, HashError> {
    if let Some(t) = tee.as_mut() {
        t.clone_from(file);
    }
    let io_err = |source| HashError::Io {
        path: path.to_owned(),
        source,
    };
    let mut b3 = blake3::Hasher::new();
    let mut sha = opts.sha256.then(sha2::Sha256::new);
    let mut size = 0u64;
    let big = stat.size > READ_BUF as u64;
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with_borrow_mut(|buf| -> io::Result<()> {
        let len = if big { BIG_CHUNK } else { READ_BUF };
        if buf.len() != len {
            // A thread that hashed one big file keeps 8 MiB only while it hashes big files.
            *buf = vec![0u8; len];
        }
        while size < stat.size {
            // Fill the whole chunk before hashing it, so rayon gets big pieces to split. Read
            // at explicit offsets: the file's own offset may be anywhere (a handle the caller
            // shares, a second attempt).
            let want = ((stat.size - size) as usize).min(buf.len());
            let mut n = 0;
            while n < want {
                match file.read_at(&mut buf[n..want], size + n as u64) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if n == 0 {
                break;
            }
            if big && cores == Cores::All {
                b3.update_rayon(&buf[..n]);
            } else {
                b3.update(&buf[..n]);
            }
            if let Some(s) = sha.as_mut() {
                s.update(&buf[..n]);
            }
            if let Some(t) = tee.as_mut() {
                t.write(&buf[..n]);
            }
            size += n as u64;
            if big {
                BIG_BYTES_READ.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            }
            if n < want {
                break;
            }
        }
        Ok(())
    })
    .map_err(io_err)?;
    // Growth, shrinkage or a rewrite during the read shows in size or timestamps.
    let after = FileStat::from_metadata(&file.metadata().map_err(io_err)?);
    if after != stat || size != stat.size {
        return Err(HashError::Changed {
            path: path.to_owned(),
        });
    }
    Ok(Hashed {
        hash: ContentHash {
            blake3: b3.finalize().to_hex().to_string(),
            sha256: sha.map(|s| hex(&s.finalize())),
            size,
        },
        stat,
        from_cache: false,
        read_ns,
    })
}

/// Opens `path` for hashing without blocking on a FIFO that replaced it (the fstat that follows
/// rejects anything but a regular file).
fn open_nonblocking(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

pub fn hash_path(path: &Path, opts: HashOptions) -> Result<Hashed, HashError> {
    let file = File::open(path).map_err(|source| HashError::Io {
        path: path.to_owned(),
        source,
    })?;
    hash_open_file(&file, path, opts)
}

/// Lowercase hex of `bytes` (the `hex` crate's).
pub fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// Whether a hash read at `read_ns` may have missed a change that left `stat` as it is.
fn racy(stat: &FileStat, read_ns: i64) -> bool {
    stat.ctime_ns.max(stat.mtime_ns) + RACY_NS >= read_ns
}
