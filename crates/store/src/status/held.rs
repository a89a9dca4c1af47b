//! Who holds what: from the last records and last writers of the locations a status plan
//! judges, the outputs each job (or step) still holds, and every node that takes part.

use std::collections::{BTreeMap, HashMap};

use super::{Last, Node, Writers};

/// The steps of the jobs a plan judges (see `Store::steps_among`).
pub(super) struct StepsOf {
    pub final_step: HashMap<(i64, String), u32>,
    pub seqs: HashMap<i64, Vec<u32>>,
}

/// The outputs each node still holds.
pub(super) type Held = BTreeMap<Node, Vec<String>>;

/// The last writer of each location (the node, the content it left).
pub(super) type Made = HashMap<String, (Node, String)>;

/// The outputs each last writer (or its step) still holds, every last writer and every step of
/// one among them; and the last writer of each location with the content it left.
pub(super) fn held_outputs(
    last: &HashMap<String, Last>,
    writers: Writers,
    steps: &StepsOf,
) -> (Held, Made) {
    let StepsOf { final_step, seqs } = steps;
    // The last writer of each location that still holds what it wrote (as far as the
    // store knows: no later record shows other content there).
    let mut outputs: BTreeMap<Node, Vec<String>> = BTreeMap::new();
    let mut made = HashMap::new();
    for (path, job, blake3) in writers {
        let held = last
            .get(&path)
            .is_some_and(|l| !l.gone && l.hash.as_ref().is_some_and(|h| h.blake3 == blake3));
        let node = (job, final_step.get(&(job, path.clone())).copied());
        if held {
            outputs.entry(node).or_default().push(path.clone());
        }
        made.insert(path, (node, blake3));
    }
    // Every last writer takes part, even one whose outputs were all moved on: a change
    // upstream of it goes through it to the jobs that read what it made; so does every
    // step of such a job (a change goes from step to step inside it).
    for (node, _) in made.values() {
        outputs.entry(*node).or_default();
    }
    let jobs_with_steps: Vec<i64> = outputs
        .keys()
        .map(|(job, _)| *job)
        .filter(|job| seqs.contains_key(job))
        .collect();
    for job in jobs_with_steps {
        for &seq in &seqs[&job] {
            outputs.entry((job, Some(seq))).or_default();
        }
        // Outputs no step is known to have left stay with the step that is the job.
        let whole = outputs.remove(&(job, None)).unwrap_or_default();
        outputs.entry((job, Some(1))).or_default().extend(whole);
    }
    for (node, _) in made.values_mut() {
        if node.1.is_none() && seqs.contains_key(&node.0) {
            node.1 = Some(1);
        }
    }
    (outputs, made)
}
