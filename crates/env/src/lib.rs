//! Environment capture (docs/SEMANTICS.md, "Environment"): the packages a job actually used,
//! derived from what the tracer already saw; the machine; the code state; the parameters in its
//! argv.
//!
//! Packages come from evidence, never from a listing of what is installed: the files a job
//! opened that the ignore rules keep out of its inputs (site-packages, shared libraries,
//! interpreters' own code) and the programs it ran. Each file is looked up in a package index:
//! one per Python site directory and one for dpkg, built on first use, kept in a per-user cache
//! ([`cache`]) with the identity of what it was built from, and rebuilt when that changes. A job
//! that loads nothing new costs a handful of indexed lookups.

pub mod cache;
pub mod clean;
pub mod conda;
pub mod dpkg;
pub mod git;
pub mod params;
pub mod python;
pub mod repo;
pub mod runtime;
pub mod values;
pub mod wanted;

use std::collections::{BTreeSet, HashMap};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use roar_store::{Package, Runtime};

pub use cache::Cache;

/// What a job showed of its environment.
#[derive(Debug, Default)]
pub struct Evidence<'a> {
    /// Files it touched that are environment, not data (the ignored paths).
    pub files: &'a [PathBuf],
    /// Its inputs (an editable install's sources are inputs: they are the project's code).
    pub inputs: Vec<&'a Path>,
    /// The programs it ran.
    pub programs: Vec<&'a Path>,
}

/// A package index: `source` names what was indexed (`dpkg`, `python:SITE_DIR`, `exe:PATH`),
/// `stamp` the identity of its files when it was built, `entries` key -> package.
#[derive(Debug, Clone, Default)]
pub struct PackageIndex {
    pub source: String,
    pub stamp: String,
    pub entries: Vec<(Vec<u8>, Package)>,
}

/// An index in use for one job: the stored one, or one just built.
enum Index {
    Stored(String),
    Fresh(HashMap<Vec<u8>, Package>),
    Missing,
}

struct Resolver<'c> {
    cache: &'c mut Cache,
    root: PathBuf,
    indexes: HashMap<String, Index>,
    /// Directories, by whether any dpkg package lists them.
    dpkg_dirs: HashMap<PathBuf, bool>,
    /// Directories, by the conda environment they lie in.
    conda_prefixes: HashMap<PathBuf, Option<PathBuf>>,
    real: RealPaths,
}

/// Paths with every symlink resolved, as `realpath` gives them, from their directories' (each
/// resolved once): glibc's realpath reads every component of a path again (a readlink each), and
/// a job's files lie in a few directories. One lstat tells whether the name itself is a link.
#[derive(Default)]
struct RealPaths {
    /// Directories, by their resolved paths (None: not there).
    dirs: HashMap<PathBuf, Option<PathBuf>>,
}

impl RealPaths {
    fn dir(&mut self, dir: &Path) -> Option<PathBuf> {
        if let Some(real) = self.dirs.get(dir) {
            return real.clone();
        }
        let real = std::fs::canonicalize(dir).ok();
        self.dirs.insert(dir.to_owned(), real.clone());
        real
    }

    fn of(&mut self, path: &Path) -> Option<PathBuf> {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return std::fs::canonicalize(path).ok();
        };
        let meta = std::fs::symlink_metadata(path).ok()?;
        if meta.file_type().is_symlink() {
            return std::fs::canonicalize(path).ok();
        }
        Some(self.dir(dir)?.join(name))
    }
}

impl Resolver<'_> {
    /// Index `source`, stamped `stamp`, built by `build` unless the cache holds it with that
    /// stamp.
    fn index(
        &mut self,
        source: &str,
        stamp: impl FnOnce() -> Option<String>,
        build: impl FnOnce() -> Vec<(Vec<u8>, Package)>,
    ) -> &Index {
        if !self.indexes.contains_key(source) {
            let index = match stamp() {
                None => Index::Missing,
                Some(stamp) => {
                    if self.cache.stamp(source).as_deref() == Some(stamp.as_str()) {
                        Index::Stored(source.to_owned())
                    } else {
                        let entries = build();
                        let map = entries.iter().cloned().collect();
                        self.cache.replace(&PackageIndex {
                            source: source.to_owned(),
                            stamp,
                            entries,
                        });
                        Index::Fresh(map)
                    }
                }
            };
            self.indexes.insert(source.to_owned(), index);
        }
        &self.indexes[source]
    }

    fn lookup(&self, source: &str, key: &[u8]) -> Option<Package> {
        match self.indexes.get(source)? {
            // The cache keeps what it answered while the source's stamp holds.
            Index::Stored(s) => self.cache.lookup(s, key),
            Index::Fresh(map) => map.get(key).cloned(),
            Index::Missing => None,
        }
    }

    fn python(&mut self, site: &Path, rest: &Path) -> Option<Package> {
        let source = format!("python:{}", site.display());
        let s = site.to_owned();
        let s2 = site.to_owned();
        self.index(&source, || python::stamp(&s), || python::index(&s2));
        python::keys(rest)
            .iter()
            .find_map(|k| self.lookup(&source, k))
    }

    /// The conda package owning `path`, when it lies in a conda environment.
    fn conda(&mut self, path: &Path) -> Option<Package> {
        let dir = path.parent()?;
        let prefix = match self.conda_prefixes.get(dir) {
            Some(p) => p.clone(),
            None => {
                let p = conda::prefix_of(dir);
                self.conda_prefixes.insert(dir.to_owned(), p.clone());
                p
            }
        }?;
        let source = format!("conda:{}", prefix.display());
        let (p1, p2) = (prefix.clone(), prefix);
        self.index(&source, || conda::stamp(&p1), || conda::index(&p2));
        let real = self.real.of(path);
        [Some(path.to_owned()), real]
            .into_iter()
            .flatten()
            .find_map(|p| self.lookup(&source, p.as_os_str().as_bytes()))
    }

    fn dpkg(&mut self, path: &Path) -> Option<Package> {
        let admin = dpkg::admin_dir(&self.root);
        let a2 = admin.clone();
        self.index(dpkg::SOURCE, || dpkg::stamp(&admin), || dpkg::index(&a2));
        // dpkg lists every directory of its files: a file whose directory no package lists is
        // no package's (a Python stdlib outside dpkg is hundreds of such files, one lookup).
        let dir = path.parent()?;
        let owned = match self.dpkg_dirs.get(dir) {
            Some(owned) => *owned,
            None => {
                let real = self.real.dir(dir);
                let owned = dpkg::candidates(dir, real).iter().any(|d| {
                    self.lookup(dpkg::SOURCE, d.as_os_str().as_bytes())
                        .is_some()
                });
                self.dpkg_dirs.insert(dir.to_owned(), owned);
                owned
            }
        };
        if !owned {
            return None;
        }
        let real = self.real.of(path);
        dpkg::candidates(path, real)
            .iter()
            .find_map(|p| self.lookup(dpkg::SOURCE, p.as_os_str().as_bytes()))
    }

    /// Editable installs of the site directories seen, as (source directory, package).
    fn editables(&self, sites: &BTreeSet<PathBuf>) -> Vec<(PathBuf, Package)> {
        let mut out = Vec::new();
        for site in sites {
            let source = format!("python:{}", site.display());
            match self.indexes.get(&source) {
                Some(Index::Fresh(map)) => {
                    for (k, p) in map {
                        if let Some(dir) = k.strip_prefix(python::EDITABLE) {
                            out.push((PathBuf::from(std::ffi::OsStr::from_bytes(dir)), p.clone()));
                        }
                    }
                }
                Some(Index::Stored(s)) => {
                    out.extend(self.cache.prefixed(s, python::EDITABLE).into_iter().map(
                        |(k, p)| {
                            let dir = &k[python::EDITABLE.len()..];
                            (PathBuf::from(std::ffi::OsStr::from_bytes(dir)), p)
                        },
                    ));
                }
                _ => {}
            }
        }
        out
    }
}

/// The packages `evidence` shows the job used, sorted. Indexes come from `cache` and go back
/// to it when rebuilt; `exclude` are roar's own files (its shim), never a package of the job's.
pub fn packages(cache: &mut Cache, evidence: &Evidence, exclude: &[PathBuf]) -> Vec<Package> {
    packages_under(cache, Path::new("/"), evidence, exclude)
}

/// [`packages`] with the dpkg database under `root`.
pub fn packages_under(
    cache: &mut Cache,
    root: &Path,
    evidence: &Evidence,
    exclude: &[PathBuf],
) -> Vec<Package> {
    let mut r = Resolver {
        cache,
        root: root.to_owned(),
        indexes: HashMap::new(),
        dpkg_dirs: HashMap::new(),
        conda_prefixes: HashMap::new(),
        real: RealPaths::default(),
    };
    let mut found: BTreeSet<Package> = BTreeSet::new();
    let mut sites = BTreeSet::new();
    let files = evidence.files.iter().map(PathBuf::as_path);
    for path in files.chain(evidence.programs.iter().copied()) {
        if exclude.iter().any(|e| e == path)
            || path.starts_with("/proc")
            || path.starts_with("/dev")
        {
            continue;
        }
        if let Some((site, rest)) = python::site_of(path) {
            sites.insert(site.clone());
            if python::is_startup_noise(&rest) {
                continue;
            }
            if let Some(p) = r.python(&site, &rest) {
                found.insert(p);
                continue;
            }
        }
        if let Some(p) = r.conda(path).or_else(|| r.dpkg(path)) {
            found.insert(p);
        }
    }
    // Site directories whose only evidence was startup noise still have their indexes read:
    // their editable installs are found through the sources the job read.
    for site in &sites {
        let source = format!("python:{}", site.display());
        let (s, s2) = (site.clone(), site.clone());
        r.index(&source, || python::stamp(&s), || python::index(&s2));
    }
    let editables = r.editables(&sites);
    if !editables.is_empty() {
        let used = evidence
            .inputs
            .iter()
            .copied()
            .chain(evidence.files.iter().map(PathBuf::as_path));
        for path in used {
            if let Some((_, p)) = editables.iter().find(|(dir, _)| path.starts_with(dir)) {
                found.insert(p.clone());
            }
        }
    }
    for program in &evidence.programs {
        if let Some(p) = interpreter(&mut r, program) {
            found.insert(p);
        }
    }
    found.into_iter().collect()
}

/// The machine: probed once per boot, then read from `cache`.
pub fn machine(cache: &Cache) -> Runtime {
    let boot = runtime::boot_id();
    let host = runtime::hostname();
    if let Some(rt) = boot
        .as_deref()
        .and_then(|b| cache.runtime(b, host.as_deref()))
    {
        return rt;
    }
    let rt = runtime::probe(Path::new("/"), true);
    if let Some(b) = &boot {
        cache.keep_runtime(b, &rt);
    }
    rt
}

/// The identity of a file or directory an index is built from: a change (a package installed,
/// a binary replaced) changes it.
pub(crate) fn stamp_of(path: &Path) -> Option<String> {
    let m = std::fs::metadata(path).ok()?;
    Some(format!(
        "{}:{}:{}.{}:{}",
        m.dev(),
        m.ino(),
        m.mtime(),
        m.mtime_nsec(),
        m.size()
    ))
}

/// An interpreter the job ran (python, node, ruby), with the version it reports: asked once per
/// binary (`EXE --version`) and kept as an index stamped with the binary's identity.
fn interpreter(r: &mut Resolver, program: &Path) -> Option<Package> {
    let name = program.file_name()?.to_str()?;
    let kind = ["python", "node", "ruby"].into_iter().find(|k| {
        name.starts_with(k)
            && name[k.len()..]
                .chars()
                .all(|c| c.is_ascii_digit() || c == '.')
    })?;
    let real = std::fs::canonicalize(program).ok()?;
    let source = format!("exe:{}", real.display());
    let (r1, r2) = (real.clone(), real.clone());
    r.index(
        &source,
        || stamp_of(&r1),
        || {
            version_of(&r2)
                .map(|version| {
                    vec![(
                        Vec::new(),
                        Package {
                            kind: "interpreter".into(),
                            name: kind.into(),
                            version,
                            installer: None,
                            location: Some(r2.to_string_lossy().into_owned()),
                            commit: None,
                        },
                    )]
                })
                .unwrap_or_default()
        },
    );
    r.lookup(&source, b"")
}

/// `EXE --version`: "Python 3.11.7", "v20.11.1", "ruby 3.1.2p20 (...)".
fn version_of(exe: &Path) -> Option<String> {
    let out = Command::new(exe)
        .arg("--version")
        .env_clear()
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(if out.stdout.is_empty() {
        &out.stderr
    } else {
        &out.stdout
    })
    .into_owned();
    let word = text.split_whitespace().find(|w| {
        let w = w.trim_start_matches('v');
        w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.')
    })?;
    Some(word.trim_start_matches('v').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// A path resolved from its directory's resolution is what `realpath` gives, whatever links
    /// lie in it: linked directories (absolute, relative, chained), a linked name, `..` after a
    /// link, a dangling link, a missing file, the root; asked in every order, twice.
    #[test]
    fn real_paths_are_what_realpath_gives() {
        use std::os::unix::fs::symlink;
        let t = tempfile::tempdir().unwrap();
        let base = t.path();
        write(&base.join("usr/lib/x/libz.so.1.3"), "z");
        write(&base.join("usr/bin/tool"), "t");
        symlink("usr/lib", base.join("lib")).unwrap();
        symlink(base.join("lib"), base.join("lib64")).unwrap();
        symlink("libz.so.1.3", base.join("usr/lib/x/libz.so.1")).unwrap();
        symlink("../x/libz.so.1", base.join("usr/lib/libz-up.so")).unwrap();
        symlink("nowhere", base.join("usr/bin/dangling")).unwrap();
        let paths: Vec<PathBuf> = [
            "usr/lib/x/libz.so.1.3",
            "usr/lib/x/libz.so.1",
            "lib/x/libz.so.1.3",
            "lib64/x/libz.so.1",
            "lib64/x/../x/libz.so.1.3",
            "lib/../bin/tool",
            "usr/lib/libz-up.so",
            "usr/bin/dangling",
            "usr/bin/missing",
            "lib64",
            "lib64/x",
        ]
        .iter()
        .map(|p| base.join(p))
        .chain([PathBuf::from("/"), PathBuf::from("/usr")])
        .collect();
        let mut real = RealPaths::default();
        for p in paths.iter().chain(paths.iter().rev()) {
            assert_eq!(real.of(p), std::fs::canonicalize(p).ok(), "{}", p.display());
        }
    }

    /// A conda environment with a library and a Python distribution: found from the files a job
    /// touched, the first time by building the indexes, the second time from the cache.
    #[test]
    fn evidence_resolves_through_built_then_cached_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("env");
        let site = prefix.join("lib/python3.11/site-packages");
        write(
            &prefix.join("conda-meta/libfoo-1.2-h0.json"),
            r#"{"name": "libfoo", "version": "1.2", "build": "h0", "channel": "conda-forge",
                "files": ["lib/libfoo.so.1"]}"#,
        );
        write(&prefix.join("lib/libfoo.so.1"), "elf");
        write(
            &site.join("bar-3.0.dist-info/METADATA"),
            "Metadata-Version: 2.1\nName: bar\nVersion: 3.0\n",
        );
        write(&site.join("bar-3.0.dist-info/INSTALLER"), "conda\n");
        write(
            &site.join("bar-3.0.dist-info/RECORD"),
            "bar/__init__.py,,\n",
        );
        write(&site.join("bar/__init__.py"), "");
        write(
            &site.join("unused-1.0.dist-info/METADATA"),
            "Name: unused\nVersion: 1.0\n",
        );
        write(&site.join("unused-1.0.dist-info/RECORD"), "unused.py,,\n");
        let files = vec![
            prefix.join("lib/libfoo.so.1"),
            site.join("bar/__init__.py"),
            site.join("distutils-precedence.pth"),
        ];
        let evidence = Evidence {
            files: &files,
            inputs: Vec::new(),
            programs: Vec::new(),
        };
        let db = dir.path().join("cache/packages.db");
        let no_dpkg = dir.path().join("no-root");
        for round in ["built", "cached"] {
            let mut cache = Cache::at(&db);
            let found = packages_under(&mut cache, &no_dpkg, &evidence, &[]);
            let names: Vec<(&str, &str, &str)> = found
                .iter()
                .map(|p| (p.kind.as_str(), p.name.as_str(), p.version.as_str()))
                .collect();
            assert_eq!(
                names,
                [("conda", "libfoo", "1.2=h0"), ("python", "bar", "3.0")],
                "{round}"
            );
            assert_eq!(found[0].installer.as_deref(), Some("conda:conda-forge"));
            assert_eq!(found[1].installer.as_deref(), Some("conda"));
        }
        // A new distribution changes the site directory: its index is rebuilt.
        write(
            &site.join("baz-1.0.dist-info/METADATA"),
            "Name: baz\nVersion: 1.0\n",
        );
        write(&site.join("baz-1.0.dist-info/RECORD"), "baz.py,,\n");
        let files = vec![site.join("baz.py")];
        let evidence = Evidence {
            files: &files,
            inputs: Vec::new(),
            programs: Vec::new(),
        };
        let found = packages_under(&mut Cache::at(&db), &no_dpkg, &evidence, &[]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].name, "baz");
    }
}
