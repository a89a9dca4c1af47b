//! Distributed runs on one machine: a launcher starting `roar run` per rank with torchrun's
//! variables (its default run id `none`, as a plain `torchrun --no-python` gives), twice. Each
//! launch is one run of its own; a rank's lineage brings every rank of its run and no other.

use crate::common;

use std::collections::BTreeSet;

use common::{require_tool, stderr, Project};

#[test]
fn each_launch_is_one_run_and_a_ranks_lineage_brings_its_run() {
    if !require_tool("python3") {
        return;
    }
    let p = Project::new();
    for r in 0..4 {
        p.write(&format!("shard{r}.bin"), &[r as u8; 64]);
    }
    p.write(
        "rank.py",
        b"import os\nr = os.environ['RANK']\nd = open(f'shard{r}.bin', 'rb').read()\n\
          if r == '0':\n    open(os.environ['OUT'], 'wb').write(os.environ['OUT'].encode() + d)\n",
    );
    let launch = |out: &str| {
        // The launcher stays the parent of every rank, as torchrun's agent does.
        let script = format!(
            "for r in 0 1 2 3; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 GROUP_RANK=0 \
             TORCHELASTIC_RUN_ID=none OUT={out} {roar} run -- python3 rank.py & done; wait",
            roar = common::roar_bin().display()
        );
        let o = std::process::Command::new("sh")
            .args(["-c", &script])
            .current_dir(p.path())
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    };
    launch("ckpt-a.pt");
    launch("ckpt-b.pt");
    let log: serde_json::Value =
        serde_json::from_slice(&p.roar(["log", "--json", "-n", "0"]).stdout).unwrap();
    let groups: BTreeSet<String> = log
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|j| j["dist"]["group"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(groups.len(), 2, "two launches, two runs: {groups:?}");
    for g in &groups {
        assert!(g.starts_with("torchelastic:none@"), "{g}");
        let out = p.roar(["show", g, "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let ranks: Vec<u64> = run["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["dist"]["rank"].as_u64().unwrap())
            .collect();
        assert_eq!(ranks, [0, 1, 2, 3], "by rank");
    }
    for ckpt in ["ckpt-a.pt", "ckpt-b.pt"] {
        let out = p.roar(["lineage", ckpt, "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let l: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let steps = l["steps"].as_array().unwrap();
        let groups: BTreeSet<&str> = steps
            .iter()
            .filter_map(|s| s["dist"]["group"].as_str())
            .collect();
        assert_eq!(groups.len(), 1, "only its own run: {l:#}");
        assert_eq!(steps.len(), 4, "every rank of it: {l:#}");
        let roots: BTreeSet<String> = l["roots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r["path"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .filter(|n| n.starts_with("shard"))
            .collect();
        assert_eq!(roots.len(), 4, "every rank's shard: {roots:?}");
    }
    // Reproducing it lists each rank for its launcher; run one after another they would hang.
    let out = p.roar(["reproduce", "ckpt-a.pt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let script = common::stdout(&out);
    let ranks: Vec<&str> = script
        .lines()
        .filter(|l| l.starts_with("# job ") && l.contains("torchelastic:none@"))
        .collect();
    assert_eq!(ranks.len(), 4, "{script}");
    assert!(
        !script
            .lines()
            .any(|l| l.starts_with("roar run") && l.contains("rank.py")),
        "no rank is run by the script: {script}"
    );
    let out = p.roar(["reproduce", "ckpt-a.pt", "--run"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("distributed run"), "{err}");
}

/// A run's name comes from the environment or `--group`: a hostile one (a newline, a command) is
/// escaped on terminals and never ends the comment it sits in in a reproduce script.
#[test]
fn a_hostile_run_name_stays_inside_its_comment() {
    let p = Project::new();
    let name = "g\necho PWNED > pwned.txt\n\x1b[31m";
    let o = p
        .cmd(["run", "--group", name, "--", "sh", "-c", "echo x > out.txt"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let script = common::stdout(&p.roar(["reproduce", "out.txt"]));
    assert!(
        !script
            .lines()
            .any(|l| l.trim_start().starts_with("echo PWNED")),
        "{script}"
    );
    let log = common::stdout(&p.roar(["log"]));
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(!log.contains('\x1b'), "{log:?}");
    let show = common::stdout(&p.roar(["show", "1"]));
    assert!(
        !show.contains('\x1b') && !show.contains("\necho PWNED"),
        "{show:?}"
    );
}
