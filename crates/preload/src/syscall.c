/* syscall(2), hooked for the one call the shim must know of: io_uring_setup. A ring's opens,
 * reads and writes are requests in shared memory the kernel runs for the process, never calls
 * the shim (or any tracer) sees, so a job that sets one up is reported and recorded incomplete
 * (SEMANTICS.md, blind spots). Programs reach the call through this symbol (Python's ctypes,
 * Rust's io-uring crate); liburing issues it inline and stays unseen (documented there).
 * Every other number goes straight to the kernel, exactly as glibc's syscall does: the same six
 * registers, and errno set from a result in [-4095, -1]. */
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>

/* lib.rs: reports that this process set up an io_uring instance. */
void roar_shim_ring_set_up(void);

static long raw6(long n, long a, long b, long c, long d, long e, long f) {
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}

long syscall(long number, ...) {
    va_list ap;
    va_start(ap, number);
    long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
    long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
    va_end(ap);
    long ret = raw6(number, a, b, c, d, e, f);
    if (ret < 0 && ret >= -4095) {
        errno = (int)-ret;
        return -1;
    }
    if (number == SYS_io_uring_setup) {
        int saved = errno;
        roar_shim_ring_set_up();
        errno = saved;
    }
    return ret;
}
