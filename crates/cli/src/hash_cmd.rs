//! `roar hash`: b3sum-style output, hashes recorded in the cache and as artifacts.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    let unlisted: usize = paths.iter().map(|p| expand(p, true, &mut files)).sum();
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
    if failed + unlisted > 0 {
        anyhow::bail!(
            "{} of {} entries could not be hashed (listed above); the others were",
            failed + unlisted,
            files.len() + unlisted
        );
    }
    Ok(())
}

/// Collects the files under `path`, reporting what cannot be read (a symlink loop, a directory
/// without permission) on stderr and going on. Arguments are followed if they are symlinks;
/// symlinks met inside a directory are hashed when they lead to a file and not followed into
/// directories (a loop cannot recurse). Returns how many entries could not be listed.
fn expand(path: &Path, top: bool, out: &mut Vec<PathBuf>) -> usize {
    let meta = if top {
        std::fs::metadata(path)
    } else {
        std::fs::symlink_metadata(path).and_then(|m| {
            if m.file_type().is_symlink() {
                std::fs::metadata(path).map(|t| if t.is_dir() { m } else { t })
            } else {
                Ok(m)
            }
        })
    };
    let meta = match meta {
        Ok(m) => m,
        Err(e) => {
            eprintln!("roar: cannot hash {}: {e}", path.display());
            return 1;
        }
    };
    if meta.file_type().is_symlink() {
        // A symlink to a directory inside the walk: listed, not followed.
        eprintln!(
            "roar: skipped {}: a symbolic link to a directory (name it to hash what it points to)",
            path.display()
        );
        return 0;
    }
    if !meta.is_dir() {
        out.push(path.to_owned());
        return 0;
    }
    let entries = std::fs::read_dir(path).and_then(|d| {
        d.map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<Vec<PathBuf>>>()
    });
    let mut entries = match entries {
        Ok(e) => e,
        Err(e) => {
            eprintln!("roar: cannot list {}: {e}", path.display());
            return 1;
        }
    };
    entries.sort();
    entries
        .iter()
        .filter(|e| e.file_name().is_none_or(|n| n != roar_store::DIR_NAME))
        .map(|e| expand(e, false, out))
        .sum()
}

/// A progress bar on stderr that appears only once hashing has taken a second, and only on a terminal.
pub(crate) struct Progress {
    bar: ProgressBar,
    start: Instant,
    shown: std::sync::atomic::AtomicBool,
    tty: bool,
}

impl Progress {
    pub(crate) fn new(total: u64) -> Progress {
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

    pub(crate) fn inc(&self, n: u64) {
        self.bar.inc(n);
        self.show_if_slow();
    }

    /// Moves the bar to `pos` (of the total).
    pub(crate) fn set(&self, pos: u64) {
        self.bar.set_position(pos);
        self.show_if_slow();
    }

    fn show_if_slow(&self) {
        use std::sync::atomic::Ordering;
        if self.tty
            && self.start.elapsed() > Duration::from_secs(1)
            && !self.shown.swap(true, Ordering::Relaxed)
        {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
