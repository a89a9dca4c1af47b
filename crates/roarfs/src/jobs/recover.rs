//! The jobs of a mount daemon that died, rebuilt from their journals.

use roar_engine::journal::Record;
use roar_engine::{Event, Judge};
use roar_store::{JobRecord, Outcome};

use super::{context, record, steps, Steps};

/// A job of a mount daemon that died, rebuilt from its journal's records through the same rule
/// and step log the daemon had; `read_files`: the mount is gone, and outputs whose content the
/// daemon never saw are hashed from their files. None when the journal holds no header or the job touched
/// no recorded path. Its status is `killed`, ended at `last_ns` (the journal's last write),
/// unless the daemon saw its root process end (then it ended, and only its recording was lost).
pub fn recover(
    records: Vec<Record>,
    steps: &Steps,
    last_ns: i64,
    read_files: bool,
) -> Option<JobRecord> {
    let mut header: Option<JobRecord> = None;
    let mut rules = roar_engine::Rules::default();
    let mut log = steps::Log::default();
    let mut root_gone = false;
    let judge = Judge::Globs(steps.ignore);
    for r in records {
        match r {
            Record::Job(j) => header = Some(*j),
            Record::RootGone => root_gone = true,
            Record::Step(ev) => {
                // The kernel's report of the root's exit, read before the daemon died.
                let root = header
                    .as_ref()
                    .and_then(|h| h.processes.first())
                    .map(|p| p.pid);
                root_gone |= matches!(ev, Event::Exit { pid, .. } if Some(pid) == root);
                log.push(ev)
            }
            other => {
                let started = header.as_ref()?.started_ns;
                rules.replay(&context(&judge, started), &other);
                if let Record::Event(ev) = other {
                    log.push(ev);
                }
            }
        }
    }
    let header = header?;
    if rules.is_empty() {
        return None;
    }
    let job = record(header, rules, &log, steps, read_files);
    Some(JobRecord {
        ended_ns: Some(last_ns.max(job.started_ns)),
        outcome: if root_gone {
            Outcome::Ended
        } else {
            Outcome::Killed
        },
        incomplete: !root_gone,
        ..job
    })
}
