//! The seccomp-bpf program that decides which syscalls of a traced program stop for the tracer.
//!
//! Written here, not with seccompiler: seccompiler's programs begin with an architecture check
//! that kills the process on a mismatch (`SECCOMP_RET_KILL_PROCESS`), and a traced x86_64
//! program may run 32-bit code (`int 0x80`, an i386 binary it execs): roar must let those
//! through untouched (ARCHITECTURE.md, "The program is untouched"). This program allows every
//! other ABI, and the test below runs it through a BPF interpreter on every path.

// The x86_64 syscalls that name or change a file (numbers from libc).
pub const SYS_OPEN: u64 = libc::SYS_open as u64;
pub const SYS_TRUNCATE: u64 = libc::SYS_truncate as u64;
pub const SYS_FTRUNCATE: u64 = libc::SYS_ftruncate as u64;
pub const SYS_RENAME: u64 = libc::SYS_rename as u64;
pub const SYS_MKDIR: u64 = libc::SYS_mkdir as u64;
pub const SYS_RMDIR: u64 = libc::SYS_rmdir as u64;
pub const SYS_CREAT: u64 = libc::SYS_creat as u64;
pub const SYS_LINK: u64 = libc::SYS_link as u64;
pub const SYS_UNLINK: u64 = libc::SYS_unlink as u64;
pub const SYS_SYMLINK: u64 = libc::SYS_symlink as u64;
pub const SYS_OPENAT: u64 = libc::SYS_openat as u64;
pub const SYS_MKDIRAT: u64 = libc::SYS_mkdirat as u64;
pub const SYS_UNLINKAT: u64 = libc::SYS_unlinkat as u64;
pub const SYS_RENAMEAT: u64 = libc::SYS_renameat as u64;
pub const SYS_LINKAT: u64 = libc::SYS_linkat as u64;
pub const SYS_SYMLINKAT: u64 = libc::SYS_symlinkat as u64;
pub const SYS_RENAMEAT2: u64 = libc::SYS_renameat2 as u64;
pub const SYS_IO_URING_SETUP: u64 = libc::SYS_io_uring_setup as u64;
pub const SYS_OPENAT2: u64 = libc::SYS_openat2 as u64;
pub const TRACED_SYSCALLS: [u64; 19] = [
    SYS_OPEN,
    SYS_TRUNCATE,
    SYS_FTRUNCATE,
    SYS_RENAME,
    SYS_MKDIR,
    SYS_RMDIR,
    SYS_CREAT,
    SYS_LINK,
    SYS_UNLINK,
    SYS_OPENAT,
    SYS_MKDIRAT,
    SYS_UNLINKAT,
    SYS_RENAMEAT,
    SYS_LINKAT,
    SYS_RENAMEAT2,
    SYS_OPENAT2,
    SYS_SYMLINK,
    SYS_SYMLINKAT,
    SYS_IO_URING_SETUP,
];

/// `EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE` (linux/audit.h; not in libc).
pub const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
pub const SECCOMP_RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
pub const SECCOMP_RET_TRACE: u32 = libc::SECCOMP_RET_TRACE;

fn bpf(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// `RET_TRACE` for the syscalls above (x86_64 ABI only), `RET_ALLOW` for everything else, and for
/// `open`/`openat` of directories (`O_DIRECTORY`): `find` and `ls -R` open thousands of them and
/// they are never artifacts, so they do not stop the tracee at all.
pub fn filter() -> Vec<libc::sock_filter> {
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let jeq = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    let jset = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    // seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (low 32 bits first on x86_64).
    let arg = |i: u32| 16 + 8 * i;
    let others: Vec<u64> = TRACED_SYSCALLS
        .iter()
        .copied()
        .filter(|nr| *nr != SYS_OPEN && *nr != SYS_OPENAT)
        .collect();
    let m = others.len();
    // Instruction indexes of the jump targets.
    let allow = 5 + m;
    let open_blk = allow + 1;
    let openat_blk = open_blk + 2;
    let allow_dir = openat_blk + 2;
    let trace = allow_dir + 1;
    let off = |from: usize, to: usize| (to - from - 1) as u8;
    let mut prog = vec![
        bpf(ld, 0, 0, 4),
        bpf(jeq, 0, off(1, allow), AUDIT_ARCH_X86_64),
        bpf(ld, 0, 0, 0),
        bpf(jeq, off(3, open_blk), 0, SYS_OPEN as u32),
        bpf(jeq, off(4, openat_blk), 0, SYS_OPENAT as u32),
    ];
    for (i, nr) in others.iter().enumerate() {
        prog.push(bpf(jeq, off(5 + i, trace), 0, *nr as u32));
    }
    prog.push(bpf(ret, 0, 0, SECCOMP_RET_ALLOW));
    prog.push(bpf(ld, 0, 0, arg(1)));
    prog.push(bpf(
        jset,
        off(open_blk + 1, allow_dir),
        off(open_blk + 1, trace),
        libc::O_DIRECTORY as u32,
    ));
    prog.push(bpf(ld, 0, 0, arg(2)));
    prog.push(bpf(
        jset,
        off(openat_blk + 1, allow_dir),
        off(openat_blk + 1, trace),
        libc::O_DIRECTORY as u32,
    ));
    prog.push(bpf(ret, 0, 0, SECCOMP_RET_ALLOW));
    prog.push(bpf(ret, 0, 0, SECCOMP_RET_TRACE));
    debug_assert_eq!(prog.len(), trace + 1);
    prog
}

#[cfg(test)]
mod tests {
    /// Runs a classic-BPF seccomp program (the instructions `filter` uses) on one syscall.
    fn eval(prog: &[libc::sock_filter], arch: u32, nr: u64, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let ins = prog[pc];
            let class = ins.code as u32 & 0x07;
            match class {
                c if c == libc::BPF_LD => {
                    let k = ins.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                    pc += 1;
                }
                c if c == libc::BPF_JMP => {
                    let taken = if ins.code as u32 & 0xf0 == libc::BPF_JSET {
                        acc & ins.k != 0
                    } else {
                        acc == ins.k
                    };
                    pc += 1 + if taken { ins.jt } else { ins.jf } as usize;
                }
                c if c == libc::BPF_RET => return ins.k,
                other => panic!("unexpected instruction class {other}"),
            }
        }
    }

    #[test]
    fn the_filter_traces_file_syscalls_but_not_directory_opens() {
        use super::*;
        let prog = filter();
        let x86 = AUDIT_ARCH_X86_64;
        let dir = libc::O_DIRECTORY as u64;
        let e = [0u64; 6];
        assert_eq!(
            eval(
                &prog,
                x86,
                SYS_OPENAT,
                [0, 0, libc::O_RDONLY as u64, 0, 0, 0]
            ),
            SECCOMP_RET_TRACE
        );
        assert_eq!(
            eval(&prog, x86, SYS_OPENAT, [0, 0, dir, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(
            eval(&prog, x86, SYS_OPEN, [0, libc::O_WRONLY as u64, 0, 0, 0, 0]),
            SECCOMP_RET_TRACE
        );
        assert_eq!(
            eval(&prog, x86, SYS_OPEN, [0, dir, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        for nr in TRACED_SYSCALLS
            .iter()
            .filter(|n| **n != SYS_OPEN && **n != SYS_OPENAT)
        {
            assert_eq!(eval(&prog, x86, *nr, e), SECCOMP_RET_TRACE, "syscall {nr}");
        }
        for nr in [0u64, 1, 3, 59, 60, 231] {
            assert_eq!(eval(&prog, x86, nr, e), SECCOMP_RET_ALLOW, "syscall {nr}");
        }
        assert_eq!(
            eval(&prog, 0x4000_0003, SYS_OPENAT, e),
            SECCOMP_RET_ALLOW,
            "other ABIs pass"
        );
    }
}
