/* The record the eBPF tracer writes to its ring buffer, shared by roar.bpf.c and ebpf.rs.
 *
 * A fixed header, then `len[0..4]` bytes of strings back to back. What each string is depends on
 * the kind (see ebpf.rs `decode`); a directory is sent as its components from the leaf up, each
 * NUL-terminated, and rebuilt in userspace. Little-endian, no padding (every field is aligned). */
#ifndef ROAR_EBPF_H
#define ROAR_EBPF_H

enum roar_kind {
	ROAR_EXEC = 1,
	ROAR_FORK = 2,
	ROAR_EXIT = 3,
	ROAR_OPEN = 4,
	ROAR_RENAME = 5,
	ROAR_LINK = 6,
	ROAR_UNLINK = 7,
	ROAR_TRUNCATE = 8,
	ROAR_SYMLINK = 9,
	ROAR_EXCHANGE = 10,
	/* io_uring_setup succeeded: the process's files may reach no tracer. */
	ROAR_IO_URING = 11,
	/* Directories made and removed: no role, but they tell a directory's rename from a file's. */
	ROAR_MKDIR = 12,
	ROAR_RMDIR = 13,
};

/* Header flags. */
#define ROAR_HAS_STAT 1u
/* A directory walk stopped before reaching the root, or a string was cut: the path is unknown. */
#define ROAR_TRUNCATED 2u

struct roar_event {
	__u32 kind;
	__u32 pid;
	__u32 ppid;
	__s32 open_flags;
	__u64 ts_ns;
	__u64 dev; /* kernel encoding (major << 20 | minor) */
	__u64 ino;
	__u64 size;
	__s64 mtime_ns;
	__s64 ctime_ns;
	__u32 flags;
	__u32 run_gen; /* the generation of the run it is for: a reused ring may hold older records */
	__u32 len[4];
};

#endif
