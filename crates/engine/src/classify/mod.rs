//! The rule that turns a job's events into what the store records of each path it touched: input,
//! output, temporary or deleted, with the facts its content is pinned by. Every observer feeds it:
//! `roar run`'s backends after the job, the mount as requests arrive ([`Rules::apply`], one event
//! at a time; nothing is kept per event).
//!
//! Per path, in event order: a read of content the job did not make marks the path as an input
//! (its identity at that first read is kept); a write, truncate, or rename onto it makes its final
//! content an output; content the job created and then removed is a temporary. Renames carry a
//! path's state to its new name, so `write tmp; rename tmp out` yields the output `out`. A hard
//! link the job made is the same file under two names: a write through either changes both.
//!
//! Whether content at a path predates the job: the job's own events say so where they can (it
//! linked or renamed from the path before changing it, it removed it, it made it); only where
//! they are silent is the file's ctime against the job's start asked, since the job's own link or
//! chmod moves a ctime too.

use std::path::{Path, PathBuf};

use roar_store::ignore::Ignore;
use roar_store::{ContentHash, FileStat, Ops, PathUse, ProcessRecord};

use crate::event::Event;

mod facts;
mod links;
mod paths;
mod state;

use links::Through;
pub use paths::Judge;
use paths::{Paths, Seen};
pub use state::{PathState, Version};

/// Maps keyed by a path's bytes (`OsStr`: the events' paths are already normalised, and `Path`'s
/// own hash and equality walk components), hashed with foldhash: both showed in profiles of jobs
/// with many files.
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// A job's paths, classified but not yet hashed.
#[derive(Debug, Default)]
pub struct Classified {
    /// Every tracked path with its state, in first-seen order.
    pub paths: Vec<(PathBuf, PathState)>,
    pub processes: Vec<ProcessRecord>,
    /// The ignored paths the job touched, each once, in first-seen order: not data, but the
    /// evidence of its environment (the packages it loaded: `roar_env`).
    pub environment: Vec<PathBuf>,
}

const O_ACCMODE: i32 = libc::O_ACCMODE;

impl Classified {
    /// Each tracked path with how the job used it, in first-seen order: the use, the operations,
    /// and when it was first and last touched.
    pub fn uses(&self) -> impl Iterator<Item = (&Path, PathUse, Ops, i64, i64)> {
        self.paths
            .iter()
            .map(|(p, st)| (p.as_path(), st.path_use(), st.ops, st.first_ns, st.last_ns))
    }

    /// The paths whose prior content the job read: its inputs, before hashing.
    pub fn read_paths(&self) -> impl Iterator<Item = &Path> {
        self.paths
            .iter()
            .filter(|(_, st)| st.reads_prior)
            .map(|(p, _)| p.as_path())
    }
}

/// Classifies every path the events touched. `ctime_floor_ns` (taken before the command started)
/// decides, where the job's events do not, whether a file the job opened existed before it: a
/// ctime at or above it means the inode changed during the job.
pub fn classify(events: &[Event], ctime_floor_ns: i64, ignore: &Ignore) -> Classified {
    classify_part(
        events.iter(),
        &made_dirs(events),
        ctime_floor_ns,
        &Judge::Globs(ignore),
    )
}

/// Directories the job made or removed, by name, and the names a directory was renamed through
/// on its way to a name that is a directory after the job (`mv d0 d1; mv d1 d0` shows nothing
/// else): a rename of one moves what is below it. Asks the filesystem, so only after the job.
pub fn made_dirs(events: &[Event]) -> HashSet<&Path> {
    let mut dirs: HashSet<&Path> = events
        .iter()
        .filter_map(|e| match e {
            Event::Mkdir { path, .. } | Event::Rmdir { path, .. } => Some(path.as_path()),
            _ => None,
        })
        .collect();
    // Where what each rename moved ended up: later renames first, so `ends[name]` is where what
    // stood at `name` then went by the end of the job.
    let mut ends: HashMap<&Path, &Path> = HashMap::default();
    for e in events.iter().rev() {
        if let Event::Rename { from, to, .. } = e {
            let end = ends.get(to.as_path()).copied().unwrap_or(to.as_path());
            // A rename straight to its end is asked about by the rule itself (`is_dir`).
            if end != to.as_path() && end.is_dir() {
                dirs.extend([from.as_path(), to.as_path()]);
            }
            ends.insert(from.as_path(), end);
        }
    }
    dirs
}

/// [`classify`] of some of a job's events (one step's), with the directories the whole job made.
pub fn classify_part<'e>(
    events: impl Iterator<Item = &'e Event>,
    dirs: &HashSet<&Path>,
    ctime_floor_ns: i64,
    ignore: &Judge,
) -> Classified {
    let cx = Context {
        dirs,
        ctime_floor_ns,
        ignore,
        ask_filesystem: true,
    };
    let mut rules = Rules::default();
    for ev in events {
        rules.apply(&cx, ev);
    }
    // A name a directory move refilled and no later event touched holds at the end what the
    // move put there: the filesystem says whether that is a file.
    let refilled: Vec<PathBuf> = match rules.paths.unsettled {
        0 => Vec::new(),
        _ => rules.paths.refilled().map(Path::to_owned).collect(),
    };
    for path in refilled {
        let holds = path.symlink_metadata().is_ok_and(|m| !m.is_dir());
        rules.holds(&path, holds);
    }
    rules.finish()
}

/// What the rule is told besides the events: which paths are not data, since when a change is the
/// job's, and where to learn whether a renamed path is a directory.
pub struct Context<'a> {
    /// Directories known to be such by name: a rename of one moves what is below it.
    pub dirs: &'a HashSet<&'a Path>,
    /// A ctime at or above this (the coarse clock before the job started) is the job's change.
    pub ctime_floor_ns: i64,
    pub ignore: &'a Judge<'a>,
    /// Whether a rename the events do not show to be a directory's may be asked of the
    /// filesystem (never by the mount, whose paths lead back into itself).
    pub ask_filesystem: bool,
}

/// The rule as a state machine: one job's state, changed by one event at a time.
#[derive(Default)]
pub struct Rules {
    paths: Paths,
    processes: Vec<ProcessRecord>,
    /// Each process's latest record, by pid.
    latest: HashMap<i32, usize>,
    /// Where pre-existing content moved away unread lies now (`moved_to`), by path: a later
    /// rename moves it on (`mv a tmp; mv tmp a`), and its input content is read where it lands
    /// last.
    landed: HashMap<PathBuf, PathBuf>,
    /// The names the job gave a file by linking to it, by that file's first name.
    links: HashMap<PathBuf, Vec<PathBuf>>,
    /// First names (keys of `links`) that no longer name their file: removed, renamed away or
    /// renamed over. A file the job puts there later is another file.
    detached: HashSet<PathBuf>,
    /// The names each file (dev, ino) was seen under, by the events and the observers' facts:
    /// checked against each name's current file when looked up. Every name whose file becomes
    /// known is added ([`Rules::index`]): a fact about the file must reach it. Built at the first
    /// fact (from every path's file), so observers that give none (`roar run`'s) never pay for it.
    files: Option<HashMap<(u64, u64), Vec<PathBuf>>>,
    /// Events applied so far.
    seq: u64,
}

impl Rules {
    /// Applies one event.
    pub fn apply(&mut self, cx: &Context, ev: &Event) {
        self.seq += 1;
        self.decide(cx, ev);
        match ev {
            Event::Open { path, .. } => self.index(path),
            Event::Rename { to, .. } | Event::Link { to, .. } => self.index(to),
            Event::Exchange { a, b, .. } => {
                self.index(a);
                self.index(b);
            }
            _ => {}
        }
    }

    /// Where the job's events are now: a fact an observer is about to take (a hash) is told with
    /// the mark taken before it, and counts only for names no event changed since.
    pub fn mark(&self) -> u64 {
        self.seq
    }

    /// Remembers that `path` names the file it names now, if known.
    fn index(&mut self, path: &Path) {
        if self.files.is_none() {
            return;
        }
        let Some(file) = self.state(path).and_then(|st| st.file) else {
            return;
        };
        let names = self
            .files
            .as_mut()
            .expect("checked above")
            .entry(file)
            .or_default();
        if !names.iter().any(|p| p == path) {
            names.push(path.to_owned());
        }
    }

    fn decide(&mut self, cx: &Context, ev: &Event) {
        if self.paths.unsettled > 0 {
            for (path, holds) in evidence(cx, ev).into_iter().flatten() {
                self.holds(path, holds);
            }
        }
        match ev {
            Event::Exec {
                pid,
                ppid,
                exe,
                argv,
                ts_ns,
                ..
            } => {
                self.latest.insert(*pid, self.processes.len());
                self.processes.push(ProcessRecord {
                    pid: *pid,
                    parent_pid: Some(*ppid),
                    exe: Some(exe.clone()),
                    argv: argv.clone(),
                    started_ns: Some(*ts_ns),
                    ended_ns: None,
                });
            }
            Event::Fork { pid, ppid, ts_ns } => {
                let parent = self.latest.get(ppid).map(|&i| self.processes[i].clone());
                self.latest.insert(*pid, self.processes.len());
                self.processes.push(ProcessRecord {
                    pid: *pid,
                    parent_pid: Some(*ppid),
                    exe: parent.as_ref().and_then(|p| p.exe.clone()),
                    argv: parent.map(|p| p.argv).unwrap_or_default(),
                    started_ns: Some(*ts_ns),
                    ended_ns: None,
                });
            }
            Event::Exit { pid, ts_ns } => {
                if let Some(&i) = self.latest.get(pid) {
                    self.processes[i].ended_ns = Some(*ts_ns);
                }
            }
            Event::Open {
                path,
                flags,
                stat,
                ts_ns,
                ..
            } => self.open(cx, path, *flags, stat.as_ref(), *ts_ns),
            Event::Truncate { path, ts_ns, .. } => {
                // Under every name the job gave the file.
                let mut names = self.other_names(path);
                names.push(path.clone());
                for name in names {
                    if let Some(st) = self.paths.get(&name, *ts_ns, cx.ignore) {
                        // truncate(2) makes no file: on first touch, it found one here.
                        st.found |= st.ops == Ops::default() && !st.job_made;
                        st.ops.insert(Ops::TRUNCATE | Ops::WRITE);
                        st.written_ns = Some(*ts_ns);
                        st.job_made = true;
                        st.exists = true;
                        st.changed(self.seq);
                    }
                }
            }
            Event::Rename {
                from, to, ts_ns, ..
            } => self.rename_or_link(cx, from, to, true, *ts_ns),
            Event::Link {
                from, to, ts_ns, ..
            } => self.rename_or_link(cx, from, to, false, *ts_ns),
            Event::Unlink { path, ts_ns, .. } => {
                if let Some(st) = self.paths.get(path, *ts_ns, cx.ignore) {
                    // unlink(2) removes a file: on first touch, it found one here (a file the
                    // job makes there later and removes again does not hide the deletion).
                    st.found |= st.ops == Ops::default() && !st.job_made;
                    st.ops.insert(Ops::UNLINK);
                    st.exists = false;
                    st.changed(self.seq);
                    st.file = None;
                }
                self.unname(path);
                self.end_landing(path);
            }
            Event::Exchange { a, b, ts_ns, .. } => self.exchange(cx, a, b, *ts_ns),
            Event::Symlink { path, ts_ns, .. } => {
                // symlink(2) fails if the name exists: the job made this path. Removed later
                // (configure's `conftest.sym`), it is a temp, not a deleted pre-existing file.
                if let Some(st) = self.paths.get(path, *ts_ns, cx.ignore) {
                    st.ops.insert(Ops::CREATE);
                    st.job_made = true;
                    st.place();
                    st.exists = true;
                    st.changed(self.seq);
                    st.file = None;
                }
            }
            Event::Mkdir { .. } | Event::Rmdir { .. } | Event::Untraced { .. } => {}
        }
    }

    /// A directory moved from `from` to `to` (an observer that tells directories from files when
    /// they move: the mount): what the job did below it now lives below the new name. The names
    /// already below `to` are refilled: the observer says what each holds ([`Rules::holds`],
    /// [`Rules::refilled_below`]).
    pub fn moved_dir(&mut self, from: &Path, to: &Path) {
        self.paths.move_children(from, to);
        self.move_landings(from, to);
        // A fact about one of the moved files (a hash at its last writer's release) must reach
        // it under its new name.
        if self.files.is_some() {
            let below: Vec<PathBuf> = (self.paths.list.iter())
                .filter(|(p, st)| st.is_some() && p.starts_with(to))
                .map(|(p, _)| p.clone())
                .collect();
            for p in below {
                self.index(&p);
            }
        }
    }

    /// The names below `dir` a directory move refilled and nothing has settled yet.
    pub fn refilled_below(&self, dir: &Path) -> Vec<PathBuf> {
        self.paths
            .refilled()
            .filter(|p| p.starts_with(dir))
            .map(Path::to_owned)
            .collect()
    }

    /// Whether `path`, refilled by a directory move, holds a file (one the job never saw): its
    /// earlier history there ends (what the job read of the old file stays an input; a deletion
    /// or a temporary of the old name is superseded by the file now there). Holding nothing, the
    /// earlier history stands. A name not refilled is left alone.
    pub fn holds(&mut self, path: &Path, holds: bool) {
        let seq = self.seq;
        let Some(st) = self.paths.state_mut(path) else {
            return;
        };
        let was = st.refilled;
        st.refill(holds, seq);
        if was {
            self.paths.unsettled -= 1;
        }
    }

    /// Whether `path` may still name `file`: a change made through a handle on `file` happened
    /// at `path` only then (not once the path was renamed over or removed).
    pub fn names(&self, path: &Path, file: (u64, u64)) -> bool {
        self.state(path)
            .is_none_or(|st| st.file.map_or(st.exists, |f| f == file))
    }

    /// Whether the job has touched no recorded path yet.
    pub fn is_empty(&self) -> bool {
        self.paths.list.is_empty()
    }

    /// What the job did to `path` so far (None: untouched or ignored).
    pub fn state(&self, path: &Path) -> Option<&PathState> {
        match self.paths.seen.get(path.as_os_str()) {
            Some(Seen::At(i)) => self.paths.list[*i].1.as_ref(),
            _ => None,
        }
    }

    /// The job's paths as the events left them.
    pub fn finish(self) -> Classified {
        let environment = self.paths.ignored;
        let paths = self
            .paths
            .list
            .into_iter()
            .filter_map(|(p, st)| st.map(|st| (p, st)))
            .collect();
        Classified {
            paths,
            processes: self.processes,
            environment,
        }
    }

    fn open(&mut self, cx: &Context, path: &Path, flags: i32, stat: Option<&FileStat>, ts: i64) {
        // O_TMPFILE names the directory an anonymous file is made in: nothing happened at that
        // path. The file gets a name, if ever, by a link, recorded as such.
        if flags & libc::O_TMPFILE == libc::O_TMPFILE {
            return;
        }
        let floor = cx.ctime_floor_ns;
        let Some(st) = self.paths.get(path, ts, cx.ignore) else {
            return;
        };
        let acc = flags & O_ACCMODE;
        let reads = acc == libc::O_RDONLY || acc == libc::O_RDWR;
        let writes = acc == libc::O_WRONLY || acc == libc::O_RDWR;
        let truncates = flags & libc::O_TRUNC != 0 && writes;
        let first_access = st.ops == Ops::default();
        // Bytes this open reads (or a write keeps) were the link source's before the job.
        let linked_from = (st.linked_prior && (reads || !truncates))
            .then(|| st.alias_of.clone())
            .flatten();
        let created_now = flags & libc::O_CREAT != 0
            && !st.existed
            && (flags & libc::O_EXCL != 0
                || stat.is_some_and(|s| s.size == 0 && s.ctime_ns >= floor));
        // No old bytes: the job removed the path earlier, or creates/truncates it on first touch.
        let no_prior =
            (!first_access && !st.exists) || (first_access && (truncates || created_now));
        let prior_is_foreign = !st.job_made && !no_prior;
        // A file this open made: on first touch as the ctime or O_EXCL says, or where the job
        // had removed the one there.
        if flags & libc::O_CREAT != 0 && (created_now || (!first_access && !st.exists)) {
            st.place();
        }
        if first_access && !st.job_made && !created_now {
            let older = stat.is_some_and(|s| s.ctime_ns < floor);
            st.found |= flags & libc::O_CREAT == 0 || st.existed || older;
        }
        if let Some(s) = stat {
            st.file = Some((s.dev, s.ino));
        }
        if reads {
            st.ops.insert(Ops::READ);
        }
        if (reads || (writes && !truncates)) && prior_is_foreign {
            // Appending or writing in place keeps the old bytes: they are an input too, unless
            // there were none (a new, empty file). Only an open that may have created the file
            // (O_CREAT) leaves it to the ctime to say whether they predate the job.
            let predates =
                |s: &FileStat| flags & libc::O_CREAT == 0 || s.ctime_ns < floor || st.existed;
            let has_prior = reads || stat.is_some_and(|s| s.size > 0 && predates(s));
            if has_prior && !st.reads_prior {
                st.read_now(stat);
            }
        }
        // The content before this open, if known: what a write through another name keeps.
        let before = st.current().cloned();
        if writes {
            st.ops.insert(Ops::WRITE);
            st.written_ns = Some(ts);
            st.job_made = true;
            // O_EXCL succeeds only by creating; otherwise the ctime says whether it did.
            let excl = flags & libc::O_EXCL != 0;
            if flags & libc::O_CREAT != 0 && (excl || stat.is_some_and(|s| s.ctime_ns >= floor)) {
                st.ops.insert(Ops::CREATE);
            }
            st.changed(self.seq);
        }
        if truncates {
            st.ops.insert(Ops::TRUNCATE);
        }
        st.exists = true;
        if reads || writes {
            let through = Through {
                truncates,
                file: st.file,
                before: before.as_ref(),
                stat,
            };
            // The same file under every name the job gave it: which name an observer reports
            // (the mount knows an open by its inode alone) changes nothing in the record.
            let others = self.other_names(path);
            for other in &others {
                if writes {
                    self.written_through(cx, other, &through, ts);
                } else {
                    self.read_through(cx, other, &through, ts);
                }
                self.index(other);
            }
            // The link source no longer names the file (removed, renamed over, made again):
            // what was read here was its content before the job all the same.
            if let Some(origin) = linked_from.filter(|o| !others.contains(o)) {
                self.read_linked(cx, &origin, &through, ts);
            }
        }
    }
}

/// What an observer that sees content saw: `file` held `content` when the job's events were at
/// `mark` ([`Rules::mark`], taken before the content was read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    pub file: (u64, u64),
    pub content: ContentHash,
    pub mark: u64,
}

/// What an event shows of the names it touches, for names a directory move refilled: whether a
/// file was there (an open that did not make its file, an unlink, a truncate by path, a rename or
/// link from it, an exchange) or not (an open that made it). A rename, link or symlink onto a
/// name replaces whatever was there: the name's history goes on as if nothing had been.
fn evidence<'e>(cx: &Context, ev: &'e Event) -> [Option<(&'e Path, bool)>; 2] {
    match ev {
        Event::Open {
            path, flags, stat, ..
        } if flags & libc::O_TMPFILE != libc::O_TMPFILE => {
            let made = flags & libc::O_EXCL != 0
                || (flags & libc::O_CREAT != 0
                    && stat.is_some_and(|s| s.size == 0 && s.ctime_ns >= cx.ctime_floor_ns));
            [Some((path, !made)), None]
        }
        Event::Unlink { path, .. } | Event::Truncate { path, .. } => [Some((path, true)), None],
        Event::Rename { from, to, .. } | Event::Link { from, to, .. } => {
            [Some((from, true)), Some((to, false))]
        }
        Event::Symlink { path, .. } => [Some((path, false)), None],
        Event::Exchange { a, b, .. } => [Some((a, true)), Some((b, true))],
        _ => [None, None],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roar_store::Role;

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

    #[test]
    fn moved_content_deleted_where_it_landed_is_unknown_whatever_comes_there_later() {
        let d = Path::new("/nonexistent-roar-test");
        let (a, d0, d1) = (d.join("a"), d.join("d0"), d.join("d1"));
        let rm = |path: PathBuf, ts_ns| Event::Unlink {
            pid: 1,
            path,
            ts_ns,
        };
        // `mv a d0/t; rm d0/t; mv d1 d0`, a `d1/t` there before: a's bytes are gone, and what
        // is at d0/t at the end is d1's file (seed 5304127846756344154, program 5204: the
        // record gave a the hash of d1/t).
        let touch = Event::Open {
            pid: 1,
            path: d1.join("u"),
            flags: libc::O_RDONLY,
            stat: None,
            ts_ns: 3,
        };
        let events = [
            mv(&a, &d0.join("t"), 1),
            rm(d0.join("t"), 2),
            touch,
            mv(&d1, &d0, 4),
        ];
        assert_eq!(landing(&events, &a), None);
        // Removed where it landed, even with nothing there later.
        assert_eq!(landing(&events[..2], &a), None);
    }

    #[test]
    fn moved_content_moves_on_with_its_directory() {
        let d = Path::new("/nonexistent-roar-test");
        let (a, d0, d9) = (d.join("a"), d.join("d0"), d.join("d9"));
        // `mv a d0/t; mv d0 d9`: a's bytes are at d9/t.
        assert_eq!(
            landing(&[mv(&a, &d0.join("t"), 1), mv(&d0, &d9, 2)], &a),
            Some(d9.join("t"))
        );
    }

    fn stat(size: u64, ctime_ns: i64) -> Option<FileStat> {
        Some(FileStat {
            dev: 1,
            ino: 2,
            size,
            mtime_ns: ctime_ns,
            ctime_ns,
        })
    }

    #[test]
    fn bytes_kept_by_an_append_through_a_linked_file_are_an_input_whatever_its_ctime() {
        let d = Path::new("/nonexistent-roar-test");
        let (orig, alias) = (d.join("orig"), d.join("alias"));
        // The job's own link moved the file's ctime past the job's start (100).
        let append = |path: &Path, ts_ns| Event::Open {
            pid: 1,
            path: path.to_owned(),
            flags: libc::O_WRONLY | libc::O_APPEND,
            stat: stat(10, 150),
            ts_ns,
        };
        for through in [&orig, &alias] {
            let events = [
                Event::Link {
                    pid: 1,
                    from: orig.clone(),
                    to: alias.clone(),
                    ts_ns: 120,
                },
                append(through, 150),
            ];
            let c = classify(&events, 100, &Ignore::new(&[]));
            let st = |p: &Path| c.paths.iter().find(|(q, _)| q == p).unwrap().1.clone();
            let (o, a) = (st(&orig), st(&alias));
            assert!(
                o.reads_prior,
                "through {through:?}: the kept bytes are orig's input"
            );
            assert!(!a.reads_prior, "the new name held nothing before the job");
            assert!(
                o.job_made && a.job_made,
                "both names now hold what the job made"
            );
            assert!(o.ops.contains(Ops::WRITE) && a.ops.contains(Ops::WRITE));
        }
    }

    #[test]
    fn a_read_of_a_linked_name_a_file_was_renamed_onto_is_not_the_link_s_source() {
        // `ln f1 f3; mv g f3; cat f3`: f3 holds g's file, not f1's (found by the generator,
        // seed 1796058406997819105: an observer reporting no identity for g read f1 through f3).
        let d = Path::new("/nonexistent-roar-test");
        let (f1, f3, g) = (d.join("f1"), d.join("f3"), d.join("g"));
        let events = [
            Event::Link {
                pid: 1,
                from: f1.clone(),
                to: f3.clone(),
                ts_ns: 110,
            },
            Event::Rename {
                pid: 1,
                from: g.clone(),
                to: f3.clone(),
                ts_ns: 120,
            },
            Event::Open {
                pid: 1,
                path: f3.clone(),
                flags: libc::O_RDONLY,
                stat: None,
                ts_ns: 130,
            },
        ];
        let c = classify(&events, 100, &Ignore::new(&[]));
        let st = |p: &Path| c.paths.iter().find(|(q, _)| q == p).map(|(_, s)| s.clone());
        assert!(
            st(&f1).is_none_or(|s| !s.reads_prior),
            "f1 was not read: {:?}",
            st(&f1)
        );
        assert!(st(&g).unwrap().reads_prior, "g's file was consumed");
    }

    #[test]
    fn an_append_to_a_file_new_since_the_job_began_keeps_no_input() {
        let d = Path::new("/nonexistent-roar-test");
        let events = [Event::Open {
            pid: 1,
            path: d.join("log"),
            flags: libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT,
            stat: stat(10, 150),
            ts_ns: 150,
        }];
        let c = classify(&events, 100, &Ignore::new(&[]));
        assert!(!c.paths[0].1.reads_prior);
    }

    fn fact(r: &Rules, file: (u64, u64), content: ContentHash) -> Fact {
        Fact {
            file,
            content,
            mark: r.mark(),
        }
    }

    fn h(s: &str) -> ContentHash {
        ContentHash {
            blake3: s.to_owned(),
            sha256: None,
            size: 1,
        }
    }

    /// The context of the tests built from event sequences: nothing ignored, no directories, the
    /// job started at 100, the filesystem never asked.
    fn cx() -> Context<'static> {
        static IGNORE: std::sync::LazyLock<Ignore> = std::sync::LazyLock::new(|| Ignore::new(&[]));
        static JUDGE: std::sync::LazyLock<Judge<'static>> =
            std::sync::LazyLock::new(|| Judge::Globs(&IGNORE));
        static DIRS: std::sync::LazyLock<HashSet<&'static Path>> =
            std::sync::LazyLock::new(HashSet::default);
        Context {
            dirs: &DIRS,
            ctime_floor_ns: 100,
            ignore: &JUDGE,
            ask_filesystem: false,
        }
    }

    fn open_as(path: &Path, flags: i32, ino: u64, ts_ns: i64) -> Event {
        Event::Open {
            pid: 1,
            path: path.to_owned(),
            flags,
            stat: Some(FileStat {
                dev: 1,
                ino,
                size: 5,
                mtime_ns: 0,
                ctime_ns: 0,
            }),
            ts_ns,
        }
    }

    /// Found by the generator on the mount: a file's last writer released it after its directory
    /// moved; the hash must reach the file under its new name (the index of names by file had
    /// only the old one), as `roar run` and the mount both move directories.
    #[test]
    fn content_seen_after_a_directory_moved_reaches_the_file_under_its_new_name() {
        let cx = cx();
        let (d0, d1) = (Path::new("/d/d0"), Path::new("/d/d1"));
        let (g_old, g_new) = (d0.join("g1"), d1.join("g1"));
        for by_event in [true, false] {
            let mut r = Rules::default();
            r.apply(
                &cx,
                &open_as(&g_old, libc::O_WRONLY | libc::O_CREAT, 7, 150),
            );
            // A first fact (another file's) makes the index of names by file.
            r.found(
                &cx,
                Path::new("/d/other"),
                fact(&r, (1, 8), h("other")),
                151,
            );
            if by_event {
                // `roar run`: a rename whose source has the job's files below it.
                r.apply(&cx, &mv(d0, d1, 152));
            } else {
                r.moved_dir(d0, d1);
            }
            r.found_in(fact(&r, (1, 7), h("written")));
            let st = r.state(&g_new).expect("moved with its directory");
            assert_eq!(st.output(), Some(&h("written")), "by event: {by_event}");
        }
    }

    #[test]
    fn content_seen_before_an_in_place_write_is_the_input_and_at_the_release_the_output() {
        let cx = cx();
        let f = Path::new("/d/f");
        let mut r = Rules::default();
        r.found(&cx, f, fact(&r, (1, 7), h("old")), 150);
        r.apply(&cx, &open_as(f, libc::O_WRONLY, 7, 150));
        assert!(
            r.wants_content(&cx, f),
            "written: its content is not known yet"
        );
        r.found_in(fact(&r, (1, 7), h("new")));
        let st = r.state(f).unwrap();
        assert_eq!(st.input.as_ref(), Some(&h("old")));
        assert_eq!(st.output(), Some(&h("new")));
        // A later writable open: what was seen is not the content any more.
        r.apply(&cx, &open_as(f, libc::O_WRONLY, 7, 160));
        assert_eq!(r.state(f).unwrap().output(), None);
    }

    #[test]
    fn a_handle_released_after_its_file_was_renamed_over_tells_nothing_of_the_new_file() {
        // The generator's case: f0 held open for appending, f2 renamed onto f0, then the handle
        // (on the replaced file) released.
        let cx = cx();
        let (f0, f2) = (Path::new("/d/f0"), Path::new("/d/f2"));
        let mut r = Rules::default();
        r.apply(
            &cx,
            &open_as(f0, libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND, 3, 150),
        );
        r.found(&cx, f2, fact(&r, (1, 9), h("f2's")), 151);
        r.apply(
            &cx,
            &Event::Rename {
                pid: 1,
                from: f2.to_owned(),
                to: f0.to_owned(),
                ts_ns: 151,
            },
        );
        r.found_in(fact(&r, (1, 3), h("empty")));
        let st = r.state(f0).unwrap();
        assert_eq!(st.output(), Some(&h("f2's")));
        let moved = r.state(f2).unwrap();
        assert!(moved.reads_prior, "f2 moved away unread is an input");
        assert_eq!(moved.input.as_ref(), Some(&h("f2's")));
    }

    #[test]
    fn content_seen_through_one_link_is_every_linked_names() {
        let cx = cx();
        let (a, b) = (Path::new("/d/a"), Path::new("/d/b"));
        let mut r = Rules::default();
        r.found(&cx, a, fact(&r, (1, 4), h("v0")), 150);
        r.apply(
            &cx,
            &Event::Link {
                pid: 1,
                from: a.to_owned(),
                to: b.to_owned(),
                ts_ns: 151,
            },
        );
        assert_eq!(r.state(b).unwrap().output(), Some(&h("v0")));
        r.apply(&cx, &open_as(b, libc::O_WRONLY | libc::O_APPEND, 4, 152));
        r.found_in(fact(&r, (1, 4), h("v1")));
        let (sa, sb) = (r.state(a).unwrap(), r.state(b).unwrap());
        assert_eq!(sa.input.as_ref(), Some(&h("v0")), "a's kept bytes");
        assert_eq!(sa.output(), Some(&h("v1")));
        assert_eq!(sb.output(), Some(&h("v1")));
    }

    /// Found by the generator: f1 written, linked to f3, truncated through its handle (which the
    /// mount reports under the inode's latest name, f3), then released.
    #[test]
    fn a_truncate_or_a_release_under_one_name_of_a_file_the_job_wrote_is_every_names() {
        let cx = cx();
        let (f1, f3) = (Path::new("/d/f1"), Path::new("/d/f3"));
        let mut r = Rules::default();
        r.apply(&cx, &open_as(f1, libc::O_RDWR, 5, 150));
        r.apply(
            &cx,
            &Event::Link {
                pid: 1,
                from: f1.to_owned(),
                to: f3.to_owned(),
                ts_ns: 151,
            },
        );
        r.apply(
            &cx,
            &Event::Truncate {
                pid: 1,
                path: f3.to_owned(),
                ts_ns: 152,
            },
        );
        r.found_in(fact(&r, (1, 5), h("empty")));
        for p in [f1, f3] {
            let st = r.state(p).unwrap();
            assert_eq!(st.output(), Some(&h("empty")), "{p:?}");
            assert!(st.ops.contains(Ops::TRUNCATE), "{p:?}");
        }
    }

    #[test]
    fn a_change_through_a_handle_on_a_file_renamed_over_did_not_happen_at_its_old_name() {
        let cx = cx();
        let (f1, f3) = (Path::new("/d/f1"), Path::new("/d/f3"));
        let mut r = Rules::default();
        r.apply(&cx, &open_as(f3, libc::O_WRONLY | libc::O_TRUNC, 3, 150));
        assert!(r.names(f3, (1, 3)));
        r.found(&cx, f1, fact(&r, (1, 1), h("f1's")), 151);
        r.apply(
            &cx,
            &Event::Rename {
                pid: 1,
                from: f1.to_owned(),
                to: f3.to_owned(),
                ts_ns: 151,
            },
        );
        assert!(!r.names(f3, (1, 3)), "f3 names f1's file now");
        assert!(r.names(f3, (1, 1)));
        assert!(!r.names(f1, (1, 1)), "nothing at f1 any more");
        assert!(r.names(Path::new("/d/new"), (1, 9)), "nothing known: maybe");
    }

    #[test]
    fn a_rename_onto_itself_or_between_two_names_of_one_file_does_nothing() {
        let cx = cx();
        let (a, b) = (Path::new("/d/a"), Path::new("/d/b"));
        let mv = |from: &Path, to: &Path| Event::Rename {
            pid: 1,
            from: from.to_owned(),
            to: to.to_owned(),
            ts_ns: 151,
        };
        let mut r = Rules::default();
        r.apply(&cx, &mv(a, a));
        let swap = |a: &Path, b: &Path| Event::Exchange {
            pid: 1,
            a: a.to_owned(),
            b: b.to_owned(),
            ts_ns: 151,
        };
        r.apply(&cx, &swap(a, a));
        assert!(r.is_empty(), "nothing happened at a");
        r.apply(&cx, &open_as(a, libc::O_RDONLY, 4, 150));
        r.apply(
            &cx,
            &Event::Link {
                pid: 1,
                from: a.to_owned(),
                to: b.to_owned(),
                ts_ns: 151,
            },
        );
        r.apply(&cx, &mv(a, b));
        r.apply(&cx, &swap(a, b));
        let st = r.state(a).unwrap();
        assert!(st.exists && !st.job_made, "a is still there, as it was");
    }

    /// Found by the generator: a release hashed the file, a truncate by path came in (and was
    /// seen with its own content), then the release's older content arrived.
    #[test]
    fn content_taken_before_a_change_does_not_count_after_it() {
        let cx = cx();
        let f = Path::new("/d/f");
        let mut r = Rules::default();
        r.apply(&cx, &open_as(f, libc::O_WRONLY, 7, 150));
        let stale = fact(&r, (1, 7), h("before the truncate"));
        r.apply(
            &cx,
            &Event::Truncate {
                pid: 1,
                path: f.to_owned(),
                ts_ns: 151,
            },
        );
        r.found(&cx, f, fact(&r, (1, 7), h("truncated")), 151);
        r.found_in(stale);
        assert_eq!(r.state(f).unwrap().output(), Some(&h("truncated")));
    }

    /// Found by the generator: the mount named an open by the file's other name (its latest
    /// lookup), then that name was unlinked; the release's content must still reach the name
    /// left, which learned its file only through the link.
    #[test]
    fn a_fact_reaches_a_name_that_learned_its_file_through_a_link() {
        let cx = cx();
        let (f1, f2) = (Path::new("/d/f1"), Path::new("/d/f2"));
        let mut r = Rules::default();
        r.apply(
            &cx,
            &Event::Link {
                pid: 1,
                from: f2.to_owned(),
                to: f1.to_owned(),
                ts_ns: 150,
            },
        );
        r.found(&cx, f1, fact(&r, (1, 2), h("v0")), 150);
        r.apply(&cx, &open_as(f1, libc::O_RDWR, 2, 151));
        r.apply(
            &cx,
            &Event::Unlink {
                pid: 1,
                path: f1.to_owned(),
                ts_ns: 152,
            },
        );
        r.found_in(fact(&r, (1, 2), h("v1")));
        assert_eq!(r.state(f2).unwrap().output(), Some(&h("v1")));
    }

    /// Found by the generator: `ln f2 f1; cat f2` — the mount reports the open under the file's
    /// latest name (f1); the record must not depend on which name an observer reports.
    #[test]
    fn a_read_under_either_name_of_a_linked_file_reads_what_the_job_did_not_make() {
        let cx = cx();
        let (f1, f2) = (Path::new("/d/f1"), Path::new("/d/f2"));
        let records = |read: &Path| {
            let mut r = Rules::default();
            r.apply(
                &cx,
                &Event::Link {
                    pid: 1,
                    from: f2.to_owned(),
                    to: f1.to_owned(),
                    ts_ns: 150,
                },
            );
            r.apply(&cx, &open_as(read, libc::O_RDONLY, 2, 151));
            r.finish()
                .paths
                .iter()
                .flat_map(|(p, st)| st.roles().map(move |(role, _)| (p.clone(), role)))
                .collect::<Vec<_>>()
        };
        assert_eq!(records(f1), records(f2));
        assert!(records(f1).contains(&(f2.to_owned(), Role::Input)));
    }

    /// Found by the generator: a file there before deleted unread, then made again and deleted:
    /// the deletion of what was there stands (not a temp).
    #[test]
    fn a_deleted_file_made_again_and_deleted_is_still_a_deletion() {
        let f = Path::new("/d/f1");
        let unlink = |ts_ns| Event::Unlink {
            pid: 1,
            path: f.to_owned(),
            ts_ns,
        };
        let made = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
        for again in [false, true] {
            let mut events = vec![unlink(101)];
            if again {
                events.push(open_as(f, made, 8, 102));
                events.push(unlink(103));
            }
            let c = classify(&events, 100, &Ignore::new(&[]));
            let roles: Vec<(Role, Version)> = c.paths[0].1.roles().collect();
            assert_eq!(
                roles,
                [(Role::Output, Version::Gone)],
                "made again: {again}"
            );
        }
    }

    /// Found by the generator: a pre-existing `d1/g1` moved away (an input), then `d0`, holding
    /// a file the job made at `g1`, moved onto `d1`. The name keeps its input (the content that
    /// moved away) beside the output the moved file leaves there.
    #[test]
    fn a_directory_moved_onto_a_name_keeps_what_the_job_read_there() {
        let dir = tempfile::tempdir().unwrap();
        let (d0, d1) = (dir.path().join("d0"), dir.path().join("d1"));
        let f0 = dir.path().join("f0");
        let events = [
            open_as(
                &d0.join("g1"),
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                3,
                101,
            ),
            mv(&d1.join("g1"), &f0, 102),
            mv(&d0, &d1, 103),
        ];
        let c = classify(&events, 100, &Ignore::new(&[]));
        let mut roles: Vec<(PathBuf, Role)> = c
            .paths
            .iter()
            .flat_map(|(p, st)| st.roles().map(move |(role, _)| (p.clone(), role)))
            .collect();
        roles.sort_by_key(|(p, role)| (p.clone(), format!("{role:?}")));
        assert_eq!(
            roles,
            [
                (d1.join("g1"), Role::Input),
                (d1.join("g1"), Role::Output),
                (f0.clone(), Role::Output),
            ]
        );
    }

    /// Found by the generator: `rm -rf d0; mv d1 d0` — a directory moved onto a name whose files
    /// the job had deleted. Each name below it now holds what the moved directory held there:
    /// a file read there is an input, a file left there is no deletion; a name left empty is.
    #[test]
    fn a_directory_moved_onto_removed_names_refills_them() {
        let dir = tempfile::tempdir().unwrap();
        let (d0, d1) = (dir.path().join("d0"), dir.path().join("d1"));
        let (g0, g1) = (d0.join("g0"), d0.join("g1"));
        // After the job: the moved directory held g0, not g1.
        std::fs::create_dir(&d0).unwrap();
        std::fs::write(&g0, "moved in").unwrap();
        let records = |read: bool| {
            let mut events = vec![
                open_as(&g0, libc::O_RDONLY, 2, 101),
                mv(&g0, &dir.path().join("away"), 102),
                Event::Unlink {
                    pid: 1,
                    path: g1.clone(),
                    ts_ns: 104,
                },
                Event::Rmdir {
                    pid: 1,
                    path: d0.clone(),
                    ts_ns: 105,
                },
                mv(&d1, &d0, 106),
            ];
            if read {
                events.push(open_as(&g0, libc::O_RDONLY, 4, 107));
            }
            let mut got: Vec<(PathBuf, Role, bool)> = classify(&events, 100, &Ignore::new(&[]))
                .paths
                .iter()
                .flat_map(|(p, st)| {
                    st.roles()
                        .map(move |(role, v)| (p.clone(), role, v == Version::Gone))
                })
                .collect();
            got.sort_by_key(|(p, role, gone)| (p.clone(), format!("{role:?}"), *gone));
            got
        };
        let away = dir.path().join("away");
        for read in [false, true] {
            assert_eq!(
                records(read),
                [
                    (away.clone(), Role::Output, false),
                    // Read, then moved away: an input; the file now at its name is no output.
                    (g0.clone(), Role::Input, false),
                    // Deleted, and nothing moved in: the deletion stands.
                    (g1.clone(), Role::Output, true),
                ],
                "read after the move: {read}"
            );
        }
        // Deleted unread, and a file moved in then read: an input, no deletion.
        let events = [
            Event::Unlink {
                pid: 1,
                path: g0.clone(),
                ts_ns: 101,
            },
            Event::Rmdir {
                pid: 1,
                path: d0.clone(),
                ts_ns: 102,
            },
            mv(&d1, &d0, 103),
            open_as(&g0, libc::O_RDONLY, 4, 104),
        ];
        let c = classify(&events, 100, &Ignore::new(&[]));
        let roles: Vec<(PathBuf, Role)> = c
            .paths
            .iter()
            .flat_map(|(p, st)| st.roles().map(move |(role, _)| (p.clone(), role)))
            .collect();
        assert_eq!(roles, [(g0.clone(), Role::Input)]);
        // Untouched after the move: the file there at the end is what the move put there.
        let c = classify(&events[..3], 100, &Ignore::new(&[]));
        assert_eq!(c.paths.iter().flat_map(|(_, st)| st.roles()).count(), 0);
    }

    /// Found by the generator: `mmap-write d0/g1; mv f0 d0/g1; rm d0/g1` — the file found at
    /// the name was read (an input) and replaced by one the job put there, which is gone at the
    /// end: a temporary, as a file the job made, read the old content first or not. The same
    /// for a file made again where the job had read and removed the old one.
    #[test]
    fn a_file_the_job_put_where_it_had_read_one_is_a_temporary_when_gone() {
        let (x, f0) = (Path::new("/d/x"), Path::new("/d/f0"));
        let unlink = |ts_ns| Event::Unlink {
            pid: 1,
            path: x.to_owned(),
            ts_ns,
        };
        let replaced = [
            open_as(x, libc::O_RDWR, 2, 101),
            mv(f0, x, 102),
            unlink(103),
        ];
        let made_again = [
            open_as(x, libc::O_RDONLY, 2, 101),
            unlink(102),
            open(x, 103),
            unlink(104),
        ];
        // Written in place and removed: the input consumed, no temporary.
        let in_place = [open_as(x, libc::O_RDWR, 2, 101), unlink(102)];
        for (events, temp) in [
            (&replaced[..], true),
            (&made_again[..], true),
            (&in_place[..], false),
        ] {
            let c = classify(events, 100, &Ignore::new(&[]));
            let st = &c.paths.iter().find(|(p, _)| p == x).expect("x").1;
            let mut want = vec![(Role::Input, Version::Prior)];
            if temp {
                want.push((Role::Temp, Version::Gone));
            }
            assert_eq!(st.roles().collect::<Vec<_>>(), want, "{events:?}");
        }
    }

    /// Found by the generator: `rm -r d0; mv d1 d0; open d0/g1 (read and write); rm d0/g1` —
    /// the name refilled by the move holds a file again, which the job reads and deletes: an
    /// input, and at the end the name is empty, so the deletion of the file that was there
    /// before the job stands again (it was only superseded while a file was there).
    #[test]
    fn a_deletion_superseded_by_a_refill_stands_again_when_the_name_ends_empty() {
        let dir = tempfile::tempdir().unwrap();
        let (d0, d1) = (dir.path().join("d0"), dir.path().join("d1"));
        let g1 = d0.join("g1");
        std::fs::create_dir(&d0).unwrap();
        let events = |last_opens: bool| {
            let mut events = vec![
                Event::Unlink {
                    pid: 1,
                    path: g1.clone(),
                    ts_ns: 101,
                },
                Event::Rmdir {
                    pid: 1,
                    path: d0.clone(),
                    ts_ns: 102,
                },
                mv(&d1, &d0, 103),
            ];
            if last_opens {
                events.push(open_as(&g1, libc::O_RDWR | libc::O_CREAT, 3, 104));
            }
            events.push(Event::Unlink {
                pid: 1,
                path: g1.clone(),
                ts_ns: 105,
            });
            events
        };
        let roles = |events: &[Event]| -> Vec<(PathBuf, Role, Version)> {
            classify(events, 100, &Ignore::new(&[]))
                .paths
                .iter()
                .flat_map(|(p, st)| st.roles().map(move |(role, v)| (p.clone(), role, v)))
                .collect()
        };
        // Read and deleted: the input, and the deletion of what was there before.
        assert_eq!(
            roles(&events(true)),
            [
                (g1.clone(), Role::Input, Version::Prior),
                (g1.clone(), Role::Output, Version::Gone),
            ]
        );
        // Deleted unread: one deletion.
        assert_eq!(
            roles(&events(false)),
            [(g1.clone(), Role::Output, Version::Gone)]
        );
    }

    /// Found by the generator (seed 9866626374876062354, program 1895): `ln f0 f2; mv f2 f1;
    /// mmap-write f1` — the renamed link is still a name of `f0`'s file: the write through it
    /// keeps `f0`'s bytes (an input there) and changes `f0` (an output).
    #[test]
    fn a_renamed_link_is_still_a_name_of_its_file() {
        let (f0, f1, f2) = (Path::new("/d/f0"), Path::new("/d/f1"), Path::new("/d/f2"));
        let events = [
            Event::Link {
                pid: 1,
                from: f0.to_owned(),
                to: f2.to_owned(),
                ts_ns: 101,
            },
            mv(f2, f1, 102),
            open_as(f1, libc::O_RDWR, 7, 103),
        ];
        let c = classify(&events, 100, &Ignore::new(&[]));
        let at = |p: &Path| roles_at(&c, p);
        assert_eq!(
            at(f0),
            [(Role::Input, Version::Prior), (Role::Output, Version::Left)]
        );
        assert_eq!(at(f1), [(Role::Output, Version::Left)]);
    }

    /// Found by the generator (seed 1796133588012499713, program 1264): `ln d1/g1 d0/g0; mv
    /// d1/g1 d0/g0` — both names are one file, so the rename does nothing (rename(2)): `d1/g1`
    /// still holds its bytes, unread, and `d0/g0` is the link's name (every observer but the
    /// oracle recorded `d1/g1` consumed as an input). The same for an exchange of the two.
    #[test]
    fn a_rename_between_two_names_the_job_linked_does_nothing() {
        let (a, b) = (Path::new("/d/d1/g1"), Path::new("/d/d0/g0"));
        let link = Event::Link {
            pid: 1,
            from: a.to_owned(),
            to: b.to_owned(),
            ts_ns: 101,
        };
        let exchange = Event::Exchange {
            pid: 1,
            a: a.to_owned(),
            b: b.to_owned(),
            ts_ns: 102,
        };
        for second in [mv(a, b, 102), mv(b, a, 102), exchange] {
            let c = classify(&[link.clone(), second.clone()], 100, &Ignore::new(&[]));
            assert_eq!(roles_at(&c, a), [], "{second:?}");
            assert_eq!(
                roles_at(&c, b),
                [(Role::Output, Version::Left)],
                "{second:?}"
            );
        }
        // Once the link's name was removed, a file made there is another file: the rename moves.
        let c = classify(
            &[
                link.clone(),
                Event::Unlink {
                    pid: 1,
                    path: b.to_owned(),
                    ts_ns: 102,
                },
                open_as(b, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 7, 103),
                mv(a, b, 104),
            ],
            100,
            &Ignore::new(&[]),
        );
        // (a pre-existing file moved away unread: consumed, its bytes now at `b`)
        assert_eq!(roles_at(&c, a), [(Role::Input, Version::Prior)]);
        assert_eq!(roles_at(&c, b), [(Role::Output, Version::Left)]);
    }

    /// Found by the generator (seed 1796133588012499713, program 2534): `ln f2 d1/g1; exchange
    /// d1/g1 d1/g0; mmap-write d1/g0` — the exchanged name takes the link's place: `d1/g0` now
    /// names `f2`'s file, so the write through it keeps `f2`'s bytes (an input) and changes `f2`
    /// (an output), as a rename of the link does.
    #[test]
    fn an_exchanged_link_is_still_a_name_of_its_file() {
        let (f2, g1, g0) = (
            Path::new("/d/f2"),
            Path::new("/d/d1/g1"),
            Path::new("/d/d1/g0"),
        );
        let events = [
            Event::Link {
                pid: 1,
                from: f2.to_owned(),
                to: g1.to_owned(),
                ts_ns: 101,
            },
            Event::Exchange {
                pid: 1,
                a: g1.to_owned(),
                b: g0.to_owned(),
                ts_ns: 102,
            },
            open_as(g0, libc::O_RDWR, 7, 103),
        ];
        let c = classify(&events, 100, &Ignore::new(&[]));
        assert_eq!(
            roles_at(&c, f2),
            [(Role::Input, Version::Prior), (Role::Output, Version::Left)]
        );
    }

    type Roles = Vec<(Role, Version)>;

    /// The records `c` gives the path `p`, in order.
    /// `events` classified as `roar run` gives them, then as the mount does: a directory's
    /// rename (the events at `dir_moves`) is no event there but a [`Rules::moved_dir`].
    fn run_and_mount(events: &[Event], dir_moves: &[usize]) -> [Classified; 2] {
        let mut r = Rules::default();
        for (i, e) in events.iter().enumerate() {
            match e {
                Event::Rename { from, to, .. } if dir_moves.contains(&i) => r.moved_dir(from, to),
                e => r.apply(&cx(), e),
            }
        }
        [classify(events, 100, &Ignore::new(&[])), r.finish()]
    }

    fn roles_at(c: &Classified, p: &Path) -> Roles {
        c.paths
            .iter()
            .filter(|(q, _)| q == p)
            .flat_map(|(_, st)| st.roles())
            .collect()
    }

    /// Found by the generator (seed 9866626374876062354, program 1757): `ln f1 f3; rm f1; cat
    /// f3` — the bytes read through the link were `f1`'s before the job, though `f1` names
    /// nothing by then: an input at `f1`, beside its deletion (removed before it was read). Read
    /// first and removed after, it is an input consumed; made again, an output beside the input.
    #[test]
    fn bytes_read_through_a_link_are_the_source_names_input_when_it_is_gone() {
        let (f1, f3) = (Path::new("/d/f1"), Path::new("/d/f3"));
        let link = Event::Link {
            pid: 1,
            from: f1.to_owned(),
            to: f3.to_owned(),
            ts_ns: 101,
        };
        let unlink = |ts_ns| Event::Unlink {
            pid: 1,
            path: f1.to_owned(),
            ts_ns,
        };
        let read = |ts_ns| open_as(f3, libc::O_RDONLY, 7, ts_ns);
        let made = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
        let cases: [(Vec<Event>, Roles); 4] = [
            (
                vec![link.clone(), unlink(102), read(103)],
                vec![(Role::Input, Version::Prior), (Role::Output, Version::Gone)],
            ),
            (
                vec![link.clone(), read(102), unlink(103)],
                vec![(Role::Input, Version::Prior)],
            ),
            (
                vec![
                    link.clone(),
                    unlink(102),
                    open_as(f1, made, 8, 103),
                    read(104),
                ],
                vec![(Role::Input, Version::Prior), (Role::Output, Version::Left)],
            ),
            // Made again after the read and removed: the deletion stands, no temp.
            (
                vec![
                    link,
                    unlink(102),
                    read(103),
                    open_as(f1, made, 8, 104),
                    unlink(105),
                ],
                vec![(Role::Input, Version::Prior), (Role::Output, Version::Gone)],
            ),
        ];
        for (events, want) in cases {
            let c = classify(&events, 100, &Ignore::new(&[]));
            let at = |p: &Path| roles_at(&c, p);
            assert_eq!(at(f1), want, "{events:?}");
            assert_eq!(at(f3), [(Role::Output, Version::Left)], "{events:?}");
        }
    }

    /// Found by the generator (seed 9866626374876062354, program 488): `rm d0/g1; open d0/g1
    /// (O_CREAT, held); mv d0 d1` — the file there before the job deleted unread, a new one made
    /// at its name, then the directory moved. The deletion stays where the old file was; the new
    /// file is an output where it is now (a temporary, if the job then removes it there).
    #[test]
    fn a_deletion_superseded_by_a_new_file_stays_when_the_directory_moves() {
        let dir = tempfile::tempdir().unwrap();
        let (d0, d1) = (dir.path().join("d0"), dir.path().join("d1"));
        let made = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
        for removed_after in [false, true] {
            let mut events = vec![
                Event::Unlink {
                    pid: 1,
                    path: d0.join("g1"),
                    ts_ns: 101,
                },
                open_as(&d0.join("g1"), made, 3, 102),
                mv(&d0, &d1, 103),
            ];
            if removed_after {
                events.push(Event::Unlink {
                    pid: 1,
                    path: d1.join("g1"),
                    ts_ns: 104,
                });
            }
            for (c, by_event) in run_and_mount(&events, &[2]).into_iter().zip([true, false]) {
                let mut roles: Vec<(PathBuf, Role, Version)> = c
                    .paths
                    .iter()
                    .flat_map(|(p, st)| st.roles().map(move |(role, v)| (p.clone(), role, v)))
                    .collect();
                roles.sort_by_key(|(p, ..)| p.clone());
                let new = if removed_after {
                    (d1.join("g1"), Role::Temp, Version::Gone)
                } else {
                    (d1.join("g1"), Role::Output, Version::Left)
                };
                assert_eq!(
                    roles,
                    [(d0.join("g1"), Role::Output, Version::Gone), new],
                    "by event: {by_event}, removed after: {removed_after}"
                );
            }
        }
    }

    /// Found by the generator (seed 1796093033312293485, program 1255): `mv d1/g0 d0/g0; ...;
    /// (tmpfile linked at) d1/g0; mv d1 d0` — the file there before the job moved away unread,
    /// another put at its name, then the directory moved. The input is the old file's and stays
    /// where it was; the new file is an output where it is now (a temporary if removed there).
    /// Every observer named the input where the directory went.
    #[test]
    fn an_input_moved_away_before_a_new_file_took_its_name_stays_when_the_directory_moves() {
        let dir = tempfile::tempdir().unwrap();
        let (d1, d2, f) = (
            dir.path().join("d1"),
            dir.path().join("d2"),
            dir.path().join("f"),
        );
        let made = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
        for (first, input) in [("moved away", false), ("read, removed", true)] {
            let mut events = if input {
                vec![
                    open_as(&d1.join("g0"), libc::O_RDONLY, 2, 101),
                    Event::Unlink {
                        pid: 1,
                        path: d1.join("g0"),
                        ts_ns: 102,
                    },
                ]
            } else {
                vec![
                    mv(&d1.join("g0"), &f, 101),
                    mv(&f, &dir.path().join("h"), 102),
                ]
            };
            events.extend([open_as(&d1.join("g0"), made, 3, 103), mv(&d1, &d2, 104)]);
            for (c, by_event) in run_and_mount(&events, &[3]).into_iter().zip([true, false]) {
                let how = format!("{first}, by event: {by_event}");
                assert_eq!(
                    roles_at(&c, &d1.join("g0")),
                    [(Role::Input, Version::Prior)],
                    "{how}"
                );
                assert_eq!(
                    roles_at(&c, &d2.join("g0")),
                    [(Role::Output, Version::Left)],
                    "{how}"
                );
            }
        }
    }

    /// Found by the generator (seed 1796095042051600215, program 68): `touch d0/g1; rm -r d1;
    /// mv d0 d1; mv d1 d0`, `d1/g1` there before — the directory moved onto the name of the
    /// removed one, and back. The file removed at `d1/g1` stays deleted: the file moved onto its
    /// name superseded the deletion, and took its own history on with it.
    #[test]
    fn a_deletion_a_moved_directory_landed_on_stands_when_it_moves_on() {
        let dir = tempfile::tempdir().unwrap();
        let (d0, d1) = (dir.path().join("d0"), dir.path().join("d1"));
        let made = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
        let events = [
            open_as(&d0.join("g1"), made, 3, 101),
            Event::Unlink {
                pid: 1,
                path: d1.join("g1"),
                ts_ns: 102,
            },
            mv(&d0, &d1, 103),
            mv(&d1, &d0, 104),
        ];
        for c in run_and_mount(&events, &[2, 3]) {
            assert_eq!(
                roles_at(&c, &d1.join("g1")),
                [(Role::Output, Version::Gone)]
            );
            assert_eq!(
                roles_at(&c, &d0.join("g1")),
                [(Role::Output, Version::Left)]
            );
        }
    }

    /// Found by the generator: `rm d0/g1; mv d0 d1` — a file deleted below a directory the job
    /// then moved. The deletion names where the file was: it did not move with the directory
    /// (it was gone); what the job read below it did, and is named where it is now.
    #[test]
    fn a_deletion_below_a_moved_directory_stays_where_the_file_was() {
        let dir = tempfile::tempdir().unwrap();
        let (d0, d1) = (dir.path().join("d0"), dir.path().join("d1"));
        std::fs::create_dir(&d1).unwrap();
        std::fs::write(d1.join("g0"), "read").unwrap();
        let events = [
            open_as(&d0.join("g0"), libc::O_RDONLY, 2, 101),
            Event::Unlink {
                pid: 1,
                path: d0.join("g1"),
                ts_ns: 102,
            },
            mv(&d0, &d1, 103),
        ];
        for (c, by_event) in run_and_mount(&events, &[2]).into_iter().zip([true, false]) {
            let mut roles: Vec<(PathBuf, Role, Version)> = c
                .paths
                .iter()
                .flat_map(|(p, st)| st.roles().map(move |(role, v)| (p.clone(), role, v)))
                .collect();
            roles.sort_by_key(|(p, ..)| p.clone());
            assert_eq!(
                roles,
                [
                    (d0.join("g1"), Role::Output, Version::Gone),
                    (d1.join("g0"), Role::Input, Version::Prior),
                ],
                "by event: {by_event}"
            );
        }
    }
}
