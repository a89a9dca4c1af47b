//! `roar run` on real processes, under each backend: the coverage workloads, with strace as the
//! oracle for which files each one touched, and the command's exit status and signals kept.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::workloads::{sh, workloads, C_FOPEN};
use common::{require_tool, stderr, Project};

fn set(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

fn prerequisites() -> bool {
    ["python3", "make", "cc", "tar", "sed", "strace"]
        .iter()
        .all(|t| require_tool(t))
        && python_has_numpy()
}

fn python_has_numpy() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        common::skip("numpy is not installed (scripts/setup.sh installs it)");
    }
    ok
}

/// The files strace saw the command open, create, rename, link, truncate or unlink successfully,
/// relative to the project, excluding directories.
fn strace_files(p: &Project, argv: &[&str]) -> BTreeSet<String> {
    // -ff writes one log per process, so no call is split into unfinished/resumed halves.
    let log = p.path().join(".roar/strace.log");
    let status = Command::new("strace")
        .args(["-ff", "-qq", "-e", "trace=open,openat,creat,rename,renameat,renameat2,link,linkat,unlink,unlinkat,truncate,symlink,symlinkat", "-o"])
        .arg(&log)
        .args(argv)
        .current_dir(p.path())
        .output()
        .unwrap();
    let _ = status;
    let root = std::fs::canonicalize(p.path()).unwrap();
    let mut text = String::new();
    for entry in std::fs::read_dir(p.path().join(".roar")).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("strace.log.")
        {
            text.push_str(&std::fs::read_to_string(path).unwrap());
        }
    }
    let mut files = BTreeSet::new();
    for line in text.lines() {
        let Some(eq) = line.rfind(" = ") else {
            continue;
        };
        let ok = line[eq + 3..]
            .split_whitespace()
            .next()
            .and_then(|r| r.parse::<i64>().ok())
            .is_some_and(|r| r >= 0);
        if !ok || line.contains("O_DIRECTORY") || line.contains("AT_REMOVEDIR") {
            continue;
        }
        let quoted: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
        // A symlink's target is a string, not a file the job used: only the link's own path.
        let used = if line.starts_with("symlink") {
            &quoted[quoted.len().saturating_sub(1)..]
        } else {
            &quoted[..]
        };
        for quoted in used {
            let path = root.join(quoted);
            let Ok(rel) = path.strip_prefix(&root) else {
                continue;
            };
            let rel = rel.to_string_lossy().into_owned();
            if rel.starts_with(".roar") || rel.is_empty() || path.is_dir() {
                continue;
            }
            files.insert(rel);
        }
    }
    files
}

#[test]
fn coverage_workloads_match_expectations_and_strace_on_every_backend() {
    if !prerequisites() {
        return;
    }
    let mut failures = Vec::new();
    for w in workloads() {
        let mut strace_set = None;
        for backend in common::backends() {
            let p = Project::new();
            sh(p.path(), w.setup);
            let out = p.roar([&["run", "--tracer", backend, "--"][..], w.argv].concat());
            if out.status.code() != Some(w.exit) {
                failures.push(format!(
                    "{} [{backend}]: exit {:?}, want {}: {}",
                    w.name,
                    out.status.code(),
                    w.exit,
                    stderr(&out)
                ));
                continue;
            }
            let job = p.last_job();
            let (inputs, outputs) = (p.files(&job, "input"), p.files(&job, "output"));
            if inputs != set(w.inputs) || outputs != set(w.outputs) {
                failures.push(format!(
                    "{} [{backend}]: inputs {inputs:?} outputs {outputs:?}, want {:?} {:?}",
                    w.name, w.inputs, w.outputs
                ));
            }
            // Every recorded output hash is the content the file has now (early hashes taken at
            // close time must not survive a later write).
            for f in job["files"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["role"] == "output")
            {
                let Some(recorded) = f["hash"]["blake3"].as_str() else {
                    continue;
                };
                let path = std::path::PathBuf::from(f["path"].as_str().unwrap());
                let actual = roar_store::hash::hash_path(&path, Default::default())
                    .unwrap()
                    .hash
                    .blake3;
                if recorded != actual {
                    failures.push(format!(
                        "{} [{backend}]: {} recorded {recorded}, is {actual}",
                        w.name,
                        path.display()
                    ));
                }
            }
            let expected_backend = job["backend"].as_str().unwrap_or_default();
            assert_eq!(expected_backend, backend);
            if w.oracle {
                let roar_set: BTreeSet<String> = inputs
                    .iter()
                    .chain(&outputs)
                    .chain(&p.files(&job, "temp"))
                    .cloned()
                    .collect();
                // strace runs the same workload in a fresh copy of the same setup.
                let oracle = strace_set.get_or_insert_with(|| {
                    let q = Project::new();
                    sh(q.path(), w.setup);
                    strace_files(&q, w.argv)
                });
                let normalize = |s: &BTreeSet<String>| -> BTreeSet<String> {
                    // Random temporary names (sed's, Python's) differ between runs.
                    s.iter()
                        .map(|f| {
                            if f.starts_with("sed") {
                                "sed*".into()
                            } else {
                                f.clone()
                            }
                        })
                        .collect()
                };
                if normalize(&roar_set) != normalize(oracle) {
                    failures.push(format!(
                        "{} [{backend}]: roar saw {roar_set:?}, strace saw {oracle:?}",
                        w.name
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn paths_with_spaces_newlines_and_non_utf8_bytes_are_recorded_exactly() {
    if !require_tool("python3") {
        return;
    }
    for backend in common::backends() {
        let p = Project::new();
        let script = "import os\nfor n in [b'with space.txt', b'new\\nline.txt', b'caf\\xe9.txt']:\n    open(n, 'wb').write(n)\n";
        let out = p.roar(["run", "--tracer", backend, "--", "python3", "-c", script]);
        assert!(out.status.success(), "{}", stderr(&out));
        let outputs = p.files(&p.last_job(), "output");
        assert_eq!(outputs.len(), 3, "[{backend}] {outputs:?}");
        assert!(
            outputs.contains(&"with space.txt".to_owned()),
            "[{backend}] {outputs:?}"
        );
        assert!(
            outputs.contains(&"new\nline.txt".to_owned()),
            "[{backend}] {outputs:?}"
        );
        assert!(
            outputs.contains(&"caf\u{fffd}.txt".to_owned()),
            "[{backend}] {outputs:?}"
        );
        // The exact bytes are stored: the path resolves back to the artifact.
        let show = p.roar(["show", "with space.txt"]);
        assert!(show.status.success(), "{}", stderr(&show));
    }
}

/// The backend `auto` must pick for a program the preload shim cannot enter.
fn auto_for_static() -> &'static str {
    if common::ebpf_available() {
        "ebpf"
    } else {
        "ptrace"
    }
}

/// `auto` must not pick preload for the static program `prog` (which reads `input` and writes
/// `output`), and every backend that can trace it records exactly those two files.
fn assert_static_program_traced(p: &Project, prog: &str, input: &str, output: &str) {
    let out = p.roar(["run", "--", prog]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = p.last_job();
    assert_eq!(
        job["backend"],
        auto_for_static(),
        "auto must not pick preload for a static binary"
    );
    assert_eq!(p.files(&job, "input"), vec![input]);
    assert_eq!(p.files(&job, "output"), vec![output]);
    for backend in common::backends().into_iter().filter(|b| *b != "preload") {
        let out = p.roar(["run", "--tracer", backend, "--", prog]);
        assert!(out.status.success(), "[{backend}] {}", stderr(&out));
        let job = p.last_job();
        assert_eq!(p.files(&job, "input"), vec![input], "[{backend}]");
        assert_eq!(p.files(&job, "output"), vec![output], "[{backend}]");
    }
}

#[test]
fn a_statically_linked_program_is_traced_by_ebpf_or_ptrace() {
    if !require_tool("cc") {
        return;
    }
    let p = Project::new();
    sh(p.path(), &format!("echo cfile > f.in && cat > prog.c <<'EOF'\n{C_FOPEN}\nEOF\ncc -static -O1 -o sprog prog.c"));
    assert_static_program_traced(&p, "./sprog", "f.in", "f.out");
}

#[test]
fn stdout_stderr_and_stdin_pass_through_untouched() {
    for backend in common::backends() {
        let p = Project::new();
        let mut child = p
            .cmd([
                "run",
                "--tracer",
                backend,
                "--",
                "sh",
                "-c",
                "cat; echo err >&2",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"payload\n").unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.stdout, b"payload\n", "[{backend}]");
        assert!(
            stderr(&out).starts_with("err\n"),
            "[{backend}] {}",
            stderr(&out)
        );
    }
}

#[test]
fn a_missing_command_exits_127_and_leaves_no_job() {
    let p = Project::new();
    let out = p.roar(["run", "--", "definitely-not-a-command-roar"]);
    assert_eq!(out.status.code(), Some(127));
    let err = stderr(&out);
    assert!(
        err.contains("definitely-not-a-command-roar: command not found"),
        "{err}"
    );
    assert_eq!(
        err.lines().count(),
        1,
        "one line, as a shell says it: {err}"
    );
    let log: serde_json::Value = serde_json::from_slice(&p.roar(["--json", "log"]).stdout).unwrap();
    assert_eq!(log, serde_json::json!([]), "nothing ran: no job");
    p.write("noexec", b"data");
    let out = p.roar(["run", "--", "./noexec"]);
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
}

#[test]
fn secrets_in_the_environment_are_not_stored() {
    let p = Project::new();
    let out = p
        .cmd(["run", "--", "true"])
        .env("AWS_SECRET_ACCESS_KEY", "hunter2-very-secret")
        .env("MY_API_TOKEN", "tok-123")
        .output()
        .unwrap();
    assert!(out.status.success());
    let job = p.last_job();
    assert_eq!(job["env"]["AWS_SECRET_ACCESS_KEY"], "<redacted>");
    assert_eq!(job["env"]["MY_API_TOKEN"], "<redacted>");
    let db = std::fs::read(p.path().join(".roar/roar.db")).unwrap();
    let wal = std::fs::read(p.path().join(".roar/roar.db-wal")).unwrap_or_default();
    for bytes in [db, wal] {
        assert!(
            !bytes.windows(19).any(|w| w == b"hunter2-very-secret"),
            "a secret reached the store"
        );
    }
}

#[test]
fn a_dirty_git_tree_is_recorded_not_refused() {
    if !require_tool("git") {
        return;
    }
    let p = Project::new();
    let git = |args: &[&str]| {
        assert!(
            Command::new("git")
                .args(args)
                .current_dir(p.path())
                .output()
                .unwrap()
                .status
                .success(),
            "git {args:?}"
        );
    };
    git(&["init", "-q"]);
    p.write("tracked.txt", b"v1");
    git(&["add", "tracked.txt"]);
    git(&[
        "-c",
        "user.email=t@t",
        "-c",
        "user.name=t",
        "commit",
        "-qm",
        "c",
    ]);
    p.write("tracked.txt", b"v2");
    let out = p.roar(["run", "--", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = p.last_job();
    assert_eq!(job["git"]["dirty"], true);
    assert_eq!(job["git"]["commit"].as_str().map(str::len), Some(40));
}

#[test]
fn tracer_check_reports_every_backend() {
    let p = Project::new();
    let out = p.roar(["tracer", "check", "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["backend"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["preload", "ptrace", "ebpf"]);
    assert_eq!(v[0]["ok"], true, "the preload shim is built next to roar");
    // An unavailable backend is refused before anything runs.
    let out = p
        .cmd(["run", "--tracer", "preload", "--", "touch", "nope"])
        .env("ROAR_PRELOAD_LIB", "/nonexistent/libroar_preload.so")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("the preload tracer cannot run here"),
        "{}",
        stderr(&out)
    );
    assert!(!Path::new(&p.path().join("nope")).exists());
}

#[test]
fn sigterm_sent_to_roar_reaches_the_command_and_its_status_is_kept() {
    for backend in common::backends() {
        let p = Project::new();
        let mut child = p
            .cmd([
                "run",
                "--tracer",
                backend,
                "--",
                "sh",
                "-c",
                "trap 'echo term > got; exit 42' TERM; touch ready; while :; do sleep 0.01; done",
            ])
            .spawn()
            .unwrap();
        // Wait for the trap to be installed: the command says so by creating `ready`.
        let ready = p.path().join("ready");
        for _ in 0..2000 {
            if ready.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(ready.exists(), "[{backend}] the command never started");
        let pid = child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let status = child.wait().unwrap();
        assert_eq!(
            status.code(),
            Some(42),
            "[{backend}] the trap's exit status passes through"
        );
        assert_eq!(
            std::fs::read_to_string(p.path().join("got")).unwrap(),
            "term\n"
        );
        assert!(
            p.files(&p.last_job(), "output").contains(&"got".to_owned()),
            "[{backend}]"
        );
    }
}

#[test]
fn a_go_binary_is_traced_by_ebpf_or_ptrace() {
    if !require_tool("go") {
        return;
    }
    let p = Project::new();
    p.write("in.txt", b"go input\n");
    p.write(
        "main.go",
        b"package main\n\nimport \"os\"\n\nfunc main() {\n\tb, err := os.ReadFile(\"in.txt\")\n\tif err != nil {\n\t\tos.Exit(2)\n\t}\n\tif err := os.WriteFile(\"out.txt\", b, 0o644); err != nil {\n\t\tos.Exit(3)\n\t}\n}\n",
    );
    let build = Command::new("go")
        .args(["build", "-o", "gobin", "main.go"])
        .current_dir(p.path())
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .output()
        .unwrap();
    assert!(build.status.success(), "go build: {}", stderr(&build));
    assert_static_program_traced(&p, "./gobin", "in.txt", "out.txt");
}

#[test]
fn an_output_that_replaces_a_known_version_names_it() {
    let p = Project::new();
    for content in ["one", "two"] {
        let out = p.roar([
            "run",
            "--",
            "sh",
            "-c",
            &format!("echo {content} > model.bin"),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let job = p.last_job();
    let output = job["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["role"] == "output")
        .unwrap();
    let one = roar_store::hash::hash_path(&p.path().join("model.bin"), Default::default()).unwrap();
    assert_eq!(output["hash"]["blake3"], one.hash.blake3.as_str());
    let before = output["before"]["blake3"]
        .as_str()
        .expect("the first version is named");
    assert_ne!(before, one.hash.blake3);
    let show = common::stdout(&p.roar(["show", &job["id"].to_string()]));
    assert!(show.contains(&format!("(was {})", &before[..12])), "{show}");
}

#[test]
fn the_wal_a_large_job_leaves_is_checkpointed_after_roar_run_returns() {
    let p = Project::new();
    let out = p.roar([
        "run",
        "--",
        "python3",
        "-c",
        "import os\nos.mkdir('out')\nfor i in range(12000):\n    open(f'out/{i}', 'w').write(str(i))",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // 12,000 recorded files take the WAL past its limit; `roar run` returned without folding it
    // into the database, and the process it started does so and truncates it.
    let wal = p.path().join(".roar/roar.db-wal");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::metadata(&wal).map_or(0, |m| m.len()) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the WAL was not checkpointed: {} bytes",
            std::fs::metadata(&wal).unwrap().len()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let job = p.last_job();
    assert_eq!(p.files(&job, "output").len(), 12000);
}

#[test]
fn outputs_hashed_while_the_job_runs_are_checked_against_their_final_content() {
    let script = "echo first > kept
echo aaaa > rewritten
touch -r rewritten stamp
exec 3> growing
echo one >&3
exec 4> big
head -c 9437184 /dev/zero >&4
sleep 1
echo bbbb > rewritten
touch -r stamp rewritten
echo two >&3
echo tail >&4";
    for backend in common::backends() {
        let p = Project::new();
        let out = p
            .cmd([
                "run", "--timing", "--tracer", backend, "--", "sh", "-c", script,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{backend}: {}", stderr(&out));
        // `kept` and `stamp` were left alone after the second the job slept: hashed then, and not
        // read again. `rewritten` (same size, mtime put back: only its ctime moved), `growing` and
        // `big` (written again through a descriptor opened before; `big` is big enough to be
        // confirmed before the store's write lock is taken) changed after their early hash.
        assert!(
            stderr(&out).contains("(2 files hashed during the run)"),
            "{backend}: {}",
            stderr(&out)
        );
        let job = p.last_job();
        let outputs: Vec<(String, String)> = job["files"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["role"] == "output")
            .map(|f| {
                let name = Path::new(f["path"].as_str().unwrap()).file_name().unwrap();
                let hash = f["hash"]["blake3"].as_str().unwrap();
                (name.to_string_lossy().into_owned(), hash.to_owned())
            })
            .collect();
        let mut big = vec![0u8; 9437184];
        big.extend_from_slice(b"tail\n");
        let mut expected: Vec<(String, String)> = [
            ("kept", b"first\n".as_slice()),
            ("rewritten", b"bbbb\n"),
            ("stamp", b""),
            ("growing", b"one\ntwo\n"),
            ("big", &big),
        ]
        .iter()
        .map(|(name, content)| {
            let hash = blake3::hash(content).to_hex().to_string();
            (name.to_string(), hash)
        })
        .collect();
        expected.sort();
        let mut outputs = outputs;
        outputs.sort();
        assert_eq!(outputs, expected, "{backend}");
    }
}

#[test]
fn each_line_roar_prints_reaches_stderr_in_one_write() {
    // A background process the command leaves behind may still be writing to the same terminal:
    // a line written in pieces can be split by its output. strace shows roar's own writes.
    if !require_tool("strace") {
        return;
    }
    let p = Project::new();
    let log = p.path().join(".roar/writes.log");
    let out = Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-e",
            "trace=write",
            "-e",
            "signal=none",
            "-s",
            "4096",
            "-o",
        ])
        .arg(&log)
        .arg(common::roar_bin())
        .args([
            "run",
            "-v",
            "--tracer",
            "preload",
            "--",
            "sh",
            "-c",
            "echo hi > out.txt",
        ])
        .current_dir(p.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let writes: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let call = l.split_once("write(2, \"")?.1;
            Some(call.rsplit_once("\", ")?.0.to_owned())
        })
        .collect();
    let printed = stderr(&out);
    for line in printed
        .lines()
        .filter(|l| l.starts_with("roar: job") || l.contains("out.txt"))
    {
        assert!(
            writes.iter().any(|w| *w == format!("{line}\\n")),
            "{line:?} was not written whole; roar's writes to stderr: {writes:#?}"
        );
    }
    assert!(printed.lines().any(|l| l.contains("out.txt")), "{printed}");
}

/// The ignored and blocked signal sets `cat /proc/self/status` reports when `cmd` runs it, all of
/// them: glibc's own 32 and 33 too (a posix_spawn child has them ignored, a fork child of a
/// shell does not: the command must start as roar was started either way).
fn signal_sets(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    common::stdout(&out)
        .lines()
        .filter_map(|l| {
            let (name, set) = l.split_once(":\t")?;
            let set = u64::from_str_radix(set, 16).ok()?;
            ["SigIgn", "SigBlk"]
                .contains(&name)
                .then(|| format!("{name} {set:#x}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn the_command_starts_with_the_signal_state_roar_was_started_with() {
    use std::os::unix::process::CommandExt;
    // As a background job of a non-interactive shell under `nohup` starts: HUP, INT and QUIT
    // ignored; SIGPIPE ignored, as Python's subprocess leaves it with `restore_signals=False`;
    // and SIGUSR1 blocked, as some job runners leave it.
    fn nohup_like(cmd: &mut Command) -> &mut Command {
        // SAFETY: signal and sigprocmask are async-signal-safe; the sigset is ours.
        unsafe {
            cmd.pre_exec(|| {
                for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGPIPE] {
                    libc::signal(sig, libc::SIG_IGN);
                }
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGUSR1);
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                Ok(())
            })
        }
    }
    // As a shell's fork starts a command: glibc's own 32 and 33 at their default (a posix_spawn
    // child, as this test's plain Command may be, has them ignored). glibc's signal() refuses
    // them: the kernel's rt_sigaction with a zeroed action (SIG_DFL, no flags).
    fn by_a_shell(cmd: &mut Command) -> &mut Command {
        // SAFETY: rt_sigaction is async-signal-safe; the action is a zeroed kernel sigaction.
        unsafe {
            cmd.pre_exec(|| {
                let default = [0u64; 4];
                for sig in [32, 33] {
                    libc::syscall(libc::SYS_rt_sigaction, sig, default.as_ptr(), 0, 8);
                }
                Ok(())
            })
        }
    }
    let p = Project::new();
    for started in ["plainly", "like nohup", "by a shell"] {
        let setup = |cmd: &mut Command| {
            if started == "like nohup" {
                nohup_like(cmd);
            }
            if started == "by a shell" {
                by_a_shell(cmd);
            }
        };
        let mut bare = Command::new("cat");
        bare.arg("/proc/self/status");
        setup(&mut bare);
        let expected = signal_sets(&mut bare);
        for backend in common::backends() {
            let mut traced = p.cmd(["run", "--tracer", backend, "--", "cat", "/proc/self/status"]);
            setup(&mut traced);
            assert_eq!(
                signal_sets(&mut traced),
                expected,
                "[{backend}] started {started}"
            );
        }
    }
}

#[test]
fn the_command_is_found_and_run_as_a_shell_would() {
    let p = Project::new();
    let first = p.path().join("first");
    let second = p.path().join("second");
    std::fs::create_dir_all(&first).unwrap();
    std::fs::create_dir_all(&second).unwrap();
    // A same-named file without execute permission earlier on PATH is passed over, and a script
    // without a `#!` line is run by /bin/sh.
    std::fs::write(first.join("roar-found"), "exit 9\n").unwrap();
    std::fs::write(second.join("roar-found"), "echo \"$0 $1\" > found.txt\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        second.join("roar-found"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let path = format!(
        "{}:{}:{}",
        first.display(),
        second.display(),
        std::env::var("PATH").unwrap()
    );
    let found = p.path().join("found.txt");
    for backend in common::backends() {
        // Each backend's run must write it anew.
        let _ = std::fs::remove_file(&found);
        let out = p
            .cmd(["run", "--tracer", backend, "--", "roar-found", "arg"])
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(out.status.success(), "[{backend}] {}", stderr(&out));
        assert_eq!(
            std::fs::read_to_string(&found).unwrap(),
            format!("{} arg\n", second.join("roar-found").display()),
            "[{backend}]"
        );
        assert!(
            p.files(&p.last_job(), "output")
                .contains(&"found.txt".to_owned()),
            "[{backend}]"
        );
        // Only non-executable candidates: 126, as a shell says.
        let out = p
            .cmd(["run", "--tracer", backend, "--", "roar-found"])
            .env("PATH", first.display().to_string())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(126), "[{backend}] {}", stderr(&out));
    }
}

/// The early hasher starts with the first written path, on every backend: an output left alone
/// while the command goes on is hashed during the run, and the recorded hash is its content. A
/// command that writes nothing hashes nothing early.
#[test]
fn an_output_left_alone_is_hashed_during_the_run_on_every_backend() {
    let p = Project::new();
    for backend in common::backends() {
        let out = p.roar([
            "run",
            "--tracer",
            backend,
            "--timing",
            "--",
            "sh",
            "-c",
            "echo early > out.txt; sleep 0.5",
        ]);
        let err = stderr(&out);
        assert!(out.status.success(), "[{backend}] {err}");
        assert!(
            err.contains("(1 files hashed during the run)"),
            "[{backend}] {err}"
        );
        let job = p.last_job();
        let out_txt = job["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["role"] == "output" && f["path"].as_str().unwrap().ends_with("/out.txt"))
            .unwrap_or_else(|| panic!("[{backend}] no out.txt in {job}"));
        assert_eq!(
            out_txt["hash"]["blake3"].as_str().unwrap(),
            blake3::hash(b"early\n").to_hex().as_str(),
            "[{backend}]"
        );
        let out = p.roar(["run", "--tracer", backend, "--timing", "--", "sleep", "0.1"]);
        let err = stderr(&out);
        assert!(
            err.contains("(0 files hashed during the run)"),
            "[{backend}] {err}"
        );
    }
}

/// A signal sent to roar alone that is the command's (a resize, a timer, SIGUSR1) reaches the
/// command, on every backend.
#[test]
fn signals_sent_to_roar_reach_the_command() {
    let p = Project::new();
    let script = "import os, signal, sys, time\n\
        got = []\n\
        for s in (signal.SIGWINCH, signal.SIGUSR1, signal.SIGALRM):\n\
        \x20   signal.signal(s, lambda n, f: got.append(n))\n\
        open('ready', 'w').close()\n\
        end = time.time() + 10\n\
        while len(got) < 3 and time.time() < end:\n\
        \x20   time.sleep(0.01)\n\
        open('got', 'w').write(' '.join(str(n) for n in sorted(got)))\n";
    for backend in common::backends() {
        for f in ["ready", "got"] {
            let _ = std::fs::remove_file(p.path().join(f));
        }
        let mut roar = p
            .cmd(["run", "--tracer", backend, "--", "python3", "-c", script])
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !p.path().join("ready").exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "[{backend}] never ready"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        for sig in [libc::SIGWINCH, libc::SIGUSR1, libc::SIGALRM] {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(roar.id() as i32, sig) };
        }
        assert!(roar.wait().unwrap().success(), "[{backend}]");
        let got = std::fs::read_to_string(p.path().join("got")).unwrap();
        let want = format!("{} {} {}", libc::SIGUSR1, libc::SIGALRM, libc::SIGWINCH);
        assert_eq!(got, want, "[{backend}] the signals the command got");
    }
}

/// A Python started from a virtualenv reads its `pyvenv.cfg`: that is the environment the job ran
/// in, not an input of every job run from a venv.
#[test]
fn a_venvs_settings_are_not_an_input() {
    let p = Project::new();
    let venv = p.path().join("venv");
    let o = Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    p.write("in.txt", b"x");
    let python = venv.join("bin/python");
    let o = p
        .cmd(["run", "--"])
        .arg(&python)
        .args(["-c", "open('out.txt', 'w').write(open('in.txt').read())"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let inputs = p.files(&p.last_job(), "input");
    assert_eq!(inputs, ["in.txt"], "{inputs:?}");
}
