//! A recorded step's command as it can run again: its argv with each secret roar redacted taken
//! from a slot variable (`ROAR_SECRET_N`), and its standard streams that were files opened again
//! around it. `roar reproduce` writes it into its script and runs it with `--run`.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use roar_store::quote::script_word;
use roar_store::redact::REDACTED;
use roar_store::Step;

/// For a step whose standard streams were files opened for it (`wc -l t > report.txt` in a
/// script), the `sh -c` program that opens them again around its argv, which follows it as `$0`
/// and `$@` (so the argv is passed word for word, secrets' slots included). The files are opened
/// inside the re-run job, which records them like the original.
pub(crate) fn redirecting(streams: &[roar_store::Stream]) -> Option<Vec<u8>> {
    if streams.is_empty() {
        return None;
    }
    let mut program = b"exec \"$0\" \"$@\"".to_vec();
    for s in streams {
        program.push(b' ');
        program.extend_from_slice(s.operator().as_bytes());
        program.push(b' ');
        program.extend(script_word(s.path.as_bytes()));
    }
    Some(program)
}

/// The name of the `n`th secret slot (1-based in what users see).
fn slot_var(n: usize) -> String {
    format!("ROAR_SECRET_{}", n + 1)
}

/// Each argument of a step split around the secrets roar redacted from it.
pub(crate) fn pieces(arg: &OsStr) -> Vec<&[u8]> {
    let b = arg.as_bytes();
    let mut out = Vec::new();
    let mut rest = b;
    while let Some(at) = rest
        .windows(REDACTED.len())
        .position(|w| w == REDACTED.as_bytes())
    {
        out.push(&rest[..at]);
        rest = &rest[at + REDACTED.len()..];
    }
    out.push(rest);
    out
}

/// A step's argv as `sh` words, each redacted secret replaced by its slot variable.
pub(crate) fn script_argv(s: &Step, slot: &mut usize) -> Vec<u8> {
    let mut line = Vec::new();
    for (k, arg) in s.argv.iter().enumerate() {
        if k > 0 {
            line.push(b' ');
        }
        let parts = pieces(arg);
        if parts.len() == 1 {
            line.extend(script_word(arg.as_bytes()));
            continue;
        }
        for (i, part) in parts.iter().enumerate() {
            if !part.is_empty() {
                line.extend(script_word(part));
            }
            if i + 1 < parts.len() {
                let var = slot_var(*slot);
                *slot += 1;
                line.extend(
                    format!(
                        "\"${{{var}:?is a secret roar redacted from argument {k} of job {}: set it}}\"",
                        s.job_id
                    )
                    .bytes(),
                );
            }
        }
    }
    line
}

/// A step's argv for `--run`, each redacted secret taken from its slot variable.
pub(crate) fn supplied(s: &Step, slot: &mut usize) -> anyhow::Result<Vec<OsString>> {
    let mut argv = Vec::with_capacity(s.argv.len());
    let mut missing = Vec::new();
    for (k, arg) in s.argv.iter().enumerate() {
        let parts = pieces(arg);
        let mut out = parts[0].to_vec();
        for part in &parts[1..] {
            let var = slot_var(*slot);
            *slot += 1;
            match std::env::var_os(&var) {
                Some(v) => out.extend_from_slice(v.as_bytes()),
                None => missing.push(format!("{var} (argument {k})")),
            }
            out.extend_from_slice(part);
        }
        argv.push(OsString::from_vec(out));
    }
    anyhow::ensure!(
        missing.is_empty(),
        "job {} had secrets roar redacted; supply them in the environment: {}",
        s.job_id,
        missing.join(", ")
    );
    Ok(argv)
}
