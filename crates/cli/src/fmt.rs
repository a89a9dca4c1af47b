//! Text rendering shared by the commands: times, sizes, hashes, paths, colour.

use std::io::IsTerminal;
use std::path::Path;

use roar_store::ContentHash;

/// Digits of a blake3 hash shown in tables; `roar show` accepts any prefix of at least 4.
pub const SHORT_HASH: usize = 12;

pub fn short_hash(h: &ContentHash) -> String {
    h.blake3[..SHORT_HASH.min(h.blake3.len())].to_owned()
}

/// Colour only when stdout is a terminal and NO_COLOR is unset (https://no-color.org).
pub fn color() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && std::io::stdout().is_terminal()
}

pub fn bold(s: &str) -> String {
    if color() {
        format!("\x1b[1m{s}\x1b[0m")
    } else {
        s.to_owned()
    }
}

pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

pub fn duration_ns(ns: i64) -> String {
    let s = ns as f64 / 1e9;
    if s < 1.0 {
        format!("{:.1} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

/// A UTC timestamp, `YYYY-MM-DD HH:MM:SS`, without a date library.
pub fn time_ns(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A stored absolute path shown relative to `base` when it is inside it, with control
/// characters escaped (see [`roar_store::quote`]).
pub fn rel(path: &str, base: &Path) -> String {
    shown(&rel_exact(path, base)).into_owned()
}

/// [`rel`] unescaped, for JSON.
pub fn rel_exact(path: &str, base: &Path) -> String {
    match Path::new(path).strip_prefix(base) {
        Ok(p) if !p.as_os_str().is_empty() => p.to_string_lossy().into_owned(),
        _ => path.to_owned(),
    }
}

/// A recorded string (name, cwd, value) for the terminal.
pub fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    roar_store::shown(s)
}

/// A recorded argv for the terminal: as bash would need it typed, control bytes escaped.
pub fn argv(argv: &[String]) -> String {
    argv.iter()
        .map(|a| roar_store::shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn status(status: &str, exit_code: Option<i32>, signal: Option<i32>) -> String {
    match (status, exit_code, signal) {
        ("exited", Some(c), _) => format!("exit {c}"),
        ("signaled", _, Some(s)) => format!("signal {s}"),
        ("failed_to_start", ..) => "not started".to_owned(),
        (other, ..) => other.to_owned(),
    }
}

pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    roar_store::quote::write_json(&mut out, value, true)?;
    use std::io::Write;
    writeln!(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_times() {
        assert_eq!(super::time_ns(0), "1970-01-01 00:00:00");
        assert_eq!(
            super::time_ns(1_795_219_200_000_000_000),
            "2026-11-21 00:00:00"
        );
        assert_eq!(
            super::time_ns(951_825_600_000_000_000),
            "2000-02-29 12:00:00"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(super::size(12), "12 B");
        assert_eq!(super::size(1536), "1.5 KiB");
        assert_eq!(super::size(1 << 30), "1.0 GiB");
    }
}
