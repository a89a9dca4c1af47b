//! The job's paths in first-seen order, each looked up once per event with its ignore verdict
//! ([`Paths`]), and re-keyed when a directory moves.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use roar_store::ignore::Ignore;
use roar_store::Ops;

use super::{Context, HashMap, HashSet, PathState};

/// What classification knows of a path it has seen in an event.
#[derive(Clone, Copy)]
pub(super) enum Seen {
    /// Matched the ignore globs (checked once per distinct path, not per event).
    Ignored,
    /// Tracked: its index in [`Paths::list`].
    At(usize),
}

/// Which paths are not data: the ignore globs, or (classifying part of a job whose whole was
/// classified already) the verdicts the job's classification reached, without matching again.
pub enum Judge<'a> {
    Globs(&'a Ignore),
    /// The paths the job's classification found ignored ([`Classified::environment`]).
    Known(&'a HashSet<&'a OsStr>),
}

impl Judge<'_> {
    pub(super) fn is_ignored(&self, path: &Path) -> bool {
        match self {
            Judge::Globs(ignore) => ignore.is_ignored(path),
            Judge::Known(ignored) => ignored.contains(path.as_os_str()),
        }
    }
}

/// The job's tracked paths in first-seen order, and one lookup per event for a path's state or
/// for its ignore verdict: events of a job with many files are mostly first and second sightings
/// of one path each, so every extra map probe showed in profiles.
#[derive(Default)]
pub(super) struct Paths {
    pub(super) seen: HashMap<OsString, Seen>,
    /// `None` once a directory move re-keyed the path onto an earlier entry.
    pub(super) list: Vec<(PathBuf, Option<PathState>)>,
    /// Ignored paths, at first sight.
    pub(super) ignored: Vec<PathBuf>,
    /// How many paths a directory move refilled are not settled yet ([`PathState::refilled`]):
    /// while none is, events are not looked at for what they show of one.
    pub(super) unsettled: usize,
}

impl Paths {
    /// The state of `path`, created at `ts` on first sight; `None` if the path is ignored.
    pub(super) fn get(&mut self, path: &Path, ts: i64, ignore: &Judge) -> Option<&mut PathState> {
        let i = match self.seen.get(path.as_os_str()) {
            Some(Seen::Ignored) => return None,
            Some(Seen::At(i)) => *i,
            None => {
                if ignore.is_ignored(path) {
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
    pub(super) fn state_mut(&mut self, path: &Path) -> Option<&mut PathState> {
        match self.seen.get(path.as_os_str()) {
            Some(Seen::At(i)) => self.list[*i].1.as_mut(),
            _ => None,
        }
    }

    pub(super) fn track(&mut self, path: PathBuf, ts: i64) -> usize {
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

    pub(super) fn is_tracked(&self, path: &Path) -> bool {
        matches!(self.seen.get(path.as_os_str()), Some(Seen::At(_)))
    }

    /// Whether a rename `from -> to` moved a directory, from what the job itself showed: it made
    /// or removed a directory at either name, or used paths below `from/`. Only when the job
    /// showed nothing is the filesystem asked (after the job, so a directory renamed and then
    /// deleted is known only from the events).
    pub(super) fn is_dir(&self, from: &Path, to: &Path, cx: &Context) -> bool {
        cx.dirs.contains(from)
            || cx.dirs.contains(to)
            || self
                .list
                .iter()
                .any(|(p, st)| st.is_some() && p != from && p.starts_with(from))
            || (cx.ask_filesystem && to.is_dir())
    }

    /// Re-keys every tracked path below `from/` to the same place below `to/`. The moved state
    /// replaces one already at the new name (it is what lives there now) and keeps the earlier of
    /// the two places in the order.
    pub(super) fn move_children(&mut self, from: &Path, to: &Path) {
        // The names already below `to`: each now holds what `from` held under it (the job's
        // state moved there if it had one, else something it never saw, or nothing).
        let mut displaced: Vec<usize> = (0..self.list.len())
            .filter(|&j| {
                let (p, st) = &self.list[j];
                st.is_some() && p != to && p.starts_with(to)
            })
            .collect();
        for i in 0..self.list.len() {
            let (p, st) = &mut self.list[i];
            let Ok(rest) = p.strip_prefix(from) else {
                continue;
            };
            if rest.as_os_str().is_empty() || st.as_ref().is_none_or(PathState::stays) {
                // What was there before the job, gone since, did not move.
                continue;
            }
            let new = to.join(rest);
            let mut moved = st.take().expect("checked above");
            let left = moved.split_prior();
            moved.ops.insert(Ops::RENAME);
            let old = std::mem::replace(p, new.clone());
            self.seen.remove(old.as_os_str());
            if let Some(left) = left {
                self.seen
                    .insert(old.clone().into_os_string(), Seen::At(self.list.len()));
                self.list.push((old, Some(left)));
            }
            match self.seen.get(new.as_os_str()) {
                Some(Seen::At(j)) if *j < i => {
                    let j = *j;
                    displaced.retain(|&d| d != j);
                    if let Some(old) = self.list[j].1.take() {
                        moved.keep_input_of(old);
                    }
                    self.list[j].1 = Some(moved);
                }
                Some(Seen::At(j)) => {
                    let j = *j;
                    displaced.retain(|&d| d != j);
                    if let Some(old) = self.list[j].1.take() {
                        moved.keep_input_of(old);
                    }
                    self.list[i].1 = Some(moved);
                    self.seen.insert(new.into_os_string(), Seen::At(i));
                }
                _ => {
                    self.list[i].1 = Some(moved);
                    self.seen.insert(new.into_os_string(), Seen::At(i));
                }
            }
        }
        for j in displaced {
            if let Some(st) = self.list[j].1.as_mut() {
                if !std::mem::replace(&mut st.refilled, true) {
                    self.unsettled += 1;
                }
            }
        }
    }

    /// The names a directory move refilled that no event has settled yet.
    pub(super) fn refilled(&self) -> impl Iterator<Item = &Path> {
        self.list
            .iter()
            .filter(|(_, st)| st.as_ref().is_some_and(|st| st.refilled))
            .map(|(p, _)| p.as_path())
    }
}
