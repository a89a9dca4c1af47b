//! The machine: CPU, memory, kernel, OS, container and hypervisor, GPUs. Read from /proc, /sys
//! and /etc under a root directory (`/`, or a fake tree in tests); probed once per boot (the
//! store keeps the last probe with its boot id).

use std::path::Path;
use std::process::{Command, Stdio};

use roar_store::{Gpu, Runtime};

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
pub fn boot_id() -> Option<String> {
    read("/", "proc/sys/kernel/random/boot_id")
}

/// The machine's name (this UTS namespace's): uname(2), one syscall where
/// /proc/sys/kernel/hostname is four. None if it is empty.
pub fn hostname() -> Option<String> {
    let u = nix::sys::utsname::uname().ok()?;
    let name = u.nodename().to_string_lossy().trim().to_owned();
    (!name.is_empty()).then_some(name)
}

fn read(root: impl AsRef<Path>, rel: &str) -> Option<String> {
    let s = std::fs::read_to_string(root.as_ref().join(rel)).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

/// Probes the machine under `root`. `nvidia_smi`: ask `nvidia-smi` for the CUDA version when the
/// NVIDIA driver is loaded.
pub fn probe(root: &Path, nvidia_smi: bool) -> Runtime {
    let cpuinfo = read(root, "proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_owned())
        })
    };
    let cpu_model = field("model name")
        .or_else(|| field("Model"))
        .or_else(|| field("Hardware"));
    let hypervisor_flag = field("flags").is_some_and(|f| f.split(' ').any(|x| x == "hypervisor"));
    Runtime {
        hostname: read(root, "proc/sys/kernel/hostname"),
        cpu_model,
        cpus: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        memory_bytes: memory(root),
        kernel: read(root, "proc/sys/kernel/osrelease"),
        os: os_release(root),
        arch: Some(std::env::consts::ARCH.to_owned()),
        container: container(root),
        virtualization: hypervisor_flag.then(|| hypervisor(root)),
        gpus: gpus(root, nvidia_smi),
    }
}

/// MemTotal, or the cgroup's memory limit when it is lower (a container's real budget).
fn memory(root: &Path) -> Option<u64> {
    let meminfo = read(root, "proc/meminfo")?;
    let total = meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemTotal:")?;
        rest.trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .ok()
    })? * 1024;
    let limit = read(root, "sys/fs/cgroup/memory.max").and_then(|s| s.parse::<u64>().ok());
    Some(limit.map_or(total, |l| l.min(total)))
}

fn os_release(root: &Path) -> Option<String> {
    let text = read(root, "etc/os-release").or_else(|| read(root, "usr/lib/os-release"))?;
    let get = |key: &str| {
        text.lines().find_map(|l| {
            let v = l.strip_prefix(key)?.strip_prefix('=')?;
            Some(v.trim_matches('"').to_owned())
        })
    };
    get("PRETTY_NAME").or_else(|| get("NAME"))
}

fn container(root: &Path) -> Option<String> {
    if root.join(".dockerenv").exists() {
        return Some("docker".into());
    }
    if root.join("run/.containerenv").exists() {
        return Some("podman".into());
    }
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return Some("kubernetes".into());
    }
    // systemd-nspawn, lxc and others announce themselves in pid 1's environment.
    if let Ok(environ) = std::fs::read(root.join("proc/1/environ")) {
        for var in environ.split(|b| *b == 0) {
            if let Some(v) = var.strip_prefix(b"container=") {
                return Some(String::from_utf8_lossy(v).into_owned());
            }
        }
    }
    let cgroup = read(root, "proc/1/cgroup").unwrap_or_default();
    ["kubepods", "docker", "lxc", "containerd"]
        .into_iter()
        .find(|k| cgroup.contains(k))
        .map(str::to_owned)
}

/// The hypervisor's vendor as firmware names it (the CPU said it runs under one).
fn hypervisor(root: &Path) -> String {
    let vendor = read(root, "sys/class/dmi/id/sys_vendor").unwrap_or_default();
    let product = read(root, "sys/class/dmi/id/product_name").unwrap_or_default();
    let both = format!("{vendor} {product}").to_ascii_lowercase();
    for (needle, name) in [
        ("kvm", "kvm"),
        ("qemu", "qemu"),
        ("vmware", "vmware"),
        ("virtualbox", "virtualbox"),
        ("microsoft", "microsoft"),
        ("xen", "xen"),
        ("amazon", "amazon"),
        ("google", "google"),
        ("firecracker", "firecracker"),
    ] {
        if both.contains(needle) {
            return name.into();
        }
    }
    if both.trim().is_empty() {
        "unknown".into()
    } else {
        both.trim().to_owned()
    }
}

/// NVIDIA GPUs from the driver's /proc tree (model and bus per GPU, driver version), and the
/// CUDA version `nvidia-smi` reports. Nothing when the driver is not loaded.
pub fn gpus(root: &Path, nvidia_smi: bool) -> Vec<Gpu> {
    let base = root.join("proc/driver/nvidia");
    let Ok(entries) = std::fs::read_dir(base.join("gpus")) else {
        return Vec::new();
    };
    let driver = read(&base, "version").and_then(|v| {
        // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 ..."
        let line = v.lines().next()?.to_owned();
        line.split_whitespace()
            .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
            .map(str::to_owned)
    });
    let cuda = if nvidia_smi { cuda_version() } else { None };
    let mut out: Vec<Gpu> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let info = std::fs::read_to_string(e.path().join("information")).ok()?;
            let model = info.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "Model").then(|| v.trim().to_owned())
            })?;
            Some(Gpu {
                model,
                driver: driver.clone(),
                cuda: cuda.clone(),
                bus: Some(e.file_name().to_string_lossy().into_owned()),
            })
        })
        .collect();
    out.sort_by(|a, b| a.bus.cmp(&b.bus));
    out
}

/// "CUDA Version: 12.2" from the header `nvidia-smi` prints.
fn cuda_version() -> Option<String> {
    let out = Command::new("nvidia-smi")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    parse_cuda(&String::from_utf8_lossy(&out.stdout))
}

pub(crate) fn parse_cuda(text: &str) -> Option<String> {
    let i = text.find("CUDA Version:")?;
    let v = text[i + "CUDA Version:".len()..]
        .split_whitespace()
        .next()?;
    Some(v.trim_end_matches('|').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn nvidia_tree_is_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            "proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version:  gcc version 12.2.0\n",
        );
        write(
            root,
            "proc/driver/nvidia/gpus/0000:3b:00.0/information",
            "Model: \t\t NVIDIA A100-SXM4-80GB\nIRQ:   \t\t 80\nGPU UUID: \t GPU-1\nVideo BIOS: \t 92.00.36.00.01\nBus Type: \t PCIe\n",
        );
        write(
            root,
            "proc/driver/nvidia/gpus/0000:07:00.0/information",
            "Model: \t\t Tesla T4\nIRQ:   \t\t 81\n",
        );
        let g = gpus(root, false);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].model, "Tesla T4");
        assert_eq!(g[0].bus.as_deref(), Some("0000:07:00.0"));
        assert_eq!(g[1].model, "NVIDIA A100-SXM4-80GB");
        assert_eq!(g[1].driver.as_deref(), Some("535.104.05"));
        assert_eq!(g[1].cuda, None);
    }

    #[test]
    fn no_driver_no_gpus() {
        let dir = tempfile::tempdir().unwrap();
        assert!(gpus(dir.path(), true).is_empty());
        assert!(probe(dir.path(), true).gpus.is_empty());
    }

    #[test]
    fn cuda_from_nvidia_smi_header() {
        let header =
            "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |";
        assert_eq!(parse_cuda(header).as_deref(), Some("12.2"));
        assert_eq!(parse_cuda("no gpu"), None);
    }

    #[test]
    fn machine_fields_from_a_fake_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            "proc/cpuinfo",
            "processor\t: 0\nmodel name\t: Test CPU @ 2.00GHz\nflags\t\t: fpu hypervisor sse\n",
        );
        write(
            root,
            "proc/meminfo",
            "MemTotal:       24576000 kB\nMemFree: 1 kB\n",
        );
        write(root, "sys/fs/cgroup/memory.max", "1073741824\n");
        write(
            root,
            "etc/os-release",
            "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
        );
        write(root, "sys/class/dmi/id/sys_vendor", "QEMU\n");
        write(root, ".dockerenv", "");
        let rt = probe(root, false);
        assert_eq!(rt.cpu_model.as_deref(), Some("Test CPU @ 2.00GHz"));
        assert_eq!(rt.memory_bytes, Some(1 << 30));
        assert_eq!(rt.os.as_deref(), Some("Debian GNU/Linux 12 (bookworm)"));
        assert_eq!(rt.virtualization.as_deref(), Some("qemu"));
        assert_eq!(rt.container.as_deref(), Some("docker"));
    }
}
