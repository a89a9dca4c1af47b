//! `roar diff` at step level: the steps of two jobs paired, and what differs in each pair.
//!
//! Steps are paired (root steps aside: they are the jobs themselves) first by identical command
//! and directory, in order — a Makefile's recipes, whatever order `make -j` ran them in — then,
//! among those left, by program in order (`train.py --lr 0.1` with `train.py --lr 0.01`). What is
//! left over was only in A or only in B. A pair differs when its command, an input's content or
//! an output's content does.

use std::collections::BTreeMap;
use std::path::Path;

use roar_store::{ContentHash, StepDetail, StepEdge};
use serde::Serialize;

use crate::changes::{compare, Change, FileChange};

/// Whether two steps are the same step of their jobs, by one pass's criterion.
type Pairing = dyn Fn(&StepDetail, &StepDetail) -> bool;

#[derive(Serialize)]
pub(crate) struct StepChange {
    /// changed | added (only in B) | removed (only in A)
    pub change: &'static str,
    /// The step's number in A's job and in B's.
    pub a: Option<u32>,
    pub b: Option<u32>,
    /// Its command (B's, when it is in both).
    pub command: Vec<String>,
    pub argv: Option<Change<Vec<String>>>,
    pub inputs: Vec<FileChange>,
    pub outputs: Vec<FileChange>,
}

fn argv(s: &StepDetail) -> Vec<String> {
    s.argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// The program a step ran, by name: its exe, else its argv[0].
fn program(s: &StepDetail) -> Option<String> {
    let name = |p: &str| {
        Path::new(p)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
    };
    s.exe
        .as_deref()
        .and_then(name)
        .or_else(|| s.argv.first().and_then(|a| name(&a.to_string_lossy())))
}

fn edges(e: &[StepEdge]) -> BTreeMap<String, Option<ContentHash>> {
    e.iter().map(|f| (f.path.clone(), f.hash.clone())).collect()
}

/// The steps of A's and B's jobs that differ, B's order first then what only A had, and how
/// many pairs are the same. Nothing when either job is one step (it has no step rows).
pub(crate) fn compare_steps(a: &[StepDetail], b: &[StepDetail]) -> (Vec<StepChange>, usize) {
    if a.is_empty() || b.is_empty() {
        return (Vec::new(), 0);
    }
    let (a, b) = (&a[1..], &b[1..]);
    let mut pair_of_b: Vec<Option<usize>> = vec![None; b.len()];
    let mut paired_a = vec![false; a.len()];
    let same_command = |x: &StepDetail, y: &StepDetail| x.argv == y.argv && x.cwd == y.cwd;
    let same_program =
        |x: &StepDetail, y: &StepDetail| program(x).is_some() && program(x) == program(y);
    let passes: [&Pairing; 2] = [&same_command, &same_program];
    for same in passes {
        for (i, sa) in a.iter().enumerate() {
            if paired_a[i] {
                continue;
            }
            if let Some(j) = (0..b.len()).find(|&j| pair_of_b[j].is_none() && same(sa, &b[j])) {
                pair_of_b[j] = Some(i);
                paired_a[i] = true;
            }
        }
    }
    let mut changes = Vec::new();
    let mut same = 0;
    for (j, sb) in b.iter().enumerate() {
        let Some(i) = pair_of_b[j] else {
            changes.push(StepChange {
                change: "added",
                a: None,
                b: Some(sb.seq),
                command: argv(sb),
                argv: None,
                inputs: Vec::new(),
                outputs: Vec::new(),
            });
            continue;
        };
        let sa = &a[i];
        let (inputs, _) = compare(&edges(&sa.inputs), &edges(&sb.inputs));
        let (outputs, _) = compare(&edges(&sa.outputs), &edges(&sb.outputs));
        let argv_change = (sa.argv != sb.argv).then(|| Change {
            a: argv(sa),
            b: argv(sb),
        });
        if argv_change.is_none() && inputs.is_empty() && outputs.is_empty() {
            same += 1;
            continue;
        }
        changes.push(StepChange {
            change: "changed",
            a: Some(sa.seq),
            b: Some(sb.seq),
            command: argv(sb),
            argv: argv_change,
            inputs,
            outputs,
        });
    }
    for (sa, _) in a.iter().zip(&paired_a).filter(|(_, paired)| !**paired) {
        changes.push(StepChange {
            change: "removed",
            a: Some(sa.seq),
            b: None,
            command: argv(sa),
            argv: None,
            inputs: Vec::new(),
            outputs: Vec::new(),
        });
    }
    (changes, same)
}
