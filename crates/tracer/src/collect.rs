//! Hashes what the engine's rule classified (`roar_engine::classify`): each input as first read
//! and each output as the job left it, into the store's file records.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use roar_store::hash::{
    cache_get, hash_paths_keeping, hash_paths_on_this_thread, Connection, HashError, HashOptions,
    Keeping, Prior,
};
use roar_store::{ContentHash, FileChunk, FileRecord, FileStat, Made, Role};

pub use roar_engine::classify::{
    classify, classify_part, made_dirs, Classified, HashMap, HashSet, Judge, PathState, Version,
};

use crate::early::Early;
/// What hashing a job's files found, besides the files themselves (which went to the sink).
#[derive(Debug, Default)]
pub struct Hashed {
    pub inputs: usize,
    pub outputs: usize,
    /// Inputs whose content could not be pinned down (changed or gone before hashing).
    pub unhashed_inputs: usize,
    /// Files hashed while the job ran and unchanged since: not read again.
    pub hashed_early: usize,
}

/// Outputs handed to the sink at a time: enough that a chunk is cheap to send, few enough that the
/// writer starts early.
const CHUNK: usize = 256;

/// Outputs at least this big are confirmed before the store's write lock is taken: one that
/// changed since its early hash (a write through a descriptor opened before, which no event
/// shows) is then read again with the other new content, not while other writers wait.
const CONFIRM_FIRST: u64 = 8 << 20;

/// Which versions of a job's files are kept, and where (`roar_store::objects`).
pub struct Versions<'a> {
    pub objects: &'a roar_store::objects::Objects,
    pub rule: &'a dyn KeepRule,
}

pub trait KeepRule: Sync {
    /// Whether the version at `path` is kept; `made`: the job made it (an output), else the job
    /// read it (an input).
    fn wants(&self, path: &Path, made: bool) -> bool;
}

/// Hashes outputs (final content) and inputs (content as first read) and hands every file to
/// `sink`, with the hash-cache entries learned on the way.
///
/// Most outputs of a job were hashed while it ran (`early`); such a hash stands if the file's
/// identity has not changed since, so all that is left for them is a stat each (one whose identity
/// moved anyway, by a change no event showed, is read again there; see `CONFIRM_FIRST` for big
/// ones). Those come last, in chunks, on this thread alone: the caller's sink is meant to hand
/// them to a writer that records one chunk while this thread confirms the next. Everything else
/// (inputs, rename destinations, outputs not hashed during the run) is hashed first, in parallel,
/// and goes to the sink in one chunk.
pub fn hash<'c>(
    mut classified: Classified,
    opts: HashOptions,
    cache: &dyn Fn() -> Option<&'c Connection>,
    early: &Early,
    versions: Option<&Versions>,
    sink: &mut dyn FnMut(FileChunk),
) -> Hashed {
    let mut summary = Hashed::default();
    // Members read through an archive mount: the mount knows what they are (and their hash).
    let from_archives = archive_members(&mut classified.paths);
    summary.inputs += from_archives.len();
    let later = hashed_during_the_run(&classified.paths, early);

    let mut want: Vec<PathBuf> = Vec::new();
    let mut prior: Vec<Prior> = Vec::new();
    let mut index: HashMap<&OsStr, usize> = HashMap::default();
    let states: HashMap<&OsStr, &PathState> = classified
        .paths
        .iter()
        .map(|(p, s)| (p.as_os_str(), s))
        .collect();
    for ((path, st), later) in classified.paths.iter().zip(&later) {
        // Only its own record needs a path confirmed later.
        let own = (st.exists && !later).then_some(path);
        for p in [own, st.moved_to.as_ref().map(|(to, _)| to)]
            .into_iter()
            .flatten()
        {
            if !index.contains_key(p.as_os_str()) {
                index.insert(p.as_os_str(), want.len());
                want.push(p.clone());
                // Only content that may predate the job can be in the hash cache.
                let job_made = states.get(p.as_os_str()).is_some_and(|s| s.job_made);
                prior.push(if job_made {
                    early.get(p.as_os_str()).map_or(Prior::New, Prior::Hashed)
                } else {
                    Prior::MayBeCached
                });
            }
        }
    }
    // Kept: the version of each path the record holds (an output as left, an input as read
    // while it is still there).
    let made = |p: &Path| {
        states
            .get(p.as_os_str())
            .is_some_and(|s| s.path_use().records().1 == Some(Made::Output))
    };
    let wants_at = |i: usize| versions.is_some_and(|v| v.rule.wants(&want[i], made(&want[i])));
    let keeping = versions.map(|v| Keeping {
        objects: v.objects,
        wants: &wants_at,
    });
    let batch = hash_paths_keeping(&want, opts, &|i| prior[i], cache, &|_| {}, keeping.as_ref());
    summary.hashed_early += count_early(prior.iter().copied(), &batch.results);
    let current = |p: &Path| -> Option<&roar_store::hash::Hashed> {
        batch.results[*index.get(p.as_os_str())?].as_ref().ok()
    };

    let mut files = from_archives;
    for ((path, st), later) in classified.paths.iter().zip(&later) {
        if *later {
            continue;
        }
        for (role, version) in st.roles() {
            let hash = match version {
                Version::Prior => {
                    let hash = input_hash(path, st, &states, &current, cache, opts);
                    summary.unhashed_inputs += usize::from(hash.is_none());
                    summary.inputs += 1;
                    hash
                }
                Version::Left => current(path).map(|h| h.hash.clone()),
                Version::Gone => None,
            };
            files.push(st.record(role, path.clone(), hash));
        }
    }
    summary.outputs += files.iter().filter(|f| f.role == Role::Output).count();
    if !files.is_empty() || !batch.new_cache.is_empty() {
        sink(FileChunk {
            files,
            cache: batch.new_cache,
        });
    }

    // The outputs hashed during the run, confirmed (or hashed again) a chunk at a time.
    let rest =
        (classified.paths.into_iter().zip(later)).filter_map(|(p, later)| later.then_some(p));
    confirm(rest, opts, cache, early, versions, &mut summary, sink);
    summary
}

/// Which of `paths` only need their hash during the run confirmed: outputs and nothing else,
/// hashed during the run (and, if big, still as they were then), and nobody's rename
/// destination (the current content of a destination may pin an input's, so it is hashed with
/// the inputs).
fn hashed_during_the_run(paths: &[(PathBuf, PathState)], early: &Early) -> Vec<bool> {
    let moved_to: HashSet<&OsStr> = paths
        .iter()
        .filter_map(|(_, st)| st.moved_to.as_ref().map(|(to, _)| to.as_os_str()))
        .collect();
    paths
        .iter()
        .map(|(path, st)| {
            let p = path.as_os_str();
            st.path_use().records() == (false, Some(Made::Output))
                && !moved_to.contains(p)
                && early.get(p).is_some_and(|h| {
                    h.hash.size < CONFIRM_FIRST
                        || std::fs::metadata(path)
                            .is_ok_and(|m| FileStat::from_metadata(&m) == h.stat)
                })
        })
        .collect()
}

/// Confirms (or hashes again) the outputs hashed during the run, `CHUNK` at a time, each chunk
/// to `sink` as it is done.
fn confirm<'c>(
    rest: impl Iterator<Item = (PathBuf, PathState)>,
    opts: HashOptions,
    cache: &dyn Fn() -> Option<&'c Connection>,
    early: &Early,
    versions: Option<&Versions>,
    summary: &mut Hashed,
    sink: &mut dyn FnMut(FileChunk),
) {
    let mut rest = rest.peekable();
    while rest.peek().is_some() {
        let (paths, states): (Vec<PathBuf>, Vec<PathState>) = rest.by_ref().take(CHUNK).unzip();
        let earlier: Vec<&roar_store::hash::Hashed> =
            paths.iter().map(|p| &early[p.as_os_str()]).collect();
        let wants_at = |i: usize| versions.is_some_and(|v| v.rule.wants(&paths[i], true));
        let keeping = versions.map(|v| Keeping {
            objects: v.objects,
            wants: &wants_at,
        });
        let batch = hash_paths_on_this_thread(
            &paths,
            opts,
            &|i| Prior::Hashed(earlier[i]),
            cache,
            keeping.as_ref(),
        );
        let priors = earlier.iter().map(|e| Prior::Hashed(e));
        summary.hashed_early += count_early(priors, &batch.results);
        summary.outputs += paths.len();
        let files = paths
            .into_iter()
            .zip(&states)
            .zip(batch.results)
            .map(|((path, st), r)| st.record(Role::Output, path, r.ok().map(|h| h.hash)))
            .collect();
        sink(FileChunk {
            files,
            cache: batch.new_cache,
        });
    }
}

/// Takes out of `paths` the files only read under an archive mount (`roar mount ARCHIVE DIR`)
/// that the mount says are members, and gives their records: each member as
/// `ARCHIVE!/path/in/archive` with its hash, and each archive once, as the mount records them.
fn archive_members(paths: &mut Vec<(PathBuf, PathState)>) -> Vec<FileRecord> {
    let mut records = Vec::new();
    // Only a path the job read and did not make can be a member; mountinfo (tens of
    // microseconds for the kernel to print) is read only if there is one.
    if !paths
        .iter()
        .any(|(_, st)| st.path_use().records() == (true, None))
    {
        return records;
    }
    let mounts = roar_archive::mounted::archive_mounts();
    if mounts.is_empty() {
        return records;
    }
    let hash = |b3: &[u8; 32], size: u64| ContentHash {
        blake3: roar_store::hash::hex(b3),
        sha256: None,
        size,
    };
    let mut archives = HashSet::default();
    paths.retain(|(path, st)| {
        let only_read = st.path_use().records() == (true, None);
        if !only_read || !mounts.iter().any(|m| path.starts_with(m)) {
            return true;
        }
        let Some(r) = roar_archive::mounted::member_at(path) else {
            return true;
        };
        records.push(st.record(Role::Input, r.path, Some(hash(&r.blake3, r.size))));
        // The archive it is in, and each archive that one is inside (nested archives).
        for a in r.archives {
            if archives.insert(a.path.clone()) {
                let h = hash(&a.blake3, a.size);
                records.push(st.record(Role::Input, a.path, Some(h)));
            }
        }
        false
    });
    // A job that also opened the archive file itself has its own record of it.
    let opened: HashSet<&Path> = paths.iter().map(|(p, _)| p.as_path()).collect();
    records.retain(|r| !archives.contains(&r.path) || !opened.contains(r.path.as_path()));
    records
}

/// How many of `results` are the earlier hash itself (the file was not read again).
fn count_early<'a>(
    prior: impl Iterator<Item = Prior<'a>>,
    results: &[Result<roar_store::hash::Hashed, HashError>],
) -> usize {
    prior
        .zip(results)
        .filter(|(p, r)| match (p, r) {
            // The pass after the job starts later than any early hash: an equal start is a reuse.
            (Prior::Hashed(e), Ok(h)) => h.read_ns == e.read_ns,
            _ => false,
        })
        .count()
}

fn input_hash<'a, 'c>(
    path: &Path,
    st: &PathState,
    states: &HashMap<&OsStr, &PathState>,
    current: &dyn Fn(&Path) -> Option<&'a roar_store::hash::Hashed>,
    cache: &dyn Fn() -> Option<&'c Connection>,
    opts: HashOptions,
) -> Option<ContentHash> {
    if let Some(read) = &st.read_stat {
        // Unchanged since the job opened it: its current content is what was read.
        if let Some(now) = current(path) {
            if same_content_identity(&now.stat, read) {
                return Some(now.hash.clone());
            }
        }
        // Replaced since (sed -i, an in-place rewrite): known only if hashed before the job.
        return cache().and_then(|c| cache_get(c, read, opts));
    }
    let (to, moved_ns) = st.moved_to.as_ref()?;
    let dst = states.get(to.as_os_str())?;
    // Written there after the move: the moved bytes are gone (writes before it were replaced).
    if dst.written_ns.is_some_and(|w| w >= *moved_ns) {
        return None;
    }
    current(to).map(|h| h.hash.clone())
}

/// Rename changes ctime but not content; size, mtime and inode still identify the bytes.
fn same_content_identity(a: &FileStat, b: &FileStat) -> bool {
    a.dev == b.dev && a.ino == b.ino && a.size == b.size && a.mtime_ns == b.mtime_ns
}
