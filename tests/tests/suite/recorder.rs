//! The resident recorder (crates/recorder): a job it records reads exactly as one its
//! run records itself; a run whose recorder dies, goes away or cannot take the job still records
//! it, once; a killed run's job reads `killed`; the recorder leaves with its store.

use crate::common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{stderr, Project};
use serde_json::Value;

/// `roar run --json -- ARGV` with `envs`: the output and the run's summary (its last stderr line).
fn run(p: &Project, envs: &[(&str, &str)], argv: &[&str]) -> (Output, Value) {
    let o = p
        .cmd(["run", "--json", "--"])
        .args(argv)
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let err = stderr(&o);
    let line = err.lines().last().unwrap_or_default();
    let summary = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {err}"));
    (o, summary)
}

/// Runs `argv` until a run of it is recorded by the recorder (the first run of a store starts
/// it and records its own job); returns that run's summary.
fn run_through_recorder(p: &Project, argv: &[&str]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (o, summary) = run(p, &[], argv);
        assert!(o.status.success(), "{}", stderr(&o));
        if summary["recorded_by"] == "recorder" {
            return summary;
        }
        assert!(
            Instant::now() < deadline,
            "no recorder took a job: {summary}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What of a job's record must not depend on who wrote it: everything but ids, times, pids and
/// the recorder's name for itself.
fn comparable(p: &Project, id: i64) -> Value {
    let mut job = p.job_json(id);
    let processes = job["processes"].as_array().map(Vec::len);
    let o = p.roar(["show", &id.to_string(), "--env", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let env: Value = serde_json::from_slice(&o.stdout).unwrap();
    let obj = job.as_object_mut().unwrap();
    // The variable that chose the writer is in the recorded environment of the run that set it.
    if let Some(env) = obj.get_mut("env").and_then(Value::as_object_mut) {
        env.remove("ROAR_RECORDER");
        env.remove("OLDPWD");
    }
    for volatile in ["id", "started_ns", "ended_ns", "uid", "processes", "steps"] {
        obj.remove(volatile);
    }
    if let Some(files) = obj.get_mut("files").and_then(Value::as_array_mut) {
        for f in files {
            let f = f.as_object_mut().unwrap();
            f.remove("first_ns");
            f.remove("last_ns");
            f.remove("job_id");
        }
    }
    serde_json::json!({
        "job": job,
        "runtime": env["runtime"],
        "packages": env["packages"],
        "processes": processes,
    })
}

#[test]
fn a_job_the_recorder_records_reads_as_one_its_run_records() {
    // The same workload from the same state in two projects, written by the run itself in one
    // and by the recorder in the other: files, hashes, prior contents, packages, machine.
    let script = "import hashlib,sys; d=open('in.txt','rb').read(); open('out.txt','w').write(hashlib.sha256(d).hexdigest())";
    let argv = ["python3", "-c", script];
    let records: Vec<Value> = [("0", "run"), ("1", "recorder")]
        .into_iter()
        .map(|(resident, by)| {
            let p = Project::new();
            p.write("in.txt", b"input\n");
            p.write("out.txt", b"older\n");
            let env = [("ROAR_RECORDER", resident)];
            if resident == "1" {
                run_through_recorder(&p, &["true"]);
            } else {
                assert!(run(&p, &env, &["true"]).0.status.success());
            }
            for round in 0..2 {
                let (o, s) = run(&p, &env, &argv);
                assert!(o.status.success(), "{}", stderr(&o));
                assert_eq!(s["recorded_by"], by, "{s}");
                if round == 1 {
                    let root = std::fs::canonicalize(p.path()).unwrap();
                    let text = comparable(&p, s["job"].as_i64().unwrap()).to_string();
                    let text = text.replace(&*root.to_string_lossy(), "<root>");
                    return serde_json::from_str(&text).unwrap();
                }
            }
            unreachable!()
        })
        .collect();
    let (a, b) = (&records[0], &records[1]);
    for (k, v) in a["job"].as_object().unwrap() {
        assert_eq!(v, &b["job"][k], "job.{k}");
    }
    for key in ["job", "runtime", "packages", "processes"] {
        assert_eq!(a[key], b[key], "{key}");
    }
    assert!(
        a["packages"].as_array().is_some_and(|v| !v.is_empty()),
        "{a}"
    );
    assert!(
        a["job"]["files"].as_array().is_some_and(|f| f.len() == 2),
        "{a}"
    );
}

#[test]
fn a_run_killed_while_the_recorder_holds_its_row_reads_killed() {
    let p = Project::new();
    run_through_recorder(&p, &["true"]);
    let mut child = p
        .cmd(["run", "--", "sleep", "31.5"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status_of_last = || {
        let o = p.roar(["log", "--json", "-n", "1"]);
        let log: Value = serde_json::from_slice(&o.stdout).unwrap();
        (log[0]["argv"][0].clone(), log[0]["status"].clone())
    };
    wait_until(
        "the running row is written",
        Duration::from_secs(20),
        || status_of_last() == (Value::from("sleep"), Value::from("running")),
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // The recorder is alive; the row names the run, which is gone.
    assert!(!common::recorders(&p).is_empty());
    assert_eq!(status_of_last().1, "killed");
    let _ = Command::new("pkill").args(["-f", "sleep 31.5"]).status();
}

#[test]
fn a_run_whose_recorder_dies_records_its_job_once_into_its_row() {
    for round in 0..3 {
        let p = Project::new();
        run_through_recorder(&p, &["true"]);
        let before = p.roar(["log", "--json", "-n", "0"]);
        let before: Vec<Value> = serde_json::from_slice(&before.stdout).unwrap();
        let child = p
            .cmd([
                "run",
                "--json",
                "--",
                "sh",
                "-c",
                "sleep 0.5; echo made > out.txt",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Killed while the command runs (round 0), or at any moment after it (the others).
        std::thread::sleep(Duration::from_millis(200 + 250 * round));
        for pid in common::recorders(&p) {
            nix_kill(pid);
        }
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let summary: Value = serde_json::from_str(stderr(&o).lines().last().unwrap()).unwrap();
        let id = summary["job"].as_i64().unwrap();
        let after = p.roar(["log", "--json", "-n", "0"]);
        let after: Vec<Value> = serde_json::from_slice(&after.stdout).unwrap();
        assert_eq!(after.len(), before.len() + 1, "one new job: {after:?}");
        let job = p.job_json(id);
        assert_eq!(job["status"], "exited", "{job}");
        assert_eq!(p.files(&job, "output"), ["out.txt"], "{job}");
        assert_eq!(job["outputs"], 1, "each file once: {job}");
    }
}

fn nix_kill(pid: i32) {
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
}

#[test]
fn the_recorder_leaves_with_its_store_and_when_idle() {
    let p = Project::new();
    run_through_recorder(&p, &["true"]);
    let first = common::recorders(&p);
    assert_eq!(first.len(), 1, "{first:?}");
    // A store removed and made again: the old recorder leaves, the next one serves the new store.
    std::fs::remove_dir_all(p.path().join(".roar")).unwrap();
    wait_until(
        "the recorder of the removed store exits",
        Duration::from_secs(10),
        || !std::path::Path::new(&format!("/proc/{}", first[0])).exists(),
    );
    assert!(p.roar(["init"]).status.success());
    let s = run_through_recorder(&p, &["true"]);
    // Into the new store: its newest job, numbered from its first.
    let log = p.roar(["log", "--json", "-n", "0"]);
    let log: Vec<Value> = serde_json::from_slice(&log.stdout).unwrap();
    assert_eq!(log[0]["id"], s["job"], "{s}");
    assert_eq!(Some(log.len() as i64), s["job"].as_i64(), "{log:?}");
    // Idle: gone after ROAR_RECORDER_IDLE_SECS without a run.
    for pid in common::recorders(&p) {
        nix_kill(pid);
    }
    let o = p
        .cmd(["run", "--", "true"])
        .env("ROAR_RECORDER_IDLE_SECS", "1")
        .output()
        .unwrap();
    assert!(o.status.success());
    wait_until("a recorder starts", Duration::from_secs(10), || {
        !common::recorders(&p).is_empty()
    });
    wait_until("the idle recorder exits", Duration::from_secs(10), || {
        common::recorders(&p).is_empty()
    });
}

#[test]
fn redaction_rules_changed_apply_to_the_next_job_the_recorder_records() {
    let p = Project::new();
    run_through_recorder(&p, &["true"]);
    let config = p.path().join(".roar/config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("names = []\n"), "{text}");
    std::fs::write(
        &config,
        text.replace("names = []\n", "names = [\"LAB_*\"]\n"),
    )
    .unwrap();
    let (o, s) = run(&p, &[("LAB_CODE", "plainvalue")], &["true"]);
    assert!(o.status.success());
    assert_eq!(s["recorded_by"], "recorder", "{s}");
    let job = p.job_json(s["job"].as_i64().unwrap());
    assert_eq!(job["env"]["LAB_CODE"], "<redacted>", "{}", job["env"]);
    let db = std::fs::read(p.path().join(".roar/roar.db")).unwrap();
    let wal = std::fs::read(p.path().join(".roar/roar.db-wal")).unwrap_or_default();
    for bytes in [db, wal] {
        assert!(!bytes.windows(10).any(|w| w == b"plainvalue"));
    }
}

#[test]
fn runs_at_once_through_one_recorder_are_each_recorded_once() {
    let p = Project::new();
    run_through_recorder(&p, &["true"]);
    let children: Vec<_> = (0..12)
        .map(|i| {
            p.cmd([
                "run",
                "--json",
                "--",
                "sh",
                "-c",
                &format!("echo {i} > out{i}.txt"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let mut ids = Vec::new();
    for (i, c) in children.into_iter().enumerate() {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let s: Value = serde_json::from_str(stderr(&o).lines().last().unwrap()).unwrap();
        let id = s["job"].as_i64().unwrap();
        assert_eq!(p.files(&p.job_json(id), "output"), [format!("out{i}.txt")]);
        ids.push(id);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 12);
}

#[test]
fn a_job_of_many_files_is_recorded_by_its_run_whole() {
    let p = Project::new();
    run_through_recorder(&p, &["true"]);
    let (o, s) = run(
        &p,
        &[],
        &["sh", "-c", "mkdir d && cd d && seq 3000 | xargs touch"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(s["recorded_by"], "run", "{s}");
    assert_eq!(s["outputs"], 3000, "{s}");
    let job = p.job_json(s["job"].as_i64().unwrap());
    assert_eq!(job["outputs"], 3000);
    assert_eq!(job["status"], "exited");
    // Into the row the recorder made when the job began: no other row for it.
    let log = p.roar(["log", "--json", "-n", "0"]);
    let log: Vec<Value> = serde_json::from_slice(&log.stdout).unwrap();
    let rows: Vec<_> = log.iter().filter(|j| j["argv"][0] == "sh").collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
}

#[test]
fn a_run_inside_a_run_starts_no_recorder() {
    // Outer: eBPF sees every process of its job, a recorder the inner run started included (it
    // would also wait for it: a process its command left behind). Inner: preload, so that only
    // the "inside another roar" rule can keep it from starting one (a ptraced roar never does).
    if !common::ebpf_available() {
        return;
    }
    let p = Project::new();
    let o = p
        .cmd([
            "run",
            "--json",
            "--tracer",
            "ebpf",
            "--",
            "env",
            "-u",
            "ROAR_RECORDER",
        ])
        .arg(common::roar_bin())
        .args(["run", "--tracer", "preload", "--", "true"])
        // No recorder for the outer run; the inner one may use one but must not start one.
        .env("ROAR_RECORDER", "0")
        .env("ROAR_RECORDER_IDLE_SECS", "1")
        .output()
        .unwrap();
    let s: Value = serde_json::from_str(stderr(&o).lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {}", stderr(&o)));
    assert!(o.status.success(), "{}", stderr(&o));
    let outer = p.job_json(s["job"].as_i64().unwrap());
    let argvs: Vec<String> = outer["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["argv"].to_string())
        .collect();
    assert!(argvs.iter().any(|a| a.contains("\"true\"")), "{argvs:?}");
    assert!(!argvs.iter().any(|a| a.contains("__recorder")), "{argvs:?}");
    assert!(common::recorders(&p).is_empty());
}

/// A newer roar migrated the store while the recorder had it open: the recorder writes nothing
/// into a schema it does not know (checked under the write lock, with each commit) and leaves;
/// the run says why its job could not be recorded and keeps its command's exit code.
#[test]
fn a_recorder_writes_nothing_into_a_store_a_newer_roar_migrated() {
    let p = Project::new();
    run_through_recorder(&p, &["true"]);
    let serving = common::recorders(&p);
    assert_eq!(serving.len(), 1, "{serving:?}");
    let db = p.path().join(".roar/roar.db");
    let newer = roar_store::SCHEMA_VERSION + 1;
    rusqlite::Connection::open(&db)
        .unwrap()
        .pragma_update(None, "user_version", newer)
        .unwrap();
    // roar refuses to open the store now; SQLite itself counts its rows.
    let jobs = || {
        rusqlite::Connection::open(&db)
            .unwrap()
            .query_row("SELECT count(*) FROM jobs", [], |r| r.get::<_, i64>(0))
            .unwrap()
    };
    let before = jobs();
    let o = p.cmd(["run", "--", "sh", "-c", "exit 3"]).output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("has schema version {newer}, newer than this roar")),
        "{}",
        stderr(&o)
    );
    assert_eq!(jobs(), before, "no row was written");
    wait_until("the recorder leaves", Duration::from_secs(10), || {
        common::recorders(&p).is_empty()
    });
}

/// The first run of a store starts its recorder without waiting for it: the recorder is started
/// once the command is done, so the run, a subreaper that waits for every process its command
/// left, never counts it among them. Under each backend that can run here.
#[test]
fn a_first_run_starts_the_recorder_and_ends_without_waiting_for_it() {
    let mut backends = vec!["preload", "ptrace"];
    if common::ebpf_available() {
        backends.push("ebpf");
    }
    for backend in backends {
        let p = Project::new();
        let mut child = p
            .cmd(["run", "--json", "--tracer", backend, "--", "true"])
            // Far past the deadline below: a run that waited for it would not end in time.
            .env("ROAR_RECORDER_IDLE_SECS", "120")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "{backend}: the first run did not end: it waits for the recorder it started"
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let o = child.wait_with_output().unwrap();
        assert!(status.success(), "{backend}: {}", stderr(&o));
        let s: Value = serde_json::from_str(stderr(&o).lines().last().unwrap()).unwrap();
        assert_eq!(s["recorded_by"], "run", "{backend}: {s}");
        wait_until(
            "the recorder serves the store",
            Duration::from_secs(10),
            || common::recorders(&p).len() == 1,
        );
        assert_eq!(
            run_through_recorder(&p, &["true"])["recorded_by"],
            "recorder"
        );
    }
}
