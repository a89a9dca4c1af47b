//! Where `roar run` records its job: through the resident recorder (crates/recorder)
//! while the job is small, else (or when the recorder cannot take it) through a writer of its own,
//! opened on its own thread while the command runs.

use std::path::{Path, PathBuf};

use roar_store::{
    Begun, CacheEntry, Checkpoints, FileChunk, JobRecord, JobStream, OpeningWriter, Writer,
};

use crate::environment::{self, Prepared, Wanted};
use roar_recorder::{self as recorder, Reached, Recorder};

/// Files a job may have and still go through the recorder. Past this the bytes on the socket cost
/// more than the run opening the store itself, and the run's own writer records chunks of files
/// while it confirms the next (bench/NOTES.md, "the resident recorder").
const RESIDENT_FILES: usize = 2048;

/// A job being recorded, from its start to its commit.
pub struct Recording {
    db: PathBuf,
    state: State,
}

enum State {
    /// The recorder wrote (or is writing) the running row; files gather here until the end.
    Resident {
        recorder: Recorder,
        job: Option<Box<JobRecord>>,
        cache: Vec<CacheEntry>,
        /// What the recorder finds the job's packages from (it keeps the package cache open).
        wanted: Wanted,
    },
    /// This process's writer: opening, or open and streaming the job's files into its
    /// transaction.
    Own {
        /// No recorder serves the store: one is started once the job is recorded.
        start_recorder: bool,
        /// The package cache and machine, read while the command runs.
        prepared: Option<Prepared>,
        opening: Option<roar_store::Result<OpeningWriter>>,
        writer: Option<roar_store::Result<Writer>>,
        begun: Option<Begun>,
        stream: Option<roar_store::Result<JobStream>>,
    },
}

/// How the job went into the store: `recorder` or `run` (`roar run --json`'s `recorded_by`).
pub type By = &'static str;

impl Recording {
    /// Starts recording `job` (its row, `running`, is written while the command runs).
    pub fn start(db: &Path, job: &JobRecord) -> Recording {
        let found = Recorder::connect(db);
        let start_recorder = matches!(found, Reached::Absent);
        if let Reached::Serving(mut recorder) = found {
            match recorder.begin(job) {
                Ok(()) => {
                    return Recording {
                        db: db.to_owned(),
                        state: State::Resident {
                            recorder,
                            job: None,
                            cache: Vec::new(),
                            wanted: Wanted::default(),
                        },
                    }
                }
                Err(e) => tracing::debug!("the recorder did not take the job: {e}"),
            }
        }
        // The store is opened on the writer's thread while the command runs (the first connection
        // replays the WAL and reads the schema: about a millisecond the user would wait for after
        // it).
        let opening = Writer::open_in_background(db, Checkpoints::Deferred);
        let begun = opening.as_ref().ok().and_then(|o| o.begin_job(job).ok());
        Recording {
            db: db.to_owned(),
            state: State::Own {
                start_recorder,
                prepared: environment::prepare(),
                opening: Some(opening),
                writer: None,
                begun,
                stream: None,
            },
        }
    }

    /// Sends the recorder what the job's packages are found from, for it to look them up while
    /// the run finishes the record (the record carries it again: this only saves time).
    pub fn wanted(&mut self, wanted: &Wanted) {
        if let State::Resident { recorder, .. } = &mut self.state {
            recorder.wanted(wanted);
        }
    }

    /// Completes the job's environment with its packages and the machine: now from this run's
    /// package cache, or in the recorder from its own. Called once, before any file is queued.
    pub fn environment(&mut self, job: &mut JobRecord, wanted: Wanted) {
        match &mut self.state {
            State::Resident { wanted: w, .. } => *w = wanted,
            State::Own { prepared, .. } => {
                let (mut cache, machine) = Prepared::take(prepared.take());
                environment::resolve(
                    job.environment.get_or_insert_default(),
                    &wanted,
                    &mut cache,
                    &machine,
                );
            }
        }
    }

    /// Queues files of the job (`job` is taken at the first call; later calls pass None). The
    /// run's own writer starts recording at once; the recorder gets the job whole at the end.
    pub fn files(&mut self, job: &mut Option<JobRecord>, chunk: FileChunk) {
        if let State::Resident {
            job: held, cache, ..
        } = &mut self.state
        {
            let held = held.get_or_insert_with(|| Box::new(job.take().expect("one job")));
            held.files.extend(chunk.files);
            cache.extend(chunk.cache);
            if held.files.len() > RESIDENT_FILES {
                self.go_own();
            }
            return;
        }
        let State::Own {
            opening,
            writer,
            begun,
            stream,
            ..
        } = &mut self.state
        else {
            unreachable!("the recorder's state was left above")
        };
        let writer = writer.get_or_insert_with(|| {
            opening
                .take()
                .expect("opened")
                .and_then(OpeningWriter::wait)
        });
        let Ok(w) = writer else { return };
        match stream {
            Some(Ok(s)) => s.send(chunk),
            Some(Err(_)) => {}
            None => {
                let started = w.start_begun(begun.take(), job.take().expect("one job"));
                if let Ok(s) = &started {
                    s.send(chunk);
                }
                *stream = Some(started);
            }
        }
    }

    /// Leaves the recorder for the run's own writer, with the files gathered so far: the job has
    /// grown past what is worth sending.
    fn go_own(&mut self) {
        let State::Resident {
            recorder,
            job,
            cache,
            wanted,
        } = std::mem::replace(
            &mut self.state,
            State::Own {
                start_recorder: false,
                prepared: None,
                opening: None,
                writer: None,
                begun: None,
                stream: None,
            },
        )
        else {
            return;
        };
        let begun = recorder.begun().map(Begun::known);
        let mut job = job.expect("gathered");
        resolve_here(&mut job, &wanted);
        let writer = Writer::start_with(&self.db, Checkpoints::Deferred);
        let stream = writer.as_ref().ok().map(|w| {
            let started = w.start_begun(begun, *job);
            if let Ok(s) = &started {
                s.send(FileChunk {
                    files: Vec::new(),
                    cache,
                });
            }
            started
        });
        self.state = State::Own {
            start_recorder: false,
            prepared: None,
            opening: None,
            writer: Some(writer),
            begun: None,
            stream,
        };
    }

    /// Commits the job (`job`: still here if no file was queued) and returns its id, with how it
    /// was recorded.
    pub fn finish(self, job: Option<JobRecord>) -> (roar_store::Result<i64>, By) {
        match self.state {
            State::Resident {
                recorder,
                job: held,
                cache,
                wanted,
            } => {
                let mut job = held.map(|b| *b).or(job).expect("the job is held or given");
                match recorder.record(&job, &cache, &wanted) {
                    Ok(id) => (Ok(id), "recorder"),
                    Err((begun, why)) => {
                        tracing::debug!("the recorder could not record the job: {why}");
                        resolve_here(&mut job, &wanted);
                        let recorded = Writer::start_with(&self.db, Checkpoints::Deferred)
                            .and_then(|w| {
                                w.cache(cache)?;
                                w.record_begun(begun.map(Begun::known), job)
                            });
                        (recorded, "run")
                    }
                }
            }
            State::Own {
                start_recorder,
                opening,
                writer,
                begun,
                stream,
                ..
            } => {
                let recorded = match (stream, job) {
                    (Some(stream), _) => {
                        // The writer stays until the stream's commit is answered.
                        let _writer = writer;
                        stream.and_then(JobStream::finish)
                    }
                    (None, Some(job)) => writer
                        .or_else(|| opening.map(|o| o.and_then(OpeningWriter::wait)))
                        .expect("a writer opening or open")
                        .and_then(|w| w.record_begun(begun, job)),
                    (None, None) => unreachable!("a job with no files is given to finish"),
                };
                if start_recorder {
                    recorder::start_for(&self.db);
                }
                (recorded, "run")
            }
        }
    }
}

/// [`environment::resolve`] in this process, for a job the recorder was to complete.
fn resolve_here(job: &mut JobRecord, wanted: &Wanted) {
    // A job whose command never started has no environment to complete.
    let Some(env) = job.environment.as_mut() else {
        return;
    };
    let (mut cache, machine) = Prepared::take(None);
    environment::resolve(env, wanted, &mut cache, &machine);
}
