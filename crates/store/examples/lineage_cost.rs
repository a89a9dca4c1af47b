//! Times `Store::lineage_with` in process (no CLI start, no printing), both ways of reading
//! outputs interleaved run by run: `cargo run --release -p roar-store --example lineage_cost --
//! STORE.db PATH [RUNS]`. Used to judge changes to the walk on a store `bench/team.sh` (or a dev
//! fleet) left, a mirror `.roar/remotes/NAME.db` included. Each run opens the store afresh, as
//! a command does. `ROAR_LINEAGE_COLLAPSED=1` times only the collapsed listing (what `roar
//! lineage` prints), for a profiler.
use std::path::Path;
use std::time::Instant;

use roar_store::{ignore::Ignore, Outputs, Store};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, db, path, rest @ ..] = &args[..] else {
        return Err("usage: lineage_cost STORE.db PATH [RUNS]".into());
    };
    let runs: usize = rest.first().map_or(Ok(20), |r| r.parse())?;
    let mut modes = vec![
        ("every output read", Outputs::Every),
        ("outputs collapsed at 6", Outputs::Collapsed { at: 6 }),
    ];
    if std::env::var_os("ROAR_LINEAGE_COLLAPSED").is_some() {
        modes.remove(0);
    }
    let mut times = vec![Vec::new(); modes.len()];
    let mut shapes = vec![String::new(); modes.len()];
    for _ in 0..runs {
        for (i, (_, mode)) in modes.iter().enumerate() {
            let t = Instant::now();
            let mut store = Store::open(Path::new(db))?;
            store.hide(Some(Ignore::new(&[])))?;
            let target = store.version_at(Path::new(path))?;
            let l = store.lineage_with(&target, *mode)?;
            times[i].push(t.elapsed().as_secs_f64() * 1e3);
            let sum = |f: fn(&roar_store::Step) -> usize| l.steps.iter().map(f).sum::<usize>();
            shapes[i] = format!(
                "{} steps, {} inputs, {} outputs, {} directories counted",
                l.steps.len(),
                sum(|s| s.inputs.len()),
                sum(|s| s.outputs.len()),
                sum(|s| s.output_dirs.len())
            );
        }
    }
    for (i, (name, _)) in modes.iter().enumerate() {
        let t = &mut times[i];
        t.sort_by(f64::total_cmp);
        println!(
            "{name:24} median {:6.1} ms  min {:6.1}  max {:6.1}  ({runs} runs; {})",
            t[runs / 2],
            t[0],
            t[runs - 1],
            shapes[i]
        );
    }
    Ok(())
}
