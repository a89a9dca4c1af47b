//! What observers that see content (the mount, the gateway) tell the rule: the content a file or
//! a name held at a moment of the job's events, and what the rule still wants to know.

use std::path::{Path, PathBuf};

use roar_store::ContentHash;

use super::{Context, Fact, HashMap, PathState, Rules, Seen};

impl Rules {
    /// An observer that sees content found `content` at `path`, which names `file` now (it just
    /// looked), at `ts`: the content of the path's current version. Told before an event that
    /// changes the path, it is what the event found there (an in-place write's kept bytes, a
    /// pre-existing file renamed away).
    pub fn found(&mut self, cx: &Context, path: &Path, fact: Fact, ts: i64) {
        if let Some(st) = self.paths.get(path, ts, cx.ignore) {
            if st.version > fact.mark {
                return;
            }
            st.file = Some(fact.file);
            self.index(path);
            // Under every name of the file.
            self.found_in(fact);
        }
    }

    /// An observer whose objects have no identity but their name (an S3 key, an archive
    /// member) saw `content` at `path` after `mark`: the content of the path's current version.
    pub fn found_named(
        &mut self,
        cx: &Context,
        path: &Path,
        content: ContentHash,
        mark: u64,
        ts: i64,
    ) {
        if let Some(st) = self.paths.get(path, ts, cx.ignore) {
            if st.version <= mark {
                st.knows(content);
            }
        }
    }

    /// An observer that sees content found `content` in `file` through a handle it held (the
    /// last writer's release): the current content of each name that still names that file —
    /// never of a name another file was renamed onto meanwhile — and of the names the job
    /// linked to those (the same file, known or not).
    pub fn found_in(&mut self, fact: Fact) {
        let Fact {
            file,
            content,
            mark,
        } = fact;
        if self.files.is_none() {
            let mut files: HashMap<(u64, u64), Vec<PathBuf>> = HashMap::default();
            for (path, st) in &self.paths.list {
                if let Some(f) = st.as_ref().and_then(|st| st.file) {
                    files.entry(f).or_default().push(path.clone());
                }
            }
            self.files = Some(files);
        }
        let seen_as = self.files.as_ref().and_then(|files| files.get(&file));
        let mut names: Vec<PathBuf> = seen_as
            .into_iter()
            .flatten()
            .filter(|p| self.state(p).is_some_and(|st| st.file == Some(file)))
            .cloned()
            .collect();
        for i in 0..names.len() {
            for other in self.other_names(&names[i].clone()) {
                if !names.contains(&other) {
                    names.push(other);
                }
            }
        }
        for name in names {
            let st = self.paths.state_mut(&name);
            let holds =
                |st: &&mut PathState| st.file.is_none_or(|f| f == file) && st.version <= mark;
            if let Some(st) = st.filter(holds) {
                st.file = Some(file);
                st.knows(content.clone());
                self.index(&name);
            }
        }
    }

    /// Whether content seen at `path` now would tell the rule something: the path is not ignored
    /// and the content of what it holds now is not known yet.
    pub fn wants_content(&self, cx: &Context, path: &Path) -> bool {
        match self.paths.seen.get(path.as_os_str()) {
            Some(Seen::Ignored) => false,
            Some(Seen::At(i)) => self.paths.list[*i]
                .1
                .as_ref()
                .is_some_and(|st| st.file.is_none() || st.current().is_none()),
            None => !cx.ignore.is_ignored(path),
        }
    }

    /// Whether the job read prior content at `path`, or at another name of its file, whose hash
    /// no observer gave yet.
    pub fn wants_input(&self, path: &Path) -> bool {
        let wants = |p: &Path| {
            self.state(p).is_some_and(|st| {
                st.reads_prior && st.input.is_none() && st.input_version == st.version
            })
        };
        wants(path) || self.other_names(path).iter().any(|p| wants(p))
    }
}
