//! Builds a large synthetic store for the query benchmark (bench/query.sh).
//!
//!     cargo run --release -p roar-store --example synth_store -- DIR [JOBS] [EDGES_PER_JOB]
//!
//! The shape is many independent 20-step pipelines: each step reads every output of the step
//! before it plus the same 10 shared root files (a dataset every pipeline reads), and writes
//! outputs of its own, so one artifact's lineage is 20 steps deep while the store holds
//! JOBS (default 10,000) jobs and JOBS x EDGES_PER_JOB (default 100) file edges.
//! Records go through the same Writer as `roar run`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use roar_store::{ContentHash, FileRecord, JobRecord, Ops, Outcome, Project, Role, Writer};

const STEPS: usize = 20;
const SHARED_ROOTS: usize = 10;

fn content(label: &str) -> ContentHash {
    ContentHash {
        blake3: blake3::hash(label.as_bytes()).to_hex().to_string(),
        sha256: None,
        size: label.len() as u64,
    }
}

fn file(role: Role, path: String, hash: ContentHash) -> FileRecord {
    FileRecord {
        role,
        path: PathBuf::from(path),
        hash: Some(hash),
        before: None,
        ops: if role == Role::Input {
            Ops::READ
        } else {
            Ops::WRITE | Ops::CREATE
        },
        first_ns: None,
        last_ns: None,
        s3: None,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .ok_or("usage: synth_store DIR [JOBS] [EDGES_PER_JOB]")?,
    );
    let jobs: usize = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(10_000);
    let edges: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(100);
    std::fs::create_dir_all(&dir)?;
    let (project, _) = Project::init(&dir)?;
    let writer = Writer::start(&project.db_path())?;
    let root = dir.display().to_string();
    // Half of each step's edges are inputs (shared roots + the previous step's outputs).
    let outputs_per_step = (edges - SHARED_ROOTS) / 2;
    let roots: Vec<FileRecord> = (0..SHARED_ROOTS)
        .map(|r| {
            file(
                Role::Input,
                format!("{root}/data/shared-{r}.parquet"),
                content(&format!("shared {r}")),
            )
        })
        .collect();
    let t = std::time::Instant::now();
    for j in 0..jobs {
        let (pipeline, step) = (j / STEPS, j % STEPS);
        let mut files = roots.clone();
        let out = |s: usize, k: usize| {
            (
                format!("{root}/p{pipeline}/step{s}/part-{k}.bin"),
                content(&format!("p{pipeline} s{s} k{k}")),
            )
        };
        for k in 0..outputs_per_step {
            if step > 0 {
                let (path, hash) = out(step - 1, k);
                files.push(file(Role::Input, path, hash));
            } else {
                files.push(file(
                    Role::Input,
                    format!("{root}/raw/p{pipeline}-{k}.csv"),
                    content(&format!("raw p{pipeline} k{k}")),
                ));
            }
            let (path, hash) = out(step, k);
            files.push(file(Role::Output, path, hash));
        }
        writer.record_job(JobRecord {
            name: Some(format!("p{pipeline}-step{step}")),
            argv: vec![
                "python".into(),
                "step.py".into(),
                format!("--step={step}").into(),
            ],
            cwd: dir.clone(),
            started_ns: 1_700_000_000_000_000_000 + j as i64 * 1_000_000_000,
            ended_ns: Some(1_700_000_000_000_000_000 + j as i64 * 1_000_000_000 + 500_000_000),
            outcome: Outcome::Exited(0),
            incomplete: false,
            backend: "synthetic".into(),
            git: None,
            env: BTreeMap::new(),
            host: Some("bench".into()),
            processes: Vec::new(),
            steps: Vec::new(),
            files,
            environment: None,
            uid: None,
            dist: None,
        })?;
    }
    writer.flush()?;
    eprintln!(
        "synth_store: {jobs} jobs, {} file edges in {:.1} s",
        jobs * (SHARED_ROOTS + 2 * outputs_per_step),
        t.elapsed().as_secs_f64()
    );
    // The last pipeline's final output and one of its root inputs, for the benchmark.
    let last = jobs - 1;
    println!("{root}/p{}/step{}/part-0.bin", last / STEPS, last % STEPS);
    Ok(())
}
