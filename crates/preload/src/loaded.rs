//! Shared objects the dynamic loader mapped into the process, reported as reads of their files.
//!
//! The loader opens them with its own system calls, which no libc hook sees: without this, a job
//! traced by preload would not show the libraries it loaded, where ptrace and eBPF do (the
//! environment's dpkg packages come from them; a project's own `.so` is an input). The objects
//! loaded before `main` are reported by the constructor, those of each successful `dlopen` after
//! it: new objects are appended to the loader's list, so each scan reports only the ones after
//! the last scan's count, unless an unload (`dlpi_subs`) reordered it.

use core::ffi::{c_char, c_int, c_void};
use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

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
    // SAFETY: the loader's name for the object, a C string (empty for the program itself).
    let name = unsafe { crate::cstr(info.dlpi_name) };
    if name.first() != Some(&b'/') {
        return 0;
    }
    // SAFETY: stat into a zeroed struct, on the loader's NUL-terminated name.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    if unsafe { libc::stat(info.dlpi_name, &mut st) } != 0
        || st.st_mode & libc::S_IFMT != libc::S_IFREG
    {
        return 0;
    }
    // SAFETY: send copies the parts before returning.
    unsafe {
        crate::send(
            Kind::Open,
            libc::O_RDONLY as i64,
            -1,
            crate::wire_stat(&st),
            [&[], name, &[], &[]],
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

/// `dlopen`: the real one, then a report of what it loaded.
#[no_mangle]
pub unsafe extern "C" fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void {
    let real = real!(dlopen: unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void);
    // SAFETY: the caller's arguments, unchanged.
    let handle = unsafe { real(filename, flags) };
    if !handle.is_null() {
        // SAFETY: report only reads the loader's list.
        unsafe { report() };
    }
    handle
}
