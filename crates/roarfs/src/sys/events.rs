//! The kernel's process events (the netlink proc connector): forks, execs and exits.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::check;

/// The kernel's process events (the netlink proc connector), read for thread exits (what lets
/// the mount keep a thread's job cached without re-reading /proc on every request), execs (what
/// cuts a job into steps) and forks (which process made which, when its parent is gone). Needs
/// CAP_NET_ADMIN.
pub struct ExitEvents {
    sock: OwnedFd,
    /// Written by a [`Poke`] to wake a reader blocked in [`ExitEvents::block`].
    woken: OwnedFd,
}

/// Wakes the reader of [`ExitEvents`] (so that it reads what is queued and says so).
pub struct Poke(OwnedFd);

impl Poke {
    pub fn poke(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write from a live buffer to an eventfd we own. A full counter
        // (EAGAIN) already wakes the reader.
        unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }
}

/// A thread's exit as the kernel reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub tid: i32,
    /// When it exited: CLOCK_MONOTONIC, ns.
    pub at_ns: u64,
}

/// A process's fork as the kernel reported it (threads are not forks here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fork {
    /// The process (thread group) that forked.
    pub parent: i32,
    pub child: i32,
    /// When: CLOCK_MONOTONIC, ns.
    pub at_ns: u64,
}

/// What [`ExitEvents::wait`] saw.
pub enum Exits {
    /// These processes were forked, these threads exited, and these processes (by pid) exec'd a
    /// new program (with when, CLOCK_MONOTONIC ns). Reported late when the reader lags (a
    /// machine busy with other processes): an exited thread's id may already belong to a new
    /// thread, which started after `at_ns`.
    Seen {
        forks: Vec<Fork>,
        exits: Vec<Exit>,
        execs: Vec<(i32, u64)>,
    },
    /// Events were lost (the socket's buffer overflowed): any cached thread may have exited.
    Lost,
    /// Nothing is queued: every event the kernel sent before this call was read.
    Drained,
}

const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_FORK: u32 = 0x0000_0001;
const PROC_EVENT_EXEC: u32 = 0x0000_0002;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// The socket's receive buffer: ~30,000 events waiting before any is lost.
const EVENTS_BUFFER: libc::c_int = 32 << 20;
/// sizeof(struct nlmsghdr) and sizeof(struct cn_msg).
const NLMSG_HDR: usize = 16;
const CN_MSG: usize = 20;

impl ExitEvents {
    pub fn open() -> io::Result<ExitEvents> {
        // SAFETY: plain socket/setsockopt/bind/send on a socket we own; the buffers are live
        // locals.
        unsafe {
            let fd = check(libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_CONNECTOR,
            ))?;
            let sock = OwnedFd::from_raw_fd(fd);
            // The kernel sends every process's fork, exec and exit, each event its own buffer
            // of ~1 KiB counted against the socket: the default 208 KiB holds ~200 of them, a
            // few milliseconds of a busy machine's forks while the reader waits for a CPU, and
            // events lost forget who forked whom (a daemon's double fork then left its job).
            // Forced past rmem_max (this needs CAP_NET_ADMIN, as listening does); memory is
            // taken only by events waiting.
            let want: libc::c_int = EVENTS_BUFFER;
            for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
                let set = libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    (&want as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as u32,
                );
                if set == 0 {
                    break;
                }
            }
            let mut addr: libc::sockaddr_nl = std::mem::zeroed();
            addr.nl_family = libc::AF_NETLINK as u16;
            addr.nl_groups = CN_IDX_PROC;
            check(libc::bind(
                fd,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            ))?;
            // nlmsghdr + cn_msg + the listen operation.
            let mut msg = [0u8; NLMSG_HDR + CN_MSG + 4];
            let len = msg.len() as u32;
            msg[0..4].copy_from_slice(&len.to_ne_bytes());
            msg[4..6].copy_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
            msg[12..16].copy_from_slice(&std::process::id().to_ne_bytes());
            msg[16..20].copy_from_slice(&CN_IDX_PROC.to_ne_bytes());
            msg[20..24].copy_from_slice(&CN_VAL_PROC.to_ne_bytes());
            msg[32..34].copy_from_slice(&4u16.to_ne_bytes());
            msg[36..40].copy_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
            let sent = libc::send(fd, msg.as_ptr().cast(), msg.len(), 0);
            if sent < 0 {
                return Err(io::Error::last_os_error());
            }
            let woken = OwnedFd::from_raw_fd(check(libc::eventfd(
                0,
                libc::EFD_CLOEXEC | libc::EFD_NONBLOCK,
            ))?);
            Ok(ExitEvents { sock, woken })
        }
    }

    /// What wakes this reader from [`ExitEvents::block`].
    pub fn poke(&self) -> io::Result<Poke> {
        Ok(Poke(self.woken.try_clone()?))
    }

    /// Blocks until events arrive; returns the forks, exits and execs among them.
    pub fn wait(&self, buf: &mut [u8]) -> io::Result<Exits> {
        loop {
            match self.next(buf)? {
                Exits::Drained => self.block()?,
                seen => return Ok(seen),
            }
        }
    }

    /// Blocks until events are queued or a [`Poke`] wakes the reader.
    pub fn block(&self) -> io::Result<()> {
        let mut fds = [
            libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.woken.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll over a live array of two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::Interrupted => Ok(()),
                _ => Err(e),
            };
        }
        if fds[1].revents & libc::POLLIN != 0 {
            let mut count = [0u8; 8];
            // SAFETY: an 8-byte read into a live buffer from an eventfd we own (it resets it).
            unsafe { libc::read(self.woken.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        }
        Ok(())
    }

    /// The events queued now, without blocking: [`Exits::Drained`] when there are none.
    pub fn next(&self, buf: &mut [u8]) -> io::Result<Exits> {
        // SAFETY: sockaddr_nl is plain old data.
        let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        let mut from_len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        // SAFETY: recvfrom into a live, writable buffer of its length and a sockaddr_nl.
        let n = unsafe {
            libc::recvfrom(
                self.sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
                (&mut from as *mut libc::sockaddr_nl).cast(),
                &mut from_len,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOBUFS) => Ok(Exits::Lost),
                Some(libc::EAGAIN) => Ok(Exits::Drained),
                // Not drained: nothing was read (the caller reads again).
                Some(libc::EINTR) => Ok(Exits::Seen {
                    forks: Vec::new(),
                    exits: Vec::new(),
                    execs: Vec::new(),
                }),
                _ => Err(e),
            };
        }
        if from.nl_pid != 0 {
            // Only the kernel speaks for the proc connector; anything else is dropped unread.
            return Ok(Exits::Seen {
                forks: Vec::new(),
                exits: Vec::new(),
                execs: Vec::new(),
            });
        }
        let mut forks = Vec::new();
        let mut exits = Vec::new();
        let mut execs = Vec::new();
        let mut rest = &buf[..n as usize];
        // Netlink messages, each: nlmsghdr (len first), cn_msg, proc_event {what, cpu,
        // timestamp_ns (u64), then the event's own fields}.
        while rest.len() >= NLMSG_HDR {
            let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
            if len < NLMSG_HDR || len > rest.len() {
                break;
            }
            let ev = &rest[NLMSG_HDR + CN_MSG..len.max(NLMSG_HDR + CN_MSG)];
            let word = |at: usize| {
                ev.get(at..at + 4)
                    .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
            };
            let at_ns = ev
                .get(8..16)
                .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")));
            // exit: {pid, tgid, ...}; exec: {pid, tgid}; fork: {parent pid, parent tgid, child
            // pid, child tgid}, a thread when the child's pid is not its tgid.
            match (word(0), word(16), word(20), at_ns) {
                (Some(PROC_EVENT_EXIT), Some(tid), _, Some(at_ns)) => exits.push(Exit {
                    tid: tid as i32,
                    at_ns,
                }),
                (Some(PROC_EVENT_EXEC), _, Some(tgid), Some(at_ns)) => {
                    execs.push((tgid as i32, at_ns))
                }
                (Some(PROC_EVENT_FORK), _, Some(parent), Some(at_ns)) => {
                    if let (Some(child), Some(child_tgid)) = (word(24), word(28)) {
                        if child == child_tgid {
                            forks.push(Fork {
                                parent: parent as i32,
                                child: child as i32,
                                at_ns,
                            });
                        }
                    }
                }
                _ => {}
            }
            rest = &rest[((len + 3) & !3).min(rest.len())..];
        }
        Ok(Exits::Seen {
            forks,
            exits,
            execs,
        })
    }
}
