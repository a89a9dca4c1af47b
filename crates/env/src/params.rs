//! A job's parameters, read from its argv: `--lr 0.1`, `--lr=0.1`, `-n 5`, Hydra-style
//! `lr=0.1` / `+model.depth=4` / `~key`, and bare flags (`--amp`: `true`). What is left is
//! positional (`train.py`, `data/`), numbered by position.
//!
//! Derived when asked, never stored: every job ever recorded has parameters, and a better parser
//! improves old records too. `roar diff` reports them first; exports carry them as a facet.

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Param {
    /// As written, without leading dashes (`lr`, `model.depth`); positional ones are `#1`, `#2`...
    pub name: String,
    pub value: String,
}

/// Keys compare without regard to `-` versus `_` (`--learning-rate` is `--learning_rate`).
pub fn same_key(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .all(|(x, y)| x == y || (matches!(x, b'-' | b'_') && matches!(y, b'-' | b'_')))
}

fn is_value(s: &str) -> bool {
    !s.starts_with('-') || s.parse::<f64>().is_ok()
}

fn hydra_key(k: &str) -> bool {
    let k = k.trim_start_matches(['+', '~']);
    let mut chars = k.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | '@'))
}

/// Where a parameter's value is in the arguments: the whole argument `i`, the end of argument `i`
/// after `prefix` bytes (`--lr=0.1`, `lr=0.1`, `-n5`), or nowhere (a bare flag: `--amp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Whole(usize),
    After(usize, usize),
    Flag(usize),
}

/// The parameters in `args` (the arguments after the program; for an interpreter running a
/// script, after the script too: `python train.py --lr 0.1` has `#1 = train.py` and `lr`).
pub fn parse(args: &[String]) -> Vec<Param> {
    parse_slots(args).into_iter().map(|(p, _)| p).collect()
}

/// [`parse`], with where each value is.
pub fn parse_slots(args: &[String]) -> Vec<(Param, Slot)> {
    let mut out = Vec::new();
    let mut push = |name: &str, value: &str, slot: Slot| {
        out.push((
            Param {
                name: name.into(),
                value: value.into(),
            },
            slot,
        ))
    };
    let mut positional = 0;
    let mut i = 0;
    let mut only_positional = false;
    // The value of an option, if the next argument is one (it is then consumed).
    let takes_value = |i: &mut usize, bare_pairs_too: bool| -> Option<(usize, String)> {
        let next = args.get(*i)?;
        (is_value(next) && (bare_pairs_too || !next.contains('='))).then(|| {
            *i += 1;
            (*i - 1, next.clone())
        })
    };
    let slot_of = |v: &Option<(usize, String)>, at: usize| match v {
        Some((k, _)) => Slot::Whole(*k),
        None => Slot::Flag(at),
    };
    while i < args.len() {
        let at = i;
        let a = &args[i];
        i += 1;
        if only_positional {
            positional += 1;
            push(&format!("#{positional}"), a, Slot::Whole(at));
            continue;
        }
        if a == "--" {
            only_positional = true;
            continue;
        }
        if let Some(body) = a.strip_prefix("--").filter(|b| !b.is_empty()) {
            match body.split_once('=') {
                Some((k, v)) => push(k, v, Slot::After(at, a.len() - v.len())),
                None => {
                    let v = takes_value(&mut i, false);
                    let value = v.as_ref().map_or("true", |(_, v)| v.as_str());
                    push(body, value, slot_of(&v, at));
                }
            }
            continue;
        }
        if let Some(body) = a
            .strip_prefix('-')
            .filter(|b| !b.is_empty() && a.parse::<f64>().is_err())
        {
            let mut chars = body.chars();
            let first = chars.next().expect("not empty");
            let rest = chars.as_str();
            if !rest.is_empty() && first.is_ascii_alphabetic() && rest.parse::<f64>().is_ok() {
                // `-n5`
                push(
                    &first.to_string(),
                    rest,
                    Slot::After(at, a.len() - rest.len()),
                );
            } else {
                let v = (body.len() == 1)
                    .then(|| takes_value(&mut i, true))
                    .flatten();
                let value = v.as_ref().map_or("true", |(_, v)| v.as_str());
                push(body, value, slot_of(&v, at));
            }
            continue;
        }
        if let Some((k, v)) = a.split_once('=').filter(|(k, _)| hydra_key(k)) {
            push(k, v, Slot::After(at, a.len() - v.len()));
            continue;
        }
        if let Some(k) = a.strip_prefix('~').filter(|k| hydra_key(k)) {
            push(&format!("~{k}"), "deleted", Slot::Flag(at));
            continue;
        }
        positional += 1;
        push(&format!("#{positional}"), a, Slot::Whole(at));
    }
    out
}

/// `argv` with parameter `key` (as [`of_argv`] names it; `-` and `_` alike) set to `value`.
/// Err: why not (no such parameter, or a bare flag, which has no value to change).
pub fn set_in_argv(argv: &[String], key: &str, value: &str) -> Result<Vec<String>, String> {
    let start = interpreter_options_end(argv);
    let (_, slot) = parse_slots(&argv[start..])
        .into_iter()
        .find(|(p, _)| same_key(&p.name, key))
        .ok_or_else(|| format!("the command has no parameter {key}"))?;
    let mut out = argv.to_vec();
    match slot {
        Slot::Whole(i) => out[start + i] = value.to_owned(),
        Slot::After(i, prefix) => out[start + i] = format!("{}{value}", &argv[start + i][..prefix]),
        Slot::Flag(_) => {
            return Err(format!(
                "{key} is a flag without a value in the command; edit the command instead"
            ))
        }
    }
    Ok(out)
}

/// The parameters of a job's argv: the program itself is not one; for an interpreter the
/// interpreter's own options before the script are not either (`python -u train.py --lr 0.1`).
pub fn of_argv(argv: &[String]) -> Vec<Param> {
    if argv.is_empty() {
        return Vec::new();
    }
    parse(&argv[interpreter_options_end(argv)..])
}

/// The argv without its named parameters: a name for the job that stays the same when only
/// parameter values change (`python -u train.py --lr 0.1 data/` -> `python -u train.py data/`).
pub fn stable_name(argv: &[String]) -> Vec<String> {
    let Some(prog) = argv.first() else {
        return Vec::new();
    };
    let start = interpreter_options_end(argv);
    let mut out: Vec<String> = argv[..start].to_vec();
    if out.is_empty() {
        out.push(prog.clone());
    }
    out.extend(
        parse(&argv[start..])
            .into_iter()
            .filter(|p| p.name.starts_with('#'))
            .map(|p| p.value),
    );
    out
}

/// The name a job's runs go by: its `--name`, else its default name.
pub fn run_name(name: Option<&str>, argv: &[String]) -> Option<String> {
    name.map(str::to_owned).or_else(|| default_name(argv))
}

/// The name a job goes by without `--name`: its script's or module's (`python train.py` and
/// `python -m pkg.train` → `train`, `bash pipeline.sh` → `pipeline`, `uv run train.py` →
/// `train`), else its program's (`make`, `./prep.sh` → `prep`). None for a command line given to
/// a shell (`sh -c '...'`), which has no name of its own.
pub fn default_name(argv: &[String]) -> Option<String> {
    let prog = argv.first()?;
    let base = |s: &str| -> String {
        let file = s.rsplit('/').next().unwrap_or(s);
        let stem = match file.rsplit_once('.') {
            Some((stem, ext)) if !stem.is_empty() && !ext.is_empty() => stem,
            _ => file,
        };
        stem.to_owned()
    };
    let prog_base = prog.rsplit('/').next().unwrap_or(prog);
    if prog_base == "uv" && argv.get(1).is_some_and(|a| a == "run") {
        return default_name(&argv[2..]);
    }
    let start = interpreter_options_end(argv);
    if !is_interpreter(prog) || start >= argv.len() {
        return (!prog_base.is_empty()).then(|| base(prog));
    }
    if start > 1 && argv[start - 1] == "-c" {
        return None;
    }
    if argv[start] == "-m" {
        let module = argv.get(start + 1)?;
        return Some(module.rsplit('.').next().unwrap_or(module).to_owned());
    }
    Some(base(&argv[start]))
}

/// Whether `prog` runs a script or module named in its arguments.
fn is_interpreter(prog: &str) -> bool {
    let base = prog.rsplit('/').next().unwrap_or(prog);
    [
        "python", "node", "ruby", "Rscript", "bash", "sh", "perl", "uv", "torchrun",
    ]
    .iter()
    .any(|k| base.starts_with(k))
}

/// Where the arguments that are the job's own begin: after the program, and for an interpreter
/// after its own options (`-m` stays: the module is the job's first argument).
fn interpreter_options_end(argv: &[String]) -> usize {
    let Some(prog) = argv.first() else {
        return 0;
    };
    let mut start = 1;
    if is_interpreter(prog) {
        while start < argv.len() && argv[start].starts_with('-') && argv[start] != "-m" {
            start += 1;
        }
    }
    start.min(argv.len())
}

/// One parameter that differs between two jobs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParamChange {
    pub name: String,
    pub a: Option<String>,
    pub b: Option<String>,
}

/// The parameters that differ, in A's order then B's new ones.
pub fn compare(a: &[Param], b: &[Param]) -> Vec<ParamChange> {
    let mut out = Vec::new();
    for p in a {
        let other = b.iter().find(|q| same_key(&q.name, &p.name));
        if other.map(|q| &q.value) != Some(&p.value) {
            out.push(ParamChange {
                name: p.name.clone(),
                a: Some(p.value.clone()),
                b: other.map(|q| q.value.clone()),
            });
        }
    }
    for q in b {
        if !a.iter().any(|p| same_key(&p.name, &q.name)) {
            out.push(ParamChange {
                name: q.name.clone(),
                a: None,
                b: Some(q.value.clone()),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_come_from_the_script_or_the_program() {
        let name = |a: &[&str]| default_name(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            name(&["python3", "-u", "train.py", "--lr", "0.1"]).as_deref(),
            Some("train")
        );
        assert_eq!(
            name(&["/usr/bin/python3", "-m", "pkg.evaluate"]).as_deref(),
            Some("evaluate")
        );
        assert_eq!(name(&["bash", "pipeline.sh"]).as_deref(), Some("pipeline"));
        assert_eq!(name(&["uv", "run", "src/prep.py"]).as_deref(), Some("prep"));
        assert_eq!(name(&["./prep.sh", "x"]).as_deref(), Some("prep"));
        assert_eq!(name(&["make", "-j2"]).as_deref(), Some("make"));
        assert_eq!(name(&["sh", "-c", "make all"]), None);
    }

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    fn pairs(ps: &[Param]) -> Vec<(String, String)> {
        ps.iter()
            .map(|p| (p.name.clone(), p.value.clone()))
            .collect()
    }

    #[test]
    fn a_parameter_is_set_where_it_is_written() {
        let argv = v(&[
            "python3",
            "-u",
            "train.py",
            "--lr",
            "0.1",
            "--epochs=5",
            "-n3",
            "model.depth=4",
            "data/",
            "--amp",
        ]);
        let set = |k: &str, x: &str| set_in_argv(&argv, k, x);
        assert_eq!(set("lr", "0.2").unwrap()[4], "0.2");
        assert_eq!(set("epochs", "7").unwrap()[5], "--epochs=7");
        assert_eq!(set("n", "4").unwrap()[6], "-n4");
        assert_eq!(set("model.depth", "8").unwrap()[7], "model.depth=8");
        assert_eq!(set("#2", "other/").unwrap()[8], "other/");
        assert!(set("amp", "false").is_err());
        assert!(set("batch", "8").is_err());
        // Only the one value changes.
        let out = set("lr", "0.2").unwrap();
        assert_eq!(out.iter().zip(&argv).filter(|(a, b)| a != b).count(), 1);
    }

    #[test]
    fn styles() {
        let p = of_argv(&v(&[
            "python3",
            "-u",
            "train.py",
            "--lr",
            "0.1",
            "--epochs=5",
            "-n",
            "3",
            "--amp",
            "model.depth=4",
            "+trainer.gpus=2",
            "--shift",
            "-1",
            "data/",
        ]));
        assert_eq!(
            pairs(&p),
            vec![
                ("#1".into(), "train.py".into()),
                ("lr".into(), "0.1".into()),
                ("epochs".into(), "5".into()),
                ("n".into(), "3".into()),
                ("amp".into(), "true".into()),
                ("model.depth".into(), "4".into()),
                ("+trainer.gpus".into(), "2".into()),
                ("shift".into(), "-1".into()),
                ("#2".into(), "data/".into()),
            ]
        );
    }

    #[test]
    fn flags_before_flags_and_dash_dash() {
        let p = of_argv(&v(&[
            "tool",
            "--verbose",
            "--out",
            "x",
            "--",
            "--not-a-flag",
        ]));
        assert_eq!(
            pairs(&p),
            vec![
                ("verbose".into(), "true".into()),
                ("out".into(), "x".into()),
                ("#1".into(), "--not-a-flag".into()),
            ]
        );
    }

    #[test]
    fn names_without_parameter_values() {
        assert_eq!(
            stable_name(&v(&["python3", "-u", "train.py", "--lr", "0.1", "data/"])),
            v(&["python3", "-u", "train.py", "data/"])
        );
        assert_eq!(
            stable_name(&v(&["make", "-j2", "all"])),
            v(&["make", "all"])
        );
    }

    #[test]
    fn changes_rank_by_name() {
        let a = of_argv(&v(&[
            "python",
            "t.py",
            "--learning-rate",
            "0.1",
            "--seed",
            "1",
        ]));
        let b = of_argv(&v(&[
            "python",
            "t.py",
            "--learning_rate",
            "0.01",
            "--seed",
            "1",
            "--amp",
        ]));
        let c = compare(&a, &b);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].name, "learning-rate");
        assert_eq!(c[0].a.as_deref(), Some("0.1"));
        assert_eq!(c[0].b.as_deref(), Some("0.01"));
        assert_eq!(c[1].name, "amp");
        assert_eq!(c[1].a, None);
    }
}
