//! Lineage answers on real recorded pipelines: dag (text, golden), lineage, inputs, status,
//! reproduce (script and --run).

mod common;

use common::{snapshot, stderr, stdout, Project};

/// A three-step pipeline run for real under `roar run`.
fn pipeline() -> Project {
    let p = Project::new();
    p.write("raw.txt", b"3\n1\n2\n");
    p.write("conf.txt", b"reverse\n");
    for (name, cmd) in [
        ("sort", "sort raw.txt > sorted.txt"),
        ("tag", "cat conf.txt sorted.txt > tagged.txt"),
        (
            "report",
            "wc -l tagged.txt > report.txt && cat sorted.txt >> report.txt",
        ),
    ] {
        let out = p.roar(["run", "--name", name, "--", "sh", "-c", cmd]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
    }
    p
}

#[test]
fn dag_text_golden() {
    let p = pipeline();
    let out = p.roar(["dag"]);
    assert!(out.status.success(), "{}", stderr(&out));
    snapshot("dag.txt", &stdout(&out));
    let dot = stdout(&p.roar(["dag", "--dot"]));
    assert!(dot.starts_with("digraph roar {"));
    assert_eq!(dot.matches("shape=box").count(), 3, "{dot}");
}

#[test]
fn lineage_and_inputs_walk_to_the_root_inputs() {
    let p = pipeline();
    let out = p.roar(["inputs", "report.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let roots: Vec<String> = stdout(&out)
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
        .collect();
    assert_eq!(roots, ["conf.txt", "raw.txt"]);
    let json: serde_json::Value =
        serde_json::from_slice(&p.roar(["lineage", "report.txt", "--json"]).stdout).unwrap();
    let jobs: Vec<i64> = json["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["job_id"].as_i64().unwrap())
        .collect();
    assert_eq!(jobs, [1, 2, 3]);
    // sorted.txt needs only the first job.
    let json: serde_json::Value =
        serde_json::from_slice(&p.roar(["lineage", "sorted.txt", "--json"]).stdout).unwrap();
    assert_eq!(json["steps"].as_array().unwrap().len(), 1);
    // The same answer by hash prefix.
    let hash = json["target"]["blake3"].as_str().unwrap();
    let by_hash: serde_json::Value =
        serde_json::from_slice(&p.roar(["lineage", &hash[..10], "--json"]).stdout).unwrap();
    assert_eq!(by_hash["steps"], json["steps"]);
    // A root input has no lineage.
    assert!(stdout(&p.roar(["lineage", "raw.txt"])).contains("it is a root input"));
    let out = p.roar(["lineage", "never.txt"]);
    assert_eq!(out.status.code(), Some(4));
}

#[test]
fn status_reports_modified_stale_deleted_and_untracked() {
    let p = pipeline();
    assert!(
        stdout(&p.roar(["status"])).contains("everything matches"),
        "{}",
        stdout(&p.roar(["status"]))
    );
    p.write("conf.txt", b"forward\n");
    std::fs::remove_file(p.path().join("sorted.txt")).unwrap();
    p.write("new.txt", b"n");
    let out = stdout(&p.roar(["status"]));
    assert!(out.contains("modified:  conf.txt"), "{out}");
    assert!(out.contains("deleted:   sorted.txt"), "{out}");
    assert!(
        out.contains("stale:     tagged.txt  (input conf.txt changed since job 2)"),
        "{out}"
    );
    assert!(out.contains("untracked: new.txt"), "{out}");
}

#[test]
fn reproduce_prints_the_steps_and_run_rebuilds_and_verifies() {
    let p = pipeline();
    let script = stdout(&p.roar(["reproduce", "tagged.txt"]));
    assert!(
        script.contains("roar run -- sh -c 'sort raw.txt > sorted.txt'  # job 1"),
        "{script}"
    );
    assert!(script.contains("# job 2"), "{script}");
    assert!(!script.contains("# job 3"), "{script}");
    std::fs::remove_file(p.path().join("tagged.txt")).unwrap();
    std::fs::remove_file(p.path().join("sorted.txt")).unwrap();
    let out = p.roar(["reproduce", "--run", "tagged.txt"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("reproduced tagged.txt"),
        "{}",
        stdout(&out)
    );
    // A changed root input is refused before anything runs.
    p.write("raw.txt", b"9\n");
    let out = p.roar(["reproduce", "--run", "tagged.txt"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("root input raw.txt changed"),
        "{}",
        stderr(&out)
    );
}
