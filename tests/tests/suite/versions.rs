//! The lineage graph of file versions (issue 27), on pipelines run for real under `roar run`:
//! a node is (location, content), so copies, outputs equal to a checkpoint, renames and re-runs
//! get the right producers; random pipelines never give a cycle; `status` is transitive and only
//! reports real changes; noise is hidden from already-recorded jobs; big directories collapse.

use crate::common;

use std::collections::{HashMap, HashSet};

use common::{stderr, stdout, Project};
use serde_json::Value;

fn run(p: &Project, name: &str, cmd: &str) {
    let out = p.roar(["run", "--name", name, "--", "sh", "-c", cmd]);
    assert!(out.status.success(), "{name}: {}", stderr(&out));
}

fn json(p: &Project, args: &[&str]) -> Value {
    let out = p.roar(args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn rel(p: &Project, path: &str) -> String {
    path.strip_prefix(&format!("{}/", p.path().display()))
        .unwrap_or(path)
        .to_owned()
}

/// (path relative to the project, producer, copy_of) of every input of `job` in `dag --json`.
fn inputs_of(p: &Project, dag: &Value, job: i64) -> Vec<(String, Option<i64>, Option<String>)> {
    let step = dag["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["job_id"] == job)
        .unwrap_or_else(|| panic!("job {job} not in {dag}"));
    step["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                rel(p, e["path"].as_str().unwrap()),
                e["producer"].as_i64(),
                e["copy_of"].as_str().map(|c| rel(p, c)),
            )
        })
        .collect()
}

/// The jobs of a lineage in the order they ran (a job with steps is several nodes, one job).
fn job_ids(lineage: &Value) -> Vec<i64> {
    let mut ids: Vec<i64> = lineage["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["job_id"].as_i64().unwrap())
        .collect();
    ids.dedup();
    ids
}

/// A lineage node: a job, or one of its steps (`3.2`).
fn node(job: &Value, step: &Value) -> String {
    match step.as_u64() {
        Some(s) => format!("{}.{s}", job.as_i64().unwrap()),
        None => job.as_i64().unwrap().to_string(),
    }
}

#[test]
fn a_copy_step_is_two_versions_and_never_its_own_producer() {
    let p = Project::new();
    p.write("remote/iris.csv", b"sepal,petal\n5.1,1.4\n");
    std::fs::create_dir_all(p.path().join("data/raw")).unwrap();
    run(&p, "download", "cp remote/iris.csv data/raw/dataset.csv");
    run(&p, "prep", "sort data/raw/dataset.csv > data/clean.csv");
    let dag = json(&p, &["dag", "--json"]);
    // The copy's own input has no producer: the job did not make what it read.
    assert_eq!(
        inputs_of(&p, &dag, 1),
        [("remote/iris.csv".into(), None, None)]
    );
    // prep read the copy at its own location, made by job 1.
    assert_eq!(
        inputs_of(&p, &dag, 2),
        [("data/raw/dataset.csv".into(), Some(1), None)]
    );
    let outputs = &dag["steps"][0]["outputs"];
    assert_eq!(
        rel(&p, outputs[0]["path"].as_str().unwrap()),
        "data/raw/dataset.csv"
    );
    assert_eq!(
        rel(&p, outputs[0]["copy_of"].as_str().unwrap()),
        "remote/iris.csv"
    );
    let dot = stdout(&p.roar(["dag", "--dot"]));
    assert!(dot.contains("data/raw/dataset.csv"), "{dot}");
    let lineage = json(&p, &["lineage", "data/clean.csv", "--json"]);
    assert_eq!(job_ids(&lineage), [1, 2]);
    let roots: Vec<String> = lineage["roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| rel(&p, r["path"].as_str().unwrap()))
        .collect();
    assert_eq!(roots, ["remote/iris.csv"]);
    let text = stdout(&p.roar(["lineage", "data/clean.csv"]));
    assert!(text.contains("data/raw/dataset.csv  (job 1)"), "{text}");
    assert!(!text.contains("iris.csv  (job 1)"), "{text}");
}

#[test]
fn an_output_with_the_bytes_of_a_checkpoint_keeps_its_own_node() {
    let p = Project::new();
    // Collapsing a job's directory of checkpoints is what is checked here: the loop's `cat`s
    // would each be a step with one checkpoint (tests/tests/suite/steps.rs covers steps).
    p.append_config("\n[steps]\ndrivers = []\n");
    p.write("data.txt", b"d");
    std::fs::create_dir_all(p.path().join("ckpt")).unwrap();
    run(
        &p,
        "train",
        "for i in 0 1 2 3 4 5 6 7; do cat data.txt > ckpt/epoch_00$i.npy; echo $i >> ckpt/epoch_00$i.npy; done; cp ckpt/epoch_007.npy model.npy",
    );
    run(&p, "evaluate", "wc -c model.npy > metrics.json");
    let dag = json(&p, &["dag", "--json"]);
    assert_eq!(
        inputs_of(&p, &dag, 2),
        [("model.npy".into(), Some(1), None)]
    );
    let lineage = json(&p, &["lineage", "metrics.json", "--json"]);
    assert_eq!(job_ids(&lineage), [1, 2]);
    // The checkpoints are one node in text and DOT, expanded on request.
    let text = stdout(&p.roar(["dag"]));
    assert!(text.contains("ckpt/ (8 files)"), "{text}");
    assert!(!text.contains("epoch_001"), "{text}");
    let text = stdout(&p.roar(["dag", "--expand"]));
    assert!(text.contains("ckpt/epoch_001.npy"), "{text}");
    let ckpt = p.path().join("ckpt");
    let text = stdout(&p.roar(["dag", &format!("--expand={}", ckpt.display())]));
    assert!(text.contains("ckpt/epoch_001.npy"), "{text}");
    let dot = stdout(&p.roar(["dag", "--dot"]));
    assert!(dot.contains("(8 files)"), "{dot}");
    assert_eq!(
        dot.matches("shape=note").count(),
        4,
        "data, ckpt/, model, metrics: {dot}"
    );
}

#[test]
fn a_rename_and_a_copy_outside_roar_name_their_origin() {
    let p = Project::new();
    p.write("raw.txt", b"b\na\n");
    run(&p, "sort", "sort raw.txt > sorted.txt");
    run(&p, "move", "mv sorted.txt final.txt");
    // A copy roar did not see: the content is found at its first location, shown as a copy.
    std::fs::copy(p.path().join("final.txt"), p.path().join("copy.txt")).unwrap();
    run(&p, "use", "cat copy.txt final.txt > both.txt");
    let dag = json(&p, &["dag", "--json"]);
    assert_eq!(
        inputs_of(&p, &dag, 2),
        [("sorted.txt".into(), Some(1), None)]
    );
    let mut used = inputs_of(&p, &dag, 3);
    used.sort();
    assert_eq!(
        used,
        [
            ("copy.txt".into(), Some(2), Some("final.txt".into())),
            ("final.txt".into(), Some(2), None),
        ]
    );
    assert_eq!(
        job_ids(&json(&p, &["lineage", "both.txt", "--json"])),
        [1, 2, 3]
    );
    let text = stdout(&p.roar(["lineage", "both.txt"]));
    assert!(
        text.contains("copy.txt  = copy of final.txt  (job 2)"),
        "{text}"
    );
    // In DOT the copy hangs off the version it copies, dashed.
    let dot = stdout(&p.roar(["dag", "--dot"]));
    let root = std::fs::canonicalize(p.path()).unwrap();
    let edge = format!(
        "\"v{0}/final.txt@2\" -> \"v{0}/copy.txt@2\" [style=dashed, label=\"copy\"];",
        root.display()
    );
    assert!(dot.contains(&edge), "{edge} in {dot}");
    assert!(
        dot.contains(&format!("\"j2\" -> \"v{}/final.txt@2\"", root.display())),
        "{dot}"
    );
}

#[test]
fn after_a_reproduce_lineage_names_only_the_rerun() {
    let p = Project::new();
    p.write("raw.txt", b"3\n1\n2\n");
    run(&p, "sort", "sort raw.txt > sorted.txt");
    run(&p, "head", "head -n 2 sorted.txt > top.txt");
    let out = p.roar(["reproduce", "--run", "--in-place", "top.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let jobs = job_ids(&json(&p, &["lineage", "top.txt", "--json"]));
    assert_eq!(jobs.len(), 2, "one sort and one head: {jobs:?}");
    assert!(
        jobs.iter().all(|j| *j > 2),
        "only the re-run jobs: {jobs:?}"
    );
}

/// A tiny deterministic generator, so a failing seed can be run again.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// Steps that copy, rewrite the same bytes, update in place, rename and read each other's
/// files, then checks `dag --json` as a graph: no cycle, and every producer started before its
/// reader and wrote that content (at that path, or at `copy_of`).
#[test]
fn random_pipelines_never_give_a_cycle() {
    for seed in [1u64, 7, 42] {
        let p = Project::new();
        let mut rng = Lcg(seed);
        let mut files = vec!["f0".to_owned(), "f1".to_owned()];
        p.write("f0", b"zero\n");
        p.write("f1", b"one\n");
        for step in 0..14 {
            let a = files[rng.next(files.len())].clone();
            let b = files[rng.next(files.len())].clone();
            let new = format!("f{}", files.len());
            let cmd = match rng.next(6) {
                0 => format!("cp {a} {new}"),
                1 => format!("cat {a} {b} > {new}"),
                2 => format!("cp {a} {a}.t && cat {a}.t > {a} && rm {a}.t"),
                3 => format!("echo {step} >> {a}"),
                4 => format!("mv {a} {new} && cp {new} {a}"),
                _ => format!("sort {a} > {new}; cat {new} > {b}"),
            };
            run(&p, &format!("s{step}"), &cmd);
            if p.path().join(&new).exists() {
                files.push(new);
            }
        }
        let dag = json(&p, &["dag", "--json"]);
        let steps = dag["steps"].as_array().unwrap();
        // Nodes are jobs, or the steps of a job that has steps (`sort a > n; cat n > b`).
        let started: HashMap<String, i64> = steps
            .iter()
            .map(|s| {
                (
                    node(&s["job_id"], &s["step"]),
                    s["started_ns"].as_i64().unwrap(),
                )
            })
            .collect();
        let wrote: HashSet<(String, String, Option<String>)> = steps
            .iter()
            .flat_map(|s| {
                s["outputs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(move |o| {
                        Some((
                            node(&s["job_id"], &s["step"]),
                            o["path"].as_str()?.to_owned(),
                            o["hash"]["blake3"].as_str().map(str::to_owned),
                        ))
                    })
            })
            .collect();
        let mut edges: HashMap<String, Vec<String>> = HashMap::new();
        for s in steps {
            let me = node(&s["job_id"], &s["step"]);
            for i in s["inputs"].as_array().unwrap() {
                if i["producer"].is_null() {
                    continue;
                }
                let up = node(&i["producer"], &i["producer_step"]);
                assert!(
                    started[&up] < started[&me],
                    "seed {seed}: {up} -> {me}: {dag}"
                );
                let at = i["copy_of"]
                    .as_str()
                    .or(i["path"].as_str())
                    .unwrap()
                    .to_owned();
                // A step's intermediate file (written again later in its job) has no hash.
                let content = i["hash"]["blake3"].as_str().map(str::to_owned);
                assert!(
                    wrote.contains(&(up.clone(), at.clone(), content)),
                    "seed {seed}: {up} never wrote {at} as {me} read it: {dag}"
                );
                edges.entry(up).or_default().push(me.clone());
            }
        }
        // Depth-first search for a back edge.
        fn visit(
            n: &str,
            edges: &HashMap<String, Vec<String>>,
            state: &mut HashMap<String, u8>,
        ) -> bool {
            match state.get(n) {
                Some(1) => return false,
                Some(2) => return true,
                _ => {}
            }
            state.insert(n.to_owned(), 1);
            let ok = edges
                .get(n)
                .into_iter()
                .flatten()
                .all(|m| visit(m, edges, state));
            state.insert(n.to_owned(), 2);
            ok
        }
        let mut state = HashMap::new();
        for n in started.keys() {
            assert!(
                visit(n, &edges, &mut state),
                "seed {seed}: a cycle in {dag}"
            );
        }
    }
}

#[test]
fn status_checks_inputs_outside_the_project_and_ignores_touches() {
    let p = Project::new();
    let outside = tempfile::tempdir().unwrap();
    let raw = outside.path().join("raw.csv");
    std::fs::write(&raw, b"1,2\n").unwrap();
    p.write("train.py", b"# v1\n");
    run(&p, "prep", &format!("cp {} data.csv", raw.display()));
    run(&p, "train", "cat train.py data.csv > model.bin");
    run(&p, "report", "wc -c model.bin > report.txt");
    let clean = p.roar(["status", "--exit-code"]);
    assert_eq!(clean.status.code(), Some(0), "{}", stdout(&clean));
    // Touching files without changing them changes nothing.
    for f in ["train.py", "data.csv", "model.bin"] {
        let t = std::fs::File::options()
            .append(true)
            .open(p.path().join(f))
            .unwrap();
        t.set_modified(std::time::SystemTime::now()).unwrap();
    }
    let touched = p.roar(["status", "--exit-code"]);
    assert_eq!(touched.status.code(), Some(0), "{}", stdout(&touched));
    // Editing the script makes train and report stale, through the chain.
    p.write("train.py", b"# v2\n");
    let v = json(&p, &["status", "--json"]);
    assert_eq!(v["clean"], false);
    let stale: Vec<(i64, Vec<i64>)> = v["stale"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let chain = s["because"]["chain"].as_array().unwrap();
            (
                s["job"].as_i64().unwrap(),
                chain.iter().map(|j| j.as_i64().unwrap()).collect(),
            )
        })
        .collect();
    assert_eq!(stale, [(2, vec![2]), (3, vec![2, 3])], "{v}");
    p.write("train.py", b"# v1\n");
    assert_eq!(p.roar(["status", "--exit-code"]).status.code(), Some(0));
    // A raw input outside the project changed: everything downstream of it is stale.
    std::fs::write(&raw, b"1,3\n").unwrap();
    let out = p.roar(["status", "--exit-code"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(text.contains("stale outputs (3 files of 3 jobs)"), "{text}");
    assert!(
        text.contains(&format!(
            "{} modified (job 1 → job 2 → job 3)",
            raw.display()
        )),
        "{text}"
    );
    // Outside the project it is a cause, not a changed project file.
    assert!(!text.contains("changed since recorded"), "{text}");
}

#[test]
fn noise_is_hidden_from_jobs_recorded_before_the_rule() {
    let p = Project::new();
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join(".cache/matplotlib");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(cache.join("fontlist-v390.json"), b"{}").unwrap();
    p.write("scratch.log", b"x");
    p.write("in.txt", b"data");
    let out = p
        .cmd(["run", "--name", "plot", "--", "sh", "-c"])
        .arg(format!(
            "cat {}/fontlist-v390.json scratch.log in.txt > out.txt",
            cache.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // The tracer already left the font cache out; the log is data until the rule says not.
    let files = |args: &[&str]| -> Vec<String> {
        json(&p, args)["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| rel(&p, f["path"].as_str().unwrap()))
            .collect()
    };
    assert_eq!(
        files(&["show", "plot", "--json"]),
        ["in.txt", "scratch.log", "out.txt"]
    );
    let config = p.path().join(".roar/config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text = text.replacen("ignore = []", "ignore = [\"**/*.log\"]", 1);
    assert!(
        text.contains("**/*.log"),
        "the default config has an ignore key: {text}"
    );
    std::fs::write(&config, text).unwrap();
    assert_eq!(files(&["show", "plot", "--json"]), ["in.txt", "out.txt"]);
    assert_eq!(
        files(&["show", "plot", "--all", "--json"]),
        ["in.txt", "scratch.log", "out.txt"]
    );
    let log = stdout(&p.roar(["log"]));
    assert!(log.contains("  1 in   1 out"), "{log}");
}

#[test]
fn jobs_are_named_as_users_name_them() {
    let p = Project::new();
    p.write("a", b"a");
    run(&p, "train", "cp a b");
    run(&p, "eval", "cp b c");
    run(&p, "train", "cp a d");
    let id = |what: &str| json(&p, &["show", what, "--json"])["id"].as_i64();
    assert_eq!(id("train"), Some(3));
    assert_eq!(id("train~1"), Some(1));
    assert_eq!(id("@2"), Some(2));
    assert_eq!(id("eval~0"), Some(2));
    let out = p.roar(["show", "train~5"]);
    assert!(!out.status.success());
    // A file of that name wins over a job name.
    p.write("eval", b"e");
    let out = p.roar(["show", "eval"]);
    assert!(
        stderr(&out).contains("eval was never recorded"),
        "{}",
        stderr(&out)
    );
    let all = stdout(&p.roar(["log", "-n", "0"]));
    assert_eq!(all.lines().count(), 3, "{all}");
    let diff = p.roar(["diff", "train~1", "train"]);
    assert!(diff.status.success(), "{}", stderr(&diff));
    assert!(stdout(&diff).contains("A: job 1"), "{}", stdout(&diff));
}

#[test]
fn a_store_of_the_previous_schema_migrates_with_every_job() {
    let p = Project::new();
    p.write("raw.txt", b"2\n1\n");
    run(&p, "sort", "sort raw.txt > sorted.txt");
    run(&p, "copy", "cp sorted.txt final.txt");
    let before = stdout(&p.roar(["dag"]));
    // Put the store back to schema 5, as the previous release left it.
    let db = p.path().join(".roar/roar.db");
    {
        let conn = roar_store::open(&db, false).unwrap();
        conn.execute_batch(
            "DROP INDEX job_files_version;
             CREATE INDEX job_files_path ON job_files(path);
             ALTER TABLE jobs DROP COLUMN recorder;
             DROP TABLE job_packages;
             DROP TABLE packages;
             DROP TABLE runtimes;
             DROP TABLE blobs;
             ALTER TABLE jobs DROP COLUMN git_remote;
             ALTER TABLE jobs DROP COLUMN git_diff;
             ALTER TABLE jobs DROP COLUMN runtime_id;
             DROP TABLE step_files;
             DROP TABLE steps;
             DROP INDEX jobs_uid;
             DROP INDEX jobs_group;
             ALTER TABLE jobs DROP COLUMN uid;
             ALTER TABLE jobs DROP COLUMN run_group;
             ALTER TABLE jobs DROP COLUMN rank;
             ALTER TABLE jobs DROP COLUMN world_size;
             ALTER TABLE jobs DROP COLUMN local_rank;
             ALTER TABLE jobs DROP COLUMN node_rank;
             DROP TABLE pushed;
             DROP TABLE fetched;
             DROP INDEX jobs_started;
             DROP TABLE labels;
             PRAGMA user_version = 5;",
        )
        .unwrap();
    }
    let after = stdout(&p.roar(["dag"]));
    assert_eq!(after, before);
    let v = json(&p, &["db", "--json"]);
    assert_eq!(v["schema_version"], roar_store::SCHEMA_VERSION);
    assert_eq!(v["jobs"], 2);
    assert_eq!(
        job_ids(&json(&p, &["lineage", "final.txt", "--json"])),
        [1, 2]
    );
    // Every job recorded before the team store existed got a global identity of its own.
    let uids: std::collections::BTreeSet<String> = json(&p, &["log", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["uid"].as_str().expect("a uid").to_owned())
        .collect();
    assert_eq!(uids.len(), 2);
    assert!(uids.iter().all(|u| u.len() == 32));
}

#[test]
fn an_s3_copy_is_a_new_version_whose_lineage_goes_through_the_copy() {
    if !common::require_python_modules(&["boto3"]) {
        return;
    }
    let p = Project::new();
    p.write("data.csv", b"a,b\n1,2\n");
    let s3 = |name: &str, code: &str| {
        let script = format!("import boto3\ns3 = boto3.client('s3')\n{code}\n");
        p.write(&format!("{name}.py"), script.as_bytes());
        let out = p.roar([
            "run",
            "--s3",
            "--name",
            name,
            "--",
            "python3",
            &format!("{name}.py"),
        ]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
    };
    s3(
        "upload",
        "s3.create_bucket(Bucket='lineage-b')\ns3.upload_file('data.csv', 'lineage-b', 'raw/data.csv')",
    );
    s3(
        "stage",
        "s3.copy_object(Bucket='lineage-b', Key='staged/data.csv', CopySource={'Bucket': 'lineage-b', 'Key': 'raw/data.csv'})",
    );
    s3(
        "train",
        "open('model.txt', 'wb').write(s3.get_object(Bucket='lineage-b', Key='staged/data.csv')['Body'].read().upper())",
    );
    let dag = json(&p, &["dag", "--json"]);
    assert_eq!(
        inputs_of(&p, &dag, 3)
            .into_iter()
            .filter(|i| i.0.starts_with("s3://"))
            .collect::<Vec<_>>(),
        [("s3://lineage-b/staged/data.csv".into(), Some(2), None)],
        "{dag}"
    );
    let stage = &dag["steps"][1];
    assert_eq!(
        stage["outputs"][0]["path"], "s3://lineage-b/staged/data.csv",
        "{dag}"
    );
    assert_eq!(
        stage["outputs"][0]["copy_of"], "s3://lineage-b/raw/data.csv",
        "{dag}"
    );
    assert_eq!(
        job_ids(&json(&p, &["lineage", "model.txt", "--json"])),
        [1, 2, 3]
    );
    let out = p.roar(["status", "--exit-code"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

#[test]
fn status_names_active_mounts_and_judges_their_jobs_once_recorded() {
    if !common::mount::require_fuse() {
        return;
    }
    let mut m =
        common::mount::Mounted::new(|d| std::fs::write(d.join("raw.txt"), b"2\n1\n").unwrap());
    assert!(m.run(&["sh", "-c", "sort raw.txt > sorted.txt"]).success());
    let v = json(&m.p, &["status", "--json"]);
    let mounts = v["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 1, "{v}");
    assert_eq!(mounts[0]["state"], "active", "{v}");
    let text = stdout(&m.p.roar(["status"]));
    assert!(text.contains("mount data  (pid"), "{text}");
    m.unmount();
    let out = m.p.roar(["status", "--exit-code"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    std::fs::write(m.data.join("raw.txt"), b"3\n").unwrap();
    let v = json(&m.p, &["status", "--json"]);
    assert_eq!(
        v["stale"][0]["because"]["path"],
        m.data.join("raw.txt").to_str().unwrap(),
        "{v}"
    );
    assert!(v["mounts"].as_array().unwrap().is_empty(), "{v}");
}
