//! A lineage read with several connections (its wide levels split between them) is the lineage
//! one connection reads: generated graphs of the shapes a team store holds.

use std::path::Path;

use roar_store::testing::{self, file, Rng};
use roar_store::{Distributed, JobRecord, Outputs, Role, Store, Writer};

/// One generated history: datasets ingested in shards, jobs reading some shards (some paths
/// written again), a distributed run of 8-16 ranks over their outputs, an evaluation of its
/// checkpoint. Returns the paths worth asking the lineage of.
fn history(rng: &mut Rng, writer: &Writer) -> Vec<String> {
    let mut t = 0i64;
    let mut at = |argv: &[&str], files| {
        t += 1;
        testing::job(argv, "/w", t * 1_000_000_000_000, files)
    };
    let mut shards = Vec::new();
    for d in 0..2 + rng.below(4) {
        let mut files = vec![file(Role::Input, &format!("/raw/{d}"), &[d as u8])];
        for s in 0..10 + rng.below(30) {
            let path = format!("/data/d{d}/s{s}");
            files.push(file(Role::Output, &path, path.as_bytes()));
            shards.push(path);
        }
        writer.record_job(at(&["ingest"], files)).unwrap();
    }
    let mut made = Vec::new();
    for p in 0..10 + rng.below(12) {
        let mut files: Vec<_> = (0..1 + rng.below(5))
            .map(|_| &shards[rng.below(shards.len())])
            .map(|s| file(Role::Input, s, s.as_bytes()))
            .collect();
        // Some paths are written again: a later reader finds the newer version's producer.
        let out = format!("/prep/{}", p % 8);
        let version = format!("{out}@{p}");
        files.push(file(Role::Output, &out, version.as_bytes()));
        writer.record_job(at(&["prep"], files)).unwrap();
        made.push((out, version));
    }
    let ranks = 8 + rng.below(9);
    for rank in 0..ranks {
        let mut files: Vec<_> = (0..2 + rng.below(3))
            .map(|_| &made[rng.below(made.len())])
            .map(|(path, version)| file(Role::Input, path, version.as_bytes()))
            .collect();
        if rank == 0 {
            files.push(file(Role::Output, "/ckpt", b"weights"));
        }
        let mut job: JobRecord = at(&["train"], files);
        job.dist = Some(Distributed {
            group: "group:train".into(),
            rank: Some(rank as u32),
            world_size: Some(ranks as u32),
            local_rank: None,
            node_rank: None,
        });
        writer.record_job(job).unwrap();
    }
    let (last, version) = &made[made.len() - 1];
    let files = vec![
        file(Role::Input, "/ckpt", b"weights"),
        file(Role::Input, last, version.as_bytes()),
        file(Role::Output, "/score", b"0.9"),
    ];
    writer.record_job(at(&["eval"], files)).unwrap();
    vec![
        "/score".into(),
        "/ckpt".into(),
        last.clone(),
        shards[0].clone(),
    ]
}

/// Seeded graphs (replay one with ROAR_LINEAGE_SEED): every lineage, with every output read
/// and with directories counted, is byte for byte the same read both ways — and the wide levels
/// did use a second connection where the machine has a second core.
#[test]
fn a_lineage_read_by_several_connections_is_the_one_one_connection_reads() {
    let mut rng = Rng::from_env("ROAR_LINEAGE_SEED", 20_261_202);
    let mut twinned = 0;
    for round in 0..8 {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("roar.db");
        roar_store::open(&db, true).unwrap();
        let writer = Writer::start(&db).unwrap();
        let targets = history(&mut rng, &writer);
        drop(writer);
        let store = Store::open(&db).unwrap();
        for path in &targets {
            let target = store.version_at(Path::new(path)).unwrap();
            for outputs in [Outputs::Every, Outputs::Collapsed { at: 6 }] {
                let mut read = |parallel| {
                    let walked = testing::lineage_walk(&store, &target, outputs, parallel).unwrap();
                    twinned += usize::from(walked.twinned);
                    serde_json::to_string(&walked.lineage.expect("no writer ran")).unwrap()
                };
                let (alone, shared) = (read(false), read(true));
                assert_eq!(
                    alone,
                    shared,
                    "round {round} of seed {}: lineage of {path} ({outputs:?})",
                    rng.seed()
                );
            }
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        twinned > 0 || cores == 1,
        "no lineage was read with a second connection: the comparison compared nothing"
    );
}

/// While a writer keeps committing jobs that change who produced what a run read (a job
/// recorded late that wrote the same bytes at the same path just before the run started), every
/// lineage read with several connections answers, and answers a lineage of one moment: each
/// producer it names is one of its steps.
#[test]
fn a_lineage_read_while_a_writer_commits_is_of_one_moment() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("roar.db");
    roar_store::open(&db, true).unwrap();
    let writer = Writer::start(&db).unwrap();
    let s = 1_000_000_000_000i64;
    let shards: Vec<_> = (0..20).map(|i| format!("/data/s{i}")).collect();
    let ingest = shards.iter().map(|p| file(Role::Output, p, p.as_bytes()));
    writer
        .record_job(testing::job(&["ingest"], "/w", s, ingest.collect()))
        .unwrap();
    let prep = |p: usize, started_ns| {
        let files = vec![
            file(Role::Input, &shards[p], shards[p].as_bytes()),
            file(
                Role::Output,
                &format!("/prep/{p}"),
                format!("v{p}").as_bytes(),
            ),
        ];
        testing::job(&["prep"], "/w", started_ns, files)
    };
    for p in 0..10 {
        writer.record_job(prep(p, (2 + p as i64) * s)).unwrap();
    }
    for rank in 0..12 {
        let mut files: Vec<_> = (0..3)
            .map(|k| (rank + k * 3) % 10)
            .map(|p| {
                file(
                    Role::Input,
                    &format!("/prep/{p}"),
                    format!("v{p}").as_bytes(),
                )
            })
            .collect();
        if rank == 0 {
            files.push(file(Role::Output, "/ckpt", b"weights"));
        }
        let mut job = testing::job(&["train"], "/w", 20 * s, files);
        job.dist = Some(Distributed {
            group: "group:train".into(),
            rank: Some(rank as u32),
            world_size: Some(12),
            local_rank: None,
            node_rank: None,
        });
        writer.record_job(job).unwrap();
    }
    drop(writer);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let writer = Writer::start(&db).unwrap();
            for k in 0..400 {
                writer.record_job(prep(k % 10, 15 * s + k as i64)).unwrap();
                writer.flush().unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let store = Store::open(&db).unwrap();
        let target = store.version_at(Path::new("/ckpt")).unwrap();
        let mut reads = 0;
        while !done.load(std::sync::atomic::Ordering::Relaxed) || reads < 20 {
            let lineage = store
                .lineage_with(&target, Outputs::Collapsed { at: 6 })
                .expect("a lineage read while a writer commits");
            let jobs: std::collections::HashSet<i64> =
                lineage.steps.iter().map(|s| s.job_id).collect();
            for step in &lineage.steps {
                for input in &step.inputs {
                    if let Some(p) = input.producer {
                        assert!(
                            jobs.contains(&p),
                            "producer {p} of {} not a step",
                            input.path
                        );
                    }
                }
            }
            reads += 1;
        }
    });
}
