//! Finding and creating a roar project: the `.roar/` directory holding `roar.db` and
//! `config.toml`, found by walking up from the current directory like git does.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Result, StoreError};

pub const DIR_NAME: &str = ".roar";
pub const DB_NAME: &str = "roar.db";
pub const CONFIG_NAME: &str = "config.toml";

/// Written by `roar init`; every key shows its default.
pub const DEFAULT_CONFIG: &str = r#"# roar project configuration.

# Content hash recorded for every artifact: "blake3", or "sha256" to record sha256 as well.
hash = "blake3"

# Default tracer for `roar run`: "auto", "preload", "ptrace" or "ebpf".
tracer = "auto"

# Paths a job may touch without them becoming inputs or outputs, added to the built-in list
# (/proc, /sys, /dev, system libraries, fonts, tool caches, .roar/, __pycache__). Globs as in
# .gitignore: `*.log` matches that name anywhere, `data/tmp/**` is relative to the project,
# `/scratch/**` is absolute; `*` stays within a name, `**` crosses directories. They also hide
# matching files of jobs recorded before they were added (`roar show --all` shows everything).
ignore = []

# The S3 gateway (`roar gateway`, `roar run --s3`): clients get AWS_ENDPOINT_URL pointing at it.
[s3]
# Start a gateway for every `roar run`, as `--s3` does.
enabled = false
# Forward to an S3 service (re-signed with the credentials in the environment or AWS_PROFILE)
# instead of serving the embedded object store in .roar/s3/.
# upstream = "http://127.0.0.1:9000"
region = "us-east-1"

# The environment `roar run` records with each job (`roar show JOB --env`): the packages it
# used (Python distributions, dpkg packages, the interpreter), the machine, and the code.
[env]
# Keep a dirty tree's `git diff HEAD` in the store, so `roar reproduce` can restore the exact code
# (false: record only that the tree was dirty).
diff = true
# Record the packages the job used, found from the files it loaded.
packages = true

# Secrets are redacted from command lines and environments before anything is stored
# (docs/SECURITY.md lists the built-in rules). Add your own here:
[redact]
# More names whose values are secrets: variables, options (without dashes), name=value pairs.
# `*` matches anything; case is ignored.
names = []
# Names that are never secret by name (values are still checked for token shapes).
allow = []
# Regular expressions; every match is redacted wherever it appears.
patterns = []

# Steps inside a job (`roar show JOB`): a program that a driver started begins a step of its own.
# Uncomment to replace the built-in drivers (shells, make, ninja, xargs, env, nohup, time, timeout,
# nice, python*...: docs/SEMANTICS.md "Steps"); `drivers = []` makes every job one step.
# [steps]
# drivers = ["bash", "sh", "make", "python*"]
"#;

#[derive(Debug, Clone)]
pub struct Project {
    /// The directory that contains `.roar/`.
    pub root: PathBuf,
    /// The store queries read instead of `.roar/roar.db` (a team store's mirror, `--remote`).
    db: Option<PathBuf>,
}

impl Project {
    pub fn dir(&self) -> PathBuf {
        self.root.join(DIR_NAME)
    }

    /// Where observers keep what they saw while a job runs (`roar_engine::journal`).
    /// The object store: the embedded S3 store's bodies and the file versions kept
    /// (`roar_store::objects`).
    pub fn objects_dir(&self) -> PathBuf {
        self.dir().join("s3")
    }

    pub fn objects(&self) -> crate::objects::Objects {
        crate::objects::Objects::at(&self.objects_dir())
    }

    pub fn journal_dir(&self) -> PathBuf {
        self.dir().join("journal")
    }

    pub fn db_path(&self) -> PathBuf {
        self.db.clone().unwrap_or_else(|| self.dir().join(DB_NAME))
    }

    /// Whether queries read a team store's mirror ([`Project::reading`]).
    pub fn reads_a_mirror(&self) -> bool {
        self.db.is_some()
    }

    /// The same project, its queries reading the store at `db` (a team store's mirror).
    pub fn reading(self, db: PathBuf) -> Project {
        Project {
            db: Some(db),
            ..self
        }
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir().join(CONFIG_NAME)
    }

    /// Finds the project containing `start`. `ROAR_DIR`, if set, names the `.roar` directory
    /// directly (for stores kept outside the tree).
    pub fn find(start: &Path) -> Result<Project> {
        if let Some(dir) = std::env::var_os("ROAR_DIR") {
            let dir = PathBuf::from(dir);
            if dir.join(DB_NAME).is_file() {
                let root = dir.parent().unwrap_or(Path::new("/")).to_owned();
                return Ok(Project { root, db: None });
            }
            return Err(StoreError::NoProject { start: dir });
        }
        let mut cur = Some(start);
        while let Some(dir) = cur {
            if dir.join(DIR_NAME).join(DB_NAME).is_file() {
                return Ok(Project {
                    root: dir.to_owned(),
                    db: None,
                });
            }
            cur = dir.parent();
        }
        Err(StoreError::NoProject {
            start: start.to_owned(),
        })
    }

    /// Creates `.roar/` in `root` (idempotent: an existing project is opened and left as is).
    /// Returns the project and whether it was newly created.
    pub fn init(root: &Path) -> Result<(Project, bool)> {
        let project = Project {
            root: root.to_owned(),
            db: None,
        };
        let dir = project.dir();
        let fresh = !project.db_path().exists();
        crate::private::create_dir(&dir).map_err(|e| StoreError::io("create", &dir, e))?;
        if !project.config_path().exists() {
            std::fs::write(project.config_path(), DEFAULT_CONFIG)
                .map_err(|e| StoreError::io("write", project.config_path(), e))?;
        }
        crate::db::open(&project.db_path(), true)?;
        if root.join(".git").exists() {
            ignore_in_git(root)?;
        }
        Ok((project, fresh))
    }
}

/// Adds `.roar/` to the repository's `.gitignore` unless a line already ignores it.
fn ignore_in_git(root: &Path) -> Result<()> {
    let path = root.join(".gitignore");
    let existing = match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(StoreError::io("read", &path, e)),
    };
    if existing
        .lines()
        .any(|l| matches!(l.trim(), ".roar" | ".roar/" | "/.roar" | "/.roar/"))
    {
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .map_err(|e| StoreError::io("open", &path, e))?;
    let sep = if existing.is_empty() || existing.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    writeln!(f, "{sep}.roar/").map_err(|e| StoreError::io("write", &path, e))
}
