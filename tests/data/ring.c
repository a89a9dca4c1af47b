/* Writes ring-out.txt through io_uring only (openat, write, close as ring requests). */
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static struct io_uring_params p;
static unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
static struct io_uring_sqe *sqes;
static struct io_uring_cqe *cqes;
static int ring;

static int run(struct io_uring_sqe *e) {
    unsigned t = *sq_tail;
    sqes[t & *sq_mask] = *e;
    sq_array[t & *sq_mask] = t & *sq_mask;
    __atomic_store_n(sq_tail, t + 1, __ATOMIC_RELEASE);
    if (syscall(SYS_io_uring_enter, ring, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0) return -1;
    unsigned h = *cq_head;
    int res = cqes[h & *cq_mask].res;
    __atomic_store_n(cq_head, h + 1, __ATOMIC_RELEASE);
    return res;
}

int main(void) {
    ring = syscall(SYS_io_uring_setup, 4, &p);
    if (ring < 0) { perror("io_uring_setup"); return 2; }
    char *sq = mmap(0, p.sq_off.array + p.sq_entries * 4, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_SQ_RING);
    char *cq = mmap(0, p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_CQ_RING);
    sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_SQES);
    sq_tail = (unsigned *)(sq + p.sq_off.tail); sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    sq_array = (unsigned *)(sq + p.sq_off.array);
    cq_head = (unsigned *)(cq + p.cq_off.head); cq_tail = (unsigned *)(cq + p.cq_off.tail);
    cq_mask = (unsigned *)(cq + p.cq_off.ring_mask); cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    struct io_uring_sqe e;
    memset(&e, 0, sizeof e);
    e.opcode = IORING_OP_OPENAT; e.fd = AT_FDCWD; e.addr = (unsigned long)"ring-out.txt";
    e.open_flags = O_WRONLY | O_CREAT | O_TRUNC; e.len = 0644;
    int fd = run(&e);
    if (fd < 0) { fprintf(stderr, "openat: %d\n", fd); return 3; }
    static const char text[] = "written through the ring\n";
    memset(&e, 0, sizeof e);
    e.opcode = IORING_OP_WRITE; e.fd = fd; e.addr = (unsigned long)text; e.len = sizeof text - 1;
    if (run(&e) != (int)(sizeof text - 1)) return 4;
    memset(&e, 0, sizeof e);
    e.opcode = IORING_OP_CLOSE; e.fd = fd;
    return run(&e) == 0 ? 0 : 5;
}
