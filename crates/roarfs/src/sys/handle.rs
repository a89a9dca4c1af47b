//! Kernel file handles (`name_to_handle_at`, `open_by_handle_at`): how the daemon names a
//! backing file without holding a descriptor for it.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::check;

/// A kernel file handle (`name_to_handle_at`): names a backing inode without holding it open,
/// so the daemon needs no descriptor per inode it knows. The bytes are opaque and, for one file,
/// always the same (they carry the inode number and its generation, so a reused inode number
/// gives a different handle).
#[derive(Clone, PartialEq, Eq)]
pub struct FileHandle {
    kind: i32,
    bytes: Box<[u8]>,
}

/// `MAX_HANDLE_SZ` in the kernel.
const MAX_HANDLE_SZ: usize = 128;

#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

impl FileHandle {
    /// The handle of the file `fd` refers to (an `O_PATH` fd is enough), and its mount id.
    pub fn of(fd: BorrowedFd<'_>) -> io::Result<(FileHandle, i32)> {
        let mut raw = RawHandle {
            handle_bytes: MAX_HANDLE_SZ as u32,
            handle_type: 0,
            f_handle: [0; MAX_HANDLE_SZ],
        };
        let mut mount_id: libc::c_int = 0;
        // SAFETY: `raw` is a file_handle header followed by MAX_HANDLE_SZ writable bytes, as
        // handle_bytes says; the empty path with AT_EMPTY_PATH names the fd itself.
        check(unsafe {
            libc::name_to_handle_at(
                fd.as_raw_fd(),
                c"".as_ptr(),
                (&mut raw as *mut RawHandle).cast(),
                &mut mount_id,
                libc::AT_EMPTY_PATH,
            )
        })?;
        let n = (raw.handle_bytes as usize).min(MAX_HANDLE_SZ);
        Ok((
            FileHandle {
                kind: raw.handle_type,
                bytes: raw.f_handle[..n].into(),
            },
            mount_id,
        ))
    }

    /// Opens the file as an `O_PATH` fd; `mount_fd` is any non-`O_PATH` fd on its filesystem.
    /// Needs CAP_DAC_READ_SEARCH.
    pub fn open(&self, mount_fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
        self.open_with(mount_fd, libc::O_PATH)
    }

    /// Opens the file with real access `flags` (O_CREAT/O_EXCL dropped), as [`reopen`] does
    /// for an `O_PATH` fd, in one call.
    pub fn open_file(&self, mount_fd: BorrowedFd<'_>, flags: i32) -> io::Result<File> {
        let flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW);
        self.open_with(mount_fd, flags).map(File::from)
    }

    fn open_with(&self, mount_fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
        let mut raw = RawHandle {
            handle_bytes: self.bytes.len() as u32,
            handle_type: self.kind,
            f_handle: [0; MAX_HANDLE_SZ],
        };
        raw.f_handle[..self.bytes.len()].copy_from_slice(&self.bytes);
        // SAFETY: `raw` is a valid file_handle of handle_bytes bytes; the fd is new and ours.
        let fd = check(unsafe {
            libc::open_by_handle_at(
                mount_fd.as_raw_fd(),
                (&mut raw as *mut RawHandle).cast(),
                flags | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: just returned by open_by_handle_at, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Heap bytes this handle holds (for the stated per-inode memory).
    pub fn heap_size(&self) -> usize {
        self.bytes.len()
    }
}
