//! `roar hash`: b3sum-style output, hashes recorded in the cache and as artifacts.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use roar_store::hash::{hash_paths, HashOptions, Prior};
use roar_store::{Store, Writer};
use serde::Serialize;

use crate::config::Config;

#[derive(Serialize)]
struct Line<'a> {
    path: String,
    #[serde(flatten)]
    hash: &'a roar_store::ContentHash,
}

pub fn hash(paths: &[PathBuf], sha256: bool, json: bool) -> anyhow::Result<()> {
    let project = crate::project()?;
    let config = Config::load(&project)?;
    let opts = HashOptions {
        sha256: sha256 || config.sha256(),
    };
    let mut files = Vec::new();
    for p in paths {
        expand(p, &mut files)?;
    }
    let store = Store::open(&project.db_path())?;
    let total: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let bar = Progress::new(total);
    let batch = hash_paths(
        &files,
        opts,
        &|_| Prior::MayBeCached,
        &|| Some(store.conn()),
        &|n| bar.inc(n),
    );
    bar.finish();

    let writer = Writer::start(&project.db_path())?;
    writer.cache(batch.new_cache)?;
    let mut out = std::io::stdout().lock();
    let mut hashes = Vec::new();
    let mut lines = Vec::new();
    let mut failed = 0;
    for (path, result) in files.iter().zip(batch.results) {
        match result {
            Ok(h) => {
                if json {
                    lines.push((path.to_string_lossy().into_owned(), h.hash.clone()));
                } else if let Some(s) = &h.hash.sha256 {
                    writeln!(out, "{}  {}  {}", h.hash.blake3, s, path.display())?;
                } else {
                    writeln!(out, "{}  {}", h.hash.blake3, path.display())?;
                }
                hashes.push(h.hash);
            }
            Err(e) => {
                failed += 1;
                eprintln!("roar: {:#}", anyhow::Error::from(e));
            }
        }
    }
    if json {
        let v: Vec<Line> = lines
            .iter()
            .map(|(path, hash)| Line {
                path: path.clone(),
                hash,
            })
            .collect();
        crate::fmt::print_json(&v)?;
    }
    writer.artifacts(hashes)?;
    writer.flush()?;
    if failed > 0 {
        anyhow::bail!("{failed} of {} files could not be hashed", files.len());
    }
    Ok(())
}

fn expand(path: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot hash {}", path.display()))?;
    if !meta.is_dir() {
        out.push(path.to_owned());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("cannot list {}", path.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("cannot list {}", path.display()))?;
    entries.sort();
    for e in entries {
        if e.file_name().is_some_and(|n| n == roar_store::DIR_NAME) {
            continue;
        }
        expand(&e, out)?;
    }
    Ok(())
}

/// A progress bar on stderr that appears only once hashing has taken a second, and only on a terminal.
struct Progress {
    bar: ProgressBar,
    start: Instant,
    shown: std::sync::atomic::AtomicBool,
    tty: bool,
}

impl Progress {
    fn new(total: u64) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template(
            "{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}",
        ) {
            bar.set_style(style);
        }
        Progress {
            bar,
            start: Instant::now(),
            shown: false.into(),
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn inc(&self, n: u64) {
        self.bar.inc(n);
        use std::sync::atomic::Ordering;
        if self.tty
            && self.start.elapsed() > Duration::from_secs(1)
            && !self.shown.swap(true, Ordering::Relaxed)
        {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
