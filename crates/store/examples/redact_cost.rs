//! What redaction costs per job (bench/security.sh): `Policy::job` on three job shapes, median of
//! many rounds, printed in microseconds for the benchmark to set against `roar run true`.
//!
//! - `typical`: this process's environment and a 12-argument command line;
//! - `wide`: 300 variables and 200 arguments, none secret;
//! - `hostile`: the same sizes, every other value secret-shaped (tokens, URLs with passwords,
//!   `--password X`, PEM blocks).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::time::Instant;

use roar_store::redact::Policy;
use roar_store::{JobRecord, Outcome};

fn job(argv: Vec<String>, env: BTreeMap<String, String>) -> JobRecord {
    JobRecord {
        name: None,
        argv: argv.into_iter().map(OsString::from).collect(),
        cwd: "/w".into(),
        started_ns: 0,
        ended_ns: Some(1),
        outcome: Outcome::Exited(0),
        incomplete: false,
        backend: "preload".into(),
        git: None,
        env,
        host: None,
        processes: Vec::new(),
        steps: Vec::new(),
        files: Vec::new(),
        environment: None,
        uid: None,
        dist: None,
    }
}

fn shapes() -> Vec<(&'static str, JobRecord)> {
    let typical_argv: Vec<String> = "python train.py --epochs 5 --lr 0.01 --data data/raw/train.csv --out models/m.npy --seed 7"
        .split(' ')
        .map(String::from)
        .collect();
    let typical = job(
        typical_argv,
        roar_store::redact::collect_env(std::env::vars_os()),
    );
    let wide = job(
        (0..200)
            .map(|i| format!("--opt{i}=value-{i}/path/file{i}.csv"))
            .collect(),
        (0..300)
            .map(|i| (format!("VAR_{i}"), format!("/some/path/{i}:/other/{i}")))
            .collect(),
    );
    let secret = |i: usize| match i % 4 {
        0 => format!("ghp_{:036}", i),
        1 => format!("https://user:pw{i}@host/x"),
        2 => format!("-----BEGIN RSA PRIVATE KEY-----\nMIIE{i}\n-----END RSA PRIVATE KEY-----"),
        _ => format!("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIx{i}In0.sig{i}abcdefgh"),
    };
    let hostile = job(
        (0..200)
            .flat_map(|i| {
                if i % 2 == 0 {
                    vec![format!("--password"), format!("pw{i}")]
                } else {
                    vec![secret(i)]
                }
            })
            .take(200)
            .collect(),
        (0..300)
            .map(|i| {
                let v = if i % 2 == 0 {
                    secret(i)
                } else {
                    format!("/plain/{i}")
                };
                (format!("VAR_{i}"), v)
            })
            .collect(),
    );
    vec![("typical", typical), ("wide", wide), ("hostile", hostile)]
}

fn main() {
    let policy = Policy::builtin();
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(200);
    for (name, shape) in shapes() {
        // The first job of a process also compiles the patterns its strings need.
        let t = Instant::now();
        policy.job(&mut shape.clone());
        let first = t.elapsed().as_secs_f64() * 1e6;
        let vars = shape.env.len();
        let args = shape.argv.len();
        let mut times: Vec<f64> = (0..rounds)
            .map(|_| {
                let mut j = shape.clone();
                let t = Instant::now();
                std::hint::black_box(policy.job(&mut j));
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        times.sort_by(f64::total_cmp);
        println!(
            "{name}: {vars} vars, {args} args: first {first:.0} us, then median {:.0} us per job",
            times[times.len() / 2]
        );
    }
}
