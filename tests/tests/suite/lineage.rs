//! Lineage answers on real recorded pipelines: dag (text, golden), lineage, inputs, status,
//! reproduce (script and --run).

use crate::common;

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
    // Jobs 1 and 2 are one step each; job 3 (`wc ... > report.txt && cat ... >> report.txt`) is
    // its shell and two steps.
    assert_eq!(dot.matches("shape=box").count(), 5, "{dot}");
}

#[test]
fn dag_svg_renders_with_graphviz() {
    let p = pipeline();
    if !common::require_tool("dot") {
        return;
    }
    let svg = p.path().join("graph.svg");
    let out = p.roar(["dag", "--svg", svg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg"), "{text}");
    assert_eq!(
        text.matches("class=\"node\"").count(),
        5 + 6,
        "2 jobs and 3 steps; 6 file versions (report.txt twice: wc's, then with cat's append): {text}"
    );
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
    let nodes: Vec<(i64, Option<i64>)> = json["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["job_id"].as_i64().unwrap(), s["step"].as_i64()))
        .collect();
    // Job 3's report.txt is cat's append to what wc wrote: both steps.
    assert_eq!(nodes, [(1, None), (2, None), (3, Some(2)), (3, Some(3))]);
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
    let out = p.roar(["status", "--exit-code"]);
    assert!(
        stdout(&out).contains("everything matches"),
        "{}",
        stdout(&out)
    );
    assert_eq!(out.status.code(), Some(0));
    p.write("conf.txt", b"forward\n");
    std::fs::remove_file(p.path().join("sorted.txt")).unwrap();
    p.write("new.txt", b"n");
    let out = p.roar(["status", "--exit-code"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = stdout(&out);
    assert!(out.contains("modified: conf.txt  (read by job 2)"), "{out}");
    assert!(
        out.contains("deleted:  sorted.txt  (made by job 1)"),
        "{out}"
    );
    assert!(
        out.contains("job 2  [tag] sh -c 'cat conf.txt sorted.txt > tagged.txt'  (1 file): conf.txt modified (job 2)"),
        "{out}"
    );
    // report read sorted.txt (gone) and tag's output (stale): the direct cause is named.
    assert!(
        out.contains("(1 file): sorted.txt deleted (job 3)"),
        "{out}"
    );
    // Put sorted.txt back: report is still stale, through tag.
    let out = p.roar(["run", "--", "sh", "-c", "sort raw.txt > sorted.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = stdout(&p.roar(["status"]));
    assert!(out.contains("conf.txt modified (job 2 → job 3)"), "{out}");
    assert!(out.contains("untracked (1)\n  new.txt"), "{out}");
    // Without --exit-code, status always exits 0.
    assert_eq!(p.roar(["status"]).status.code(), Some(0));
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
    let out = p.roar(["reproduce", "--run", "--in-place", "tagged.txt"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("reproduced tagged.txt"),
        "{}",
        stdout(&out)
    );
    // A changed root input is refused before anything runs.
    p.write("raw.txt", b"9\n");
    let out = p.roar(["reproduce", "--run", "--in-place", "tagged.txt"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("root input raw.txt changed"),
        "{}",
        stderr(&out)
    );
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

#[test]
fn diff_names_what_changed_between_two_runs() {
    let p = pipeline();
    let old_hash = json(&p.roar(["show", "tagged.txt", "--json"]))["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["role"] == "output")
        .unwrap()["hash"]["blake3"]
        .as_str()
        .unwrap()
        .to_owned();
    // New raw data, and the tag step re-run with an extra variable.
    p.write("raw.txt", b"3\n1\n2\n4\n");
    assert!(p
        .roar([
            "run",
            "--name",
            "sort",
            "--",
            "sh",
            "-c",
            "sort raw.txt > sorted.txt"
        ])
        .status
        .success());
    let out = p
        .cmd([
            "run",
            "--name",
            "tag",
            "--",
            "sh",
            "-c",
            "cat conf.txt sorted.txt > tagged.txt",
        ])
        .env("ROAR_IT_EXTRA", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    // Artifact against artifact: the direct and the root inputs that changed.
    let d = json(&p.roar(["diff", &old_hash[..12], "tagged.txt", "--json"]));
    assert_eq!(
        (d["a_job"].as_i64(), d["b_job"].as_i64()),
        (Some(2), Some(5))
    );
    let changed = |key: &str| -> Vec<(String, String)> {
        d[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let path = c["path"].as_str().unwrap();
                let name = path.rsplit('/').next().unwrap().to_owned();
                (name, c["change"].as_str().unwrap().to_owned())
            })
            .collect()
    };
    assert_eq!(
        changed("inputs"),
        [("sorted.txt".into(), "modified".into())]
    );
    assert_eq!(
        changed("root_inputs"),
        [("raw.txt".into(), "modified".into())]
    );
    assert_eq!(
        changed("outputs"),
        [("tagged.txt".into(), "modified".into())]
    );
    assert_eq!(d["same_inputs"], 1, "conf.txt is unchanged");
    assert!(d["argv"].is_null(), "same command: {}", d["argv"]);
    let env: Vec<&str> = d["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(env, ["ROAR_IT_EXTRA"]);

    // Jobs by id, in text: the different commands show.
    let text = stdout(&p.roar(["diff", "1", "2"]));
    assert!(text.contains("argv"), "{text}");
    assert!(text.contains("~ ") || text.contains("+ "), "{text}");
    let same = stdout(&p.roar(["diff", "2", "2"]));
    assert!(same.contains("same job"), "{same}");

    // A root input has no provenance to compare: one line, not-found class of error.
    let out = p.roar(["diff", "raw.txt", "tagged.txt"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("is a root input"), "{}", stderr(&out));
    let out = p.roar(["diff", "99", "2"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
}

#[test]
fn export_prov_json_is_valid_and_complete() {
    if !common::require_python_modules(&["jsonschema", "prov"]) {
        return;
    }
    let p = pipeline();
    let out = p.roar(["export", "--all", "--format", "prov-json"]);
    let doc = json(&out);
    common::validate_export("prov-json", &out.stdout);
    // Jobs 1 and 2, and job 3's shell and its two steps.
    assert_eq!(doc["activity"].as_object().unwrap().len(), 5);
    // report.txt (cat's append) derives from wc's report.txt and sorted.txt; its entity is named
    // by its hash.
    let report = json(&p.roar(["show", "report.txt", "--json"]))["history"][0]["hash"]["blake3"]
        .as_str()
        .unwrap()
        .to_owned();
    let from: Vec<&str> = doc["wasDerivedFrom"]
        .as_object()
        .unwrap()
        .values()
        .filter(|d| d["prov:generatedEntity"] == format!("b3:{report}"))
        .map(|d| d["prov:usedEntity"].as_str().unwrap())
        .collect();
    assert_eq!(from.len(), 2, "{from:?}");
    // Only the lineage of sorted.txt: one job.
    let one = json(&p.roar(["export", "sorted.txt"]));
    assert_eq!(one["activity"].as_object().unwrap().len(), 1);
    let out = p.roar(["export"]);
    assert_eq!(out.status.code(), Some(2), "a target or --all is required");
}

#[test]
fn export_openlineage_events_are_accepted_by_the_openlineage_client() {
    if !common::require_python_modules(&["openlineage.client"]) {
        return;
    }
    let p = pipeline();
    // A failing job gives a FAIL event.
    let out = p.roar(["run", "--", "sh", "-c", "cat raw.txt > copy.txt; exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    let out = p.roar(["export", "--all", "--format", "openlineage"]);
    assert!(out.status.success(), "{}", stderr(&out));
    common::validate_export("openlineage", &out.stdout);
    let events: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = events
        .iter()
        .map(|e| e["eventType"].as_str().unwrap())
        .collect();
    // Jobs 1 and 2; job 3's shell and its two steps, each a run; the failing job (its shell only
    // wraps cat: one step).
    assert_eq!(
        types,
        [
            "START", "COMPLETE", "START", "COMPLETE", "START", "COMPLETE", "START", "COMPLETE",
            "START", "COMPLETE", "START", "FAIL"
        ]
    );
    // Job 3's steps are child runs of job 3's run, which is its root step's.
    let job3 = events[5]["run"]["runId"].clone();
    for e in &events[6..10] {
        assert_eq!(e["run"]["facets"]["parent"]["run"]["runId"], job3);
    }
    // The sort step's output is the tag step's input, as the same dataset and version.
    let out_ds = &events[1]["outputs"][0];
    let in_ds = events[3]["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == out_ds["name"])
        .expect("sorted.txt is an input of the tag step");
    assert_eq!(in_ds["namespace"], out_ds["namespace"]);
    assert_eq!(
        in_ds["facets"]["version"]["datasetVersion"],
        out_ds["facets"]["version"]["datasetVersion"]
    );
    // Exporting twice gives the same run ids.
    let again = p.roar(["export", "--all", "--format", "openlineage"]);
    assert_eq!(again.stdout, out.stdout);
}

/// A job without `--name` goes by its script's name (`python3 train.py` is `train`): `show`,
/// `diff` and `NAME~N` resolve it; a name nothing goes by is one line that says how jobs are named.
#[test]
fn jobs_go_by_their_scripts_name_and_name_n_steps_back() {
    let p = Project::new();
    p.write("a.txt", b"x\n");
    p.write(
        "train.py",
        b"import sys\nopen('model.txt', 'w').write(sys.argv[-1])\n",
    );
    for lr in ["0.1", "0.01", "0.001"] {
        let o = p.roar(["run", "--", "python3", "train.py", "--lr", lr]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = p.roar([
        "run", "--name", "other", "--", "python3", "train.py", "--lr", "9",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let id = |what: &str| {
        let o = p.roar(["--json", "show", what]);
        assert!(o.status.success(), "show {what}: {}", stderr(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["id"]
            .as_i64()
            .unwrap()
    };
    assert_eq!(id("train"), 3, "the latest job named by its script");
    assert_eq!(id("train~1"), 2);
    assert_eq!(id("train~2"), 1);
    assert_eq!(id("other"), 4, "--name wins");
    let diff = stdout(&p.roar(["diff", "train~1", "train"]));
    assert!(diff.contains("lr: 0.01 -> 0.001"), "{diff}");
    let o = p.roar(["show", "trian"]);
    assert_eq!(o.status.code(), Some(4));
    let err = stderr(&o);
    assert!(
        err.contains("no job named trian") && err.lines().count() == 1,
        "{err}"
    );
}

/// A root input (read, never produced) that a job copied elsewhere: its lineage has no maker —
/// the job that read it came after its bytes — while the copy's lineage names that job.
#[test]
fn a_root_input_is_not_made_by_the_job_that_copied_it() {
    let p = Project::new();
    std::fs::create_dir_all(p.path().join("data")).unwrap();
    p.write("data/remote.csv", b"a,b\n1,2\n");
    let o = p.roar(["run", "--", "cp", "data/remote.csv", "data/local.csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let steps = |path: &str| {
        let o = p.roar(["--json", "lineage", path]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["steps"].as_array().unwrap().len()
    };
    assert_eq!(steps("data/remote.csv"), 0, "a root input has no maker");
    assert_eq!(steps("data/local.csv"), 1, "the copy was made by cp");
}

/// A job two of whose inputs changed is stale for both reasons, and says both.
#[test]
fn status_gives_every_reason_a_job_is_stale() {
    let p = Project::new();
    p.write("a.txt", b"1\n");
    p.write("b.txt", b"2\n");
    let o = p.roar(["run", "--", "sh", "-c", "cat a.txt b.txt > out.txt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    p.write("a.txt", b"11\n");
    p.write("b.txt", b"22\n");
    let text = stdout(&p.roar(["status"]));
    assert!(
        text.contains("a.txt modified (job 1), b.txt modified (job 1)"),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&p.roar(["--json", "status"]).stdout).unwrap();
    let causes: Vec<&str> = json["stale"][0]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap().rsplit('/').next().unwrap())
        .collect();
    assert_eq!(causes, ["a.txt", "b.txt"]);
}

/// The param loop: edit params.yaml and argv, retrain; `roar diff` leads with the values that
/// changed in the file and in argv, and `roar runs` has each run's parameters and metrics —
/// the first run's read from the versions kept, though both files were overwritten since.
#[test]
fn the_param_loop_shows_parameter_and_metric_values() {
    let p = Project::new();
    p.write("params.yaml", b"model:\n  max_depth: 8\nseed: 1\n");
    p.write(
        "train.py",
        b"import json\np = open('params.yaml').read()\nd = 8 if 'max_depth: 8' in p else 5\njson.dump({'acc': d / 10}, open('metrics.json', 'w'))\n",
    );
    let o = p.roar(["run", "--", "python3", "train.py", "--lr", "0.1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    p.write("params.yaml", b"model:\n  max_depth: 5\nseed: 1\n");
    let o = p.roar(["run", "--", "python3", "train.py", "--lr", "0.01"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let diff = stdout(&p.roar(["diff", "train~1", "train"]));
    let first = diff.lines().nth(2).unwrap_or_default();
    assert!(
        first.starts_with("parameters") && first.contains("params.yaml:model.max_depth: 8 -> 5"),
        "{diff}"
    );
    assert!(diff.contains("lr: 0.1 -> 0.01"), "{diff}");
    let o = p.roar(["--json", "runs", "train", "--sort", "acc"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let runs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let row = |i: usize, k: &str, v: &str| runs[i][k][v].as_str().map(str::to_owned);
    assert_eq!(runs.as_array().unwrap().len(), 2);
    assert_eq!(
        row(0, "params", "params.yaml:model.max_depth").as_deref(),
        Some("8")
    );
    assert_eq!(
        row(0, "metrics", "metrics.json:acc").as_deref(),
        Some("0.8")
    );
    assert_eq!(row(0, "params", "lr").as_deref(), Some("0.1"));
    assert_eq!(
        row(1, "metrics", "metrics.json:acc").as_deref(),
        Some("0.5")
    );
}

/// `roar run @N --set`: job N again with one value changed in its argv and one in the parameter
/// file it read — the file itself never written (the re-run reads a changed copy at its path);
/// the new job is N's name, labelled as N's re-run, and `roar diff` and `roar runs` show exactly
/// the values set. A key no source has, or a flag, is refused before anything runs.
#[test]
fn a_job_runs_again_with_parameters_set_and_the_users_file_untouched() {
    let p = Project::new();
    let params = b"# tuned by hand\nmodel:\n  max_depth: 8\n  name: rf\nseed: 1\n";
    p.write("params.yaml", params);
    p.write(
        "train.py",
        b"import json, sys\nlr = float(sys.argv[sys.argv.index('--lr') + 1])\nd = [l for l in open('params.yaml') if 'max_depth' in l][0].split(':')[1].strip()\njson.dump({'acc': lr + int(d)}, open('metrics.json', 'w'))\n",
    );
    let o = p.roar([
        "run", "--name", "train", "--", "python3", "train.py", "--lr", "0.1", "--amp",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = p.roar([
        "run",
        "@train",
        "--set",
        "lr=0.5",
        "--set=model.max_depth=3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(p.path().join("params.yaml")).unwrap(),
        params,
        "the user's file was written"
    );
    let metrics = std::fs::read_to_string(p.path().join("metrics.json")).unwrap();
    assert!(
        metrics.contains("3.5"),
        "the re-run did not see both values: {metrics}"
    );
    let show: serde_json::Value =
        serde_json::from_slice(&p.roar(["--json", "show", "2"]).stdout).unwrap();
    assert_eq!(show["name"], "train");
    assert_eq!(show["labels"]["roar.rerun_of"], "1");
    let diff = stdout(&p.roar(["diff", "1", "2"]));
    assert!(
        diff.contains("params.yaml:model.max_depth: 8 -> 3"),
        "{diff}"
    );
    assert!(diff.contains("lr: 0.1 -> 0.5"), "{diff}");
    let o = p.roar(["--json", "runs", "train", "--label", "roar.rerun_of=1"]);
    let runs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 1, "{runs}");
    assert_eq!(runs[0]["params"]["params.yaml:model.max_depth"], "3");
    assert_eq!(runs[0]["metrics"]["metrics.json:acc"], "3.5");
    // Refused with one line, nothing run.
    for (set, says) in [
        ("batch=4", "has no parameter batch"),
        ("amp=false", "flag"),
        ("params.yaml:model.depth=4", "has no parameter"),
    ] {
        let o = p.roar(["run", "@1", "--set", set]);
        assert!(!o.status.success(), "{set} was taken");
        let err = stderr(&o);
        assert!(
            err.contains(says) && err.trim().lines().count() == 1,
            "{set}: {err}"
        );
    }
    let log: serde_json::Value = serde_json::from_slice(&p.roar(["--json", "log"]).stdout).unwrap();
    assert_eq!(
        log.as_array().unwrap().len(),
        2,
        "a refused re-run left a job"
    );
}

/// Labels: set by `roar run --label` and `roar label`, removed with --rm, shown by `roar show`,
/// filtered by `roar runs --label`; a malformed one is refused with one line.
#[test]
fn labels_are_set_shown_filtered_and_removed() {
    let p = Project::new();
    let o = p.roar([
        "run",
        "--label",
        "stage=prep",
        "--",
        "sh",
        "-c",
        "echo 1 > a.txt",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = p.roar(["run", "--", "sh", "-c", "echo 2 > b.txt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = p.roar(["label", "2", "baseline=true", "ticket=ML-42"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&p.roar(["show", "2"])).contains("labels   baseline=true ticket=ML-42"));
    let count = |args: &[&str]| -> usize {
        let mut a = vec!["--json", "runs"];
        a.extend(args);
        let v: serde_json::Value = serde_json::from_slice(&p.roar(&a).stdout).unwrap();
        v.as_array().unwrap().len()
    };
    assert_eq!(count(&["--label", "baseline"]), 1);
    assert_eq!(count(&["--label", "stage=prep"]), 1);
    assert_eq!(count(&["--label", "stage=train"]), 0);
    // A secret in a label is redacted like one in the environment.
    let token = format!(
        "ghp_{}",
        &blake3::hash(b"a label's token").to_hex().as_str()[..36]
    );
    let o = p.roar(["label", "2", &format!("api_token={token}")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&p.roar(["show", "2"])).contains("api_token=<redacted>"));
    let db = std::fs::read(p.path().join(".roar/roar.db")).unwrap();
    let wal = std::fs::read(p.path().join(".roar/roar.db-wal")).unwrap_or_default();
    for bytes in [&db, &wal] {
        assert!(
            !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
            "the token reached the store"
        );
    }
    let o = p.roar(["label", "2", "--rm", "baseline"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(count(&["--label", "baseline"]), 0);
    for bad in [
        &["label", "2", "no-equals"][..],
        &["label", "2", "bad key=1"],
        &["label", "9", "a=1"],
        &["run", "--label", "x", "--", "true"],
    ] {
        let o = p.roar(bad);
        assert!(!o.status.success(), "{bad:?} was taken");
        assert_eq!(
            stderr(&o).trim().lines().count(),
            1,
            "{bad:?}: {}",
            stderr(&o)
        );
    }
}

/// `roar diff` of two artifacts each made by one step of a pipeline job compares those steps —
/// their commands and files — not the whole jobs with everything else they made.
#[test]
fn diff_of_two_artifacts_compares_the_steps_that_made_them() {
    let p = Project::new();
    let raw: String = (1..=20).map(|i| format!("{i}\n")).collect();
    p.write("raw.txt", raw.as_bytes());
    p.write(
        "pipeline.sh",
        b"sort -n raw.txt > clean.txt\nfor i in 1 2 3 4 5 6; do head -n $i clean.txt > part$i.txt; done\ntail -n \"$1\" clean.txt > model.txt\n",
    );
    for n in ["3", "5"] {
        let o = p.roar(["run", "--", "bash", "pipeline.sh", n]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = p.roar(["--json", "diff", "model.txt@1", "model.txt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let d: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let argv = |side: &str| d["argv"][side].as_array().map(|a| a.len());
    assert_eq!(argv("a"), Some(4), "A is not the tail step: {d}");
    assert_eq!(d["argv"]["b"][2], "5");
    let outputs: Vec<&str> = d["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().rsplit('/').next().unwrap())
        .collect();
    assert_eq!(outputs, ["model.txt"], "outputs beyond the step's: {d}");
    let text = stdout(&p.roar(["diff", "model.txt@1", "model.txt"]));
    assert!(
        text.contains("step") && text.contains("bash pipeline.sh 3"),
        "{text}"
    );
}

/// Every edge of `roar dag --dot` joins two declared nodes (Graphviz draws an undeclared end as a
/// node named by its internal key, `j6.1`), for the latest runs and for all runs of pipelines with
/// steps, copies made outside roar's view, collapsed directories and re-runs.
#[test]
fn every_dot_edge_joins_declared_nodes() {
    let p = Project::new();
    p.write("raw.txt", b"3\n1\n2\n");
    p.write(
        "pipeline.sh",
        b"sort raw.txt > clean.txt\nmkdir -p parts\nfor i in 1 2 3 4 5 6 7; do cp clean.txt parts/p$i.txt; done\nwc -l parts/*.txt > count.txt\n",
    );
    for _ in 0..2 {
        let o = p.roar(["run", "--", "bash", "pipeline.sh"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    // A copy no job made: its reader's input is `copy_of` the version job 2 wrote.
    std::fs::copy(p.path().join("count.txt"), p.path().join("copy.txt")).unwrap();
    let o = p.roar([
        "run",
        "--",
        "sh",
        "-c",
        "cat copy.txt parts/p1.txt > final.txt",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for args in [
        &["dag", "--dot"][..],
        &["dag", "--dot", "--all-runs"],
        &["dag", "--dot", "--expand"],
        &["dag", "final.txt", "--dot"],
    ] {
        let dot = stdout(&p.roar(args));
        let mut declared = std::collections::HashSet::new();
        let mut ends = Vec::new();
        for line in dot.lines().map(str::trim) {
            let quoted: Vec<&str> = line.split('"').collect();
            if line.contains(" -> ") {
                ends.push(quoted[1].to_owned());
                ends.push(quoted[3].to_owned());
            } else if line.starts_with('"') {
                declared.insert(quoted[1].to_owned());
            }
        }
        assert!(!ends.is_empty(), "{args:?}: {dot}");
        for e in &ends {
            assert!(
                declared.contains(e),
                "{args:?}: edge end {e} is not a declared node:\n{dot}"
            );
        }
        if args.len() == 2 {
            assert!(dot.contains("copy"), "the copy edge is missing: {dot}");
        }
    }
}
