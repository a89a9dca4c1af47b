//! What people expect of a command-line tool (issue 30): roar's options are roar's, output into
//! a closed pipe stops quietly, `--json` everywhere something is reported, colour only on a
//! terminal, `roar config`, `roar rm`, completions and a man page, `roar hash` past bad entries,
//! and the install command (into a temporary prefix) and a binary installed alone.

use crate::common;

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use common::{roar_bin, stderr, stdout, Project};

fn pipeline() -> Project {
    let p = Project::new();
    p.write("raw.txt", b"2\n1\n");
    for (name, cmd) in [
        ("sort", "sort raw.txt > sorted.txt"),
        ("top", "head -n 1 sorted.txt > top.txt"),
    ] {
        let out = p.roar(["run", "--name", name, "--", "sh", "-c", cmd]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    p
}

#[test]
fn options_before_the_command_are_roars() {
    let p = Project::new();
    let out = p.roar(["run", "-q", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unexpected argument '-q'"),
        "{}",
        stderr(&out)
    );
    let log = p.roar(["log", "--json"]);
    assert_eq!(stdout(&log).trim(), "[]", "nothing was run or recorded");
    // From the command's name on, everything is the command's, hyphens included.
    let out = p.roar(["run", "sh", "-c", "echo -n ok"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "ok");
}

/// Runs roar with its stdout a pipe whose reader is already gone: the first write fails.
fn into_closed_pipe(p: &Project, args: &[&str]) -> std::process::Output {
    let mut fds = [0; 2];
    // SAFETY: pipe fills two descriptors we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fresh descriptors from pipe().
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    p.cmd(args).stdout(Stdio::from(write)).output().unwrap()
}

#[test]
fn reports_into_a_closed_pipe_stop_quietly() {
    let p = pipeline();
    let commands: &[&[&str]] = &[
        &["log"],
        &["show", "1"],
        &["show", "sorted.txt"],
        &["db"],
        &["dag"],
        &["dag", "--dot"],
        &["lineage", "top.txt"],
        &["inputs", "top.txt"],
        &["status"],
        &["diff", "1", "2"],
        &["export", "--all"],
        &["reproduce", "top.txt"],
        &["hash", "raw.txt"],
        &["config", "list"],
        &["completions", "bash"],
        &["man"],
        &["tracer", "check", "preload"],
        &["log", "--json"],
    ];
    for args in commands {
        for _ in 0..20 {
            let out = into_closed_pipe(&p, args);
            let err = stderr(&out);
            assert!(
                !err.contains("panicked") && !err.contains("Broken pipe"),
                "{args:?}: {err}"
            );
            let quiet = out.status.code() == Some(0) || out.status.signal() == Some(libc::SIGPIPE);
            assert!(quiet, "{args:?}: {:?} {err}", out.status);
        }
    }
    // And through a real `head -1`, as people type it.
    let out = Command::new("bash")
        .args([
            "-c",
            &format!(
                "set -o pipefail; {} export --all | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}",
                roar_bin().display()
            ),
        ])
        .current_dir(p.path())
        .output()
        .unwrap();
    let code = stdout(&out);
    assert!(
        code.trim() == "0" || code.trim() == "141",
        "{code} {}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

#[test]
fn run_json_is_one_object_on_stderr_and_stdout_stays_the_commands() {
    let p = Project::new();
    p.write("in.txt", b"x");
    let out = p.roar([
        "--json",
        "run",
        "-v",
        "--",
        "sh",
        "-c",
        "cat in.txt > out.txt; echo hello",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "hello\n");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    let v: serde_json::Value = serde_json::from_str(&err).unwrap();
    assert_eq!(v["job"], 1);
    assert_eq!(v["inputs"], 1);
    assert_eq!(v["outputs"], 1);
    assert_eq!(v["incomplete"], false);
    let files = v["files"].as_array().unwrap();
    assert_eq!(files.len(), 2, "{v}");
    assert_eq!(
        files[1]["blake3"],
        blake3::hash(b"x").to_hex().as_str(),
        "{v}"
    );
}

#[test]
fn diagnostics_have_colour_only_on_a_terminal() {
    let p = Project::new();
    // ROAR_LOG=debug makes roar log to stderr; stderr here is a pipe: no escape codes.
    for no_color in [None, Some("1")] {
        let mut cmd = p.cmd(["run", "--", "true"]);
        cmd.env("ROAR_LOG", "debug");
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        let out = cmd.output().unwrap();
        let err = stderr(&out);
        assert!(err.contains("DEBUG"), "ROAR_LOG=debug logs: {err}");
        assert!(!err.contains('\x1b'), "{err:?}");
    }
}

#[test]
fn config_is_read_and_changed_with_validation() {
    let p = Project::new();
    let config = p.path().join(".roar/config.toml");
    let get = |key: &str| stdout(&p.roar(["config", "get", key])).trim().to_owned();
    assert_eq!(get("tracer"), "auto");
    assert_eq!(get("s3.region"), "us-east-1");
    let out = p.roar(["config", "set", "tracer", "ptrace"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(get("tracer"), "ptrace");
    assert!(
        std::fs::read_to_string(&config)
            .unwrap()
            .contains("# Default tracer"),
        "comments kept"
    );
    let out = p.roar(["config", "set", "ignore", r#"["*.log", "scratch/**"]"#]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(get("ignore"), r#"["*.log", "scratch/**"]"#);
    let list: serde_json::Value =
        serde_json::from_slice(&p.roar(["config", "list", "--json"]).stdout).unwrap();
    assert_eq!(list["tracer"], "ptrace");
    assert_eq!(list["s3.enabled"], false);
    // Refused, one line each, and the file is left as it was.
    let before = std::fs::read(&config).unwrap();
    for (args, says) in [
        (vec!["config", "set", "tracer", "strace"], "is not a tracer"),
        (vec!["config", "set", "hash", "md5"], "is not supported"),
        (
            vec!["config", "set", "ignore", r#"["data**"]"#],
            "must be a whole path component",
        ),
        (
            vec!["config", "set", "ignore", r#"["../x/**"]"#],
            "goes above the project",
        ),
        (vec!["config", "set", "ignore", r#"[""]"#], "is empty"),
        (vec!["config", "set", "s3.enabled", "maybe"], "invalid type"),
        (vec!["config", "set", "colour", "on"], "unknown setting"),
        (vec!["config", "get", "colour"], "unknown setting"),
    ] {
        let out = p.roar(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read(&config).unwrap(), before);
    // A broken file: one line with the file, the line number and the line.
    let mut text = String::from_utf8(before).unwrap();
    text = text.replacen("hash = \"blake3\"", "hash = blake3", 1);
    std::fs::write(&config, &text).unwrap();
    let line = text.lines().position(|l| l == "hash = blake3").unwrap() + 1;
    let out = p.roar(["log"]);
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&format!("config.toml:{line}:")), "{err}");
    assert!(err.contains("hash = blake3"), "{err}");
}

#[test]
fn relative_ignore_globs_work_as_in_gitignore() {
    let p = Project::new();
    std::fs::create_dir_all(p.path().join("scratch/deep")).unwrap();
    let out = p.roar(["config", "set", "ignore", r#"["*.log", "scratch/**"]"#]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = p.roar([
        "run", "--", "sh", "-c",
        "echo a > run.log; echo b > scratch/deep/x; echo c > keep.txt; mkdir -p sub; echo d > sub/w.log",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = p.last_job();
    assert_eq!(p.files(&job, "output"), ["keep.txt"]);
}

#[test]
fn rm_forgets_jobs_and_never_files() {
    let p = pipeline();
    let out = p.roar(["rm", "1", "nope"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(
        stdout(&p.roar(["log", "-n", "0"])).lines().count(),
        2,
        "a typo removes nothing"
    );
    let out = p.roar(["rm", "sort"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("removed job 1"), "{}", stdout(&out));
    assert!(p.path().join("sorted.txt").exists());
    assert_eq!(stdout(&p.roar(["log", "-n", "0"])).lines().count(), 1);
    assert_eq!(p.roar(["show", "1"]).status.code(), Some(4));
    // What job 1 made is now a root input of job 2.
    let lineage: serde_json::Value =
        serde_json::from_slice(&p.roar(["lineage", "top.txt", "--json"]).stdout).unwrap();
    assert_eq!(lineage["steps"].as_array().unwrap().len(), 1);
    let db: serde_json::Value = serde_json::from_slice(&p.roar(["db", "--json"]).stdout).unwrap();
    assert_eq!(db["jobs"], 1);
    assert_eq!(
        db["artifacts"], 2,
        "sorted.txt and top.txt: raw.txt's record went with job 1"
    );
}

#[test]
fn hash_reports_unreadable_entries_and_goes_on() {
    let p = Project::new();
    let d = p.path().join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("ok.txt"), b"fine").unwrap();
    std::os::unix::fs::symlink("loop-b", d.join("loop-a")).unwrap();
    std::os::unix::fs::symlink("loop-a", d.join("loop-b")).unwrap();
    std::os::unix::fs::symlink("..", d.join("up")).unwrap();
    let out = p.roar(["hash", "d"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains(&format!("{}  d/ok.txt", blake3::hash(b"fine").to_hex())),
        "{}",
        stdout(&out)
    );
    let err = stderr(&out);
    assert!(err.contains("loop-a") && err.contains("loop-b"), "{err}");
    assert!(
        err.contains("skipped d/up: a symbolic link to a directory"),
        "{err}"
    );
    assert!(err.contains("2 of 3 entries could not be hashed"), "{err}");
}

#[test]
fn completions_parse_and_the_man_page_renders() {
    let p = Project::new();
    for (shell, check) in [
        ("bash", vec!["bash", "-n"]),
        ("zsh", vec!["zsh", "-n"]),
        ("fish", vec!["fish", "--no-execute"]),
    ] {
        if !common::require_tool(check[0]) {
            continue;
        }
        let out = p.roar(["completions", shell]);
        assert!(out.status.success(), "{}", stderr(&out));
        let file = p.path().join(format!("roar.{shell}"));
        std::fs::write(&file, &out.stdout).unwrap();
        let checked = Command::new(check[0])
            .args(&check[1..])
            .arg(&file)
            .output()
            .unwrap();
        assert!(checked.status.success(), "{shell}: {}", stderr(&checked));
        assert!(
            stdout(&out).contains("lineage"),
            "{shell} completes subcommands"
        );
    }
    if common::require_tool("groff") {
        let man = p.roar(["man"]);
        assert!(man.status.success());
        let file = p.path().join("roar.1");
        std::fs::write(&file, &man.stdout).unwrap();
        let out = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        assert!(
            text.contains("Record data lineage by observing execution"),
            "{text}"
        );
        assert!(text.contains("reproduce"), "{text}");
    }
}

#[test]
fn the_install_command_installs_and_uninstalls_without_leftovers() {
    let prefix = tempfile::tempdir().unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // --from: the same steps on the build the suite already has (no second, release build).
    let built = roar_bin().parent().unwrap().to_owned();
    let out = Command::new("bash")
        .arg(repo.join("scripts/install.sh"))
        .arg("--from")
        .arg(&built)
        .arg("--prefix")
        .arg(prefix.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let roar = prefix.path().join("bin/roar");
    let shim = prefix.path().join("lib/roar/libroar_preload.so");
    assert!(shim.is_file());
    let v = Command::new(&roar).arg("--version").output().unwrap();
    assert!(
        stdout(&v).contains(&format!(
            "{} (installed)",
            prefix.path().join("lib/roar/libroar_preload.so").display()
        )),
        "{}",
        stdout(&v)
    );
    let check = Command::new(&roar)
        .args(["tracer", "check", "preload"])
        .output()
        .unwrap();
    assert!(
        stdout(&check).starts_with("preload  ok"),
        "{}",
        stdout(&check)
    );
    let work = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(&roar)
            .args(args)
            .current_dir(work.path())
            .env_remove("ROAR_PRELOAD_LIB")
            .output()
            .unwrap()
    };
    assert!(run(&["init"]).status.success());
    let out = run(&["run", "--tracer", "preload", "--", "sh", "-c", "echo x > f"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1 outputs, preload"),
        "{}",
        stderr(&out)
    );
    assert!(prefix.path().join("share/man/man1/roar.1").is_file());
    let out = Command::new("bash")
        .arg(repo.join("scripts/install.sh"))
        .args(["--uninstall", "--prefix"])
        .arg(prefix.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let left: Vec<_> = std::fs::read_dir(prefix.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_binary_installed_alone_uses_the_shim_built_into_it() {
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("bin/roar");
    std::fs::create_dir(dir.path().join("bin")).unwrap();
    common::copy_executable(&roar_bin(), &alone);
    let cache = dir.path().join("cache");
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let run = |args: &[&str]| {
        Command::new(&alone)
            .args(args)
            .current_dir(&work)
            .env("XDG_CACHE_HOME", &cache)
            .env_remove("ROAR_PRELOAD_LIB")
            .output()
            .unwrap()
    };
    let v = stdout(&run(&["--version"]));
    assert!(v.contains("preload shim: built in"), "{v}");
    assert!(run(&["init"]).status.success());
    // Two runs at once: neither loads a half-written shim.
    let children: Vec<_> = (0..2)
        .map(|i| {
            Command::new(&alone)
                .args([
                    "run",
                    "--tracer",
                    "preload",
                    "--",
                    "sh",
                    "-c",
                    &format!("echo {i} > f{i}"),
                ])
                .current_dir(&work)
                .env("XDG_CACHE_HOME", &cache)
                .env_remove("ROAR_PRELOAD_LIB")
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("1 outputs, preload"),
            "{}",
            stderr(&out)
        );
    }
    // The package cache (roar_env::cache) lives there too; everything else is the shim's.
    let written: Vec<_> = std::fs::read_dir(cache.join("roar"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("packages.db"))
        .collect();
    assert_eq!(
        written.len(),
        1,
        "one shim file, no temporaries left: {written:?}"
    );
    assert!(written[0].starts_with("libroar_preload-"), "{written:?}");
}

#[test]
fn trace_shows_each_access_as_it_happens_on_every_backend() {
    let mut backends = vec!["preload", "ptrace"];
    if common::ebpf_available() {
        backends.push("ebpf");
    }
    for backend in backends {
        let p = Project::new();
        p.write("in.txt", b"x");
        let trace = p.path().join("trace.log");
        let out = p
            .cmd(["run", "--tracer", backend, "--summary", "--trace-file"])
            .arg(&trace)
            .args([
                "--",
                "sh",
                "-c",
                "cat in.txt > tmp.txt && mv tmp.txt out.txt && rm -f gone",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{backend}: {}", stderr(&out));
        let text = std::fs::read_to_string(&trace).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .map(|l| {
                l.strip_prefix("roar: [")
                    .and_then(|l| l.split_once("] "))
                    .map(|x| x.1)
                    .unwrap_or(l)
            })
            .collect();
        for want in [
            "exec sh -c 'cat in.txt > tmp.txt && mv tmp.txt out.txt && rm -f gone'",
            "open R in.txt",
            "open W (create, truncate) tmp.txt",
            "rename tmp.txt -> out.txt",
        ] {
            assert!(lines.contains(&want), "{backend}: no {want:?} in {text}");
        }
        // Events keep their order: the rename is seen after the write it follows.
        let pos = |w: &str| lines.iter().position(|l| *l == w).unwrap();
        assert!(
            pos("open W (create, truncate) tmp.txt") < pos("rename tmp.txt -> out.txt"),
            "{text}"
        );
        let err = stderr(&out);
        assert!(err.contains("roar: summary of"), "{err}");
        assert!(
            err.lines().any(|l| l.trim_end().ends_with("rename")),
            "{err}"
        );
        // Without --trace, the command's stderr has nothing of it.
        let out = p.roar(["run", "--tracer", backend, "--", "cat", "in.txt"]);
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    }
}

#[test]
fn gateway_and_unmount_report_in_json() {
    let p = Project::new();
    let gw = common::server::Server::spawn(
        p.cmd(["--json", "gateway", "--listen", "127.0.0.1:0"]),
        p.path().join("gateway.log"),
    );
    let v: serde_json::Value =
        serde_json::from_str(&gw.line).unwrap_or_else(|e| panic!("{e}: {}", gw.line));
    assert!(
        v["endpoint"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:"),
        "{v}"
    );
    assert_eq!(v["region"], "us-east-1");
    assert!(
        v["access_key_id"].as_str().is_some_and(|k| !k.is_empty()),
        "{v}"
    );
    assert!(
        v["secret_access_key"]
            .as_str()
            .is_some_and(|k| !k.is_empty()),
        "{v}"
    );
    drop(gw);
    if !common::mount::require_fuse() {
        return;
    }
    let mut m = common::mount::Mounted::new(|_| {});
    let out = m.p.roar(["--json", "unmount", "data"]);
    assert!(out.status.success(), "{}", stderr(&out));
    m.mounted = false;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "unmounted", "{v}");
    assert_eq!(v["dir"], m.data.to_str().unwrap(), "{v}");
}

/// roar started with its standard fds closed (`2>&-`, `<&- >&- 2>&-`): the files it opens itself
/// (a trace file, its store, the event ring, the recorder's socket) must not take those numbers,
/// or its own report would be written into them. Its command gets them closed too, and both ways
/// of recording leave a whole store with the job in it.
#[test]
fn roar_started_with_its_standard_fds_closed_writes_nothing_into_its_own_files() {
    let p = Project::new();
    let config = p.path().join(".roar/config.toml");
    let config_before = std::fs::read(&config).unwrap();
    let runs = [
        ("0", "2>&-"),
        ("1", "2>&-"),
        ("0", "<&- >&- 2>&-"),
        ("1", "<&- >&- 2>&-"),
    ];
    for (i, (recorder, closed)) in runs.into_iter().enumerate() {
        let script = format!(
            "exec env ROAR_RECORDER={recorder} {} run --name closed{i} --trace-file trace{i}.txt -- sh -c 'echo {i} > out{i}.txt' {closed}",
            roar_bin().display()
        );
        let status = Command::new("sh")
            .args(["-c", &script])
            .current_dir(p.path())
            .status()
            .unwrap();
        assert!(status.success(), "{script}: {status:?}");
        let out = std::fs::read_to_string(p.path().join(format!("out{i}.txt"))).unwrap();
        assert_eq!(out, format!("{i}\n"));
        let trace = std::fs::read_to_string(p.path().join(format!("trace{i}.txt"))).unwrap();
        assert!(trace.contains(&format!("out{i}.txt")), "{script}: {trace}");
        assert!(
            !trace.contains("roar: job"),
            "{script}: roar's report went into its trace file: {trace}"
        );
    }
    assert_eq!(std::fs::read(&config).unwrap(), config_before);
    let log = p.roar(["log", "--json"]);
    assert!(log.status.success(), "{}", stderr(&log));
    let jobs: serde_json::Value = serde_json::from_slice(&log.stdout).unwrap();
    assert_eq!(jobs.as_array().map(Vec::len), Some(runs.len()), "{jobs}");
    for i in 0..runs.len() {
        let out = p.roar(["lineage", &format!("out{i}.txt")]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stdout(&out).contains(&format!("closed{i}")),
            "{}",
            stdout(&out)
        );
    }
}

/// A mistyped command is one line naming the command meant (swapped letters too), exit 2.
#[test]
fn a_mistyped_command_says_which_was_meant() {
    for (typed, meant) in [("lgo", "log"), ("shwo", "show"), ("reproduec", "reproduce")] {
        let o = Command::new(roar_bin()).arg(typed).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{typed}");
        let err = stderr(&o);
        assert!(
            err.contains(&format!("did you mean `roar {meant}`")) && err.lines().count() == 1,
            "{typed}: {err}"
        );
    }
}

/// Hashing that takes long shows a progress line on a terminal (`script` gives roar one), cleared
/// before the job's summary; without a terminal, nothing (issue 60: a 2 GiB output was hashed in
/// silence). The line's delay is 0 here (ROAR_PROGRESS_AFTER_MS), a second otherwise.
#[test]
fn long_hashing_shows_progress_on_a_terminal_only() {
    if !common::require_tool("script") {
        return;
    }
    let p = Project::new();
    let cmd = format!(
        "{} run -- sh -c 'head -c 64M /dev/zero > big.bin'",
        roar_bin().display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .current_dir(p.path())
        .env("ROAR_PROGRESS_AFTER_MS", "0")
        .env_remove("ROAR_DIR")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let tty = String::from_utf8_lossy(&out.stdout);
    let line = tty.find("roar: hashing the job's files: ");
    let summary = tty.find("roar: job 1,");
    assert!(line.is_some() && summary.is_some(), "{tty:?}");
    assert!(
        tty[..summary.unwrap()].ends_with("\r\x1b[2K"),
        "the progress line was not cleared: {tty:?}"
    );
    let o = p
        .cmd(["run", "--", "sh", "-c", "head -c 64M /dev/zero > big2.bin"])
        .env("ROAR_PROGRESS_AFTER_MS", "0")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(!stderr(&o).contains("hashing"), "{}", stderr(&o));
}
