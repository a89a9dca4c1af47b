//! What a mount's daemon served (issue 65): requests by kind, those the caller waited for, the
//! polls that caught a request or ran out, and the daemon's CPU. The daemon writes its counts
//! beside its state file at each tick; `roar mount --list` reads them.

use std::path::{Path, PathBuf};

/// Where a mount's daemon keeps the count of the requests it has served (`roar mount --list`).
pub(crate) fn requests_path(state: &Path) -> PathBuf {
    state.with_extension("requests")
}

/// The mount's requests by kind and how polling for them went, as `roar mount --list --json`
/// shows them; written by the daemon at each tick when they changed.
pub(crate) fn write_requests(path: &Path, stats: &roar_roarfs::Stats, last: &mut u64) {
    let kinds = stats.requests();
    let total: u64 = kinds.iter().map(|k| k.count).sum();
    if total == *last {
        return;
    }
    *last = total;
    let polls = stats.polls();
    let json = serde_json::json!({
        "requests": kinds.iter().map(|k| (k.name.to_owned(), k.count.into())).collect::<serde_json::Map<_, _>>(),
        "waited": kinds.iter().filter(|k| k.waited).map(|k| k.count).sum::<u64>(),
        "total": total,
        "polls": {"caught": polls.hits, "ran_out": polls.misses},
    });
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, json.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// `N requests served (W waited for: OPEN a, IOCTL b, ...); daemon CPU C s`, the busiest kinds
/// first: what a mount has cost the processes using it so far.
pub(crate) fn served_line(m: &serde_json::Value) -> Option<String> {
    let served = &m["served"];
    let mut kinds: Vec<(&String, u64)> = served["requests"]
        .as_object()?
        .iter()
        .filter_map(|(k, v)| Some((k, v.as_u64()?)))
        .collect();
    kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    Some(format!(
        "{} requests served ({} waited for; {}); polls caught {}, ran out {}; daemon CPU {:.2} s",
        served["total"],
        served["waited"],
        kinds.join(", "),
        served["polls"]["caught"],
        served["polls"]["ran_out"],
        m["daemon_cpu_ms"].as_f64().unwrap_or(0.0) / 1e3
    ))
}

/// The CPU time process `pid` has used (user and system, all threads), in milliseconds.
pub(crate) fn cpu_ms(pid: i32) -> Option<f64> {
    let stat = procfs::process::Process::new(pid).ok()?.stat().ok()?;
    let ticks = (stat.utime + stat.stime) as f64;
    Some(ticks * 1e3 / procfs::ticks_per_second() as f64)
}
