//! What only the eBPF backend has to prove: bursts are recorded whole or the job says it is not,
//! paths relative to directory fds are resolved in-kernel, concurrent runs never see each other's
//! processes, and the resident helper that keeps the programs loaded leaks nothing from one run
//! into the next, says when it dies, and goes away when idle. (The coverage workloads run on eBPF
//! in run.rs.)

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{ebpf_available, require_tool, stderr, Project};

const BURST: usize = 100_000;

/// Makes BURST small files under `many/` without tracing, and a script that opens each once.
fn burst_project() -> Project {
    let p = Project::new();
    let make = std::process::Command::new("python3")
        .args([
            "-c",
            &format!(
                "import os\nos.mkdir('many')\nfor i in range({BURST}):\n    with open(f'many/{{i}}', 'w') as f: f.write(str(i))\n"
            ),
        ])
        .current_dir(p.path())
        .status()
        .unwrap();
    assert!(make.success());
    p.write(
        "burst.py",
        format!(
            "import os, sys\nfor i in range({BURST}):\n    os.close(os.open(f'many/{{i}}', os.O_RDONLY))\nsys.exit(3)\n"
        )
        .as_bytes(),
    );
    p
}

/// `roar run --tracer ebpf --name NAME -- sh -c SCRIPT` in `p`.
fn ebpf_sh(p: &Project, name: &str, script: &str) -> std::process::Command {
    p.cmd([
        "run", "--tracer", "ebpf", "--name", name, "--", "sh", "-c", script,
    ])
}

#[test]
fn a_burst_of_100k_opens_is_recorded_whole_or_the_job_says_it_is_incomplete() {
    if !require_tool("python3") || !ebpf_available() {
        return;
    }
    let p = burst_project();
    // Default ring buffer: every open arrives.
    let out = p.roar(["run", "--tracer", "ebpf", "--", "python3", "burst.py"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let job = p.last_job();
    assert_eq!(job["incomplete"], false, "{}", stderr(&out));
    let inputs = p.files(&job, "input");
    let many = inputs.iter().filter(|f| f.starts_with("many/")).count();
    assert_eq!(many, BURST, "{}", stderr(&out));

    // A ring buffer of one page cannot hold the burst: the loss is reported, never hidden, and
    // the command's status is still its own.
    let out = p
        .cmd(["run", "--tracer", "ebpf", "--", "python3", "burst.py"])
        .env("ROAR_EBPF_RING_KB", "4")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let job = p.last_job();
    let recorded = p
        .files(&job, "input")
        .iter()
        .filter(|f| f.starts_with("many/"))
        .count();
    assert!(recorded < BURST, "a 4 KiB ring held {recorded} records");
    assert_eq!(job["incomplete"], true);
    assert!(
        stderr(&out).contains("events lost: the eBPF ring buffer was full"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_preflight_names_the_missing_capability() {
    // Run unprivileged (setpriv drops root and every capability): the verdict must say why.
    if !common::can_switch_user("needs root to drop privileges") {
        return;
    }
    // A copy the unprivileged user can reach, wherever the checkout lives.
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("roar");
    common::copy_executable(&common::roar_bin(), &bin);
    for p in [dir.path(), bin.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&bin)
        .args(["tracer", "check", "ebpf"])
        .current_dir("/")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = common::stdout(&out);
    assert!(text.starts_with("ebpf     no"), "{text}");
    assert!(
        text.contains("needs CAP_BPF and CAP_PERFMON, or root"),
        "{text}"
    );
}

#[test]
fn a_bad_ring_size_is_one_clear_line_and_nothing_runs() {
    if !ebpf_available() {
        return;
    }
    common::assert_refused_before_running("ebpf", "ROAR_EBPF_RING_KB", "1000", "ROAR_EBPF_RING_KB");
}

/// Opens, renames and unlinks relative to directory fds, as `find`, `rm -r` and shutil do.
const DIRFD_SCRIPT: &str = r#"
import os
os.makedirs('d/sub', exist_ok=True)
with open('d/sub/in.txt', 'w') as f: f.write('in')
d = os.open('d/sub', os.O_RDONLY | os.O_DIRECTORY)
os.chdir('/')
data = os.read(os.open('in.txt', os.O_RDONLY, dir_fd=d), 10)
fd = os.open('tmp.txt', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=d)
os.write(fd, data + b' out')
os.close(fd)
os.rename('tmp.txt', '../out.txt', src_dir_fd=d, dst_dir_fd=d)
fd = os.open('scratch', os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=d)
os.close(fd)
os.unlink('scratch', dir_fd=d)
fd = os.open('../out.txt', os.O_RDWR, dir_fd=d)
os.ftruncate(fd, 6)
"#;

#[test]
fn paths_relative_to_directory_fds_match_ptrace() {
    if !require_tool("python3") || !ebpf_available() {
        return;
    }
    let mut seen = Vec::new();
    for backend in ["ptrace", "ebpf"] {
        let p = Project::new();
        let out = p.roar([
            "run",
            "--tracer",
            backend,
            "--",
            "python3",
            "-c",
            DIRFD_SCRIPT,
        ]);
        assert!(out.status.success(), "[{backend}] {}", stderr(&out));
        let job = p.last_job();
        assert_eq!(job["incomplete"], false, "[{backend}]");
        let roles: Vec<Vec<String>> = ["input", "output", "temp"]
            .iter()
            .map(|r| p.files(&job, r))
            .collect();
        seen.push(roles);
    }
    assert_eq!(seen[0], seen[1], "ptrace vs ebpf");
    assert_eq!(
        seen[1][1],
        ["d/out.txt", "d/sub/in.txt"],
        "outputs (in.txt was made by the job)"
    );
    assert_eq!(seen[1][2], ["d/sub/scratch", "d/sub/tmp.txt"], "temps");
}

#[test]
fn concurrent_runs_record_only_their_own_processes() {
    if !ebpf_available() {
        return;
    }
    let p = Project::new();
    // Each run writes its own file while the other is running, for about half a second.
    let script = |name: &str| {
        format!("for i in 1 2 3 4 5 6 7 8 9 10; do echo $i >> {name}.txt; sleep 0.05; done")
    };
    let a = ebpf_sh(&p, "a", &script("a"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let b = ebpf_sh(&p, "b", &script("b"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A process of no run touches the project meanwhile.
    let outsider = std::process::Command::new("sh")
        .args([
            "-c",
            "for i in 1 2 3 4 5; do echo $i >> c.txt; sleep 0.05; done",
        ])
        .current_dir(p.path())
        .status()
        .unwrap();
    assert!(outsider.success());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success(), "{}", stderr(&a));
    assert!(b.status.success(), "{}", stderr(&b));
    let log = p.roar(["log", "--json"]);
    let jobs: serde_json::Value = serde_json::from_slice(&log.stdout).unwrap();
    for job in jobs.as_array().unwrap() {
        let name = job["name"].as_str().unwrap().to_owned();
        let full = p.job_json(job["id"].as_i64().unwrap());
        let outputs = p.files(&full, "output");
        assert_eq!(outputs, [format!("{name}.txt")], "job {name}");
        assert!(p.files(&full, "input").is_empty(), "job {name}");
    }
    assert_eq!(jobs.as_array().unwrap().len(), 2);
}

fn helpers(ring_kb: u32) -> Vec<i32> {
    common::ebpf_helpers(ring_kb)
}

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn warm_runs_use_the_resident_helper_which_exits_when_idle() {
    if !ebpf_available() {
        return;
    }
    const RING: u32 = 512;
    let p = Project::new();
    p.write("in.txt", b"data\n");
    let run = |out: &str| {
        ebpf_sh(&p, "run", &format!("cat in.txt > {out}"))
            .env("ROAR_EBPF_RING_KB", RING.to_string())
            .env("ROAR_EBPF_IDLE_SECS", "2")
            .env("ROAR_LOG", "roar_tracer=debug")
            .output()
            .unwrap()
    };
    let first = run("a.txt");
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stderr(&first).contains("resident helper"),
        "{}",
        stderr(&first)
    );
    assert_eq!(helpers(RING).len(), 1, "one helper serves the runs");
    let second = run("b.txt");
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(
        !stderr(&second).contains("no eBPF helper"),
        "the second run found the first one's helper: {}",
        stderr(&second)
    );
    for (out, want) in [("a.txt", "a.txt"), ("b.txt", "b.txt")] {
        let job = p.job_json(p.last_job()["id"].as_i64().unwrap() - i64::from(out == "a.txt"));
        assert_eq!(p.files(&job, "output"), vec![want.to_owned()]);
        assert!(p.files(&job, "input").contains(&"in.txt".to_owned()));
        assert_eq!(job["incomplete"], false);
    }
    // Two seconds without a run (after the second the programs stay attached): it exits.
    wait_until("the idle helper exits", Duration::from_secs(15), || {
        helpers(RING).is_empty()
    });
}

#[test]
fn a_process_left_by_a_killed_run_never_reaches_the_next_run() {
    if !ebpf_available() {
        return;
    }
    const RING: u32 = 1024;
    let p = Project::new();
    // Run A's command outlives its roar (killed) and writes left.txt only once run B, which gets
    // A's freed slot, has started; B ends only after that write. No timing: files hand over.
    let mut a = ebpf_sh(
        &p,
        "a",
        "echo 1 > early.txt; i=0; while [ ! -e b-started ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; echo 2 > left.txt",
    )
    .env("ROAR_EBPF_RING_KB", RING.to_string())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    wait_until("run A starts its command", Duration::from_secs(20), || {
        p.path().join("early.txt").exists()
    });
    a.kill().unwrap();
    a.wait().unwrap();
    let b = ebpf_sh(
        &p,
        "b",
        "echo > b-started; i=0; while [ ! -e left.txt ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; echo 3 > mine.txt",
    )
    .env("ROAR_EBPF_RING_KB", RING.to_string())
    .output()
    .unwrap();
    assert!(b.status.success(), "{}", stderr(&b));
    assert!(
        p.path().join("left.txt").exists(),
        "A's orphan wrote during B"
    );
    let job = p.last_job();
    assert_eq!(job["name"], "b");
    assert_eq!(
        p.files(&job, "output"),
        vec!["b-started".to_owned(), "mine.txt".to_owned()]
    );
    assert!(!p.files(&job, "input").contains(&"left.txt".to_owned()));
    assert_eq!(job["incomplete"], false, "{}", stderr(&b));
    // A's own job: the helper followed A's command into A's journal after A died, to its end;
    // the next roar command recovered it whole.
    let mut a_job = serde_json::Value::Null;
    wait_until("run A's job is recovered", Duration::from_secs(20), || {
        let log = p.roar(["log", "--json", "-n", "0"]);
        let log: serde_json::Value = serde_json::from_slice(&log.stdout).unwrap();
        let found = log
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["name"] == "a" && j["status"] == "killed")
            .and_then(|j| j["id"].as_i64());
        if let Some(id) = found {
            let j = p.job_json(id);
            if !p.files(&j, "output").is_empty() {
                a_job = j;
                return true;
            }
        }
        false
    });
    assert_eq!(
        p.files(&a_job, "output"),
        vec!["early.txt".to_owned(), "left.txt".to_owned()],
        "{a_job}"
    );
    assert_eq!(a_job["incomplete"], false, "{a_job}");
}

#[test]
fn a_helper_that_dies_during_a_run_makes_the_job_incomplete() {
    if !ebpf_available() {
        return;
    }
    const RING: u32 = 256;
    let p = Project::new();
    // The command writes after.txt once the test says go, after the helper is gone.
    let run = ebpf_sh(
        &p,
        "run",
        "echo 1 > before.txt; i=0; while [ ! -e go ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; echo 2 > after.txt",
    )
    .env("ROAR_EBPF_RING_KB", RING.to_string())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_until(
        "the run starts its command",
        Duration::from_secs(20),
        || p.path().join("before.txt").exists(),
    );
    let pids = helpers(RING);
    assert_eq!(pids.len(), 1, "the run started a helper");
    // SAFETY: kill with a pid we just found.
    unsafe { libc::kill(pids[0], libc::SIGKILL) };
    wait_until("the helper is gone", Duration::from_secs(20), || {
        helpers(RING).is_empty()
    });
    std::fs::write(p.path().join("go"), "").unwrap();
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "the command's status is its own");
    assert!(p.path().join("after.txt").exists());
    let job = p.last_job();
    assert_eq!(job["incomplete"], true, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("incomplete (the eBPF helper exited while the command ran"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_run_inside_another_roar_loads_the_programs_itself() {
    if !ebpf_available() {
        return;
    }
    const RING: u32 = 128;
    let p = Project::new();
    // A helper started here would be an orphan the outer run waits for (for its idle time).
    let inner = format!(
        "{} run --tracer ebpf -- sh -c 'echo x > inner.txt'",
        common::roar_bin().display()
    );
    let started = Instant::now();
    let out = p
        .cmd(["run", "--tracer", "preload", "--", "sh", "-c", &inner])
        .env("ROAR_EBPF_RING_KB", RING.to_string())
        .env("ROAR_EBPF_IDLE_SECS", "60")
        .env("ROAR_LOG", "roar_tracer=debug")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(
        stderr(&out).contains("programs loaded by this run"),
        "{}",
        stderr(&out)
    );
    assert!(helpers(RING).is_empty());
}
