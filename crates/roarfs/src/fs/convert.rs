//! Between the backing filesystem and FUSE's types: a stat as attributes, file kinds and
//! directory entry types, times, errors, and whether a file is setuid/setgid.

use super::*;

pub(super) fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

pub(super) fn ts(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH
    }
}

pub(super) fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

pub(super) fn attr(ino: u64, st: &libc::stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: ts(st.st_atime, st.st_atime_nsec),
        mtime: ts(st.st_mtime, st.st_mtime_nsec),
        ctime: ts(st.st_ctime, st.st_ctime_nsec),
        crtime: ts(st.st_ctime, st.st_ctime_nsec),
        kind: kind(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: (st.st_blksize as u32).max(BLKSIZE),
        flags: 0,
    }
}

pub(super) fn is_reg(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// A time setattr asks for, as utimensat(2) takes it: None to leave it, `Some(None)` for now.
pub(super) fn timespec_of(t: Option<TimeOrNow>) -> Option<Option<libc::timespec>> {
    t.map(|t| match t {
        TimeOrNow::Now => None,
        TimeOrNow::SpecificTime(t) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            Some(libc::timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: d.subsec_nanos() as i64,
            })
        }
    })
}

/// A regular file with a setuid or setgid bit: what a write, a truncate, a chown or an `O_TRUNC`
/// open by an unprivileged caller may have to drop. The daemon runs those operations with the
/// caller's ids ([`sys::as_caller`]), so the backing filesystem drops exactly what it would for
/// the caller (the kernel leaves it to the daemon: `FUSE_HANDLE_KILLPRIV_V2`).
pub(super) fn has_sxid(st: &libc::stat) -> bool {
    is_reg(st) && st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0
}

pub(super) fn dtype(t: u8) -> FileType {
    match t {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}
