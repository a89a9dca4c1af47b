//! Hashing many paths at once, through the hash cache: a path whose identity the cache (or an
//! earlier hash in the job) vouches for is not read again, the others are hashed in parallel, and
//! the new hashes go back to the cache.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use rusqlite::{params, Connection, OptionalExtension};

use super::*;
use crate::model::{now_ns, CacheEntry, ContentHash, FileStat};
use crate::objects::Objects;

/// Looks `stat` up in the hash cache; a hit must also carry sha256 if the caller needs it.
pub fn cache_get(conn: &Connection, stat: &FileStat, opts: HashOptions) -> Option<ContentHash> {
    // A file changed within the racy window cannot have a trusted entry: skip the query.
    if racy(stat, now_ns()) {
        return None;
    }
    let (hash, hashed_ns) = cache_lookup(conn, stat).ok().flatten()?;
    if racy(stat, hashed_ns) || (opts.sha256 && hash.sha256.is_none()) {
        return None;
    }
    Some(hash)
}

/// Keeps a version whose hash was known without reading it (the cache, an earlier hash), unless
/// its content is kept already: one read now, kept under the hash of what that read found.
fn keep_unread(objects: &Objects, path: &Path, hashed: &Hashed) {
    if !objects.fits(hashed.hash.size) || objects.has(&hashed.hash.blake3) {
        return;
    }
    if let Err(e) = keep_file(objects, path, hashed.hash.sha256.is_some()) {
        keep_failed(e);
    }
}

/// The result of hashing a batch: one result per path, in order, and the cache entries to store.
pub struct Batch {
    pub results: Vec<Result<Hashed, HashError>>,
    pub new_cache: Vec<CacheEntry>,
}

/// What a caller of [`hash_paths`] already knows about one path's content.
#[derive(Clone, Copy)]
pub enum Prior<'a> {
    /// Nothing, and the content is new to the caller: no cache entry can be valid, so the path is
    /// not even looked up.
    New,
    /// The content may predate the caller: the hash cache may know it.
    MayBeCached,
    /// The caller hashed this path earlier (with [`hash_if_settled`]): that hash stands if the
    /// file still has the identity it had then.
    Hashed(&'a Hashed),
}

/// Hashes `paths` in parallel, answering from what the caller knows (`prior(i)`) and from the hash
/// cache where it can. `cache` is asked for the cache database only when a lookup is needed
/// (files changed within the racy window are never looked up), so callers can open it lazily.
/// `progress` is called with the byte count of each file as it completes (from several threads).
///
/// Small batches run on the calling thread: waking a thread pool costs more than hashing a few
/// files.
pub fn hash_paths<'c, 'p>(
    paths: &[PathBuf],
    opts: HashOptions,
    prior: &(dyn Fn(usize) -> Prior<'p> + Sync),
    cache: &dyn Fn() -> Option<&'c Connection>,
    progress: &(dyn Fn(u64) + Sync),
) -> Batch {
    hash_paths_keeping(paths, opts, prior, cache, progress, None)
}

/// Which of a batch's versions are kept, and where.
pub struct Keeping<'a> {
    pub objects: &'a Objects,
    /// Whether the version at the `i`th path is kept.
    pub wants: &'a (dyn Fn(usize) -> bool + Sync),
}

/// [`hash_paths`], keeping the versions `keep` asks for: a file read to be hashed is copied as it
/// is read; one answered without a read (the cache, an earlier hash) is read once now unless its
/// content is kept already.
pub fn hash_paths_keeping<'c, 'p>(
    paths: &[PathBuf],
    opts: HashOptions,
    prior: &(dyn Fn(usize) -> Prior<'p> + Sync),
    cache: &dyn Fn() -> Option<&'c Connection>,
    progress: &(dyn Fn(u64) + Sync),
    keep: Option<&Keeping>,
) -> Batch {
    const PARALLEL_MIN: usize = 32;
    let parallel = paths.len() >= PARALLEL_MIN;
    hash_batch(paths, opts, prior, cache, progress, parallel, keep)
}

/// [`hash_paths`] on the calling thread alone, however many paths: for a caller that keeps
/// another core busy meanwhile (`roar run` confirms its outputs while its writer records them).
pub fn hash_paths_on_this_thread<'c, 'p>(
    paths: &[PathBuf],
    opts: HashOptions,
    prior: &(dyn Fn(usize) -> Prior<'p> + Sync),
    cache: &dyn Fn() -> Option<&'c Connection>,
    keep: Option<&Keeping>,
) -> Batch {
    hash_batch(paths, opts, prior, cache, &|_| {}, false, keep)
}

/// What is known about a path before its content is read: `None` if it was not looked up (it is
/// opened and fstat'ed when hashed, one syscall fewer than stat + open), else its stat and, if the
/// cache or an earlier hash of the caller's answers for that identity, the result.
type Known = Option<(io::Result<std::fs::Metadata>, Option<Hashed>)>;

fn hash_batch<'c, 'p>(
    paths: &[PathBuf],
    opts: HashOptions,
    prior: &(dyn Fn(usize) -> Prior<'p> + Sync),
    cache: &dyn Fn() -> Option<&'c Connection>,
    progress: &(dyn Fn(u64) + Sync),
    parallel: bool,
    keep: Option<&Keeping>,
) -> Batch {
    // Every stat below happens after this instant, so it is a safe "read began" time for the cache.
    let read_ns = now_ns();
    // Stat what may be known already, and take the caller's earlier hashes that still hold.
    let look = |(i, path): (usize, &PathBuf)| -> Known {
        let prior = prior(i);
        if matches!(prior, Prior::New) {
            return None;
        }
        let meta = std::fs::metadata(path);
        let hit = match (prior, &meta) {
            (Prior::Hashed(earlier), Ok(meta)) => {
                // Same identity as when it was hashed outside the racy window: same bytes.
                let valid = earlier.stat == FileStat::from_metadata(meta)
                    && !racy(&earlier.stat, earlier.read_ns)
                    && (!opts.sha256 || earlier.hash.sha256.is_some());
                valid.then(|| earlier.clone())
            }
            _ => None,
        };
        Some((meta, hit))
    };
    let mut known: Vec<Known> = if parallel {
        paths.par_iter().enumerate().map(look).collect()
    } else {
        paths.iter().enumerate().map(look).collect()
    };
    from_cache(&mut known, prior, cache, opts, read_ns);
    let one = |(i, (path, known)): (usize, (&PathBuf, Known))| {
        let io_err = |source| HashError::Io {
            path: path.to_owned(),
            source,
        };
        let objects = keep.filter(|k| (k.wants)(i)).map(|k| k.objects);
        let r = match known {
            None => open_nonblocking(path).map_err(io_err).and_then(|f| {
                let began = now_ns();
                let meta = f.metadata().map_err(io_err)?;
                if !meta.is_file() {
                    return Err(HashError::NotAFile {
                        path: path.to_owned(),
                    });
                }
                let stat = FileStat::from_metadata(&meta);
                hash_kept(&f, path, stat, began, opts, Cores::All, objects)
            }),
            Some((meta, hit)) => {
                let meta = meta.map_err(io_err)?;
                if !meta.is_file() {
                    return Err(HashError::NotAFile {
                        path: path.to_owned(),
                    });
                }
                let stat = FileStat::from_metadata(&meta);
                match hit {
                    Some(hashed) => {
                        if let Some(objects) = objects {
                            keep_unread(objects, path, &hashed);
                        }
                        Ok(hashed)
                    }
                    None => File::open(path).map_err(io_err).and_then(|f| {
                        hash_kept(&f, path, stat, read_ns, opts, Cores::All, objects)
                    }),
                }
            }
        };
        if let Ok(h) = &r {
            progress(h.hash.size);
        }
        r
    };
    let results: Vec<Result<Hashed, HashError>> = if parallel {
        paths
            .par_iter()
            .zip(known.into_par_iter())
            .enumerate()
            .map(one)
            .collect()
    } else {
        paths.iter().zip(known).enumerate().map(one).collect()
    };
    let new_cache = new_cache(&results);
    Batch { results, new_cache }
}

/// Answers from the hash cache the paths stat'ed and not known yet that may predate the job,
/// all in one read transaction: outside one, each query takes and drops the database's shared
/// lock (two fcntl calls and a WAL index check).
fn from_cache<'c, 'p>(
    known: &mut [Known],
    prior: &(dyn Fn(usize) -> Prior<'p> + Sync),
    cache: &dyn Fn() -> Option<&'c Connection>,
    opts: HashOptions,
    read_ns: i64,
) {
    let mut reading: Option<&Connection> = None;
    for (i, k) in known.iter_mut().enumerate() {
        let Some((Ok(meta), hit @ None)) = k else {
            continue;
        };
        if !matches!(prior(i), Prior::MayBeCached) {
            continue;
        }
        let stat = FileStat::from_metadata(meta);
        if racy(&stat, read_ns) {
            continue;
        }
        let Some(conn) = cache() else {
            continue;
        };
        if reading.is_none() && conn.is_autocommit() && conn.execute_batch("BEGIN").is_ok() {
            reading = Some(conn);
        }
        *hit = cache_get(conn, &stat, opts).map(|hash| Hashed {
            hash,
            stat,
            from_cache: true,
            read_ns,
        });
    }
    if let Some(conn) = reading {
        let _ = conn.execute_batch("COMMIT");
    }
}

/// The cache entries `results` teach: content read now (not answered from the cache), outside
/// the racy window (an entry that would be racy on lookup can never be trusted: not worth a row).
fn new_cache(results: &[Result<Hashed, HashError>]) -> Vec<CacheEntry> {
    results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .filter(|h| !h.from_cache && !racy(&h.stat, h.read_ns))
        .map(|h| CacheEntry {
            stat: h.stat,
            hash: h.hash.clone(),
            hashed_ns: h.read_ns,
        })
        .collect()
}

/// Looks up a cache entry valid for `stat` (see [`crate::hash`] for the racy-entry rule).
fn cache_lookup(
    conn: &Connection,
    stat: &crate::FileStat,
) -> rusqlite::Result<Option<(ContentHash, i64)>> {
    conn.prepare_cached(
        "SELECT blake3, sha256, hashed_ns FROM hash_cache
         WHERE dev = ?1 AND ino = ?2 AND size = ?3 AND mtime_ns = ?4 AND ctime_ns = ?5",
    )?
    .query_row(
        params![
            stat.dev as i64,
            stat.ino as i64,
            stat.size as i64,
            stat.mtime_ns,
            stat.ctime_ns
        ],
        |r| {
            Ok((
                ContentHash {
                    blake3: r.get(0)?,
                    sha256: r.get(1)?,
                    size: stat.size,
                },
                r.get(2)?,
            ))
        },
    )
    .optional()
}
