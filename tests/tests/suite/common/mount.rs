//! A project with `data/` mounted by `roar mount`, for the FUSE tests.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{stderr, Project};

/// FUSE needs /dev/fuse and root; a missing capability fails under CI=true.
pub fn require_fuse() -> bool {
    // Root: real uid 0 in /proc/self/status.
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    let ok = root && Path::new("/dev/fuse").exists();
    if !ok {
        super::skip("FUSE mount tests need root and /dev/fuse");
    }
    ok
}

/// Whether the kernel offers FUSE over io_uring (`enable_uring`; scripts/test.sh turns it on for
/// the suite). Under CI=true its absence is a failure, not a skip.
pub fn require_uring() -> bool {
    let on = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|v| v.trim() == "Y");
    if !on {
        super::skip("FUSE over io_uring: /sys/module/fuse/parameters/enable_uring is not Y (scripts/test.sh sets it; Linux 6.14+)");
    }
    on
}

/// A project with a `data/` directory, mounted; unmounted (and its jobs recorded) on drop.
pub struct Mounted {
    pub p: Project,
    pub data: PathBuf,
    pub mounted: bool,
    /// `data/` is a tmpfs of its own (`ROAR_TEST_DATA_FS=tmpfs`), unmounted on drop.
    volume: bool,
}

/// With `ROAR_TEST_DATA_FS=tmpfs`, every mount test's `data/` is a filesystem of its own, as a
/// data volume is (the store stays on the project's): what only same-filesystem operations
/// between the two would get right shows up.
fn data_on_a_volume(data: &Path) -> bool {
    if std::env::var("ROAR_TEST_DATA_FS").as_deref() != Ok("tmpfs") {
        return false;
    }
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512m", "roar-test-volume"])
        .arg(data)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount -t tmpfs {}", data.display());
    true
}

impl Mounted {
    pub fn new(setup: impl FnOnce(&Path)) -> Mounted {
        let p = Project::new();
        let data = std::fs::canonicalize(p.path()).unwrap().join("data");
        std::fs::create_dir(&data).unwrap();
        let volume = data_on_a_volume(&data);
        setup(&data);
        let out = p.roar(["mount", "data"]);
        assert!(out.status.success(), "roar mount: {}", stderr(&out));
        Mounted {
            p,
            data,
            mounted: true,
            volume,
        }
    }

    /// Like [`Mounted::new`], with the `roar mount` command adjusted first (limits, env).
    pub fn with(setup: impl FnOnce(&Path), adjust: impl FnOnce(&mut Command)) -> Mounted {
        let p = Project::new();
        let data = std::fs::canonicalize(p.path()).unwrap().join("data");
        std::fs::create_dir(&data).unwrap();
        let volume = data_on_a_volume(&data);
        setup(&data);
        let mut cmd = p.cmd(["mount", "data"]);
        adjust(&mut cmd);
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "roar mount: {}", stderr(&out));
        Mounted {
            p,
            data,
            mounted: true,
            volume,
        }
    }

    /// Runs `argv` in `data/` as its own process group, as an interactive shell would.
    pub fn run(&self, argv: &[&str]) -> std::process::ExitStatus {
        // `./prog` names a program in data/, not in the test's own directory.
        let program = if argv[0].starts_with("./") {
            self.data.join(argv[0])
        } else {
            PathBuf::from(argv[0])
        };
        Command::new(program)
            .args(&argv[1..])
            .current_dir(&self.data)
            .process_group(0)
            .status()
            .unwrap()
    }

    pub fn unmount(&mut self) {
        let out = self.p.roar(["unmount", "data"]);
        assert!(out.status.success(), "roar unmount: {}", stderr(&out));
        self.mounted = false;
    }

    /// The daemon's log (every `.log` in the project's mount state).
    pub fn log(&self) -> String {
        self.read_logs().expect("the mount's logs")
    }

    fn read_logs(&self) -> std::io::Result<String> {
        let mut all = String::new();
        for e in std::fs::read_dir(self.p.path().join(".roar/mounts"))? {
            let path = e?.path();
            if path.extension().is_some_and(|x| x == "log") {
                all.push_str(&std::fs::read_to_string(path)?);
            }
        }
        Ok(all)
    }

    /// The daemon's log lines that warn or report errors (none when there is no log to read:
    /// this explains a failure, it must not replace it with its own).
    pub fn warnings(&self) -> Vec<String> {
        self.read_logs()
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .map(|l| format!("daemon log: {l}"))
            .collect()
    }

    /// The daemon's pid, from `roar mount --list`.
    pub fn daemon_pid(&self) -> i32 {
        let list: serde_json::Value =
            serde_json::from_slice(&self.p.roar(["mount", "--list", "--json"]).stdout).unwrap();
        list[0]["pid"].as_i64().expect("a mount with a pid") as i32
    }

    /// The recorded mount jobs, oldest first.
    pub fn jobs(&self) -> Vec<serde_json::Value> {
        let log: serde_json::Value =
            serde_json::from_slice(&self.p.roar(["log", "--json", "-n", "1000"]).stdout).unwrap();
        let mut jobs: Vec<serde_json::Value> = log
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["backend"] == "mount")
            .map(|j| self.p.job_json(j["id"].as_i64().unwrap()))
            .collect();
        jobs.reverse();
        jobs
    }

    /// The job whose root ran `argv`. The mount reads argv from /proc after exec, so a program
    /// started through a wrapper shows what the wrapper exec'd: pyenv's `python3` shim the real
    /// interpreter's path, `env -i sh -c ...` the `sh -c ...` part.
    pub fn job_with_argv(&self, argv: &[&str]) -> serde_json::Value {
        let jobs = self.jobs();
        let matches = |a: &Vec<serde_json::Value>| {
            let a: Vec<&str> = a.iter().map(|x| x.as_str().unwrap()).collect();
            let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_owned();
            (0..argv.len()).any(|skip| {
                let want = &argv[skip..];
                a.len() == want.len()
                    && a[1..] == want[1..]
                    && base(a[0]).starts_with(&base(want[0]))
            })
        };
        // A program exec'd with an empty argument list has no argv to match: it is the
        // workload's if it is the only such job.
        let nameless: Vec<_> = jobs
            .iter()
            .filter(|j| j["argv"].as_array().is_some_and(|a| a.is_empty()))
            .collect();
        jobs.iter()
            .find(|j| j["argv"].as_array().is_some_and(matches))
            .or(if nameless.len() == 1 {
                Some(nameless[0])
            } else {
                None
            })
            .cloned()
            .unwrap_or_else(|| panic!("no mount job with argv {argv:?} among {jobs:#?}"))
    }

    /// The job's `role` files, relative to data/.
    pub fn files(&self, job: &serde_json::Value, role: &str) -> Vec<String> {
        super::files_under(job, role, &self.data)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.mounted {
            let _ = self.p.roar(["unmount", "data"]);
        }
        if self.volume {
            let _ = Command::new("umount").arg("-l").arg(&self.data).status();
        }
    }
}
