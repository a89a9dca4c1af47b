/* The exec functions that take their arguments as C varargs. Stable Rust cannot define a variadic
 * function, and glibc's own execl/execle/execlp call execve internally (not through the hooked
 * symbol), so without these a program that passes a scrubbed environment to execle would leave the
 * shim behind. Each copies its list into an argv array on the stack (sized by the list, as glibc
 * does) and calls the shim's execv/execvp/execve, which put roar's variables back into the
 * environment. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

/* The number of entries after arg0 up to and including the terminating NULL. */
static size_t count(va_list ap) {
    size_t n = 1;
    while (va_arg(ap, const char *) != NULL) {
        n++;
    }
    return n;
}

/* glibc declares arg0 nonnull, so the compiler deletes a plain `arg0 == NULL` test; yet
 * `execl(path, (char *)0)` (an empty argument list) is valid and must not make the shim walk
 * past the list's end. The empty asm hides where the pointer came from. */
static int is_null(const char *p) {
    __asm__("" : "+r"(p));
    return p == NULL;
}

#define GATHER(last)                                                                               \
    va_list ap, probe;                                                                             \
    va_start(ap, last);                                                                            \
    va_copy(probe, ap);                                                                            \
    size_t n = is_null(arg0) ? 1 : count(probe) + 1; /* arg0 .. NULL */                            \
    va_end(probe);                                                                                 \
    if (n > INT_MAX / sizeof(char *)) {                                                            \
        va_end(ap);                                                                                \
        errno = E2BIG;                                                                             \
        return -1;                                                                                 \
    }                                                                                              \
    const char *argv[n];                                                                           \
    argv[0] = arg0;                                                                                \
    for (size_t i = 1; i < n; i++) {                                                               \
        argv[i] = va_arg(ap, const char *);                                                        \
    }

int execl(const char *path, const char *arg0, ...) {
    GATHER(arg0)
    va_end(ap);
    return execv(path, (char *const *)argv);
}

int execlp(const char *file, const char *arg0, ...) {
    GATHER(arg0)
    va_end(ap);
    return execvp(file, (char *const *)argv);
}

int execle(const char *path, const char *arg0, ...) {
    GATHER(arg0)
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, (char *const *)argv, envp);
}
