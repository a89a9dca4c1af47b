//! A file's names: what a read or write under one name does to the file's other names (hard
//! links the job made), renames and links that move content and names, and exchanges.

use std::path::{Path, PathBuf};

use roar_store::{ContentHash, FileStat, Made, Ops};

use super::{Context, PathState, Paths, Rules};

/// An open under one name, as the file's other names see it.
pub(super) struct Through<'a> {
    pub(super) truncates: bool,
    /// The file the name opened.
    pub(super) file: Option<(u64, u64)>,
    /// Its content before the open, where known.
    pub(super) before: Option<&'a ContentHash>,
    /// Its identity at the open.
    pub(super) stat: Option<&'a FileStat>,
}

impl Rules {
    /// The file at `name` was opened for reading under another of its names: bytes the job did
    /// not make were read there too.
    pub(super) fn read_through(&mut self, cx: &Context, name: &Path, w: &Through, ts: i64) {
        let Some(st) = self.paths.get(name, ts, cx.ignore) else {
            return;
        };
        if st.file.is_none() {
            st.file = w.file;
        }
        st.ops.insert(Ops::READ);
        if !st.job_made && !st.reads_prior {
            st.read_now(w.stat);
            if st.input.is_none() && st.file == w.file {
                st.input = w.before.cloned();
            }
        }
    }

    /// Bytes the job read through a name it linked to `origin` were `origin`'s before the job,
    /// though `origin` names another file now, or none: an input there. Its content is what the
    /// linked name held at the open, where an observer saw it. A deletion of `origin` made
    /// before the read stands (`ln f1 f3; rm f1; cat f3`: the job removed `f1` unread, then
    /// read its bytes), as one made after it would not (read, then removed: consumed).
    pub(super) fn read_linked(&mut self, cx: &Context, origin: &Path, w: &Through, ts: i64) {
        let Some(st) = self.paths.get(origin, ts, cx.ignore) else {
            return;
        };
        st.ops.insert(Ops::READ);
        if st.deleted() {
            st.superseded = Some(Made::Deleted);
        }
        if !st.reads_prior {
            st.reads_prior = true;
            st.read_stat = w.stat.copied();
            st.input_version = st.version;
            st.input = w.before.cloned();
        }
    }

    /// The other names of the file at `path` that the job made by linking (a write through any
    /// of them changes all), those that still name it: not removed, not renamed over.
    pub(super) fn other_names(&self, path: &Path) -> Vec<PathBuf> {
        // Most jobs link nothing: no look-up, no allocation per event.
        if self.links.is_empty() {
            return Vec::new();
        }
        let Some(st) = self.state(path) else {
            return Vec::new();
        };
        let first = st.alias_of.clone().unwrap_or_else(|| path.to_owned());
        if first == path && self.detached.contains(path) {
            // Another file now, that the job did not link.
            return Vec::new();
        }
        let Some(names) = self.links.get(&first) else {
            return Vec::new();
        };
        let same = |other: &PathState| match (st.file, other.file) {
            (Some(a), Some(b)) => a == b,
            // Observers that report no identity: a name that still exists.
            _ => other.exists,
        };
        std::iter::once(&first)
            .filter(|f| !self.detached.contains(*f))
            .chain(names)
            .filter(|p| p.as_path() != path && self.state(p).is_some_and(same))
            .cloned()
            .collect()
    }

    /// The file at `name` was opened for writing under another of its names: it changes too, and
    /// bytes the write keeps were this name's before the job.
    pub(super) fn written_through(&mut self, cx: &Context, name: &Path, w: &Through, ts: i64) {
        let Some(st) = self.paths.get(name, ts, cx.ignore) else {
            return;
        };
        if st.file.is_none() {
            st.file = w.file;
        }
        if !w.truncates && !st.job_made && !st.reads_prior && w.stat.is_some_and(|s| s.size > 0) {
            st.read_now(w.stat);
            if st.input.is_none() && st.file == w.file {
                st.input = w.before.cloned();
            }
        }
        st.ops.insert(Ops::WRITE);
        st.written_ns = Some(ts);
        st.job_made = true;
        st.exists = true;
        st.changed(self.seq);
    }

    /// Whether `a` and `b` are one file's names: a rename or exchange between them does nothing.
    /// Known from the file each names (where an observer saw it) or from the links the job made
    /// (`ln a b; mv a b` leaves both names: no observer reports a file for a name never opened).
    pub(super) fn one_file(&self, a: &Path, b: &Path) -> bool {
        let file = |p: &Path| self.state(p).and_then(|st| st.file.filter(|_| st.exists));
        a == b
            || file(a).is_some_and(|f| file(b) == Some(f))
            || self
                .link_group(a)
                .is_some_and(|g| self.link_group(b) == Some(g))
    }

    /// The first name of the group of names the job linked that `p` belongs to, while `p` still
    /// names that file (a name removed or renamed over leaves its group).
    fn link_group(&self, p: &Path) -> Option<PathBuf> {
        let st = self.state(p).filter(|st| st.exists)?;
        match &st.alias_of {
            Some(first) => Some(first.clone()),
            None => {
                (self.links.contains_key(p) && !self.detached.contains(p)).then(|| p.to_owned())
            }
        }
    }

    pub(super) fn rename_or_link(
        &mut self,
        cx: &Context,
        from: &Path,
        to: &Path,
        rename: bool,
        ts: i64,
    ) {
        // rename(2) onto the same name, or between two names of one file, does nothing.
        if rename && self.one_file(from, to) {
            return;
        }
        if rename && !self.paths.is_tracked(from) && self.paths.is_dir(from, to, cx) {
            // A directory moved: what the job did inside it now lives under the new name.
            self.moved_dir(from, to);
            return;
        }
        let ignored_to = cx.ignore.is_ignored(to);
        self.move_landed(from, to, rename, ignored_to, ts);
        let src = self.paths.get(from, ts, cx.ignore).map(|st| {
            let snapshot = st.clone();
            if rename {
                st.ops.insert(Ops::RENAME);
                st.exists = false;
                if !st.job_made && !st.reads_prior {
                    // A pre-existing file moved away unread: consumed as an input, and its
                    // content is whatever lands at the destination.
                    st.read_now(None);
                    if !ignored_to {
                        st.moved_to = Some((to.to_owned(), ts));
                    }
                }
                st.changed(self.seq);
                st.file = None;
            } else if !st.job_made {
                // Linked from: the name held content the job had not made, and still does.
                st.existed = true;
                st.found = true;
                st.exists = true;
            }
            snapshot
        });
        if rename && src.as_ref().is_some_and(|s| !s.job_made && !s.reads_prior) && !ignored_to {
            self.landed.insert(to.to_owned(), from.to_owned());
        }
        // A name the job had linked moves: the file keeps it among its names, under the new one.
        let group = src.as_ref().filter(|_| rename).and_then(|s| {
            (s.alias_of.clone()).or_else(|| self.links.contains_key(from).then(|| from.to_owned()))
        });
        if rename {
            // The name now holds the moved file: no longer another name of one the job linked;
            // nor does the old name name it.
            self.unname(to);
            self.unname(from);
        } else {
            self.detached.remove(to);
        }
        let Some(dst) = self.paths.get(to, ts, cx.ignore) else {
            return;
        };
        dst.ops.insert(Ops::RENAME);
        dst.place();
        dst.exists = true;
        // The file and what is known of its content move with it.
        dst.changed(self.seq);
        dst.file = src.as_ref().and_then(|s| s.file);
        if let Some(content) = src.as_ref().and_then(|s| s.current()) {
            dst.knows(content.clone());
        }
        if !rename {
            // A new name for the same file: writes through either name change the other.
            dst.linked_prior = src.as_ref().is_some_and(|s| !s.job_made || s.linked_prior);
            dst.alias_of = src
                .as_ref()
                .map(|s| s.alias_of.clone().unwrap_or_else(|| from.to_owned()));
            if let Some(first) = dst.alias_of.clone() {
                self.links.entry(first).or_default().push(to.to_owned());
            }
        }
        // New content at the destination either way; its old content, if the job had read it,
        // stays an input through `reads_prior`.
        dst.job_made = true;
        if src.as_ref().is_some_and(|s| s.ops.contains(Ops::CREATE)) {
            dst.ops.insert(Ops::CREATE);
        }
        if let Some(first) = group {
            let linked_prior = src.is_some_and(|s| s.linked_prior);
            self.renamed_in_group(&first, from, to, linked_prior);
        }
    }

    /// Content that had landed at `to` (pre-existing bytes moved away unread) is replaced there:
    /// gone, so unknown. Renamed on from `from`, content that had landed there lands at `to`,
    /// unless the job wrote it where it lay.
    fn move_landed(&mut self, from: &Path, to: &Path, rename: bool, ignored_to: bool, ts: i64) {
        self.end_landing(to);
        if !rename {
            return;
        }
        if let Some(origin) = self.landed.remove(from) {
            // Written where they lay, the bytes moving on are no longer the input's.
            let kept = !ignored_to && !rewritten_since_landing(&mut self.paths, &origin, from);
            if let Some(st) = self.paths.state_mut(&origin) {
                st.moved_to = kept.then(|| (to.to_owned(), ts));
            }
            if kept {
                self.landed.insert(to.to_owned(), origin);
            }
        }
    }

    /// The name `at` no longer holds the file pre-existing content landed on (removed, renamed
    /// over, refilled by a directory move): those bytes are gone, so unknown.
    pub(super) fn end_landing(&mut self, at: &Path) {
        if let Some(origin) = self.landed.remove(at) {
            if let Some(st) = self.paths.state_mut(&origin) {
                st.moved_to = None;
            }
        }
    }

    /// A directory moved `from -> to`: content that had landed below `to` is gone (the names
    /// there hold what `from` held now); content that had landed below `from` lands below `to`.
    pub(super) fn move_landings(&mut self, from: &Path, to: &Path) {
        let below = |p: &Path, dir: &Path| p != dir && p.starts_with(dir);
        let displaced: Vec<PathBuf> = (self.landed.keys())
            .filter(|p| below(p, to))
            .cloned()
            .collect();
        for at in displaced {
            self.end_landing(&at);
        }
        let moving: Vec<PathBuf> = (self.landed.keys())
            .filter(|p| below(p, from))
            .cloned()
            .collect();
        for at in moving {
            let origin = self.landed.remove(&at).expect("listed above");
            let now = to.join(at.strip_prefix(from).expect("below `from`"));
            if let Some(st) = self.paths.state_mut(&origin) {
                if let Some((place, _)) = st.moved_to.as_mut() {
                    *place = now.clone();
                }
            }
            self.landed.insert(now, origin);
        }
    }

    /// A name of a file the job linked (`first`: the group's first name) was renamed `from ->
    /// to`: `to` is one of the file's names now, so a write through any of them changes it and a
    /// read through it is what the link read (`ln f0 f2; mv f2 f1; echo >> f1` changes `f0`).
    fn renamed_in_group(&mut self, first: &Path, from: &Path, to: &Path, linked_prior: bool) {
        if first != from {
            if let Some(names) = self.links.get_mut(first) {
                names.retain(|n| n != from);
                names.push(to.to_owned());
            }
            if let Some(st) = self.paths.state_mut(to) {
                st.alias_of = Some(first.to_owned());
                st.linked_prior = linked_prior;
            }
            return;
        }
        // The first name itself moved: the group goes by its new name (unless that name heads
        // a group of another file, which it does not join).
        if self.links.contains_key(to) {
            return;
        }
        self.detached.remove(from);
        let Some(names) = self.links.remove(from) else {
            return;
        };
        for n in &names {
            if let Some(st) = self.paths.state_mut(n) {
                st.alias_of = Some(to.to_owned());
            }
        }
        self.links.insert(to.to_owned(), names);
    }

    /// `name` no longer names the file it named (removed, renamed away or over): a file the job
    /// puts there later is not one the job linked to the old one's other names.
    pub(super) fn unname(&mut self, name: &Path) {
        if self.links.contains_key(name) {
            self.detached.insert(name.to_owned());
        }
        self.drop_alias(name);
    }

    /// `name` stops being a name the job gave a file by linking (a rename put another file there).
    pub(super) fn drop_alias(&mut self, name: &Path) {
        let first = self.paths.state_mut(name).and_then(|st| st.alias_of.take());
        if let Some(names) = first.and_then(|first| self.links.get_mut(&first)) {
            names.retain(|n| n != name);
        }
    }

    pub(super) fn exchange(&mut self, cx: &Context, a: &Path, b: &Path, ts: i64) {
        if self.one_file(a, b) {
            return;
        }
        if self.paths.is_dir(a, b, cx) {
            // Two directories swapped: what the job did below each now lives below the other
            // name (through a temporary name no path can have).
            let swap = a.join("\0roar-exchange");
            self.moved_dir(a, &swap);
            self.moved_dir(b, a);
            self.moved_dir(&swap, b);
            return;
        }
        // A name the job linked keeps its place among its file's names: under the other name.
        let groups = [(self.group_of(a), a, b), (self.group_of(b), b, a)];
        // Each name now holds the other's content: each is made by the job, and each prior
        // content the job had not made is consumed, its bytes now at the other name. Content
        // that had landed at either name moves to the other.
        let was = [(self.landed.remove(a), a, b), (self.landed.remove(b), b, a)];
        for (origin, here, there) in was {
            if let Some(origin) = origin {
                let kept = !rewritten_since_landing(&mut self.paths, &origin, here);
                if let Some(st) = self.paths.state_mut(&origin) {
                    st.moved_to = kept.then(|| (there.to_owned(), ts));
                }
                if kept {
                    self.landed.insert(there.to_owned(), origin);
                }
            }
        }
        // What each name held: its file and known content, now the other's.
        let held = |rules: &mut Rules, p: &Path| {
            rules
                .paths
                .get(p, ts, cx.ignore)
                .map(|st| (st.file, st.current().cloned()))
        };
        let (held_a, held_b) = (held(self, a), held(self, b));
        for (here, there) in [(a, b), (b, a)] {
            let ignored_there = cx.ignore.is_ignored(there);
            if let Some(st) = self.paths.get(here, ts, cx.ignore) {
                st.ops.insert(Ops::RENAME);
                if !st.job_made && !st.reads_prior {
                    st.read_now(None);
                    if !ignored_there {
                        st.moved_to = Some((there.to_owned(), ts));
                        self.landed.insert(there.to_owned(), here.to_owned());
                    }
                }
            }
        }
        for (p, other) in [(a, held_b), (b, held_a)] {
            if let Some(st) = self.paths.get(p, ts, cx.ignore) {
                st.job_made = true;
                st.place();
                st.exists = true;
                st.changed(self.seq);
                let (file, content) = other.unwrap_or((None, None));
                st.file = file;
                if let Some(content) = content {
                    st.knows(content);
                }
            }
        }
        for (group, from, to) in groups {
            if let Some((first, linked_prior)) = group {
                self.renamed_in_group(&first, from, to, linked_prior);
            }
        }
    }

    /// The group of names the job linked that `p` belongs to (its first name), and whether the
    /// file's bytes predate the job there.
    fn group_of(&self, p: &Path) -> Option<(PathBuf, bool)> {
        let st = self.state(p)?;
        let first = self.link_group(p)?;
        Some((first, st.linked_prior))
    }
}

/// Whether the job wrote at `at` after the content of `origin` landed there.
pub(super) fn rewritten_since_landing(paths: &mut Paths, origin: &Path, at: &Path) -> bool {
    let landed_ns = paths
        .state_mut(origin)
        .and_then(|st| st.moved_to.as_ref().map(|(_, ts)| *ts));
    let written_ns = paths.state_mut(at).and_then(|st| st.written_ns);
    matches!((written_ns, landed_ns), (Some(w), Some(l)) if w >= l) || landed_ns.is_none()
}
