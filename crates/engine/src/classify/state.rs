//! What the rule knows of one path as the job's events go by ([`PathState`]), and what that
//! makes it in the record: the roles it gets and the version of its content each names.

use std::path::PathBuf;

use roar_store::{ContentHash, FileRecord, FileStat, Made, Ops, PathUse, Role};

/// What the job did to one path, as far as its events tell.
#[derive(Debug, Clone, Default)]
pub struct PathState {
    pub ops: Ops,
    pub first_ns: i64,
    pub last_ns: i64,
    /// Content the job did not make was read (or kept by an appending/in-place write).
    pub reads_prior: bool,
    /// Identity of that prior content when first opened.
    pub read_stat: Option<FileStat>,
    /// The content now at the path was made by the job.
    pub job_made: bool,
    /// As far as the events tell, the path exists at the end.
    pub exists: bool,
    /// The job's own events showed content here it had not made (it linked from the path): that
    /// content predates the job whatever the file's ctime says.
    pub existed: bool,
    /// A file the job had not made was here when the job first touched the path, as its own
    /// events show: an open without `O_CREAT`, an `O_CREAT` open of a file older than the job, a
    /// truncate by path, a link from it ([`PathUse::found`]).
    pub found: bool,
    /// A pre-existing file moved away from here, unread, now lives at this path (since `.1`).
    pub moved_to: Option<(PathBuf, i64)>,
    /// When the job last opened the path for writing or truncated it.
    pub written_ns: Option<i64>,
    /// A hard link the job made: the file's first name, whose content a write through this one
    /// changes (same inode).
    pub alias_of: Option<PathBuf>,
    /// The file (dev, ino) the path names, as far as the events tell: opens report it, renames
    /// and links carry it, an unlink ends it.
    pub file: Option<(u64, u64)>,
    /// The number of the last event that changed what the path holds ([`Rules::mark`]).
    pub version: u64,
    /// The version whose bytes the job read as prior content.
    pub input_version: u64,
    /// The input's content, where an observer that sees content (the mount) saw it.
    pub input: Option<ContentHash>,
    /// The latest content an observer saw at the path, with the version it saw.
    pub known: Option<(u64, ContentHash)>,
    /// A directory the job moved landed where this name's directory was: the name now holds
    /// what the moved directory held under it — a file the job never saw, or nothing — until an
    /// event or the observer says which ([`PathState::refill`]).
    pub refilled: bool,
    /// What the job had left here before a directory move refilled the name with a file
    /// ([`PathUse::superseded`]).
    pub superseded: Option<Made>,
    /// The job put a file here that was not the one found here ([`PathUse::placed`]).
    pub placed: bool,
    /// The job linked this name to a file whose content it had not made, unchanged since: bytes
    /// read here were the link source's ([`PathState::alias_of`]) before the job, whatever that
    /// name holds now.
    pub linked_prior: bool,
}

/// Which version of a path a record names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The content there before the job changed it: an input's.
    Prior,
    /// The content the job left: an output's.
    Left,
    /// None: a temporary, or a pre-existing file the job deleted.
    Gone,
}

impl PathState {
    /// How the job used the path, for the records it gets ([`PathUse::records`]).
    pub fn path_use(&self) -> PathUse {
        PathUse {
            read_prior: self.reads_prior,
            job_made: self.job_made,
            exists: self.exists,
            unlinked: self.ops.contains(Ops::UNLINK),
            found: self.found,
            superseded: self.superseded,
            placed: self.placed,
        }
    }

    /// Whether the path records the deletion of a file that was there before the job: nothing
    /// is there now, and what was is gone.
    pub fn deleted(&self) -> bool {
        !self.exists && matches!(self.path_use().records().1, Some(Made::Deleted))
    }

    /// Whether a directory move leaves this name where it is: nothing is there (what was there
    /// before the job deleted, read or moved away; a file the job made and removed). A record
    /// of a file gone names where it was; only a file still there moves with its directory.
    pub fn stays(&self) -> bool {
        !self.exists
    }

    /// The records the path gets, each with the version whose content it names (every observer
    /// records a path by these; only where the content comes from is its own).
    pub fn roles(&self) -> impl Iterator<Item = (Role, Version)> {
        let (input, made) = self.path_use().records();
        let made = match made {
            Some(Made::Output) => Some((Role::Output, Version::Left)),
            Some(Made::Temp) => Some((Role::Temp, Version::Gone)),
            Some(Made::Deleted) => Some((Role::Output, Version::Gone)),
            None => None,
        };
        [input.then_some((Role::Input, Version::Prior)), made]
            .into_iter()
            .flatten()
    }

    /// The store's record of the path in `role`, naming content `hash`.
    pub fn record(&self, role: Role, path: PathBuf, hash: Option<ContentHash>) -> FileRecord {
        FileRecord {
            role,
            path,
            hash,
            before: None,
            ops: self.ops,
            first_ns: Some(self.first_ns),
            last_ns: Some(self.last_ns),
            s3: None,
        }
    }
}

impl PathState {
    /// A file moved with its directory landed on a name the job already knew (`old`, the name's
    /// history): the content the job had read there, or moved away from there, stays an input
    /// of the name — as when a file is renamed onto it — unless the file moved in brings one of
    /// its own (one input per name); a deletion stands, superseded by the file now there. The
    /// name's other history (a temporary) ends.
    pub(super) fn keep_input_of(&mut self, old: PathState) {
        // A deletion standing there is superseded by the file now there, as by one the job put
        // there itself ([`PathState::place`]): gone at the end, or moved on, the name records it.
        if old.deleted() || old.superseded == Some(Made::Deleted) {
            self.superseded = Some(Made::Deleted);
        }
        if self.reads_prior || !old.reads_prior {
            return;
        }
        self.reads_prior = true;
        self.read_stat = old.read_stat;
        self.input_version = old.input_version;
        self.input = old.input;
        self.moved_to = old.moved_to;
        self.found |= old.found;
        self.existed |= old.existed;
        self.first_ns = self.first_ns.min(old.first_ns);
    }

    /// The job puts a file at the path: makes it, or renames, links or exchanges one onto it
    /// (before the event marks the path existing). A deletion standing here is superseded by
    /// the new file ([`PathUse::superseded`]): the file there before the job stays gone whatever
    /// becomes of the new one, and a directory move carries the new one away without it.
    pub(super) fn place(&mut self) {
        if self.deleted() {
            self.superseded = Some(Made::Deleted);
        }
        self.placed = true;
    }

    /// The state a directory move leaves at a name whose file moves with the directory: what the
    /// job did to a file that is no longer there, which did not move. The deletion of the file
    /// there before the job, if one stood before the file now there superseded it (`rm d/f;
    /// touch d/f; mv d e`: `d/f` records a deletion, `e/f` the output); the input of a file the
    /// job read or moved away before it put another at the name (`mv d/f g; touch d/f; mv d e`:
    /// `d/f` the input, `e/f` the output). `self` becomes the moved file's own history.
    pub(super) fn split_prior(&mut self) -> Option<PathState> {
        let deletion = self.superseded == Some(Made::Deleted);
        // The input is another file's only where the job put the file now here.
        let input = self.placed && self.reads_prior;
        if !self.exists || !(deletion || input) {
            return None;
        }
        self.superseded = None;
        let mut left = PathState {
            ops: self.ops,
            first_ns: self.first_ns,
            last_ns: self.last_ns,
            found: true,
            ..PathState::default()
        };
        if input {
            left.reads_prior = true;
            left.read_stat = self.read_stat.take();
            left.input_version = self.input_version;
            left.input = self.input.take();
            left.moved_to = self.moved_to.take();
            left.existed = self.existed;
            self.reads_prior = false;
        }
        if self.placed {
            // The job's own file: what the name found and removed before it stays behind.
            self.found = false;
            self.existed = false;
            self.ops = Ops::from_bits(self.ops.bits() & !Ops::UNLINK.bits());
        }
        Some(left)
    }

    /// A refilled name settled ([`Rules::holds`]), by event `seq`.
    pub(super) fn refill(&mut self, holds: bool, seq: u64) {
        if !std::mem::take(&mut self.refilled) || !holds {
            return;
        }
        // What the job had left here is superseded by the file now there, unless that file is
        // gone too at the end.
        let left = self.path_use().records().1;
        self.superseded = left.filter(|m| *m != Made::Output).or(self.superseded);
        // A file the job did not make, there before the job under the moved directory.
        self.job_made = false;
        self.placed = false;
        self.exists = true;
        self.found = true;
        self.existed = true;
        self.moved_to = None;
        self.written_ns = None;
        self.alias_of = None;
        self.file = None;
        self.changed(seq);
    }

    /// The content at the path changed (or the path now names something else), by event `seq`.
    pub(super) fn changed(&mut self, seq: u64) {
        self.version = seq;
        self.linked_prior = false;
    }

    /// The job reads the path's prior content now (`stat`: its identity, when the event says).
    pub(super) fn read_now(&mut self, stat: Option<&FileStat>) {
        self.reads_prior = true;
        self.read_stat = stat.copied();
        self.input_version = self.version;
        self.input = self.current().cloned();
    }

    /// What an observer saw of the current version's content.
    pub(super) fn current(&self) -> Option<&ContentHash> {
        self.known
            .as_ref()
            .filter(|(v, _)| *v == self.version)
            .map(|(_, h)| h)
    }

    /// An observer saw `content` at the path's current version.
    pub(super) fn knows(&mut self, content: ContentHash) {
        if self.reads_prior && self.input.is_none() && self.input_version == self.version {
            self.input = Some(content.clone());
        }
        self.known = Some((self.version, content));
    }

    /// The content the job left at the path, where an observer saw it.
    pub fn output(&self) -> Option<&ContentHash> {
        self.current()
    }
}
