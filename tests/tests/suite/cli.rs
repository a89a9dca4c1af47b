//! The `roar` command's foundation: init, hash, log, show, db, and its answers to bad input.

use crate::common;

use std::ffi::OsString;
use std::path::PathBuf;

use common::{roar_bin, snapshot, stderr, stdout, Project};
use roar_store::{ContentHash, FileRecord, JobRecord, Ops, Outcome, ProcessRecord, Role, Writer};

#[test]
fn init_creates_the_store_and_ignores_it_in_git() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(".git")).unwrap();
    std::fs::write(dir.path().join(".gitignore"), "target").unwrap();
    let run = || {
        std::process::Command::new(roar_bin())
            .arg("init")
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let first = run();
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(stdout(&first).starts_with("Initialised roar project in "));
    assert!(dir.path().join(".roar/roar.db").is_file());
    assert!(dir.path().join(".roar/config.toml").is_file());
    let second = run();
    assert!(stdout(&second).starts_with("Reinitialised existing roar project"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".gitignore")).unwrap(),
        "target\n.roar/\n"
    );
}

#[test]
fn commands_outside_a_project_say_so_and_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["log"][..],
        &["db"],
        &["run", "--", "true"],
        &["show", "1"],
    ] {
        let out = std::process::Command::new(roar_bin())
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{args:?}");
        assert!(
            stderr(&out).contains("no roar project here"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn run_outside_a_project_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(roar_bin())
        .args(["run", "--", "touch", "made"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(!dir.path().join("made").exists());
}

#[test]
fn hash_prints_b3sum_lines_and_records_artifacts() {
    let p = Project::new();
    p.write("abc.txt", b"abc");
    p.write("d/empty", b"");
    let out = p.roar(["hash", "abc.txt", "d", "--sha256"]);
    assert!(out.status.success(), "{}", stderr(&out));
    snapshot("hash_sha256.txt", &stdout(&out));
    let out = p.roar(["show", "6437b3ac"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("size    3 B"));
}

#[test]
fn hash_of_a_missing_file_fails_clearly() {
    let p = Project::new();
    let out = p.roar(["hash", "nope.bin"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("cannot hash nope.bin"),
        "{}",
        stderr(&out)
    );
}

fn content(s: &str) -> ContentHash {
    ContentHash {
        blake3: blake3_hex(s.as_bytes()),
        sha256: None,
        size: s.len() as u64,
    }
}

fn blake3_hex(b: &[u8]) -> String {
    // The store's own hasher, through a file, so the test does not need blake3 itself.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x");
    std::fs::write(&f, b).unwrap();
    roar_store::hash::hash_path(&f, Default::default())
        .unwrap()
        .hash
        .blake3
}

/// Records a two-step pipeline through the store API, with fixed times so output is stable.
fn record_pipeline(p: &Project) {
    let root = std::fs::canonicalize(p.path()).unwrap();
    let writer = Writer::start(&root.join(".roar/roar.db")).unwrap();
    let file = |role, rel: &str, c: &str, ops| FileRecord {
        role,
        path: root.join(rel),
        hash: Some(content(c)),
        before: None,
        ops,
        first_ns: None,
        last_ns: None,
        s3: None,
    };
    let job = |argv: &[&str], start: i64, files| JobRecord {
        name: None,
        argv: argv.iter().map(OsString::from).collect(),
        cwd: root.clone(),
        started_ns: start,
        ended_ns: Some(start + 1_250_000_000),
        outcome: Outcome::Exited(0),
        incomplete: false,
        backend: "preload".into(),
        git: Some(roar_store::GitState {
            commit: Some("0123456789abcdef0123".into()),
            branch: Some("main".into()),
            dirty: true,
            remote: None,
            diff: None,
        }),
        env: Default::default(),
        host: Some("testhost".into()),
        processes: vec![ProcessRecord {
            pid: 100,
            parent_pid: Some(99),
            exe: Some(PathBuf::from("/usr/bin/python3")),
            argv: argv.iter().map(OsString::from).collect(),
            started_ns: Some(start),
            ended_ns: None,
        }],
        steps: Vec::new(),
        files,
        environment: None,
        uid: None,
        dist: None,
    };
    writer
        .record_job(job(
            &["python3", "prep.py"],
            1_795_219_200_000_000_000,
            vec![
                file(Role::Input, "raw.csv", "a,b\n1,2\n", Ops::READ),
                file(
                    Role::Output,
                    "clean.csv",
                    "a,b\n1,2\n",
                    Ops::WRITE | Ops::CREATE,
                ),
            ],
        ))
        .unwrap();
    writer
        .record_job(job(
            &["python3", "train.py", "--epochs", "3"],
            1_795_219_260_000_000_000,
            vec![
                file(Role::Input, "clean.csv", "a,b\n1,2\n", Ops::READ),
                file(
                    Role::Output,
                    "model.bin",
                    "weights",
                    Ops::WRITE | Ops::CREATE,
                ),
                file(
                    Role::Temp,
                    "tmp.ckpt",
                    "x",
                    Ops::WRITE | Ops::CREATE | Ops::UNLINK,
                ),
            ],
        ))
        .unwrap();
}

#[test]
fn log_show_and_db_output_snapshots() {
    let p = Project::new();
    record_pipeline(&p);
    snapshot("log.txt", &stdout(&p.roar(["log"])));
    let root = std::fs::canonicalize(p.path()).unwrap();
    let show = stdout(&p.roar(["show", "2"])).replace(&*root.to_string_lossy(), "<root>");
    snapshot("show_job.txt", &show);
    let model = blake3_hex(b"weights");
    snapshot(
        "show_artifact.txt",
        &stdout(&p.roar(["show", &model[..8]])).replace(&model, "<model-hash>"),
    );
    snapshot("show_path.txt", &stdout(&p.roar(["show", "clean.csv"])));
    let db = stdout(&p.roar(["db"]));
    assert!(db.contains("jobs        2"), "{db}");
    assert!(db.contains("artifacts   3"), "{db}");
    let json: serde_json::Value =
        serde_json::from_slice(&p.roar(["log", "--json"]).stdout).unwrap();
    assert_eq!(json[0]["argv"][1], "train.py");
    assert_eq!(json[0]["git"]["dirty"], true);
}

#[test]
fn unknown_and_ambiguous_lookups_exit_4_and_5() {
    let p = Project::new();
    record_pipeline(&p);
    let out = p.roar(["show", "ffffffffff"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(stderr(&out).contains("no artifact has a hash starting with ffffffffff"));
    let out = p.roar(["show", "99"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(stderr(&out).contains("no job 99"));
    let out = p.roar(["show", "never/recorded.txt"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(stderr(&out).contains("was never recorded by roar"));
    // Find a one-digit prefix shared by two artifacts (there are three): "b3:" forces hash lookup.
    let hashes = [
        blake3_hex(b"a,b\n1,2\n"),
        blake3_hex(b"weights"),
        blake3_hex(b"x"),
    ];
    let shared = (0..3)
        .flat_map(|i| (0..3).map(move |j| (i, j)))
        .filter(|(i, j)| i < j)
        .find_map(|(i, j)| (hashes[i][..1] == hashes[j][..1]).then(|| hashes[i][..1].to_owned()));
    if let Some(prefix) = shared {
        let out = p.roar(["show", &format!("b3:{prefix}")]);
        assert_eq!(out.status.code(), Some(5));
        assert!(
            stderr(&out).contains("is ambiguous; candidates:"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn corrupt_and_newer_databases_exit_6_and_stay_untouched() {
    let p = Project::new();
    let db = p.path().join(".roar/roar.db");
    let _ = std::fs::remove_file(p.path().join(".roar/roar.db-wal"));
    let _ = std::fs::remove_file(p.path().join(".roar/roar.db-shm"));
    let garbage = b"definitely not sqlite\n".repeat(100);
    std::fs::write(&db, &garbage).unwrap();
    let out = p.roar(["log"]);
    assert_eq!(out.status.code(), Some(6));
    assert!(
        stderr(&out).contains("is not a roar database"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        stderr(&out).lines().count(),
        1,
        "one line: {}",
        stderr(&out)
    );
    assert_eq!(std::fs::read(&db).unwrap(), garbage);

    std::fs::remove_file(&db).unwrap();
    make_newer(&db);
    let before = std::fs::read(&db).unwrap();
    let out = p.roar(["db"]);
    assert_eq!(out.status.code(), Some(6));
    assert!(
        stderr(&out).contains("newer than this roar understands"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

/// A database whose schema version is from the future.
fn make_newer(db: &std::path::Path) {
    let conn =
        roar_store::testing::create_at_version(db, roar_store::SCHEMA_VERSION as usize).unwrap();
    conn.pragma_update(None, "user_version", 999).unwrap();
}

#[test]
fn a_read_only_store_is_a_clear_error_as_root() {
    if unsafe_geteuid() != 0 {
        common::skip("a read-only mount needs root");
        return;
    }
    let p = Project::new();
    p.write("f", b"x");
    // Old enough for a hash-cache entry, which the writer stores without anyone waiting on it:
    // its failure must still reach the exit status.
    std::thread::sleep(std::time::Duration::from_nanos(
        2 * roar_store::hash::RACY_NS as u64,
    ));
    let roar_dir = p.path().join(".roar");
    let sh = |c: &str| {
        std::process::Command::new("sh")
            .args(["-c", c])
            .status()
            .unwrap()
            .success()
    };
    assert!(sh(&format!(
        "mount --bind '{0}' '{0}' && mount -o remount,bind,ro '{0}'",
        roar_dir.display()
    )));
    let out = p.roar(["hash", "f"]);
    let run = p.roar(["run", "--", "sh", "-c", "exit 7"]);
    assert!(sh(&format!("umount '{}'", roar_dir.display())));
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("read-only"), "{}", stderr(&out));
    // The command still runs and its status is kept; roar says the job was not recorded.
    assert_eq!(run.status.code(), Some(7), "{}", stderr(&run));
    assert!(
        stderr(&run).contains("job could not be recorded"),
        "{}",
        stderr(&run)
    );
}

fn unsafe_geteuid() -> u32 {
    let out = std::process::Command::new("id").arg("-u").output().unwrap();
    stdout(&out).trim().parse().unwrap()
}
