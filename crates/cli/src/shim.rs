//! Where `roar run` finds the preload shim: `ROAR_PRELOAD_LIB`; else a shim installed beside the
//! binary (`libroar_preload.so` next to it, in `../lib/roar/` or `../lib/`); else the copy built
//! into the binary (crates/cli/build.rs), written once to the user's cache directory under a name
//! that carries its content hash (computed at build time), so a newer roar never loads an older
//! shim.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

static EMBEDDED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libroar_preload.so"));

/// Where the shim comes from, for `roar --version` and `roar tracer check`.
pub enum Source {
    Env(PathBuf),
    Beside(PathBuf),
    Embedded(PathBuf),
    Missing,
}

fn installed() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    // current_exe is the resolved path (/proc/self/exe): its parent's parent is `..` exactly.
    let dir = exe.parent()?;
    let prefix = dir.parent().unwrap_or(dir);
    [
        dir.join("libroar_preload.so"),
        prefix.join("lib/roar/libroar_preload.so"),
        prefix.join("lib/libroar_preload.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// `$XDG_CACHE_HOME/roar` or `~/.cache/roar`, and the file name the embedded shim has there.
fn embedded_path() -> Option<PathBuf> {
    if EMBEDDED.is_empty() {
        return None;
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(
        cache
            .join("roar")
            .join(concat!("libroar_preload-", env!("ROAR_SHIM_ID"), ".so")),
    )
}

/// Where the shim is, without writing anything.
pub fn source() -> Source {
    if let Some(p) = std::env::var_os("ROAR_PRELOAD_LIB") {
        return Source::Env(PathBuf::from(p));
    }
    if let Some(p) = installed() {
        return Source::Beside(p);
    }
    match embedded_path() {
        Some(p) => Source::Embedded(p),
        None => Source::Missing,
    }
}

/// The shim to preload; the embedded one is written out first if it is not there yet (an
/// existing file of the right size is trusted: its name is its content's hash).
pub fn path() -> Option<PathBuf> {
    match source() {
        Source::Env(p) | Source::Beside(p) => Some(p),
        Source::Missing => None,
        Source::Embedded(p) => {
            if std::fs::metadata(&p).is_ok_and(|m| m.len() == EMBEDDED.len() as u64) {
                return Some(p);
            }
            match write_out(&p) {
                Ok(()) => Some(p),
                Err(e) => {
                    tracing::warn!("cannot write the preload shim to {}: {e}", p.display());
                    None
                }
            }
        }
    }
}

/// Written to a temporary name and renamed, so a concurrent `roar run` never loads half a file.
fn write_out(p: &std::path::Path) -> std::io::Result<()> {
    let dir = p.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".shim-{}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(&tmp)?;
    f.write_all(EMBEDDED)?;
    f.sync_all()?;
    std::fs::rename(&tmp, p)
}

/// One line for `roar --version`.
pub fn describe() -> String {
    match source() {
        Source::Env(p) => format!("{} (ROAR_PRELOAD_LIB)", p.display()),
        Source::Beside(p) => format!("{} (installed)", p.display()),
        Source::Embedded(p) => format!(
            "built in ({} KiB), used from {}",
            EMBEDDED.len() / 1024,
            p.display()
        ),
        Source::Missing => "none: set ROAR_PRELOAD_LIB or install with scripts/install.sh".into(),
    }
}
