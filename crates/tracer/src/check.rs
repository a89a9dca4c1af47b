//! The deterministic preflight: for each backend, whether it will work here and why not, and the
//! rule `--tracer auto` follows.
//!
//! auto: preload for dynamically linked programs (cheapest per run: no load, no stop). For a
//! statically linked or setuid/setgid program (the dynamic loader would not load the shim): eBPF
//! when its preflight passes (no stop per file), else ptrace.
#![allow(unsafe_code)]

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Preload,
    Ptrace,
    Ebpf,
}

impl Backend {
    pub const ALL: [Backend; 3] = [Backend::Preload, Backend::Ptrace, Backend::Ebpf];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Preload => "preload",
            Backend::Ptrace => "ptrace",
            Backend::Ebpf => "ebpf",
        }
    }

    pub fn parse(s: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == s)
    }
}

#[derive(Debug, Clone)]
pub struct Verdict {
    pub backend: Backend,
    pub ok: bool,
    pub reason: String,
}

/// Whether `backend` can run here, without loading the eBPF programs (`roar run`'s preflight: a
/// failed load is reported by the run itself, before anything starts).
pub fn quick_check(backend: Backend, preload_lib: Option<&Path>) -> Verdict {
    match backend {
        Backend::Ebpf => {
            let blocker = ebpf_blocker();
            Verdict {
                backend,
                ok: blocker.is_none(),
                reason: blocker.unwrap_or_else(|| "eBPF prerequisites present".into()),
            }
        }
        other => check(other, preload_lib),
    }
}

/// Whether `backend` can run on this machine (independent of the command). For eBPF this loads
/// and attaches the programs once.
pub fn check(backend: Backend, preload_lib: Option<&Path>) -> Verdict {
    let (ok, reason) = match backend {
        Backend::Preload => match preload_lib {
            Some(lib) if lib.is_file() => (true, format!("shim at {}", lib.display())),
            Some(lib) => (
                false,
                format!(
                    "shim {} does not exist; build it with `cargo build --release`",
                    lib.display()
                ),
            ),
            None => (
                false,
                "libroar_preload.so not found next to the roar binary; set ROAR_PRELOAD_LIB".into(),
            ),
        },
        Backend::Ptrace => ptrace_verdict(),
        Backend::Ebpf => match ebpf_blocker() {
            Some(reason) => (false, reason),
            None => match crate::ebpf::probe() {
                Ok(took) => (
                    true,
                    format!(
                        "BTF raw tracepoints load and attach ({:.0} ms)",
                        took.as_secs_f64() * 1e3
                    ),
                ),
                Err(e) => (false, e.reason()),
            },
        },
    };
    Verdict {
        backend,
        ok,
        reason,
    }
}

/// Effective capabilities of this process, from /proc/self/status.
#[cfg(feature = "ebpf")]
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("CapEff:")
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            })
        })
        .unwrap_or(0)
}

/// Why eBPF cannot work here, from what the system says without loading anything.
fn ebpf_blocker() -> Option<String> {
    #[cfg(not(feature = "ebpf"))]
    return Some(crate::ebpf::ABSENT.into());
    #[cfg(feature = "ebpf")]
    ebpf_blocker_here()
}

#[cfg(feature = "ebpf")]
fn ebpf_blocker_here() -> Option<String> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    if !cfg!(target_arch = "x86_64") {
        return Some("the BPF programs read x86_64 syscall registers only".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some(
            "the kernel has no BTF (/sys/kernel/btf/vmlinux; needs CONFIG_DEBUG_INFO_BTF=y)".into(),
        );
    }
    let caps = effective_caps();
    let has = |c: u32| caps & (1 << c) != 0;
    if !(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))) {
        return Some(
            "needs CAP_BPF and CAP_PERFMON, or root (tracing programs are never allowed unprivileged)".into(),
        );
    }
    if let Ok(l) = std::fs::read_to_string("/sys/kernel/security/lockdown") {
        if l.contains("[confidentiality]") {
            return Some(
                "the kernel is locked down (confidentiality): BPF may not read kernel memory"
                    .into(),
            );
        }
    }
    None
}

fn ptrace_verdict() -> (bool, String) {
    if !cfg!(target_arch = "x86_64") {
        return (
            false,
            "the seccomp filter is written for x86_64 only".into(),
        );
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let tracer = status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .map(str::trim)
        .filter(|p| *p != "0");
    if let Some(pid) = tracer {
        // A tracee's children are its tracer's (PTRACE_O_TRACEFORK): they cannot be traced again.
        return (
            false,
            format!("roar is itself being traced (by pid {pid}: an outer `roar run --tracer ptrace`, strace or a debugger), and a traced process's children cannot be traced again; use --tracer preload or ebpf"),
        );
    }
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Ok(s) if s.trim() == "3" => (false, "kernel.yama.ptrace_scope=3 forbids ptrace".into()),
        _ => match std::fs::read_to_string("/proc/self/status") {
            Ok(s)
                if s.lines()
                    .any(|l| l.starts_with("Seccomp:") && l.trim_end().ends_with('2')) =>
            {
                (true, "seccomp filter stacking on an existing filter".into())
            }
            _ => (
                true,
                "PTRACE_O_TRACESECCOMP with a seccomp-bpf filter".into(),
            ),
        },
    }
}

/// What kind of program `exe` is, as far as the dynamic loader is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linkage {
    Dynamic,
    Static,
    SetId,
    /// A script (`#!`) or anything not ELF: its interpreter decides, assumed dynamic.
    Other,
}

pub fn linkage(exe: &Path) -> Linkage {
    let Ok(meta) = std::fs::metadata(exe) else {
        return Linkage::Other;
    };
    // The loader runs a program in secure mode (and ignores LD_PRELOAD) when exec gives it
    // another user or group id: setuid to another owner, setgid (with group exec) to another group.
    use std::os::unix::fs::MetadataExt;
    let mode = meta.mode();
    // SAFETY: no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if (mode & 0o4000 != 0 && meta.uid() != uid) || (mode & 0o2010 == 0o2010 && meta.gid() != gid) {
        return Linkage::SetId;
    }
    let mut head = [0u8; 64];
    let Ok(mut f) = std::fs::File::open(exe) else {
        return Linkage::Other;
    };
    if f.read_exact(&mut head).is_err() || &head[..4] != b"\x7fELF" || head[4] != 2 {
        return Linkage::Other;
    }
    // ELF64: program headers at e_phoff (0x20), e_phentsize at 0x36, e_phnum at 0x38.
    let phoff = u64::from_le_bytes(head[0x20..0x28].try_into().expect("8 bytes"));
    let phentsize = u16::from_le_bytes([head[0x36], head[0x37]]) as u64;
    let phnum = u16::from_le_bytes([head[0x38], head[0x39]]) as u64;
    let mut table = vec![0u8; (phentsize * phnum) as usize];
    use std::io::{Seek, SeekFrom};
    if f.seek(SeekFrom::Start(phoff)).is_err() || f.read_exact(&mut table).is_err() {
        return Linkage::Other;
    }
    const PT_INTERP: u32 = 3;
    let has_interp = table
        .chunks(phentsize.max(4) as usize)
        .any(|ph| u32::from_le_bytes(ph[..4].try_into().expect("4 bytes")) == PT_INTERP);
    if has_interp {
        Linkage::Dynamic
    } else {
        Linkage::Static
    }
}

/// Resolves a command name through PATH as execvp would.
pub fn resolve(cmd: &OsStr) -> Option<PathBuf> {
    let p = Path::new(cmd);
    if p.components().count() > 1 {
        return Some(p.to_owned());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(cmd))
        .find(|c| {
            c.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether this process runs inside a job traced by `roar run --tracer preload` (the outer run's
/// shim put its event socket in the environment).
pub fn inside_preload_run() -> bool {
    std::env::var_os(roar_wire::SOCK_ENV).is_some_and(|v| !v.is_empty())
}

/// The backend `auto` picks for `cmd`, with the reason.
pub fn choose(cmd: &OsStr, preload_lib: Option<&Path>) -> (Backend, String) {
    let exe = resolve(cmd);
    let link = exe.as_deref().map(linkage).unwrap_or(Linkage::Other);
    let preload = check(Backend::Preload, preload_lib);
    let no_preload = |why: &str| match ebpf_blocker() {
        None => (Backend::Ebpf, why.to_owned()),
        Some(blocker) => (Backend::Ptrace, format!("{why}; eBPF: {blocker}")),
    };
    match link {
        Linkage::Static => no_preload("static binary: the preload shim cannot load"),
        Linkage::SetId => no_preload("setuid/setgid binary: the loader drops LD_PRELOAD"),
        // Nested in a `roar run` that traces with preload: the command inherits the outer run's
        // shim, and a shim of ours would take its events away from the outer job. A backend
        // that does not touch the command's environment leaves the outer shim reporting to the
        // outer run, so both jobs are complete.
        _ if inside_preload_run() => match ptrace_verdict() {
            (true, _) => (
                Backend::Ptrace,
                "inside a preload-traced `roar run`: its shim keeps reporting to the outer job"
                    .into(),
            ),
            (false, why) => no_preload(&format!(
                "inside a preload-traced `roar run` (ptrace: {why})"
            )),
        },
        _ if !preload.ok => (
            Backend::Ptrace,
            format!("preload unavailable: {}", preload.reason),
        ),
        _ => (Backend::Preload, "dynamically linked program".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_dynamic_binaries_and_scripts() {
        assert_eq!(linkage(Path::new("/bin/sh")), Linkage::Dynamic);
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("s.sh");
        std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
        assert_eq!(linkage(&script), Linkage::Other);
    }
}
