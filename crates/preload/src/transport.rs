//! How a report reaches roar: into the run's shared-memory ring (mapped at start, waited on when
//! full), else as one datagram on roar's socket (connected on first use, its fd kept out of the
//! program's way), else into the late file a killed roar leaves for recovery.

use super::*;

/// The socket, connected now if this is the first datagram.
pub(super) unsafe fn socket() -> c_int {
    let sock = SOCK.load(Ordering::Relaxed);
    if sock != UNCONNECTED {
        return sock;
    }
    // SAFETY: no preconditions.
    let fresh = unsafe { connect_socket() };
    match SOCK.compare_exchange(UNCONNECTED, fresh, Ordering::AcqRel, Ordering::Relaxed) {
        Ok(_) => fresh,
        Err(other) => {
            // Another thread connected first.
            if fresh >= 0 {
                // SAFETY: closing the fd we just opened.
                unsafe { real!(close: unsafe extern "C" fn(c_int) -> c_int)(fresh) };
            }
            other
        }
    }
}

pub(super) unsafe fn cstr<'a>(p: *const c_char) -> &'a [u8] {
    if p.is_null() {
        &[]
    } else {
        // SAFETY: callers pass C strings that libc just accepted.
        unsafe { CStr::from_ptr(p) }.to_bytes()
    }
}

pub(super) fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_REALTIME is served by the vDSO.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

pub(super) unsafe fn connect_socket() -> c_int {
    let len = SOCK_NAME_LEN.load(Ordering::Relaxed);
    if len == 0 {
        return -1;
    }
    // SAFETY: plain socket calls on a zeroed sockaddr_un we fill within bounds.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return -1;
        }
        let mut addr: libc::sockaddr_un = core::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        // Abstract namespace: sun_path[0] stays NUL.
        let name = &*ptr::addr_of!(SOCK_NAME);
        for (dst, src) in addr.sun_path[1..].iter_mut().zip(&name[..len.min(106)]) {
            *dst = *src as c_char;
        }
        let addr_len = (core::mem::size_of::<libc::sa_family_t>() + 1 + len) as libc::socklen_t;
        if libc::connect(fd, ptr::addr_of!(addr).cast(), addr_len) != 0 {
            real!(close: unsafe extern "C" fn(c_int) -> c_int)(fd);
            return -1;
        }
        let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, SOCK_FD_MIN);
        if high >= 0 {
            real!(close: unsafe extern "C" fn(c_int) -> c_int)(fd);
            high
        } else {
            fd
        }
    }
}

/// Reports one event: into the ring if this process mapped it, else as a datagram. Waits while
/// roar's ring or queue is full: events are never dropped by the shim while roar is alive.
pub(super) unsafe fn send(kind: Kind, arg: i64, fd: c_int, stat: WireStat, parts: [&[u8]; 4]) {
    let pid = event_pid();
    let mut h = Header {
        kind: kind as u16,
        pid,
        arg,
        fd,
        ts_ns: now_ns(),
        stat,
        ..Header::default()
    };
    for (i, p) in parts.iter().enumerate() {
        h.lens[i] = p.len() as u32;
    }
    if ROAR_GONE.load(Ordering::Relaxed) {
        // SAFETY: no preconditions.
        unsafe { late(&h, parts) };
        return;
    }
    // SAFETY: the mapping is never unmapped while RING_MAP points at it.
    if let Some(ring) = unsafe { ring() } {
        let [a, b, c, d] = parts;
        if ring.write(
            pid,
            &[h.as_bytes(), a, b, c, d],
            &mut RingWait::new(&ring).f(),
        ) {
            if ring.wake_needed(false) {
                wake(&ring);
            }
            return;
        }
    }
    let mut iov = [libc::iovec {
        iov_base: ptr::null_mut(),
        iov_len: 0,
    }; 6];
    iov[0] = libc::iovec {
        iov_base: h.as_bytes().as_ptr() as *mut c_void,
        iov_len: h.as_bytes().len(),
    };
    for (i, p) in parts.iter().enumerate() {
        iov[i + 1] = libc::iovec {
            iov_base: p.as_ptr() as *mut c_void,
            iov_len: p.len(),
        };
    }
    iov[5] = libc::iovec {
        // SAFETY: KEY is written once by the constructor, before any event is sent.
        iov_base: ptr::addr_of!(KEY) as *mut c_void,
        iov_len: KEY_LEN,
    };
    // SAFETY: msghdr zeroed then pointed at our iovecs, which outlive the call.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len();
    for _attempt in 0..2 {
        // SAFETY: no preconditions.
        let sock = unsafe { socket() };
        if sock < 0 {
            break;
        }
        loop {
            // SAFETY: msg is valid; MSG_NOSIGNAL keeps a vanished roar from killing the program.
            let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return;
            }
            // SAFETY: reading errno.
            let err = unsafe { *libc::__errno_location() };
            if err == libc::EINTR {
                continue;
            }
            if err == libc::EBADF || err == libc::ENOTSOCK || err == libc::ENOTCONN {
                // Our fd was closed behind our back (raw syscall): reconnect once.
                // SAFETY: no preconditions.
                let fresh = unsafe { connect_socket() };
                SOCK.store(fresh, Ordering::Relaxed);
                break;
            }
            if err == libc::ECONNREFUSED {
                // Nobody reads the socket: roar is gone.
                break;
            }
            return;
        }
    }
    // No roar to take it: the journal's late file keeps it.
    // SAFETY: no preconditions.
    unsafe { late(&h, parts) };
}

/// Appends one event to the late file (see [`LATE`]): its length, then the event as a datagram
/// would carry it, in one `writev` on a file opened for append, so events of concurrent
/// processes never interleave. Never creates the file (roar made it, 0600, with the ring): a
/// name someone else put there is not written through.
pub(super) unsafe fn late(h: &Header, parts: [&[u8]; 4]) {
    let n = LATE_LEN.load(Ordering::Relaxed);
    if n == 0 {
        return;
    }
    // SAFETY: LATE is written once by the constructor, NUL-terminated at `n`.
    unsafe {
        let path = ptr::addr_of!(LATE).cast::<c_char>();
        let fd = real!(open: unsafe extern "C" fn(*const c_char, c_int, c_uint) -> c_int)(
            path,
            libc::O_WRONLY | libc::O_APPEND | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        );
        if fd < 0 {
            return;
        }
        let body = h.as_bytes().len() + parts.iter().map(|p| p.len()).sum::<usize>();
        let len = (body as u32).to_le_bytes();
        let mut iov = [libc::iovec {
            iov_base: ptr::null_mut(),
            iov_len: 0,
        }; 6];
        iov[0] = libc::iovec {
            iov_base: len.as_ptr() as *mut c_void,
            iov_len: 4,
        };
        iov[1] = libc::iovec {
            iov_base: h.as_bytes().as_ptr() as *mut c_void,
            iov_len: h.as_bytes().len(),
        };
        for (i, p) in parts.iter().enumerate() {
            iov[i + 2] = libc::iovec {
                iov_base: p.as_ptr() as *mut c_void,
                iov_len: p.len(),
            };
        }
        libc::writev(fd, iov.as_ptr(), iov.len() as c_int);
        real!(close: unsafe extern "C" fn(c_int) -> c_int)(fd);
    }
}

/// The ring this process mapped, if any.
pub(super) unsafe fn ring() -> Option<Ring> {
    let base = RING_MAP.load(Ordering::Acquire);
    if base.is_null() {
        return None;
    }
    // SAFETY: RING_MAP is set only to a live mapping of RING_MAP_LEN bytes.
    unsafe { Ring::attach(base, RING_MAP_LEN.load(Ordering::Relaxed)) }
}

/// Wakes roar's reader sleeping on the ring (roar_wire::ring says when).
pub(super) fn wake(ring: &Ring) {
    // SAFETY: FUTEX_WAKE on a word of our shared mapping, which stays mapped.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            ring.wake_word(),
            libc::FUTEX_WAKE,
            1,
            ptr::null::<libc::timespec>(),
        );
    }
}

/// How a producer waits for space in a full ring: wake roar's reader if it sleeps, yield first,
/// then short sleeps, and every second or so make sure roar is still there to drain it.
pub(super) struct RingWait {
    ring: Ring,
    owner: pid_t,
    waits: u32,
}

impl RingWait {
    pub(super) fn new(ring: &Ring) -> RingWait {
        RingWait {
            ring: *ring,
            owner: ring.owner_pid() as pid_t,
            waits: 0,
        }
    }

    pub(super) fn f(&mut self) -> impl FnMut() -> bool + '_ {
        move || {
            if self.ring.wake_needed(true) {
                wake(&self.ring);
            }
            self.waits += 1;
            if self.waits < 64 {
                // SAFETY: no preconditions.
                unsafe { libc::sched_yield() };
                return true;
            }
            if self.waits == 64 || self.waits.is_multiple_of(1024) {
                // SAFETY: a signal-0 probe of roar's pid; errno is restored by the caller's guard.
                let gone = unsafe { libc::kill(self.owner, 0) } != 0
                    && unsafe { *libc::__errno_location() } == libc::ESRCH;
                if gone {
                    ROAR_GONE.store(true, Ordering::Relaxed);
                    RING_MAP.store(ptr::null_mut(), Ordering::Release);
                    return false;
                }
            }
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 50_000,
            };
            // SAFETY: valid timespec; an early wake-up just retries.
            unsafe { libc::nanosleep(&ts, ptr::null_mut()) };
            true
        }
    }
}

/// Maps the ring named by `ROAR_INTERNAL_RING`: a file (a run with a journal: it outlives roar),
/// or `<roar pid>/<fd>` through /proc, so a program that closed its inherited fds still reaches
/// it. Returns the mapping's length, 0 if not mapped.
pub(super) unsafe fn map_ring(spec: &[u8]) -> usize {
    let mut path = [0u8; PATH_MAX];
    if spec.first() == Some(&b'/') {
        // A ring file of its own (a run with a journal), and its late file beside it.
        if spec.len() >= PATH_MAX {
            return 0;
        }
        path[..spec.len()].copy_from_slice(spec);
        // SAFETY: the constructor is the only writer, before any thread exists.
        let late = unsafe { &mut *ptr::addr_of_mut!(LATE) };
        late[..spec.len()].copy_from_slice(spec);
        late[spec.len()..spec.len() + 5].copy_from_slice(b".late");
        late[spec.len() + 5] = 0;
        LATE_LEN.store(spec.len() + 5, Ordering::Relaxed);
    } else {
        // "/proc/" + spec + "/fd/" inserted after the pid: spec is "<pid>/<fd>".
        let Some(slash) = spec.iter().position(|b| *b == b'/') else {
            return 0;
        };
        let mut len = 0;
        for part in [b"/proc/".as_slice(), &spec[..slash], b"/fd", &spec[slash..]] {
            if len + part.len() >= 64 {
                return 0;
            }
            path[len..len + part.len()].copy_from_slice(part);
            len += part.len();
        }
    }
    // SAFETY: path is NUL-terminated; plain open/fstat/mmap/close on our own fd.
    unsafe {
        let fd = real!(open: unsafe extern "C" fn(*const c_char, c_int, c_uint) -> c_int)(
            path.as_ptr().cast(),
            libc::O_RDWR | libc::O_CLOEXEC,
            0,
        );
        if fd < 0 {
            return 0;
        }
        let mut st: libc::stat = core::mem::zeroed();
        let size = if libc::fstat(fd, &mut st) == 0 {
            st.st_size as usize
        } else {
            0
        };
        let map = if size > 0 {
            libc::mmap(
                ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        } else {
            libc::MAP_FAILED
        };
        real!(close: unsafe extern "C" fn(c_int) -> c_int)(fd);
        if map == libc::MAP_FAILED {
            return 0;
        }
        if Ring::attach(map.cast(), size).is_none() {
            libc::munmap(map, size);
            return 0;
        }
        RING_MAP_LEN.store(size, Ordering::Relaxed);
        RING_MAP.store(map.cast(), Ordering::Release);
        size
    }
}
