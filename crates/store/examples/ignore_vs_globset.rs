//! roar's ignore matcher against globset on the built-in list (bench/NOTES.md, session 48): what
//! building each costs (every `roar run` builds the matcher once) and what a path's verdict
//! costs, over the paths under a few real directories, with the number each ignores (they must
//! agree). `cargo run --release -p roar-store --example ignore_vs_globset [ROUNDS]`.

use std::path::PathBuf;
use std::time::Instant;

use globset::{GlobBuilder, GlobSetBuilder};
use roar_store::ignore::{Ignore, DEFAULT_IGNORES};

/// Up to 200,000 paths under directories every machine here has.
fn paths() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let roots = [
        "/usr/lib/python3",
        "/usr/share",
        env!("CARGO_MANIFEST_DIR"),
        "/etc",
        "/tmp",
    ];
    for root in roots {
        let mut stack = vec![PathBuf::from(root)];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(p.clone());
                }
                out.push(p);
                if out.len() >= 200_000 {
                    return out;
                }
            }
        }
    }
    out
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(15);
    let ps = paths();
    let (mut build_roar, mut build_gs, mut match_roar, mut match_gs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut ignored_roar, mut ignored_gs) = (0, 0);
    for _ in 0..rounds {
        let t = Instant::now();
        let ignore = Ignore::new(&[]);
        ignore.compile();
        build_roar.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        let mut b = GlobSetBuilder::new();
        for g in DEFAULT_IGNORES {
            b.add(GlobBuilder::new(g).literal_separator(true).build().unwrap());
        }
        let set = b.build().unwrap();
        build_gs.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        ignored_roar = ps.iter().filter(|p| ignore.is_ignored(p)).count();
        match_roar.push(t.elapsed().as_secs_f64() * 1e9 / ps.len() as f64);
        let t = Instant::now();
        ignored_gs = ps.iter().filter(|p| set.is_match(p)).count();
        match_gs.push(t.elapsed().as_secs_f64() * 1e9 / ps.len() as f64);
    }
    let (br, bg) = (median(&mut build_roar), median(&mut build_gs));
    let (mr, mg) = (median(&mut match_roar), median(&mut match_gs));
    println!(
        "{} paths, {} patterns, {rounds} rounds (medians)",
        ps.len(),
        DEFAULT_IGNORES.len()
    );
    println!(
        "build: roar {br:8.1} us   globset {bg:8.1} us   globset/roar {:.1}x",
        bg / br
    );
    println!(
        "match: roar {mr:8.1} ns   globset {mg:8.1} ns a path   globset/roar {:.2}x",
        mg / mr
    );
    println!("ignored: roar {ignored_roar}, globset {ignored_gs}");
    assert_eq!(ignored_roar, ignored_gs, "the two matchers disagree");
}
