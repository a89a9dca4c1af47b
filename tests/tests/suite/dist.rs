//! What a user installs without a compiler (`scripts/dist.sh`): the wheel into a fresh venv, the
//! Debian package into a fresh root, each then recording a `roar run` and a `roar mount` and
//! answering `roar show`; and the lean build (no eBPF: no clang, no libelf) saying what it lacks.
//!
//! The artifacts come from `ROAR_DIST_DIR` (scripts/test.sh builds them), the lean binary from
//! `ROAR_LEAN_BIN`; without them these tests skip loudly, and fail under CI=true.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{stderr, stdout};

/// `ROAR_DIST_DIR`'s file whose name starts with `prefix` and ends with `suffix`.
fn artifact(prefix: &str, suffix: &str) -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("ROAR_DIST_DIR") else {
        common::skip("ROAR_DIST_DIR is not set (scripts/test.sh builds the packages)");
        return None;
    };
    let found = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("ROAR_DIST_DIR {dir:?}: {e}"))
        .map(|e| e.unwrap().path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(prefix) && name.ends_with(suffix)
        });
    Some(found.unwrap_or_else(|| panic!("no {prefix}*{suffix} in {dir:?}")))
}

fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", stderr(&out));
    stdout(&out)
}

/// The highest `GLIBC_2.N` symbol version `files` ask for: N.
fn glibc_needed(files: &[&Path]) -> u32 {
    let text = ok(Command::new("objdump").arg("-T").args(files));
    text.split("GLIBC_2.")
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .max()
        .expect("a dynamically linked binary asks for some GLIBC_ version")
}

/// An installed `roar` (with `home` as HOME, so nothing it writes there goes unnoticed) records
/// a run and a mount and answers `show`; its shim is `shim`, installed beside it.
fn records_with(roar: &Path, shim: &Path, home: &Path) {
    let roar_cmd = |dir: &Path| {
        let mut c = Command::new(roar);
        c.current_dir(dir)
            .env("HOME", home)
            .env_remove("ROAR_PRELOAD_LIB");
        c
    };
    let version = ok(roar_cmd(home).arg("--version"));
    let says = format!("preload shim: {} (installed)", shim.display());
    assert!(version.contains(&says), "{version}");

    let project = tempfile::tempdir().unwrap();
    let p = project.path();
    ok(roar_cmd(p).arg("init"));
    std::fs::write(p.join("in.txt"), "hello\n").unwrap();
    ok(roar_cmd(p).args(["run", "--", "sh", "-c", "tr a-z A-Z < in.txt > out.txt"]));
    let inputs = ok(roar_cmd(p).args(["inputs", "out.txt"]));
    let want = blake3::hash(b"hello\n").to_hex().to_string();
    assert_eq!(inputs.trim(), format!("{want}  in.txt"), "{inputs}");
    let made = ok(roar_cmd(p).args(["show", "out.txt"]));
    let out_hash = blake3::hash(b"HELLO\n").to_hex().to_string();
    assert!(
        made.contains(&out_hash[..12]) && made.contains("output job 1"),
        "{made}"
    );

    if !Path::new("/dev/fuse").exists() {
        common::skip("the installed roar's mount: no /dev/fuse");
    } else {
        std::fs::create_dir(p.join("data")).unwrap();
        ok(roar_cmd(p).args(["mount", "data"]));
        let wrote = Command::new("sh")
            .args(["-c", "echo mounted > data/m.txt"])
            .current_dir(p)
            .status();
        let unmounted = roar_cmd(p).args(["unmount", "data"]).output().unwrap();
        assert!(wrote.unwrap().success());
        assert!(unmounted.status.success(), "{}", stderr(&unmounted));
        let shown = ok(roar_cmd(p).args(["show", "data/m.txt"]));
        let m_hash = blake3::hash(b"mounted\n").to_hex().to_string();
        assert!(
            shown.contains(&m_hash[..12]) && shown.contains("output job 2"),
            "{shown}"
        );
    }
    // The shim was found where it was installed: no copy written out at run time.
    let cached: Vec<_> = std::fs::read_dir(home.join(".cache/roar"))
        .into_iter()
        .flatten()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("libroar_preload"))
        .collect();
    assert!(
        cached.is_empty(),
        "a shim was written to the cache: {cached:?}"
    );
}

#[test]
fn the_wheel_installs_into_a_fresh_venv_and_its_roar_records() {
    let Some(wheel) = artifact("roar-", ".whl") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let venv = tmp.path().join("venv");
    ok(Command::new("python3").arg("-m").arg("venv").arg(&venv));
    ok(Command::new(venv.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .arg(&wheel));
    let (roar, shim) = (
        venv.join("bin/roar"),
        venv.join("lib/roar/libroar_preload.so"),
    );
    for f in [
        "share/man/man1/roar.1",
        "share/bash-completion/completions/roar",
    ] {
        assert!(venv.join(f).is_file(), "the wheel did not install {f}");
    }
    // Tagged with the oldest glibc both the binary and the shim run on.
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    let tag = format!("manylinux_2_{}_x86_64.whl", glibc_needed(&[&roar, &shim]));
    assert!(name.ends_with(&tag), "{name} is not tagged {tag}");
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    records_with(&roar, &shim, &home);
}

#[test]
fn the_debian_package_installs_into_a_fresh_root_and_its_roar_records() {
    let Some(deb) = artifact("roar_", "_amd64.deb") else {
        return;
    };
    let control = ok(Command::new("dpkg-deb").arg("-f").arg(&deb).arg("Depends"));
    assert!(control.starts_with("libc6 (>= 2."), "{control}");
    // apt takes it as it is (what `apt install ./roar_*.deb` does, without doing it).
    let sim = ok(Command::new("apt-get")
        .args(["install", "--simulate", "-q"])
        .arg(&deb));
    assert!(sim.contains("Inst roar"), "{sim}");

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let admin = root.join("var/lib/dpkg");
    for d in ["info", "updates"] {
        std::fs::create_dir_all(admin.join(d)).unwrap();
    }
    std::fs::write(admin.join("status"), "").unwrap();
    // An empty root has no libc6 package to depend on; the host's libc is the one that runs it.
    let dpkg = |args: &[&str]| {
        let mut c = Command::new("dpkg");
        c.arg(format!("--root={}", root.display()))
            .arg("--force-depends")
            .args(args);
        c
    };
    ok(dpkg(&["-i"]).arg(&deb));
    let listed = ok(&mut dpkg(&["-L", "roar"]));
    for f in [
        "/usr/bin/roar",
        "/usr/lib/roar/libroar_preload.so",
        "/usr/share/man/man1/roar.1.gz",
        "/usr/share/bash-completion/completions/roar",
        "/usr/share/zsh/vendor-completions/_roar",
        "/usr/share/fish/vendor_completions.d/roar.fish",
    ] {
        assert!(
            listed.lines().any(|l| l == f),
            "{f} not in the package:\n{listed}"
        );
    }
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let roar = root.join("usr/bin/roar");
    records_with(&roar, &root.join("usr/lib/roar/libroar_preload.so"), &home);
    // Removed, it leaves nothing of its own behind.
    ok(&mut dpkg(&["-r", "roar"]));
    assert!(!roar.exists() && !root.join("usr/lib/roar").exists());
}

#[test]
fn the_lean_build_has_no_ebpf_and_says_so() {
    let Some(lean) = std::env::var_os("ROAR_LEAN_BIN") else {
        common::skip("ROAR_LEAN_BIN is not set (scripts/test.sh builds it)");
        return;
    };
    // Nothing that needs clang or libelf is in its dependency tree.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let tree = |lean: bool| {
        let mut c = Command::new(&cargo);
        c.args([
            "tree",
            "--offline",
            "--locked",
            "-p",
            "roar-cli",
            "-e",
            "normal,build",
        ])
        .args(["--prefix", "none"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
        if lean {
            c.arg("--no-default-features");
        }
        ok(&mut c)
    };
    assert!(tree(false).contains("libbpf-sys"));
    let lean_tree = tree(true);
    assert!(!lean_tree.contains("libbpf"), "{lean_tree}");

    let version = ok(Command::new(&lean).arg("--version"));
    assert!(
        version.contains("eBPF programs: none (a lean build"),
        "{version}"
    );
    let check = Command::new(&lean)
        .args(["tracer", "check", "ebpf"])
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(1));
    assert!(
        stdout(&check).contains("this roar was built without eBPF"),
        "{}",
        stdout(&check)
    );
    // Asked for by name, it stops before the command runs, in one line; `auto` passes over it.
    let p = common::Project::new();
    let refused = Command::new(&lean)
        .args(["run", "--tracer", "ebpf", "--", "touch", "made"])
        .current_dir(p.path())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(stderr(&refused).lines().count(), 1, "{}", stderr(&refused));
    assert!(stderr(&refused).contains("built without eBPF"));
    assert!(!p.path().join("made").exists());
    let auto = Command::new(&lean)
        .args(["run", "--tracer", "auto", "--", "touch", "made"])
        .current_dir(p.path())
        .output()
        .unwrap();
    assert!(auto.status.success(), "{}", stderr(&auto));
    assert!(p.path().join("made").exists());
}
