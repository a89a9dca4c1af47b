//! `roar mount` with a real FUSE mount: programs started without `roar run` are recorded; the
//! mount behaves like the directory under it (a reference model on random operations); a killed
//! daemon is cleaned up; bad input is refused with one line.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use common::mount::{require_fuse, require_uring, Mounted};
use common::workloads::{sh, workloads};
use common::{stderr, stdout, Project, Rng};

fn b3(path: &Path) -> String {
    blake3::hash(&std::fs::read(path).unwrap())
        .to_hex()
        .to_string()
}

#[test]
fn programs_started_without_roar_run_are_recorded_with_content_hashes() {
    if !require_fuse() {
        return;
    }
    let mut m = Mounted::new(|d| std::fs::write(d.join("in.txt"), b"hello\n").unwrap());
    let argv = [
        "sh",
        "-c",
        "cat in.txt > copy.txt && tr a-z A-Z < copy.txt > up.txt",
    ];
    assert!(m.run(&argv).success());
    // A big file written in one sequential pass (hashed from the write stream) and read back.
    let big: Vec<u8> = (0..8u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(m.data.join("seed.bin"), &big).unwrap();
    let argv2 = ["sh", "-c", "cat seed.bin > big.bin && cmp seed.bin big.bin"];
    assert!(
        m.run(&argv2).success(),
        "content read back through the mount differs"
    );
    m.unmount();

    let job = m.job_with_argv(&argv);
    assert_eq!(m.files(&job, "input"), ["in.txt"]);
    assert_eq!(m.files(&job, "output"), ["copy.txt", "up.txt"]);
    assert_eq!(job["status"], "ended");
    for f in job["files"].as_array().unwrap() {
        let path = Path::new(f["path"].as_str().unwrap());
        assert_eq!(f["hash"]["blake3"], b3(path), "{}", path.display());
    }
    let job2 = m.job_with_argv(&argv2);
    assert_eq!(m.files(&job2, "input"), ["seed.bin"]);
    assert_eq!(m.files(&job2, "output"), ["big.bin"]);
    let out = job2["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["role"] == "output")
        .unwrap();
    assert_eq!(
        out["hash"]["blake3"],
        blake3::hash(&big).to_hex().to_string()
    );
    // The files are the directory's own, still there after the unmount.
    assert_eq!(std::fs::read(m.data.join("up.txt")).unwrap(), b"HELLO\n");
}

#[test]
fn coverage_workloads_through_the_mount_match_roar_run() {
    if !require_fuse() {
        return;
    }
    if !["python3", "make", "cc", "tar", "sed"]
        .iter()
        .all(|t| common::require_tool(t))
    {
        return;
    }
    let mut failures = Vec::new();
    for w in workloads() {
        let mut m = Mounted::new(|d| sh(d, w.setup));
        let status = m.run(w.argv);
        if let Some(code) = status.code() {
            assert_eq!(code, w.exit, "{}: exit status", w.name);
        }
        m.unmount();
        let job = m.job_with_argv(w.argv);
        let (inputs, outputs) = (m.files(&job, "input"), m.files(&job, "output"));
        let want = |v: &[&str]| {
            let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
            v.sort();
            v
        };
        if inputs != want(w.inputs) || outputs != want(w.outputs) {
            failures.push(format!(
                "{}: inputs {inputs:?} (want {:?}), outputs {outputs:?} (want {:?})",
                w.name, w.inputs, w.outputs
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Applies one random operation under `root`; returns what happened, to compare.
fn apply(root: &Path, op: u64, a: &str, b: &str, data: &[u8]) -> String {
    let (pa, pb) = (root.join(a), root.join(b));
    let r: std::io::Result<String> = (|| {
        Ok(match op {
            0 => {
                std::fs::write(&pa, data)?;
                "write".into()
            }
            1 => {
                use std::io::Write;
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&pa)?
                    .write_all(data)?;
                "append".into()
            }
            2 => format!("read {}", digest(&std::fs::read(&pa)?)),
            3 => {
                std::fs::rename(&pa, &pb)?;
                "rename".into()
            }
            4 => {
                std::fs::remove_file(&pa)?;
                "unlink".into()
            }
            5 => {
                std::fs::create_dir(&pa)?;
                "mkdir".into()
            }
            6 => {
                std::fs::remove_dir(&pa)?;
                "rmdir".into()
            }
            7 => {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&pa)?
                    .set_len(data.len() as u64 / 2)?;
                "truncate".into()
            }
            8 => {
                std::fs::hard_link(&pa, &pb)?;
                "link".into()
            }
            9 => {
                std::os::unix::fs::symlink(a, &pb)?;
                "symlink".into()
            }
            10 => {
                std::fs::set_permissions(&pa, std::fs::Permissions::from_mode(0o600))?;
                "chmod".into()
            }
            11 => {
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new().write(true).open(&pa)?;
                f.write_all_at(data, 3)?;
                "pwrite".into()
            }
            _ => {
                let mut names: Vec<String> = std::fs::read_dir(&pa)?
                    .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                    .collect::<Result<_, _>>()?;
                names.sort();
                format!("list {names:?}")
            }
        })
    })();
    match r {
        Ok(s) => s,
        Err(e) => format!("error {:?}", e.raw_os_error()),
    }
}

/// A file's content, short: its size and blake3.
fn digest(content: &[u8]) -> String {
    let hash = blake3::hash(content).to_hex();
    format!("{} bytes {}", content.len(), &hash[..16])
}

/// Everything observable about a tree: type, mode, size, content, link count, symlink target.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let m = std::fs::symlink_metadata(&path).unwrap();
            let desc = if m.is_dir() {
                stack.push(path.clone());
                format!("dir {:o}", m.mode() & 0o7777)
            } else if m.file_type().is_symlink() {
                format!("link -> {:?}", std::fs::read_link(&path).unwrap())
            } else {
                format!(
                    "file {:o} nlink {} {}",
                    m.mode() & 0o7777,
                    m.nlink(),
                    digest(&std::fs::read(&path).unwrap())
                )
            };
            out.insert(rel, desc);
        }
    }
    out
}

#[test]
fn random_operations_behave_as_on_the_plain_directory() {
    if require_fuse() {
        random_operations("1", "0");
    }
}

#[test]
fn random_operations_behave_as_on_the_plain_directory_without_passthrough() {
    if require_fuse() {
        random_operations("0", "0");
    }
}

#[test]
fn random_operations_behave_as_on_the_plain_directory_over_io_uring() {
    if require_fuse() && require_uring() {
        random_operations("1", "1");
    }
}

/// 600 random operations on the mount (`ROAR_MOUNT_PASSTHROUGH` and `ROAR_MOUNT_URING` as
/// given) and on a plain directory answer the same and leave the same tree.
fn random_operations(passthrough: &str, uring: &str) {
    let mut m = Mounted::with(
        |_| {},
        |c| {
            c.env("ROAR_MOUNT_PASSTHROUGH", passthrough)
                .env("ROAR_MOUNT_URING", uring);
        },
    );
    let plain = tempfile::tempdir().unwrap();
    let names = ["a", "b", "c", "d/e", "d/f", "d", "g/h", "g"];
    let seed = 0x5eed_u64;
    let mut rng = Rng(seed);
    for step in 0..600 {
        let op = rng.below(13);
        let a = names[rng.below(names.len() as u64) as usize];
        let b = names[rng.below(names.len() as u64) as usize];
        // One write in eight is larger than what the mount serves from its page cache (256 KiB),
        // so files move between that and passthrough as they are written and truncated.
        let len = if rng.below(8) == 0 {
            300 << 10
        } else {
            rng.below(64)
        };
        let data: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
        let want = apply(plain.path(), op, a, b, &data);
        let got = apply(&m.data, op, a, b, &data);
        assert_eq!(
            got, want,
            "step {step} (seed {seed:#x}): op {op} on {a} {b}: the mount answered differently"
        );
    }
    assert_eq!(snapshot(&m.data), snapshot(plain.path()));
    m.unmount();
    // And the backing directory holds exactly that tree.
    assert_eq!(snapshot(&m.data), snapshot(plain.path()));
}

#[test]
fn a_killed_daemon_is_detected_and_cleared_and_nothing_is_lost() {
    if !require_fuse() {
        return;
    }
    let mut m = Mounted::new(|d| std::fs::write(d.join("keep.txt"), b"precious").unwrap());
    let list: serde_json::Value =
        serde_json::from_slice(&m.p.roar(["mount", "--list", "--json"]).stdout).unwrap();
    assert_eq!(list[0]["state"], "active", "{list}");
    let pid = list[0]["pid"].as_i64().unwrap();
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    // The kernel cuts the connection when the daemon's /dev/fuse fd closes, as it dies (it may
    // stay a zombie where nothing reaps it, so its /proc entry is no signal).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // While it dies, requests in flight fail with ECONNABORTED; once it is gone, every request
    // answers ENOTCONN.
    let err = loop {
        match std::fs::metadata(m.data.join("keep.txt")) {
            Err(e) if e.raw_os_error() == Some(107) => break e,
            _ if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            other => panic!("30 s after its daemon was killed the mount answers {other:?}"),
        }
    };
    assert_eq!(
        err.raw_os_error(),
        Some(107),
        "a dead FUSE mount answers ENOTCONN"
    );
    // Mounting again notices, clears it, says so, and mounts.
    let out = m.p.roar(["mount", "data"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("dead roarfs mount"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read(m.data.join("keep.txt")).unwrap(), b"precious");
    m.unmount();
    assert_eq!(std::fs::read(m.data.join("keep.txt")).unwrap(), b"precious");
}

/// `umount DIR` (not `roar unmount`) ends the session: the daemon records the mount's jobs
/// and exits instead of waiting for a signal forever.
#[test]
fn a_mount_unmounted_from_outside_records_its_jobs_and_its_daemon_exits() {
    if !require_fuse() {
        return;
    }
    let mut m = Mounted::new(|_| {});
    let pid = m.daemon_pid();
    assert!(m.run(&["sh", "-c", "echo made > out.txt"]).success());
    let out = Command::new("umount").arg(&m.data).output().unwrap();
    assert!(out.status.success(), "umount: {}", stderr(&out));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // The daemon is not this process's child: gone once its /proc entry is, or is a zombie.
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    while alive() {
        assert!(
            std::time::Instant::now() < deadline,
            "10 s after `umount`, the mount's daemon (pid {pid}) still runs"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    m.mounted = false;
    let job = m.job_with_argv(&["sh", "-c", "echo made > out.txt"]);
    assert_eq!(m.files(&job, "output"), ["out.txt"]);
    assert_eq!(std::fs::read(m.data.join("out.txt")).unwrap(), b"made\n");
}

/// The mount's preferred I/O size is its own (each write is a round trip to the daemon), not
/// the backing filesystem's 4 KiB: buffered writers (Python, stdio) size their buffers by it.
#[test]
fn the_mount_asks_for_writes_of_at_least_128_kib() {
    if !require_fuse() {
        return;
    }
    let m = Mounted::new(|d| std::fs::write(d.join("f"), "x").unwrap());
    std::fs::create_dir(m.data.join("d")).unwrap();
    for p in ["f", "d", "."] {
        let blksize = std::fs::metadata(m.data.join(p)).unwrap().blksize();
        assert!(blksize >= 128 << 10, "{p}: st_blksize {blksize}");
    }
}

#[test]
fn bad_mount_requests_get_one_clear_line() {
    if !require_fuse() {
        return;
    }
    let p = Project::new();
    // The store would be on the mount it records.
    let out = p.roar(["mount", "."]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("inside"), "{}", stderr(&out));
    let out = p.roar(["mount", "missing"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("missing"), "{}", stderr(&out));
    let out = p.roar(["unmount", "."]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not mounted by roar"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    // Twice on the same directory.
    let m = Mounted::new(|_| {});
    let out = m.p.roar(["mount", "data"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("already mounted"), "{}", stderr(&out));
    assert!(stdout(&m.p.roar(["mount", "--list"])).contains("active"));
}

#[test]
fn processes_already_inside_the_directory_are_warned_about() {
    if !require_fuse() {
        return;
    }
    let p = Project::new();
    std::fs::create_dir(p.path().join("data")).unwrap();
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .current_dir(p.path().join("data"))
        .spawn()
        .unwrap();
    let out = p.roar(["mount", "data"]);
    sleeper.kill().unwrap();
    let _ = sleeper.wait();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("bypass the mount"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains(&format!("{} (sleep)", sleeper.id())),
        "{}",
        stderr(&out)
    );
    let out = p.roar(["unmount", "data"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Behaviours the reference-model test does not reach, run by one script on the mount and on a
/// plain directory: the two transcripts must be identical.
const POSIX_SCRIPT: &str = r#"
import ctypes, errno, mmap, os, sys
def show(label, f):
    try:
        print(label, f())
    except OSError as e:
        print(label, "error", errno.errorcode[e.errno])
libc = ctypes.CDLL(None, use_errno=True)
def renameat2(a, b, flags):
    r = libc.renameat2(-100, a.encode(), -100, b.encode(), flags)
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r
open("x1", "w").write("one"); open("x2", "w").write("two")
show("exchange", lambda: (renameat2("x1", "x2", 2), open("x1").read(), open("x2").read()))
show("noreplace", lambda: renameat2("x1", "x2", 1))
show("xattr set", lambda: os.setxattr("x1", "user.roar", b"v1"))
show("xattr get", lambda: os.getxattr("x1", "user.roar"))
show("xattr list", lambda: sorted(os.listxattr("x1")))
show("xattr remove", lambda: (os.removexattr("x1", "user.roar"), os.listxattr("x1")))
with open("m", "wb") as f:
    f.write(b"\0" * 8192)
with open("m", "r+b") as f:
    mm = mmap.mmap(f.fileno(), 8192)
    mm[100:105] = b"hello"
    mm.flush(); mm.close()
show("mmap write", lambda: open("m", "rb").read()[98:107])
with open("sparse", "wb") as f:
    f.seek(1 << 20); f.write(b"end")
show("sparse size", lambda: os.stat("sparse").st_size)
fd = os.open("sparse", os.O_RDONLY)
show("seek data", lambda: os.lseek(fd, 0, os.SEEK_DATA) >= 4096)
os.close(fd)
os.mkdir("d1"); f = open("d1/open.txt", "w"); f.write("a")
os.rename("d1", "d2"); f.write("b"); f.close()
show("renamed dir, open file", lambda: open("d2/open.txt").read())
fd = os.open("app", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.write(fd, b"1"); os.pwrite(fd, b"2", 0); os.close(fd)
show("append", lambda: open("app").read())
os.symlink("d2/open.txt", "ln")
show("symlink", lambda: (os.readlink("ln"), open("ln").read()))
os.chmod("x1", 0o640); os.chown("x1", 65534, 65534)
show("chmod chown", lambda: (oct(os.stat("x1").st_mode & 0o777), os.stat("x1").st_uid))
os.utime("x1", (1000000000, 1000000000))
show("utime", lambda: os.stat("x1").st_mtime)
os.truncate("x2", 1)
show("truncate", lambda: open("x2").read())
show("statvfs", lambda: os.statvfs(".").f_bsize > 0)
show("listing", lambda: sorted(os.listdir(".")))
"#;

/// Runs the Python `script` in a fresh plain directory and in the mount; the two transcripts
/// must be equal. Returns the plain directory's.
fn same_transcript(m: &Mounted, script: &str) -> String {
    let plain = tempfile::tempdir().unwrap();
    let run = |dir: &Path| {
        let out = Command::new("python3")
            .args(["-c", script])
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let (want, got) = (run(plain.path()), run(&m.data));
    assert_eq!(
        got, want,
        "mount transcript differs from the plain directory's"
    );
    want
}

#[test]
fn posix_behaviours_match_the_backing_directory() {
    if !require_fuse() || !common::require_tool("python3") {
        return;
    }
    let m = Mounted::new(|_| {});
    let want = same_transcript(&m, POSIX_SCRIPT);
    assert!(want.contains("exchange (0, 'two', 'one')"), "{want}");
    // Permissions are the backing files' own: another user cannot write a 0640 root-owned file.
    if common::require_tool("setpriv") {
        for d in [m.p.path(), m.data.as_path()] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::write(m.data.join("mine"), b"root's").unwrap();
        std::fs::set_permissions(m.data.join("mine"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        let as_nobody = |script: String| {
            Command::new("setpriv")
                .args([
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "sh",
                    "-c",
                ])
                .arg(script)
                .output()
                .unwrap()
        };
        let read = as_nobody(format!("cat {}/mine", m.data.display()));
        assert!(
            read.status.success(),
            "others may read a 0644 file: {}",
            stderr(&read)
        );
        let write = as_nobody(format!("echo x > {}/mine", m.data.display()));
        assert!(!write.status.success());
        assert!(
            stderr(&write).contains("Permission denied"),
            "{}",
            stderr(&write)
        );
        assert_eq!(std::fs::read(m.data.join("mine")).unwrap(), b"root's");
    }
}

/// A mount job records the machine like a `roar run` job, and no packages (the mount sees only
/// its own files).
#[test]
fn a_mount_job_records_the_machine_needs_root() {
    if !require_fuse() {
        return;
    }
    let mut m = Mounted::new(|_| {});
    assert!(m.run(&["sh", "-c", "echo x > out.txt"]).success());
    m.unmount();
    let job = m.job_with_argv(&["sh", "-c", "echo x > out.txt"]);
    let out =
        m.p.roar(["show", &job["id"].to_string(), "--env", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let env: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(env["runtime"]["kernel"], kernel.trim(), "{env}");
    assert_eq!(env["packages"], serde_json::json!([]), "{env}");
}

/// What one process sees right after another changed the file through the mount: the kernel
/// keeps names, missing names and attributes for a minute (SEMANTICS, "Kernel caches"), so every
/// change made through the mount must reach those caches at once.
const CACHE_SCRIPT: &str = r#"
import os, subprocess
def sh(cmd): subprocess.run(["sh", "-c", cmd], check=True)
def show(what):
    try:
        st = os.stat("f")
        print(what, "size", st.st_size, "mode", oct(st.st_mode), "nlink", st.st_nlink, open("f").read())
    except FileNotFoundError:
        print(what, "missing")
for round in range(3):
    show("probe")
    sh("echo one > f"); show("created")
    before = os.stat("f")
    sh("echo two >> f"); show("appended")
    after = os.stat("f")
    print("size and mtime moved", after.st_size > before.st_size, after.st_mtime_ns > before.st_mtime_ns)
    sh("cat f > /dev/null; chmod 600 f"); show("chmod")
    sh("ln f g && echo three >> g"); show("written through a second name")
    sh("truncate -s 2 g"); show("truncated through it")
    sh("echo new > h && mv h f"); show("renamed over")
    sh("rm g f"); show("removed")
    print("listing", sorted(os.listdir(".")))
"#;

#[test]
fn changes_through_the_mount_are_seen_at_once_despite_the_kernel_caches() {
    if !require_fuse() || !common::require_tool("python3") {
        return;
    }
    let m = Mounted::new(|_| {});
    let want = same_transcript(&m, CACHE_SCRIPT);
    assert!(
        want.contains("written through a second name size 14"),
        "{want}"
    );
    assert!(want.contains("size and mtime moved True True"), "{want}");
}

/// Reads through the mount are served two ways (passthrough above 256 KiB, the mount's own page
/// cache below it) and a file moves between them as it grows and shrinks, with handles of the
/// other kind still open: every read must see the file as the plain directory does.
const SERVED_SCRIPT: &str = r#"
import hashlib, mmap, os
def d(b): return len(b), hashlib.md5(b).hexdigest()[:12]
def read(p):
    with open(p, "rb") as f: return d(f.read())
small, big = b"s" * 100, bytes(range(256)) * 1200
with open("f", "wb") as w: w.write(small)
print("small", read("f"), read("f"))
with open("f", "ab") as w: w.write(big)
print("grown", read("f"), read("f"))
r = open("f", "rb")
print("large, held", d(r.read(10)))
with open("f", "r+b") as w: w.write(b"W" * 50)
print("held sees a write", d(os.pread(r.fileno(), 100, 0)))
r.close()
os.truncate("f", 1000)
print("truncated by name", read("f"), read("f"))
with open("f", "ab") as w: w.write(big)
r = open("f", "rb")
with open("f", "wb") as w: w.write(b"t" * 70)
print("held sees the truncate", d(os.pread(r.fileno(), 1000, 0)))
r.close()
print("small again", read("f"), read("f"))
c = open("f", "rb")
print("small, held", d(c.read()))
with open("f", "r+b") as w: w.write(b"X" * 5)
print("held sees a write", d(os.pread(c.fileno(), 1000, 0)))
with open("f", "ab") as w: w.write(big)
print("held sees it grow", d(os.pread(c.fileno(), 10**6, 0)))
c.close()
print("large again", read("f"))
with open("g", "wb") as w: w.write(b"m" * 8192)
print("g", read("g"))
with open("g", "r+b") as w:
    m = mmap.mmap(w.fileno(), 8192)
    m[0:4] = b"MMAP"
    m.flush()
    m.close()
print("g written through a mapping", read("g"))
os.rename("g", "f")
print("renamed over", read("f"))
"#;

#[test]
fn reads_see_every_change_whichever_way_the_file_is_served() {
    if !require_fuse() || !common::require_tool("python3") {
        return;
    }
    for passthrough in ["1", "0"] {
        let m = Mounted::with(
            |_| {},
            |c| {
                c.env("ROAR_MOUNT_PASSTHROUGH", passthrough);
            },
        );
        let want = same_transcript(&m, SERVED_SCRIPT);
        assert!(want.contains("held sees a write (100, "), "{want}");
    }
}

/// `name` in the directory under the mount, reached through `dir`, a descriptor of that
/// directory opened before the mount hid it (as a process already inside it would).
fn behind(dir: &std::fs::File, name: &str) -> std::path::PathBuf {
    Path::new("/proc/self/fd")
        .join(std::os::fd::AsRawFd::as_raw_fd(dir).to_string())
        .join(name)
}

/// A mount of a data directory `setup` fills, and a descriptor of that directory opened before
/// the mount hid it (to change it behind the mount, through [`behind`]).
fn mounted_with_a_way_behind(setup: impl FnOnce(&Path)) -> (Mounted, std::fs::File) {
    let mut under = None;
    let m = Mounted::new(|d| {
        setup(d);
        under = Some(std::fs::File::open(d).unwrap());
    });
    (m, under.unwrap())
}

/// The mount's page cache of a small file is kept between opens only while the backing file is
/// as it was: a change that reaches the backing file some other way (a process that had the
/// directory open before the mount), even one that keeps the size and puts the mtime back, is
/// read afresh, and recorded as read.
#[test]
fn a_file_changed_under_the_mount_is_read_afresh() {
    if !require_fuse() {
        return;
    }
    let (mut m, under) =
        mounted_with_a_way_behind(|d| std::fs::write(d.join("f"), vec![b'a'; 1000]).unwrap());
    let backing = behind(&under, "f");
    let f = m.data.join("f");
    for _ in 0..3 {
        assert_eq!(std::fs::read(&f).unwrap(), vec![b'a'; 1000]);
    }
    let mtime = std::fs::metadata(&backing).unwrap().modified().unwrap();
    std::fs::write(&backing, vec![b'b'; 1000]).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&backing)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(
        std::fs::metadata(&backing).unwrap().modified().unwrap(),
        mtime
    );
    let read = std::fs::read(&f).unwrap();
    assert!(
        read == [b'b'; 1000],
        "a read through the mount returned what its cache held, not the file: {:?}...",
        &read[..8]
    );
    // A process group of its own: a job of its own (`Mounted::run`).
    let out = Command::new("cat")
        .arg("f")
        .current_dir(&m.data)
        .process_group(0)
        .output()
        .unwrap();
    assert_eq!(out.stdout, vec![b'b'; 1000]);
    m.unmount();
    let job = m.job_with_argv(&["cat", "f"]);
    assert_eq!(m.files(&job, "input"), ["f"]);
    let input = &job["files"].as_array().unwrap()[0];
    assert_eq!(
        input["hash"]["blake3"],
        blake3::hash(&[b'b'; 1000]).to_hex().to_string(),
        "cat's input is not recorded as what it read"
    );
}

/// The names in a directory, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The kernel keeps a directory's listing between opens only while the directory is as it was:
/// a change that reaches it behind the mount (entries added, removed, renamed; its mtime put
/// back each time) is listed at the next open, as is a change through the mount, in a directory
/// of a few entries and in one of many pages of them.
#[test]
fn a_directory_changed_under_the_mount_is_listed_afresh() {
    if !require_fuse() {
        return;
    }
    let (m, under) = mounted_with_a_way_behind(|d| {
        for (dir, n) in [("few", 6), ("many", 3000)] {
            std::fs::create_dir(d.join(dir)).unwrap();
            for i in 0..n {
                std::fs::write(d.join(dir).join(format!("file-{i:05}")), "x").unwrap();
            }
        }
    });
    for dir in ["few", "many"] {
        let (through, back) = (m.data.join(dir), behind(&under, dir));
        for round in 0..6 {
            for _ in 0..2 {
                assert_eq!(
                    listing(&through),
                    listing(&back),
                    "{dir}, round {round}: the mount lists what it listed before, not the directory"
                );
            }
            let mtime = std::fs::metadata(&back).unwrap().modified().unwrap();
            let (at, name) = if round % 2 == 0 {
                (&back, "behind")
            } else {
                (&through, "through")
            };
            match round / 2 {
                0 => std::fs::write(at.join(format!("new-{name}")), "n").unwrap(),
                1 => std::fs::remove_file(at.join(format!("file-{round:05}"))).unwrap(),
                _ => std::fs::rename(
                    at.join(format!("file-{round:05}")),
                    at.join(format!("renamed-{name}")),
                )
                .unwrap(),
            }
            if at == &back {
                std::fs::File::open(&back)
                    .unwrap()
                    .set_modified(mtime)
                    .unwrap();
                assert_eq!(std::fs::metadata(&back).unwrap().modified().unwrap(), mtime);
            }
        }
        assert_eq!(listing(&through), listing(&back));
    }
}

/// Listings taken while another thread changes the directory, through the mount and behind
/// it, in a loop: once the changes stop, the next listing is the directory's. (Each side changes
/// names of its own: a name changed behind the mount is seen through it within the kernel's
/// 60 s, a listing at its next open.)
#[test]
fn a_directory_listed_while_it_changes_is_listed_right_after() {
    if !require_fuse() {
        return;
    }
    let (m, under) = mounted_with_a_way_behind(|d| std::fs::create_dir(d.join("d")).unwrap());
    let (through, back) = (m.data.join("d"), behind(&under, "d"));
    for round in 0..20 {
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    listing(&through);
                }
            });
            let changed = (0..100).try_for_each(|i| {
                let (at, side) = if (i + round) % 3 == 0 {
                    (&back, "behind")
                } else {
                    (&through, "through")
                };
                let name = at.join(format!("{side}-{}", (i * 7 + round) % 20));
                if name.exists() {
                    std::fs::remove_file(&name)
                } else {
                    std::fs::write(&name, "x")
                }
            });
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            changed.unwrap();
        });
        assert_eq!(listing(&through), listing(&back), "round {round}");
    }
}

/// How many pages of `path` are in the page cache (`mincore` over a mapping of it).
fn resident_pages(path: &Path) -> usize {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let pages = len.div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: a read-only shared mapping of a file we hold open, unmapped below; mincore writes
    // one byte per page into `vec`, which has that many.
    #[allow(unsafe_code)]
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        );
        assert_ne!(addr, libc::MAP_FAILED);
        assert_eq!(libc::mincore(addr, len, vec.as_mut_ptr()), 0);
        libc::munmap(addr, len);
    }
    vec.iter().filter(|b| *b & 1 == 1).count()
}

/// A small file read through the mount is in memory once: the mount's page cache keeps it
/// between opens, and the daemon drops the backing filesystem's copy of what it served.
#[test]
fn a_small_file_read_through_the_mount_is_cached_once() {
    if !require_fuse() {
        return;
    }
    let content: Vec<u8> = (0..200u32 << 10).map(|i| (i % 251) as u8).collect();
    let mut under = None;
    let m = Mounted::new(|d| {
        let mut f = std::fs::File::create(d.join("f")).unwrap();
        std::io::Write::write_all(&mut f, &content).unwrap();
        // Clean pages: the kernel drops those when asked (dirty ones only once written back).
        f.sync_all().unwrap();
        under = Some(std::fs::File::open(d).unwrap());
    });
    let under = under.unwrap();
    // On a memory filesystem (ROAR_TEST_DATA_FS=tmpfs) the pages are the file: none to drop.
    // SAFETY: statfs is plain old data.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs on an open directory into a live statfs.
    let got = unsafe { libc::fstatfs(std::os::fd::AsRawFd::as_raw_fd(&under), &mut fs) };
    assert_eq!(got, 0);
    if fs.f_type == libc::TMPFS_MAGIC {
        common::skip("a small file cached once: data/ is a tmpfs, whose pages are the file");
        return;
    }
    let backing = behind(&under, "f");
    assert!(resident_pages(&backing) > 0, "the file was just written");
    for _ in 0..2 {
        assert!(std::fs::read(m.data.join("f")).unwrap() == content);
    }
    // The daemon drops them after its reply.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while resident_pages(&backing) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        resident_pages(&backing),
        0,
        "the backing file's pages stayed cached beside the mount's"
    );
}

/// CPU time (utime + stime, in ticks) of the daemon's io_uring queue threads, and how many there
/// are.
fn ring_threads_cpu(pid: i32) -> (u64, usize) {
    let mut ticks = 0;
    let mut count = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("fuser-ring-") {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        // Fields after the `(comm)`: state is the 3rd field, utime the 14th, stime the 15th.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = rest.split(' ').collect();
        ticks += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        count += 1;
    }
    (ticks, count)
}

#[test]
fn requests_go_through_dev_fuse_by_default_and_through_io_uring_when_asked() {
    if !require_fuse() || !require_uring() {
        return;
    }
    // A thousand files written, read back and listed: enough requests that the threads serving
    // them show CPU time. Reads go through the daemon (no passthrough), so replies of up to a
    // megabyte go back through the transport too: a 4 MiB file must read back as written.
    let work = "for i in $(seq 1000); do echo $i > f$i; cat f$i > /dev/null; done; ls -l > /dev/null; \
        python3 -c \"d = bytes(range(256)) * 16384; open('big', 'wb').write(d); assert open('big', 'rb').read() == d\"";
    for (uring, transport) in [(Some("1"), "io_uring"), (None, "dev-fuse")] {
        let p = Project::new();
        let data = std::fs::canonicalize(p.path()).unwrap().join("data");
        std::fs::create_dir(&data).unwrap();
        let mut mount = p.cmd(["mount", "data", "--json"]);
        mount.env("ROAR_MOUNT_PASSTHROUGH", "0");
        match uring {
            Some(v) => mount.env("ROAR_MOUNT_URING", v),
            None => mount.env_remove("ROAR_MOUNT_URING"),
        };
        let out = mount.output().unwrap();
        assert!(out.status.success(), "roar mount: {}", stderr(&out));
        let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(said["transport"], transport, "{said}");
        let pid = said["pid"].as_i64().unwrap() as i32;
        let (before, _) = ring_threads_cpu(pid);
        let ran = Command::new("sh")
            .args(["-c", work])
            .current_dir(&data)
            .status()
            .unwrap();
        assert!(ran.success());
        let (ticks, threads) = ring_threads_cpu(pid);
        if uring.is_some() {
            assert!(threads > 0, "no io_uring queue threads in the daemon");
            assert!(
                ticks > before,
                "the io_uring threads served nothing: {ticks} ticks"
            );
        } else {
            assert_eq!(
                (ticks, threads),
                (0, 0),
                "io_uring threads without io_uring"
            );
        }
        let done = p.cmd(["unmount", "data"]).output().unwrap();
        assert!(done.status.success(), "roar unmount: {}", stderr(&done));
        // The same record either way: every file written is an output.
        let log: serde_json::Value =
            serde_json::from_slice(&p.roar(["log", "-n", "0", "--json"]).stdout).unwrap();
        let outputs: usize = log
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["outputs"].as_u64().unwrap_or(0) as usize)
            .sum();
        assert_eq!(outputs, 1001, "{transport}: {log}");
    }
}

/// An idle process whose working directory is in the mount does not keep `roar unmount` waiting:
/// the mount is detached, the daemon records its jobs and exits, and the holder is named.
#[test]
fn unmount_with_an_idle_working_directory_inside_finishes_and_names_the_holder() {
    if !common::mount::require_fuse() {
        return;
    }
    let mut m = common::mount::Mounted::new(|_| {});
    assert!(m.run(&["sh", "-c", "echo made > out.txt"]).success());
    let mut holder = std::process::Command::new("sleep")
        .arg("300")
        .current_dir(&m.data)
        .spawn()
        .unwrap();
    let daemon = m.daemon_pid();
    let t = std::time::Instant::now();
    let out = m.p.roar(["unmount", "data"]);
    let _ = holder.kill();
    let _ = holder.wait();
    m.mounted = false;
    assert!(
        out.status.success(),
        "roar unmount: {}",
        common::stderr(&out)
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        t.elapsed()
    );
    let err = common::stderr(&out);
    assert!(
        err.contains(&format!("process {} (sleep)", holder.id())),
        "{err}"
    );
    // Gone (or a zombie its parent has not reaped yet).
    let stat = std::fs::read_to_string(format!("/proc/{daemon}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z "),
        "the daemon runs on: {stat}"
    );
    let jobs = m.jobs();
    assert!(
        jobs.iter()
            .any(|j| m.files(j, "output").iter().any(|f| f.ends_with("out.txt"))),
        "the job is recorded: {jobs:?}"
    );
}

/// What `roar mount --list --json` says a mount served (the daemon writes it at each tick).
fn served(p: &Project) -> serde_json::Value {
    std::thread::sleep(std::time::Duration::from_millis(600));
    let list: serde_json::Value =
        serde_json::from_slice(&p.roar(["mount", "--list", "--json"]).stdout).unwrap();
    list[0]["served"].clone()
}

/// The daemon counts the requests it serves by kind (issue 65: requests per operation beside
/// every benchmark's time), and while they come back to back one thread polls for the next
/// instead of sleeping; with polling off (`ROAR_MOUNT_POLL_US=0`) nothing is polled. Either way
/// the record is the same.
#[test]
fn the_mount_counts_what_it_serves_and_polls_while_requests_come_back_to_back() {
    if !require_fuse() {
        return;
    }
    // 300 files, each opened and read whole four times in a row by one Python process: OPEN,
    // IOCTL (Python's isatty) and RELEASE per open once the pages are cached.
    let work = "import os\n\
        for i in range(300): open(f'f{i}', 'wb').write(b'x' * 4096)\n\
        for _ in range(4):\n    for i in range(300): open(f'f{i}', 'rb').read()\n";
    let mut records = Vec::new();
    for poll in [None, Some("0")] {
        let p = Project::new();
        let data = std::fs::canonicalize(p.path()).unwrap().join("data");
        std::fs::create_dir(&data).unwrap();
        let mut mount = p.cmd(["mount", "data"]);
        match poll {
            Some(v) => mount.env("ROAR_MOUNT_POLL_US", v),
            None => mount.env_remove("ROAR_MOUNT_POLL_US"),
        };
        let out = mount.output().unwrap();
        assert!(out.status.success(), "roar mount: {}", stderr(&out));
        let ran = Command::new("python3")
            .args(["-c", work])
            .current_dir(&data)
            .status()
            .unwrap();
        assert!(ran.success());
        let s = served(&p);
        let n = |k: &str| s["requests"][k].as_u64().unwrap_or(0);
        assert!(n("OPEN") >= 1200, "every open is served: {s}");
        assert!(n("RELEASE") >= 1200, "{s}");
        let (total, waited) = (s["total"].as_u64().unwrap(), s["waited"].as_u64().unwrap());
        let kinds: u64 = s["requests"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(kinds, total, "{s}");
        assert!(
            waited + n("RELEASE") <= total,
            "RELEASE is not waited for: {s}"
        );
        let caught = s["polls"]["caught"].as_u64().unwrap();
        match poll {
            None => assert!(caught > 0, "nothing caught polling: {s}"),
            Some(_) => assert_eq!(
                (caught, s["polls"]["ran_out"].as_u64().unwrap()),
                (0, 0),
                "polled with polling off: {s}"
            ),
        }
        let text = stdout(&p.roar(["mount", "--list"]));
        assert!(text.contains("requests served ("), "{text}");
        assert!(text.contains("daemon CPU"), "{text}");
        let done = p.cmd(["unmount", "data"]).output().unwrap();
        assert!(done.status.success(), "roar unmount: {}", stderr(&done));
        let log: serde_json::Value =
            serde_json::from_slice(&p.roar(["log", "-n", "0", "--json"]).stdout).unwrap();
        let job = &log.as_array().unwrap()[0];
        records.push((job["inputs"].clone(), job["outputs"].clone()));
    }
    assert_eq!(records[0], records[1], "polling changed the record");
    assert_eq!(records[0].1, 300, "{records:?}");
}
