//! Hooks of processes and descriptors: fork and vfork (a shim without the ring vouches for its
//! child), close, close_range and dup2/dup3 (roar's socket kept out of the program's way), exit,
//! and the report of an io_uring set up (src/syscall.c).

use super::*;

/// This process set up an io_uring instance (src/syscall.c): its program is reported as one
/// whose files the shim cannot see, and the job is recorded incomplete.
#[no_mangle]
pub extern "C" fn roar_shim_ring_set_up() {
    if !enabled() {
        return;
    }
    let _errno = KeepErrno::new();
    let mut buf = [0u8; PATH_MAX];
    // SAFETY: readlink writes at most buf.len() - 1 bytes into buf, a live local.
    let n = unsafe {
        libc::syscall(
            libc::SYS_readlink,
            c"/proc/self/exe".as_ptr(),
            buf.as_mut_ptr(),
            buf.len() - 1,
        )
    };
    let exe = &buf[..n.max(0) as usize];
    let why = followable::Unfollowable::Ring as i64;
    // SAFETY: plain byte slices; send copies them.
    unsafe {
        send(
            Kind::Untraced,
            why,
            -1,
            WireStat::default(),
            [&[], exe, &[], &[]],
        )
    };
}

// ---- processes and our own fd ------------------------------------------------------------------

/// A shim without the ring (this process became another user than roar's) tells roar it started
/// `child`: roar takes a datagram only from a process it can place in the run, and a child that
/// exits before roar looks can be placed only by its parent's word.
pub(super) unsafe fn vouch_for(child: pid_t) {
    if enabled() && RING_LEN.load(Ordering::Relaxed) == 0 && !ROAR_GONE.load(Ordering::Relaxed) {
        let _errno = KeepErrno::new();
        // SAFETY: no preconditions.
        unsafe {
            send(
                Kind::Spawned,
                i64::from(child),
                -1,
                WireStat::default(),
                [&[]; 4],
            )
        };
    }
}

#[no_mangle]
pub unsafe extern "C" fn fork() -> pid_t {
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    let pid = unsafe { real!(fork: unsafe extern "C" fn() -> pid_t)() };
    if pid > 0 {
        // SAFETY: no preconditions.
        unsafe { vouch_for(pid) };
    }
    if pid == 0 && enabled() {
        let _errno = KeepErrno::new();
        // SAFETY: no preconditions.
        PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
        // SAFETY: no preconditions.
        let ppid = unsafe { libc::getppid() };
        // SAFETY: `send` copies the parts it is given (slices that live across the call) into the ring or a datagram.
        unsafe { send(Kind::Fork, ppid as i64, -1, WireStat::default(), [&[]; 4]) };
    }
    pid
}

/// vfork, with the child marked ([`IN_VFORK`]). It cannot be a wrapper that calls the real one:
/// the child returns through the caller's frame and then the parent returns through it again, so,
/// like libc's own, it keeps the return address in a register across the system call.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn vfork() -> pid_t {
    core::arch::naked_asm!(
        "pop rdi",
        "mov eax, {nr}",
        "syscall",
        "push rdi",
        "test eax, eax",
        "jz 2f",
        // The parent, resumed once the child exec'd or exited: vouches for the child (the pid
        // kept across the call, which the push also aligns to 16 bytes).
        "mov byte ptr [rip + {flag}], 0",
        "cmp rax, -4095",
        "jae 3f",
        "push rax",
        "mov edi, eax",
        "call {vouch}",
        "pop rax",
        "ret",
        "2:",
        "mov byte ptr [rip + {flag}], 1",
        "ret",
        // Failed: errno, -1. One push keeps the stack 16-byte aligned for the call.
        "3:",
        "neg eax",
        "push rax",
        "call {errno}",
        "pop rcx",
        "mov dword ptr [rax], ecx",
        "mov eax, -1",
        "ret",
        nr = const libc::SYS_vfork,
        flag = sym IN_VFORK,
        errno = sym libc::__errno_location,
        vouch = sym vouch_for_vforked,
    )
}

/// [`vouch_for`], called from [`vfork`]'s parent path.
pub(super) extern "C" fn vouch_for_vforked(child: pid_t) {
    // SAFETY: no preconditions.
    unsafe { vouch_for(child) };
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if fd >= 0 && fd == SOCK.load(Ordering::Relaxed) {
        // Programs that close every fd would cut roar off; the socket is CLOEXEC anyway.
        return 0;
    }
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    unsafe { real!(close: unsafe extern "C" fn(c_int) -> c_int)(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let f = real!(close_range: unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int);
    let sock = SOCK.load(Ordering::Relaxed);
    if sock < 0 || (sock as c_uint) < first || (sock as c_uint) > last {
        // SAFETY: libc's close_range, with the caller's range split around the shim's socket.
        return unsafe { f(first, last, flags) };
    }
    let s = sock as c_uint;
    let mut r = 0;
    if s > first {
        // SAFETY: libc's close_range, with the caller's range split around the shim's socket.
        r = unsafe { f(first, s - 1, flags) };
    }
    if r == 0 && s < last {
        // SAFETY: libc's close_range, with the caller's range split around the shim's socket.
        r = unsafe { f(s + 1, last, flags) };
    }
    r
}

/// Moves our socket out of the way before the program takes its fd number.
pub(super) unsafe fn vacate(newfd: c_int) {
    let sock = SOCK.load(Ordering::Relaxed);
    if sock >= 0 && sock == newfd {
        let _errno = KeepErrno::new();
        // SAFETY: duplicating an fd we own.
        let moved = unsafe { libc::fcntl(sock, libc::F_DUPFD_CLOEXEC, newfd + 1) };
        SOCK.store(moved, Ordering::Relaxed);
    }
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: `vacate` moves only the shim's own socket fd out of the way.
    unsafe { vacate(new) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    unsafe { real!(dup2: unsafe extern "C" fn(c_int, c_int) -> c_int)(old, new) }
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: `vacate` moves only the shim's own socket fd out of the way.
    unsafe { vacate(new) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    unsafe { real!(dup3: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int)(old, new, flags) }
}

/// Whether the pipe at `fd` has no writer and nothing left to read: it can never carry data.
pub(super) fn dead_pipe(fd: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLHUP != 0 && p.revents & libc::POLLIN == 0
}

/// Set once this process reported its exit (a hooked `exit` runs the destructor after it).
pub(super) static EXITED: AtomicBool = AtomicBool::new(false);

/// Reports the process's exit, once: from the `exit` family of hooks, or from the shim's
/// destructor for a process that returns from `main` (libc's own call to `exit` passes no hook).
pub(crate) unsafe fn report_exit(status: c_int) {
    if enabled() {
        // SAFETY: `report` reads only what `dl_iterate_phdr` hands it, under the loader's lock.
        unsafe { loaded::report() };
        // A vfork child shares the flag with its parent: it reports without marking.
        if IN_VFORK.load(Ordering::Relaxed) || !EXITED.swap(true, Ordering::Relaxed) {
            // SAFETY: `send` copies the parts it is given (slices that live across the call) into the ring or a datagram.
            unsafe { send(Kind::Exit, status as i64, -1, WireStat::default(), [&[]; 4]) };
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn exit(status: c_int) -> ! {
    // SAFETY: reports from the shim's own state; nothing of the caller's is read.
    unsafe { report_exit(status) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    unsafe { real!(exit: unsafe extern "C" fn(c_int) -> !)(status) }
}

#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    // SAFETY: reports from the shim's own state; nothing of the caller's is read.
    unsafe { report_exit(status) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    unsafe { real!(_exit: unsafe extern "C" fn(c_int) -> !)(status) }
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: reports from the shim's own state; nothing of the caller's is read.
    unsafe { report_exit(status) };
    // SAFETY: libc's own function, called once with the caller's arguments unchanged.
    unsafe { real!(_Exit: unsafe extern "C" fn(c_int) -> !)(status) }
}
