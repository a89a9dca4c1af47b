//! Versions kept, refs to them and reproduce in isolation (issue 58): the param loop's two models
//! rebuilt bit-exact in a scratch worktree with the working tree untouched, a dataset overwritten
//! in place still gives the old model back from kept versions, `roar checkout` writes any
//! recorded version back verified, and a generator checks that every version `PATH~N` names comes
//! back byte for byte.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::{stderr, stdout, Project, Rng};

const PREP: &str = r#"
p = dict(l.split(": ") for l in open("params.yaml").read().split("\n") if l)
rows = [int(x) for x in open("data/raw.csv").read().split()]
open("features.txt", "w").write("\n".join(str(r * int(p["scale"])) for r in rows))
"#;

const TRAIN: &str = r#"
import sys
p = dict(l.split(": ") for l in open("params.yaml").read().split("\n") if l)
feats = [int(x) for x in open("features.txt").read().split()]
depth = int(p["max_depth"])
seed = int(sys.argv[1])
open("models/model.bin", "w").write(f"depth={depth} seed={seed} w={sum(feats) * depth + seed}\n")
"#;

fn git(p: &Project, args: &[&str]) {
    let o = Command::new("git")
        .args(args)
        .current_dir(p.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "git {args:?}: {}", stderr(&o));
}

fn run(p: &Project, argv: &[&str]) -> i64 {
    let mut args = vec!["run", "--"];
    args.extend(argv);
    let o = p.roar(&args);
    assert!(o.status.success(), "{argv:?}: {}", stderr(&o));
    p.last_job()["id"].as_i64().unwrap()
}

/// Every file of the working tree (but the store) with its bytes and modification time.
fn tree(root: &Path) -> Tree {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let path = e.path();
            let name = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if name == ".roar" || name == ".git" {
                continue;
            }
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(path);
            } else {
                out.insert(name, (std::fs::read(&path).unwrap(), m.modified().unwrap()));
            }
        }
    }
    out
}

type Tree = BTreeMap<String, (Vec<u8>, std::time::SystemTime)>;

/// The working tree at `root` is as `before` (names the files that differ).
fn untouched(before: &Tree, root: &Path) {
    let now = tree(root);
    let differ: Vec<&String> = before
        .keys()
        .chain(now.keys())
        .filter(|k| before.get(*k) != now.get(*k))
        .collect();
    assert!(differ.is_empty(), "the working tree changed: {differ:?}");
}

/// A git project: prep and train committed with params.yaml; data/raw.csv untracked.
fn param_loop() -> Project {
    let p = Project::new();
    git(&p, &["init", "-q"]);
    git(&p, &["config", "user.email", "t@example.com"]);
    git(&p, &["config", "user.name", "t"]);
    p.write("prep.py", PREP.as_bytes());
    p.write("train.py", TRAIN.as_bytes());
    p.write("params.yaml", b"scale: 2\nmax_depth: 8\n");
    p.write("data/raw.csv", b"1 2 3 4\n");
    std::fs::create_dir_all(p.path().join("models")).unwrap();
    git(&p, &["add", "prep.py", "train.py", "params.yaml"]);
    git(&p, &["commit", "-q", "-m", "v1"]);
    p
}

fn model(p: &Project) -> Vec<u8> {
    std::fs::read(p.path().join("models/model.bin")).unwrap()
}

#[test]
fn the_param_loop_reproduces_both_models_bit_exact_with_the_working_tree_untouched() {
    let p = param_loop();
    run(&p, &["python3", "prep.py"]);
    let train1 = run(&p, &["python3", "train.py", "7"]);
    let v1 = model(&p);
    // An edited parameter, not committed: the second model is made with the kept diff.
    p.write("params.yaml", b"scale: 2\nmax_depth: 5\n");
    let train2 = run(&p, &["python3", "train.py", "7"]);
    let v2 = model(&p);
    assert_ne!(v1, v2);
    let before = tree(p.path());
    for (job, want) in [(train1, &v1), (train2, &v2)] {
        let o = p.roar(["reproduce", "--run", &format!("models/model.bin@{job}")]);
        let out = stdout(&o);
        assert!(o.status.success(), "job {job}: {out}{}", stderr(&o));
        assert!(
            out.contains("reproduced  models/model.bin  bit-exact"),
            "{out}"
        );
        assert!(out.contains("matches"), "{out}");
        // The plan runs prep once and train once.
        assert_eq!(out.matches("python3 prep.py").count(), 1, "{out}");
        assert_eq!(out.matches("python3 train.py").count(), 1, "{out}");
        let _ = want;
    }
    untouched(&before, p.path());
    // --in keeps the worktree: the old model is there, made again.
    let keep = tempfile::tempdir().unwrap();
    let dir = keep.path().join("wt");
    let o = p
        .cmd([
            "reproduce",
            "--run",
            &format!("models/model.bin@{train1}"),
            "--in",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(dir.join("models/model.bin")).unwrap(), v1);
    assert_eq!(
        std::fs::read(dir.join("params.yaml")).unwrap(),
        b"scale: 2\nmax_depth: 8\n"
    );
}

#[test]
fn a_dataset_overwritten_in_place_still_reproduces_the_old_model_from_kept_versions() {
    let p = param_loop();
    run(&p, &["python3", "prep.py"]);
    let old = run(&p, &["python3", "train.py", "1"]);
    let v1 = model(&p);
    p.write("data/raw.csv", b"9 9 9 9\n");
    run(&p, &["python3", "prep.py"]);
    run(&p, &["python3", "train.py", "1"]);
    assert_ne!(model(&p), v1);
    let before = tree(p.path());
    let o = p.roar(["reproduce", "--run", &format!("models/model.bin@{old}")]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    untouched(&before, p.path());
    // `roar checkout` gives the old version back, checked against its hash.
    let elsewhere = tempfile::tempdir().unwrap();
    let old_bin = elsewhere.path().join("old.bin");
    let o = p
        .cmd(["checkout", "models/model.bin~1", "-o"])
        .arg(&old_bin)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&old_bin).unwrap(), v1);
    // The old dataset's kept copy gone: prep cannot run (the report says which input is
    // missing), train still can, from the kept features it read.
    let blob = |content: &[u8]| {
        let h = blake3::hash(content).to_hex().to_string();
        (p.path().join(".roar/s3/blobs").join(&h[..2]).join(&h), h)
    };
    let (raw_blob, raw_v1) = blob(b"1 2 3 4\n");
    assert!(raw_blob.is_file(), "the untracked input was kept");
    std::fs::remove_file(&raw_blob).unwrap();
    let o = p.roar(["reproduce", "--run", &format!("models/model.bin@{old}")]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(
        out.contains("not run     features.txt") && out.contains(&raw_v1[..12]),
        "{out}"
    );
    assert!(
        out.contains("reproduced  models/model.bin  bit-exact"),
        "{out}"
    );
    // The features gone too: the model cannot be made, exit 4.
    let (features_blob, _) = blob(b"2\n4\n6\n8");
    std::fs::remove_file(&features_blob).unwrap();
    let o = p.roar(["reproduce", "--run", &format!("models/model.bin@{old}")]);
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("not run     models/model.bin"),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        before,
        tree(p.path()),
        "nothing in the working tree changed, ever"
    );
}

#[test]
fn checkout_verifies_the_bytes_and_keeps_what_it_replaces() {
    let p = Project::new();
    p.write("in.txt", b"one\n");
    run(&p, &["sh", "-c", "cp in.txt out.txt"]);
    p.write("in.txt", b"two\n");
    run(&p, &["sh", "-c", "cp in.txt out.txt"]);
    // out.txt edited by hand (not recorded): checkout keeps it before replacing it.
    p.write("out.txt", b"by hand\n");
    let o = p.roar(["checkout", "out.txt~1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(p.path().join("out.txt")).unwrap(), b"one\n");
    let hand = blake3::hash(b"by hand\n").to_hex().to_string();
    let o = p.roar(["checkout", &format!("b3:{}", &hand[..16]), "-o", "back.txt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A damaged kept object is refused and the destination left as it was.
    let two = blake3::hash(b"two\n").to_hex().to_string();
    let blob = p.path().join(".roar/s3/blobs").join(&two[..2]).join(&two);
    std::fs::write(&blob, b"rot\n").unwrap();
    std::fs::remove_file(p.path().join("in.txt")).unwrap();
    let o = p.roar(["checkout", "out.txt~0"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("damaged"), "{}", stderr(&o));
    assert_eq!(std::fs::read(p.path().join("out.txt")).unwrap(), b"one\n");
}

#[test]
fn refs_that_name_nothing_say_which_in_one_line_and_exit_4() {
    let p = Project::new();
    p.write("a.txt", b"a\n");
    run(&p, &["sh", "-c", "cat a.txt > b.txt"]);
    for bad in ["b.txt@99", "nothere.txt@1", "b.txt~3", "b.txt@nosuchname"] {
        let o = p.roar(["checkout", bad, "-o", "x"]);
        assert_eq!(o.status.code(), Some(4), "{bad}: {}", stderr(&o));
        assert_eq!(
            stderr(&o).trim().lines().count(),
            1,
            "{bad}: {}",
            stderr(&o)
        );
        assert!(!p.path().join("x").exists());
        let o = p.roar(["reproduce", "--run", bad]);
        assert_eq!(o.status.code(), Some(4), "{bad}: {}", stderr(&o));
    }
}

/// Seeded rounds of jobs that write, overwrite and append files; afterwards every version
/// `PATH~N` names is checked out and must be the bytes the generator wrote then.
#[test]
fn every_recorded_version_comes_back_byte_for_byte() {
    for seed in 1..=4u64 {
        let p = Project::new();
        let mut rng = Rng(seed * 7919);
        // What each path held after each job, newest last (distinct contents only).
        let mut history: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
        for round in 0..6 {
            let name = format!("f{}.txt", rng.below(3));
            let path = p.path().join(&name);
            let prior = std::fs::read(&path).unwrap_or_default();
            let line = format!("seed {seed} round {round} {}\n", rng.next());
            let (script, now) = match rng.below(3) {
                0 => ("printf %s \"$1\" > \"$2\"", line.clone().into_bytes()),
                1 => (
                    "printf %s \"$1\" >> \"$2\"",
                    [prior.clone(), line.clone().into_bytes()].concat(),
                ),
                _ => (
                    "cat \"$2\" > /dev/null; printf %s \"$1\" > \"$2.tmp\" && mv \"$2.tmp\" \"$2\"",
                    line.clone().into_bytes(),
                ),
            };
            run(&p, &["sh", "-c", script, "sh", &line, &name]);
            assert_eq!(
                std::fs::read(&path).unwrap(),
                now,
                "seed {seed} round {round}"
            );
            let versions = history.entry(name).or_default();
            if versions.last() != Some(&now) {
                versions.retain(|v| v != &now);
                versions.push(now);
            }
        }
        for (name, versions) in &history {
            for (back, want) in versions.iter().rev().enumerate() {
                let out = p.path().join("checked");
                let o = p.roar(["checkout", &format!("{name}~{back}"), "-o", "checked"]);
                assert!(
                    o.status.success(),
                    "seed {seed} {name}~{back}: {}",
                    stderr(&o)
                );
                assert_eq!(
                    &std::fs::read(&out).unwrap(),
                    want,
                    "seed {seed} {name}~{back}"
                );
            }
        }
    }
}

const KEY: &str = "KEPTKEY0000000000001";
const SECRET: &str = "KEPTSECRETKEPTSECRETKEPTSECRETKEPTSECR01";

/// The param loop recorded on one machine, pushed (jobs to PostgreSQL, kept versions to a
/// versitygw bucket), and reproduced on a second clone that has the code from git and nothing
/// else: no data, no store.
#[test]
fn kept_versions_travel_with_the_team_store_to_a_second_clone() {
    let Some(pg) = common::postgres::Postgres::start() else {
        return;
    };
    let Some(bin) = common::server::versitygw() else {
        return;
    };
    if !common::require_tool("aws") {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let (_vgw, endpoint) =
        common::server::start_versitygw(&bin, &scratch.path().join("vgw"), KEY, SECRET);
    let creds = [
        ("AWS_ACCESS_KEY_ID", KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ];
    let mb = Command::new("aws")
        .args(["--endpoint-url", &endpoint, "s3", "mb", "s3://team"])
        .envs(creds)
        .output()
        .unwrap();
    assert!(mb.status.success(), "aws s3 mb: {}", stderr(&mb));

    let p = param_loop();
    run(&p, &["python3", "prep.py"]);
    let train1 = run(&p, &["python3", "train.py", "3"]);
    let v1 = model(&p);
    p.write("params.yaml", b"scale: 2\nmax_depth: 5\n");
    let train2 = run(&p, &["python3", "train.py", "3"]);
    let o = p.roar(["remote", "add", "origin", &pg.url(), "--no-auto-push"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let config = p.path().join(".roar/config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "objects = \"s3://team/kept\"\nobjects_endpoint = \"{endpoint}\"\n"
    ));
    std::fs::write(&config, &text).unwrap();
    let o = p.cmd(["push"]).envs(creds).output().unwrap();
    assert!(o.status.success(), "roar push: {}", stderr(&o));
    assert!(stderr(&o).contains("kept versions"), "{}", stderr(&o));

    // The second machine: the same checkout path, a clone of the code, a fresh store.
    let here = p.path().to_owned();
    let first = scratch.path().join("first");
    std::fs::rename(&here, &first).unwrap();
    let clone = Command::new("git")
        .args(["clone", "-q"])
        .arg(&first)
        .arg(&here)
        .output()
        .unwrap();
    assert!(clone.status.success(), "{}", stderr(&clone));
    let o = p.roar(["init"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(&config, &text).unwrap();
    assert!(!here.join("data/raw.csv").exists() && !here.join("models").exists());
    for (job, want) in [(train1, Some(&v1)), (train2, None)] {
        let o = p
            .cmd(["--remote", "origin", "reproduce", "--run"])
            .arg(format!("models/model.bin@{job}"))
            .envs(creds)
            .output()
            .unwrap();
        let out = stdout(&o);
        assert!(o.status.success(), "job {job}: {out}{}", stderr(&o));
        assert!(
            out.contains("reproduced  models/model.bin  bit-exact"),
            "{out}"
        );
        if let Some(v1) = want {
            let back = scratch.path().join("v1.bin");
            let o = p
                .cmd(["--remote", "origin", "checkout"])
                .arg(format!("models/model.bin@{job}"))
                .arg("-o")
                .arg(&back)
                .envs(creds)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", stderr(&o));
            assert_eq!(&std::fs::read(&back).unwrap(), v1);
        }
    }
}

/// `roar gc` takes only what nothing needs: never a version the record holds, nor one `roar
/// checkout` kept before replacing it; an unrecorded, unpinned blob goes.
#[test]
fn gc_never_takes_a_kept_version() {
    let p = Project::new();
    p.write("in.txt", b"one\n");
    run(&p, &["sh", "-c", "cp in.txt out.txt"]);
    p.write("out.txt", b"by hand\n");
    let o = p.roar(["checkout", "out.txt~0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let blob = |content: &[u8]| {
        let h = blake3::hash(content).to_hex().to_string();
        p.path().join(".roar/s3/blobs").join(&h[..2]).join(&h)
    };
    // A blob nothing records or pins (one a crash left, say).
    let stray = blob(b"stray\n");
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::write(&stray, b"stray\n").unwrap();
    let o = p.roar(["gc", "--grace", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(blob(b"one\n").is_file(), "a recorded version stays");
    assert!(blob(b"by hand\n").is_file(), "a pinned version stays");
    assert!(!stray.exists(), "an unneeded blob goes");
}

/// `roar gc --grace 0` while a job runs takes none of the versions it has kept so far (they are
/// recorded only when it ends): every blob written since the oldest running job began stays.
/// (The job's end also checks each kept version and keeps it again if it is gone, so the blob is
/// looked at while the job runs; the rule closes the moment between that check and the record.)
#[test]
fn gc_at_no_grace_keeps_what_a_running_job_has_kept() {
    let p = Project::new();
    // Written, closed, then the job runs on until the test says `go` (at most a minute): the
    // version is hashed and kept while it runs.
    let mut job = p
        .cmd([
            "run",
            "--",
            "sh",
            "-c",
            "echo made while running > out.txt; for i in $(seq 1200); do [ -e go ] && break; sleep 0.05; done",
        ])
        .spawn()
        .unwrap();
    let blob = {
        let h = blake3::hash(b"made while running\n").to_hex().to_string();
        p.path().join(".roar/s3/blobs").join(&h[..2]).join(&h)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !blob.is_file() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(blob.is_file(), "the output was not kept while the job ran");
    let o = p.roar(["gc", "--grace", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Looked at while the job still runs: its end would keep the version again.
    assert!(job.try_wait().unwrap().is_none(), "the job ended early");
    assert!(blob.is_file(), "gc took a version a running job had kept");
    std::fs::write(p.path().join("go"), b"").unwrap();
    assert!(job.wait().unwrap().success());
    assert!(blob.is_file(), "the version is gone after the job ended");
    std::fs::write(p.path().join("out.txt"), b"changed\n").unwrap();
    let o = p.roar(["checkout", "out.txt@1"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Through `roar mount`, each version a job leaves is kept as the last writer lets go of it
/// (streamed writes, and a rewrite in place that is hashed by reading), and comes back — with the
/// mounted directory on the project's filesystem, and on another one (a data volume: the kernel
/// will not copy from it into the store, so the daemon copies; every version was silently lost
/// there before).
#[test]
fn the_mount_keeps_the_versions_its_jobs_leave() {
    if !common::mount::require_fuse() {
        return;
    }
    for other_fs in [false, true] {
        /// Unmounts the tmpfs under the mount however the test ends (after the mount: declared
        /// before it, dropped after it).
        struct Tmpfs(Option<std::path::PathBuf>);
        impl Drop for Tmpfs {
            fn drop(&mut self) {
                if let Some(dir) = &self.0 {
                    let _ = Command::new("umount").arg("-l").arg(dir).status();
                }
            }
        }
        let mut tmpfs = Tmpfs(None);
        let mut m = common::mount::Mounted::new(|data| {
            if other_fs {
                let mounted = Command::new("mount")
                    .args(["-t", "tmpfs", "-o", "size=16m", "roar-test-volume"])
                    .arg(data)
                    .status()
                    .unwrap();
                assert!(mounted.success(), "mount -t tmpfs");
                tmpfs.0 = Some(data.to_owned());
            }
        });
        assert!(m.run(&["sh", "-c", "echo one > out.txt"]).success());
        assert!(m.run(&["sh", "-c", "echo two > out.txt"]).success());
        // Not a write stream from offset 0: the daemon hashes it by reading, and keeps that read.
        assert!(m
            .run(&[
                "python3",
                "-c",
                "f=open('out.txt','r+b'); f.seek(1); f.write(b'W'); f.close()"
            ])
            .success());
        m.unmount();
        for content in [&b"one\n"[..], b"two\n", b"tWo\n"] {
            let h = blake3::hash(content).to_hex().to_string();
            let blob = m.p.path().join(".roar/s3/blobs").join(&h[..2]).join(&h);
            assert_eq!(
                std::fs::read(&blob).ok().as_deref(),
                Some(content),
                "{:?} kept (another filesystem: {other_fs})",
                String::from_utf8_lossy(content)
            );
        }
        let o = m.p.roar(["checkout", "data/out.txt~2", "-o", "first.txt"]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(
            std::fs::read(m.p.path().join("first.txt")).unwrap(),
            b"one\n"
        );
        // The tmpfs first: the project's directory cannot be removed while data/ is mounted.
        drop(tmpfs);
        drop(m);
    }
}

/// Through `roar mount`, inputs are kept by the rule `roar run` keeps by: a file git does not
/// track is kept by the read that hashes it (and comes back after it is overwritten), one git
/// tracks is not (git gives it back) until `git rm --cached` makes it untracked.
#[test]
fn the_mount_keeps_the_untracked_inputs_its_jobs_read() {
    if !common::mount::require_fuse() {
        return;
    }
    let blob = |root: &Path, content: &[u8]| {
        let h = blake3::hash(content).to_hex().to_string();
        root.join(".roar/s3/blobs").join(&h[..2]).join(&h)
    };
    let git_in = |root: &Path, args: &[&str]| {
        let o = Command::new("git")
            .args(["-c", "user.email=t@example.com", "-c", "user.name=t"])
            .args(args)
            .current_dir(root)
            .output()
            .unwrap();
        assert!(o.status.success(), "git {args:?}: {}", stderr(&o));
    };
    let mut m = common::mount::Mounted::new(|data| {
        let root = data.parent().unwrap();
        std::fs::write(data.join("raw.csv"), b"1,2\n3,4\n").unwrap();
        std::fs::write(data.join("code.txt"), b"tracked by git\n").unwrap();
        git_in(root, &["init", "-q"]);
        git_in(root, &["add", "data/code.txt"]);
        git_in(root, &["commit", "-q", "-m", "code"]);
    });
    let root = m.p.path().to_owned();
    assert!(m
        .run(&["sh", "-c", "cat raw.csv code.txt > out.txt"])
        .success());
    // The dataset refreshed in place by the next job; the old version must still come back.
    assert!(m
        .run(&[
            "sh",
            "-c",
            "printf '5,6\\n' > raw.csv; cat raw.csv > out2.txt"
        ])
        .success());
    assert_eq!(
        std::fs::read(blob(&root, b"1,2\n3,4\n")).ok().as_deref(),
        Some(&b"1,2\n3,4\n"[..]),
        "the untracked input read through the mount is kept"
    );
    assert!(
        !blob(&root, b"tracked by git\n").exists(),
        "a tracked input is not kept"
    );
    // Untracked now (the index changed): the daemon asks git again.
    git_in(&root, &["rm", "-q", "--cached", "data/code.txt"]);
    assert!(m.run(&["sh", "-c", "cat code.txt > out3.txt"]).success());
    m.unmount();
    assert!(
        blob(&root, b"tracked by git\n").exists(),
        "an input git stopped tracking is kept"
    );
    let h = blake3::hash(b"1,2\n3,4\n").to_hex().to_string();
    let o = m.p.roar(["checkout", &h[..12], "-o", "old.csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(root.join("old.csv")).unwrap(), b"1,2\n3,4\n");
}

/// The kernel sends a writer's RELEASE when it likes — here a forked child holds the descriptor
/// while the next job overwrites the file: the first job's output is still the version it wrote
/// (recorded and kept), never the content the file holds by the time its writer lets go.
#[test]
fn a_version_overwritten_before_its_writer_lets_go_is_still_the_first_jobs_output() {
    if !common::mount::require_fuse() {
        return;
    }
    let mut m = common::mount::Mounted::new(|_| {});
    let first = "import os, time\nf = open('out.txt', 'w')\nf.write('one\\n')\nf.flush()\nif os.fork() == 0:\n    time.sleep(1.5)\n    os._exit(0)\n";
    assert!(m.run(&["python3", "-c", first]).success());
    assert!(m.run(&["sh", "-c", "echo two > out.txt"]).success());
    // The child's exit releases the first writer; its job ends then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let ended = |jobs: Vec<serde_json::Value>| {
        jobs.len() == 2 && jobs.iter().all(|j| j["status"] != "running")
    };
    while !ended(m.jobs()) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    m.unmount();
    let jobs = m.jobs();
    assert_eq!(jobs.len(), 2, "two jobs recorded");
    let output = |job: &serde_json::Value| -> Vec<String> {
        job["files"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["role"] == "output" && f["path"].as_str().unwrap().ends_with("/out.txt"))
            .map(|f| f["hash"]["blake3"].as_str().unwrap_or("none").to_owned())
            .collect()
    };
    let b3 = |c: &[u8]| blake3::hash(c).to_hex().to_string();
    let python = jobs
        .iter()
        .find(|j| j["argv"][0].as_str().unwrap().contains("python"))
        .unwrap();
    let shell = jobs
        .iter()
        .find(|j| j["argv"][0].as_str().unwrap().ends_with("sh"))
        .unwrap();
    assert_eq!(output(python), [b3(b"one\n")], "the first job's version");
    assert_eq!(output(shell), [b3(b"two\n")], "the second job's version");
    for content in [&b"one\n"[..], b"two\n"] {
        let h = b3(content);
        let blob = m.p.path().join(".roar/s3/blobs").join(&h[..2]).join(&h);
        assert_eq!(
            std::fs::read(&blob).ok().as_deref(),
            Some(content),
            "{h} kept"
        );
    }
}

/// Past `[keep] budget_bytes`, `roar gc` (also started after each run) lets the least recently
/// used versions go, never a pinned job's.
#[test]
fn a_size_budget_lets_the_oldest_versions_go_but_never_a_pinned_jobs() {
    let p = Project::new();
    p.append_config("\n[keep]\nbudget_bytes = 3000\n");
    let mut ids = Vec::new();
    for i in 0..5u8 {
        let body = vec![b'a' + i; 1000];
        ids.push(run(
            &p,
            &[
                "sh",
                "-c",
                "printf %s \"$1\" > out.txt",
                "sh",
                std::str::from_utf8(&body).unwrap(),
            ],
        ));
        if i == 0 {
            let o = p.roar(["pin", &format!("@{}", ids[0])]);
            assert!(o.status.success(), "{}", stderr(&o));
        }
    }
    let o = p.roar(["gc"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let kept = |i: u8| {
        let h = blake3::hash(&vec![b'a' + i; 1000]).to_hex().to_string();
        p.path()
            .join(".roar/s3/blobs")
            .join(&h[..2])
            .join(&h)
            .is_file()
    };
    assert!(kept(0), "the pinned job's version stays");
    assert!(!kept(1) && !kept(2), "the oldest unpinned versions went");
    assert!(kept(4), "the newest stays");
    let total: u64 = walk(&p.path().join(".roar/s3/blobs"));
    assert!(total <= 3000, "{total} bytes kept");
    let o = p.roar(["checkout", "out.txt~3", "-o", "x"]);
    assert_eq!(
        o.status.code(),
        Some(4),
        "a version let go is missing: {}",
        stderr(&o)
    );
}

fn walk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                walk(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

/// A job runs again with the environment it recorded; a secret roar redacted from it comes
/// from the current environment, and each such value is named on stderr.
#[test]
fn a_job_runs_again_with_its_recorded_environment() {
    let p = Project::new();
    let o = p
        .cmd([
            "run",
            "--",
            "sh",
            "-c",
            "echo \"$MODE $API_TOKEN\" > out.txt",
        ])
        .env("MODE", "fast")
        .env("API_TOKEN", "s3cr3t-Value-9f8e7d6c5b4a")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // MODE is not set now: the recorded value is used; the token is taken from here.
    let o = p
        .cmd(["reproduce", "--run", "out.txt"])
        .env_remove("MODE")
        .env("API_TOKEN", "s3cr3t-Value-9f8e7d6c5b4a")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("bit-exact"), "{}", stdout(&o));
    assert!(
        stderr(&o)
            .contains("API_TOKEN was recorded redacted; its value is taken from this environment"),
        "{}",
        stderr(&o)
    );
    // Without it here, the job runs without it, says so, and the output differs.
    let o = p
        .cmd(["reproduce", "--run", "out.txt"])
        .env_remove("API_TOKEN")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("API_TOKEN was recorded redacted and is not set here"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).contains("differs"), "{}", stdout(&o));
}

/// A rebuild that makes other bytes says why, from the two records: an input outside the tree
/// (which the worktree does not put in place) that changed, else a command that is not
/// deterministic.
#[test]
fn a_rebuild_that_differs_names_the_likeliest_cause() {
    let p = Project::new();
    let outside = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(outside.path(), b"a\n").unwrap();
    let src = outside.path().to_str().unwrap();
    run(&p, &["sh", "-c", "cat \"$1\" > out.txt", "sh", src]);
    std::fs::write(outside.path(), b"b\n").unwrap();
    let o = p.roar(["reproduce", "--run", "out.txt"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let want = format!("input {src} had other content this time");
    assert!(stdout(&o).contains(&want), "{}", stdout(&o));
    run(&p, &["sh", "-c", "date +%s%N > t.txt"]);
    let o = p.roar(["reproduce", "--run", "t.txt"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("not deterministic"), "{}", stdout(&o));
}
