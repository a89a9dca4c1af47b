#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
/* Opens and closes ./in N times: the cost of one observed open, with nothing new to hash. */
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    for (int i = 0; i < n; i++) {
        int fd = open("in", O_RDONLY);
        if (fd < 0) return 1;
        close(fd);
    }
    return 0;
}
