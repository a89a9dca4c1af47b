//! Keeping what a backend observed in the job's journal (`roar_engine::journal`) as it arrives,
//! so a `roar run` killed at any moment loses none of it (docs/SEMANTICS.md, "Crashes").
//!
//! A backend frames each event as it decodes it ([`Keep::event`]) and writes the batch at the
//! point where what it read would otherwise be gone: preload before it frees the ring's slots,
//! ptrace before it resumes the process that made the event, eBPF after each read of its ring
//! buffer ([`Keep::commit`]). Without a journal (a run not recorded) it costs nothing.

use std::sync::{Arc, Mutex};

use roar_engine::journal::{self, Journal, Record};

use crate::Event;

#[derive(Default)]
pub struct Keep {
    journal: Option<Arc<Journal>>,
    /// What of a command line may be stored: a journal is on disk, so the argv of every program
    /// the job runs is redacted before it is written, as the store would.
    policy: roar_store::redact::Policy,
    /// The project's config, whose `[redact]` rules the policy is: what an observer that takes
    /// the journal over (the eBPF helper) redacts by.
    config: Option<std::path::PathBuf>,
    batch: Mutex<Vec<u8>>,
}

impl Keep {
    /// Nothing is kept.
    pub fn none() -> Arc<Keep> {
        Arc::new(Keep::default())
    }

    /// Keeps events in `journal`, redacted by `policy`: the `[redact]` rules of the config at
    /// `config` (the caller has read it already; reading and parsing it again cost `roar run
    /// true` ~0.03 ms).
    pub fn new(
        journal: Arc<Journal>,
        config: &std::path::Path,
        policy: roar_store::redact::Policy,
    ) -> Arc<Keep> {
        Arc::new(Keep {
            journal: Some(journal),
            policy,
            config: Some(config.to_owned()),
            batch: Mutex::new(Vec::with_capacity(64 << 10)),
        })
    }

    /// The project's config the events are redacted by, if events are kept.
    pub fn config(&self) -> Option<&std::path::Path> {
        self.journal.as_ref().and(self.config.as_deref())
    }

    /// The journal's file, if events are kept.
    pub fn journal_path(&self) -> Option<&std::path::Path> {
        self.journal.as_deref().map(Journal::path)
    }

    /// `ev` joins the batch.
    pub fn event(&self, ev: &Event) {
        if self.journal.is_none() {
            return;
        }
        journal::frame_redacted(&self.policy, ev, false, &mut self.lock());
    }

    /// `ev` goes to the journal now, with the batch before it: for a backend whose source frees
    /// an event as soon as it is handed over (libbpf advances the eBPF ring's consumer position
    /// after each record's callback), so that every event is in the source or in the journal.
    pub fn event_now(&self, ev: &Event) {
        if self.journal.is_none() {
            return;
        }
        journal::frame_redacted(&self.policy, ev, false, &mut self.lock());
        self.commit(None);
    }

    /// The job's header, redacted as the store would redact it, joins the batch.
    pub fn job(&self, job: &roar_store::JobRecord) {
        if self.journal.is_some() {
            self.record(&Record::Job(Box::new(job.clone())));
        }
    }

    /// `r` goes to the journal now, apart from the batch (what another thread observes for the
    /// job: the S3 accesses of the run's own gateway).
    pub fn now(&self, r: &Record) {
        if let Some(j) = &self.journal {
            if let Err(e) = j.append(&self.policy, std::slice::from_ref(r)) {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| tracing::warn!("cannot write the job's journal: {e}"));
            }
        }
    }

    /// Other records join the batch (the run's set-up: its ring, the ctime floor; a job's
    /// header), redacted as the store would redact them.
    pub fn record(&self, r: &Record) {
        if self.journal.is_some() {
            journal::frame_redacted_record(&self.policy, r, &mut self.lock());
        }
    }

    /// The batch goes to the journal; `ring_pos`: every ring event before it is in it. A failed
    /// write (a full disk) is reported once and leaves the run as it was: the record is then only
    /// as durable as it was before journals.
    pub fn commit(&self, ring_pos: Option<u64>) {
        let Some(j) = &self.journal else {
            return;
        };
        let mut batch = self.lock();
        if let Some(pos) = ring_pos {
            journal::frame_redacted_record(&self.policy, &Record::RingPos(pos), &mut batch);
        }
        if let Err(e) = j.append_framed(&batch) {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| tracing::warn!("cannot write the job's journal: {e}"));
        }
        batch.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.batch.lock().unwrap_or_else(|p| p.into_inner())
    }
}
