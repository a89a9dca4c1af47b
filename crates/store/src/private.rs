//! A store is private to its owner: `.roar/` is 0700 and the database, its WAL and shared-memory
//! file are 0600. Stores made by older versions (0755 / 0644) are narrowed the first time any
//! `roar` command opens them.
//!
//! Sharing on purpose: set the setgid bit on `.roar/` (`chgrp -R team .roar && chmod 2770 .roar
//! && chmod 660 .roar/roar.db*`). roar then keeps the group's bits and only ever removes the
//! bits of others (docs/SECURITY.md).

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The bits a file of a private store may keep.
const FILE_PRIVATE: u32 = 0o600;
/// ... and of a store shared with its group.
const FILE_GROUP: u32 = 0o660;
const DIR_PRIVATE: u32 = 0o700;
const DIR_GROUP: u32 = 0o2770;

/// Creates `dir` (and its parents) with a private mode for the last component.
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(DIR_PRIVATE).create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        other => other,
    }
}

/// Creates the database file empty and private if it does not exist, so SQLite (which gives the
/// WAL and shared-memory file the database's mode) never makes a world-readable one.
pub fn create_file(path: &Path) -> std::io::Result<()> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_PRIVATE)
        .open(path)
    {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        other => other.map(drop),
    }
}

/// Removes the bits the store's files and directory may not have. Best effort: a user who
/// reads a store someone else owns cannot change it, and is not stopped from reading.
pub fn narrow(db: &Path) {
    let Some(dir) = db.parent() else { return };
    let Ok(meta) = std::fs::metadata(dir) else {
        return;
    };
    let shared = meta.permissions().mode() & 0o2000 != 0;
    let (dir_allowed, file_allowed) = if shared {
        (DIR_GROUP, FILE_GROUP)
    } else {
        (DIR_PRIVATE, FILE_PRIVATE)
    };
    restrict(dir, meta.permissions().mode(), dir_allowed);
    for suffix in ["", "-wal", "-shm"] {
        let mut path = db.as_os_str().to_owned();
        path.push(suffix);
        if let Ok(m) = std::fs::symlink_metadata(&path) {
            if m.file_type().is_file() {
                restrict(Path::new(&path), m.permissions().mode(), file_allowed);
            }
        }
    }
}

fn restrict(path: &Path, mode: u32, allowed: u32) {
    let mode = mode & 0o7777;
    if mode & !allowed != 0 {
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & allowed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn an_old_wide_store_is_narrowed_and_a_shared_one_keeps_its_group() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join(".roar");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let db = dir.join("roar.db");
        for f in ["roar.db", "roar.db-wal", "roar.db-shm"] {
            std::fs::write(dir.join(f), "").unwrap();
            std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        narrow(&db);
        assert_eq!(mode(&dir), 0o700);
        for f in ["roar.db", "roar.db-wal", "roar.db-shm"] {
            assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o2775)).unwrap();
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o664)).unwrap();
        narrow(&db);
        assert_eq!(mode(&dir), 0o2770);
        assert_eq!(mode(&db), 0o660);
    }

    #[test]
    fn created_private() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("a/.roar");
        create_dir(&dir).unwrap();
        create_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        create_file(&dir.join("roar.db")).unwrap();
        assert_eq!(mode(&dir.join("roar.db")), 0o600);
    }
}
