//! The oracle of the differential tests: what `strace -ff` sees a bare command do (no roar),
//! read through an independent model of docs/SEMANTICS.md's rules (tests/data/strace_model.py,
//! which shares no code with roar).

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use super::stderr;

/// The calls the model reads.
const CALLS: &str = "trace=open,openat,creat,rename,renameat,renameat2,link,linkat,symlink,symlinkat,unlink,unlinkat,mkdir,mkdirat,truncate,ftruncate";

/// What the model says of `argv` run bare in `dir` (laid out as it is before the command):
/// `[(role, path relative to dir)]` of the files under `dir`, sorted.
pub fn record(dir: &Path, argv: &[&OsStr]) -> Vec<(String, String)> {
    let dir = std::fs::canonicalize(dir).unwrap();
    let mut pre = Vec::new();
    files_below(&dir, &dir, &mut pre);
    pre.sort();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("log");
    let st = Command::new("strace")
        // --seccomp-bpf: only the calls traced stop the program (a Python start makes thousands
        // of others): the generator's oracle in half the time.
        .args([
            "-ff",
            "--seccomp-bpf",
            "-ttt",
            "-y",
            "-qq",
            "-e",
            CALLS,
            "-o",
        ])
        .arg(&log)
        .args(argv)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(st.status.success(), "strace {argv:?}: {}", stderr(&st));
    let logs: Vec<std::path::PathBuf> = std::fs::read_dir(logs.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/strace_model.py");
    let out = Command::new("python3")
        .arg(&model)
        .arg(&dir)
        .arg(pre.join(","))
        .args(&logs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "strace model {argv:?}: {}",
        stderr(&out)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The files (not directories) below `at`, as paths relative to `root`.
fn files_below(root: &Path, at: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(at).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            files_below(root, &e.path(), out);
        } else {
            let rel = e.path().strip_prefix(root).unwrap().to_owned();
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}
