//! Steps inside one run (SEMANTICS.md "Steps"): a pipeline script, a Makefile under `make -j2`
//! and a Python driver are each one job whose steps are the commands they ran, with the files
//! between them linked step to step; the same steps and edges on every backend; lineage and
//! `roar reproduce` at step level.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;

use common::{stderr, stdout, Project};
use serde_json::Value;

/// `roar run --tracer BACKEND -- ARGV`, and the job it recorded.
fn run(p: &Project, backend: &str, argv: &[&str]) -> Value {
    p.run_under(backend, argv);
    p.last_job()
}

fn name(path: &str) -> String {
    Path::new(path)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The program a step ran: the last word of its exe, or of its argv[0].
fn program(step: &Value) -> String {
    step["exe"]
        .as_str()
        .or_else(|| step["argv"][0].as_str())
        .map(name)
        .unwrap_or_default()
}

/// A step's files as `in NAME <- PROGRAM`, `in NAME` (from before the job) and `out NAME`.
fn edges(job: &Value) -> BTreeSet<String> {
    let steps = job["steps"].as_array().expect("the job has steps");
    let by_seq = |seq: u64| {
        steps
            .iter()
            .find(|s| s["seq"] == seq)
            .map(program)
            .unwrap_or_else(|| format!("step {seq}?"))
    };
    let mut out = BTreeSet::new();
    for s in steps {
        let me = program(s);
        for i in s["inputs"].as_array().unwrap() {
            let from = match i["from_step"].as_u64() {
                Some(w) => format!(" <- {}", by_seq(w)),
                None => String::new(),
            };
            out.insert(format!(
                "{me}: in {}{from}",
                name(i["path"].as_str().unwrap())
            ));
        }
        for o in s["outputs"].as_array().unwrap() {
            out.insert(format!("{me}: out {}", name(o["path"].as_str().unwrap())));
        }
    }
    out
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

const PIPELINE: &str = "#!/bin/sh
set -e
tr a-z A-Z < raw.txt > clean.txt
sort clean.txt > model.txt
wc -l model.txt > metrics.txt
";

#[test]
fn a_pipeline_script_is_three_steps_with_the_same_edges_on_every_backend() {
    let expected = set(&[
        "tr: in raw.txt",
        "tr: out clean.txt",
        "sort: in clean.txt <- tr",
        "sort: out model.txt",
        "wc: in model.txt <- sort",
        "wc: out metrics.txt",
    ]);
    // dash opens a command's redirections itself and vforks it; bash opens them in the child.
    let shells: Vec<&str> = ["sh", "bash"]
        .into_iter()
        .filter(|s| common::require_tool(s))
        .collect();
    for (backend, shell) in common::backends()
        .into_iter()
        .flat_map(|b| shells.iter().map(move |s| (b, *s)))
    {
        let backend = format!("{backend} ({shell})");
        let p = Project::new();
        p.write("raw.txt", b"b\na\nc\n");
        p.write("pipeline.sh", PIPELINE.as_bytes());
        let tracer = backend.split(' ').next().unwrap();
        let job = run(&p, tracer, &[shell, "pipeline.sh"]);
        let steps = job["steps"].as_array().expect("steps");
        let tree = step_tree(steps);
        assert_eq!(
            tree,
            [(1, None), (2, Some(1)), (3, Some(1)), (4, Some(1))],
            "{backend}: the script and its three commands"
        );
        let mut want = expected.clone();
        // `sh` is whichever shell the system has (dash here, bash elsewhere).
        want.insert(format!("{}: in pipeline.sh", program(&steps[0])));
        assert_eq!(edges(&job), want, "{backend}");
        // The job-level record is unchanged: the intermediates are the job's outputs.
        assert_eq!(
            p.files(&job, "output"),
            ["clean.txt", "metrics.txt", "model.txt"],
            "{backend}"
        );
        // The file between two steps has the content the job left there.
        let sort = &steps[2];
        let clean_in = &sort["inputs"][0];
        assert_eq!(
            clean_in["hash"]["blake3"],
            blake3::hash(b"B\nA\nC\n").to_hex().as_str(),
            "{backend}"
        );

        // Lineage goes step to step: wc <- sort <- tr, not the script.
        let o = p.roar(["lineage", "metrics.txt", "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let l: Value = serde_json::from_slice(&o.stdout).unwrap();
        let nodes: Vec<(u64, String)> = l["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["step"].as_u64().unwrap(), program_of_argv(s)))
            .collect();
        assert_eq!(
            nodes,
            [(2, "tr".into()), (3, "sort".into()), (4, "wc".into())],
            "{backend}"
        );
        let roots: Vec<String> = l["roots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| name(r["path"].as_str().unwrap()))
            .collect();
        assert_eq!(roots, ["raw.txt"], "{backend}");
    }
}

fn program_of_argv(step: &Value) -> String {
    name(step["argv"][0].as_str().unwrap())
}

const MAKEFILE: &str = "all: final.txt
a.txt: src1.txt
\ttr a-z A-Z < src1.txt > a.txt
b.txt: src2.txt
\tsort src2.txt > b.txt
joined.txt: a.txt b.txt
\tcat a.txt b.txt > joined.txt
summary.txt: joined.txt
\twc -l joined.txt > summary.txt
final.txt: summary.txt
\ttr 0-9 a-j < summary.txt > final.txt
";

#[test]
fn a_makefile_under_make_j2_is_a_step_per_recipe_and_reproduce_reruns_one() {
    if !common::require_tool("make") {
        return;
    }
    for backend in common::backends() {
        let p = Project::new();
        p.write("Makefile", MAKEFILE.as_bytes());
        p.write("src1.txt", b"one\n");
        p.write("src2.txt", b"zwei\ndrei\n");
        let job = run(&p, backend, &["make", "-j2"]);
        make_steps_are_the_recipes(&job, backend);
        if backend == "preload" {
            lineage_and_reproduce_of_the_makefile(&p, &job);
        }
    }
}

/// What each recipe of [`MAKEFILE`] reads and writes, with the recipe each input came from.
fn make_edges() -> BTreeSet<String> {
    set(&[
        "tr: in src1.txt",
        "tr: out a.txt",
        "sort: in src2.txt",
        "sort: out b.txt",
        "cat: in a.txt <- tr",
        "cat: in b.txt <- sort",
        "cat: out joined.txt",
        "wc: in joined.txt <- cat",
        "wc: out summary.txt",
        "tr: in summary.txt <- wc",
        "tr: out final.txt",
    ])
}

fn make_steps_are_the_recipes(job: &Value, backend: &str) {
    let steps = job["steps"].as_array().expect("steps");
    // make, and one step per recipe under it.
    assert_eq!(program(&steps[0]), "make", "{backend}");
    assert_eq!(steps.len(), 6, "{backend}: {:#}", job["steps"]);
    assert!(steps[1..].iter().all(|s| s["parent"] == 1), "{backend}");
    let e = edges(job);
    for want in make_edges()
        .iter()
        .chain([&"make: in Makefile".to_string()])
    {
        assert!(e.contains(want), "{backend}: {want} missing from {e:#?}");
    }
}

/// The mount's steps are `want`, or coarser where the mount could not see a stream handed
/// over (SEMANTICS.md "Steps inside a job"): an input of a command may be its shell's (`shell`)
/// instead, from the same step, and nothing else may differ.
fn same_or_coarser(got: &BTreeSet<String>, want: &BTreeSet<String>, shell: &str, run: &str) {
    for w in want {
        if got.contains(w) {
            continue;
        }
        let (_, rest) = w.split_once(": ").unwrap();
        let as_shell = format!("{shell}: {rest}");
        assert!(
            rest.starts_with("in ") && got.contains(&as_shell),
            "{run}: {w} missing (nor as {as_shell}) from {got:#?}"
        );
    }
    for g in got {
        let (_, rest) = g.split_once(": ").unwrap();
        assert!(
            want.contains(g)
                || (g.starts_with(&format!("{shell}: in "))
                    && want.iter().any(|w| w.ends_with(&format!(": {rest}")))),
            "{run}: {g} is not one of {want:#?}"
        );
    }
}

fn lineage_and_reproduce_of_the_makefile(p: &Project, job: &Value) {
    // The final target's lineage is the five recipes, not make.
    let o = p.roar(["lineage", "final.txt", "--json"]);
    let l: Value = serde_json::from_slice(&o.stdout).unwrap();
    let nodes = l["steps"].as_array().unwrap();
    assert_eq!(nodes.len(), 5, "{l:#}");
    assert!(nodes.iter().all(|s| s["job_id"] == job["id"]));
    let mut roots: Vec<String> = l["roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| name(r["path"].as_str().unwrap()))
        .collect();
    roots.sort();
    assert_eq!(roots, ["src1.txt", "src2.txt"]);

    // Both exports carry the steps, and the standards' own implementations accept them.
    let o = p.roar(["export", "--format", "prov-json", "final.txt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    common::validate_export("prov-json", &o.stdout);
    let prov: Value = serde_json::from_slice(&o.stdout).unwrap();
    let job_id = job["id"].as_i64().unwrap();
    let steps_of_job = prov["activity"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with(&format!("roar:job-{job_id}-step-")))
        .count();
    assert_eq!(steps_of_job, 5, "{prov:#}");
    // joined.txt's recipe was informed by both independent recipes.
    let informed = prov["wasInformedBy"].as_object().unwrap();
    assert!(informed.len() >= 4, "{prov:#}");
    let o = p.roar(["export", "--format", "openlineage", "final.txt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    common::validate_export("openlineage", &o.stdout);
    let events: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 10, "a START and a COMPLETE per recipe");
    let parents: BTreeSet<String> = events
        .iter()
        .map(|e| {
            e["run"]["facets"]["parent"]["run"]["runId"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        parents.len(),
        1,
        "every recipe is a child run of the make job's run"
    );

    // Reproducing one intermediate re-runs only its recipe.
    let o = p.roar(["reproduce", "a.txt"]);
    let script = stdout(&o);
    let runs: Vec<&str> = script
        .lines()
        .filter(|l| l.starts_with("roar run"))
        .collect();
    assert_eq!(runs.len(), 1, "{script}");
    assert!(
        runs[0].contains("src1.txt") && !runs[0].contains("make"),
        "{script}"
    );
    let b_before = std::fs::metadata(p.path().join("b.txt"))
        .unwrap()
        .modified()
        .unwrap();
    std::fs::remove_file(p.path().join("a.txt")).unwrap();
    let o = p.roar(["reproduce", "--run", "--in-place", "a.txt"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("matches"), "{}", stdout(&o));
    assert_eq!(std::fs::read(p.path().join("a.txt")).unwrap(), b"ONE\n");
    let b_after = std::fs::metadata(p.path().join("b.txt"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(b_before, b_after, "only a.txt's recipe ran");
}

#[test]
fn status_is_judged_step_by_step() {
    if !common::require_tool("make") {
        return;
    }
    let p = Project::new();
    p.write("Makefile", MAKEFILE.as_bytes());
    p.write("src1.txt", b"one\n");
    p.write("src2.txt", b"zwei\ndrei\n");
    run(&p, "preload", &["make", "-j2"]);
    p.write("src1.txt", b"uno\n");
    let o = p.roar(["status", "--json"]);
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let stale: BTreeSet<String> = report["stale"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["outputs"].as_array().unwrap().clone())
        .map(|o| name(o.as_str().unwrap()))
        .collect();
    // b.txt comes from src2.txt alone: the job is stale, that recipe is not.
    assert_eq!(
        stale,
        set(&["a.txt", "joined.txt", "summary.txt", "final.txt"]),
        "{report:#}"
    );
    assert!(report["stale"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["step"].is_u64()));
}

const DRIVER: &str = r#"
import subprocess, sys
for stage in (["prep", "raw.txt", "clean.txt"], ["train", "clean.txt", "model.txt"],
              ["eval", "model.txt", "metrics.txt"]):
    subprocess.run([sys.executable, "stage.py", *stage], check=True)
"#;

const STAGE: &str = r#"
import multiprocessing, sys

def part(i):
    with open(f"part{i}.txt", "w") as f:
        f.write(open(sys.argv[2]).read()[i::2])

if __name__ == "__main__":
    what, src, dst = sys.argv[1:]
    if what == "train":
        # A pool of forked workers: the train step's, not steps of their own. Closed and
        # joined: leaving a `with` block terminates the workers with SIGTERM, which can kill
        # one in the middle of reporting an event and so mark the job incomplete (rightly;
        # preload.rs tests that), which is not what this test is about.
        pool = multiprocessing.get_context("fork").Pool(2)
        pool.map(part, [0, 1])
        pool.close()
        pool.join()
        data = open("part0.txt").read() + open("part1.txt").read()
    else:
        data = open(src).read().upper()
    open(dst, "w").write(data)
"#;

#[test]
fn a_python_driver_is_a_step_per_subprocess_and_a_pool_stays_in_its_step() {
    let p = Project::new();
    p.write("raw.txt", b"abcdef\n");
    p.write("driver.py", DRIVER.as_bytes());
    p.write("stage.py", STAGE.as_bytes());
    for backend in common::backends() {
        let job = run(&p, backend, &["python3", "driver.py"]);
        driver_stages_are_steps(&job, backend);
    }
}

/// The [`DRIVER`] job's steps: its three stages under it, the pool's files in the train step,
/// and eval's input from train.
fn driver_stages_are_steps(job: &Value, observer: &str) {
    let steps = job["steps"].as_array().expect("steps");
    let stages: Vec<&str> = steps[1..]
        .iter()
        .map(|s| s["argv"][2].as_str().unwrap())
        .collect();
    assert_eq!(
        stages,
        ["prep", "train", "eval"],
        "{observer}: {:#}",
        job["steps"]
    );
    assert!(steps[1..].iter().all(|s| s["parent"] == 1), "{observer}");
    let outs: BTreeSet<String> = steps[2]["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| name(o["path"].as_str().unwrap()))
        .collect();
    assert_eq!(
        outs,
        set(&["model.txt", "part0.txt", "part1.txt"]),
        "{observer}: the workers' files are the train step's"
    );
    let from: Vec<(String, Option<u64>)> = steps[3]["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (name(i["path"].as_str().unwrap()), i["from_step"].as_u64()))
        .collect();
    assert!(
        from.contains(&("model.txt".into(), Some(3))),
        "{observer}: eval read train's model: {from:?}"
    );
}

#[test]
fn a_file_a_driver_opens_and_hands_over_as_stdout_is_the_commands_output() {
    let p = Project::new();
    p.write("raw.txt", b"b\na\n");
    p.write(
        "drive.py",
        b"import subprocess\nsubprocess.run(['sort', 'raw.txt'], stdout=open('sorted.txt', 'w'), check=True)\nopen('log.txt', 'w').write('done')\n",
    );
    for backend in common::backends() {
        let job = run(&p, backend, &["python3", "drive.py"]);
        let mut want = set(&["sort: in raw.txt", "sort: out sorted.txt"]);
        let root = program(&job["steps"][0]);
        want.insert(format!("{root}: in drive.py"));
        want.insert(format!("{root}: out log.txt"));
        let got: BTreeSet<String> = edges(&job)
            .into_iter()
            .filter(|e| e.contains(".txt") || e.contains(".py"))
            .collect();
        assert_eq!(got, want, "{backend}");
    }
}

const VFORKER: &str = r#"
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    pid_t pid = vfork();
    if (pid == 0) {
        /* Before its exec, the child writes a file that is none of its streams. */
        int fd = open("side.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, "c", 1) != 1)
            _exit(1);
        close(fd);
        execlp("cat", "cat", "in.txt", (char *)0);
        _exit(127);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || status != 0)
        return 1;
    int fd = open("parent.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    return fd < 0 || write(fd, "p", 1) != 1;
}
"#;

#[test]
fn what_a_vfork_child_does_before_its_exec_is_the_new_steps_on_every_backend() {
    if !common::require_tool("cc") {
        return;
    }
    let p = Project::new();
    p.write("vforker.c", VFORKER.as_bytes());
    p.write("in.txt", b"x");
    let o = std::process::Command::new("cc")
        .args(["-O1", "-o", "vforker", "vforker.c"])
        .current_dir(p.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    p.append_config("\n[steps]\ndrivers = [\"vforker\"]\n");
    for backend in common::backends() {
        let job = run(&p, backend, &["./vforker"]);
        let got: BTreeSet<String> = edges(&job)
            .into_iter()
            .filter(|e| e.contains(".txt"))
            .collect();
        assert_eq!(
            got,
            set(&[
                "cat: in in.txt",
                "cat: out side.txt",
                "vforker: out parent.txt"
            ]),
            "{backend}"
        );
    }
}

#[test]
fn reproduce_reruns_steps_with_their_redirections_on_every_shell() {
    for shell in ["sh", "bash"] {
        if !common::require_tool(shell) {
            continue;
        }
        let p = Project::new();
        p.write("t.txt", b"a\nb\n");
        p.write("s.txt", b"z\n");
        let job = run(
            &p,
            "preload",
            &[shell, "-c", "wc -l < t.txt > r.txt && cat s.txt >> r.txt"],
        );
        let streams: Vec<String> = job["steps"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["streams"].as_array().cloned().unwrap_or_default())
            .map(|r| format!("{} {}", r["fd"], name(r["path"].as_str().unwrap())))
            .collect();
        assert_eq!(
            streams,
            ["0 t.txt", "1 r.txt", "1 r.txt"],
            "{shell}: {job:#}"
        );
        let want = std::fs::read(p.path().join("r.txt")).unwrap();
        let script = stdout(&p.roar(["reproduce", "r.txt"]));
        assert!(script.contains(">> "), "{shell}: {script}");
        std::fs::remove_file(p.path().join("r.txt")).unwrap();
        let o = p.roar(["reproduce", "--run", "--in-place", "r.txt"]);
        assert!(o.status.success(), "{shell}: {}{}", stdout(&o), stderr(&o));
        assert_eq!(
            std::fs::read(p.path().join("r.txt")).unwrap(),
            want,
            "{shell}"
        );
    }
}

#[test]
fn programs_joined_by_a_pipe_stay_in_the_step_that_runs_them_on_every_backend() {
    let p = Project::new();
    p.write("a.txt", b"b\n");
    p.write("b.txt", b"a\n");
    p.write("raw.txt", b"x\n");
    p.write(
        "capture.py",
        b"import subprocess\nout = subprocess.run(['cat', 'raw.txt'], capture_output=True, check=True).stdout\nopen('copy.txt', 'wb').write(out)\n",
    );
    for backend in common::backends() {
        // The data goes from cat to sort through a pipe no file event shows: one step, the
        // shell's, has a.txt and b.txt as inputs and s.txt as output.
        let job = run(
            &p,
            backend,
            &[
                "sh",
                "-c",
                "cat a.txt b.txt | sort > s.txt; wc -l s.txt > n.txt",
            ],
        );
        let root = program(&job["steps"][0]);
        let want = set(&[
            &format!("{root}: in a.txt"),
            &format!("{root}: in b.txt"),
            &format!("{root}: out s.txt"),
            &format!("wc: in s.txt <- {root}"),
            "wc: out n.txt",
        ]);
        assert_eq!(edges(&job), want, "{backend}");
        // Output captured by the driver: cat is the driver's, and copy.txt comes from raw.txt.
        let job = run(&p, backend, &["python3", "capture.py"]);
        assert!(job.get("steps").is_none(), "{backend}: {:#}", job["steps"]);
        let o = p.roar(["inputs", "copy.txt"]);
        assert!(stdout(&o).contains("raw.txt"), "{backend}: {}", stdout(&o));
    }
}

#[test]
fn reproduce_quotes_hostile_names_in_redirections() {
    let p = Project::new();
    // A name a shell would expand, split or end a quote on.
    let hostile = "o u'$(touch PWNED)\"`id`;\n.txt";
    p.write("in.txt", b"b\na\n");
    let script = "sort in.txt > \"$1\" && cat in.txt >> \"$1\"";
    run(&p, "preload", &["bash", "-c", script, "bash", hostile]);
    let want = std::fs::read(p.path().join(hostile)).unwrap();
    // The script, before the re-run below records new jobs.
    let text = stdout(&p.roar(["reproduce", hostile]));
    std::fs::remove_file(p.path().join(hostile)).unwrap();
    let o = p.roar(["reproduce", "--run", "--in-place", hostile]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(std::fs::read(p.path().join(hostile)).unwrap(), want);
    // The script form runs the same under sh.
    std::fs::remove_file(p.path().join(hostile)).unwrap();
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(&text)
        .current_dir(p.path())
        .env(
            "PATH",
            format!(
                "{}:{}",
                common::roar_bin().parent().unwrap().display(),
                std::env::var("PATH").unwrap()
            ),
        )
        .output()
        .unwrap();
    assert!(o.status.success(), "{text}\n{}", stderr(&o));
    assert_eq!(std::fs::read(p.path().join(hostile)).unwrap(), want);
    assert!(
        !p.path().join("PWNED").exists(),
        "a recorded name ran as a command"
    );
}

#[test]
fn a_secret_in_a_steps_command_never_reaches_the_store() {
    let p = Project::new();
    let secret = "hunter2-roar-step-secret";
    let job = run(
        &p,
        "preload",
        &[
            "sh",
            "-c",
            &format!("/usr/bin/printf %s --password={secret} > a.txt; cat a.txt > b.txt"),
        ],
    );
    let steps = job["steps"].as_array().expect("steps");
    let printf = steps
        .iter()
        .find(|s| program(s) == "printf")
        .expect("printf is a step");
    assert!(
        !printf["argv"].to_string().contains(secret),
        "{:#}",
        printf["argv"]
    );
    for file in ["roar.db", "roar.db-wal"] {
        let bytes = std::fs::read(p.path().join(".roar").join(file)).unwrap_or_default();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{file} holds the secret"
        );
    }
    let o = p.roar(["db", "--secrets-scan"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}

#[test]
fn steps_follow_the_configured_drivers_and_none_makes_every_job_one_step() {
    let p = Project::new();
    p.write("raw.txt", b"b\na\n");
    p.write("pipeline.sh", PIPELINE.as_bytes());
    let config = p.path().join(".roar/config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[steps]\ndrivers = []\n");
    std::fs::write(&config, &text).unwrap();
    let job = run(&p, "preload", &["sh", "pipeline.sh"]);
    assert!(job.get("steps").is_none(), "{job:#}");
    // A bad driver name is one clear line, before anything runs.
    std::fs::write(
        &config,
        text.replace("drivers = []", "drivers = [\"/bin/sh\"]"),
    )
    .unwrap();
    let o = p.roar(["run", "--", "true"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not a program name"), "{err}");
}

/// The mount cuts a job into steps by the same rule, from what it sees: each command of a
/// script (sh and bash, each run a few times: the mount reads a program it is told exec'd
/// while that program runs), each recipe of a Makefile under `make -j2`, each stage of a Python
/// driver, with the same files and edges as every `roar run` backend.
#[test]
fn under_the_mount_scripts_makefiles_and_drivers_are_the_same_steps_needs_root() {
    if !common::mount::require_fuse() {
        return;
    }
    let mut m = common::mount::Mounted::new(|d| {
        std::fs::write(d.join("raw.txt"), b"b\na\nc\n").unwrap();
        std::fs::write(d.join("pipeline.sh"), PIPELINE).unwrap();
        std::fs::write(d.join("src1.txt"), b"hello\n").unwrap();
        std::fs::write(d.join("src2.txt"), b"b\na\n").unwrap();
        std::fs::write(d.join("Makefile"), MAKEFILE).unwrap();
        std::fs::write(d.join("driver.py"), DRIVER).unwrap();
        std::fs::write(d.join("stage.py"), STAGE).unwrap();
    });
    let shells: Vec<&str> = ["sh", "bash"]
        .into_iter()
        .filter(|s| common::require_tool(s))
        .collect();
    let rounds = 4;
    let mut runs = Vec::new();
    for round in 0..rounds {
        for shell in &shells {
            assert!(m.run(&[shell, "pipeline.sh"]).success());
            runs.push(format!("{shell} #{round}"));
        }
    }
    let make = common::require_tool("make");
    if make {
        assert!(m.run(&["make", "-j2"]).success());
    }
    let python = common::require_tool("python3");
    if python {
        assert!(m.run(&["python3", "driver.py"]).success());
    }
    m.unmount();
    let jobs = m.jobs();
    let scripts: Vec<&Value> = jobs
        .iter()
        .filter(|j| j["argv"][1] == "pipeline.sh")
        .collect();
    assert_eq!(scripts.len(), runs.len(), "a job per script: {jobs:#?}");
    let pipeline = set(&[
        "tr: in raw.txt",
        "tr: out clean.txt",
        "sort: in clean.txt <- tr",
        "sort: out model.txt",
        "wc: in model.txt <- sort",
        "wc: out metrics.txt",
    ]);
    for (job, run) in scripts.iter().zip(&runs) {
        let steps = job["steps"]
            .as_array()
            .unwrap_or_else(|| panic!("{run}: {job:#}"));
        let tree = step_tree(steps);
        assert_eq!(
            tree,
            [(1, None), (2, Some(1)), (3, Some(1)), (4, Some(1))],
            "{run}: the script and its three commands: {:#}",
            job["steps"]
        );
        let mut want = pipeline.clone();
        let shell = program(&steps[0]);
        want.insert(format!("{shell}: in pipeline.sh"));
        if shell == "bash" {
            // bash opens a redirection in the child: the command's own request.
            assert_eq!(edges(job), want, "{run}");
        } else {
            same_or_coarser(&edges(job), &want, &shell, run);
        }
        let clean_in = &steps[2]["inputs"][0];
        assert_eq!(
            clean_in["hash"]["blake3"],
            blake3::hash(b"B\nA\nC\n").to_hex().as_str(),
            "{run}"
        );
    }
    if make {
        let job = jobs
            .iter()
            .find(|j| j["argv"][0] == "make")
            .expect("make's job");
        // Recipes with `<` run as `sh -c`: tr may show as a step under its shell's.
        let mut want = make_edges();
        want.insert("make: in Makefile".into());
        let got: BTreeSet<String> = edges(job)
            .into_iter()
            .map(|e| e.replacen("dash: ", "sh: ", 1))
            .collect();
        same_or_coarser(&got, &want, "sh", "make -j2");
    }
    if python {
        let job = jobs
            .iter()
            .find(|j| {
                j["argv"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|a| a == "driver.py")
            })
            .expect("the driver's job");
        driver_stages_are_steps(job, "mount");
    }
}

/// `roar diff` of two runs of a Makefile compares them step by step: after an edit of
/// `src2.txt`, the recipes downstream of it differ (each with the file that changed) until one
/// makes the same content again (`wc -l` counts as many lines), and the recipe that reads only
/// `src1.txt` is identical, whatever order `make -j2` ran them in.
#[test]
fn diff_of_two_runs_names_the_steps_that_differ() {
    let p = Project::new();
    p.write("src1.txt", b"hello\n");
    p.write("src2.txt", b"b\na\n");
    p.write("Makefile", MAKEFILE.as_bytes());
    let a = run(&p, "preload", &["make", "-s", "-j2"]);
    p.write("src2.txt", b"d\nc\n");
    let b = run(&p, "preload", &["make", "-B", "-s", "-j2"]);
    let (ida, idb) = (a["id"].to_string(), b["id"].to_string());
    let o = p.roar(["diff", &ida, &idb, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let d: Value = serde_json::from_slice(&o.stdout).unwrap();
    let changed: BTreeSet<String> = d["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert_eq!(s["change"], "changed", "{s:#}");
            s["command"].as_array().unwrap()[2]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        changed,
        set(&[
            "sort src2.txt > b.txt",
            "cat a.txt b.txt > joined.txt",
            "wc -l joined.txt > summary.txt",
        ]),
        "{:#}",
        d["steps"]
    );
    assert_eq!(d["same_steps"], 2, "the two tr recipes: {d:#}");
    let sort = d["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["command"][2] == "sort src2.txt > b.txt")
        .unwrap();
    let ins: Vec<(String, &str)> = sort["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                name(f["path"].as_str().unwrap()),
                f["change"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(ins, [("src2.txt".to_string(), "modified")]);
    // The human form says the same in a section of its own.
    let o = p.roar(["diff", &ida, &idb]);
    let text = stdout(&o);
    assert!(text.contains("steps"), "{text}");
    assert!(text.contains("2 identical steps"), "{text}");
    assert!(text.contains("sort src2.txt > b.txt"), "{text}");
}

/// Each step's number and its parent's.
fn step_tree(steps: &[serde_json::Value]) -> Vec<(u64, Option<u64>)> {
    steps
        .iter()
        .map(|s| (s["seq"].as_u64().unwrap(), s["parent"].as_u64()))
        .collect()
}
