//! A clean tree known without running git: the dirty check of `roar run` in the common case of an
//! unchanged, clean checkout costs a few hundred stats instead of a `git diff` (a process start
//! and ~2-3 ms here, paid after a short command).
//!
//! When `git diff HEAD` finds the tree clean, a mark remembers the commit and the index file's
//! identity (size, mtime, ctime, inode). Later, if HEAD and the index are still those, the tree is
//! clean exactly when every tracked file still has the stat data the index holds for it — the
//! test git itself makes before reading a file. Anything this does not read as git would (another
//! index version, a split or sparse index, conflicts, submodules, intent-to-add or skip-worktree
//! entries, a file changed in the same instant as the index was written, SHA-256 repositories, more
//! than [`MAX_ENTRIES`] files) means "not known", and git is asked as before.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::repo::Repo;

/// Bigger indexes are left to git (it stats in parallel; the point here is small repositories,
/// where git's start dominates).
pub const MAX_ENTRIES: usize = 5000;

#[derive(Debug, PartialEq, Eq)]
struct IndexId {
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
    ino: u64,
}

fn index_id(meta: &std::fs::Metadata) -> IndexId {
    IndexId {
        size: meta.size(),
        mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
        ino: meta.ino(),
    }
}

/// The marks live in the user's cache (crate::cache::dir), one file per repository.
fn marks() -> Option<PathBuf> {
    Some(crate::cache::dir()?.join("git-clean"))
}

fn mark_path(marks: &Path, repo: &Repo) -> PathBuf {
    let key = roar_store::environment::blake3_hex(repo.git_dir.as_os_str().as_encoded_bytes());
    marks.join(&key[..32])
}

fn mark_text(head: &str, id: &IndexId) -> String {
    format!(
        "v1 {head} {} {} {} {}\n",
        id.size, id.mtime_ns, id.ctime_ns, id.ino
    )
}

/// Remembers that `git diff HEAD` found the tree clean at `head` with the index as it is now.
/// Best effort: a mark that cannot be written only means git is asked next time.
pub fn remember(repo: &Repo, head: &str) {
    if let Some(m) = marks() {
        remember_in(&m, repo, head);
    }
}

fn remember_in(marks: &Path, repo: &Repo, head: &str) {
    let index = repo.git_dir.join("index");
    let Ok(meta) = std::fs::symlink_metadata(&index) else {
        return;
    };
    if read_small_index(&index, meta.size()).is_none() {
        return; // never read by `known`: no mark
    }
    let path = mark_path(marks, repo);
    let text = mark_text(head, &index_id(&meta));
    if std::fs::read_to_string(&path).is_ok_and(|t| t == text) {
        return;
    }
    let Some(dir) = path.parent() else { return };
    let tmp = dir.join(format!(".{}.tmp", std::process::id()));
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, text))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Whether the tree at `head` is known clean without asking git (see the module's doc).
pub fn known(repo: &Repo, head: &str) -> bool {
    marks().is_some_and(|m| known_in(&m, repo, head))
}

fn known_in(marks: &Path, repo: &Repo, head: &str) -> bool {
    let index_path = repo.git_dir.join("index");
    let (Ok(mark), Ok(meta)) = (
        std::fs::read_to_string(mark_path(marks, repo)),
        std::fs::symlink_metadata(&index_path),
    ) else {
        return false;
    };
    let id = index_id(&meta);
    if mark != mark_text(head, &id) || sha256_repo(repo) {
        return false;
    }
    read_small_index(&index_path, id.size)
        .is_some_and(|bytes| entries_match(&bytes, &repo.root, id.mtime_ns))
}

/// The index, read whole (one open) if its header announces at most [`MAX_ENTRIES`] entries and
/// it is still `size` bytes long (it did not change since it was stat'ed): a big index costs
/// its 12-byte header.
fn read_small_index(path: &Path, size: u64) -> Option<Vec<u8>> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut bytes = vec![0u8; 12];
    f.read_exact(&mut bytes).ok()?;
    if be32(&bytes, 8)? as usize > MAX_ENTRIES {
        return None;
    }
    f.read_to_end(&mut bytes).ok()?;
    (bytes.len() as u64 == size).then_some(bytes)
}

fn sha256_repo(repo: &Repo) -> bool {
    std::fs::read_to_string(repo.common.join("config"))
        .map_or(true, |c| c.to_ascii_lowercase().contains("objectformat"))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const ENTRY_FIXED: usize = 62; // ten 32-bit stat fields, a 20-byte oid, 16-bit flags
const FLAG_EXTENDED: u16 = 0x4000;
const FLAG_STAGE: u16 = 0x3000;
const EXT_SKIP_WORKTREE: u16 = 0x4000;
const EXT_INTENT_TO_ADD: u16 = 0x2000;

/// Whether every entry of index `b` (versions 2 and 3) is a stage-0 file or symlink whose work-tree
/// copy under `root` has the stat data recorded, written before the index (`index_mtime_ns`).
fn entries_match(b: &[u8], root: &Path, index_mtime_ns: i64) -> bool {
    if b.get(..4) != Some(b"DIRC".as_slice()) {
        return false;
    }
    let (Some(version), Some(count)) = (be32(b, 4), be32(b, 8)) else {
        return false;
    };
    let count = count as usize;
    if !(2..=3).contains(&version) || count > MAX_ENTRIES {
        return false;
    }
    let mut at = 12;
    for _ in 0..count {
        let field = |i: usize| be32(b, at + 4 * i);
        let (Some(ctime_s), Some(ctime_ns), Some(mtime_s), Some(mtime_ns)) =
            (field(0), field(1), field(2), field(3))
        else {
            return false;
        };
        let (Some(ino), Some(mode), Some(size)) = (field(5), field(6), field(9)) else {
            return false;
        };
        let Some(flags) = b
            .get(at + 60..at + 62)
            .map(|f| u16::from_be_bytes([f[0], f[1]]))
        else {
            return false;
        };
        let mut name_at = at + ENTRY_FIXED;
        if flags & FLAG_EXTENDED != 0 {
            let Some(ext) = b.get(name_at..name_at + 2) else {
                return false;
            };
            let ext = u16::from_be_bytes([ext[0], ext[1]]);
            if version < 3 || ext & (EXT_SKIP_WORKTREE | EXT_INTENT_TO_ADD) != 0 {
                return false;
            }
            name_at += 2;
        }
        let Some(len) = b
            .get(name_at..)
            .and_then(|r| r.iter().position(|c| *c == 0))
        else {
            return false;
        };
        let name = &b[name_at..name_at + len];
        // Entries are padded with 1-8 NULs to a multiple of 8 bytes.
        at += (name_at - at + len + 8) & !7;
        let kind = mode & S_IFMT;
        if flags & FLAG_STAGE != 0 || (kind != S_IFREG && kind != S_IFLNK) {
            return false;
        }
        let entry_mtime = i64::from(mtime_s) * 1_000_000_000 + i64::from(mtime_ns);
        if entry_mtime >= index_mtime_ns {
            return false; // racily clean: git would read the file
        }
        let path = root.join(OsStr::from_bytes(name));
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            return false;
        };
        let same = m.mtime() == i64::from(mtime_s)
            && m.mtime_nsec() == i64::from(mtime_ns)
            && m.ctime() == i64::from(ctime_s)
            && m.ctime_nsec() == i64::from(ctime_ns)
            && m.size() as u32 == size
            && m.ino() as u32 == ino
            && m.mode() & S_IFMT == kind
            && (kind == S_IFLNK || (m.mode() & 0o100 != 0) == (mode & 0o100 != 0));
        if !same {
            return false;
        }
    }
    no_foreign_entries(b, at)
}

/// Whether the extensions after the entries (at `at`, up to the trailing 20-byte checksum) leave
/// the entries whole: a split index ("link") keeps most of them in another file, a sparse one
/// ("sdir") folds directories into single entries.
fn no_foreign_entries(b: &[u8], mut at: usize) -> bool {
    let end = b.len().saturating_sub(20);
    while at + 8 <= end {
        let sig = &b[at..at + 4];
        if sig == b"link" || sig == b"sdir" {
            return false;
        }
        let Some(len) = be32(b, at + 4) else {
            return false;
        };
        at += 8 + len as usize;
    }
    at == end
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(["-c", "user.email=t@t", "-c", "user.name=t"])
            .args(args)
            .current_dir(dir)
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A committed repository of a few files, the index written after them (not racy).
    fn repo() -> (tempfile::TempDir, Repo, String) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("w");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("a.txt"), "a\n").unwrap();
        std::fs::write(root.join("src/b.py"), "print(1)\n").unwrap();
        std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
        git(&root, &["init", "-q"]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        git(&root, &["add", "-A"]);
        git(&root, &["commit", "-qm", "c"]);
        let head = git(&root, &["rev-parse", "HEAD"]);
        let repo = Repo::find(&root).unwrap();
        (t, repo, head)
    }

    /// A repository as [`repo`] makes it, with a mark from git's verdict that it is clean.
    fn marked() -> (tempfile::TempDir, Repo, String, PathBuf) {
        let (t, repo, head) = repo();
        let marks = t.path().join("marks");
        remember_in(&marks, &repo, &head);
        (t, repo, head, marks)
    }

    #[test]
    fn a_clean_tree_is_known_only_after_git_said_so_and_until_anything_changes() {
        let (t, repo, head) = repo();
        let marks = t.path().join("marks");
        assert!(!known_in(&marks, &repo, &head), "no mark yet");
        remember_in(&marks, &repo, &head);
        assert!(known_in(&marks, &repo, &head));
        assert!(!known_in(
            &marks,
            &repo,
            "0000000000000000000000000000000000000000"
        ));

        // Same size, new content: the stat data no longer matches.
        std::fs::write(repo.root.join("a.txt"), "b\n").unwrap();
        assert!(!known_in(&marks, &repo, &head));
        std::fs::write(repo.root.join("a.txt"), "a\n").unwrap();
        // Restored bytes, but git would have to read the file: still not known.
        assert!(!known_in(&marks, &repo, &head));
    }

    #[test]
    fn deleted_files_mode_changes_and_a_rewritten_index_are_not_clean() {
        let (_t, repo, head, marks) = marked();
        let b = repo.root.join("src/b.py");
        let mut perm = std::fs::metadata(&b).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
        std::fs::set_permissions(&b, perm).unwrap();
        assert!(
            !known_in(&marks, &repo, &head),
            "an executable bit is a change"
        );

        let (_t, repo, head, marks) = marked();
        std::fs::remove_file(repo.root.join("link")).unwrap();
        assert!(
            !known_in(&marks, &repo, &head),
            "a deleted file is a change"
        );

        let (_t, repo, head, marks) = marked();
        std::fs::write(repo.root.join("new.txt"), "n").unwrap();
        git(&repo.root, &["add", "new.txt"]);
        assert!(
            !known_in(&marks, &repo, &head),
            "a staged file rewrote the index"
        );
    }

    #[test]
    fn a_big_index_is_never_marked() {
        let (t, repo, _) = repo();
        let marks = t.path().join("marks");
        for i in 0..=MAX_ENTRIES {
            std::fs::write(repo.root.join(format!("f{i}")), "").unwrap();
        }
        git(&repo.root, &["add", "-A"]);
        git(&repo.root, &["commit", "-qm", "many"]);
        let head = git(&repo.root, &["rev-parse", "HEAD"]);
        remember_in(&marks, &repo, &head);
        assert!(!mark_path(&marks, &repo).exists());
        assert!(!known_in(&marks, &repo, &head));
    }

    #[test]
    fn untracked_files_do_not_matter_as_for_git_diff() {
        let (_t, repo, head, marks) = marked();
        std::fs::write(repo.root.join("untracked.txt"), "u").unwrap();
        assert!(known_in(&marks, &repo, &head));
    }

    #[test]
    fn an_index_git_would_read_differently_is_left_to_git() {
        let (t, repo, head) = repo();
        let marks = t.path().join("marks");
        // Version 4 (prefix-compressed paths).
        git(&repo.root, &["update-index", "--index-version", "4"]);
        remember_in(&marks, &repo, &head);
        assert!(!known_in(&marks, &repo, &head));
        // A split index keeps entries in another file.
        git(&repo.root, &["update-index", "--index-version", "2"]);
        git(&repo.root, &["update-index", "--split-index"]);
        assert!(std::fs::read_dir(&repo.git_dir).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("sharedindex.")));
        remember_in(&marks, &repo, &head);
        assert!(!known_in(&marks, &repo, &head));
        git(&repo.root, &["update-index", "--no-split-index"]);
        remember_in(&marks, &repo, &head);
        assert!(known_in(&marks, &repo, &head), "back to a plain index");
        // An intent-to-add entry shows in `git diff HEAD`.
        std::fs::write(repo.root.join("later.txt"), "l").unwrap();
        git(&repo.root, &["add", "-N", "later.txt"]);
        remember_in(&marks, &repo, &head);
        assert!(!known_in(&marks, &repo, &head));
    }
}
