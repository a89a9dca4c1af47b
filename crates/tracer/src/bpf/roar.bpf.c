// SPDX-License-Identifier: (Apache-2.0 OR GPL-2.0)
/* roar's eBPF tracer: what the processes of each `roar run` do to files.
 *
 * Attached with BTF-typed raw tracepoints (`tp_btf`): the syscall entry/exit points and the
 * scheduler's fork/exec/exit. None of them needs tracefs, kprobes, fentry or LSM hooks.
 *
 * The programs serve several runs at once (ebpf/helper.rs keeps them loaded between runs):
 * - `runs` is a table of run slots; a slot holds the generation of the run that has it (0: free).
 * - `tracked` maps a tgid to the run it belongs to, as (slot, generation). The command adds itself
 *   before it execs (ebpf/mod.rs); fork adds children in-kernel, so no short-lived child is
 *   missed; the last thread's exit removes the process. An entry whose generation is no longer
 *   its slot's (its run ended or crashed, and the slot may serve another run now) is dead: it is
 *   dropped when seen, and nothing it does reaches any run.
 * - `rings` holds a ring buffer per slot, which the slot's successive runs reuse (putting a map
 *   into a map-of-maps waits for an RCU grace period, ~10 ms): each record carries its run's
 *   generation, and a run reads only its own.
 * - sys_enter keeps the arguments of a file syscall of a tracked process in `pending` (per
 *   thread); sys_exit drops it on failure, and on success sends one record with the paths read
 *   from the program's memory (just read by the kernel, so resident). A relative path is sent with
 *   its base directory (cwd or dirfd) walked up the dentry tree in-kernel. Reads and writes send
 *   nothing.
 * - A record that cannot be written (ring full) or state that cannot be kept (map full) counts in
 *   the run's `lost`: userspace then marks the job incomplete instead of recording part of it.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "roar.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define DATA_SIZE 16384
#define DATA_MASK (DATA_SIZE - 1)
#define PATH_CAP 4096
#define NAME_CAP 256
#define MAX_DEPTH 40
#define ARGV_CAP 4096

#define AT_FDCWD -100
#define AT_REMOVEDIR 0x200
#define RENAME_EXCHANGE (1 << 1)
#define O_WRONLY 01
#define O_CREAT 0100
#define O_EXCL 0200
/* Set in f_mode by the open that created the file (include/linux/fs.h: 1 << 20 since 4.19, also
 * after the bits were renumbered in 6.9). */
#define FMODE_CREATED (1U << 20)
#define O_TRUNC 01000
#define O_DIRECTORY 0200000
#define S_IFMT 0170000
#define S_IFREG 0100000
#define S_IFIFO 0010000
#define S_IFSOCK 0140000

/* x86_64 syscall numbers. */
#define NR_open 2
#define NR_truncate 76
#define NR_ftruncate 77
#define NR_rename 82
#define NR_mkdir 83
#define NR_rmdir 84
#define NR_creat 85
#define NR_link 86
#define NR_unlink 87
#define NR_symlink 88
#define NR_openat 257
#define NR_mkdirat 258
#define NR_unlinkat 263
#define NR_renameat 264
#define NR_linkat 265
#define NR_symlinkat 266
#define NR_renameat2 316
#define NR_io_uring_setup 425
#define NR_openat2 437

struct scratch {
	struct roar_event ev;
	/* Strings are written at offsets below DATA_SIZE; the tail keeps any copy in bounds. */
	char data[DATA_SIZE + PATH_CAP];
};

struct run_key {
	__u32 slot;
	__u32 gen;
};

struct run_state {
	__u32 gen; /* of the run holding the slot; 0 when free */
	__u32 reserved;
	__u64 lost;
};

struct pending {
	long nr;
	__u64 a[5];
	struct run_key run;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

/* Runs served at once; ebpf/helper.rs hands out the slots. */
#define MAX_RUNS 64

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_RUNS);
	__type(key, __u32);
	__type(value, struct run_state);
} runs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_RUNS);
	__type(key, __u32);
	/* The template: the kernel compares a ring put here by type, not size (the runs' rings are
	 * ROAR_EBPF_RING_KB). */
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_RINGBUF);
		__uint(max_entries, 4096);
	});
} rings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* preallocating costs milliseconds per load */
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct run_key);
} tracked SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	/* Preallocated: an entry comes and goes on every traced syscall. */
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct pending);
} pending SEC(".maps");

/* Set by userspace before load: wake the reader once this much is waiting (see emit). */
const volatile __u64 wake_bytes = 1 << 20;

/* The state of the live run `k` names, or 0 if that run is over (its slot is free or reused). */
static __always_inline struct run_state *live(const struct run_key *k)
{
	__u32 slot = k->slot;
	struct run_state *r = bpf_map_lookup_elem(&runs, &slot);

	if (!r || r->gen != k->gen || k->gen == 0)
		return 0;
	return r;
}

/* The run `tgid` belongs to, copied into `k`; false for a process of no live run (a dead entry
 * is removed on the way). */
static __always_inline bool run_of(__u32 tgid, struct run_key *k)
{
	struct run_key *e = bpf_map_lookup_elem(&tracked, &tgid);

	if (!e)
		return false;
	*k = *e;
	if (!live(k)) {
		bpf_map_delete_elem(&tracked, &tgid);
		return false;
	}
	return true;
}

static __always_inline void count_lost(const struct run_key *k)
{
	struct run_state *r = live(k);

	if (r)
		__sync_fetch_and_add(&r->lost, 1);
}

static __always_inline bool traced_nr(long nr)
{
	switch (nr) {
	case NR_open:
	case NR_creat:
	case NR_openat:
	case NR_openat2:
	case NR_truncate:
	case NR_ftruncate:
	case NR_rename:
	case NR_renameat:
	case NR_renameat2:
	case NR_link:
	case NR_linkat:
	case NR_unlink:
	case NR_unlinkat:
	case NR_symlink:
	case NR_symlinkat:
	case NR_io_uring_setup:
	case NR_mkdir:
	case NR_mkdirat:
	case NR_rmdir:
		return true;
	}
	return false;
}

/* An offset into scratch.data the verifier can see is in bounds: masked in asm, because clang
 * drops a mask it can prove redundant after `off < DATA_SIZE`. */
static __always_inline __u64 slot(__u32 off)
{
	__u64 v = off;

	asm volatile("%0 &= %1" : "+r"(v) : "i"(DATA_MASK));
	return v;
}

static __always_inline struct scratch *begin(__u32 kind, __u32 pid)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &zero);

	if (!s)
		return 0;
	__builtin_memset(&s->ev, 0, sizeof(s->ev));
	s->ev.kind = kind;
	s->ev.pid = pid;
	s->ev.ts_ns = bpf_ktime_get_ns();
	return s;
}

static __always_inline void emit(struct scratch *s, __u32 off, const struct run_key *k)
{
	__u64 size = off;
	__u32 slot = k->slot;
	void *ring = bpf_map_lookup_elem(&rings, &slot);

	if (!ring) {
		count_lost(k);
		return;
	}
	s->ev.run_gen = k->gen;
	/* Clamped in asm: clang would otherwise pass the verifier an unclamped copy. */
	asm volatile("if %0 <= %1 goto +1\n\t%0 = %1" : "+r"(size) : "i"(DATA_SIZE));
	/* Waking the reader for every record would cost a context switch per file: it is woken once a
	 * batch is waiting, and otherwise reads on its own timer and at the end of the run. */
	__u64 flags = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA) >= wake_bytes ?
			      BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(ring, s, sizeof(s->ev) + size, flags))
		count_lost(k);
}

struct walk {
	struct dentry *d;
	struct dentry *mnt_root;
	struct mount *m;
	__u32 off;
	int reached_root;
};

/* One step of put_dir, run by bpf_loop: the verifier checks it once, not once per level. */
static long walk_step(__u64 i, void *ctx)
{
	struct walk *w = ctx;
	/* Plain locals: BPF_CORE_READ on w->... would relocate struct walk itself. */
	struct dentry *d = w->d;
	struct mount *m = w->m;
	struct dentry *parent = BPF_CORE_READ(d, d_parent);
	struct scratch *s;
	__u32 zero = 0, off = w->off;
	long n;

	if (d == w->mnt_root) {
		struct mount *up = BPF_CORE_READ(m, mnt_parent);

		if (up == m) {
			w->reached_root = 1; /* the root of the mount tree */
			return 1;
		}
		w->d = BPF_CORE_READ(m, mnt_mountpoint);
		w->m = up;
		w->mnt_root = BPF_CORE_READ(up, mnt.mnt_root);
		return 0;
	}
	if (d == parent) {
		w->reached_root = 1; /* the root of a filesystem not mounted here: as far as it goes */
		return 1;
	}
	s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s || off >= DATA_SIZE)
		return 1;
	n = bpf_probe_read_kernel_str(&s->data[slot(off)], NAME_CAP,
				      BPF_CORE_READ(d, d_name.name));
	if (n <= 0)
		return 1;
	w->off = off + n;
	w->d = parent;
	return 0;
}

/* Appends the directory `path` names as its components from the leaf up, each NUL-terminated,
 * crossing mount points up to the root of the mount tree. Returns the new offset. */
static __always_inline __u32 put_dir(struct scratch *s, __u32 off, const struct path *path)
{
	struct vfsmount *vfs = BPF_CORE_READ(path, mnt);
	struct walk w = {
		.d = BPF_CORE_READ(path, dentry),
		.mnt_root = BPF_CORE_READ(vfs, mnt_root),
		.m = container_of(vfs, struct mount, mnt),
		.off = off,
	};

	bpf_loop(MAX_DEPTH, walk_step, &w, 0);
	if (!w.reached_root)
		s->ev.flags |= ROAR_TRUNCATED;
	return w.off;
}

static __always_inline struct file *fd_file(struct task_struct *t, int fd)
{
	struct fdtable *fdt = BPF_CORE_READ(t, files, fdt);
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = 0;

	if (fd < 0 || fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]);
	return f;
}

/* Appends the program's path argument, then (string idx + 1) the directory it is relative to,
 * empty for an absolute path. */
static __always_inline __u32 put_at(struct scratch *s, __u32 off, struct task_struct *t,
				    int dirfd, __u64 upath, int idx)
{
	__u32 start = off;
	long n;

	if (off >= DATA_SIZE) {
		s->ev.flags |= ROAR_TRUNCATED;
		return off;
	}
	n = bpf_probe_read_user_str(&s->data[slot(off)], PATH_CAP, (const void *)upath);
	if (n <= 0) {
		s->ev.flags |= ROAR_TRUNCATED;
		return off;
	}
	off += n;
	s->ev.len[idx & 3] = n;
	if (s->data[slot(start)] == '/')
		return off;
	if (dirfd == AT_FDCWD) {
		struct fs_struct *fs = BPF_CORE_READ(t, fs);

		off = put_dir(s, off, __builtin_preserve_access_index(&fs->pwd));
	} else {
		struct file *f = fd_file(t, dirfd);

		if (!f) {
			s->ev.flags |= ROAR_TRUNCATED;
			return off;
		}
		off = put_dir(s, off, __builtin_preserve_access_index(&f->f_path));
	}
	s->ev.len[(idx + 1) & 3] = off - start - n;
	return off;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter, struct pt_regs *regs, long id)
{
	__u64 pid_tgid;
	__u32 tgid, tid;
	struct pending p = {};

	if (!traced_nr(id))
		return 0;
	pid_tgid = bpf_get_current_pid_tgid();
	tgid = pid_tgid >> 32;
	tid = (__u32)pid_tgid;
	if (!run_of(tgid, &p.run))
		return 0;
	/* Direct (BTF) loads: no helper call per argument. */
	p.nr = id;
	p.a[0] = regs->di;
	p.a[1] = regs->si;
	p.a[2] = regs->dx;
	p.a[3] = regs->r10;
	p.a[4] = regs->r8;
	/* find and ls -R open thousands of directories; they are never artifacts. */
	if ((id == NR_open && (p.a[1] & O_DIRECTORY)) || (id == NR_openat && (p.a[2] & O_DIRECTORY)))
		return 0;
	if (bpf_map_update_elem(&pending, &tid, &p, BPF_ANY))
		count_lost(&p.run);
	return 0;
}

static __always_inline int on_open(struct scratch *s, struct task_struct *t, int dirfd,
				   __u64 upath, int flags, long fd, const struct run_key *k)
{
	struct file *f = fd_file(t, fd);
	struct inode *ino;
	__u32 off;

	if (!f)
		return 0;
	ino = BPF_CORE_READ(f, f_inode);
	if ((BPF_CORE_READ(ino, i_mode) & S_IFMT) != S_IFREG)
		return 0;
	/* Whether an O_CREAT open made the file, as the kernel knows it: said as O_EXCL (made), or
	 * as an open without O_CREAT (it found one), so that a file there before the job is never
	 * taken for one the job made, whatever its ctime (the shim and ptrace say the same). */
	if ((flags & (O_CREAT | O_EXCL)) == O_CREAT) {
		if (BPF_CORE_READ(f, f_mode) & FMODE_CREATED)
			flags |= O_EXCL;
		else
			flags &= ~O_CREAT;
	}
	s->ev.open_flags = flags;
	s->ev.flags |= ROAR_HAS_STAT;
	s->ev.dev = BPF_CORE_READ(ino, i_sb, s_dev);
	s->ev.ino = BPF_CORE_READ(ino, i_ino);
	s->ev.size = BPF_CORE_READ(ino, i_size);
	s->ev.mtime_ns = BPF_CORE_READ(ino, i_mtime_sec) * 1000000000 + BPF_CORE_READ(ino, i_mtime_nsec);
	/* Kernels >= 6.13 keep the multigrain "ctime queried" flag in bit 31 of i_ctime_nsec
	 * (I_CTIME_QUERIED); stat(2) masks it, so must we. No other timestamp carries a flag. */
	s->ev.ctime_ns = BPF_CORE_READ(ino, i_ctime_sec) * 1000000000 +
			 (BPF_CORE_READ(ino, i_ctime_nsec) & ~(1U << 31));
	off = put_at(s, 0, t, dirfd, upath, 0);
	emit(s, off, k);
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit, struct pt_regs *regs, long ret)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid;
	struct task_struct *t;
	struct pending *pp, p;
	struct scratch *s;
	__u32 off = 0, kind;

	/* Runs after every syscall on the machine: a direct (BTF) load, no helper call. */
	if (!traced_nr(regs->orig_ax))
		return 0;
	pp = bpf_map_lookup_elem(&pending, &tid);
	if (!pp)
		return 0;
	p = *pp;
	bpf_map_delete_elem(&pending, &tid);
	if (ret < 0 || !live(&p.run))
		return 0;
	switch (p.nr) {
	case NR_open:
	case NR_openat:
	case NR_openat2:
	case NR_creat:
		kind = ROAR_OPEN;
		break;
	case NR_rename:
	case NR_renameat:
		kind = ROAR_RENAME;
		break;
	case NR_renameat2:
		kind = (p.a[4] & RENAME_EXCHANGE) ? ROAR_EXCHANGE : ROAR_RENAME;
		break;
	case NR_link:
	case NR_linkat:
		kind = ROAR_LINK;
		break;
	case NR_truncate:
	case NR_ftruncate:
		kind = ROAR_TRUNCATE;
		break;
	case NR_symlink:
	case NR_symlinkat:
		kind = ROAR_SYMLINK;
		break;
	case NR_io_uring_setup:
		kind = ROAR_IO_URING;
		break;
	case NR_mkdir:
	case NR_mkdirat:
		kind = ROAR_MKDIR;
		break;
	case NR_rmdir:
		kind = ROAR_RMDIR;
		break;
	case NR_unlinkat:
		kind = (p.a[2] & AT_REMOVEDIR) ? ROAR_RMDIR : ROAR_UNLINK;
		break;
	default:
		kind = ROAR_UNLINK;
	}
	s = begin(kind, pid_tgid >> 32);
	if (!s)
		return 0;
	t = bpf_get_current_task_btf();
	switch (p.nr) {
	case NR_open:
		return on_open(s, t, AT_FDCWD, p.a[0], p.a[1], ret, &p.run);
	case NR_creat:
		return on_open(s, t, AT_FDCWD, p.a[0], O_WRONLY | O_CREAT | O_TRUNC, ret, &p.run);
	case NR_openat:
		return on_open(s, t, p.a[0], p.a[1], p.a[2], ret, &p.run);
	case NR_openat2: {
		__u64 how_flags = 0;

		bpf_probe_read_user(&how_flags, sizeof(how_flags), (const void *)p.a[2]);
		return on_open(s, t, p.a[0], p.a[1], how_flags, ret, &p.run);
	}
	case NR_rename:
	case NR_link:
		off = put_at(s, 0, t, AT_FDCWD, p.a[0], 0);
		off = put_at(s, off, t, AT_FDCWD, p.a[1], 2);
		break;
	case NR_renameat:
	case NR_renameat2:
	case NR_linkat:
		off = put_at(s, 0, t, p.a[0], p.a[1], 0);
		off = put_at(s, off, t, p.a[2], p.a[3], 2);
		break;
	case NR_unlink:
	case NR_truncate:
	case NR_mkdir:
	case NR_rmdir:
		off = put_at(s, 0, t, AT_FDCWD, p.a[0], 0);
		break;
	case NR_unlinkat:
	case NR_mkdirat:
		off = put_at(s, 0, t, p.a[0], p.a[1], 0);
		break;
	/* symlink(target, linkpath), symlinkat(target, newdirfd, linkpath): the link's path. */
	case NR_symlink:
		off = put_at(s, 0, t, AT_FDCWD, p.a[1], 0);
		break;
	case NR_symlinkat:
		off = put_at(s, 0, t, p.a[1], p.a[2], 0);
		break;
	/* The program that set the ring up, as its exec named it. */
	case NR_io_uring_setup: {
		struct file *exe = BPF_CORE_READ(t, mm, exe_file);

		if (!exe)
			return 0;
		off = put_dir(s, 0, __builtin_preserve_access_index(&exe->f_path));
		s->ev.len[0] = off;
		break;
	}
	case NR_ftruncate: {
		struct file *f = fd_file(t, (int)p.a[0]);

		/* A file with no name left (unlinked while open) was truncated at no path. */
		if (!f || BPF_CORE_READ(f, f_inode, __i_nlink) == 0)
			return 0;
		/* No path argument: string 0 is empty, string 1 the file's own path. */
		off = put_dir(s, 0, __builtin_preserve_access_index(&f->f_path));
		s->ev.len[1] = off;
		break;
	}
	default:
		return 0;
	}
	emit(s, off, &p.run);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(sched_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = BPF_CORE_READ(parent, tgid);
	__u32 ctgid = BPF_CORE_READ(child, tgid);
	struct run_key k;
	struct scratch *s;

	if (ptgid == ctgid || !run_of(ptgid, &k))
		return 0;
	if (bpf_map_update_elem(&tracked, &ctgid, &k, BPF_ANY)) {
		count_lost(&k);
		return 0;
	}
	s = begin(ROAR_FORK, ctgid);
	if (!s)
		return 0;
	s->ev.ppid = ptgid;
	emit(s, 0, &k);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(sched_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	__u32 tgid = BPF_CORE_READ(p, tgid);
	struct fs_struct *fs;
	struct file *exe;
	struct scratch *s;
	struct run_key k;
	__u64 start, end, n;
	__u32 off, mark;

	if (!run_of(tgid, &k))
		return 0;
	s = begin(ROAR_EXEC, tgid);
	if (!s)
		return 0;
	s->ev.ppid = BPF_CORE_READ(p, real_parent, tgid);
	fs = BPF_CORE_READ(p, fs);
	off = put_dir(s, 0, __builtin_preserve_access_index(&fs->pwd));
	s->ev.len[0] = off;
	mark = off;
	exe = BPF_CORE_READ(bprm, file);
	off = put_dir(s, off, __builtin_preserve_access_index(&exe->f_path));
	s->ev.len[1] = off - mark;
	start = BPF_CORE_READ(p, mm, arg_start);
	end = BPF_CORE_READ(p, mm, arg_end);
	n = end > start ? end - start : 0;
	if (n > ARGV_CAP)
		n = ARGV_CAP; /* argv is kept to its first 4 KiB */
	if (off < DATA_SIZE && n > 0 &&
	    bpf_probe_read_user(&s->data[slot(off)], n, (const void *)start) == 0) {
		s->ev.len[2] = n;
		off += n;
	}
	/* Its standard streams, as (dev, ino) x 3 then a kind byte each (1 regular file, 2 pipe,
	 * FIFO or socket, 0 other: roar_wire::STDIO_LEN): a redirection its parent opened for it is
	 * its file; a pipe between two programs carries data (SEMANTICS.md "Steps"). */
	if (off < DATA_SIZE) {
		struct stdio_ids {
			__u64 ids[6];
			__u8 kinds[3];
		} __attribute__((packed)) st = {};
		int i;

		for (i = 0; i < 3; i++) {
			struct file *f = fd_file(p, i);
			struct inode *ino;
			__u32 mode;

			if (!f)
				continue;
			ino = BPF_CORE_READ(f, f_inode);
			mode = BPF_CORE_READ(ino, i_mode) & S_IFMT;
			if (mode == S_IFREG) {
				st.kinds[i] = 1;
			} else if (mode == S_IFIFO && i == 0) {
				/* A stdin pipe nobody can write to carries nothing (GNU make gives every
				 * parallel recipe but one such a pipe). */
				struct pipe_inode_info *pipe = BPF_CORE_READ(ino, i_pipe);

				if (!pipe || (BPF_CORE_READ(pipe, writers) == 0 &&
					      BPF_CORE_READ(pipe, head) == BPF_CORE_READ(pipe, tail)))
					continue;
				st.kinds[i] = 2;
			} else if (mode == S_IFIFO || mode == S_IFSOCK) {
				st.kinds[i] = 2;
			} else {
				continue;
			}
			st.ids[2 * i] = BPF_CORE_READ(ino, i_sb, s_dev);
			st.ids[2 * i + 1] = BPF_CORE_READ(ino, i_ino);
		}
		__builtin_memcpy(&s->data[slot(off)], &st, sizeof(st));
		s->ev.len[3] = sizeof(st);
		off += sizeof(st);
	}
	emit(s, off, &k);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(sched_exit, struct task_struct *p, bool group_dead)
{
	__u32 tgid = BPF_CORE_READ(p, tgid);
	__u32 tid = BPF_CORE_READ(p, pid);
	struct run_key k;
	struct scratch *s;

	/* Whatever run the thread was in, even one already over: a syscall it died in must not
	 * leave its arguments behind in the (bounded) map. */
	bpf_map_delete_elem(&pending, &tid);
	if (!run_of(tgid, &k) || !group_dead)
		return 0;
	bpf_map_delete_elem(&tracked, &tgid);
	s = begin(ROAR_EXIT, tgid);
	if (s)
		emit(s, 0, &k);
	return 0;
}
