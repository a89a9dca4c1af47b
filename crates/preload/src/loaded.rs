//! Shared objects the dynamic loader mapped into the process, reported as reads of their files.
//!
//! The loader opens them with its own system calls, which no libc hook sees: without this, a job
//! traced by preload would not show the libraries it loaded, where ptrace and eBPF do (the
//! environment's dpkg packages come from them; a project's own `.so` is an input). The objects
//! loaded before `main` are reported by the constructor; those `dlopen`ed later when the process
//! leaves its image: at `exit`/`_exit`, in the shim's destructor (a return from `main`), and
//! before an exec. New objects are appended to the loader's list, so each scan reports only the
//! ones after the last scan's count, unless an unload (`dlpi_subs`) reordered it.
//!
//! `dlopen` itself is not interposed: glibc searches the *caller's* RUNPATH (`$ORIGIN/...`, as
//! PyTorch's and CUDA's libraries use) for the library, and a wrapper would make the shim the
//! caller, so such a load would fail under roar.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use roar_wire::Kind;

/// Objects reported so far, and the loader's unload count when they were.
static SEEN: AtomicUsize = AtomicUsize::new(0);
static SUBS: AtomicU64 = AtomicU64::new(0);

struct Scan {
    index: usize,
    skip: usize,
    subs: u64,
}

unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, size: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the Scan passed to dl_iterate_phdr; `info` is valid for this call.
    let (scan, info) = unsafe { (&mut *data.cast::<Scan>(), &*info) };
    let i = scan.index;
    scan.index += 1;
    if size >= core::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8 {
        scan.subs = info.dlpi_subs;
    }
    if i < scan.skip || info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: the loader's name for the object, a C string (empty for the program itself,
    // relative for a `dlopen("./lib/x.so")`: relative to the directory it was loaded from, which
    // the tracked cwd stands for).
    let name = unsafe { crate::cstr(info.dlpi_name) };
    if name.is_empty() || name.starts_with(b"linux-vdso") {
        return 0;
    }
    // SAFETY: stat into a zeroed struct, on the loader's NUL-terminated name.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: stat of a C string (not null: checked) into a zeroed stat of ours.
    if unsafe { libc::stat(info.dlpi_name, &mut st) } != 0
        || st.st_mode & libc::S_IFMT != libc::S_IFREG
    {
        return 0;
    }
    let mut buf = [0u8; crate::PATH_MAX];
    // SAFETY: base writes within buf; send copies the parts before returning.
    unsafe {
        let base = crate::base(libc::AT_FDCWD, name, &mut buf);
        crate::send(
            Kind::Open,
            libc::O_RDONLY as i64,
            -1,
            crate::wire_stat(&st),
            [base, name, &[], &[]],
        )
    };
    0
}

/// Reports the objects loaded since the last call.
pub(crate) unsafe fn report() {
    if !crate::enabled() {
        return;
    }
    let _errno = crate::KeepErrno::new();
    let mut scan = Scan {
        index: 0,
        skip: SEEN.load(Ordering::Relaxed),
        subs: SUBS.load(Ordering::Relaxed),
    };
    let subs_before = scan.subs;
    // First pass: the unload count, to know whether the list kept its order.
    // SAFETY: `each` only reads the info it is given.
    unsafe {
        let mut probe = Scan {
            index: 0,
            skip: usize::MAX,
            subs: subs_before,
        };
        libc::dl_iterate_phdr(Some(each), (&raw mut probe).cast());
        if probe.subs != subs_before {
            scan.skip = 0;
        }
        libc::dl_iterate_phdr(Some(each), (&raw mut scan).cast());
    }
    SEEN.fetch_max(scan.index, Ordering::Relaxed);
    SUBS.store(scan.subs, Ordering::Relaxed);
}

/// The shim's destructor: a process that returns from `main` leaves through libc's own `exit`,
/// which no hook sees; the loader runs this on the way out, and it reports the exit too.
unsafe extern "C" fn fini() {
    // SAFETY: reports the loader's list and the exit (its status is not known here).
    unsafe { crate::report_exit(0) };
}

#[used]
#[link_section = ".fini_array"]
static FINI: unsafe extern "C" fn() = fini;
