//! The three functions of libm that roar's code calls, defined in the binary so that no roar
//! start loads `libm.so` (each shared library costs a start ~0.1 ms here: bench/NOTES.md, "Two
//! shared libraries fewer"). glibc's static libm cannot be linked into a dynamic binary (it needs
//! the loader's `_dl_x86_cpu_features`); the `libm` crate is rust-lang's port of musl's, within
//! an ulp of glibc's.
//!
//! Who calls them: `pow` (tokio's scheduler, the S3 client's rate limiter), `log2` (the entropy
//! test of secret redaction), `log` (SQLite's FTS5 ranking), and progress bars. A new caller of
//! another libm function brings `libm.so` back, which `tests/tests/suite/preload.rs`
//! (`roar_needs_libc_alone`) catches.
#![allow(unsafe_code)]

/// The natural logarithm.
#[no_mangle]
pub extern "C" fn log(x: f64) -> f64 {
    libm::log(x)
}

/// The base-2 logarithm.
#[no_mangle]
pub extern "C" fn log2(x: f64) -> f64 {
    libm::log2(x)
}

/// `x` to the power `y`.
#[no_mangle]
pub extern "C" fn pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}

#[cfg(test)]
mod tests {
    /// The same values as the platform's libm to within an ulp, at points across the ranges the
    /// callers use (and the special cases).
    #[test]
    fn the_functions_match_the_platforms_within_an_ulp() {
        let ulps = |a: f64, b: f64| {
            if a.is_nan() && b.is_nan() || a == b {
                return 0;
            }
            (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
        };
        let points = [
            0.0,
            -0.0,
            1e-310,
            1e-10,
            0.5,
            1.0,
            2.0,
            3.0,
            7.25,
            10.0,
            1e6,
            1.5e300,
            -1.0,
            f64::INFINITY,
            f64::NAN,
        ];
        for &x in &points {
            assert!(ulps(libm::log(x), reference::log(x)) <= 1, "log({x})");
            assert!(ulps(libm::log2(x), reference::log2(x)) <= 1, "log2({x})");
            for &y in &[0.0, 0.5, -1.0, 2.0, 3.7, -250.0] {
                assert!(
                    ulps(libm::pow(x, y), reference::pow(x, y)) <= 1,
                    "pow({x}, {y})"
                );
            }
        }
    }

    /// glibc's libm, opened by name: the test binary defines the same symbols, so the reference
    /// must be looked up in the library itself.
    mod reference {
        use std::sync::OnceLock;

        type F1 = extern "C" fn(f64) -> f64;
        type F2 = extern "C" fn(f64, f64) -> f64;

        fn lib() -> *mut libc::c_void {
            static LIB: OnceLock<usize> = OnceLock::new();
            *LIB.get_or_init(|| {
                // SAFETY: a NUL-terminated name; the handle is kept for the process.
                let h = unsafe { libc::dlopen(c"libm.so.6".as_ptr(), libc::RTLD_NOW) };
                assert!(!h.is_null(), "libm.so.6 cannot be opened");
                h as usize
            }) as *mut libc::c_void
        }

        fn sym(name: &std::ffi::CStr) -> *mut libc::c_void {
            // SAFETY: a live handle and a NUL-terminated name.
            let f = unsafe { libc::dlsym(lib(), name.as_ptr()) };
            assert!(!f.is_null(), "{name:?} not in libm");
            f
        }

        pub fn log(x: f64) -> f64 {
            // SAFETY: libm's `log` has this signature.
            unsafe { std::mem::transmute::<*mut libc::c_void, F1>(sym(c"log"))(x) }
        }

        pub fn log2(x: f64) -> f64 {
            // SAFETY: libm's `log2` has this signature.
            unsafe { std::mem::transmute::<*mut libc::c_void, F1>(sym(c"log2"))(x) }
        }

        pub fn pow(x: f64, y: f64) -> f64 {
            // SAFETY: libm's `pow` has this signature.
            unsafe { std::mem::transmute::<*mut libc::c_void, F2>(sym(c"pow"))(x, y) }
        }
    }
}
