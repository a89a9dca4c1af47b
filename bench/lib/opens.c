#include <stdlib.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
/* Opens and closes ./in N times: the cost of one observed open, with nothing new to hash.
 * With a second argument US, computes for US microseconds after each open (a loop over a clock,
 * no system call): opens spread out as a program that works between them makes them. */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    double work = argc > 2 ? atoi(argv[2]) / 1e6 : 0;
    for (int i = 0; i < n; i++) {
        int fd = open("in", O_RDONLY);
        if (fd < 0) return 1;
        close(fd);
        if (work > 0)
            for (double end = now() + work; now() < end;)
                ;
    }
    return 0;
}
