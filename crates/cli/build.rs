//! Links `roar` as a position-dependent executable with GCC's unwinder inside, and embeds the
//! preload shim.
//!
//! No PIE: a PIE of this size carries ~72,000 relative relocations, which the loader applies at
//! every start (hundreds of copy-on-write page faults, about a millisecond of each `roar run`).
//!
//! The shim (`crates/preload`, a `no_std` cdylib in a workspace of its own) is built here by a
//! nested `cargo build` into this package's OUT_DIR and included in the binary, so a `roar`
//! installed alone (`cargo install --path crates/cli`) still has it: cargo cannot make a build
//! script depend on a cdylib, and `cargo install` installs binaries only. roar prefers a shim
//! installed beside it and writes the embedded one out once when there is none
//! (`crates/cli/src/shim.rs`). `ROAR_EMBED_SHIM=0` builds without it (the binary then needs a
//! shim beside it).
//!
//! Code layout: with the default linker (rust-lld), a release build places the functions a
//! `roar run` executes first and together in .text (`link/symbol-order.txt`, made by
//! `scripts/symbol-order.sh`). The kernel maps 16 pages around each page fault of the binary and
//! unmaps every one of them at exit; scattered, a run's code touched ~170 64 KiB windows, about
//! 6 MB mapped and unmapped per run (bench/NOTES.md, "The fixed cost, cut by cut").

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rustc-link-arg-bins=-no-pie");
    order_symbols();
    static_unwinder();
    println!("cargo:rerun-if-env-changed=ROAR_EMBED_SHIM");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dest = out.join("libroar_preload.so");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let workspace = manifest.join("../..");
    for dir in ["crates/preload", "crates/wire"] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }
    if std::env::var_os("ROAR_EMBED_SHIM").is_some_and(|v| v == "0") {
        std::fs::write(&dest, b"").expect("writing an empty shim placeholder");
    } else {
        let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
        build_shim(&workspace, &out.join("shim-target"), release, &dest);
    }
    // The name the embedded shim is written out under: its content's FNV-1a, computed here so a
    // run does not hash 400 KiB to find the file.
    let bytes = std::fs::read(&dest).expect("reading the shim back");
    let id = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    println!("cargo:rustc-env=ROAR_SHIM_ID={id:016x}");
}

fn build_shim(workspace: &Path, target_dir: &Path, release: bool, dest: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    // The shim's own workspace (crates/preload/Cargo.toml: no_std, panic = "abort"), with its
    // own lock file.
    cmd.arg("build")
        .arg("--locked")
        .arg("--manifest-path")
        .arg(workspace.join("crates/preload/Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    if release {
        cmd.arg("--release");
    }
    // The outer build's settings for this package must not leak into the shim's build.
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if (k.starts_with("CARGO_") && k != "CARGO_HOME" && !k.starts_with("CARGO_REGISTRIES"))
            || k == "RUSTFLAGS"
            || k == "OUT_DIR"
            || k == "TARGET"
            || k == "HOST"
            || k == "PROFILE"
            || k == "OPT_LEVEL"
            || k == "DEBUG"
            || k == "NUM_JOBS"
        {
            cmd.env_remove(&key);
        }
    }
    let status = cmd
        .status()
        .expect("running cargo to build the preload shim");
    assert!(
        status.success(),
        "building the preload shim failed ({status})"
    );
    let built = target_dir
        .join(if release { "release" } else { "debug" })
        .join("libroar_preload.so");
    std::fs::copy(&built, dest).expect("copying the built shim");
}

/// Links GCC's unwinder into the binary (`libgcc_eh.a`, as `gcc -static-libgcc` does) instead of
/// loading `libgcc_s.so` at every start: each shared library costs a roar start ~0.1 ms here
/// (bench/NOTES.md, "Two shared libraries fewer"). std asks for `-lgcc_s` by name, so the name
/// is found first in OUT_DIR, as a linker script that names the static archive. Without a
/// `libgcc_eh.a` (another toolchain), nothing changes.
fn static_unwinder() {
    let target = std::env::var("TARGET").unwrap_or_default();
    if !target.ends_with("-linux-gnu") {
        return;
    }
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let Ok(out) = Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
    else {
        return;
    };
    let archive = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    // An unknown file is printed back as its bare name.
    if !out.status.success() || !archive.is_absolute() || !archive.is_file() {
        return;
    }
    let dir =
        PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("unwind");
    std::fs::create_dir_all(&dir).expect("creating OUT_DIR/unwind");
    std::fs::write(
        dir.join("libgcc_s.so"),
        format!("INPUT({})\n", archive.display()),
    )
    .expect("writing the unwinder's linker script");
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rerun-if-env-changed=CC");
}

/// Hands the symbol order to the linker when it is rust-lld, the default on x86_64 Linux since
/// Rust 1.90: GNU ld has no such option, so a build told to use another linker goes without.
fn order_symbols() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let order = manifest.join("link/symbol-order.txt");
    println!("cargo:rerun-if-changed={}", order.display());
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let target = std::env::var("TARGET").unwrap_or_default();
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    // Any linker setting in the flags (-C linker, linker-flavor, linker-features,
    // link-self-contained) may mean another linker.
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let default_linker = std::env::var_os("RUSTC_LINKER").is_none() && !flags.contains("link");
    if target == "x86_64-unknown-linux-gnu" && release && default_linker && order.is_file() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        // Names a later build no longer has are skipped: a stale order costs layout, not a link.
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}
