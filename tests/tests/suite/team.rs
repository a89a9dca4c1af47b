//! The team store on a real PostgreSQL (started by the test on 127.0.0.1, its own data
//! directory): every query over it answers as over the local store; nodes (projects with their
//! own host names, in UTS namespaces) push a distributed run concurrently and its lineage
//! crosses them; a push cut by a server stop loses and duplicates nothing.

use crate::common;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::process::{Command, Output};

use common::postgres::Postgres;
use common::{require_tool, stderr, stdout, Project};
use roar_store::{ContentHash, FileRecord, JobRecord, Ops, Outcome, Role, Writer};

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: {}", stderr(o));
}

fn add_remote(p: &Project, pg: &Postgres, auto: bool) {
    let mut args = vec!["remote".to_owned(), "add".into(), "origin".into(), pg.url()];
    if !auto {
        args.push("--no-auto-push".into());
    }
    ok(&p.roar(&args), "roar remote add");
}

fn local_count(p: &Project, sql: &str) -> i64 {
    let conn = roar_store::open(&p.path().join(".roar/roar.db"), false).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Every query command answers the same over the team store as over the local store it was
/// pushed from (a store whose jobs were pushed in order: the mirror numbers them alike).
#[test]
fn every_query_over_the_team_store_answers_as_over_the_local_one() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    if !require_tool("python3") || !require_tool("git") {
        return;
    }
    let p = Project::new();
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .args(["-c", "user.email=t@t", "-c", "user.name=t"])
            .args(args)
            .current_dir(p.path())
            .output()
            .unwrap();
        ok(&o, "git");
    };
    git(&["init", "-q"]);
    p.write("in.txt", b"b\na\nc\n");
    p.write(
        "train.py",
        b"import sys\nopen('model.bin','w').write(open('sorted.txt').read().upper())\n",
    );
    git(&["add", "in.txt", "train.py"]);
    git(&["commit", "-qm", "x"]);
    // A dirty tree: its diff goes to the team store too.
    p.write(
        "train.py",
        b"import sys\nopen('model.bin','w').write(open('sorted.txt').read().upper()*2)\n",
    );
    p.run_under(
        "preload",
        &[
            "sh",
            "-c",
            "sort in.txt > sorted.txt && wc -l sorted.txt > n.txt",
        ],
    );
    p.run_under("ptrace", &["python3", "train.py"]);
    p.run_under("preload", &["sh", "-c", "cat model.bin n.txt > report.txt"]);
    p.write("in.txt", b"changed\n");
    add_remote(&p, &pg, false);
    ok(&p.roar(["push"]), "roar push");
    let queries: &[&[&str]] = &[
        &["log", "--json", "-n", "0"],
        &["log"],
        &["show", "1", "--json"],
        &["show", "2", "--json"],
        &["show", "2", "--env", "--json"],
        &["show", "2", "--patch"],
        &["show", "1"],
        &["show", "report.txt", "--json"],
        &["lineage", "report.txt", "--json"],
        &["lineage", "report.txt"],
        &["dag", "--json"],
        &["diff", "1", "3", "--json"],
        &["export", "--all"],
        &["export", "--all", "--format", "openlineage"],
        &["status", "--json"],
    ];
    for q in queries {
        let local = p.roar(*q);
        let mut remote_args = vec!["--remote", "origin"];
        remote_args.extend_from_slice(q);
        let remote = p.roar(&remote_args);
        assert_eq!(
            local.status.code(),
            remote.status.code(),
            "{q:?}: {}",
            stderr(&remote)
        );
        assert!(!stdout(&local).is_empty(), "{q:?} printed nothing");
        assert_eq!(
            stdout(&local),
            stdout(&remote),
            "{q:?} differs over the team store"
        );
    }
    // Nothing is pushed twice, and a query that finds nothing new costs no transfer.
    ok(&p.roar(["push"]), "second push");
    assert_eq!(pg.count("SELECT count(*) FROM jobs"), 3);
    // A URL with a password is refused before anything is written.
    let out = p.roar([
        "remote",
        "add",
        "other",
        "postgres://roar:hunter2pw@127.0.0.1:1/x",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("~/.pgpass"), "{}", stderr(&out));
    let config = std::fs::read_to_string(p.path().join(".roar/config.toml")).unwrap();
    assert!(!config.contains("hunter2pw"));
    // --remote on a command that is not a query is one clear line.
    let out = p.roar(["--remote", "origin", "run", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--remote is for the query commands"));
}

/// `roar run` under `unshare --uts` with the host name `host`.
fn on_host(p: &Project, host: &str, env: &[(&str, String)], argv: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    c.args(["--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\"", host])
        .arg(common::roar_bin())
        .args(["run", "--tracer", "preload", "--"])
        .args(argv)
        .current_dir(p.path())
        .env("NO_COLOR", "1")
        .env_remove("ROAR_DIR");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Two nodes run a distributed run of 8 ranks (4 each, torchrun's variables) on shards a
/// preprocessing job wrote on a third machine; all of them push at once with 16 pushers while
/// their background pushes run: the team store holds every job once, and the lineage of the
/// checkpoint rank 0 wrote, asked from a fourth project, crosses all three machines.
#[test]
fn nodes_push_a_distributed_run_concurrently_and_its_lineage_crosses_them() {
    if !common::can_switch_user("needs root for UTS namespaces (distinct host names)") {
        return;
    }
    let Some(pg) = Postgres::start() else {
        return;
    };
    if !require_tool("python3") || !require_tool("unshare") {
        return;
    }
    let shared = tempfile::tempdir().unwrap();
    let s = std::fs::canonicalize(shared.path()).unwrap();
    let (a, b, c) = (Project::new(), Project::new(), Project::new());
    for p in [&a, &b, &c] {
        add_remote(p, &pg, true);
    }
    let prep = format!(
        "import os\nfor r in range(8): open(os.path.join({s:?}, f'shard{{r}}.bin'), 'wb').write(bytes([r]) * 4096)\n",
        s = s.display().to_string()
    );
    c.write("prep.py", prep.as_bytes());
    ok(
        &on_host(&c, "nodeC", &[], &["python3", "prep.py"])
            .output()
            .unwrap(),
        "prep",
    );
    let rank_py = format!(
        "import os\nr = int(os.environ['RANK'])\nd = open(os.path.join({s:?}, f'shard{{r}}.bin'), 'rb').read()\n\
         open(os.path.join({s:?}, f'rank{{r}}.log'), 'w').write(str(len(d)))\n\
         if r == 0:\n    open(os.path.join({s:?}, 'ckpt.pt'), 'wb').write(b'weights')\n",
        s = s.display().to_string()
    );
    let mut ranks = Vec::new();
    for (node, p) in [(0u32, &a), (1, &b)] {
        p.write("rank.py", rank_py.as_bytes());
        for local in 0..4u32 {
            let rank = node * 4 + local;
            let env = [
                ("TORCHELASTIC_RUN_ID", "run42".to_owned()),
                ("WORLD_SIZE", "8".to_owned()),
                ("RANK", rank.to_string()),
                ("LOCAL_RANK", local.to_string()),
                ("GROUP_RANK", node.to_string()),
            ];
            let host = if node == 0 { "nodeA" } else { "nodeB" };
            ranks.push(
                on_host(p, host, &env, &["python3", "rank.py"])
                    .spawn()
                    .unwrap(),
            );
        }
    }
    for mut r in ranks {
        assert!(r.wait().unwrap().success());
    }
    // Some more ordinary jobs on every node.
    for (p, host) in [(&a, "nodeA"), (&b, "nodeB"), (&c, "nodeC")] {
        for i in 0..5 {
            let cmd = format!("echo {i} > note{i}.txt");
            ok(
                &on_host(p, host, &[], &["sh", "-c", &cmd]).output().unwrap(),
                "note",
            );
        }
    }
    // 16 pushers at once across the three projects, racing the background pushes.
    let pushers: Vec<_> = (0..16)
        .map(|i| [&a, &b, &c][i % 3].cmd(["push"]).spawn().unwrap())
        .collect();
    for mut child in pushers {
        assert!(child.wait().unwrap().success());
    }
    for p in [&a, &b, &c] {
        ok(&p.roar(["push"]), "final push");
    }
    let local_jobs: i64 = [&a, &b, &c]
        .iter()
        .map(|p| local_count(p, "SELECT count(*) FROM jobs"))
        .sum();
    let local_files: i64 = [&a, &b, &c]
        .iter()
        .map(|p| local_count(p, "SELECT count(*) FROM job_files"))
        .sum();
    assert_eq!(local_jobs, 1 + 8 + 15);
    assert_eq!(pg.count("SELECT count(*) FROM jobs"), local_jobs);
    assert_eq!(pg.count("SELECT count(DISTINCT uid) FROM jobs"), local_jobs);
    assert_eq!(pg.count("SELECT count(*) FROM job_files"), local_files);
    let hosts: BTreeSet<String> = pg
        .query("SELECT DISTINCT host FROM jobs")
        .into_iter()
        .collect();
    assert_eq!(hosts, ["nodeA", "nodeB", "nodeC"].map(String::from).into());
    // An analyst's project that ran nothing asks where the checkpoint came from.
    let d = Project::new();
    add_remote(&d, &pg, false);
    let ckpt = s.join("ckpt.pt");
    let out = d.roar([
        "--remote",
        "origin",
        "lineage",
        ckpt.to_str().unwrap(),
        "--json",
    ]);
    ok(&out, "lineage --remote");
    let lineage: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let steps = lineage["steps"].as_array().unwrap();
    let seen_hosts: BTreeSet<&str> = steps.iter().filter_map(|s| s["host"].as_str()).collect();
    assert_eq!(
        seen_hosts,
        ["nodeA", "nodeB", "nodeC"].into(),
        "{lineage:#}"
    );
    let ranks: BTreeSet<u64> = steps
        .iter()
        .filter_map(|s| s["dist"]["rank"].as_u64())
        .collect();
    assert_eq!(
        ranks,
        (0..8).collect(),
        "every rank is in the checkpoint's lineage"
    );
    let shards_read: BTreeSet<String> = steps
        .iter()
        .flat_map(|s| s["inputs"].as_array().unwrap().iter())
        .filter(|i| i["producer"].is_number())
        .map(|i| i["path"].as_str().unwrap().to_owned())
        .collect();
    let expect: BTreeSet<String> = (0..8)
        .map(|r| s.join(format!("shard{r}.bin")).display().to_string())
        .collect();
    assert_eq!(
        shards_read, expect,
        "each shard comes from the preprocessing job"
    );
    // The run as one record.
    let out = d.roar(["--remote", "origin", "show", "torchelastic:run42", "--json"]);
    ok(&out, "show RUN");
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["jobs"].as_array().unwrap().len(), 8);
    assert_eq!(run["hosts"], serde_json::json!(["nodeA", "nodeB"]));
    assert_eq!(
        run["inputs"].as_array().unwrap().len(),
        8 + 2,
        "8 shards and each node's rank.py"
    );
}

/// Seeds `n` jobs of `files` files each straight through the store's writer.
fn seed(p: &Project, n: usize, files: usize) {
    let root = std::fs::canonicalize(p.path()).unwrap();
    let writer = Writer::start(&root.join(".roar/roar.db")).unwrap();
    for j in 0..n {
        let file = |i: usize| FileRecord {
            role: if i == 0 { Role::Input } else { Role::Output },
            path: root.join(format!("d{j}/f{i}")),
            hash: Some(ContentHash {
                blake3: format!("{:064x}", (j * 1000 + i) as u128 + 1),
                sha256: None,
                size: 10,
            }),
            before: None,
            ops: Ops::WRITE,
            first_ns: None,
            last_ns: None,
            s3: None,
        };
        writer
            .record_job(JobRecord {
                name: None,
                argv: vec![OsString::from("gen"), OsString::from(j.to_string())],
                cwd: root.clone(),
                started_ns: 1_800_000_000_000_000_000 + j as i64,
                ended_ns: Some(1_800_000_000_000_000_000 + j as i64 + 1),
                outcome: Outcome::Exited(0),
                incomplete: false,
                backend: "preload".into(),
                git: None,
                env: Default::default(),
                host: Some("seed".into()),
                processes: Vec::new(),
                steps: Vec::new(),
                files: (0..files).map(file).collect(),
                environment: None,
                uid: None,
                dist: None,
            })
            .unwrap();
    }
    writer.flush().unwrap();
}

/// The server is stopped (as by a crash) while a push is under way: the push fails with one line
/// naming the team store; once it is back, the next push completes, and the team store holds
/// every job and file record exactly once.
#[test]
fn a_push_cut_by_a_server_stop_loses_and_duplicates_nothing() {
    let Some(mut pg) = Postgres::start() else {
        return;
    };
    let p = Project::new();
    const JOBS: usize = 3000;
    const FILES: usize = 20;
    seed(&p, JOBS, FILES);
    add_remote(&p, &pg, false);
    let push = p
        .cmd(["push"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let at_stop = loop {
        // Before the push made the schema, there is no table to count.
        let n = pg.try_count("SELECT count(*) FROM jobs").unwrap_or(0);
        if n > 0 || std::time::Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    pg.stop_now();
    let out = push.wait_with_output().unwrap();
    assert!(
        (1..JOBS as i64).contains(&at_stop),
        "the stop came mid-push ({at_stop} of {JOBS} jobs there)"
    );
    assert!(!out.status.success(), "a push cut short says so");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("team store origin"), "{err}");
    pg.start_again();
    ok(&p.roar(["push"]), "push after the restart");
    assert_eq!(pg.count("SELECT count(*) FROM jobs"), JOBS as i64);
    assert_eq!(
        pg.count("SELECT count(*) FROM job_files"),
        (JOBS * FILES) as i64
    );
    assert_eq!(
        pg.count("SELECT count(*) FROM (SELECT job_seq, path FROM job_files GROUP BY 1, 2 HAVING count(*) > 1) d"),
        0
    );
    let local_uids: BTreeSet<String> = {
        let conn = roar_store::open(&p.path().join(".roar/roar.db"), false).unwrap();
        let mut stmt = conn.prepare("SELECT uid FROM jobs").unwrap();
        stmt.query_map([], |r| r.get::<_, String>(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let team_uids: BTreeSet<String> = pg.query("SELECT uid FROM jobs").into_iter().collect();
    assert_eq!(local_uids, team_uids);
    // The mirror reads it all, once.
    let out = p.roar(["--remote", "origin", "log", "--json", "-n", "0"]);
    ok(&out, "log --remote");
    let log: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(log.as_array().unwrap().len(), JOBS);
}

/// With the team store down, `roar run` keeps the command's exit status and output, records the
/// job, and its background push leaves the failure for `roar remote list`; once the server is
/// back, the next run's background push sends both jobs.
#[test]
fn an_unreachable_team_store_never_changes_a_run_and_loses_no_job() {
    let Some(mut pg) = Postgres::start() else {
        return;
    };
    let p = Project::new();
    add_remote(&p, &pg, true);
    pg.stop_now();
    let out = p.roar(["run", "--", "sh", "-c", "echo out; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(stdout(&out), "out\n");
    // The background push fails and leaves its reason for `roar remote list`.
    let list = || -> serde_json::Value {
        serde_json::from_slice(&p.roar(["remote", "list", "--json"]).stdout).unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while list()[0]["last_error"].is_null() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let l = list();
    assert_eq!(l[0]["unpushed"], 1);
    assert!(
        l[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot reach")),
        "{l:#}"
    );
    let push = p.roar(["push"]);
    assert_eq!(push.status.code(), Some(1));
    assert!(
        stderr(&push).contains("cannot reach the team store origin"),
        "{}",
        stderr(&push)
    );
    pg.start_again();
    ok(&p.roar(["run", "--", "true"]), "run");
    // Whichever push comes first (that run's, in the background, or this one) sends both.
    ok(&p.roar(["push"]), "push");
    assert_eq!(pg.count("SELECT count(*) FROM jobs"), 2);
    let l = list();
    assert_eq!(l[0]["unpushed"], 0);
    assert!(l[0]["last_error"].is_null(), "{l:#}");
    // Read once, the team store's copy answers while the server is down, and says so.
    let fresh = p.roar(["--remote", "origin", "log", "--json"]);
    ok(&fresh, "log --remote");
    pg.stop_now();
    let stale = p.roar(["--remote", "origin", "log", "--json"]);
    ok(&stale, "log --remote, server down");
    assert_eq!(stdout(&stale), stdout(&fresh));
    let warning = stderr(&stale);
    assert_eq!(warning.lines().count(), 1, "{warning}");
    assert!(
        warning.contains("cannot reach the team store origin")
            && warning.contains("answering from the copy read"),
        "{warning}"
    );
    // A project that never read it has nothing to answer from: one line, failure.
    let q = Project::new();
    add_remote(&q, &pg, false);
    let out = q.roar(["--remote", "origin", "log"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
}

/// A role that may not read the team store gets the server's reason and fails (never an answer
/// from a copy that was never read); one that may read but not write gets the server's reason
/// from `roar push`, with what to ask for.
#[test]
fn a_role_without_rights_is_told_why_and_answered_nothing() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    let owner = Project::new();
    add_remote(&owner, &pg, false);
    ok(&owner.roar(["run", "--", "true"]), "run");
    ok(&owner.roar(["push"]), "push as the owner");
    pg.query("CREATE ROLE nobody LOGIN");
    pg.query("CREATE ROLE looker LOGIN");
    pg.query("GRANT SELECT ON ALL TABLES IN SCHEMA public TO looker");
    let as_role = |role: &str| {
        let p = Project::new();
        let url = pg.url().replace("roar@", &format!("{role}@"));
        ok(
            &p.roar(["remote", "add", "origin", &url, "--no-auto-push"]),
            "remote add",
        );
        p
    };
    let nobody = as_role("nobody");
    let out = nobody.roar(["--remote", "origin", "log"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot read the team store origin")
            && err.contains("permission denied")
            && err.contains("nobody needs SELECT")
            && !err.contains("db error"),
        "{err}"
    );
    assert!(
        !nobody.path().join(".roar/remotes/origin.db").exists(),
        "no copy is made of a store that could not be read"
    );
    // Asked again, still the reason, never an empty answer from a copy.
    let again = nobody.roar(["--remote", "origin", "log"]);
    assert_eq!(again.status.code(), Some(1), "{}", stderr(&again));

    let looker = as_role("looker");
    let log = looker.roar(["--remote", "origin", "log", "--json"]);
    ok(&log, "log --remote as a reader");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&log.stdout)
            .unwrap()
            .as_array()
            .map_or(0, Vec::len),
        1,
        "{}",
        stdout(&log)
    );
    ok(&looker.roar(["run", "--", "true"]), "run");
    let push = looker.roar(["push"]);
    let err = stderr(&push);
    assert_eq!(push.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot write to the team store origin")
            && err.contains("permission denied for table")
            && err.contains("looker needs INSERT")
            && !err.contains("db error"),
        "{err}"
    );
    assert_eq!(pg.count("SELECT count(*) FROM jobs"), 1);
}

/// Jobs `roar mount` records while it runs are pushed as they end, without any `roar run`.
#[test]
fn jobs_the_mount_records_are_pushed_as_they_end_needs_root() {
    if !common::mount::require_fuse() {
        return;
    }
    let Some(pg) = Postgres::start() else {
        return;
    };
    let url = pg.url();
    let mut m = common::mount::Mounted::new(|data| {
        let o = Command::new(common::roar_bin())
            .args(["remote", "add", "origin", &url])
            .current_dir(data.parent().unwrap())
            .env_remove("ROAR_DIR")
            .output()
            .unwrap();
        ok(&o, "remote add");
        std::fs::write(data.join("in.txt"), b"x").unwrap();
    });
    assert!(m.run(&["sh", "-c", "cat in.txt > out.txt"]).success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while pg.try_count("SELECT count(*) FROM jobs") != Some(1) {
        assert!(
            std::time::Instant::now() < deadline,
            "the mount's job did not reach the team store while mounted"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        pg.count(
            "SELECT count(*) FROM jobs WHERE position('cat in.txt > out.txt'::bytea IN argv) > 0"
        ),
        1
    );
    m.unmount();
}

/// `roar ui --remote`: the page's data is the team store's, and a job another machine pushes
/// while the page is open appears in it.
#[test]
fn the_page_over_the_team_store_shows_jobs_pushed_while_it_is_open() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    if !require_tool("python3") {
        return;
    }
    let (a, b) = (Project::new(), Project::new());
    add_remote(&a, &pg, false);
    add_remote(&b, &pg, false);
    a.write("in.txt", b"x");
    a.run_under("preload", &["sh", "-c", "cat in.txt > first.txt"]);
    ok(&a.roar(["push"]), "push");
    let mut ui = b
        .cmd(["--remote", "origin", "ui", "--port", "0", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(ui.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let url = serde_json::from_str::<serde_json::Value>(&line).unwrap()["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let dag_url = url.replace("/?token=", "/api/dag?token=");
    let dag = || -> String {
        let o = Command::new("python3")
            .args(["-c", "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())", &dag_url])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    assert!(dag().contains("first.txt"), "the team's job is on the page");
    a.run_under("preload", &["sh", "-c", "cat first.txt > second.txt"]);
    ok(&a.roar(["push"]), "push");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !dag().contains("second.txt") {
        assert!(
            std::time::Instant::now() < deadline,
            "a job pushed while the page is open never appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let _ = ui.kill();
    let _ = ui.wait();
}

/// `sslmode=require`: the team store is reached over TLS and verified against the CA named in
/// PGSSLROOTCERT; without it, the unverified server gets nothing (one line saying why); a URL
/// without `sslmode` is plain text, which this server refuses.
#[test]
fn sslmode_require_verifies_the_team_store() {
    let Some(mut pg) = Postgres::start() else {
        return;
    };
    if !require_tool("openssl") {
        return;
    }
    let ca = pg.require_tls();
    let p = Project::new();
    let tls_url = format!("{}?sslmode=require", pg.url());
    ok(
        &p.roar(["remote", "add", "origin", &tls_url, "--no-auto-push"]),
        "remote add",
    );
    ok(
        &p.roar(["remote", "add", "plain", &pg.url(), "--no-auto-push"]),
        "remote add",
    );
    p.run_under("preload", &["true"]);
    // No CA for it: refused before any credential or record is sent.
    let home = tempfile::tempdir().unwrap();
    let out = p
        .cmd(["push", "--remote", "origin"])
        .env("HOME", home.path())
        .env_remove("PGSSLROOTCERT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot reach the team store origin"), "{err}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // Plain text: the server refuses it.
    let out = p.roar(["push", "--remote", "plain"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(
        pg.count("SELECT count(*) FROM pg_tables WHERE tablename = 'jobs'"),
        0
    );
    // Verified TLS: pushed.
    let out = p
        .cmd(["push", "--remote", "origin"])
        .env("PGSSLROOTCERT", &ca)
        .output()
        .unwrap();
    ok(&out, "push over TLS");
    assert_eq!(pg.count("SELECT count(*) FROM jobs"), 1);
    let out = p
        .cmd(["--remote", "origin", "log", "--json"])
        .env("PGSSLROOTCERT", &ca)
        .output()
        .unwrap();
    ok(&out, "log over TLS");
}

/// Runs in a row wake one lingering background pusher instead of starting one each.
#[test]
fn runs_in_a_row_share_one_background_pusher() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    let p = Project::new();
    add_remote(&p, &pg, true);
    for i in 0..6 {
        ok(
            &p.roar(["run", "--", "sh", "-c", &format!("echo {i} > f{i}")]),
            "run",
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while pg.try_count("SELECT count(*) FROM jobs") != Some(6) {
        assert!(
            std::time::Instant::now() < deadline,
            "the runs' jobs were not pushed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let roar_dir = p.path().join(".roar");
    let pushers: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let want = format!("ROAR_DIR={}", roar_dir.display());
            cmdline.windows(12).any(|w| w == b"--background")
                && environ.split(|b| *b == 0).any(|v| v == want.as_bytes())
        })
        .collect();
    assert_eq!(
        pushers.len(),
        1,
        "one lingering pusher, not one per run: {pushers:?}"
    );
}

/// `roar log -n 0 --json` of a project, by uid, each job without its store-local `id`.
fn log_by_uid(out: &Output) -> std::collections::BTreeMap<String, serde_json::Value> {
    let log: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    log.as_array()
        .unwrap()
        .iter()
        .map(|j| {
            let mut j = j.clone();
            j.as_object_mut().unwrap().remove("id");
            (j["uid"].as_str().unwrap().to_owned(), j)
        })
        .collect()
}

/// The ids `roar log --json` printed, by uid.
fn ids_by_uid(out: &Output) -> std::collections::BTreeMap<String, i64> {
    let log: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    log.as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["uid"].as_str().unwrap().to_owned(),
                j["id"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// `roar show ID --json` (over the team store `origin` if `remote`), without the store-local id.
fn show_json(p: &Project, id: i64, remote: bool) -> serde_json::Value {
    let id = id.to_string();
    let mut args = if remote {
        vec!["--remote", "origin"]
    } else {
        vec![]
    };
    args.extend(["show", &id, "--json"]);
    let out = p.roar(&args);
    ok(&out, "show");
    let mut job: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    job.as_object_mut().unwrap().remove("id");
    job
}

/// Fails naming the first place where two JSON values differ (not the whole of each: a job
/// can hold thousands of files).
fn same_json(remote: &serde_json::Value, local: &serde_json::Value, what: &str) {
    use serde_json::Value;
    fn first_difference(a: &Value, b: &Value, at: String) -> Option<String> {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                    (Some(a), Some(b)) => first_difference(a, b, format!("{at}.{k}")),
                    (a, b) => Some(format!("{at}.{k}: {a:?} against {b:?}")),
                })
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
                .iter()
                .zip(y)
                .enumerate()
                .find_map(|(i, (a, b))| first_difference(a, b, format!("{at}[{i}]"))),
            _ if a == b => None,
            _ => Some(format!("{at}: {a} against {b}")),
        }
    }
    if let Some(d) = first_difference(remote, local, String::new()) {
        panic!("{what} differs (team store against local): {d}");
    }
}

/// A small fleet (crates/fleet: 8 nodes of about 500 jobs, each node its own project store and
/// host name, with pipelines with steps, a shared dataset, overwritten checkpoints and runs of 8
/// to 64 ranks across nodes) pushes concurrently: the team store holds every job and file record
/// once, and `--remote` answers as the union of the nodes' stores — every job's summary, a sample
/// of jobs whole, and the lineage of a checkpoint made by a chain of distributed runs.
#[test]
fn a_fleet_pushes_concurrently_and_answers_as_the_union_of_its_nodes() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    // Another fleet: ROAR_FLEET_SEED=N (every failure names the seed).
    let seed: u64 = std::env::var("ROAR_FLEET_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(66);
    let shape = roar_fleet::Shape::new(8, 500, seed);
    let seed = format!("fleet seed {seed}");
    let nodes: Vec<Project> = (0..shape.nodes).map(|_| Project::new()).collect();
    std::thread::scope(|s| {
        for (n, p) in nodes.iter().enumerate() {
            let shape = &shape;
            s.spawn(move || roar_fleet::write_node(shape, n as u32, p.path()).unwrap());
        }
    });
    for p in &nodes {
        add_remote(p, &pg, false);
    }
    // Two pushers per node at once: 16 concurrent pushers racing over the same jobs.
    let pushers: Vec<_> = (0..16)
        .map(|i| nodes[i % nodes.len()].cmd(["push"]).spawn().unwrap())
        .collect();
    for mut child in pushers {
        assert!(child.wait().unwrap().success());
    }
    let sum = |sql: &str| nodes.iter().map(|p| local_count(p, sql)).sum::<i64>();
    for table in ["jobs", "job_files", "steps", "step_files"] {
        let sql = format!("SELECT count(*) FROM {table}");
        assert_eq!(
            pg.count(&sql),
            sum(&sql),
            "{table}: lost or duplicated rows ({seed})"
        );
    }
    assert_eq!(
        pg.count("SELECT count(DISTINCT uid) FROM jobs"),
        sum("SELECT count(*) FROM jobs")
    );
    // Every job's summary, as the union of the nodes' own logs.
    let analyst = Project::new();
    add_remote(&analyst, &pg, false);
    let out = analyst.roar(["--remote", "origin", "log", "-n", "0", "--json"]);
    ok(&out, "log --remote");
    let team = log_by_uid(&out);
    let mut union = std::collections::BTreeMap::new();
    let mut local_ids = Vec::new();
    for p in &nodes {
        let out = p.roar(["log", "-n", "0", "--json"]);
        ok(&out, "log");
        let log: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for j in log.as_array().unwrap() {
            local_ids.push((
                p,
                j["id"].as_i64().unwrap(),
                j["uid"].as_str().unwrap().to_owned(),
            ));
        }
        union.extend(log_by_uid(&out));
    }
    assert_eq!(union.len(), local_ids.len(), "a uid on two nodes ({seed})");
    assert_eq!(team.len(), union.len());
    for (uid, job) in &union {
        same_json(&team[uid], job, &format!("job {uid} in the log ({seed})"));
    }
    // A sample of jobs whole (files, steps, environment), every 97th.
    let team_ids = ids_by_uid(&out);
    for (p, id, uid) in local_ids.iter().step_by(97) {
        same_json(
            &show_json(&analyst, team_ids[uid], true),
            &show_json(p, *id, false),
            &format!("job {uid} over the team store ({seed})"),
        );
    }
    // The lineage of the last run's checkpoint: rank 0 of each run of its chain, on its node,
    // and the ingest jobs, on theirs, that wrote the shards those ranks read.
    let last = shape.runs - 1;
    let ckpt = shape.run_checkpoint(last).0;
    let out = analyst.roar([
        "--remote",
        "origin",
        "lineage",
        ckpt.to_str().unwrap(),
        "--json",
    ]);
    ok(&out, "lineage --remote");
    let lineage: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let steps: BTreeSet<(String, String)> = lineage["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["host"].as_str().unwrap().to_owned(),
                s["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(steps, shape.run_lineage(last), "{seed}: {lineage:#}");
    assert!(
        steps
            .iter()
            .map(|(host, _)| host)
            .collect::<BTreeSet<_>>()
            .len()
            > 1,
        "the lineage crosses nodes ({seed})"
    );
}

/// Turns a team store of schema 3 back into schema 1 (file records naming their path, role,
/// contents and ops in full, a table of contents, and the two indexes schema 1 had),
/// independently of the migrations.
const BACK_TO_SCHEMA_1: &str = r#"
BEGIN;
CREATE TABLE artifacts (blake3 TEXT PRIMARY KEY, sha256 TEXT, size BIGINT NOT NULL);
INSERT INTO artifacts
SELECT blake3, max(sha256), max(size) FROM (
    SELECT blake3, sha256, size FROM job_files WHERE blake3 IS NOT NULL
    UNION ALL
    SELECT before_blake3, before_sha256, before_size FROM job_files WHERE before_blake3 IS NOT NULL
) a GROUP BY blake3;
CREATE TABLE job_files_old (
    job_seq BIGINT NOT NULL REFERENCES jobs (seq) ON DELETE CASCADE, ord INT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('input', 'output', 'temp')), path BYTEA NOT NULL,
    blake3 TEXT REFERENCES artifacts (blake3), before_blake3 TEXT REFERENCES artifacts (blake3),
    ops TEXT NOT NULL, first_ns BIGINT, last_ns BIGINT, s3_bucket TEXT, s3_key TEXT,
    s3_version_id TEXT, s3_etag TEXT, s3_size BIGINT, s3_range TEXT,
    PRIMARY KEY (job_seq, ord));
INSERT INTO job_files_old
SELECT f.job_seq, f.ord,
       CASE f.role WHEN 'i' THEN 'input' WHEN 'o' THEN 'output' ELSE 'temp' END, f.path,
       f.blake3, f.before_blake3,
       array_to_string(ARRAY(SELECT v.name FROM (VALUES (1, 'read'), (2, 'write'), (4, 'create'),
           (8, 'truncate'), (16, 'rename'), (32, 'unlink')) AS v (bit, name)
           WHERE f.ops & v.bit != 0 ORDER BY v.bit), ','),
       f.first_ns, f.last_ns, f.s3_bucket, f.s3_key, f.s3_version_id, f.s3_etag, f.s3_size,
       f.s3_range
FROM job_files f;
DROP VIEW job_files;
DROP TABLE job_file_lists, job_file_s3;
ALTER TABLE job_files_old RENAME TO job_files;
ALTER TABLE job_files RENAME CONSTRAINT job_files_old_pkey TO job_files_pkey;
CREATE INDEX job_files_version ON job_files (path, role, blake3);
CREATE INDEX job_files_producer ON job_files (blake3, role);
UPDATE roar_schema SET version = 1;
COMMIT;
"#;

/// A team store of schema 1 (file records in full) is migrated by the next reader, and every
/// job reads back as before: files with their roles, contents, previous contents and ops, steps.
#[test]
fn a_team_store_of_schema_1_is_migrated_and_reads_back_the_same() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    assert_eq!(roar_team::MIGRATIONS.len(), 3, "this test knows schema 3");
    let p = Project::new();
    let shape = roar_fleet::Shape::new(3, 40, 2);
    for n in 0..shape.nodes {
        roar_fleet::write_node(&shape, n, p.path()).unwrap();
    }
    record_s3_job(&p);
    add_remote(&p, &pg, false);
    ok(&p.roar(["push"]), "push");
    let files = pg.count("SELECT count(*) FROM job_files");
    assert_eq!(
        pg.count("SELECT count(*) FROM job_files WHERE s3_bucket IS NOT NULL"),
        1
    );
    pg.query(BACK_TO_SCHEMA_1);
    assert_eq!(pg.count("SELECT version FROM roar_schema"), 1);
    assert_eq!(pg.count("SELECT count(*) FROM job_files WHERE ops = ''"), 0);
    // A reader brings it up to date and answers as the store it was pushed from.
    let reader = Project::new();
    add_remote(&reader, &pg, false);
    let out = reader.roar(["--remote", "origin", "log", "-n", "0", "--json"]);
    ok(&out, "log --remote");
    assert_eq!(pg.count("SELECT version FROM roar_schema"), 3);
    assert_eq!(pg.count("SELECT count(*) FROM job_files"), files);
    let team = log_by_uid(&out);
    let local = p.roar(["log", "-n", "0", "--json"]);
    let local_log: serde_json::Value = serde_json::from_slice(&local.stdout).unwrap();
    assert_eq!(team.len(), local_log.as_array().unwrap().len());
    let remote_id = ids_by_uid(&out);
    for j in local_log.as_array().unwrap() {
        let uid = j["uid"].as_str().unwrap();
        same_json(
            &show_json(&reader, remote_id[uid], true),
            &show_json(&p, j["id"].as_i64().unwrap(), false),
            &format!("job {uid} after the migration"),
        );
    }
    // And pushes go on into the migrated store.
    roar_fleet::write_node(&roar_fleet::Shape::new(1, 10, 3), 0, p.path()).unwrap();
    ok(&p.roar(["push"]), "push after the migration");
    assert_eq!(
        pg.count("SELECT count(*) FROM jobs"),
        local_count(&p, "SELECT count(*) FROM jobs")
    );
}

/// Records one finished job in `p`'s store through the writer: `argv0`, started at `started_ns`
/// (1 s long), with `files`.
fn record_job(
    p: &Project,
    name: Option<&str>,
    argv0: &str,
    started_ns: i64,
    files: Vec<FileRecord>,
) {
    let writer = Writer::start(&p.path().join(".roar/roar.db")).unwrap();
    writer
        .record_job(JobRecord {
            name: name.map(str::to_owned),
            argv: vec![OsString::from(argv0)],
            cwd: p.path().to_owned(),
            started_ns,
            ended_ns: Some(started_ns + 1_000_000_000),
            outcome: Outcome::Exited(0),
            incomplete: false,
            backend: "preload".into(),
            git: None,
            env: Default::default(),
            host: Some("node".into()),
            processes: Vec::new(),
            steps: Vec::new(),
            files,
            environment: None,
            uid: None,
            dist: None,
        })
        .unwrap();
    writer.flush().unwrap();
}

/// Records one finished job in `p`'s store, started at `started_ns`, writing `path` with
/// `content` (a file record with no access times: the job's times stand for them).
fn record_write(p: &Project, started_ns: i64, path: &std::path::Path, content: &[u8]) {
    let file = FileRecord {
        role: Role::Output,
        path: path.to_owned(),
        hash: Some(ContentHash {
            blake3: blake3::hash(content).to_hex().to_string(),
            sha256: None,
            size: content.len() as u64,
        }),
        before: None,
        ops: Ops::WRITE | Ops::CREATE,
        first_ns: None,
        last_ns: None,
        s3: None,
    };
    record_job(p, None, "make-model", started_ns, vec![file]);
}

/// Records one job in `p`'s store with the fields a fleet's jobs leave empty: a ranged S3 read
/// (its object fields), and an output with a sha256 and the content it replaced.
fn record_s3_job(p: &Project) {
    let hash = |content: &[u8]| ContentHash {
        blake3: blake3::hash(content).to_hex().to_string(),
        sha256: Some(format!("{:064x}", content.len())),
        size: content.len() as u64,
    };
    let file = |role, path: &str, ops| FileRecord {
        role,
        path: path.into(),
        hash: Some(hash(path.as_bytes())),
        before: None,
        ops,
        first_ns: Some(1_700_000_000_000_000_001),
        last_ns: Some(1_700_000_000_000_000_002),
        s3: None,
    };
    let mut read = file(Role::Input, "s3://bucket/data/part-0", Ops::READ);
    read.s3 = Some(roar_store::S3Object {
        bucket: "bucket".into(),
        key: "data/part-0".into(),
        version_id: Some("v1".into()),
        etag: Some("\"e\"".into()),
        size: Some(4096),
        range: Some("bytes 0-1023/4096".into()),
    });
    let mut out = file(Role::Output, "/data/model.bin", Ops::WRITE | Ops::TRUNCATE);
    out.before = Some(hash(b"the model before"));
    record_job(
        p,
        Some("s3-reader"),
        "train",
        1_700_000_000_000_000_000,
        vec![read, out],
    );
}

/// A location's last record is the latest in time, not the last the team store received: a job
/// that wrote a shared file an hour after another, pushed first, is still the one whose content
/// is there — `status --remote` does not call the file modified.
#[test]
fn status_over_the_team_store_takes_the_latest_record_not_the_last_pushed() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    let analyst = Project::new();
    let model = std::fs::canonicalize(analyst.path())
        .unwrap()
        .join("model.bin");
    std::fs::write(&model, b"newer").unwrap();
    let (later, earlier) = (Project::new(), Project::new());
    let t = 1_800_000_000_000_000_000;
    record_write(&later, t + 3_600_000_000_000, &model, b"newer");
    record_write(&earlier, t, &model, b"older");
    for p in [&later, &earlier, &analyst] {
        add_remote(p, &pg, false);
    }
    ok(&later.roar(["push"]), "push");
    ok(&earlier.roar(["push"]), "push");
    let out = analyst.roar(["--remote", "origin", "status", "--json"]);
    ok(&out, "status --remote");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["changed"], serde_json::json!([]), "{report:#}");
    // And when the file is changed, the job it is compared with is the later one.
    std::fs::write(&model, b"edited").unwrap();
    let out = analyst.roar(["--remote", "origin", "status", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let changed = report["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 1, "{report:#}");
    assert_eq!(
        changed[0]["recorded"],
        blake3::hash(b"newer").to_hex().to_string(),
        "{report:#}"
    );
}

/// `status` over a team store judges the project it is asked in: its own files and jobs, and
/// what is upstream of them, wherever it was recorded — not every project of the team. And in
/// the project that recorded everything, it answers as the local store does.
#[test]
fn status_over_the_team_store_is_the_projects_own_and_what_is_upstream_of_it() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    let shared = tempfile::tempdir().unwrap();
    let shared = std::fs::canonicalize(shared.path()).unwrap();
    let data = shared.join("data.csv");
    let (maker, user) = (Project::new(), Project::new());
    // The maker's ingest writes the shared file from its raw input; a job of its own besides.
    maker.write("raw.txt", b"1\n2\n");
    maker.write("notes.txt", b"n\n");
    maker.run_under(
        "preload",
        &["sh", "-c", &format!("sort raw.txt > {}", data.display())],
    );
    maker.run_under("preload", &["sh", "-c", "cat notes.txt > summary.txt"]);
    // The user's training reads the shared file into its model.
    user.run_under(
        "preload",
        &["sh", "-c", &format!("cat {} > model.txt", data.display())],
    );
    for p in [&maker, &user] {
        add_remote(p, &pg, false);
        ok(&p.roar(["push"]), "push");
    }
    // Both of the maker's inputs change.
    maker.write("raw.txt", b"3\n");
    maker.write("notes.txt", b"m\n");
    let status = |p: &Project, remote: bool| -> serde_json::Value {
        let mut args = if remote {
            vec!["--remote", "origin"]
        } else {
            vec![]
        };
        args.extend(["status", "--json"]);
        let out = p.roar(args);
        ok(&out, "status");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let report = status(&user, true);
    let stale: Vec<(&str, Vec<&str>)> = report["stale"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["label"].as_str().unwrap(),
                s["outputs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o.as_str().unwrap())
                    .collect(),
            )
        })
        .collect();
    let model = std::fs::canonicalize(user.path())
        .unwrap()
        .join("model.txt");
    let labels: Vec<&str> = stale.iter().map(|s| s.0).collect();
    assert_eq!(stale.len(), 2, "the ingest and the training: {report:#}");
    assert!(labels[0].contains("sort raw.txt"), "{report:#}");
    assert_eq!(stale[1].1, [model.to_str().unwrap()], "{report:#}");
    let chain = &report["stale"][1]["because"]["chain"];
    assert_eq!(
        chain.as_array().unwrap().len(),
        2,
        "raw.txt -> ingest -> training: {report:#}"
    );
    assert!(
        !report.to_string().contains("summary.txt"),
        "the maker's own job is not the user's status: {report:#}"
    );
    // In the maker's project the team store answers as its local store.
    assert_eq!(status(&maker, true), status(&maker, false));
}
