//! What `roar run` sees, for people: `--trace` prints each observed access as it arrives
//! (`[1234] open R data/x.csv`, `[1234] rename tmp -> model.pt`, `[1233] exec python train.py`),
//! and `--summary` ends the run with counts per operation and per directory, like `strace -c`.
//! Neither costs anything when not asked for: without them the backends' tap is what it was.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use roar_store::shell_join;
use roar_tracer::{Event, Tap};

use crate::fmt::rel;

/// A path as the trace shows it: relative to the directory roar ran in when below it.
fn shown(p: &Path, cwd: &Path) -> String {
    if p == cwd {
        return ".".into();
    }
    rel(&p.to_string_lossy(), cwd)
}

fn open_mode(flags: i32) -> &'static str {
    let acc = flags & libc::O_ACCMODE;
    let create = flags & libc::O_CREAT != 0;
    let trunc = flags & libc::O_TRUNC != 0;
    match (acc, create, trunc) {
        (libc::O_RDONLY, _, _) => "R",
        (libc::O_WRONLY, true, true) => "W (create, truncate)",
        (libc::O_WRONLY, true, false) => "W (create)",
        (libc::O_WRONLY, false, true) => "W (truncate)",
        (libc::O_WRONLY, false, false) => "W",
        (_, true, _) => "RW (create)",
        (_, false, true) => "RW (truncate)",
        _ => "RW",
    }
}

/// One line for one event, without a newline.
pub fn line(e: &Event, cwd: &Path) -> String {
    let s = |p: &Path| shown(p, cwd);
    match e {
        Event::Exec { pid, argv, .. } => {
            let mut a = shell_join(argv);
            if a.len() > 300 {
                let cut = (0..=300)
                    .rev()
                    .find(|i| a.is_char_boundary(*i))
                    .unwrap_or(0);
                a.truncate(cut);
                a.push_str(" ...");
            }
            format!("[{pid}] exec {a}")
        }
        Event::Fork { pid, ppid, .. } => format!("[{ppid}] fork {pid}"),
        Event::Exit { pid, .. } => format!("[{pid}] exit"),
        Event::Open {
            pid, path, flags, ..
        } => format!("[{pid}] open {} {}", open_mode(*flags), s(path)),
        Event::Rename { pid, from, to, .. } => {
            format!("[{pid}] rename {} -> {}", s(from), s(to))
        }
        Event::Link { pid, from, to, .. } => format!("[{pid}] link {} -> {}", s(from), s(to)),
        Event::Exchange { pid, a, b, .. } => format!("[{pid}] exchange {} <-> {}", s(a), s(b)),
        Event::Unlink { pid, path, .. } => format!("[{pid}] unlink {}", s(path)),
        Event::Truncate { pid, path, .. } => format!("[{pid}] truncate {}", s(path)),
        Event::Mkdir { pid, path, .. } => format!("[{pid}] mkdir {}", s(path)),
        Event::Rmdir { pid, path, .. } => format!("[{pid}] rmdir {}", s(path)),
        Event::Symlink { pid, path, .. } => format!("[{pid}] symlink {}", s(path)),
        Event::Untraced { pid, path, why, .. } => {
            format!("[{pid}] exec {} (not followed: {why})", s(path))
        }
    }
}

/// The `--trace` printer: a tap that writes one line per event to stderr or a file.
pub fn trace_tap(file: Option<&Path>, cwd: PathBuf, then: Tap) -> anyhow::Result<Tap> {
    let out: Box<dyn Write + Send> = match file {
        Some(f) => Box::new(
            std::fs::File::create(f)
                .map_err(|e| anyhow::anyhow!("cannot write the trace to {}: {e}", f.display()))?,
        ),
        None => Box::new(std::io::stderr()),
    };
    let out = Mutex::new(std::io::LineWriter::new(out));
    Ok(Arc::new(move |e: &Event| {
        then(e);
        let l = line(e, &cwd);
        if let Ok(mut o) = out.lock() {
            let _ = writeln!(o, "roar: {l}");
        }
    }))
}

/// `--summary`: counts per operation and per directory.
pub fn summary(events: &[Event], cwd: &Path, out: &mut impl Write) -> std::io::Result<()> {
    let mut ops: BTreeMap<&'static str, usize> = BTreeMap::new();
    // Per directory: (reads, writes, other changes).
    let mut dirs: BTreeMap<PathBuf, [usize; 3]> = BTreeMap::new();
    let mut dir = |p: &Path, k: usize| {
        let d = p.parent().unwrap_or(Path::new("/")).to_owned();
        dirs.entry(d).or_default()[k] += 1;
    };
    for e in events {
        let op = match e {
            Event::Exec { .. } => "exec",
            Event::Fork { .. } => "fork",
            Event::Exit { .. } => "exit",
            Event::Open { path, flags, .. } => {
                let read = flags & libc::O_ACCMODE == libc::O_RDONLY;
                dir(path, if read { 0 } else { 1 });
                if read {
                    "open (read)"
                } else {
                    "open (write)"
                }
            }
            Event::Rename { to, .. } => {
                dir(to, 2);
                "rename"
            }
            Event::Link { to, .. } => {
                dir(to, 2);
                "link"
            }
            Event::Exchange { a, .. } => {
                dir(a, 2);
                "exchange"
            }
            Event::Unlink { path, .. } => {
                dir(path, 2);
                "unlink"
            }
            Event::Truncate { path, .. } => {
                dir(path, 2);
                "truncate"
            }
            Event::Mkdir { .. } => "mkdir",
            Event::Rmdir { .. } => "rmdir",
            Event::Symlink { path, .. } => {
                dir(path, 2);
                "symlink"
            }
            Event::Untraced { .. } => "exec (not followed)",
        };
        *ops.entry(op).or_default() += 1;
    }
    let total: usize = ops.values().sum();
    writeln!(out, "roar: summary of {total} observed operations")?;
    writeln!(out, "  {:>8}  {:>6}  operation", "count", "%")?;
    let mut by_count: Vec<_> = ops.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (op, n) in by_count {
        writeln!(
            out,
            "  {n:>8}  {:>5.1}%  {op}",
            100.0 * n as f64 / total.max(1) as f64
        )?;
    }
    let mut busiest: Vec<_> = dirs.into_iter().collect();
    busiest.sort_by(|a, b| {
        let sum = |v: &[usize; 3]| v.iter().sum::<usize>();
        sum(&b.1).cmp(&sum(&a.1)).then(a.0.cmp(&b.0))
    });
    const SHOWN: usize = 15;
    writeln!(
        out,
        "  {:>8}  {:>8}  {:>8}  directory",
        "reads", "writes", "changes"
    )?;
    for (d, [r, w, c]) in busiest.iter().take(SHOWN) {
        writeln!(out, "  {r:>8}  {w:>8}  {c:>8}  {}", shown(d, cwd))?;
    }
    if busiest.len() > SHOWN {
        writeln!(out, "  ... {} more directories", busiest.len() - SHOWN)?;
    }
    Ok(())
}
