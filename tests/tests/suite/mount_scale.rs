//! `roar mount` at the edges: a million-file tree under a small descriptor limit, a file
//! truncated while the daemon hashes it, descriptors exhausted (never a silent hole), unmount
//! while a program writes, a killed daemon, the mount log staying quiet.

use crate::common;

use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::mount::{require_fuse, Mounted};
use common::{stderr, stdout};

fn b3(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Sets the soft and hard limit on open files of the command it is given to (and so of the
/// daemon it starts) to `n`.
fn fd_limit(cmd: &mut Command, n: u64) {
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn sh_in(dir: &Path, script: &str) -> std::process::Output {
    Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .process_group(0)
        .output()
        .unwrap()
}

/// The size of the generated tree: 1,000,000 files in 1,000 directories, unless
/// ROAR_TEST_TREE_FILES says otherwise (for a quicker run by hand).
fn tree_files() -> usize {
    std::env::var("ROAR_TEST_TREE_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// The content of file j of directory i in the generated tree: every 100th file has its own
/// name as content, the others are empty (an empty file needs no data block, so a million of
/// them are written in about a minute where data blocks made it disk-bound).
fn content(i: usize, j: usize) -> String {
    if j.is_multiple_of(100) {
        format!("{i}/{j}")
    } else {
        String::new()
    }
}

/// The most descriptors the daemon may hold however large the tree: the FUSE channel per
/// thread, the store and its WAL, the hash cache connection, stdio, a few in flight per thread.
const DAEMON_FD_BOUND: usize = 64;

#[test]
fn a_million_file_tree_is_served_whole_within_a_fixed_descriptor_budget_needs_root() {
    if !require_fuse() {
        return;
    }
    let files = tree_files();
    let per_dir = 1000.min(files);
    let dirs = files.div_ceil(per_dir);
    let m = Mounted::with(
        |d| {
            // Written on the backing filesystem before the mount, not through it.
            for i in 0..dirs {
                let dir = d.join(format!("d{i:04}"));
                std::fs::create_dir(&dir).unwrap();
                for j in 0..per_dir.min(files - i * per_dir) {
                    std::fs::write(dir.join(format!("f{j:04}")), content(i, j)).unwrap();
                }
            }
        },
        |cmd| fd_limit(cmd, 1024),
    );
    let pid = m.daemon_pid();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.contains(" 1024 ")),
        "{limits}"
    );
    // Sample the daemon's descriptors while the walks run.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(open_fds(pid));
                std::thread::sleep(Duration::from_millis(50));
            }
            most
        })
    };
    let find = sh_in(&m.data, "find . -type f | wc -l");
    assert!(find.status.success(), "{}", stderr(&find));
    assert_eq!(stdout(&find).trim(), files.to_string(), "find");
    // ls -lR: every file stat'ed and its ACL and security label asked for.
    let ls = sh_in(&m.data, "ls -lR . | grep -c '^-'");
    assert!(ls.status.success(), "{}", stderr(&ls));
    assert_eq!(stdout(&ls).trim(), files.to_string(), "ls -lR");
    // stat of every file by path (after the kernel's cached attributes have expired).
    std::thread::sleep(Duration::from_millis(1100));
    let st = sh_in(
        &m.data,
        "find . -type f -print0 | xargs -0 stat -c '%s' | wc -l",
    );
    assert_eq!(stdout(&st).trim(), files.to_string(), "stat");
    // 10,000 random files read, each with its own content.
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    for round in 0..10_000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let k = (rng % files as u64) as usize;
        let (i, mut j) = (k / per_dir, k % per_dir);
        // Every other pick is a file with content of its own.
        if round % 2 == 0 {
            j -= j % 100;
        }
        let p = m.data.join(format!("d{i:04}/f{j:04}"));
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            content(i, j),
            "{}",
            p.display()
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = sampler.join().unwrap();
    assert!(
        most <= DAEMON_FD_BOUND,
        "the daemon held {most} descriptors (bound {DAEMON_FD_BOUND})"
    );
    // A file created now is recorded: nothing was exhausted on the way.
    let out = sh_in(&m.data, "echo new > newfile.txt");
    assert!(out.status.success(), "{}", stderr(&out));
    let mut m = m;
    m.unmount();
    let job = m.job_with_argv(&["sh", "-c", "echo new > newfile.txt"]);
    assert_eq!(m.files(&job, "output"), ["newfile.txt"]);
}

#[test]
fn truncating_a_file_while_the_daemon_hashes_it_200_times_needs_root() {
    if !require_fuse() || !common::require_tool("python3") {
        return;
    }
    // The issue's reproducer, with 4 MiB instead of 256 so 200 rounds fit in a test (still far
    // above the size that used to be memory-mapped): w's release makes the daemon hash the file
    // while k truncates it.
    const RACE: &str = r#"
import os, sys
p = sys.argv[1]
open(p, "wb").write(bytes(4 << 20))
k = os.open(p, os.O_RDWR)
w = os.open(p, os.O_RDWR)
os.pwrite(w, b"x", 1)
os.close(w)
os.ftruncate(k, 0)
os.write(k, b"end")
os.close(k)
"#;
    let mut m = Mounted::new(|_| {});
    let pid = m.daemon_pid();
    for i in 0..200 {
        let status = m.run(&["python3", "-c", RACE, &format!("v{i}")]);
        assert!(status.success(), "round {i}");
        // The file is what the program left, through the mount.
        assert_eq!(std::fs::read(m.data.join(format!("v{i}"))).unwrap(), b"end");
        // Removed at once so the rounds do not fill the disk; the record is kept.
        std::fs::remove_file(m.data.join(format!("v{i}"))).unwrap();
        assert!(
            std::fs::metadata(format!("/proc/{pid}")).is_ok(),
            "the daemon died in round {i}"
        );
    }
    m.unmount();
    let want = b3(b"end");
    // The test's own reads and removals through the mount are a job of their own.
    let jobs: Vec<serde_json::Value> = m
        .jobs()
        .into_iter()
        .filter(|j| j["argv"][0].as_str().is_some_and(|a| a.contains("python")))
        .collect();
    assert_eq!(jobs.len(), 200, "one job per round");
    for job in &jobs {
        let outputs: Vec<&serde_json::Value> = job["files"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["role"] == "output")
            .collect();
        assert_eq!(outputs.len(), 1, "{job:#}");
        // Deleted right after the job by another process: recorded with the content it had.
        assert_eq!(outputs[0]["hash"]["blake3"], want.as_str(), "{job:#}");
    }
}

#[test]
fn a_file_another_process_removes_before_its_release_keeps_the_job_s_content_needs_root() {
    if !require_fuse() || !common::require_tool("python3") {
        return;
    }
    // The kernel sends a close's release asynchronously: it can reach the daemon after another
    // process removed the file (what made the race test above flaky). Here that order is
    // forced: a child of the job holds the written file open until the test has removed it.
    // The truncate records the empty content first, so a release that is skipped shows.
    const HOLD: &str = r#"
import os, sys, time
p, done = sys.argv[1], sys.argv[2]
k = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
os.write(k, bytes(1 << 20))
os.ftruncate(k, 0)
os.pwrite(k, b"end", 0)
if os.fork() == 0:
    while os.path.exists(p):
        time.sleep(0.01)
    os.close(k)
    open(done, "w").close()
    os._exit(0)
"#;
    let mut m = Mounted::new(|_| {});
    let done = m.data.parent().unwrap().join("held-done");
    let status = m.run(&["python3", "-c", HOLD, "held", done.to_str().unwrap()]);
    assert!(status.success());
    assert_eq!(std::fs::read_to_string(m.data.join("held")).unwrap(), "end");
    std::fs::remove_file(m.data.join("held")).unwrap();
    let start = Instant::now();
    while !done.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the child never saw the removal"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    m.unmount();
    let job = m.job_with_argv(&["python3", "-c", HOLD, "held", done.to_str().unwrap()]);
    let held = record_of(&job, "held");
    assert_eq!(held["role"], "output", "{job:#}");
    assert_eq!(held["hash"]["blake3"], b3(b"end").as_str(), "{job:#}");
    // The test's read of the file is recorded first (its job ends first), but it came after
    // the write: the file had no content before this job.
    assert!(held["before"].is_null(), "{job:#}");
}

/// The job's one record of the file `name` (in data/).
fn record_of<'a>(job: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    let suffix = format!("/{name}");
    let found: Vec<&serde_json::Value> = job["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["path"].as_str().is_some_and(|p| p.ends_with(&suffix)))
        .collect();
    assert_eq!(found.len(), 1, "{name} in {job:#}");
    found[0]
}

#[test]
fn a_late_release_of_a_file_the_job_unlinked_leaves_the_new_file_at_its_name_needs_root() {
    if !require_fuse() || !common::require_tool("python3") {
        return;
    }
    // sqlite's journal cycle, with the old journal's release forced to come last: a child holds
    // the first file open until the job has unlinked it and written a new one at the same name.
    const CYCLE: &str = r#"
import os, time
k = os.open("jr", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(k, b"old journal")
pid = os.fork()
if pid == 0:
    while not os.path.exists("jr.done"):
        time.sleep(0.01)
    os.close(k)
    os._exit(0)
os.close(k)
os.unlink("jr")
with open("jr", "wb") as f:
    f.write(b"new journal")
open("jr.done", "w").close()
os.waitpid(pid, 0)
"#;
    let mut m = Mounted::new(|_| {});
    assert!(m.run(&["python3", "-c", CYCLE]).success());
    m.unmount();
    let job = m.job_with_argv(&["python3", "-c", CYCLE]);
    let jr = record_of(&job, "jr");
    assert_eq!(jr["role"], "output", "{job:#}");
    assert_eq!(jr["hash"]["blake3"], b3(b"new journal").as_str(), "{job:#}");
}

#[test]
fn files_closed_just_before_the_unmount_are_recorded_with_what_their_writer_left_needs_root() {
    if !require_fuse() || !common::require_tool("python3") {
        return;
    }
    // The kernel drops the releases it has not yet handed to the daemon when the connection
    // ends: with 400 files closed by an exit and the unmount right after, about half of them
    // (measured). Each file is truncated before its last write, so a missing release would leave
    // the truncate's empty content in the record.
    const MANY: &str = r#"
import os
fds = [os.open("f%d" % i, os.O_RDWR | os.O_CREAT, 0o644) for i in range(400)]
for i, fd in enumerate(fds):
    os.write(fd, b"junk")
    os.ftruncate(fd, 0)
    os.pwrite(fd, b"file %d\n" % i, 0)
os._exit(0)
"#;
    let mut m = Mounted::new(|_| {});
    assert!(m.run(&["python3", "-c", MANY]).success());
    m.unmount();
    let job = m.job_with_argv(&["python3", "-c", MANY]);
    let files = job["files"].as_array().unwrap();
    assert_eq!(files.len(), 400, "{job:#}");
    for f in files {
        let name = f["path"].as_str().unwrap().rsplit('/').next().unwrap();
        let want = format!("file {}\n", &name[1..]);
        assert_eq!(f["role"], "output", "{f:#}");
        assert_eq!(f["hash"]["blake3"], b3(want.as_bytes()).as_str(), "{f:#}");
    }
}

#[test]
fn an_access_the_daemon_cannot_attribute_fails_instead_of_going_unrecorded_needs_root() {
    if !require_fuse() || !common::require_tool("python3") {
        return;
    }
    // A daemon with 40 descriptors, and a program holding 60 files open through the mount:
    // some of its opens, or the daemon's /proc reads, run out. Whatever succeeds is recorded.
    const HOLD: &str = r#"
import os, sys
held, failed = [], 0
for i in range(60):
    try:
        held.append(open(f"h{i}", "w"))
    except OSError:
        failed += 1
ok = 0
for i in range(20):
    try:
        with open(f"new{i}", "w") as f:
            f.write("n")
        ok += 1
    except OSError:
        pass
print(failed, ok)
"#;
    let mut m = Mounted::with(|_| {}, |cmd| fd_limit(cmd, 40));
    let out = Command::new("python3")
        .args(["-c", HOLD])
        .current_dir(&m.data)
        .process_group(0)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let counts: Vec<usize> = stdout(&out)
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert!(counts[0] > 0, "the limit was never reached: {counts:?}");
    m.unmount();
    let job = m.job_with_argv(&["python3", "-c", HOLD]);
    let outputs = m.files(&job, "output");
    // Every file that exists was created by this job and must be among its outputs.
    for e in std::fs::read_dir(&m.data).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            outputs.contains(&name),
            "{name} exists but is not recorded; outputs: {outputs:?}"
        );
    }
    let log = m.log();
    assert!(
        log.matches("cannot attribute").count() <= 1,
        "said once, not per request:\n{log}"
    );
}

#[test]
fn unmount_while_a_program_writes_is_refused_and_force_loses_no_byte_needs_root() {
    if !require_fuse() || !common::require_tool("python3") {
        return;
    }
    const WRITER: &str = r#"
import sys
f = open(sys.argv[1], "w")
f.write("first\n"); f.flush()
print("open", flush=True)
sys.stdin.readline()
f.write("second\n"); f.close()
print("closed", flush=True)
"#;
    let mut m = Mounted::new(|_| {});
    let out_path = m.data.join("out.txt");
    let mut writer = Command::new("python3")
        .args(["-c", WRITER])
        .arg(&out_path)
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(writer.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "open");
    let refused = m.p.roar(["unmount", "data"]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains(&format!("{} (python3", writer.id())),
        "names the writer: {}",
        stderr(&refused)
    );
    assert_eq!(stderr(&refused).lines().count(), 1, "{}", stderr(&refused));
    // Still mounted and serving.
    assert!(stdout(&m.p.roar(["mount", "--list"])).contains("active"));
    let daemon = m.daemon_pid();
    let forced = m.p.roar(["unmount", "--force", "data"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    m.mounted = false;
    // Detached: the directory shows the backing files now, while the writer goes on.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(&format!(" {} ", m.data.display())));
    writer.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "closed");
    assert!(writer.wait().unwrap().success());
    assert_eq!(
        std::fs::read_to_string(&out_path).unwrap(),
        "first\nsecond\n"
    );
    // The daemon ends once the last file is closed, and records the writer's job.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(format!("/proc/{daemon}")).is_ok() && Instant::now() < deadline {
        let zombie = std::fs::read_to_string(format!("/proc/{daemon}/stat"))
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')));
        if zombie {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let job = m.job_with_argv(&["python3", "-c", WRITER, out_path.to_str().unwrap()]);
    let out = job["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["role"] == "output")
        .unwrap_or_else(|| panic!("{job:#}"));
    assert_eq!(out["hash"]["blake3"], b3(b"first\nsecond\n").as_str());
}

#[test]
fn a_killed_daemon_is_recognised_at_once_needs_root() {
    if !require_fuse() {
        return;
    }
    let mut m = Mounted::new(|d| std::fs::write(d.join("keep.txt"), b"precious").unwrap());
    for round in 0..5 {
        let pid = m.daemon_pid();
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        // No wait for the kernel to notice: mounting again right away must work.
        let out = m.p.roar(["mount", "data"]);
        assert!(out.status.success(), "round {round}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("dead roarfs mount"),
            "round {round}: {}",
            stderr(&out)
        );
        assert_eq!(std::fs::read(m.data.join("keep.txt")).unwrap(), b"precious");
    }
    m.unmount();
}

#[test]
fn the_mount_log_does_not_grow_per_request_needs_root() {
    if !require_fuse() || !common::require_tool("python3") {
        return;
    }
    let mut m = Mounted::new(|d| std::fs::write(d.join("x.txt"), b"x").unwrap());
    // Python asks for an ioctl on every open (is it a terminal?).
    let status = m.run(&["python3", "-c", "for _ in range(500): open('x.txt').read()"]);
    assert!(status.success());
    m.unmount();
    let log = m.log();
    assert!(log.lines().count() < 20, "{log}");
    assert!(!log.contains("ioctl"), "{log}");
}

/// Free bytes of the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> u64 {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs is plain integers: all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs fills the struct we own; the path is a valid C string.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail * st.f_frsize
}

/// Mounts a tmpfs of `size` on `dir` (a dataset directory on a filesystem of its own).
fn mount_tmpfs(dir: &Path, size: &str) {
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "roar-test"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "mount tmpfs: {}", stderr(&out));
}

/// Whether a tmpfs is mounted on `dir` in this mount namespace.
fn tmpfs_on(dir: &Path) -> bool {
    let want = format!(" {} ", dir.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.contains(&want) && l.contains(" - tmpfs "))
}

/// A dataset directory on a filesystem of its own (a 64 MiB tmpfs here).
/// - The daemon keeps the passthrough registration of recently read files between opens: a
///   file read and then removed through the mount must still give its space back at once (the
///   registration goes with the kernel's FORGET), or the next write finds the disk full. Each
///   round writes 40 MiB, reads it twice, changes it, reads it again and removes it.
/// - `roar unmount` removes roarfs only: the filesystem underneath stays mounted (fuser's own
///   unmount by path used to run after roar's and took it away).
#[test]
fn a_directory_on_its_own_filesystem_gets_space_back_and_stays_mounted_needs_root() {
    if !require_fuse() {
        return;
    }
    let mut m = Mounted::new(|data| mount_tmpfs(data, "64m"));
    let body = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let empty = free_bytes(&m.data);
        for round in 0..4 {
            let script = format!(
                "dd if=/dev/zero of=big{round} bs=1M count=40 status=none && \
                 cat big{round} > /dev/null && cat big{round} > /dev/null && \
                 printf changed | dd of=big{round} conv=notrunc status=none && \
                 head -c 7 big{round} && rm big{round}"
            );
            let out = sh_in(&m.data, &script);
            assert!(out.status.success(), "round {round}: {}", stderr(&out));
            assert_eq!(
                stdout(&out),
                "changed",
                "round {round}: a read after the change"
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while free_bytes(&m.data) + (4 << 20) < empty {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: 40 MiB still held 10 s after the file was removed"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }));
    m.unmount();
    let kept = tmpfs_on(&m.data);
    if kept {
        let out = Command::new("umount").arg(&m.data).output().unwrap();
        assert!(out.status.success(), "umount tmpfs: {}", stderr(&out));
    }
    if let Err(e) = body {
        std::panic::resume_unwind(e);
    }
    assert!(
        kept,
        "roar unmount also unmounted the tmpfs under the mount"
    );
}

/// Someone unmounts roarfs with `umount` behind roar's back; `roar unmount` afterwards (it stops
/// the daemon and records the jobs) must not unmount what is now on top at DIR: the directory's
/// own filesystem.
#[test]
fn roar_unmount_after_someone_else_s_umount_leaves_the_filesystem_under_it_needs_root() {
    if !require_fuse() {
        return;
    }
    let mut m = Mounted::new(|data| mount_tmpfs(data, "16m"));
    let out = sh_in(&m.data, "echo kept > f && cat f");
    assert_eq!(stdout(&out), "kept\n");
    let out = Command::new("umount").arg(&m.data).output().unwrap();
    assert!(out.status.success(), "umount roarfs: {}", stderr(&out));
    assert!(tmpfs_on(&m.data), "the tmpfs is on top again");
    let out = m.p.roar(["unmount", "data"]);
    m.mounted = false;
    let kept = tmpfs_on(&m.data);
    if kept {
        let left = std::fs::read_to_string(m.data.join("f")).unwrap_or_default();
        let umount = Command::new("umount").arg(&m.data).output().unwrap();
        assert!(umount.status.success(), "umount tmpfs: {}", stderr(&umount));
        assert_eq!(
            left, "kept\n",
            "the file written through roarfs is on the tmpfs"
        );
    }
    assert!(kept, "roar unmount unmounted the tmpfs: {}", stderr(&out));
}
