//! What only the preload backend's event transport has to prove: a ring far smaller than a burst
//! makes producers wait instead of dropping events, concurrent processes share it without losing
//! any, a process killed while reporting costs its own event only, a process that cannot map the
//! ring still reports over the socket, and a bad ring size is refused before anything runs. (The coverage workloads run on preload in run.rs.)

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::{require_tool, stderr, Project};

const FILES: usize = 20_000;
const PROCS: usize = 4;

#[test]
fn a_tiny_ring_shared_by_concurrent_processes_loses_nothing() {
    if !require_tool("python3") {
        return;
    }
    let p = Project::new();
    // Each of PROCS processes writes FILES/PROCS files and reads every one back: with a 128 KiB
    // ring (~1,000 events) the writers wait for roar over and over.
    p.write(
        "burst.py",
        format!(
            "import os, sys\n\
             from multiprocessing import Process\n\
             def work(k):\n\
             \x20   for i in range(k, {FILES}, {PROCS}):\n\
             \x20       with open(f'out/{{i}}', 'w') as f: f.write(str(i))\n\
             \x20   for i in range(k, {FILES}, {PROCS}):\n\
             \x20       open(f'out/{{i}}').read()\n\
             os.mkdir('out')\n\
             ps = [Process(target=work, args=(k,)) for k in range({PROCS})]\n\
             [x.start() for x in ps]\n\
             [x.join() for x in ps]\n\
             sys.exit(4 if all(x.exitcode == 0 for x in ps) else 1)\n"
        )
        .as_bytes(),
    );
    let out = p
        .cmd(["run", "--tracer", "preload", "--", "python3", "burst.py"])
        .env("ROAR_PRELOAD_RING_KB", "128")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let job = p.last_job();
    assert_eq!(job["incomplete"], false, "{}", stderr(&out));
    let outputs = p.files(&job, "output");
    let made = outputs.iter().filter(|f| f.starts_with("out/")).count();
    assert_eq!(made, FILES, "{}", stderr(&out));
    // Every process the pool started is in the tree.
    let procs = job["processes"].as_array().unwrap().len();
    assert!(procs > PROCS, "{procs} processes recorded");
}

/// Processes killed at random moments while they flood the ring (SIGKILL and SIGTERM, so some
/// die in the middle of writing an event), on a ring small enough that everything after them
/// goes round it many times: every file written after each kill is recorded, the run ends, and
/// an event cut off by a kill makes the job incomplete with that reason, never undecodable.
#[test]
fn processes_killed_while_reporting_lose_only_their_own_event() {
    if !require_tool("python3") {
        return;
    }
    const ROUNDS: usize = 60;
    let p = Project::new();
    p.write(
        "kill.py",
        format!(
            "import os, random, signal, sys, time\n\
             os.mkdir('after')\n\
             open('spin', 'w').close()\n\
             for r in range({ROUNDS}):\n\
             \x20   pid = os.fork()\n\
             \x20   if pid == 0:\n\
             \x20       while True:\n\
             \x20           os.close(os.open('spin', os.O_RDONLY))\n\
             \x20   time.sleep(random.random() * 0.004)\n\
             \x20   os.kill(pid, signal.SIGKILL if r % 2 else signal.SIGTERM)\n\
             \x20   os.waitpid(pid, 0)\n\
             \x20   open(f'after/{{r}}', 'w').close()\n\
             for i in range(3000):\n\
             \x20   open(f'after/{{i % {ROUNDS}}}').close()\n\
             sys.exit(4)\n"
        )
        .as_bytes(),
    );
    for attempt in 0..3 {
        let mut child = p
            .cmd(["run", "--tracer", "preload", "--", "python3", "kill.py"])
            .env("ROAR_PRELOAD_RING_KB", "128")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("attempt {attempt}: the run did not end within 120 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
        let job = p.last_job();
        let made = p
            .files(&job, "output")
            .iter()
            .filter(|f| f.starts_with("after/"))
            .count();
        assert_eq!(made, ROUNDS, "attempt {attempt}: {}", stderr(&out));
        if job["incomplete"] == true {
            assert!(
                stderr(&out).contains("cut off: a process was killed while reporting"),
                "{}",
                stderr(&out)
            );
        }
        std::fs::remove_dir_all(p.path().join("after")).unwrap();
    }
}

#[test]
fn a_process_that_cannot_map_the_ring_reports_over_the_socket() {
    if !common::can_switch_user("needs root to start a process as another user") {
        return;
    }
    let p = Project::new();
    // The unprivileged process needs to reach the shim and a directory it may write in.
    let lib = std::env::var_os("ROAR_PRELOAD_LIB")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| common::roar_bin().with_file_name("libroar_preload.so"));
    let shared = tempfile::tempdir().unwrap();
    let shim = shared.path().join("libroar_preload.so");
    std::fs::copy(&lib, &shim).unwrap();
    let dir = p.path().join("shared");
    std::fs::create_dir(&dir).unwrap();
    for (path, mode) in [
        (shared.path(), 0o755),
        (shim.as_path(), 0o755),
        (p.path(), 0o755),
        (dir.as_path(), 0o777),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    p.write("shared/in.txt", b"input");
    std::fs::set_permissions(
        p.path().join("shared/in.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    // roar is root: /proc/<roar>/fd is closed to `nobody`, whose shim must fall back.
    let script = "cp shared/in.txt shared/by-root.txt; \
                  setpriv --reuid=65534 --regid=65534 --clear-groups \
                  sh -c 'cat shared/in.txt > shared/by-nobody.txt'; \
                  cat shared/by-nobody.txt > shared/after.txt";
    let out = p
        .cmd(["run", "--tracer", "preload", "--", "sh", "-c", script])
        .env("ROAR_PRELOAD_LIB", &shim)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let job = p.last_job();
    assert_eq!(job["incomplete"], false);
    let mut outputs = p.files(&job, "output");
    outputs.sort();
    assert_eq!(
        outputs,
        [
            "shared/after.txt",
            "shared/by-nobody.txt",
            "shared/by-root.txt"
        ],
        "{}",
        stderr(&out)
    );
    assert_eq!(p.files(&job, "input"), ["shared/in.txt"]);
}

#[test]
fn a_bad_ring_size_is_one_clear_line_and_nothing_runs() {
    common::assert_refused_before_running(
        "preload",
        "ROAR_PRELOAD_RING_KB",
        "100",
        "ROAR_PRELOAD_RING_KB=\"100\" is not a power of two",
    );
}

/// Libraries loaded after `main` starts are reported (the loader's opens bypass every hook), and
/// a library that `dlopen`s a sibling through its own RUNPATH (`$ORIGIN`, as PyTorch and CUDA
/// do) still finds it under the shim: glibc searches the *caller's* RUNPATH, so a shim that
/// wrapped `dlopen` would have broken this. Both ways out: return from main, and `_exit`.
#[test]
fn dlopen_through_runpath_works_and_what_it_loaded_is_seen() {
    if !require_tool("cc") {
        return;
    }
    let p = Project::new();
    let root = p.path();
    std::fs::create_dir_all(root.join("lib")).unwrap();
    p.write("dep.c", b"int dep(void) { return 42; }\n");
    p.write(
        "caller.c",
        b"#include <dlfcn.h>\n\
          int call(void) {\n\
          \x20   void *h = dlopen(\"libdep.so\", RTLD_NOW);\n\
          \x20   if (!h) return -1;\n\
          \x20   int (*f)(void) = (int (*)(void))dlsym(h, \"dep\");\n\
          \x20   return f ? f() : -2;\n\
          }\n",
    );
    p.write(
        "main.c",
        b"#include <dlfcn.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
          int main(int argc, char **argv) {\n\
          \x20   void *h = dlopen(\"./lib/libcaller.so\", RTLD_NOW);\n\
          \x20   if (!h) { fprintf(stderr, \"%s\\n\", dlerror()); return 3; }\n\
          \x20   int (*call)(void) = (int (*)(void))dlsym(h, \"call\");\n\
          \x20   printf(\"%d\\n\", call());\n\
          \x20   fflush(stdout);\n\
          \x20   if (argc > 1) _exit(0);\n\
          \x20   return 0;\n\
          }\n",
    );
    let build = std::process::Command::new("sh")
        .arg("-c")
        .arg(
            "cc -shared -fPIC -o lib/libdep.so dep.c && \
             cc -shared -fPIC -o lib/libcaller.so caller.c -ldl -Wl,--enable-new-dtags,-rpath,'$ORIGIN' && \
             cc -o main main.c -ldl",
        )
        .current_dir(root)
        .output()
        .unwrap();
    assert!(build.status.success(), "{}", stderr(&build));
    for how in [&["./main"][..], &["./main", "_exit"][..]] {
        let out = p
            .cmd(["run", "--tracer", "preload", "--trace", "--"])
            .args(how)
            .output()
            .unwrap();
        assert!(out.status.success(), "{how:?}: {}", stderr(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "42\n",
            "{how:?}: {}",
            stderr(&out)
        );
        let trace = stderr(&out);
        for lib in ["lib/libcaller.so", "lib/libdep.so"] {
            assert!(
                trace
                    .lines()
                    .any(|l| l.contains(" open R ") && l.ends_with(lib)),
                "{how:?}: {lib} not seen:\n{trace}"
            );
        }
    }
}

fn readelf(args: &[&str], file: &std::path::Path) -> String {
    let out = std::process::Command::new("readelf")
        .args(args)
        .arg(file)
        .output()
        .unwrap();
    assert!(out.status.success(), "readelf {args:?} {}", file.display());
    String::from_utf8(out.stdout).unwrap()
}

/// The shared libraries `file` names (its NEEDED entries).
fn needed(file: &std::path::Path) -> Vec<String> {
    readelf(&["-d"], file)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .map(|l| {
            l.rsplit('[')
                .next()
                .unwrap()
                .trim_end_matches(']')
                .to_owned()
        })
        .collect()
}

/// Every `roar` start maps the shared libraries it names, ~0.1 ms each here: roar carries GCC's
/// unwinder and the three libm functions its code calls (crates/cli/build.rs, src/math.rs), so
/// it needs libc alone (and the loader); a new dependency that calls another libm function (or a toolchain
/// without `libgcc_eh.a`) shows up here.
#[test]
fn roar_needs_libc_alone() {
    if !require_tool("readelf") {
        return;
    }
    let roar = common::roar_bin();
    // The loader is mapped anyway (it is the interpreter); the static unwinder asks it for
    // `_dl_find_object`.
    let needed: Vec<String> = needed(&roar)
        .into_iter()
        .filter(|n| !n.starts_with("ld-linux"))
        .collect();
    assert_eq!(needed, ["libc.so.6"], "{}", roar.display());
}

/// The shim is loaded into every traced process: it needs libc and nothing else (no libgcc_s, no
/// std), and every symbol it does not define is libc's (a `no_std` build leaves the unwinder's
/// personality routine undefined unless the shim defines it, and the loader then refuses the
/// shim and the program with it).
#[test]
fn the_shim_needs_libc_alone() {
    if !require_tool("readelf") {
        return;
    }
    let shim = std::env::var_os("ROAR_PRELOAD_LIB")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| common::roar_bin().with_file_name("libroar_preload.so"));
    assert_eq!(needed(&shim), ["libc.so.6"], "{}", shim.display());
    // Undefined symbols: libc's (versioned GLIBC_*) and the weak ones the C runtime names.
    let weak_ok = [
        "__gmon_start__",
        "_ITM_deregisterTMCloneTable",
        "_ITM_registerTMCloneTable",
    ];
    for line in readelf(&["--dyn-syms", "-W"], &shim).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || f[6] != "UND" {
            continue;
        }
        let name = f[7];
        assert!(
            name.contains("@GLIBC_") || weak_ok.contains(&name),
            "the shim needs {name}, which libc does not define"
        );
    }
    let ran = std::process::Command::new("true")
        .env("LD_PRELOAD", &shim)
        .status()
        .unwrap();
    assert!(
        ran.success(),
        "a program with the shim preloaded did not start"
    );
}
