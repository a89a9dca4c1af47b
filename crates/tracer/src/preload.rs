//! The preload backend: runs the command with the shim in LD_PRELOAD and receives its datagrams
//! on an abstract unix socket owned by this run.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use roar_store::{now_ns, FileStat};
use roar_wire::{Header, Kind, WireStat, HEADER_LEN, LIB_ENV, SOCK_ENV};

use crate::event::{join_normalize, Event};
use crate::launch;
use crate::{TraceError, Traced};

/// Kind value of the end-of-run marker roar sends itself; never sent by the shim.
const END_MARKER: u16 = 0;
const RECV_BUF: usize = 256 * 1024;
const SOCK_BUF: libc::c_int = 32 << 20;

struct Socket {
    fd: libc::c_int,
    name: String,
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: closing the fd we own.
        unsafe { libc::close(self.fd) };
    }
}

fn abstract_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain old data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in name.bytes().enumerate().take(100) {
        addr.sun_path[i + 1] = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len().min(100);
    (addr, len as libc::socklen_t)
}

fn bind() -> Result<Socket, TraceError> {
    let err = |source| TraceError::Socket { source };
    let name = format!("roar-{}-{:x}", std::process::id(), now_ns());
    // SAFETY: plain socket calls on values we own.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        let sock = Socket { fd, name };
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

fn send_end_marker(name: &str) {
    let h = Header {
        kind: END_MARKER,
        ..Header::default()
    };
    // SAFETY: a short-lived socket of ours sends one datagram to our own name.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        let (addr, len) = abstract_addr(name);
        libc::sendto(
            fd,
            h.as_bytes().as_ptr().cast(),
            HEADER_LEN,
            0,
            std::ptr::addr_of!(addr).cast(),
            len,
        );
        libc::close(fd);
    }
}

/// What the receiver thread hands back at the end of the run.
#[derive(Default)]
struct Received {
    events: Vec<Event>,
    malformed: usize,
}

/// Receives until the end marker.
fn receive(fd: libc::c_int) -> Received {
    let mut buf = vec![0u8; RECV_BUF];
    let mut events = Vec::new();
    let mut malformed = 0;
    loop {
        // SAFETY: buf is writable for its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            malformed += 1;
            break;
        }
        match Header::parse(&buf[..n as usize]) {
            Some((h, _)) if h.kind == END_MARKER => break,
            Some((h, parts)) => match decode(&h, parts) {
                Some(ev) => events.push(ev),
                None => malformed += 1,
            },
            None => malformed += 1,
        }
    }
    Received { events, malformed }
}

fn stat_of(s: &WireStat) -> FileStat {
    FileStat {
        dev: s.dev,
        ino: s.ino,
        size: s.size,
        mtime_ns: s.mtime_ns,
        ctime_ns: s.ctime_ns,
    }
}

fn decode(h: &Header, p: [&[u8]; 4]) -> Option<Event> {
    let (pid, ts_ns) = (h.pid, h.ts_ns);
    let path = || join_normalize(p[0], p[1]);
    let path2 = || join_normalize(p[2], p[3]);
    Some(match Kind::from_u16(h.kind)? {
        Kind::Exec => Event::Exec {
            pid,
            ppid: h.arg as i32,
            cwd: PathBuf::from(OsString::from_vec(p[0].to_vec())),
            exe: PathBuf::from(OsString::from_vec(p[1].to_vec())),
            argv: roar_store::argv_from_blob(p[2]),
            ts_ns,
        },
        Kind::Fork => Event::Fork {
            pid,
            ppid: h.arg as i32,
            ts_ns,
        },
        Kind::Exit => Event::Exit { pid, ts_ns },
        Kind::Open => Event::Open {
            pid,
            path: path(),
            flags: h.arg as i32,
            stat: Some(stat_of(&h.stat)),
            ts_ns,
        },
        Kind::Rename => Event::Rename {
            pid,
            from: path(),
            to: path2(),
            ts_ns,
        },
        Kind::Link => Event::Link {
            pid,
            from: path(),
            to: path2(),
            ts_ns,
        },
        Kind::Unlink => Event::Unlink {
            pid,
            path: path(),
            ts_ns,
        },
        Kind::Truncate => Event::Truncate {
            pid,
            path: path(),
            ts_ns,
        },
        Kind::Mkdir => Event::Mkdir {
            pid,
            path: path(),
            ts_ns,
        },
        Kind::Rmdir => Event::Rmdir {
            pid,
            path: path(),
            ts_ns,
        },
    })
}

pub fn run(argv: &[OsString], env: &crate::EnvChanges, lib: &Path) -> Result<Traced, TraceError> {
    let sock = bind()?;
    let fd = sock.fd;
    let receiver: JoinHandle<Received> = std::thread::Builder::new()
        .name("roar-preload-recv".into())
        .spawn(move || receive(fd))
        .map_err(|source| TraceError::Socket { source })?;

    let guard = launch::SignalGuard::install();
    launch::become_subreaper();
    let mut cmd = launch::command(argv, env, launch::original_dispositions(&guard));
    let mut preload = lib.as_os_str().to_owned();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    cmd.env("LD_PRELOAD", preload)
        .env(SOCK_ENV, &sock.name)
        .env(LIB_ENV, lib);
    let started_ns = now_ns();
    let spawned = cmd.spawn();
    let status = match spawned {
        Ok(child) => {
            let pid = child.id() as i32;
            guard.set_child(pid);
            let status = launch::wait_for(pid).map_err(|source| TraceError::Wait { source });
            // std's Child must not wait again: it never learns the pid was reaped, which is fine.
            drop(child);
            launch::reap_orphans();
            status
        }
        Err(e) => Err(launch::spawn_error(&argv[0], e)),
    };
    let ended_ns = now_ns();
    drop(guard);
    send_end_marker(&sock.name);
    let received = receiver.join().unwrap_or_default();
    let status = status?;
    Ok(Traced {
        events: received.events,
        status,
        started_ns,
        ended_ns,
        malformed: received.malformed,
        lost: 0,
    })
}

/// Decoding is exercised on real datagrams by the integration tests; this pins the join of base
/// and path for the kinds that carry two paths.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_rename() {
        let h = Header {
            kind: Kind::Rename as u16,
            pid: 9,
            ..Header::default()
        };
        let ev = decode(&h, [b"/w", b"tmp", b"/w/sub", b"../out"]).unwrap();
        assert_eq!(
            ev,
            Event::Rename {
                pid: 9,
                from: PathBuf::from("/w/tmp"),
                to: PathBuf::from("/w/out"),
                ts_ns: 0
            }
        );
    }
}
