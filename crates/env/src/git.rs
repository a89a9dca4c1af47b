//! The code state: commit, branch and remote read from the repository's files before the command
//! starts (tens of microseconds: no process is spawned on the command's start), and whether the
//! tree is dirty, with the diff itself, from a `git diff` that runs alongside the command at idle
//! priority and is collected after it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use roar_store::GitState;

/// A diff larger than this is not kept (the tree is still recorded as dirty).
pub const MAX_DIFF: usize = 64 << 20;

use crate::repo::{before_the_job, is_oid};
pub use crate::repo::{strip_credentials, Repo};

/// A dirty-tree check running alongside the command.
pub struct DiffJob {
    repo: Repo,
    commit: Option<String>,
    /// Who does the check: [`WAITING`] until the thread or `finish` claims it.
    claim: Arc<AtomicU8>,
    /// git's pid once started (0 before, -1 once roar waits for it: no idle priority then).
    pid: Arc<AtomicI32>,
    /// When the check may start beside the command: [`OVERLAP_AFTER`] after it was made.
    from: std::time::Instant,
    /// The thread, once [`DiffJob::beside`] started it, and what wakes it (the command ended;
    /// dropped, it tells a thread still waiting that `finish` did the check).
    thread: Option<(std::sync::mpsc::Sender<()>, CheckThread)>,
}

/// The check's thread: the diff, None if git could not say or `finish` did the check.
type CheckThread = JoinHandle<Option<Vec<u8>>>;

/// How long a command runs before its dirty check starts beside it.
pub const OVERLAP_AFTER: std::time::Duration = std::time::Duration::from_millis(20);

const WAITING: u8 = 0;
const BY_THREAD: u8 = 1;
const BY_FINISH: u8 = 2;

/// What the concurrent check found.
pub enum Dirt {
    Clean,
    /// Dirty, with the diff unless it was larger than [`MAX_DIFF`].
    Dirty(Option<Vec<u8>>),
}

/// The check itself: the clean-tree record if it still holds (`crate::clean`), else
/// `git diff`, whose empty answer is remembered.
fn check(repo: &Repo, commit: Option<&str>, pid: &AtomicI32) -> Option<Vec<u8>> {
    // A clean checkout unchanged since git last said so: no git (crate::clean).
    if let Some(head) = commit {
        if crate::clean::known(repo, head) {
            return Some(Vec::new());
        }
    }
    let out = diff(&repo.root, commit.is_some(), pid);
    if let (Some(head), Some(b)) = (commit, &out) {
        if b.is_empty() {
            crate::clean::remember(repo, head);
        }
    }
    out
}

impl DiffJob {
    /// A check of `repo` against `commit` for a command starting now: `git diff HEAD --binary`
    /// at idle CPU priority (it yields the CPU to the command), unless the tree is known clean at
    /// `commit` without it (`crate::clean`). Optional locks are off: the user's own git commands
    /// never wait on roar's.
    ///
    /// It runs beside the command only once the command has run for [`OVERLAP_AFTER`]: on two
    /// cores, git's own start (~2 ms of CPU in a small repository) beside a short command slowed
    /// the command more than running it afterwards; a longer command hides the whole diff. Its
    /// thread starts when the caller says the command runs on ([`DiffJob::beside`]). A command
    /// that ends sooner has its check done by [`DiffJob::finish`] on the caller's thread, with no
    /// thread started (~0.1 ms of a short run).
    pub fn start(repo: &Repo, commit: Option<&str>) -> DiffJob {
        DiffJob {
            repo: repo.clone(),
            commit: commit.map(str::to_owned),
            claim: Arc::new(AtomicU8::new(WAITING)),
            pid: Arc::new(AtomicI32::new(0)),
            from: std::time::Instant::now() + OVERLAP_AFTER,
            thread: None,
        }
    }

    /// The command runs on: the check's thread starts, and runs the check from [`OVERLAP_AFTER`]
    /// after [`DiffJob::start`] unless `finish` claims it first. Once; later calls do nothing.
    pub fn beside(&mut self) {
        if self.thread.is_some() {
            return;
        }
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (repo, commit, claim, pid, from) = (
            self.repo.clone(),
            self.commit.clone(),
            self.claim.clone(),
            self.pid.clone(),
            self.from,
        );
        let spawned = std::thread::Builder::new()
            .name("roar-git".into())
            .spawn(move || {
                let _ =
                    wait.recv_timeout(from.saturating_duration_since(std::time::Instant::now()));
                claim
                    .compare_exchange(WAITING, BY_THREAD, Ordering::AcqRel, Ordering::Acquire)
                    .ok()?;
                check(&repo, commit.as_deref(), &pid)
            });
        // No thread: `finish` does the check.
        self.thread = spawned.ok().map(|t| (go, t));
    }

    /// The result; None if git could not say (not installed, not a repository it accepts).
    /// The command has ended: git, if still running, goes back to normal priority, since roar
    /// now waits for it.
    pub fn finish(self) -> Option<Dirt> {
        let out = if self
            .claim
            .compare_exchange(WAITING, BY_FINISH, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // No thread has begun it: the check runs here, at normal priority, and a thread
            // waiting (woken by `go` going away) returns without doing anything.
            self.pid.store(-1, Ordering::Release);
            check(&self.repo, self.commit.as_deref(), &self.pid)?
        } else {
            // Claimed by the thread, so there is one. -1: from now on git runs at normal
            // priority (`diff` sees it if git is not started yet).
            let (go, thread) = self.thread.expect("the thread claimed the check");
            let pid = self.pid.swap(-1, Ordering::AcqRel);
            let _ = go.send(());
            if pid > 0 {
                set_policy(pid, libc::SCHED_OTHER);
            }
            thread.join().ok()??
        };
        Some(if out.is_empty() {
            Dirt::Clean
        } else if out.len() > MAX_DIFF {
            Dirt::Dirty(None)
        } else {
            Dirt::Dirty(Some(out))
        })
    }
}

/// Best effort: a process that is gone, or a policy refused, leaves git as it was.
fn set_policy(pid: i32, policy: i32) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain syscall on a pid we started; failure is ignored.
    #[allow(unsafe_code)]
    unsafe {
        libc::sched_setscheduler(pid, policy, &param);
    }
}

fn diff(root: &Path, has_commit: bool, pid: &AtomicI32) -> Option<Vec<u8>> {
    let mut cmd = Command::new("git");
    cmd.args([
        "--no-optional-locks",
        "-c",
        "core.quotepath=off",
        "diff",
        "--binary",
        "--no-ext-diff",
        "--no-textconv",
        "--no-color",
    ]);
    // Before the first commit, what is staged is the code.
    cmd.arg(if has_commit { "HEAD" } else { "--cached" });
    cmd.current_dir(root)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env("GIT_PAGER", "cat");
    // Spawned without a pre-exec hook, so std uses posix_spawn (no copy of roar's page tables);
    // the idle policy is set right after.
    let mut child = cmd.stdout(Stdio::piped()).spawn().ok()?;
    let id = child.id() as i32;
    set_policy(id, libc::SCHED_IDLE);
    let raced = pid
        .compare_exchange(0, id, Ordering::AcqRel, Ordering::Acquire)
        .is_err();
    if raced {
        // finish() came first: roar already waits for git.
        set_policy(id, libc::SCHED_OTHER);
    }
    let mut stdout = child.stdout.take()?;
    let mut out = Vec::new();
    // Past the limit the rest is drained (git must not block on a full pipe), not kept.
    (&mut stdout)
        .take(MAX_DIFF as u64 + 1)
        .read_to_end(&mut out)
        .ok()?;
    std::io::copy(&mut stdout, &mut std::io::sink()).ok()?;
    match child.wait() {
        Ok(status) => status.success().then_some(out),
        // `roar run` is a subreaper and its tracers wait for any child: git may have been reaped
        // by them. Its output is whole (the pipe closed); a failed git wrote none.
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => Some(out),
        Err(_) => None,
    }
}

/// The code state when `git` must be asked (a ref store this module does not read).
pub fn from_git(root: &Path) -> Option<GitState> {
    let run = |args: &[&str]| {
        let out = Command::new("git")
            .args(args)
            .current_dir(root)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let commit = run(&["rev-parse", "--verify", "-q", "HEAD"]).filter(|c| is_oid(c));
    let branch = run(&["symbolic-ref", "-q", "--short", "HEAD"]).filter(|b| !b.is_empty());
    let remote = run(&["ls-remote", "--get-url"])
        .filter(|u| !u.is_empty() && u != "origin")
        .map(|u| strip_credentials(&u));
    Some(before_the_job(commit, branch, remote))
}

/// Which of `paths` (inside the work tree of `root`) git tracks: `git ls-files` with the paths
/// as literal pathspecs, a thousand per call (git 2.39's ls-files reads no pathspecs from
/// stdin). Unknown (git missing, or failing): none, so the caller treats them as untracked (it
/// keeps more, never less).
pub fn tracked(root: &Path, paths: &[&Path]) -> std::collections::HashSet<PathBuf> {
    let mut found = std::collections::HashSet::new();
    let rel: Vec<&Path> = paths
        .iter()
        .filter_map(|p| p.strip_prefix(root).ok())
        .collect();
    for chunk in rel.chunks(1000) {
        match ls_files(root, chunk) {
            Some(names) => found.extend(names),
            None => return found,
        }
    }
    found
}

/// `git ls-files --cached` of `pathspecs` (literal; every tracked file when empty), as paths
/// under `root`. None when git is missing or fails.
fn ls_files(root: &Path, pathspecs: &[&Path]) -> Option<Vec<PathBuf>> {
    use std::os::unix::ffi::OsStringExt;
    let out = Command::new("git")
        .args([
            "--no-optional-locks",
            "--literal-pathspecs",
            "ls-files",
            "-z",
            "--cached",
            "--",
        ])
        .args(pathspecs)
        .current_dir(root)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    // A subreaper's tracer may have reaped git: its output is whole (the pipe closed).
    if !out.status.success() && out.status.code().is_some() {
        return None;
    }
    let names = out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty());
    Some(
        names
            .map(|n| root.join(std::ffi::OsString::from_vec(n.to_vec())))
            .collect(),
    )
}

/// The identity of `repo`'s index file: it changes with `git add`, `commit`, `checkout`...
fn index_key(repo: &Repo) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let index = std::fs::metadata(repo.git_dir.join("index")).ok()?;
    Some(format!(
        "{} {} {} {}.{}",
        index.dev(),
        index.ino(),
        index.size(),
        index.mtime(),
        index.mtime_nsec()
    ))
}

/// Every file git tracks in a repository, listed again when its index changes: what a
/// long-lived process (the mount daemon) asks "is this tracked?" of, a `git ls-files` per change
/// of the index rather than per question.
pub struct TrackedFiles {
    repo: Repo,
    listed: std::sync::Mutex<Option<(String, std::collections::HashSet<PathBuf>)>>,
}

impl TrackedFiles {
    pub fn new(repo: Repo) -> TrackedFiles {
        TrackedFiles {
            repo,
            listed: std::sync::Mutex::new(None),
        }
    }

    /// Whether git tracks `path`. Unknown (no index, git failing): false, so the caller treats it
    /// as untracked (it keeps more, never less).
    pub fn contains(&self, path: &Path) -> bool {
        if !path.starts_with(&self.repo.root) {
            return false;
        }
        let Some(key) = index_key(&self.repo) else {
            return false;
        };
        let mut listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        if listed.as_ref().is_none_or(|(k, _)| *k != key) {
            let all = ls_files(&self.repo.root, &[]).unwrap_or_default();
            *listed = Some((key, all.into_iter().collect()));
        }
        listed.as_ref().is_some_and(|(_, all)| all.contains(path))
    }
}

/// [`tracked`], answered from `cache` (a file of the caller's) while the repository's index is
/// the one it was made for: asking git costs a process (3-9 ms here) on every job that reads a
/// file of the project, and the index changes only with `git add`, `commit`, `checkout`...
/// Paths the cache does not know are asked for and added.
pub fn tracked_cached(
    repo: &Repo,
    paths: &[&Path],
    cache: &Path,
) -> std::collections::HashSet<PathBuf> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let Some(key) = index_key(repo) else {
        return tracked(&repo.root, paths);
    };
    // The key's line, then one entry per path: `T` (tracked) or `U`, the path, a NUL.
    let text = std::fs::read(cache).unwrap_or_default();
    let mut known: std::collections::HashMap<PathBuf, bool> = Default::default();
    if let Some(rest) = text.strip_prefix(format!("{key}\n").as_bytes()) {
        for entry in rest.split(|b| *b == 0).filter(|e| e.len() > 1) {
            let path = PathBuf::from(std::ffi::OsString::from_vec(entry[1..].to_vec()));
            known.insert(path, entry[0] == b'T');
        }
    }
    let unknown: Vec<&Path> = paths
        .iter()
        .copied()
        .filter(|p| !known.contains_key(*p))
        .collect();
    if !unknown.is_empty() {
        let found = tracked(&repo.root, &unknown);
        for p in unknown {
            known.insert(p.to_owned(), found.contains(p));
        }
        let mut out = format!("{key}\n").into_bytes();
        for (p, t) in &known {
            out.push(if *t { b'T' } else { b'U' });
            out.extend_from_slice(p.as_os_str().as_bytes());
            out.push(0);
        }
        let tmp = cache.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, out).is_ok() {
            let _ = std::fs::rename(&tmp, cache);
        }
    }
    paths
        .iter()
        .filter(|p| known.get(**p) == Some(&true))
        .map(|p| p.to_path_buf())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository whose tracked file changed since its commit.
    fn dirty_repo() -> (tempfile::TempDir, Repo, String) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("w");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("m.py"), "a = 1\n").unwrap();
        let git = |args: &[&str]| {
            let out = Command::new("git")
                .args(["-c", "user.email=t@t", "-c", "user.name=t"])
                .args(args)
                .current_dir(&root)
                .output()
                .expect("git runs");
            assert!(out.status.success(), "git {args:?}");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        git(&["init", "-q"]);
        git(&["add", "-A"]);
        git(&["commit", "-qm", "c"]);
        let head = git(&["rev-parse", "HEAD"]);
        std::fs::write(root.join("m.py"), "a = 2\n").unwrap();
        (t, Repo::find(&root).unwrap(), head)
    }

    /// The check gives one answer whoever runs it: `finish` itself for a command that ended
    /// before any thread started (or before the thread's turn), the thread for one that ran past
    /// `OVERLAP_AFTER`, `finish` racing the thread's wake-up at the boundary, and a thread started
    /// late (`beside` after `OVERLAP_AFTER`: the check starts at once).
    #[test]
    fn the_dirty_check_answers_the_same_from_finish_and_from_its_thread() {
        let (_t, repo, head) = dirty_repo();
        let mut diffs = std::collections::BTreeSet::new();
        // (time to `beside`, if called, then to `finish`), in ms.
        let cases = [
            (None, 0),
            (Some(0), 100),
            (Some(0), 19),
            (Some(0), 20),
            (Some(0), 21),
            (Some(20), 0),
            (Some(25), 0),
            (Some(25), 100),
            (None, 100),
            (Some(0), 0),
        ];
        for (beside_ms, wait_ms) in cases {
            let mut job = DiffJob::start(&repo, Some(&head));
            if let Some(ms) = beside_ms {
                std::thread::sleep(std::time::Duration::from_millis(ms));
                job.beside();
            }
            std::thread::sleep(std::time::Duration::from_millis(wait_ms));
            match job.finish() {
                Some(Dirt::Dirty(Some(diff))) => {
                    let diff = String::from_utf8(diff).unwrap();
                    assert!(diff.contains("-a = 1") && diff.contains("+a = 2"), "{diff}");
                    diffs.insert(diff);
                }
                _ => panic!("{beside_ms:?} then {wait_ms} ms: not dirty with its diff"),
            }
        }
        assert_eq!(diffs.len(), 1, "{diffs:?}");
    }
}
