//! A folder as a layer of an archive union (`roar mount shards.tar extra/ DIR`): its names are
//! listed once, when mounted; its files are served from the folder itself, read-only, and a job
//! that opens one records it under its real path with the hash of what it holds now (hashed on
//! first open, again whenever the file's identity — size, times, inode — moved).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use roar_archive::{Data, Kind, Member};
use roar_store::hash::{hash_open_file, HashError, HashOptions};
use roar_store::{ContentHash, FileStat};

pub struct Folder {
    /// Canonical.
    pub root: PathBuf,
    /// Every entry below the root as it was when mounted, in the order walked.
    pub entries: Vec<Member>,
    /// What each file held when last hashed, by (device, inode).
    hashes: Mutex<HashMap<(u64, u64), (FileStat, ContentHash)>>,
}

impl Folder {
    /// Lists `root` (symbolic links are entries, never followed); devices, fifos and sockets are
    /// left out and logged.
    pub fn walk(root: &Path) -> io::Result<Folder> {
        let root = std::fs::canonicalize(root)?;
        let mut entries = Vec::new();
        let mut stack = vec![Vec::<u8>::new()];
        while let Some(rel) = stack.pop() {
            let dir = join(&root, &rel);
            let mut names: Vec<_> = std::fs::read_dir(&dir)?.collect::<io::Result<_>>()?;
            names.sort_by_key(|e| e.file_name());
            for e in names {
                let name = e.file_name();
                let path = if rel.is_empty() {
                    name.as_bytes().to_vec()
                } else {
                    [&rel[..], b"/", name.as_bytes()].concat()
                };
                let meta = e.metadata()?;
                let t = meta.file_type();
                let kind = if t.is_dir() {
                    Kind::Dir
                } else if t.is_file() {
                    Kind::File
                } else if t.is_symlink() {
                    Kind::Symlink
                } else {
                    tracing::warn!("roarfs: {} not shown: not a file", e.path().display());
                    continue;
                };
                let link = (kind == Kind::Symlink)
                    .then(|| std::fs::read_link(e.path()))
                    .transpose()?
                    .map(|t| t.as_os_str().as_bytes().to_vec());
                if kind == Kind::Dir {
                    stack.push(path.clone());
                }
                entries.push(Member {
                    path,
                    kind,
                    mode: meta.mode() & 0o7777,
                    uid: meta.uid(),
                    gid: meta.gid(),
                    mtime: meta.mtime(),
                    size: meta.size(),
                    data: Data::Raw { offset: 0 },
                    blake3: [0; 32],
                    link,
                });
            }
        }
        Ok(Folder {
            root,
            entries,
            hashes: Mutex::new(HashMap::new()),
        })
    }

    /// Where entry `m` is.
    pub fn path(&self, m: usize) -> PathBuf {
        join(&self.root, &self.entries[m].path)
    }

    /// What is at entry `m` now (its attributes as the folder has them, not as listed).
    pub fn now(&self, m: usize) -> Option<std::fs::Metadata> {
        std::fs::symlink_metadata(self.path(m)).ok()
    }

    /// Opens entry `m` for reading, never through a symbolic link put in its place.
    pub fn open(&self, m: usize) -> io::Result<File> {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.path(m))
    }

    /// The content of `file` (entry `m`, open): remembered while its identity holds.
    pub fn content(&self, m: usize, file: &File) -> Result<ContentHash, HashError> {
        let path = self.path(m);
        let io = |source| HashError::Io {
            path: path.clone(),
            source,
        };
        let stat = FileStat::from_metadata(&file.metadata().map_err(io)?);
        let key = (stat.dev, stat.ino);
        if let Some((was, hash)) = self.hashes.lock().expect("folder hashes").get(&key) {
            if *was == stat {
                return Ok(hash.clone());
            }
        }
        let hashed = hash_open_file(file, &path, HashOptions { sha256: false })?;
        self.hashes
            .lock()
            .expect("folder hashes")
            .insert(key, (hashed.stat, hashed.hash.clone()));
        Ok(hashed.hash)
    }
}

fn join(root: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        return root.to_owned();
    }
    root.join(std::ffi::OsStr::from_bytes(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_listed_once_and_hashed_again_only_when_a_file_changes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/b/x"), b"one").unwrap();
        std::fs::write(d.path().join("top"), b"").unwrap();
        std::os::unix::fs::symlink("a/b/x", d.path().join("link")).unwrap();
        let f = Folder::walk(d.path()).unwrap();
        let names: Vec<(String, Kind)> = f
            .entries
            .iter()
            .map(|e| (String::from_utf8(e.path.clone()).unwrap(), e.kind))
            .collect();
        assert_eq!(
            names,
            [
                ("a".into(), Kind::Dir),
                ("link".into(), Kind::Symlink),
                ("top".into(), Kind::File),
                ("a/b".into(), Kind::Dir),
                ("a/b/x".into(), Kind::File),
            ]
        );
        let x = names.iter().position(|(n, _)| n == "a/b/x").unwrap();
        let hash = |f: &Folder| f.content(x, &f.open(x).unwrap()).unwrap().blake3;
        assert_eq!(hash(&f), blake3::hash(b"one").to_hex().to_string());
        std::fs::write(d.path().join("a/b/x"), b"two!").unwrap();
        assert_eq!(hash(&f), blake3::hash(b"two!").to_hex().to_string());
        let link = names.iter().position(|(n, _)| n == "link").unwrap();
        assert!(f.open(link).is_err(), "a symlink is never followed");
    }
}
