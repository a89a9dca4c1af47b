//! Which file versions a job keeps in the project's object store (`[keep]` in the config;
//! docs/SEMANTICS.md, "Versions kept"): by default every output, and every input inside the
//! project that git cannot give back (not tracked). The bytes are copied while they are hashed
//! (`roar_store::hash::hash_paths_keeping`), so keeping reads nothing twice.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use roar_gateway::objects_remote::ObjectRemote;
use roar_store::ignore::Ignore;
use roar_store::objects::Objects;
use roar_store::{Made, Project};
use roar_tracer::collect::Classified;

use crate::config::KeepConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inputs {
    /// Inside the project and not tracked by git.
    Untracked,
    /// Inside the project.
    All,
    None,
}

/// The rule for one job.
pub struct Rule {
    outputs: bool,
    inputs: Inputs,
    root: PathBuf,
    store_dir: PathBuf,
    ignore: Ignore,
    tracked: Tracked,
    pub objects: Objects,
}

/// Which inputs inside the project git tracks.
enum Tracked {
    /// A job's, asked once as it ends ([`Rule::learn_tracked`]).
    Learned(HashSet<PathBuf>),
    /// The mount daemon's: every tracked file, listed again when git's index changes.
    Live(Option<roar_env::git::TrackedFiles>),
}

impl Tracked {
    fn contains(&self, path: &Path) -> bool {
        match self {
            Tracked::Learned(set) => set.contains(path),
            Tracked::Live(files) => files.as_ref().is_some_and(|f| f.contains(path)),
        }
    }
}

impl Rule {
    pub fn new(config: &KeepConfig, project: &Project) -> Rule {
        Rule {
            outputs: config.outputs,
            inputs: match config.inputs.as_str() {
                "all" => Inputs::All,
                "none" => Inputs::None,
                _ => Inputs::Untracked,
            },
            root: project.root.clone(),
            store_dir: project.dir(),
            ignore: Ignore::new(&config.ignore),
            tracked: Tracked::Learned(HashSet::new()),
            objects: project.objects().with_max(config.max_file_bytes),
        }
    }

    /// The rule for every job of a mount: the mount asks it as each version is read or left, so
    /// git's answer is the daemon's own, kept until the index changes. None when nothing is kept.
    pub fn for_mount(mut self) -> Option<roar_roarfs::Keep> {
        if !self.outputs && self.inputs == Inputs::None {
            return None;
        }
        let repo = roar_env::git::Repo::find(&self.root);
        self.tracked = Tracked::Live(repo.map(roar_env::git::TrackedFiles::new));
        Some(roar_roarfs::Keep {
            objects: self.objects.clone(),
            rule: Box::new(self),
        })
    }

    /// What hashing a job's files keeps, if anything.
    pub fn versions(&self) -> Option<roar_tracer::collect::Versions<'_>> {
        (self.outputs || self.inputs != Inputs::None).then_some(roar_tracer::collect::Versions {
            objects: &self.objects,
            rule: self,
        })
    }

    /// What the early hasher (outputs hashed while the job runs) keeps.
    pub fn early(&self) -> Option<roar_tracer::early::KeepOutputs> {
        self.outputs.then(|| roar_tracer::early::KeepOutputs {
            objects: self.objects.clone(),
            ignore: self.ignore.clone(),
        })
    }
}

impl roar_tracer::collect::KeepRule for Rule {
    fn wants(&self, path: &Path, made: bool) -> bool {
        if path.starts_with(&self.store_dir) || self.ignore.is_ignored(path) {
            return false;
        }
        if made {
            return self.outputs;
        }
        // A parameter file the job read (`params.yaml`): tiny, and what `roar diff` and `roar
        // runs` read values from, tracked by git or not.
        if self.inputs != Inputs::None && roar_env::values::param_file(path).is_some() {
            return true;
        }
        match self.inputs {
            Inputs::None => false,
            Inputs::All => path.starts_with(&self.root),
            Inputs::Untracked => path.starts_with(&self.root) && !self.tracked.contains(path),
        }
    }
}

impl Rule {
    /// Learns which of the job's inputs inside the project git tracks (a tracked input comes
    /// back from the commit and the kept diff; only untracked ones are kept): from the cache of
    /// earlier answers while git's index is unchanged, else one `git ls-files`.
    pub fn learn_tracked(&mut self, classified: &Classified) {
        if self.inputs != Inputs::Untracked {
            return;
        }
        let inputs: Vec<&Path> = classified
            .paths
            .iter()
            .filter(|(p, st)| {
                let (read, made) = st.path_use().records();
                read && made != Some(Made::Output)
                    && p.starts_with(&self.root)
                    && !p.starts_with(&self.store_dir)
                    && !self.ignore.is_ignored(p)
            })
            .map(|(p, _)| p.as_path())
            .collect();
        if inputs.is_empty() {
            return;
        }
        if let Some(repo) = roar_env::git::Repo::find(&self.root) {
            let cache = self.store_dir.join("git-tracked");
            self.tracked = Tracked::Learned(roar_env::git::tracked_cached(&repo, &inputs, &cache));
        }
    }
}

/// The team's kept versions (`objects` of each remote that has it), reached lazily.
pub struct TeamObjects<'a> {
    project: &'a Project,
    config: crate::config::Config,
}

impl<'a> TeamObjects<'a> {
    pub fn new(project: &'a Project) -> TeamObjects<'a> {
        TeamObjects {
            project,
            config: crate::config::Config::load(project).unwrap_or_default(),
        }
    }

    fn remotes(&self) -> impl Iterator<Item = (&String, anyhow::Result<ObjectRemote>)> {
        self.config.remotes.iter().filter_map(|(name, r)| {
            let url = r.objects.as_deref()?;
            let region = r.objects_region.as_deref().unwrap_or("us-east-1");
            Some((
                name,
                ObjectRemote::connect(url, r.objects_endpoint.as_deref(), region),
            ))
        })
    }

    /// Fetches version `blake3` into the local object store from the first remote holding it.
    /// True when it is kept here now.
    pub fn fetch(&self, blake3: &str) -> bool {
        let objects = self.project.objects();
        if objects.has(blake3) {
            return true;
        }
        for (name, remote) in self.remotes() {
            match remote.and_then(|r| r.fetch(&objects, blake3)) {
                Ok(true) => return true,
                Ok(false) => {}
                Err(e) => eprintln!("roar: warning: remote {name}: {e:#}"),
            }
        }
        false
    }
}

/// Sends the remote `name`'s bucket every kept version it does not hold yet; the ones sent (or
/// found there) are listed in `.roar/remotes/NAME.objects`, so each is asked about once.
/// Returns how many were sent.
pub fn push_objects(
    project: &Project,
    name: &str,
    r: &crate::config::RemoteConfig,
) -> anyhow::Result<usize> {
    use std::io::Write;
    let Some(url) = r.objects.as_deref() else {
        return Ok(0);
    };
    let region = r.objects_region.as_deref().unwrap_or("us-east-1");
    let objects = project.objects();
    let list = project
        .dir()
        .join("remotes")
        .join(format!("{name}.objects"));
    let done: HashSet<String> = std::fs::read_to_string(&list)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    let mine = objects.all();
    let todo: Vec<&String> = mine.iter().filter(|h| !done.contains(*h)).collect();
    if todo.is_empty() {
        return Ok(0);
    }
    let remote = ObjectRemote::connect(url, r.objects_endpoint.as_deref(), region)?;
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&list)?;
    let mut sent = 0;
    for h in todo {
        if !remote.has(h)? {
            remote.put(h, &objects.path(h))?;
            sent += 1;
        }
        writeln!(out, "{h}")?;
    }
    Ok(sent)
}

/// With a size budget (`[keep] budget_bytes`), starts `roar gc` detached after a job kept its
/// versions: the least recently used go while the user's next command runs, not before it.
pub fn budget_in_background(config: &crate::config::Config) {
    if config.keep.budget_bytes > 0 {
        crate::background::roar_in_background(&["gc".as_ref()], "roar gc for the keep budget");
    }
}
