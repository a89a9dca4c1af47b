//! Which paths never become inputs or outputs: the built-in list plus the project's globs.
//!
//! Glob syntax: `*` matches within one path component, `**` across components, `?` one byte.

use std::cell::RefCell;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::{dfa::DFA, Anchored, Input};
use memchr::memmem::Finder;

/// Runtime noise: kernel filesystems, shared libraries and interpreters' own code and caches.
pub const DEFAULT_IGNORES: &[&str] = &[
    "/proc/**",
    "/sys/**",
    "/dev/**",
    "/run/**",
    "/etc/ld.so.cache",
    "/etc/ld.so.preload",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/gai.conf",
    "/lib/**",
    "/lib64/**",
    "/usr/lib/**",
    "/usr/lib64/**",
    "/usr/libexec/**",
    "/usr/share/locale/**",
    "/usr/share/zoneinfo/**",
    "/usr/local/lib/**",
    "**/lib/python3*/**",
    "**/site-packages/**",
    "**/dist-packages/**",
    "**/__pycache__/**",
    "**/*.pyc",
    "**/*.so",
    "**/*.so.*",
    "/etc/ssl/**",
    "/etc/ca-certificates/**",
    "/usr/share/ca-certificates/**",
    "**/.pyenv/libexec/**",
    "**/.pyenv/plugins/**",
    "**/.pyenv/pyenv.d/**",
    "**/.pyenv/shims/**",
    "**/.pyenv/version",
    // A virtualenv's interpreter settings, read by every Python start inside it: the
    // environment, not a root input of every job run from a venv.
    "**/pyvenv.cfg",
    "**/.roar/**",
    // roar's own per-user cache (package indexes; `roar_env::cache`), wherever it is put.
    "**/.cache/roar/**",
    "**/roar/packages.db*",
    "**/roar-cache-*/**",
    "**/.git/**",
    // Anonymous memory (memfd_create), named by the kernel as if it were a file: a nested
    // `roar run`'s event ring, any program's shared buffers.
    "/memfd:*",
    // eBPF names a memfd by its dentry on the kernel's internal mount: "/". No file is at "/".
    "/",
    // Environment, not data (docs/SEMANTICS.md, "Noise"): fonts and fontconfig, locale and
    // terminal databases, and the caches tools keep for themselves. Caches that hold data a job
    // uses (pretrained weights in ~/.cache/torch/hub, HF models and datasets) stay recorded.
    "/usr/share/fonts/**",
    "/usr/local/share/fonts/**",
    "**/.local/share/fonts/**",
    "**/.fonts/**",
    "/etc/fonts/**",
    "/usr/share/fontconfig/**",
    "/var/cache/fontconfig/**",
    "**/.cache/fontconfig/**",
    "**/.fontconfig/**",
    "/usr/share/i18n/**",
    "/etc/locale.alias",
    "/etc/locale.conf",
    "/etc/timezone",
    "/usr/share/terminfo/**",
    "/etc/terminfo/**",
    "/usr/share/mime/**",
    "**/.cache/matplotlib/**",
    "**/.config/matplotlib/**",
    "**/.matplotlib/**",
    "**/.cache/pip/**",
    "**/.cache/uv/**",
    "**/.cache/torch/kernels/**",
    "**/.cache/torch_extensions/**",
    "/tmp/torchinductor_*/**",
    "**/.triton/**",
    "**/.nv/ComputeCache/**",
    "**/.cache/huggingface/**/.locks/**",
    "**/.cache/huggingface/modules/**",
];

/// A glob compiled to the cheapest test that is equivalent to it; checked on every event.
#[derive(Debug, Clone)]
enum Pattern {
    Exact(Vec<u8>),
    /// `dir/**`
    Prefix(Vec<u8>),
    /// `**/*.ext`: the last component ends with the bytes (which hold no `/`).
    Suffix(Vec<u8>),
    /// `**/name/**`
    Contains(Finder<'static>),
    /// Anything else; `needle` is a literal run every match contains, tested first.
    Glob {
        glob: Vec<u8>,
        needle: Finder<'static>,
    },
}

fn literal(s: &[u8]) -> bool {
    !s.iter().any(|b| matches!(b, b'*' | b'?'))
}

impl Pattern {
    fn compile(g: &[u8]) -> Pattern {
        if literal(g) {
            return Pattern::Exact(g.to_vec());
        }
        if let Some(dir) = g.strip_suffix(b"/**") {
            if literal(dir) {
                let mut p = dir.to_vec();
                p.push(b'/');
                return Pattern::Prefix(p);
            }
            if let Some(name) = dir.strip_prefix(b"**/") {
                if literal(name) {
                    let mut p = vec![b'/'];
                    p.extend_from_slice(name);
                    p.push(b'/');
                    return Pattern::Contains(Finder::new(&p).into_owned());
                }
            }
        }
        if let Some(tail) = g.strip_prefix(b"**/*") {
            if literal(tail) && !tail.contains(&b'/') && !tail.is_empty() {
                return Pattern::Suffix(tail.to_vec());
            }
        }
        Pattern::Glob {
            glob: g.to_vec(),
            needle: Finder::new(needle(g)).into_owned(),
        }
    }

    fn matches(&self, p: &[u8]) -> bool {
        match self {
            Pattern::Exact(e) => p == e.as_slice(),
            Pattern::Prefix(x) => p.starts_with(x),
            Pattern::Suffix(x) => p.ends_with(x),
            // A substring search, not a comparison at every offset: with the default list, that
            // was most of the time classifying a job's events took.
            Pattern::Contains(x) => x.find(p).is_some(),
            Pattern::Glob { glob, needle } => needle.find(p).is_some() && glob_match(glob, p),
        }
    }
}

/// The longest literal run of `glob`, which any path it matches contains: a `/` right after `**`
/// is not part of it, since `**/` may match nothing.
fn needle(glob: &[u8]) -> &[u8] {
    let mut best: &[u8] = &[];
    let mut rest = glob;
    while !rest.is_empty() {
        let wild = rest
            .iter()
            .position(|b| matches!(b, b'*' | b'?'))
            .unwrap_or(rest.len());
        if wild > best.len() {
            best = &rest[..wild];
        }
        rest = &rest[wild..];
        let after_double = rest.starts_with(b"**");
        let skip = rest.iter().take_while(|b| matches!(b, b'*' | b'?')).count();
        rest = &rest[skip..];
        if after_double {
            rest = rest.strip_prefix(b"/").unwrap_or(rest);
        }
    }
    best
}

/// The compiled patterns, tried in turn for a process's first [`SEARCH_AFTER`] paths (a `roar
/// run` of a small job: building the search below costs more than it saves), then through
/// [`Search`]; both answer alike (tested on generated globs and paths).
#[derive(Debug)]
struct Index {
    globs: Vec<Vec<u8>>,
    patterns: Vec<Pattern>,
    tried: AtomicUsize,
    search: OnceLock<Search>,
}

/// Paths matched by trying every pattern before [`Search`] is built: its Aho-Corasick automaton
/// costs ~0.3 ms to build and saves ~0.1-0.3 µs a path (bench/NOTES.md, session 49).
const SEARCH_AFTER: usize = 2_000;

/// The patterns arranged so that a path is tested only against those it could match. Two
/// necessary conditions decide which: an absolute glob whose first component is literal
/// (`/proc/**`, `/etc/hosts`) can only match a path under that component, and any other only a
/// path holding its longest literal run ([`needle`]), all of which one Aho-Corasick pass finds;
/// a literal glob is one lookup. A path under none of the anchors and holding none of the runs
/// (most data files) costs two lookups and a scan of its name (its directory's scan is resumed
/// from, [`Search::any_run`]).
#[derive(Debug)]
struct Search {
    /// Which search this is, for [`RESUME`]'s entry (an address could be another's later).
    id: usize,
    /// Patterns by the literal first component of their glob: one lookup by the path's.
    by_root: std::collections::HashMap<Vec<u8>, Vec<usize>, foldhash::fast::RandomState>,
    /// Literal globs without such a component (`/`), hashed with foldhash (SipHash was a fifth
    /// of a lineage's noise rule).
    exact: std::collections::HashSet<Vec<u8>, foldhash::fast::RandomState>,
    /// The other patterns' literal runs; `needle_of[i]` are the patterns of run `i`.
    needles: DFA,
    needle_of: Vec<Vec<usize>>,
    /// Patterns with no literal run at all (`**`): tried on every path.
    always: Vec<usize>,
}

/// The first component of an absolute `glob` when it is literal and not the last (`proc` of
/// `/proc/**`, `etc` of `/etc/hosts`): every path the glob matches begins with `/` it `/`.
fn root_of(glob: &[u8]) -> Option<&[u8]> {
    let rest = glob.strip_prefix(b"/")?;
    let end = rest.iter().position(|&b| b == b'/')?;
    let root = &rest[..end];
    (!root.is_empty() && literal(root)).then_some(root)
}

/// A path's first component, when another follows it.
fn path_root(path: &[u8]) -> Option<&[u8]> {
    let rest = path.strip_prefix(b"/")?;
    let end = memchr::memchr(b'/', rest)?;
    Some(&rest[..end])
}

impl Index {
    fn new<'a>(globs: impl Iterator<Item = &'a str>) -> Index {
        let globs: Vec<Vec<u8>> = globs.map(|g| g.as_bytes().to_vec()).collect();
        Index {
            patterns: globs.iter().map(|g| Pattern::compile(g)).collect(),
            globs,
            tried: AtomicUsize::new(0),
            search: OnceLock::new(),
        }
    }

    fn matches(&self, p: &[u8]) -> bool {
        if self.search.get().is_none() && self.tried.fetch_add(1, Relaxed) < SEARCH_AFTER {
            return self.patterns.iter().any(|g| g.matches(p));
        }
        self.searched(p)
    }

    /// The answer through [`Search`], built now if it is not yet.
    fn searched(&self, p: &[u8]) -> bool {
        let s = self.search.get_or_init(|| Search::new(&self.globs));
        let test = |ids: &[usize]| ids.iter().any(|&i| self.patterns[i].matches(p));
        if let Some(root) = path_root(p) {
            if let Some(ids) = s.by_root.get(root) {
                if test(ids) {
                    return true;
                }
            }
        }
        (!s.exact.is_empty() && s.exact.contains(p))
            || test(&s.always)
            // Most paths hold no literal run at all: asked first, where the search for every
            // run reports each.
            || (s.any_run(p)
                && s.needles
                    .try_find_overlapping_iter(Input::new(p))
                    .expect("an unanchored search of a DFA built for one")
                    .any(|m| test(&s.needle_of[m.pattern().as_usize()])))
    }
}

/// Every [`Search`] made so far: the next one's id.
static SEARCHES: AtomicUsize = AtomicUsize::new(0);

/// Where [`Search::any_run`] stood after a directory: the search (its id), the directory (to its
/// last `/`), the automaton's state there and whether a run ended in it.
type Resume = (usize, Vec<u8>, StateID, bool);

thread_local! {
    /// The directory [`Search::any_run`] was asked about last, on this thread.
    static RESUME: RefCell<Option<Resume>> = const { RefCell::new(None) };
}

impl Search {
    /// Whether any literal run occurs in `p`. Paths come by directory (a job's outputs, a
    /// listing): the scan of the directory part is kept per thread and resumed from, so a
    /// directory's files cost their names.
    fn any_run(&self, p: &[u8]) -> bool {
        let split = memchr::memrchr(b'/', p).map_or(0, |i| i + 1);
        let (dir, name) = p.split_at(split);
        let start = RESUME.with_borrow(|r| match r {
            Some((id, d, sid, found)) if *id == self.id && d.as_slice() == dir => {
                Some((*sid, *found))
            }
            _ => None,
        });
        let (sid, found) = match start {
            Some(at) => at,
            None => {
                let begin = self
                    .needles
                    .start_state(Anchored::No)
                    .expect("an unanchored start state");
                let at = self.scan(begin, dir);
                // The buffer kept from the directory before: no allocation per directory.
                RESUME.with_borrow_mut(|r| match r {
                    Some((id, d, sid, found)) => {
                        d.clear();
                        d.extend_from_slice(dir);
                        (*id, *sid, *found) = (self.id, at.0, at.1);
                    }
                    None => *r = Some((self.id, dir.to_vec(), at.0, at.1)),
                });
                at
            }
        };
        found || self.scan(sid, name).1
    }

    /// The automaton's state after `bytes` from `sid`, and whether a run ended on the way.
    fn scan(&self, mut sid: StateID, bytes: &[u8]) -> (StateID, bool) {
        let mut found = false;
        for &b in bytes {
            sid = self.needles.next_state(Anchored::No, sid, b);
            found |= self.needles.is_match(sid);
        }
        (sid, found)
    }

    fn new(globs: &[Vec<u8>]) -> Search {
        let mut by_root = std::collections::HashMap::<_, Vec<usize>, _>::default();
        let mut exact = std::collections::HashSet::default();
        let mut runs: Vec<Vec<u8>> = Vec::new();
        let mut needle_of: Vec<Vec<usize>> = Vec::new();
        let mut always = Vec::new();
        for (i, g) in globs.iter().enumerate() {
            if let Some(root) = root_of(g) {
                by_root.entry(root.to_vec()).or_default().push(i);
                continue;
            }
            if literal(g) {
                exact.insert(g.to_vec());
                continue;
            }
            let run = needle(g);
            if run.is_empty() {
                always.push(i);
                continue;
            }
            match runs.iter().position(|r| r == run) {
                Some(k) => needle_of[k].push(i),
                None => {
                    runs.push(run.to_vec());
                    needle_of.push(vec![i]);
                }
            }
        }
        let needles = DFA::new(&runs).expect("a few short literal runs always build");
        Search {
            id: SEARCHES.fetch_add(1, Relaxed),
            by_root,
            exact,
            needles,
            needle_of,
            always,
        }
    }
}

/// The paths a job's record leaves out: [`DEFAULT_IGNORES`] and the project's own. Compiled at
/// the first match (or [`Ignore::compile`]), once for every clone: building the substring
/// searchers (and, in a new process, detecting the CPU's features for them) is ~0.05 ms that
/// `roar run` spends while its command execs rather than before it starts.
#[derive(Debug, Clone)]
pub struct Ignore {
    extra: std::sync::Arc<[String]>,
    patterns: std::sync::Arc<OnceLock<Index>>,
}

impl Ignore {
    pub fn new(extra: &[String]) -> Ignore {
        Ignore {
            extra: extra.into(),
            patterns: Default::default(),
        }
    }

    /// Compiles the patterns now, if no match has yet.
    pub fn compile(&self) {
        self.patterns();
    }

    fn patterns(&self) -> &Index {
        self.patterns.get_or_init(|| {
            Index::new(
                DEFAULT_IGNORES
                    .iter()
                    .copied()
                    .chain(self.extra.iter().map(String::as_str)),
            )
        })
    }

    pub fn is_ignored(&self, path: &Path) -> bool {
        use std::os::unix::ffi::OsStrExt;
        self.patterns().matches(path.as_os_str().as_bytes())
    }
}

pub fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    match pat.first() {
        None => s.is_empty(),
        Some(b'*') if pat.get(1) == Some(&b'*') => {
            let rest = &pat[2..];
            match rest.strip_prefix(b"/") {
                // `**/`: no directory at all, or whole ones: what follows starts a component.
                Some(after) => {
                    glob_match(after, s)
                        || (0..s.len()).any(|i| s[i] == b'/' && glob_match(after, &s[i + 1..]))
                }
                // `**` not before a `/` (at the end, or inside a name): any bytes, `/` included.
                None => (0..=s.len()).any(|i| glob_match(rest, &s[i..])),
            }
        }
        Some(b'*') => {
            let rest = &pat[1..];
            for i in 0..=s.len() {
                if glob_match(rest, &s[i..]) {
                    return true;
                }
                if s.get(i) == Some(&b'/') {
                    break;
                }
            }
            false
        }
        Some(b'?') => !s.is_empty() && s[0] != b'/' && glob_match(&pat[1..], &s[1..]),
        Some(c) => s.first() == Some(c) && glob_match(&pat[1..], &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match(b"/proc/**", b"/proc/self/status"));
        assert!(glob_match(
            b"**/__pycache__/**",
            b"/w/pkg/__pycache__/m.cpython-311.pyc"
        ));
        assert!(glob_match(
            b"**/*.so.*",
            b"/usr/lib/x86_64-linux-gnu/libc.so.6"
        ));
        assert!(glob_match(
            b"**/lib/python3*/**",
            b"/root/.pyenv/versions/3.11.7/lib/python3.11/os.py"
        ));
        assert!(glob_match(b"/data/*.tmp", b"/data/a.tmp"));
        assert!(!glob_match(b"/data/*.tmp", b"/data/sub/a.tmp"));
        assert!(!glob_match(b"/proc/**", b"/process/x"));
        // After `**/` a component begins: a name that only ends with it is not one (found by
        // the generated test below; a project's `**/out*` ignored /w/layout.txt).
        assert!(!glob_match(b"**/out*", b"/w/layout.txt"));
        assert!(glob_match(b"**/out*", b"/w/out.txt"));
        assert!(!Ignore::new(&[]).is_ignored(Path::new("/home/u/mylib/python3.11/data.csv")));
        assert!(!Ignore::new(&[]).is_ignored(Path::new("/work/data/train.csv")));
        assert!(Ignore::new(&["**/*.log".into()]).is_ignored(Path::new("/w/run.log")));
    }

    /// Generated patterns (`*`, `?`, `**` as whole components, literals) and paths, seeded:
    /// the compiled matcher (each shortcut and the general one) answers as globset does with
    /// `literal_separator`, the meaning the module documents. `ROAR_GLOB_SEED` replays a seed,
    /// `ROAR_GLOB_CASES` sets how many pairs.
    #[test]
    fn generated_globs_match_as_globset_does() {
        let env = |k: &str, d: u64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        let seed = env("ROAR_GLOB_SEED", 20261201);
        let cases = env("ROAR_GLOB_CASES", 20_000);
        let mut x = seed | 1;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let names = ["a", "b", "ab", "a.b", ".a", "so", "x.so.1", "lib", "py3"];
        let part = |rnd: &mut dyn FnMut(u64) -> u64, glob: bool| -> String {
            if glob {
                match rnd(8) {
                    0 => "**".into(),
                    1 => "*".into(),
                    2 => format!("*{}", names[rnd(names.len() as u64) as usize]),
                    3 => format!("{}*", names[rnd(names.len() as u64) as usize]),
                    4 => format!("{}?", names[rnd(names.len() as u64) as usize]),
                    _ => names[rnd(names.len() as u64) as usize].into(),
                }
            } else {
                names[rnd(names.len() as u64) as usize].into()
            }
        };
        for case in 0..cases {
            // As roar's patterns are: absolute, or starting with `**/` (the project's globs are
            // resolved against it); paths are always absolute.
            let parts = 1 + rnd(4);
            let mut glob = String::from(if rnd(3) > 0 { "/" } else { "**/" });
            for i in 0..parts {
                if i > 0 {
                    glob.push('/');
                }
                glob.push_str(&part(&mut rnd, true));
            }
            let set = globset::GlobBuilder::new(&glob)
                .literal_separator(true)
                .build()
                .unwrap()
                .compile_matcher();
            let compiled = Pattern::compile(glob.as_bytes());
            for _ in 0..8 {
                let mut path = String::from("/");
                for i in 0..1 + rnd(5) {
                    if i > 0 {
                        path.push('/');
                    }
                    path.push_str(&part(&mut rnd, false));
                }
                assert_eq!(
                    compiled.matches(path.as_bytes()),
                    set.is_match(&path),
                    "case {case} (ROAR_GLOB_SEED={seed}): {glob:?} on {path:?}"
                );
            }
        }
    }

    /// The index (anchors and literal runs) answers as trying every pattern does: generated
    /// sets of globs (the built-in list's and random ones, anchored and not) on generated paths
    /// made of the components both use. `ROAR_GLOB_SEED` replays a seed.
    #[test]
    fn the_index_answers_as_every_pattern_tried() {
        let mut rng = crate::testing::Rng::from_env("ROAR_GLOB_SEED", 20261201);
        let seed = rng.seed();
        let mut rnd = |n: usize| rng.below(n);
        let names = [
            "proc",
            "etc",
            "usr",
            "lib",
            "hosts",
            "a",
            "so",
            "x.so.1",
            "py3",
            "site-packages",
            ".cache",
            "roar",
            ".roar",
            "memfd:x",
            "tmp",
            "",
        ];
        let globbed = ["**", "*", "*a", "so*", "a?", "?", "lib"];
        for case in 0..2_000 {
            let mut globs: Vec<String> = (0..rnd(6))
                .map(|_| DEFAULT_IGNORES[rnd(DEFAULT_IGNORES.len())].to_string())
                .collect();
            for _ in 0..1 + rnd(5) {
                let mut g = String::from(["/", "**/", "/", ""][rnd(4)]);
                for i in 0..1 + rnd(4) {
                    if i > 0 {
                        g.push('/');
                    }
                    g.push_str(match rnd(2) {
                        0 => names[rnd(names.len())],
                        _ => globbed[rnd(globbed.len())],
                    });
                }
                globs.push(g);
            }
            // Two indexes asked in turn about the same paths: each search resumes only from
            // where it stood itself.
            let other: Vec<&str> = globs.iter().skip(1).map(String::as_str).collect();
            let indexes = [
                Index::new(globs.iter().map(String::as_str)),
                Index::new(other.iter().copied()),
            ];
            // Paths by directory, a few names in each, as jobs' files come.
            for _ in 0..10 {
                let mut dir = String::new();
                for _ in 0..rnd(5) {
                    dir.push('/');
                    dir.push_str(names[rnd(names.len())]);
                }
                for _ in 0..3 {
                    let path = match rnd(4) {
                        0 if dir.is_empty() => "/".to_string(),
                        0 => dir.clone(),
                        _ => format!("{dir}/{}", names[rnd(names.len())]),
                    };
                    for (i, index) in indexes.iter().enumerate() {
                        let every = index.patterns.iter().any(|g| g.matches(path.as_bytes()));
                        assert_eq!(
                            index.searched(path.as_bytes()),
                            every,
                            "case {case} (ROAR_GLOB_SEED={seed}): index {i} of {globs:?} on {path:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn needles_are_required_literal_runs() {
        assert_eq!(needle(b"**/lib/python3*/**"), b"lib/python3");
        assert_eq!(needle(b"**/*.so.*"), b".so.");
        assert_eq!(needle(b"/data/*.tmp"), b"/data/");
        assert_eq!(needle(b"**"), b"");
    }

    #[test]
    fn compiled_patterns_agree_with_the_glob_matcher() {
        let paths: &[&[u8]] = &[
            b"/proc/self/status",
            b"/process/x",
            b"/w/pkg/__pycache__/m.pyc",
            b"/w/__pycache__",
            b"/usr/lib/x86_64-linux-gnu/libc.so.6",
            b"/w/data.so",
            b"/w/a.pyc/b",
            b"/etc/passwd",
            b"/w/.roar/roar.db",
            b"/w/.roarx/f",
            b"libc.so.6",
            b"lib/python3.11/os.py",
            b"/root/.pyenv/versions/3.11.7/lib/python3.11/os.py",
            b"/w/lib/python2.7/x",
            b".pyenv/version",
            b"/home/u/.pyenv/version",
            b"/home/u/.pyenv/versionx",
        ];
        let extra = ["/data/*.tmp", "**/x?y/**", "a**b", "**/**/z"];
        for g in DEFAULT_IGNORES.iter().chain(&extra) {
            let compiled = Pattern::compile(g.as_bytes());
            for p in paths {
                assert_eq!(
                    compiled.matches(p),
                    glob_match(g.as_bytes(), p),
                    "{g} on {}",
                    String::from_utf8_lossy(p)
                );
            }
        }
    }
}
