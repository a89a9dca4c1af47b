//! Versions kept: the project's content-addressed object store, `.roar/s3/blobs/XY/<blake3>` —
//! the directory the embedded S3 store keeps its object bodies in, so a file version and an S3
//! object with the same bytes are one blob (docs/SEMANTICS.md, "Versions kept").
//!
//! A blob is named by the blake3 of the bytes written into it, computed on those very bytes as
//! they are copied (or, for a copy-on-write clone, on the source read while nothing changed it):
//! a name is never taken from anything but what was kept. A blob is made in `tmp/` and renamed
//! into place whole; it is never written in place. Blobs are not synced one by one (that would
//! cost every output an fsync): a power loss can leave one damaged, and every use checks a
//! blob's bytes against its name before it is trusted ([`Objects::copy_out`]).
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The object store of a project (`Project::objects_dir`).
#[derive(Debug, Clone)]
pub struct Objects {
    blobs: PathBuf,
    tmp: PathBuf,
    /// Versions bigger than this are not kept (0: any size).
    max_bytes: u64,
}

/// The path of blob `blake3` under `blobs`: one fan-out directory per first two hex digits. The
/// one layout rule, shared with the embedded S3 store.
pub fn blob_path(blobs: &Path, blake3: &str) -> PathBuf {
    let fan = blake3.get(..2).unwrap_or("00");
    blobs.join(fan).join(blake3)
}

/// A hex blake3 digest (a name a blob may have).
fn valid_name(blake3: &str) -> bool {
    blake3.len() == 64 && blake3.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Objects {
    /// The store rooted at `root` (`.roar/s3`). Nothing is made until something is kept.
    pub fn at(root: &Path) -> Objects {
        Objects {
            blobs: root.join("blobs"),
            tmp: root.join("tmp"),
            max_bytes: 0,
        }
    }

    /// This store, keeping no version bigger than `max_bytes` (0: any size).
    pub fn with_max(mut self, max_bytes: u64) -> Objects {
        self.max_bytes = max_bytes;
        self
    }

    /// Whether a version of `size` bytes is kept at all.
    pub fn fits(&self, size: u64) -> bool {
        self.max_bytes == 0 || size <= self.max_bytes
    }

    pub fn path(&self, blake3: &str) -> PathBuf {
        blob_path(&self.blobs, blake3)
    }

    /// Whether a blob of this content is kept (not checked: see [`Objects::copy_out`]).
    pub fn has(&self, blake3: &str) -> bool {
        valid_name(blake3) && self.path(blake3).is_file()
    }

    /// Starts keeping a copy: the hasher fills it ([`Taking::clone_from`], [`Taking::write`])
    /// while it reads the source, and names it by the hash ([`Taking::commit`]).
    pub fn begin(&self) -> io::Result<Taking> {
        let make = || {
            tempfile::Builder::new()
                .prefix("keep-")
                .tempfile_in(&self.tmp)
        };
        // The directory is made only when missing: one system call less per version kept.
        let file = match make() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(&self.tmp)?;
                make()?
            }
            other => other?,
        };
        Ok(Taking {
            file,
            cloned: false,
            failed: false,
        })
    }

    /// Writes blob `want` to `dest` (a new file made beside it, then renamed over it), checking
    /// its bytes against the name as they are copied: a damaged blob is an error and `dest` is
    /// left as it was.
    pub fn copy_out(&self, want: &str, dest: &Path) -> io::Result<()> {
        copy_verified(&self.path(want), want, dest).map_err(|e| match e.kind() {
            io::ErrorKind::InvalidData => io::Error::new(
                e.kind(),
                format!("kept object {want} is damaged ({e}); it was not used"),
            ),
            _ => e,
        })?;
        // Used: the newest use is what a size budget keeps longest.
        let _ =
            File::open(self.path(want)).and_then(|f| f.set_modified(std::time::SystemTime::now()));
        Ok(())
    }

    /// The kept blobs whose name starts with `prefix` (at least two hex digits), at most 11.
    pub fn find_prefix(&self, prefix: &str) -> Vec<String> {
        let prefix = prefix.to_ascii_lowercase();
        let Some(fan) = prefix.get(..2) else {
            return Vec::new();
        };
        let mut found: Vec<String> = std::fs::read_dir(self.blobs.join(fan))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| valid_name(n) && n.starts_with(&prefix))
            .take(11)
            .collect();
        found.sort();
        found
    }

    /// Keeps blob `blake3` whatever the record says (a version `roar checkout` kept before it
    /// replaced it, which no job recorded): listed in `pinned`, which `roar gc` honours.
    pub fn pin(&self, blake3: &str) -> io::Result<()> {
        let root = self.blobs.parent().unwrap_or(Path::new("."));
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("pinned"))?;
        writeln!(f, "{blake3}")
    }

    /// The blobs kept whatever the record says ([`Objects::pin`]).
    pub fn pinned(&self) -> std::collections::HashSet<String> {
        let root = self.blobs.parent().unwrap_or(Path::new("."));
        std::fs::read_to_string(root.join("pinned"))
            .unwrap_or_default()
            .lines()
            .filter(|l| valid_name(l))
            .map(str::to_owned)
            .collect()
    }

    /// Pins job `id` (`roar pin`): a size budget never lets go of a version it read or wrote.
    /// `keep` false: unpins it.
    pub fn pin_job(&self, id: i64, keep: bool) -> io::Result<()> {
        let root = self.blobs.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(root)?;
        let mut jobs = self.pinned_jobs();
        if keep {
            jobs.insert(id);
        } else {
            jobs.remove(&id);
        }
        let text: String = jobs.iter().map(|j| format!("{j}\n")).collect();
        let tmp = root.join("pinned-jobs.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(tmp, root.join("pinned-jobs"))
    }

    /// The pinned jobs ([`Objects::pin_job`]).
    pub fn pinned_jobs(&self) -> std::collections::BTreeSet<i64> {
        let root = self.blobs.parent().unwrap_or(Path::new("."));
        std::fs::read_to_string(root.join("pinned-jobs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// The name of every kept blob.
    pub fn all(&self) -> Vec<String> {
        let mut out = Vec::new();
        for fan in std::fs::read_dir(&self.blobs)
            .into_iter()
            .flatten()
            .flatten()
        {
            for blob in std::fs::read_dir(fan.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if let Ok(name) = blob.file_name().into_string() {
                    if valid_name(&name) {
                        out.push(name);
                    }
                }
            }
        }
        out
    }
}

/// Copies `src` to `dest` (a new file made beside it, then renamed over it), checking the bytes
/// against the blake3 `want` as they are copied: bytes that differ are an error
/// (`InvalidData`) and `dest` is left as it was.
pub fn copy_verified(src: &Path, want: &str, dest: &Path) -> io::Result<()> {
    let mut src = File::open(src)?;
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut out = tempfile::Builder::new()
        .prefix(".roar-checkout-")
        .tempfile_in(dir)?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
    }
    let got = hasher.finalize().to_hex();
    if got.as_str() != want {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("its bytes hash to {got}, not {want}"),
        ));
    }
    out.persist(dest).map_err(|e| e.error)?;
    Ok(())
}

/// A copy being kept: filled while its source is hashed, then named by that hash.
pub struct Taking {
    file: tempfile::NamedTempFile,
    /// A copy-on-write clone of the source: nothing to write.
    cloned: bool,
    failed: bool,
}

impl Taking {
    /// `src` is about to be read from its start, its identity just taken: where the filesystem
    /// can, the copy becomes a copy-on-write clone of it (no byte written; the hasher's check
    /// that `src` did not change while it was read covers the clone too).
    pub fn clone_from(&mut self, src: &File) {
        // SAFETY: FICLONE between two descriptors we own; it fails harmlessly where unsupported.
        self.cloned = unsafe {
            libc::ioctl(
                self.file.as_file().as_raw_fd(),
                libc::FICLONE,
                src.as_raw_fd(),
            )
        } == 0;
    }

    /// Copies the first `len` bytes of `src` in the kernel (`copy_file_range`: no byte through
    /// this process), for a source whose hash is known already from the bytes written into it
    /// (the mount's write stream): the caller checks the source did not change around the copy
    /// before it names the copy by that hash. Between two filesystems (a mount over a data
    /// volume, the store on the project's disk: the kernel refuses with EXDEV unless both are
    /// of one type that can copy), or where the kernel cannot copy between them, the bytes go
    /// through this process.
    pub fn copy_from(&mut self, src: &File, len: u64) -> io::Result<()> {
        let mut off_in: libc::loff_t = 0;
        let mut off_out: libc::loff_t = 0;
        while (off_in as u64) < len {
            let want = (len - off_in as u64).min(1 << 30) as usize;
            // SAFETY: two descriptors we own and offsets on our stack.
            let n = unsafe {
                libc::copy_file_range(
                    src.as_raw_fd(),
                    &mut off_in,
                    self.file.as_file().as_raw_fd(),
                    &mut off_out,
                    want,
                    0,
                )
            };
            match n {
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the file shrank",
                    ))
                }
                n if n < 0 => {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EINTR) => {}
                        Some(libc::EXDEV | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS) => {
                            return self.copy_through(src, off_in as u64, len);
                        }
                        _ => {
                            self.failed = true;
                            return Err(e);
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Bytes `from..len` of `src` read and written here, to the same offsets.
    fn copy_through(&mut self, src: &File, from: u64, len: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; (len - from).min(1 << 20) as usize];
        let mut at = from;
        while at < len {
            let want = ((len - at) as usize).min(buf.len());
            let n = match src.read_at(&mut buf[..want], at) {
                Ok(0) => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file shrank",
                )),
                Ok(n) => self.file.as_file().write_all_at(&buf[..n], at).map(|()| n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
                Err(e) => Err(e),
            };
            match n {
                Ok(n) => at += n as u64,
                Err(e) => {
                    self.failed = true;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The next bytes of the source, as the hasher reads them. A write that fails (a full disk)
    /// makes this copy not kept; hashing goes on.
    pub fn write(&mut self, bytes: &[u8]) {
        if !self.cloned && !self.failed && self.file.write_all(bytes).is_err() {
            self.failed = true;
        }
    }

    /// The source hashed to `blake3` and did not change while it was read: the copy becomes
    /// blob `blake3`.
    pub fn commit(self, objects: &Objects, blake3: &str) -> io::Result<()> {
        if self.failed {
            return Err(io::Error::other("the copy could not be written"));
        }
        if !valid_name(blake3) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a blake3 digest",
            ));
        }
        // Renamed over a blob of the same name if there is one: the same bytes, now last used.
        // The fan-out directory is made only when the rename says it is missing.
        let dest = objects.path(blake3);
        match self.file.persist(&dest) {
            Ok(_) => Ok(()),
            Err(e) if e.error.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dest.parent().expect("a fan-out directory"))?;
                e.file.persist(&dest).map(drop).map_err(|e| e.error)
            }
            Err(e) => Err(e.error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source on another filesystem than the store (a mount over a data volume): the kernel
    /// will not copy between them (EXDEV) and the bytes go through this process, all of them.
    #[test]
    fn a_copy_from_another_filesystem_is_kept_whole() {
        let shm = Path::new("/dev/shm");
        let store = tempfile::tempdir().unwrap();
        let dev = |p: &Path| std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(p).unwrap());
        if !shm.is_dir() || dev(shm) == dev(store.path()) {
            assert!(
                std::env::var("CI").is_err(),
                "no tmpfs at /dev/shm on another filesystem than {}",
                store.path().display()
            );
            eprintln!("skipped: /dev/shm is not another filesystem here");
            return;
        }
        let bytes: Vec<u8> = (0..3 << 20).map(|i: u32| (i * 7 % 251) as u8).collect();
        let src = tempfile::NamedTempFile::new_in(shm).unwrap();
        std::fs::write(src.path(), &bytes).unwrap();
        let objects = Objects::at(store.path());
        let hash = blake3::hash(&bytes).to_hex().to_string();
        let mut taking = objects.begin().unwrap();
        taking.copy_from(src.as_file(), bytes.len() as u64).unwrap();
        taking.commit(&objects, &hash).unwrap();
        assert!(objects.has(&hash));
        assert!(std::fs::read(objects.path(&hash)).unwrap() == bytes);
        // A source shorter than said is an error, and nothing is kept.
        let mut taking = objects.begin().unwrap();
        let e = taking
            .copy_from(src.as_file(), bytes.len() as u64 + 1)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(taking.commit(&objects, &"0".repeat(64)).is_err());
    }
}
