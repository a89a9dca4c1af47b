//! Which distributed run a `roar run` belongs to (docs/SEMANTICS.md "Distributed runs"): read
//! from the launcher's environment (torchrun / torchelastic, Slurm, MPI), from `torchrun`'s own
//! arguments when roar runs torchrun itself (one job per node), or named with `--group`.
//!
//! A job is a rank of a distributed run only when its launcher says there is more than one
//! process (or `--group` says so): a Slurm batch script's single task is an ordinary job.

use std::ffi::OsString;

use roar_store::Distributed;

/// The distributed run of a job started with `env` running `argv`; `group` is `--group`;
/// `launcher_id` names the process that started roar (host, pid and start time), for a torchrun
/// without a rendezvous id.
pub fn detect(
    env: &dyn Fn(&str) -> Option<String>,
    argv: &[OsString],
    group: Option<&str>,
    launcher_id: &dyn Fn() -> Option<String>,
) -> Option<Distributed> {
    let num = |k: &str| env(k).and_then(|v| v.trim().parse::<u32>().ok());
    let from_env = launcher(env, &num, launcher_id);
    if let Some(name) = group {
        let mut d = from_env.unwrap_or_default();
        d.group = format!("group:{name}");
        return Some(d);
    }
    from_env.or_else(|| torchrun_node(argv))
}

fn launcher(
    env: &dyn Fn(&str) -> Option<String>,
    num: &dyn Fn(&str) -> Option<u32>,
    launcher_id: &dyn Fn() -> Option<String>,
) -> Option<Distributed> {
    let many = |world: Option<u32>| world.is_some_and(|w| w > 1);
    // torchrun / torchelastic sets these in every worker it starts. Without `--rdzv-id` (and
    // without `--standalone`, which makes one up) the run id is `none` for every run: the ranks
    // of one node are then told apart from other runs by the torchrun agent that started them.
    if let Some(run) = env("TORCHELASTIC_RUN_ID").filter(|r| !r.is_empty()) {
        if many(num("WORLD_SIZE")) {
            let run = if run == "none" { launcher_id()? } else { run };
            return Some(Distributed {
                group: format!("torchelastic:{run}"),
                rank: num("RANK"),
                world_size: num("WORLD_SIZE"),
                local_rank: num("LOCAL_RANK"),
                node_rank: num("GROUP_RANK"),
            });
        }
    }
    // srun: one task per rank.
    if let Some(job) = env("SLURM_JOB_ID").filter(|j| !j.is_empty()) {
        if many(num("SLURM_NTASKS")) && num("SLURM_PROCID").is_some() {
            let group = match env("SLURM_STEP_ID").filter(|s| !s.is_empty()) {
                Some(step) => format!("slurm:{job}.{step}"),
                None => format!("slurm:{job}"),
            };
            return Some(Distributed {
                group,
                rank: num("SLURM_PROCID"),
                world_size: num("SLURM_NTASKS"),
                local_rank: num("SLURM_LOCALID"),
                node_rank: num("SLURM_NODEID"),
            });
        }
    }
    // Open MPI, then PMI launchers (MPICH's hydra, Intel MPI): the job's name space says which
    // run; without one, ranks on different nodes could not be told apart from another run's.
    let mpi = [
        (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
        ),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
        ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK"),
    ];
    for (rank, size, local) in mpi {
        if num(rank).is_some() && many(num(size)) {
            let space = [
                "PMIX_NAMESPACE",
                "OMPI_MCA_ess_base_jobid",
                "PMI_KVSNAME",
                "PMI_JOBID",
            ]
            .iter()
            .find_map(|k| env(k).filter(|v| !v.is_empty()))?;
            return Some(Distributed {
                group: format!("mpi:{space}"),
                rank: num(rank),
                world_size: num(size),
                local_rank: num(local),
                node_rank: None,
            });
        }
    }
    None
}

/// `none@HOST:PID:START` for roar's parent process (the launcher that started this rank):
/// unique among the runs of every machine (the start time, in clock ticks since boot, tells a
/// reused pid apart).
pub fn parent_id() -> Option<String> {
    use procfs::FromRead;
    let ppid = std::os::unix::process::parent_id();
    let start = procfs::process::Stat::from_file(format!("/proc/{ppid}/stat"))
        .ok()?
        .starttime;
    let host = roar_env::runtime::hostname().unwrap_or_default();
    Some(format!("none@{host}:{ppid}:{start}"))
}

/// `roar run -- torchrun --rdzv-id=ID --node-rank=N ...`: the job is node N of run ID, all of
/// that node's ranks its processes. Without a rendezvous id (torchrun's default, `none`) there
/// is nothing to join across nodes.
fn torchrun_node(argv: &[OsString]) -> Option<Distributed> {
    let args: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let prog = args.first()?.rsplit('/').next()?.to_owned();
    let start = if prog == "torchrun" {
        1
    } else if prog.starts_with("python") {
        let m = args.iter().position(|a| a == "-m")?;
        (args.get(m + 1)? == "torch.distributed.run").then_some(m + 2)?
    } else {
        return None;
    };
    let mut opts = std::collections::HashMap::new();
    let mut i = start;
    while i < args.len() {
        let a = &args[i];
        let Some(name) = a.strip_prefix("--") else {
            break; // the training script: its own arguments follow
        };
        let (key, value) = match name.split_once('=') {
            Some((k, v)) => (k.replace('_', "-"), Some(v.to_owned())),
            None => (name.replace('_', "-"), None),
        };
        let takes_value = !matches!(
            key.as_str(),
            "standalone" | "no-python" | "module" | "run-path"
        );
        let value = match value {
            Some(v) => v,
            None if takes_value => {
                i += 1;
                args.get(i).cloned().unwrap_or_default()
            }
            None => String::new(),
        };
        opts.insert(key, value);
        i += 1;
    }
    let id = opts
        .get("rdzv-id")
        .filter(|v| !v.is_empty() && *v != "none")?;
    let nodes: Option<u32> = opts
        .get("nnodes")
        .and_then(|n| n.rsplit(':').next()?.parse().ok());
    let per_node: Option<u32> = opts.get("nproc-per-node").and_then(|n| n.parse().ok());
    Some(Distributed {
        group: format!("torchelastic:{id}"),
        rank: None,
        world_size: nodes.zip(per_node).map(|(n, p)| n * p),
        local_rank: None,
        node_rank: opts.get("node-rank").and_then(|n| n.parse().ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    fn argv(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    fn no_agent() -> Option<String> {
        None
    }

    #[test]
    fn launchers_name_the_run_and_the_rank() {
        let torch = env_of(&[
            ("TORCHELASTIC_RUN_ID", "abc"),
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("GROUP_RANK", "1"),
        ]);
        let d = detect(&torch, &argv(&["python", "train.py"]), None, &no_agent).unwrap();
        assert_eq!(
            d,
            Distributed {
                group: "torchelastic:abc".into(),
                rank: Some(5),
                world_size: Some(8),
                local_rank: Some(1),
                node_rank: Some(1)
            }
        );
        let slurm = env_of(&[
            ("SLURM_JOB_ID", "991"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "1"),
        ]);
        let d = detect(&slurm, &argv(&["python"]), None, &no_agent).unwrap();
        assert_eq!(
            (d.group.as_str(), d.rank, d.node_rank),
            ("slurm:991.0", Some(3), Some(1))
        );
        let ompi = env_of(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("PMIX_NAMESPACE", "prterun-x-1@1"),
        ]);
        let d = detect(&ompi, &argv(&["a.out"]), None, &no_agent).unwrap();
        assert_eq!((d.group.as_str(), d.rank), ("mpi:prterun-x-1@1", Some(2)));
    }

    #[test]
    fn a_single_process_is_not_a_distributed_run_unless_named() {
        let sbatch = env_of(&[
            ("SLURM_JOB_ID", "7"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ]);
        assert_eq!(
            detect(&sbatch, &argv(&["python", "prep.py"]), None, &no_agent),
            None
        );
        let torch1 = env_of(&[
            ("TORCHELASTIC_RUN_ID", "x"),
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
        ]);
        assert_eq!(detect(&torch1, &argv(&["python"]), None, &no_agent), None);
        // MPI without a name space: nothing to join ranks of other nodes by.
        let bare = env_of(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]);
        assert_eq!(detect(&bare, &argv(&["a.out"]), None, &no_agent), None);
        let named = detect(&sbatch, &argv(&["python"]), Some("nightly"), &no_agent).unwrap();
        assert_eq!(named.group, "group:nightly");
        assert_eq!(
            named.rank, None,
            "the launcher's single task has no rank to keep"
        );
        let named_rank = detect(&torch1, &argv(&["python"]), Some("g"), &no_agent).unwrap();
        assert_eq!(
            (named_rank.group.as_str(), named_rank.rank),
            ("group:g", None)
        );
    }

    #[test]
    fn torchrun_without_a_rendezvous_id_is_one_run_per_agent() {
        let default_id = env_of(&[
            ("TORCHELASTIC_RUN_ID", "none"),
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
        ]);
        let agent = || Some("none@node1:4242:77".to_owned());
        let d = detect(&default_id, &argv(&["python"]), None, &agent).unwrap();
        assert_eq!(d.group, "torchelastic:none@node1:4242:77");
        assert_eq!(d.rank, Some(1));
        assert_eq!(
            detect(&default_id, &argv(&["python"]), None, &no_agent),
            None
        );
    }

    #[test]
    fn torchrun_run_by_roar_is_one_node_of_its_rendezvous() {
        let none = env_of(&[]);
        let d = detect(
            &none,
            &argv(&[
                "torchrun",
                "--nnodes=2",
                "--nproc_per_node",
                "4",
                "--rdzv-id",
                "job7",
                "--node-rank=1",
                "train.py",
                "--rdzv-id",
                "not-ours",
            ]),
            None,
            &no_agent,
        )
        .unwrap();
        assert_eq!(d.group, "torchelastic:job7");
        assert_eq!(
            (d.node_rank, d.world_size, d.rank),
            (Some(1), Some(8), None)
        );
        let module = argv(&[
            "python3",
            "-m",
            "torch.distributed.run",
            "--rdzv_id=r9",
            "t.py",
        ]);
        assert_eq!(
            detect(&none, &module, None, &no_agent).unwrap().group,
            "torchelastic:r9"
        );
        assert_eq!(
            detect(
                &none,
                &argv(&["torchrun", "--standalone", "t.py"]),
                None,
                &no_agent
            ),
            None
        );
        assert_eq!(
            detect(
                &none,
                &argv(&["torchrun", "--rdzv-id", "none", "t.py"]),
                None,
                &no_agent
            ),
            None
        );
    }
}
