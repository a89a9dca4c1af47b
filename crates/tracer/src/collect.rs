//! Turns a job's event stream into what the store records: each path classified as input, output
//! or temporary with its content hash, and the process tree.
//!
//! Per path, in event order: a read of content the job did not make marks the path as an input
//! (its identity at that first read is kept); a write, truncate, or rename onto it makes its final
//! content an output; content the job created and then removed is a temporary. Renames carry a
//! path's state to its new name, so `write tmp; rename tmp out` yields the output `out`.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use roar_store::hash::{
    cache_get, hash_paths, hash_paths_on_this_thread, Connection, HashError, HashOptions, Prior,
};
use roar_store::{
    ContentHash, FileChunk, FileRecord, FileStat, Made, Ops, PathUse, ProcessRecord, Role,
};

use crate::early::Early;
use crate::event::Event;
use crate::ignore::Ignore;

/// Maps keyed by a path's bytes (`OsStr`: the events' paths are already normalised, and `Path`'s
/// own hash and equality walk components), hashed with foldhash: both showed in profiles of jobs
/// with many files.
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub(crate) type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

#[derive(Debug, Clone, Default)]
struct PathState {
    ops: Ops,
    first_ns: i64,
    last_ns: i64,
    /// Content the job did not make was read (or kept by an appending/in-place write).
    reads_prior: bool,
    /// Identity of that prior content when first opened.
    read_stat: Option<FileStat>,
    /// The content now at the path was made by the job.
    job_made: bool,
    /// As far as the events tell, the path exists at the end.
    exists: bool,
    /// A pre-existing file moved away from here, unread, now lives at this path (since `.1`).
    moved_to: Option<(PathBuf, i64)>,
    /// When the job last opened the path for writing or truncated it.
    written_ns: Option<i64>,
    /// A hard link the job made to a file it had not made: the other name, whose content a write
    /// through this one changes (same inode).
    alias_of: Option<PathBuf>,
}

/// A job's paths, classified but not yet hashed.
#[derive(Debug, Default)]
pub struct Classified {
    paths: Vec<(PathBuf, PathState)>,
    pub processes: Vec<ProcessRecord>,
    /// The ignored paths the job touched, each once, in first-seen order: not data, but the
    /// evidence of its environment (the packages it loaded: `roar_env`).
    pub environment: Vec<PathBuf>,
}

const O_ACCMODE: i32 = libc::O_ACCMODE;

/// What classification knows of a path it has seen in an event.
#[derive(Clone, Copy)]
enum Seen {
    /// Matched the ignore globs (checked once per distinct path, not per event).
    Ignored,
    /// Tracked: its index in [`Paths::list`].
    At(usize),
}

/// Which paths are not data: the ignore globs, or (classifying part of a job whose whole was
/// classified already) the verdicts the job's classification reached, without matching again.
pub(crate) enum Judge<'a> {
    Globs(&'a Ignore),
    /// The paths the job's classification found ignored ([`Classified::environment`]).
    Known(&'a HashSet<&'a OsStr>),
}

impl Judge<'_> {
    fn is_ignored(&self, path: &Path) -> bool {
        match self {
            Judge::Globs(ignore) => ignore.is_ignored(path),
            Judge::Known(ignored) => ignored.contains(path.as_os_str()),
        }
    }
}

/// The job's tracked paths in first-seen order, and one lookup per event for a path's state or
/// for its ignore verdict: events of a job with many files are mostly first and second sightings
/// of one path each, so every extra map probe showed in profiles.
struct Paths<'a> {
    ignore: &'a Judge<'a>,
    seen: HashMap<OsString, Seen>,
    /// `None` once a directory move re-keyed the path onto an earlier entry.
    list: Vec<(PathBuf, Option<PathState>)>,
    /// Ignored paths, at first sight.
    ignored: Vec<PathBuf>,
}

impl Paths<'_> {
    /// The state of `path`, created at `ts` on first sight; `None` if the path is ignored.
    fn get(&mut self, path: &Path, ts: i64) -> Option<&mut PathState> {
        let i = match self.seen.get(path.as_os_str()) {
            Some(Seen::Ignored) => return None,
            Some(Seen::At(i)) => *i,
            None => {
                if self.ignore.is_ignored(path) {
                    self.seen.insert(path.as_os_str().to_owned(), Seen::Ignored);
                    self.ignored.push(path.to_owned());
                    return None;
                }
                self.track(path.to_owned(), ts)
            }
        };
        let st = self.list[i]
            .1
            .as_mut()
            .expect("a seen path's entry is live");
        st.last_ns = ts;
        Some(st)
    }

    /// The state of a path already tracked, untouched (no access is recorded).
    fn state_mut(&mut self, path: &Path) -> Option<&mut PathState> {
        match self.seen.get(path.as_os_str()) {
            Some(Seen::At(i)) => self.list[*i].1.as_mut(),
            _ => None,
        }
    }

    fn track(&mut self, path: PathBuf, ts: i64) -> usize {
        let i = self.list.len();
        self.seen.insert(path.as_os_str().to_owned(), Seen::At(i));
        self.list.push((
            path,
            Some(PathState {
                first_ns: ts,
                ..PathState::default()
            }),
        ));
        i
    }

    fn is_tracked(&self, path: &Path) -> bool {
        matches!(self.seen.get(path.as_os_str()), Some(Seen::At(_)))
    }

    /// Whether a rename `from -> to` moved a directory, from what the job itself showed: it made
    /// or removed a directory at either name, or used paths below `from/`. Only when the job
    /// showed nothing is the filesystem asked (after the job, so a directory renamed and then
    /// deleted is known only from the events).
    fn is_dir(&self, from: &Path, to: &Path, dirs: &HashSet<&Path>) -> bool {
        dirs.contains(from)
            || dirs.contains(to)
            || self
                .list
                .iter()
                .any(|(p, st)| st.is_some() && p != from && p.starts_with(from))
            || to.is_dir()
    }

    /// Re-keys every tracked path below `from/` to the same place below `to/`. The moved state
    /// replaces one already at the new name (it is what lives there now) and keeps the earlier of
    /// the two places in the order.
    fn move_children(&mut self, from: &Path, to: &Path) {
        for i in 0..self.list.len() {
            let (p, st) = &mut self.list[i];
            let Ok(rest) = p.strip_prefix(from) else {
                continue;
            };
            if rest.as_os_str().is_empty() || st.is_none() {
                continue;
            }
            let new = to.join(rest);
            let mut moved = st.take().expect("checked above");
            moved.ops.insert(Ops::RENAME);
            let old = std::mem::replace(p, new.clone());
            self.seen.remove(old.as_os_str());
            match self.seen.get(new.as_os_str()) {
                Some(Seen::At(j)) if *j < i => {
                    let j = *j;
                    self.list[j].1 = Some(moved);
                }
                Some(Seen::At(j)) => {
                    let j = *j;
                    self.list[j].1 = None;
                    self.list[i].1 = Some(moved);
                    self.seen.insert(new.into_os_string(), Seen::At(i));
                }
                _ => {
                    self.list[i].1 = Some(moved);
                    self.seen.insert(new.into_os_string(), Seen::At(i));
                }
            }
        }
    }
}

impl Classified {
    /// Each tracked path with how the job used it, in first-seen order: the use, the operations,
    /// and when it was first and last touched.
    pub(crate) fn uses(&self) -> impl Iterator<Item = (&Path, PathUse, Ops, i64, i64)> {
        self.paths
            .iter()
            .map(|(p, st)| (p.as_path(), path_use(st), st.ops, st.first_ns, st.last_ns))
    }

    /// The paths whose prior content the job read: its inputs, before hashing.
    pub fn read_paths(&self) -> impl Iterator<Item = &Path> {
        self.paths
            .iter()
            .filter(|(_, st)| st.reads_prior)
            .map(|(p, _)| p.as_path())
    }
}

/// Classifies every path the events touched. `ctime_floor_ns` ([`crate::ctime_floor_ns`] taken
/// before the command started) decides whether a file the job opened existed before it: a ctime
/// at or above it means the inode changed during the job.
pub fn classify(events: &[Event], ctime_floor_ns: i64, ignore: &Ignore) -> Classified {
    classify_part(
        events.iter(),
        &made_dirs(events),
        ctime_floor_ns,
        &Judge::Globs(ignore),
    )
}

/// Directories the job made or removed, by name: a rename of one moves what is below it.
pub(crate) fn made_dirs(events: &[Event]) -> HashSet<&Path> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Mkdir { path, .. } | Event::Rmdir { path, .. } => Some(path.as_path()),
            _ => None,
        })
        .collect()
}

/// [`classify`] of some of a job's events (one step's), with the directories the whole job made.
pub(crate) fn classify_part<'e>(
    events: impl Iterator<Item = &'e Event>,
    dirs: &HashSet<&Path>,
    ctime_floor_ns: i64,
    ignore: &Judge,
) -> Classified {
    let mut paths = Paths {
        ignore,
        seen: HashMap::default(),
        list: Vec::new(),
        ignored: Vec::new(),
    };
    let mut processes: Vec<ProcessRecord> = Vec::new();
    let mut latest: HashMap<i32, usize> = HashMap::default();
    // Where pre-existing content moved away unread lies now (`moved_to`), by path: a later rename
    // moves it on (`mv a tmp; mv tmp a`), and its input content is read where it lands last.
    let mut landed: HashMap<PathBuf, PathBuf> = HashMap::default();

    for ev in events {
        match ev {
            Event::Exec {
                pid,
                ppid,
                exe,
                argv,
                ts_ns,
                ..
            } => {
                latest.insert(*pid, processes.len());
                processes.push(ProcessRecord {
                    pid: *pid,
                    parent_pid: Some(*ppid),
                    exe: Some(exe.clone()),
                    argv: argv.clone(),
                    started_ns: Some(*ts_ns),
                    ended_ns: None,
                });
            }
            Event::Fork { pid, ppid, ts_ns } => {
                let parent = latest.get(ppid).map(|&i| processes[i].clone());
                latest.insert(*pid, processes.len());
                processes.push(ProcessRecord {
                    pid: *pid,
                    parent_pid: Some(*ppid),
                    exe: parent.as_ref().and_then(|p| p.exe.clone()),
                    argv: parent.map(|p| p.argv).unwrap_or_default(),
                    started_ns: Some(*ts_ns),
                    ended_ns: None,
                });
            }
            Event::Exit { pid, ts_ns } => {
                if let Some(&i) = latest.get(pid) {
                    processes[i].ended_ns = Some(*ts_ns);
                }
            }
            Event::Open {
                path,
                flags,
                stat,
                ts_ns,
                ..
            } => {
                // O_TMPFILE names the directory an anonymous file is made in: nothing happened at
                // that path. The file gets a name, if ever, by a link, recorded as such.
                if flags & libc::O_TMPFILE == libc::O_TMPFILE {
                    continue;
                }
                let Some(st) = paths.get(path, *ts_ns) else {
                    continue;
                };
                let acc = flags & O_ACCMODE;
                let reads = acc == libc::O_RDONLY || acc == libc::O_RDWR;
                let writes = acc == libc::O_WRONLY || acc == libc::O_RDWR;
                let truncates = flags & libc::O_TRUNC != 0 && writes;
                let first_access = st.ops == Ops::default();
                let created_now = flags & libc::O_CREAT != 0
                    && (flags & libc::O_EXCL != 0
                        || stat.is_some_and(|s| s.size == 0 && s.ctime_ns >= ctime_floor_ns));
                // No old bytes: the job removed the path earlier, or creates/truncates it on first touch.
                let no_prior =
                    (!first_access && !st.exists) || (first_access && (truncates || created_now));
                let prior_is_foreign = !st.job_made && !no_prior;
                if reads {
                    st.ops.insert(Ops::READ);
                }
                if (reads || (writes && !truncates)) && prior_is_foreign {
                    // Appending or writing in place keeps the old bytes: they are an input too,
                    // unless there were none (a new, empty file).
                    let has_prior =
                        reads || stat.is_some_and(|s| s.size > 0 && s.ctime_ns < ctime_floor_ns);
                    if has_prior && !st.reads_prior {
                        st.reads_prior = true;
                        st.read_stat = *stat;
                    }
                }
                if writes {
                    st.ops.insert(Ops::WRITE);
                    st.written_ns = Some(*ts_ns);
                    st.job_made = true;
                    if flags & libc::O_CREAT != 0
                        && stat.is_some_and(|s| s.ctime_ns >= ctime_floor_ns)
                    {
                        st.ops.insert(Ops::CREATE);
                    }
                }
                if truncates {
                    st.ops.insert(Ops::TRUNCATE);
                }
                st.exists = true;
                let alias = st.alias_of.clone().filter(|_| writes);
                if let Some(st) = alias.and_then(|a| paths.get(&a, *ts_ns)) {
                    // Written through another name: this one changes too, and bytes the write
                    // keeps were this name's before the job.
                    if !truncates
                        && !st.job_made
                        && !st.reads_prior
                        && stat.is_some_and(|s| s.size > 0)
                    {
                        st.reads_prior = true;
                        st.read_stat = *stat;
                    }
                    st.ops.insert(Ops::WRITE);
                    st.written_ns = Some(*ts_ns);
                    st.job_made = true;
                    st.exists = true;
                }
            }
            Event::Truncate { path, ts_ns, .. } => {
                let Some(st) = paths.get(path, *ts_ns) else {
                    continue;
                };
                st.ops.insert(Ops::TRUNCATE | Ops::WRITE);
                st.written_ns = Some(*ts_ns);
                st.job_made = true;
                st.exists = true;
            }
            Event::Rename {
                from, to, ts_ns, ..
            }
            | Event::Link {
                from, to, ts_ns, ..
            } => {
                let is_rename = matches!(ev, Event::Rename { .. });
                if is_rename && !paths.is_tracked(from) && paths.is_dir(from, to, dirs) {
                    // A directory moved: what the job did inside it now lives under the new name.
                    paths.move_children(from, to);
                    continue;
                }
                let ignored_to = ignore.is_ignored(to);
                // Content that had landed at `to` is replaced there: gone, so unknown.
                if let Some(origin) = landed.remove(to) {
                    if let Some(st) = paths.state_mut(&origin) {
                        st.moved_to = None;
                    }
                }
                if is_rename {
                    if let Some(origin) = landed.remove(from) {
                        // Written where they lay, the bytes moving on are no longer the input's.
                        let kept =
                            !ignored_to && !rewritten_since_landing(&mut paths, &origin, from);
                        if let Some(st) = paths.state_mut(&origin) {
                            st.moved_to = kept.then(|| (to.clone(), *ts_ns));
                        }
                        if kept {
                            landed.insert(to.clone(), origin);
                        }
                    }
                }
                let src = paths.get(from, *ts_ns).map(|st| {
                    let snapshot = st.clone();
                    if is_rename {
                        st.ops.insert(Ops::RENAME);
                        st.exists = false;
                        if !st.job_made && !st.reads_prior {
                            // A pre-existing file moved away unread: consumed as an input, and
                            // its content is whatever lands at the destination.
                            st.reads_prior = true;
                            if !ignored_to {
                                st.moved_to = Some((to.clone(), *ts_ns));
                            }
                        }
                    }
                    snapshot
                });
                if is_rename
                    && src.as_ref().is_some_and(|s| !s.job_made && !s.reads_prior)
                    && !ignored_to
                {
                    landed.insert(to.clone(), from.clone());
                }
                let Some(dst) = paths.get(to, *ts_ns) else {
                    continue;
                };
                dst.ops.insert(Ops::RENAME);
                dst.exists = true;
                if !is_rename {
                    // A new name for content the job did not make: writes through it change the
                    // old name too.
                    dst.alias_of = src
                        .as_ref()
                        .filter(|s| !s.job_made)
                        .map(|s| s.alias_of.clone().unwrap_or_else(|| from.clone()));
                }
                // New content at the destination either way; its old content, if the job had read
                // it, stays an input through `reads_prior`.
                dst.job_made = true;
                if src.is_some_and(|s| s.ops.contains(Ops::CREATE)) {
                    dst.ops.insert(Ops::CREATE);
                }
            }
            Event::Unlink { path, ts_ns, .. } => {
                let Some(st) = paths.get(path, *ts_ns) else {
                    continue;
                };
                st.ops.insert(Ops::UNLINK);
                st.exists = false;
            }
            Event::Exchange { a, b, ts_ns, .. } => {
                if paths.is_dir(a, b, dirs) {
                    // Two directories swapped: what the job did below each now lives below the
                    // other name (through a temporary name no path can have).
                    let swap = a.join("\0roar-exchange");
                    paths.move_children(a, &swap);
                    paths.move_children(b, a);
                    paths.move_children(&swap, b);
                    continue;
                }
                // Each name now holds the other's content: each is made by the job, and each
                // prior content the job had not made is consumed, its bytes now at the other name.
                // Content that had landed at either name moves to the other.
                let was = [(landed.remove(a), a, b), (landed.remove(b), b, a)];
                for (origin, here, there) in was {
                    if let Some(origin) = origin {
                        let kept = !rewritten_since_landing(&mut paths, &origin, here);
                        if let Some(st) = paths.state_mut(&origin) {
                            st.moved_to = kept.then(|| (there.clone(), *ts_ns));
                        }
                        if kept {
                            landed.insert(there.clone(), origin);
                        }
                    }
                }
                for (here, there) in [(a, b), (b, a)] {
                    let ignored_there = ignore.is_ignored(there);
                    if let Some(st) = paths.get(here, *ts_ns) {
                        st.ops.insert(Ops::RENAME);
                        if !st.job_made && !st.reads_prior {
                            st.reads_prior = true;
                            if !ignored_there {
                                st.moved_to = Some((there.clone(), *ts_ns));
                                landed.insert(there.clone(), here.clone());
                            }
                        }
                    }
                }
                for p in [a, b] {
                    if let Some(st) = paths.get(p, *ts_ns) {
                        st.job_made = true;
                        st.exists = true;
                    }
                }
            }
            Event::Symlink { path, ts_ns, .. } => {
                // symlink(2) fails if the name exists: the job made this path. Removed later
                // (configure's `conftest.sym`), it is a temp, not a deleted pre-existing file.
                let Some(st) = paths.get(path, *ts_ns) else {
                    continue;
                };
                st.ops.insert(Ops::CREATE);
                st.job_made = true;
                st.exists = true;
            }
            Event::Mkdir { .. } | Event::Rmdir { .. } | Event::Untraced { .. } => {}
        }
    }
    let environment = paths.ignored;
    let paths = paths
        .list
        .into_iter()
        .filter_map(|(p, st)| st.map(|st| (p, st)))
        .collect();
    Classified {
        paths,
        processes,
        environment,
    }
}

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
    sink: &mut dyn FnMut(FileChunk),
) -> Hashed {
    let mut summary = Hashed::default();
    // Members read through an archive mount: the mount knows what they are (and their hash).
    let from_archives = archive_members(&mut classified.paths);
    summary.inputs += from_archives.len();
    // Destinations of renames: their current content may pin an input's, so they are hashed with
    // the inputs.
    let moved_to: HashSet<&OsStr> = classified
        .paths
        .iter()
        .filter_map(|(_, st)| st.moved_to.as_ref().map(|(to, _)| to.as_os_str()))
        .collect();
    // Outputs and nothing else, hashed during the run (and, if big, still as they were then), and
    // nobody's rename destination.
    let later: Vec<bool> = classified
        .paths
        .iter()
        .map(|(path, st)| {
            let p = path.as_os_str();
            path_use(st).records() == (false, Some(Made::Output))
                && !moved_to.contains(p)
                && early.get(p).is_some_and(|h| {
                    h.hash.size < CONFIRM_FIRST
                        || std::fs::metadata(path)
                            .is_ok_and(|m| FileStat::from_metadata(&m) == h.stat)
                })
        })
        .collect();

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
    let batch = hash_paths(&want, opts, &|i| prior[i], cache, &|_| {});
    summary.hashed_early += count_early(prior.iter().copied(), &batch.results);
    let current = |p: &Path| -> Option<&roar_store::hash::Hashed> {
        batch.results[*index.get(p.as_os_str())?].as_ref().ok()
    };

    let mut files = from_archives;
    for ((path, st), later) in classified.paths.iter().zip(&later) {
        if *later {
            continue;
        }
        let record =
            |role: Role, hash: Option<ContentHash>| file_record(role, path.clone(), st, hash);
        let (input, made) = path_use(st).records();
        if input {
            let hash = input_hash(path, st, &states, &current, cache, opts);
            if hash.is_none() {
                summary.unhashed_inputs += 1;
            }
            summary.inputs += 1;
            files.push(record(Role::Input, hash));
        }
        match made {
            Some(Made::Output) => {
                files.push(record(Role::Output, current(path).map(|h| h.hash.clone())))
            }
            Some(Made::Temp) => files.push(record(Role::Temp, None)),
            Some(Made::Deleted) => files.push(record(Role::Output, None)),
            None => {}
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
    let mut rest = classified
        .paths
        .into_iter()
        .zip(later)
        .filter_map(|(p, later)| later.then_some(p))
        .peekable();
    while rest.peek().is_some() {
        let (paths, states): (Vec<PathBuf>, Vec<PathState>) = rest.by_ref().take(CHUNK).unzip();
        let earlier: Vec<&roar_store::hash::Hashed> =
            paths.iter().map(|p| &early[p.as_os_str()]).collect();
        let batch = hash_paths_on_this_thread(&paths, opts, &|i| Prior::Hashed(earlier[i]), cache);
        let priors = earlier.iter().map(|e| Prior::Hashed(e));
        summary.hashed_early += count_early(priors, &batch.results);
        summary.outputs += paths.len();
        let files = paths
            .into_iter()
            .zip(&states)
            .zip(batch.results)
            .map(|((path, st), r)| file_record(Role::Output, path, st, r.ok().map(|h| h.hash)))
            .collect();
        sink(FileChunk {
            files,
            cache: batch.new_cache,
        });
    }
    summary
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
        .any(|(_, st)| path_use(st).records() == (true, None))
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
        let only_read = path_use(st).records() == (true, None);
        if !only_read || !mounts.iter().any(|m| path.starts_with(m)) {
            return true;
        }
        let Some(r) = roar_archive::mounted::member_at(path) else {
            return true;
        };
        records.push(file_record(
            Role::Input,
            r.path,
            st,
            Some(hash(&r.blake3, r.size)),
        ));
        if archives.insert(r.archive.clone()) {
            let h = hash(&r.archive_blake3, r.archive_size);
            records.push(file_record(Role::Input, r.archive, st, Some(h)));
        }
        false
    });
    // A job that also opened the archive file itself has its own record of it.
    let opened: HashSet<&Path> = paths.iter().map(|(p, _)| p.as_path()).collect();
    records.retain(|r| !archives.contains(&r.path) || !opened.contains(r.path.as_path()));
    records
}

/// Whether the job wrote at `at` after the content of `origin` landed there.
fn rewritten_since_landing(paths: &mut Paths, origin: &Path, at: &Path) -> bool {
    let landed_ns = paths
        .state_mut(origin)
        .and_then(|st| st.moved_to.as_ref().map(|(_, ts)| *ts));
    let written_ns = paths.state_mut(at).and_then(|st| st.written_ns);
    matches!((written_ns, landed_ns), (Some(w), Some(l)) if w >= l) || landed_ns.is_none()
}

fn path_use(st: &PathState) -> PathUse {
    PathUse {
        read_prior: st.reads_prior,
        job_made: st.job_made,
        exists: st.exists,
        unlinked: st.ops.contains(Ops::UNLINK),
    }
}

fn file_record(role: Role, path: PathBuf, st: &PathState, hash: Option<ContentHash>) -> FileRecord {
    FileRecord {
        role,
        path,
        hash,
        before: None,
        ops: st.ops,
        first_ns: Some(st.first_ns),
        last_ns: Some(st.last_ns),
        s3: None,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &Path, ts_ns: i64) -> Event {
        Event::Open {
            pid: 1,
            path: path.to_owned(),
            flags: libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            stat: None,
            ts_ns,
        }
    }

    #[test]
    fn a_directory_move_rekeys_what_the_job_did_inside_it() {
        let dir = tempfile::tempdir().unwrap();
        let (tmp, done) = (dir.path().join("tmp"), dir.path().join("done"));
        // The move already happened on disk: classification only asks whether `to` is a directory.
        std::fs::create_dir(&done).unwrap();
        let events = [
            open(&done.join("a"), 1),
            open(&tmp.join("a"), 2),
            open(&tmp.join("b"), 3),
            open(&done.join("c"), 4),
            Event::Rename {
                pid: 1,
                from: tmp.clone(),
                to: done.clone(),
                ts_ns: 5,
            },
            open(&tmp.join("a"), 6),
        ];
        let c = classify(&events, 0, &Ignore::new(&[]));
        let got: Vec<(PathBuf, i64, bool)> = c
            .paths
            .iter()
            .map(|(p, st)| (p.clone(), st.first_ns, st.ops.contains(Ops::RENAME)))
            .collect();
        assert_eq!(
            got,
            [
                // done/a keeps its place; what lives there now is the moved tmp/a.
                (done.join("a"), 2, true),
                (done.join("b"), 3, true),
                (done.join("c"), 4, false),
                // A new file at the old name after the move is a path of its own.
                (tmp.join("a"), 6, false),
            ]
        );
    }

    #[test]
    fn a_moved_file_takes_the_earlier_place_of_the_path_it_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let (tmp, done) = (dir.path().join("tmp"), dir.path().join("done"));
        std::fs::create_dir(&done).unwrap();
        let events = [
            open(&tmp.join("x"), 1),
            open(&done.join("y"), 2),
            open(&done.join("x"), 3),
            Event::Rename {
                pid: 1,
                from: tmp.clone(),
                to: done.clone(),
                ts_ns: 4,
            },
        ];
        let c = classify(&events, 0, &Ignore::new(&[]));
        let got: Vec<(PathBuf, i64)> = c
            .paths
            .iter()
            .map(|(p, st)| (p.clone(), st.first_ns))
            .collect();
        assert_eq!(got, [(done.join("x"), 1), (done.join("y"), 2)]);
    }

    /// Where the content of a pre-existing file moved away unread is looked for, after `events`
    /// (files, never directories: nothing here exists on disk).
    fn landing(events: &[Event], of: &Path) -> Option<PathBuf> {
        let c = classify(events, 0, &Ignore::new(&[]));
        let (_, st) = c.paths.iter().find(|(p, _)| p == of).expect("tracked");
        assert!(st.reads_prior, "a file moved away unread is an input");
        st.moved_to.as_ref().map(|(to, _)| to.clone())
    }

    fn mv(from: &Path, to: &Path, ts_ns: i64) -> Event {
        Event::Rename {
            pid: 1,
            from: from.to_owned(),
            to: to.to_owned(),
            ts_ns,
        }
    }

    #[test]
    fn moved_content_is_followed_to_where_it_lands_last() {
        let d = Path::new("/nonexistent-roar-test");
        let (a, t, u) = (d.join("a"), d.join("t"), d.join("u"));
        // `mv a t; mv t u`: the input's bytes are at u.
        assert_eq!(landing(&[mv(&a, &t, 1), mv(&t, &u, 2)], &a), Some(u));
        // `mv a t; mv t a`: back at its own name.
        assert_eq!(
            landing(&[mv(&a, &t, 1), mv(&t, &a, 2)], &a),
            Some(a.clone())
        );
        // An exchange with the landing place carries them to the other name.
        let x = Event::Exchange {
            pid: 1,
            a: t.clone(),
            b: d.join("v"),
            ts_ns: 2,
        };
        assert_eq!(landing(&[mv(&a, &t, 1), x], &a), Some(d.join("v")));
    }

    #[test]
    fn moved_content_replaced_where_it_landed_is_unknown_not_the_new_content() {
        let d = Path::new("/nonexistent-roar-test");
        let (a, c, t) = (d.join("a"), d.join("c"), d.join("t"));
        // `mv a t; mv c t`: a's bytes are gone; t holds c's.
        assert_eq!(landing(&[mv(&a, &t, 1), mv(&c, &t, 2)], &a), None);
        // `mv a t; echo x >> t; mv t u`: what reaches u is not a's any more.
        let append = Event::Open {
            pid: 1,
            path: t.clone(),
            flags: libc::O_WRONLY | libc::O_APPEND,
            stat: None,
            ts_ns: 2,
        };
        assert_eq!(
            landing(&[mv(&a, &t, 1), append, mv(&t, &d.join("u"), 3)], &a),
            None
        );
    }
}
