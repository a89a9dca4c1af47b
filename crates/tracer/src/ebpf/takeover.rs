//! The helper taking over a dead run's journal (docs/SEMANTICS.md, "Crashes").
//!
//! A run tells its helper where its journal is (and the config whose `[redact]` rules it keeps
//! by) right after its lease; the helper then holds a [`Claim`] on that journal, so no recovery
//! starts while the run lives. A run that ends says `done`; a lease that closes without it is a
//! run that died while its command may still run (under eBPF the command does not depend on
//! roar). The helper then keeps the run's slot open, adopts the journal once the dead run's lock
//! is gone, and goes on writing what the slot's ring holds into it — the same records the run
//! would have written — until no process of the run is tracked any more. The journal then ends
//! with [`Record::RootGone`] (every process of the job was seen to end, nothing was lost), is
//! let go with the claim, and the next roar command recovers the whole job.

use std::cell::RefCell;
use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libbpf_rs::{MapCore, MapFlags, MapHandle, MapInfo, RingBufferBuilder};
use roar_engine::journal::{self, Claim, Journal, Record};

use super::decode::{clock_offset, decode};
use super::maps::{Maps, RunKey};

/// What a run told its helper: `keep\0JOURNAL\0CONFIG\0` once, `done\0` at its end.
#[derive(Debug, Default)]
pub(super) struct Told {
    buf: Vec<u8>,
    pub journal: Option<(PathBuf, PathBuf, Claim)>,
    pub done: bool,
}

impl Told {
    /// Takes in what the run wrote, whole messages at a time.
    pub fn read(&mut self, bytes: &[u8]) {
        use std::os::unix::ffi::OsStrExt;
        self.buf.extend_from_slice(bytes);
        // Two paths at most: anything longer is not a run speaking.
        if self.buf.len() > 3 * libc::PATH_MAX as usize {
            self.buf.clear();
            return;
        }
        loop {
            let words: Vec<&[u8]> = self.buf.split(|b| *b == 0).collect();
            let used = match words.as_slice() {
                [b"done", _, ..] => {
                    self.done = true;
                    5
                }
                [b"keep", journal, config, _, ..] => {
                    let journal = Path::new(std::ffi::OsStr::from_bytes(journal)).to_owned();
                    let config = Path::new(std::ffi::OsStr::from_bytes(config)).to_owned();
                    let used = 5 + journal.as_os_str().len() + 1 + config.as_os_str().len() + 1;
                    match Claim::take(&journal) {
                        Ok(claim) => self.journal = Some((journal, config, claim)),
                        Err(e) => tracing::debug!("cannot claim a run's journal: {e}"),
                    }
                    used
                }
                _ => return,
            };
            self.buf.drain(..used);
        }
    }
}

/// The map a descriptor names, as a handle of this process's own.
pub(super) fn handle(fd: BorrowedFd<'_>) -> io::Result<MapHandle> {
    let info = MapInfo::new(fd).map_err(io::Error::other)?;
    MapHandle::from_map_id(info.info.id).map_err(io::Error::other)
}

/// Whether a process of `key` is still tracked.
fn any_tracked(tracked: &MapHandle, key: RunKey) -> bool {
    let want = [key.slot.to_ne_bytes(), key.gen.to_ne_bytes()].concat();
    tracked
        .keys()
        .any(|pid| matches!(tracked.lookup(&pid, MapFlags::ANY), Ok(Some(v)) if v == want))
}

/// A dead run's slot, taken over on a thread of its own; `busy` holds the slot until it is over.
pub(super) fn start(
    ring: MapHandle,
    maps: Maps,
    key: RunKey,
    told: (PathBuf, PathBuf, Claim),
    busy: Arc<Mutex<HashSet<u32>>>,
) {
    busy.lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key.slot);
    let slot = key.slot;
    let busy2 = Arc::clone(&busy);
    let spawned = std::thread::Builder::new()
        .name("roar-ebpf-takeover".into())
        .spawn(move || {
            let (journal, config, claim) = told;
            if let Err(e) = follow(&ring, &maps, key, &journal, &config) {
                tracing::debug!("taking over {}: {e}", journal.display());
            }
            maps.close_run(key.slot);
            claim.release();
            busy2
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key.slot);
        });
    if spawned.is_err() {
        busy.lock().unwrap_or_else(|p| p.into_inner()).remove(&slot);
    }
}

/// Writes the ring's records of `key` into the journal until no process of the run is left.
fn follow(
    ring: &MapHandle,
    maps: &Maps,
    key: RunKey,
    journal: &Path,
    config: &Path,
) -> io::Result<()> {
    // The dead run's lock goes when its last descriptor does: almost at once.
    let Some(journal) = Journal::adopt(journal, Duration::from_secs(5))? else {
        return Ok(());
    };
    let tracked = handle(maps.tracked.as_fd())?;
    let policy = roar_store::redact::Policy::for_config(config);
    let offset = clock_offset();
    let batch = RefCell::new(Vec::new());
    let mut malformed = 0usize;
    let mut rb = RingBufferBuilder::new();
    rb.add(ring, |rec: &[u8]| {
        match decode(rec, offset, key.gen) {
            Ok(Some(ev)) => journal::frame_redacted(&policy, &ev, false, &mut batch.borrow_mut()),
            Ok(None) => {}
            Err(()) => malformed += 1,
        }
        0
    })
    .map_err(io::Error::other)?;
    let rb = rb.build().map_err(io::Error::other)?;
    loop {
        let gone = !any_tracked(&tracked, key);
        // Every record of a process that is gone is in the ring already.
        let _ = if gone {
            rb.consume()
        } else {
            rb.poll(Duration::from_millis(50))
        };
        journal.append_framed(&batch.borrow())?;
        batch.borrow_mut().clear();
        if gone {
            break;
        }
    }
    drop(rb);
    if maps.lost(key) == Some(0) && malformed == 0 {
        journal.append(&policy, &[Record::RootGone])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_run_tells_is_read_whole_in_any_pieces() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("j.journal");
        let mut msg = b"keep\0".to_vec();
        msg.extend_from_slice(journal.as_os_str().as_encoded_bytes());
        msg.extend_from_slice(b"\0/p/config.toml\0done\0");
        for cut in 0..msg.len() {
            let mut told = Told::default();
            told.read(&msg[..cut]);
            told.read(&msg[cut..]);
            let (j, c, claim) = told.journal.expect("the journal");
            assert_eq!(
                (j.as_path(), c.as_path()),
                (journal.as_path(), Path::new("/p/config.toml"))
            );
            assert!(told.done, "cut at {cut}");
            claim.release();
        }
        // Without its last NUL nothing is taken; garbage past two paths is dropped.
        let mut told = Told::default();
        told.read(&msg[..msg.len() - 1 - 5]);
        assert!(told.journal.is_none() && !told.done);
        told.read(b"\0");
        assert!(told.journal.is_some() && !told.done);
        let mut told = Told::default();
        told.read(&vec![b'x'; 20_000]);
        assert!(told.buf.is_empty() && told.journal.is_none());
    }
}
