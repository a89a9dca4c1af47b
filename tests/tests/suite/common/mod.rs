//! Helpers shared by the integration tests: find the built `roar`, make projects, run commands.
#![allow(dead_code)]

pub mod mount;
pub mod postgres;
pub mod server;
pub mod strace;
pub mod workloads;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `roar` binary cargo built next to this test executable.
pub fn roar_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let bin = dir.join("roar");
    assert!(
        bin.is_file(),
        "{} is missing: run the tests with `cargo test --workspace` so the roar binary is built",
        bin.display()
    );
    bin
}

/// Copies an executable by `cp`, not from this process: a file this (many-threaded) test process
/// holds open for writing is inherited by whatever another test forks meanwhile, and exec of it
/// fails with ETXTBSY until that child execs in turn.
pub fn copy_executable(from: &Path, to: &Path) {
    let o = Command::new("cp").arg(from).arg(to).output().unwrap();
    assert!(o.status.success(), "cp: {}", stderr(&o));
}

/// A small deterministic generator (xorshift), so a failing sequence can be replayed from its
/// seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    /// A fresh directory with `roar init` done.
    pub fn new() -> Project {
        let dir = tempfile::Builder::new()
            .prefix("roar-it-")
            .tempdir()
            .unwrap();
        let p = Project { dir };
        let out = p.roar(["init"]);
        assert!(out.status.success(), "roar init failed: {}", stderr(&out));
        p
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn cmd<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = Command::new(roar_bin());
        c.args(args)
            .current_dir(self.path())
            .env("NO_COLOR", "1")
            // eBPF helpers started by the tests exit soon after the last one.
            .env("ROAR_EBPF_IDLE_SECS", "10")
            // So do the stores' resident recorders (or when the test's directory goes).
            .env("ROAR_RECORDER_IDLE_SECS", "10")
            .env_remove("ROAR_DIR");
        c
    }

    pub fn roar<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd(args).output().unwrap()
    }

    pub fn write(&self, rel: &str, content: &[u8]) {
        let p = self.path().join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(p, content).unwrap();
    }

    /// `roar show ID --json` parsed.
    pub fn job_json(&self, id: i64) -> serde_json::Value {
        let out = self.roar(["show", &id.to_string(), "--json"]);
        assert!(out.status.success(), "show {id}: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Appends `text` to the project's `.roar/config.toml`.
    pub fn append_config(&self, text: &str) {
        let config = self.path().join(".roar/config.toml");
        let mut all = std::fs::read_to_string(&config).unwrap();
        all.push_str(text);
        std::fs::write(&config, all).unwrap();
    }

    /// `roar run --tracer BACKEND -- ARGV` in the project; it must succeed.
    pub fn run_under(&self, backend: &str, argv: &[&str]) {
        let o = self
            .cmd(["run", "--tracer", backend, "--"])
            .args(argv)
            .output()
            .unwrap();
        assert!(o.status.success(), "{backend} {argv:?}: {}", stderr(&o));
    }

    pub fn last_job(&self) -> serde_json::Value {
        let out = self.roar(["log", "--json", "-n", "1"]);
        let log: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let id = log[0]["id"].as_i64().expect("a job was recorded");
        self.job_json(id)
    }

    /// Paths (relative to the project) of the job's files with `role`, sorted.
    pub fn files(&self, job: &serde_json::Value, role: &str) -> Vec<String> {
        files_under(job, role, &std::fs::canonicalize(self.path()).unwrap())
    }
}

/// Paths (relative to `base` when below it) of the job's files with `role`, sorted.
pub fn files_under(job: &serde_json::Value, role: &str, base: &Path) -> Vec<String> {
    let mut v: Vec<String> = job["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["role"] == role)
        .map(|f| {
            let p = f["path"].as_str().unwrap();
            Path::new(p)
                .strip_prefix(base)
                .map(|r| r.to_string_lossy().into_owned())
                .unwrap_or_else(|_| p.to_owned())
        })
        .collect();
    v.sort();
    v
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A port nothing listens on at the moment (for a server a test starts on 127.0.0.1).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// True when a missing capability must fail the test (CI) instead of skipping it.
pub fn strict() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// What this test cannot do here (`why` names the capability): under CI=true a failure; else
/// said on stderr and listed in the file `ROAR_SKIPPED` names (scripts/test.sh sets it), so the
/// suite's summary counts the test as having skipped something instead of as a plain pass
/// (libtest has no skip decided at run time). The caller then returns, or leaves out the part.
pub fn skip(why: &str) {
    assert!(!strict(), "required under CI=true: {why}");
    eprintln!("SKIPPED: {why}");
    let Some(log) = std::env::var_os("ROAR_SKIPPED") else {
        return;
    };
    // libtest names each test's thread after the test; the binary says which file it is in.
    let binary = std::env::current_exe()
        .ok()
        .and_then(|e| e.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| {
            s.rsplit_once('-')
                .map_or(s.clone(), |(name, _)| name.to_owned())
        })
        .unwrap_or_default();
    let test = std::thread::current().name().unwrap_or("?").to_owned();
    let line = format!("{binary}::{test}\t{}\n", why.replace(['\t', '\n'], " "));
    use std::io::Write;
    // One append per line: lines of tests running at once never interleave.
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Whether the eBPF backend works here (`roar tracer check ebpf` loads it for real); skips loudly
/// when not, and fails under CI=true, where we run as root on a kernel that has it.
pub fn ebpf_available() -> bool {
    let out = Command::new(roar_bin())
        .args(["tracer", "check", "ebpf", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    if v[0]["ok"] == true {
        return true;
    }
    let reason = v[0]["reason"].as_str().unwrap_or("no verdict").to_owned();
    skip(&format!("the eBPF backend: {reason}"));
    false
}

/// Every backend that can run here: eBPF only where it loads (always under CI=true).
pub fn backends() -> Vec<&'static str> {
    let mut b = vec!["preload", "ptrace"];
    if ebpf_available() {
        b.push("ebpf");
    }
    b
}

/// `roar run --tracer BACKEND -- touch made` with `var=value` set must fail with one line
/// containing `says`, before the command runs.
pub fn assert_refused_before_running(backend: &str, var: &str, value: &str, says: &str) {
    let p = Project::new();
    let out = p
        .cmd(["run", "--tracer", backend, "--", "touch", "made"])
        .env(var, value)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(says), "{err}");
    assert!(!p.path().join("made").exists());
}

/// Whether this test can run something as another user (`setpriv` as root, as in CI); skips
/// loudly with `why` otherwise, and fails under CI=true.
pub fn can_switch_user(why: &str) -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n");
    if !root || !require_tool("setpriv") {
        skip(why);
        return false;
    }
    true
}

/// Skips (loudly) or fails (under CI=true) when `tool` is not installed.
pub fn require_tool(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        skip(&format!(
            "{tool} is not installed (install it with scripts/setup.sh)"
        ));
    }
    found
}

/// Skips (loudly) or fails (under CI=true) when a Python module is not importable.
pub fn require_python_modules(modules: &[&str]) -> bool {
    let imports = modules
        .iter()
        .map(|m| format!("import {m}"))
        .collect::<Vec<_>>()
        .join("; ");
    let found = Command::new("python3")
        .args(["-c", &imports])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        skip(&format!(
            "python modules {modules:?} are missing (install them with scripts/setup.sh)"
        ));
    }
    found
}

/// Compares `actual` with the golden file tests/snapshots/NAME; UPDATE_SNAPSHOTS=1 rewrites it.
pub fn snapshot(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("snapshots")
        .join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "snapshot {} missing; run with UPDATE_SNAPSHOTS=1",
            path.display()
        )
    });
    assert_eq!(actual, expected, "snapshot {name} differs");
}

/// Runs the third-party validators of tests/data/validate_export.py on an export.
pub fn validate_export(kind: &str, text: &[u8]) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/validate_export.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(kind)
        .arg(file.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{kind} export is invalid:\n{}{}",
        stdout(&out),
        stderr(&out)
    );
}

/// The recorders serving the store of `p`: pids of `roar-recorder` processes whose command line
/// names its database.
pub fn recorders(p: &Project) -> Vec<i32> {
    let db = p.path().join(".roar/roar.db");
    let db = db.to_string_lossy();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.first().is_some_and(|a| a == "roar-recorder") && args.iter().any(|a| *a == db) {
            pids.push(pid);
        }
    }
    pids
}

/// Waits until `ready` holds (polled every 10 ms); false if it still does not after `within`.
pub fn wait_for(within: std::time::Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while !ready() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}

/// Waits until no process's command line matches `pattern` (`pgrep -f`); false if one still
/// does after `within`.
pub fn wait_until_gone(pattern: &str, within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        let running = std::process::Command::new("pgrep")
            .args(["-f", pattern])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("pgrep runs")
            .success();
        if !running {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Pids of running eBPF helpers serving rings of `ring_kb` KiB (each test that watches a helper
/// uses a ring size of its own, so it has a helper of its own).
pub fn ebpf_helpers(ring_kb: u32) -> Vec<i32> {
    let want = format!("ROAR_EBPF_RING_KB={ring_kb}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            cmdline.split(|b| *b == 0).any(|a| a == b"__ebpf-helper")
                && environ.split(|b| *b == 0).any(|v| v == want.as_bytes())
        })
        .collect()
}
