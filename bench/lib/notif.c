/* notif MODE PROG [ARG...]: runs PROG with every open/openat answered by a supervisor through a
 * seccomp user notification (Linux 5.5), as a tracer built on that mechanism would: the
 * supervisor reads the path from the program's memory, then lets the call go on
 * (SECCOMP_USER_NOTIF_FLAG_CONTINUE). MODE "sync" asks for SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP
 * (Linux 6.6): the supervisor is woken on the caller's CPU and the caller waits there, so no
 * wake-up crosses CPUs; MODE "async" leaves the default. A benchmark probe of the mechanism, not
 * part of roar: it records nothing and cannot learn an open's result. */
#define _GNU_SOURCE
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#ifndef SECCOMP_IOCTL_NOTIF_SET_FLAGS
#define SECCOMP_IOCTL_NOTIF_SET_FLAGS SECCOMP_IOW(4, __u64)
#endif
#ifndef SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP
#define SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP (1UL << 0)
#endif

static int listener;

static void *supervise(void *unused) {
    (void)unused;
    struct seccomp_notif req;
    struct seccomp_notif_resp resp;
    char path[256];
    for (;;) {
        memset(&req, 0, sizeof req);
        if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) continue; /* the caller died */
        unsigned long at = req.data.nr == __NR_openat ? req.data.args[1] : req.data.args[0];
        struct iovec local = {path, sizeof path}, remote = {(void *)at, sizeof path};
        process_vm_readv(req.pid, &local, 1, &remote, 1, 0);
        memset(&resp, 0, sizeof resp);
        resp.id = req.id;
        resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
        ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
    }
    return NULL;
}

/* Passes fd over a socket (the filter is the child's; its listener is handed to the parent). */
static void send_fd(int sock, int fd) {
    char c = 0, ctl[CMSG_SPACE(sizeof fd)] = {0};
    struct iovec iov = {&c, 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof fd);
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
    if (sendmsg(sock, &m, 0) != 1) _exit(3);
}

static int recv_fd(int sock) {
    char c, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&c, 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    if (recvmsg(sock, &m, 0) != 1) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
    return fd;
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[1], "sync") && strcmp(argv[1], "async"))) {
        fprintf(stderr, "usage: notif sync|async PROG [ARG...]\n");
        return 2;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        struct sock_filter f[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 1, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_open, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog prog = {sizeof f / sizeof f[0], f};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) _exit(3);
        int fd = syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
        if (fd < 0) _exit(3);
        send_fd(sv[1], fd);
        char go;
        if (read(sv[1], &go, 1) != 1) _exit(3); /* the supervisor is ready */
        close(fd);
        close(sv[0]);
        close(sv[1]);
        execvp(argv[2], argv + 2);
        _exit(127);
    }
    listener = recv_fd(sv[0]);
    if (listener < 0) return 1;
    if (!strcmp(argv[1], "sync") &&
        ioctl(listener, SECCOMP_IOCTL_NOTIF_SET_FLAGS, SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP, 0)) {
        perror("notif: SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP");
        return 1;
    }
    pthread_t t;
    pthread_create(&t, NULL, supervise, NULL);
    if (write(sv[0], "g", 1) != 1) return 1;
    int st;
    if (waitpid(pid, &st, 0) != pid) return 1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
