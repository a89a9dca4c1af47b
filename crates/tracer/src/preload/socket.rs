//! The run's abstract datagram socket, for processes that cannot map the ring: bound with a
//! random key each datagram must end with, and taken only from senders the kernel places in the
//! run ([`Senders`]: their credentials, then their ancestry).

use super::*;

pub(super) const RECV_BUF: usize = 256 * 1024;
pub(super) const SOCK_BUF: libc::c_int = 32 << 20;

pub(super) struct Socket {
    pub(super) fd: libc::c_int,
    pub(super) name: String,
    pub(super) key: [u8; KEY_LEN],
}

impl Socket {
    /// The `SOCK_ENV` value the shim gets: the name and the key.
    pub(super) fn env_value(&self) -> String {
        let hex: String = self.key.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}:{hex}", self.name)
    }
}

/// A fresh key from the kernel's random source.
pub(super) fn random_key() -> std::io::Result<[u8; KEY_LEN]> {
    let mut key = [0u8; KEY_LEN];
    // SAFETY: getrandom writes at most key.len() bytes into our buffer.
    let n = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
    if n != KEY_LEN as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(key)
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: closing the fd we own.
        unsafe { libc::close(self.fd) };
    }
}

pub(super) fn abstract_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain old data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in name.bytes().enumerate().take(100) {
        addr.sun_path[i + 1] = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len().min(100);
    (addr, len as libc::socklen_t)
}

pub(super) fn bind() -> Result<Socket, TraceError> {
    let err = |source| TraceError::Socket { source };
    let name = format!("roar-{}-{:x}", std::process::id(), now_ns());
    let key = random_key().map_err(err)?;
    // SAFETY: plain socket calls on values we own.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        let sock = Socket { fd, name, key };
        // Every datagram comes with its sender's pid and uid, as the kernel knows them.
        let on: libc::c_int = 1;
        let sz = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let p = std::ptr::addr_of!(on).cast();
        if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_PASSCRED, p, sz) != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        let (addr, len) = abstract_addr(&sock.name);
        if libc::bind(fd, std::ptr::addr_of!(addr).cast(), len) != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        // A deep queue keeps bursts from blocking the traced program; FORCE needs CAP_NET_ADMIN.
        let size = SOCK_BUF;
        let p = std::ptr::addr_of!(size).cast();
        let sz = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, p, sz) != 0 {
            libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, p, sz);
        }
        Ok(sock)
    }
}

/// Who may add events to this run through the socket, by what the kernel says of the sender
/// (`SCM_CREDENTIALS`, which a process cannot choose): a process of roar's own user — who could
/// as well ptrace the run or open its ring, so no boundary is crossed — or a process of the run:
/// one the run's trusted reports named (every event from the ring, which only roar's user can
/// write, and the events of senders already placed: a `setpriv --reuid` child was forked, and
/// reported, before it changed user; a placed process's shim vouches for each child it starts,
/// `Kind::Spawned`), or one whose live ancestry reaches roar (roar is its children's subreaper).
/// A datagram from a sender not placed yet is held and looked at again after the next reports;
/// what is still unplaced at the end is refused.
pub(crate) struct Senders {
    pub(super) uid: u32,
    pub(super) roar: i32,
    /// Processes of the run, by pid.
    pub(super) members: std::collections::HashSet<i32>,
}

impl Senders {
    pub(crate) fn new() -> Senders {
        Senders {
            // SAFETY: getuid cannot fail.
            uid: unsafe { libc::getuid() },
            roar: std::process::id() as i32,
            members: Default::default(),
        }
    }

    /// A trusted report (the ring, or a sender already placed) names `ev`'s process, and a
    /// forked child with it.
    pub(crate) fn note(&mut self, ev: &Event) {
        self.members.insert(ev.pid());
        if let Event::Fork { pid, .. } = ev {
            self.members.insert(*pid);
        }
    }

    /// A process of the run started `child` (its own datagram said so).
    pub(crate) fn vouched(&mut self, child: i32) {
        self.members.insert(child);
    }

    /// Whether a datagram from `pid`, running as `uid`, is the run's now.
    pub(crate) fn admit(&mut self, pid: i32, uid: u32) -> bool {
        if uid == self.uid || self.members.contains(&pid) || self.descends_from_roar(pid) {
            self.members.insert(pid);
            return true;
        }
        false
    }

    /// Whether `pid` is alive and its chain of parents reaches roar or a process of the run.
    pub(super) fn descends_from_roar(&self, pid: i32) -> bool {
        let ppid = |pid: i32| {
            procfs::process::Process::new(pid)
                .and_then(|p| p.stat())
                .ok()
                .map(|s| s.ppid)
        };
        let mut at = pid;
        // A chain of parents ends at pid 1 (or 0 past it); the bound only guards a loop.
        for _ in 0..4096 {
            match ppid(at) {
                Some(parent) if parent == self.roar || self.members.contains(&parent) => {
                    return true
                }
                Some(parent) if parent > 1 => at = parent,
                _ => return false,
            }
        }
        false
    }
}

/// Datagrams from senders not placed yet that are kept waiting; older ones beyond are refused
/// (a flood from outside the run cannot grow roar without bound).
pub(super) const MAX_HELD: usize = 65_536;

/// One datagram from the socket into `buf`, with the sender's pid and uid; `Ok(None)` when the
/// queue is empty.
pub(super) fn recv_datagram(
    fd: libc::c_int,
    buf: &mut [u8],
) -> std::io::Result<Option<(usize, i32, u32)>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixCredentials};
    let mut cmsg = nix::cmsg_space!(UnixCredentials);
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let msg = loop {
        match recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::MSG_DONTWAIT) {
            Ok(m) => break m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    };
    let mut sender = None;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmCredentials(c) = c {
            sender = Some((c.pid(), c.uid()));
        }
    }
    // Without credentials (which SO_PASSCRED always adds) no sender can be placed.
    let (pid, uid) = sender.unwrap_or((0, u32::MAX));
    Ok(Some((msg.bytes, pid, uid)))
}
