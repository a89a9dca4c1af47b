#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
/* Writes then reads back N files of 4 KiB in ./out. */
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    char buf[4096], name[64];
    for (int i = 0; i < 4096; i++) buf[i] = (char)i;
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "out/f%d", i);
        int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        buf[0] = (char)i; buf[1] = (char)(i >> 8);
        if (fd < 0 || write(fd, buf, sizeof buf) != sizeof buf) return 1;
        close(fd);
    }
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "out/f%d", i);
        int fd = open(name, O_RDONLY);
        if (fd < 0 || read(fd, buf, sizeof buf) != sizeof buf) return 1;
        close(fd);
    }
    return 0;
}
