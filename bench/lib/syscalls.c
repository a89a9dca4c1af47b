/* Calls syscall(SYS_getppid) N times through libc's symbol (the preload shim hooks `syscall` to
 * see io_uring_setup): what the hook costs a program that makes its system calls this way (Rust's
 * std takes futexes so). */
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000, sum = 0;
    for (long i = 0; i < n; i++)
        sum += syscall(SYS_getppid);
    return sum == 0;
}
