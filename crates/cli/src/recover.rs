//! Jobs whose recorder was killed: rebuilt from their journals (`roar_engine::journal`) by the
//! next roar command, through the same rule and hashing a finished run goes through, and recorded
//! `killed` in the row the job had while it ran (docs/SEMANTICS.md, "Crashes").
//!
//! A `roar run` journal holds the job's header, the ring's name, and every event its backend had
//! read; the ring and its late file hold what the shims wrote after that (they go on reporting
//! once roar is gone). While a process of the job still runs (under preload the command outlives
//! roar, and its events keep arriving) the journal is left for a later command.

use std::path::Path;
use std::sync::Arc;

use roar_engine::journal::{self, Journal, Orphan, Record};
use roar_store::{JobRecord, Outcome, Project, Store, Writer};
use roar_tracer::{collect, Event};

use crate::config::Config;

pub use roar_engine::journal::new_uid;

/// Where the run whose job is `job` keeps its events: its journal (named by the job's uid),
/// holding its header, redacted by the project's `[redact]` rules as the store would. Without a
/// journal (it cannot be made: a warning) the run goes on as durable as it was before journals.
pub fn run_keep(project: &Project, config: &Config, job: &JobRecord) -> Arc<roar_tracer::Keep> {
    let Some(uid) = job.uid.as_deref() else {
        return roar_tracer::Keep::none();
    };
    match Journal::create(&project.journal_dir(), uid, journal::Writer::Run) {
        Ok(j) => {
            let keep = roar_tracer::Keep::new(Arc::new(j), &project.config_path(), config.policy());
            // Written with the backend's set-up, which every backend commits before it starts
            // the command: one write fewer, and nothing observed before it.
            keep.job(job);
            keep
        }
        Err(e) => {
            tracing::warn!("no journal for this run ({e}): a roar killed now loses its events");
            roar_tracer::Keep::none()
        }
    }
}

/// Recovers every journal in the project whose writer is gone. Cheap when there is none: one
/// directory read.
pub fn pending(project: &Project) {
    let orphans = journal::orphans(&project.journal_dir());
    if orphans.is_empty() {
        return;
    }
    let config = Config::load(project).unwrap_or_default();
    let writer = match Writer::start(&project.db_path()) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("cannot open the store to recover killed jobs: {e}");
            return;
        }
    };
    for orphan in orphans {
        let result = match orphan.writer {
            journal::Writer::Run => run(project, &config, &writer, orphan),
            journal::Writer::Mount => mount(project, &config, &writer, orphan),
            journal::Writer::Gateway => gateway(project, &writer, orphan),
        };
        match result {
            Ok(Some(id)) => eprintln!(
                "roar: job {id} recovered from its journal: its recorder was killed before recording it (`roar show {id}`)"
            ),
            Ok(None) => {}
            Err(e) => eprintln!("roar: could not recover a killed job: {e:#}"),
        }
    }
    let _ = writer.flush();
}

/// What a run's journal holds.
struct RunJournal {
    job: Option<JobRecord>,
    ctime_floor_ns: i64,
    ring: Option<std::path::PathBuf>,
    ring_pos: u64,
    events: Vec<Event>,
    /// The S3 accesses of the run's own gateway.
    accesses: Vec<roar_gateway::Access>,
    /// Records that could not be read back (the job is then incomplete).
    unreadable: usize,
    /// Every process of the job was seen to end with nothing lost: by the run itself (killed
    /// after its command ended), or by the eBPF helper that followed the command after roar died.
    followed: bool,
}

fn read_run(records: Vec<Record>) -> RunJournal {
    let mut r = RunJournal {
        job: None,
        ctime_floor_ns: 0,
        ring: None,
        ring_pos: 0,
        events: Vec::new(),
        accesses: Vec::new(),
        unreadable: 0,
        followed: false,
    };
    for rec in records {
        match rec {
            // The last header wins: the one written once the command started holds its env.
            Record::Job(j) => r.job = Some(*j),
            Record::CtimeFloor(t) => r.ctime_floor_ns = t,
            Record::Ring { ring, .. } => r.ring = Some(ring),
            Record::RingPos(p) => r.ring_pos = p,
            Record::Event(e) => r.events.push(e),
            Record::RootGone => r.followed = true,
            Record::Extra(bytes) => match roar_gateway::sessions::access_of(&bytes) {
                Some(a) => r.accesses.push(a),
                None => r.unreadable += 1,
            },
            _ => {}
        }
    }
    r
}

/// Recovers one `roar run` journal; None when it has to wait (the command still runs) or the
/// job was recorded already.
fn run(
    project: &Project,
    config: &Config,
    writer: &Writer,
    mut orphan: Orphan,
) -> anyhow::Result<Option<i64>> {
    let mut j = read_run(std::mem::take(&mut orphan.records));
    let Some(mut job) = j.job.take() else {
        // Killed before its header was written: nothing ran yet.
        remove_run(orphan, None);
        return Ok(None);
    };
    let mut malformed = 0;
    if let Some(ring) = &j.ring {
        let (later, bad) = roar_tracer::left_behind(ring, j.ring_pos);
        j.events.extend(later);
        malformed = bad;
        if still_running(&j.events, ring) {
            return Ok(None);
        }
    }
    let (begun, done) = row_of(project, job.uid.as_deref())?;
    if done {
        remove_run(orphan, j.ring.as_deref());
        return Ok(None);
    }
    let store = Store::open(&project.db_path()).ok();
    // The environment is in the job's row (the journal never holds it), unless roar died before
    // the row was written: then it is unknown.
    if let Some(row) = begun.and_then(|id| store.as_ref()?.job(id).ok()) {
        job.env = row.env;
    }
    let ignore = roar_tracer::ignore::Ignore::new(&config.ignore);
    let classified = classify_job(&mut job, &j.events, j.ctime_floor_ns, &ignore, config);
    // The packages the job used, found as a finished run finds them (its machine, too).
    let shim = crate::shim::path();
    let wanted =
        crate::environment::wanted(&job, &classified, config.env.packages, shim.as_deref());
    let (mut cache, machine) = crate::environment::Prepared::take(None);
    crate::environment::resolve(
        job.environment.get_or_insert_default(),
        &wanted,
        &mut cache,
        &machine,
    );
    let opts = roar_store::hash::HashOptions {
        sha256: config.sha256(),
    };
    let cache = || store.as_ref().map(Store::conn);
    let mut files = Vec::new();
    // A recovered job keeps its versions as a finished one does.
    let mut versions = crate::keep::Rule::new(&config.keep, project);
    versions.learn_tracked(&classified);
    collect::hash(
        classified,
        opts,
        &cache,
        &Default::default(),
        versions.versions().as_ref(),
        &mut |chunk| files.extend(chunk.files),
    );
    job.files.extend(files);
    job.files.extend(roar_gateway::job_files(&j.accesses));
    job.ended_ns = Some(
        j.events
            .iter()
            .map(Event::ts_ns)
            .max()
            .unwrap_or(job.started_ns)
            .max(job.started_ns),
    );
    job.outcome = Outcome::Killed;
    // Under ptrace the command died with roar (unless roar died after it ended); under eBPF it
    // ran on unobserved unless the helper followed it to its end; under preload the shims kept
    // reporting, and only an event the ring or the late file could not take (a process that
    // cannot write them) is missing, counted as malformed.
    let followed = job.backend == "preload" || j.followed;
    job.incomplete = !followed || malformed > 0 || j.unreadable > 0;
    let id = writer.record_into(begun, job)?;
    remove_run(orphan, j.ring.as_deref());
    Ok(Some(id))
}

/// Recovers one job of a mount daemon that was killed; None when it has to wait (its mount is
/// still there, dead: `roar mount DIR` or `roar unmount DIR` clears it, and the files under it
/// are then read to hash what the daemon never saw the end of) or the job was recorded already.
fn mount(
    project: &Project,
    config: &Config,
    writer: &Writer,
    mut orphan: Orphan,
) -> anyhow::Result<Option<i64>> {
    let records = std::mem::take(&mut orphan.records);
    let dir = records.iter().find_map(|r| match r {
        Record::Mounted(dir) => Some(dir.clone()),
        _ => None,
    });
    if dir.as_deref().is_some_and(crate::mountinfo::is_dead) {
        return Ok(None);
    }
    // Mounted again already (this journal was still held when the new daemon started): its files
    // are not read through the new mount, which would record this roar as a job of it.
    let read_files = dir
        .as_deref()
        .is_some_and(|d| !crate::mountinfo::is_roarfs_mount(d));
    let uid = records.iter().find_map(|r| match r {
        Record::Job(j) => j.uid.clone(),
        _ => None,
    });
    let (begun, done) = row_of(project, uid.as_deref())?;
    if done {
        orphan.remove();
        return Ok(None);
    }
    let ignore = roar_store::ignore::Ignore::new(&config.ignore);
    let rule = roar_tracer::steps::Rule::new(config.steps.drivers.iter().map(String::as_str));
    let steps = roar_roarfs::Steps {
        ignore: &ignore,
        rule: &rule,
    };
    let Some(job) = roar_roarfs::recover(records, &steps, orphan.last_write_ns, read_files) else {
        // No header, or nothing recorded yet: the job had no row.
        orphan.remove();
        return Ok(None);
    };
    let id = writer.record_into(begun, job)?;
    orphan.remove();
    Ok(Some(id))
}

/// Records the accesses of a session of a gateway that was killed as the key's job.
fn gateway(project: &Project, writer: &Writer, mut orphan: Orphan) -> anyhow::Result<Option<i64>> {
    let records = std::mem::take(&mut orphan.records);
    let uid = records.iter().find_map(|r| match r {
        Record::Job(j) => j.uid.clone(),
        _ => None,
    });
    let (begun, done) = row_of(project, uid.as_deref())?;
    let job = roar_gateway::sessions::recover(records).filter(|_| !done);
    let Some(job) = job else {
        orphan.remove();
        return Ok(None);
    };
    let id = writer.record_into(begun, job)?;
    orphan.remove();
    Ok(Some(id))
}

/// Removes a run's journal with its ring and late file: the ones it names, and the ones beside
/// it (a roar killed after making its ring and before naming it in the journal).
fn remove_run(orphan: Orphan, ring: Option<&Path>) {
    let beside = roar_tracer::ring_path(&orphan.path);
    for ring in ring.into_iter().chain([beside.as_path()]) {
        let _ = std::fs::remove_file(ring);
        let _ = std::fs::remove_file(roar_tracer::late_path(ring));
    }
    orphan.remove();
}

/// The row a job with `uid` has: its id if it is still `running` (written while it ran), and
/// whether it was recorded already (a recorder killed after its commit, before its journal went).
pub(crate) fn row_of(project: &Project, uid: Option<&str>) -> anyhow::Result<(Option<i64>, bool)> {
    let Some(uid) = uid else {
        return Ok((None, false));
    };
    let store = Store::open(&project.db_path())?;
    let row: Option<(i64, String)> =
        rusqlite::OptionalExtension::optional(store.conn().query_row(
            "SELECT id, status FROM jobs WHERE uid = ?1",
            [uid],
            |r| Ok((r.get(0)?, r.get(1)?)),
        ))?;
    Ok(match row {
        Some((id, status)) if status == "running" => (Some(id), false),
        Some(_) => (None, true),
        None => (None, false),
    })
}

/// Whether a process of the job (one the events saw start and not end) still runs: the shims of
/// a command whose roar died keep writing its events, so its journal waits until it is over.
/// A process is the job's if its environment names the job's ring (the shim keeps it there).
fn still_running(events: &[Event], ring: &Path) -> bool {
    let mut live: roar_engine::HashSet<i32> = Default::default();
    for e in events {
        match e {
            Event::Exec { pid, .. } | Event::Fork { pid, .. } => {
                live.insert(*pid);
            }
            Event::Exit { pid, .. } => {
                live.remove(pid);
            }
            _ => {}
        }
    }
    use std::os::unix::ffi::OsStrExt;
    let mut var = format!("{}=", roar_wire::ring::RING_ENV).into_bytes();
    var.extend_from_slice(ring.as_os_str().as_bytes());
    live.iter().any(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == var.as_slice()))
    })
}

/// `events` through the rule: the job's steps and processes set, its paths returned (to hash).
/// A finished run and a recovered one go through this same sequence.
pub(crate) fn classify_job(
    job: &mut JobRecord,
    events: &[roar_tracer::Event],
    ctime_floor_ns: i64,
    ignore: &roar_tracer::ignore::Ignore,
    config: &crate::config::Config,
) -> roar_engine::Classified {
    let mut classified = collect::classify(events, ctime_floor_ns, ignore);
    job.steps = roar_tracer::steps::steps(
        events,
        &classified,
        ctime_floor_ns,
        &roar_tracer::steps::Rule::new(config.steps.drivers.iter().map(String::as_str)),
    );
    if let Some(root) = job.steps.first_mut() {
        // The root step is the job's command as the user gave it (a script, not its `#!` line).
        root.argv = job.argv.clone();
    }
    job.processes = std::mem::take(&mut classified.processes);
    classified
}
