//! Fault injection: `roar run` killed with SIGKILL at seeded random moments, under each backend,
//! and the mount daemon killed under a command writing through it. After the next roar command
//! has recovered the journals: the store passes its integrity check, the command's own work is
//! unaffected, and every access the command made before the kill (its own log says which, with
//! the time of each) is in the recovered job.
//!
//! `ROAR_CRASH_KILLS` sets the kills per backend (the suite runs 24; RESULTS.md has 200);
//! `ROAR_CRASH_SEED` replays one seed.

use crate::common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{stderr, Project, Rng};

/// Writes `$2` files into `$1`, logging each (with the time it was written, in µs) once it is
/// written, then reads one back and logs `end`. bash's `EPOCHREALTIME` costs no process.
const WORK: &str = r#"
d=$1; n=$2
mkdir -p "$d"
for ((k=1; k<=n; k++)); do
  echo "$k" > "$d/f_$k"
  t=${EPOCHREALTIME/./}
  echo "$d/f_$k $t" >> "$d/log"
done
cat "$d/f_1" > /dev/null
echo end >> "$d/log"
"#;

/// The ring size (so the helper) of this file's eBPF runs: no other test uses it.
const CRASH_RING_KB: u32 = 4096;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn kills() -> usize {
    std::env::var("ROAR_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

fn seed() -> u64 {
    std::env::var("ROAR_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20261128)
}

/// `roar run --tracer backend -- bash work.sh DIR FILES`, started.
/// Under eBPF the runs use a ring size of their own, so a helper of their own: the helper this
/// test kills is never another test's (the suite's tests run side by side).
fn run_work(p: &Project, backend: &str, dir: &str, files: u64) -> std::process::Child {
    p.cmd(["run", "--tracer", backend, "--", "bash", "work.sh", dir])
        .arg(files.to_string())
        .env("ROAR_EBPF_RING_KB", CRASH_RING_KB.to_string())
        .env("ROAR_CRASH_MARK", "kept")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The files `log` says were written, with when.
fn logged(log: &Path) -> (Vec<(String, u64)>, bool) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out = Vec::new();
    let mut ended = false;
    for line in text.lines() {
        if line == "end" {
            ended = true;
        } else if let Some((path, t)) = line.split_once(' ') {
            out.push((path.to_owned(), t.parse().unwrap()));
        }
    }
    (out, ended)
}

/// The recorded job that ran `dir` (None if none was), once no job of it is still running.
fn job_of(p: &Project, dir: &str) -> Option<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = p.roar(["log", "--json", "-n", "1000"]);
        assert!(out.status.success(), "roar log: {}", stderr(&out));
        let log: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let job = log
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["argv"].as_array().unwrap().iter().any(|a| a == dir))
            .cloned();
        // Not settled while it runs, nor while its journal waits for its command to end (the
        // running row of a dead recorder reads `killed` until it is recovered).
        let pending = |j: &serde_json::Value| {
            j["status"] == "running"
                || j["uid"].as_str().is_some_and(|uid| {
                    p.path()
                        .join(format!(".roar/journal/{uid}.journal"))
                        .exists()
                })
        };
        match job {
            Some(j) if pending(&j) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Some(j) => return Some(p.job_json(j["id"].as_i64().unwrap())),
            // A journal still held (the eBPF helper following a dead run's command to its end)
            // may be the job's, with no row yet.
            None if journals_left(p) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            None => return None,
        }
    }
}

fn journals_left(p: &Project) -> bool {
    std::fs::read_dir(p.path().join(".roar/journal")).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "journal"))
    })
}

#[derive(Default, Debug)]
struct Tally {
    kills: usize,
    /// Kills that landed while the command ran (the job was recovered as killed).
    mid_command: usize,
    accesses_checked: usize,
    lost: usize,
}

/// Kills `roar run --tracer backend` `n` times; `strict`: every access before the kill must be
/// in the record (preload and eBPF: every access at all, since the shims keep reporting and the
/// eBPF helper follows the command into the journal).
fn kill_runs(backend: &str, n: usize, strict: bool) -> Tally {
    kill_during_runs(backend, n, strict, Victim::Roar)
}

/// Which process a kill is aimed at.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Victim {
    /// `roar run` itself.
    Roar,
    /// The resident eBPF helper, while `roar run --tracer ebpf` uses it.
    EbpfHelper,
}

fn kill_during_runs(backend: &str, n: usize, strict: bool, victim: Victim) -> Tally {
    let p = Project::new();
    std::fs::write(p.path().join("work.sh"), WORK).unwrap();
    let mut rng = Rng(seed() ^ backend.len() as u64);
    let mut tally = Tally::default();
    for i in 0..n {
        let dir = format!("run{i}");
        let files = 50 + rng.below(400);
        let delay = Duration::from_micros(rng.below(250_000));
        let mut roar = run_work(&p, backend, &dir, files);
        std::thread::sleep(delay);
        let killed_at = now_us();
        if victim == Victim::Roar {
            let _ = roar.kill();
        } else {
            for pid in common::ebpf_helpers(CRASH_RING_KB) {
                // SAFETY: kill with a pid just found.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let status = roar.wait().unwrap();
        tally.kills += 1;
        let log = p.path().join(&dir).join("log");
        // The command outlives roar under preload and eBPF: let it finish (under ptrace it died
        // with roar).
        let this_command = format!("bash work.sh {dir} {files}");
        assert!(
            common::wait_until_gone(&this_command, Duration::from_secs(20)),
            "{backend} kill {i}: the command never ended"
        );
        let (written, ended) = logged(&log);
        let job = job_of(&p, &dir);
        let Some(job) = job else {
            assert!(
                written.is_empty(),
                "{backend} kill {i} (seed {}): the command wrote {} files and no job was recorded",
                seed(),
                written.len()
            );
            continue;
        };
        if backend != "ptrace" && !written.is_empty() {
            assert!(
                ended,
                "{backend} kill {i}: the command did not finish after roar died"
            );
        }
        // A dead helper: the run goes on and records what it read, marked incomplete.
        if victim == Victim::EbpfHelper && job["incomplete"] == true {
            tally.mid_command += 1;
        }
        if job["status"] == "killed" {
            tally.mid_command += 1;
            // Followed to the command's end: nothing is missing (a run killed before its
            // command started is a header alone, incomplete).
            if backend != "ptrace" && victim == Victim::Roar && !written.is_empty() {
                assert_eq!(job["incomplete"], false, "{backend} kill {i}: {job}");
            }
            // Its environment, from the row written as the command started (the journal never
            // holds it): certain once the command has been writing for a while.
            let first = written.iter().map(|(_, t)| *t).min();
            if first.is_some_and(|t| t + 50_000 < killed_at) {
                let shown = p.job_json(job["id"].as_i64().unwrap());
                assert_eq!(
                    shown["env"]["ROAR_CRASH_MARK"], "kept",
                    "{backend} kill {i}: the environment was lost"
                );
            }
            // Found as a finished run's: the machine, and bash's package.
            let env = &job["environment"];
            assert!(
                !env["runtime"].is_null(),
                "{backend} kill {i}: no machine: {env}"
            );
            assert!(
                written.is_empty() || env["packages"].as_array().is_some_and(|p| !p.is_empty()),
                "{backend} kill {i}: no packages: {env}"
            );
        }
        let outputs = p.files(&job, "output");
        let expected: Vec<&String> = written
            .iter()
            .filter(|(_, t)| {
                !strict || (backend != "ptrace" && victim == Victim::Roar) || *t < killed_at
            })
            .map(|(path, _)| path)
            .collect();
        let base = std::fs::canonicalize(p.path()).unwrap();
        let mut missing = Vec::new();
        for path in &expected {
            tally.accesses_checked += 1;
            if !outputs.iter().any(|o| o == *path) {
                missing.push(path.to_string());
            }
        }
        if strict {
            assert!(
                missing.is_empty(),
                "{backend} kill {i} (seed {}, {delay:?} after start, roar {status}): {} of {} accesses before the kill are not in job {} ({}): {:?}",
                seed(),
                missing.len(),
                expected.len(),
                job["id"],
                job["status"],
                &missing[..missing.len().min(5)]
            );
        }
        tally.lost += missing.len();
        // Nothing made up: every output the job names exists with the content recorded.
        for o in &outputs {
            assert!(
                base.join(o).exists(),
                "{backend} kill {i}: {o} recorded but absent"
            );
        }
    }
    settled(&p);
    eprintln!("crash {backend}: {tally:?}");
    tally
}

/// After the kills: the store passes its integrity check, and no journal is left once a roar
/// command has run.
fn settled(p: &Project) {
    let check = Command::new("sqlite3")
        .arg(p.path().join(".roar/roar.db"))
        .arg("pragma integrity_check")
        .output();
    if let Ok(out) = check {
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    }
    // A journal whose job was committed before roar was killed (before it removed the journal)
    // goes at the next roar command, which records nothing again.
    let again = p.roar(["log"]);
    let left: Vec<_> = std::fs::read_dir(p.path().join(".roar/journal"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "every journal was recovered: {left:?}; roar log: {}",
        stderr(&again)
    );
}

/// The pid of the daemon of the project's one mount.
fn daemon_pid(p: &Project) -> i64 {
    let out = p.roar(["mount", "--list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    list[0]["pid"].as_i64().expect("a mount")
}

/// The mount daemon is killed `n` times while a command writes through it; `roar mount` again
/// recovers its jobs. Every write the command's log says succeeded (each was answered by the
/// daemon, which journals an access before it answers) is in the recovered job.
#[test]
fn mount_daemon_killed_at_random_loses_no_access() {
    if !common::mount::require_fuse() {
        return;
    }
    let p = Project::new();
    std::fs::write(p.path().join("work.sh"), WORK).unwrap();
    std::fs::create_dir(p.path().join("data")).unwrap();
    let mut rng = Rng(seed() ^ 0x6d6f756e74);
    let mut tally = Tally::default();
    let mounted = p.roar(["mount", "data"]);
    assert!(mounted.status.success(), "{}", stderr(&mounted));
    for i in 0..kills() {
        let dir = format!("data/run{i}");
        let files = 50 + rng.below(400);
        // Some kills land after the command ended, before or after its job was recorded.
        let delay = Duration::from_micros(rng.below(600_000));
        let pid = daemon_pid(&p);
        // Its own process group: a job of its own on the mount.
        let mut work = Command::new("bash")
            .args(["work.sh", &dir, &files.to_string()])
            .current_dir(p.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
        tally.kills += 1;
        work.wait().unwrap();
        let again = p.roar(["mount", "data"]);
        assert!(
            again.status.success(),
            "kill {i}: mount again: {}",
            stderr(&again)
        );
        let (written, _) = logged(&p.path().join(&dir).join("log"));
        let Some(job) = job_of(&p, &dir) else {
            assert!(
                written.is_empty(),
                "mount kill {i} (seed {}): the command wrote {} files and no job was recorded",
                seed(),
                written.len()
            );
            continue;
        };
        if job["status"] == "killed" {
            tally.mid_command += 1;
        }
        // Every output hash recorded is the file's content (the command's files are not
        // written again after it).
        let base = std::fs::canonicalize(p.path()).unwrap();
        let mut hashed = 0;
        for f in job["files"].as_array().unwrap() {
            let path = f["path"].as_str().unwrap();
            let Some(hash) = f["hash"]["blake3"].as_str() else {
                continue;
            };
            if f["role"] == "output" && !path.ends_with("/log") {
                hashed += 1;
                let content = std::fs::read(base.join(path)).unwrap();
                assert_eq!(
                    blake3::hash(&content).to_hex().as_str(),
                    hash,
                    "mount kill {i}: {path} recorded with a hash that is not its content"
                );
            }
        }
        assert!(
            written.is_empty() || hashed > 0,
            "mount kill {i}: job {} has no output hash",
            job["id"]
        );
        let outputs = p.files(&job, "output");
        let missing: Vec<&String> = written
            .iter()
            .map(|(path, _)| path)
            .filter(|path| !outputs.iter().any(|o| o == *path))
            .collect();
        tally.accesses_checked += written.len();
        assert!(
            missing.is_empty(),
            "mount kill {i} (seed {}, {delay:?} after start): {} of {} writes answered before the kill are not in job {} ({}): {:?}",
            seed(),
            missing.len(),
            written.len(),
            job["id"],
            job["status"],
            &missing[..missing.len().min(5)]
        );
    }
    let out = p.roar(["unmount", "data"]);
    assert!(out.status.success(), "{}", stderr(&out));
    settled(&p);
    eprintln!("crash mount: {tally:?}");
    assert!(
        tally.mid_command > 0,
        "no kill landed while the command ran: {tally:?}"
    );
}

#[test]
fn preload_killed_at_random_loses_no_access() {
    let t = kill_runs("preload", kills(), true);
    assert!(
        t.mid_command > 0,
        "no kill landed while the command ran: {t:?}"
    );
}

#[test]
fn ptrace_killed_at_random_loses_no_access_made_before() {
    let t = kill_runs("ptrace", kills(), true);
    assert!(
        t.mid_command > 0,
        "no kill landed while the command ran: {t:?}"
    );
}

/// eBPF: the resident helper follows a dead run's command into its journal to the end, so
/// every access is kept (docs/SEMANTICS.md, "Crashes").
#[test]
fn ebpf_killed_at_random_loses_no_access() {
    if !common::ebpf_available() {
        return;
    }
    let t = kill_runs("ebpf", kills(), true);
    assert!(
        t.mid_command > 0,
        "no kill landed while the command ran: {t:?}"
    );
    // Then the helper killed under runs (in this same test: a helper killed while the test's
    // other runs used it would cut them short): each run records every access made before
    // the kill, and says it is incomplete.
    let t = kill_during_runs("ebpf", kills(), true, Victim::EbpfHelper);
    eprintln!("crash ebpf helper: {t:?}");
    assert!(t.mid_command > 0, "no helper kill landed in a run: {t:?}");
}

/// The resident recorder killed at seeded random moments while runs go through it: each run's
/// job is recorded exactly once (by the recorder, or by the run itself when its recorder is
/// gone), holding every file the command wrote, and the command's exit status is its own.
#[test]
fn recorder_killed_at_random_records_each_job_once_and_whole() {
    let p = Project::new();
    std::fs::write(p.path().join("work.sh"), WORK).unwrap();
    let mut rng = Rng(seed() ^ 0x7265_636f);
    let mut killed = 0;
    let mut checked = 0;
    for i in 0..kills() {
        let dir = format!("rec{i}");
        let files = 20 + rng.below(200);
        let delay = Duration::from_micros(rng.below(400_000));
        let run = run_work(&p, "preload", &dir, files);
        std::thread::sleep(delay);
        for pid in common::recorders(&p) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            killed += 1;
        }
        let out = run.wait_with_output().unwrap();
        assert!(out.status.success(), "recorder kill {i}: the run failed");
        let (written, ended) = logged(&p.path().join(&dir).join("log"));
        assert!(ended, "recorder kill {i}: the command did not finish");
        let log = p.roar(["log", "--json", "-n", "0"]);
        let log: serde_json::Value = serde_json::from_slice(&log.stdout).unwrap();
        let mine: Vec<&serde_json::Value> = log
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["argv"].as_array().unwrap().iter().any(|a| *a == dir))
            .collect();
        assert_eq!(mine.len(), 1, "recorder kill {i}: one job, once: {mine:?}");
        let job = p.job_json(mine[0]["id"].as_i64().unwrap());
        assert_eq!(job["status"], "exited", "recorder kill {i}: {job}");
        let outputs = p.files(&job, "output");
        for (path, _) in &written {
            checked += 1;
            assert!(
                outputs.contains(path),
                "recorder kill {i} (seed {}): {path} is not in job {}",
                seed(),
                job["id"]
            );
        }
    }
    settled(&p);
    eprintln!(
        "crash recorder: {} runs, {killed} recorders killed, {checked} accesses checked, 0 lost",
        kills()
    );
    assert!(killed > 0, "no recorder was running to kill");
}
