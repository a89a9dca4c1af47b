//! `roar gateway`'s sessions: the object accesses made with each access key, kept in a journal
//! as they complete (docs/SEMANTICS.md, "Crashes") until they are recorded as the key's job or
//! handed to the run the key was lent to. A gateway killed at any moment loses none of them: the
//! next roar command (the restarted gateway first) records each journal as the key's job, status
//! `killed` ([`recover`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{Access, Sink};
use roar_engine::journal::{self, Journal, Record};
use roar_store::redact::Policy;
use roar_store::{JobRecord, Outcome, Project, Store};

/// One access key's accesses not recorded yet, and their journal.
pub struct Session {
    pub accesses: Vec<Access>,
    last: Instant,
    uid: String,
    /// None where it cannot be made (a warning, once): then only as durable as memory.
    journal: Option<Journal>,
    /// What of a record may be on disk: the store's redaction rules.
    policy: Arc<Policy>,
}

impl Session {
    /// A session of `key` begun now, its journal holding its header.
    fn begin(dir: Option<&Path>, policy: &Arc<Policy>, root: &Path, key: &str) -> Session {
        let uid = journal::new_uid();
        let journal = dir.and_then(|dir| {
            Journal::create(dir, &uid, journal::Writer::Gateway)
                .map_err(|e| {
                    static ONCE: std::sync::Once = std::sync::Once::new();
                    ONCE.call_once(|| {
                        tracing::warn!("no journal for the gateway's sessions ({e}): a gateway killed now loses them")
                    });
                })
                .ok()
        });
        let session = Session {
            accesses: Vec::new(),
            last: Instant::now(),
            uid,
            journal,
            policy: policy.clone(),
        };
        let header = session.header(root, key, roar_store::now_ns());
        session.write(&[Record::Job(Box::new(header))]);
        session
    }

    /// `accesses` join the session, written to its journal first.
    fn add(&mut self, accesses: Vec<Access>) {
        let records: Vec<Record> = accesses.iter().map(access_record).collect();
        self.write(&records);
        self.last = Instant::now();
        self.accesses.extend(accesses);
    }

    fn write(&self, records: &[Record]) {
        if let Some(j) = &self.journal {
            if let Err(e) = j.append(&self.policy, records) {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| tracing::warn!("cannot write a session's journal: {e}"));
            }
        }
    }

    /// The job's row as it is known when the session begins.
    fn header(&self, root: &Path, key: &str, at: i64) -> JobRecord {
        JobRecord {
            name: Some(format!("s3 client {key}")),
            argv: vec!["s3-client".into(), key.into()],
            cwd: root.to_owned(),
            started_ns: at,
            ended_ns: None,
            outcome: Outcome::Running,
            incomplete: false,
            backend: "gateway".into(),
            git: None,
            env: Default::default(),
            host: roar_env::runtime::hostname(),
            processes: Vec::new(),
            steps: Vec::new(),
            files: Vec::new(),
            environment: None,
            uid: Some(self.uid.clone()),
            dist: None,
        }
    }

    /// The session as key `key`'s job.
    pub fn job(&self, project: &Project, key: &str) -> JobRecord {
        finished(self.header(&project.root, key, 0), &self.accesses)
    }

    /// Its accesses are in the store (or with the run that borrowed the key): the journal goes.
    pub fn recorded(self) {
        if let Some(j) = self.journal {
            j.remove();
        }
    }
}

/// An access as a journal's record.
pub fn access_record(a: &Access) -> Record {
    Record::Extra(serde_json::to_vec(a).expect("an access serializes"))
}

/// The access a journal's record holds, if it holds one.
pub fn access_of(bytes: &[u8]) -> Option<Access> {
    serde_json::from_slice(bytes)
        .map_err(|e| tracing::warn!("a journal's S3 access is unreadable: {e}"))
        .ok()
}

/// `header` with the files `accesses` made, started at the first and ended at the last.
fn finished(header: JobRecord, accesses: &[Access]) -> JobRecord {
    let first = accesses.iter().map(|a| a.at_ns).min().unwrap_or(0);
    let last = accesses.iter().map(|a| a.at_ns).max().unwrap_or(first);
    JobRecord {
        started_ns: first,
        ended_ns: Some(last),
        outcome: Outcome::Ended,
        files: crate::job_files(accesses),
        ..header
    }
}

pub struct Sessions {
    open: Mutex<HashMap<String, Session>>,
    /// Keys lent to runs, with the accesses made with each so far.
    lent: Mutex<HashMap<String, Session>>,
    known: Known,
    journals: Option<PathBuf>,
    root: PathBuf,
    policy: Arc<Policy>,
}

impl Sink for Sessions {
    fn record(&self, access: Access) {
        let key = access
            .access_key
            .clone()
            .unwrap_or_else(|| "anonymous".into());
        if let Some(run) = self.lent.lock().unwrap().get_mut(&key) {
            run.add(vec![access]);
            return;
        }
        let mut open = self.open.lock().unwrap();
        let session = open
            .entry(key)
            .or_insert_with_key(|key| self.begin(self.journals.as_deref(), key));
        session.add(vec![access]);
    }

    fn known(&self, bucket: &str, key: &str, etag: &str) -> Option<(String, u64)> {
        self.known.get(bucket, key, etag)
    }
}

impl Sessions {
    pub fn new(project: &Project, known: Known) -> Sessions {
        Sessions {
            open: Mutex::default(),
            lent: Mutex::default(),
            known,
            journals: Some(project.journal_dir()),
            root: project.root.clone(),
            policy: Arc::new(Policy::for_config(&project.config_path())),
        }
    }

    fn begin(&self, journals: Option<&Path>, key: &str) -> Session {
        Session::begin(journals, &self.policy, &self.root, key)
    }

    /// From now on the accesses made with `key` belong to a run.
    pub fn lend(&self, key: &str) {
        let session = self.begin(self.journals.as_deref(), key);
        self.lent.lock().unwrap().insert(key.to_owned(), session);
    }

    /// The accesses made with a lent key; later ones (if any) go to an ordinary session.
    pub fn take_back(&self, key: &str) -> Session {
        self.lent
            .lock()
            .unwrap()
            .remove(key)
            .unwrap_or_else(|| self.begin(None, key))
    }

    /// Accesses a run did not collect become the key's session, recorded like any other.
    pub fn adopt(&self, key: &str, run: Session) {
        if run.accesses.is_empty() {
            run.recorded();
            return;
        }
        let mut open = self.open.lock().unwrap();
        match open.get_mut(key) {
            Some(session) => {
                let mut run = run;
                session.add(std::mem::take(&mut run.accesses));
                run.recorded();
            }
            None => {
                open.insert(key.to_owned(), run);
            }
        }
    }

    /// Every run still holding a key loses it (the gateway stops): its accesses are adopted.
    pub fn adopt_all_lent(&self) {
        let lent: Vec<(String, Session)> = self.lent.lock().unwrap().drain().collect();
        for (key, session) in lent {
            self.adopt(&key, session);
        }
    }

    /// Removes the sessions idle for `idle` (all with `None`), oldest first.
    pub fn take_idle(&self, idle: Option<Duration>) -> Vec<(String, Session)> {
        let mut open = self.open.lock().unwrap();
        let done: Vec<String> = open
            .iter()
            .filter(|(_, s)| idle.is_none_or(|idle| s.last.elapsed() >= idle))
            .map(|(k, _)| k.clone())
            .collect();
        let mut done: Vec<(String, Session)> = done
            .into_iter()
            .filter_map(|k| open.remove_entry(&k))
            .collect();
        // Jobs are recorded in the order their sessions began.
        done.sort_by_key(|(_, s)| s.accesses.iter().map(|a| a.at_ns).min());
        done
    }
}

/// The job of a gateway session whose gateway was killed, from its journal: the key's accesses
/// up to the kill, status `killed`. None when it holds no access.
pub fn recover(records: Vec<Record>) -> Option<JobRecord> {
    let mut header = None;
    let mut accesses = Vec::new();
    let mut unreadable = 0;
    for r in records {
        match r {
            Record::Job(j) => header = Some(*j),
            Record::Extra(bytes) => match access_of(&bytes) {
                Some(a) => accesses.push(a),
                None => unreadable += 1,
            },
            _ => {}
        }
    }
    if accesses.is_empty() && unreadable == 0 {
        return None;
    }
    Some(JobRecord {
        outcome: Outcome::Killed,
        // An access that could not be read back is missing from the job.
        incomplete: unreadable > 0,
        ..finished(header?, &accesses)
    })
}

/// Looks up hashes of object versions recorded before, so ranged reads and copies of them need
/// not read the object again.
pub struct Known {
    store: Mutex<Option<Store>>,
}

impl Known {
    pub fn new(db: &Path) -> Known {
        Known {
            store: Mutex::new(Store::open(db).ok()),
        }
    }

    pub fn get(&self, bucket: &str, key: &str, etag: &str) -> Option<(String, u64)> {
        let store = self.store.lock().unwrap();
        store.as_ref()?.s3_known(bucket, key, etag).ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, at_ns: i64) -> Access {
        Access {
            access_key: Some("AK".into()),
            bucket: "b".into(),
            key: key.into(),
            kind: crate::AccessKind::Write,
            version_id: None,
            etag: Some("e".into()),
            blake3: Some("h".into()),
            size: Some(1),
            range: None,
            at_ns,
        }
    }

    #[test]
    fn a_killed_session_is_the_keys_job_and_an_unreadable_access_makes_it_incomplete() {
        let session = Session::begin(None, &Arc::default(), Path::new("/p"), "AK");
        let header = Record::Job(Box::new(session.header(Path::new("/p"), "AK", 5)));
        let whole = vec![
            header.clone(),
            access_record(&put("k1", 7)),
            access_record(&put("k2", 9)),
        ];
        let job = recover(whole).expect("a job");
        assert_eq!((job.outcome, job.incomplete), (Outcome::Killed, false));
        assert_eq!((job.started_ns, job.ended_ns), (7, Some(9)));
        assert_eq!(job.files.len(), 2);
        let damaged = vec![
            header.clone(),
            access_record(&put("k1", 7)),
            Record::Extra(b"{".to_vec()),
        ];
        let job = recover(damaged).expect("a job");
        assert!(job.incomplete);
        assert_eq!(job.files.len(), 1);
        assert!(recover(vec![header]).is_none(), "no access: no job");
    }
}
