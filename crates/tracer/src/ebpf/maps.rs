//! The loaded programs' maps as runs use them: a run holds a slot (number and generation) in
//! `runs`, reads the ring at that slot of `rings`, and its command adds itself to `tracked`
//! (`src/bpf/roar.bpf.c` says how the programs use them). Raw bpf(2) map calls: [`track_self`]
//! runs between fork and exec.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Runs served at once (`MAX_RUNS` in roar.bpf.c).
pub(super) const MAX_RUNS: u32 = 64;

/// A `tracked` value: the run a process belongs to.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RunKey {
    pub slot: u32,
    pub gen: u32,
}

/// A `runs` value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RunState {
    pub gen: u32,
    pub reserved: u32,
    pub lost: u64,
}

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;

#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// One bpf(2) map call. Nothing but a syscall: safe between fork and exec.
fn map_call(cmd: libc::c_long, fd: RawFd, key: *const u8, value: *const u8) -> io::Result<()> {
    let attr = ElemAttr {
        map_fd: fd as u32,
        _pad: 0,
        key: key as u64,
        value: value as u64,
        flags: 0,
    };
    // SAFETY: attr points at a key and value the caller keeps alive (and sized for the map) for
    // the duration of the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::addr_of!(attr),
            std::mem::size_of::<ElemAttr>(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn update<K, V>(fd: RawFd, key: &K, value: &V) -> io::Result<()> {
    map_call(
        BPF_MAP_UPDATE_ELEM,
        fd,
        (key as *const K).cast(),
        (value as *const V).cast(),
    )
}

/// The maps a run uses.
#[derive(Debug)]
pub(super) struct Maps {
    pub tracked: OwnedFd,
    pub runs: OwnedFd,
}

impl Maps {
    /// Gives `key.slot` to the run `key`: from now on its processes reach it, with no record lost.
    pub fn open_run(&self, key: RunKey) -> io::Result<()> {
        update(
            self.runs.as_raw_fd(),
            &key.slot,
            &RunState {
                gen: key.gen,
                ..RunState::default()
            },
        )
    }

    /// Ends whatever run holds `slot`: the processes it left behind reach no run any more.
    pub fn close_run(&self, slot: u32) {
        let _ = update(self.runs.as_raw_fd(), &slot, &RunState::default());
    }

    /// Records the programs could not hand over for the run `key`, or `None` if the slot no
    /// longer holds that run.
    pub fn lost(&self, key: RunKey) -> Option<u64> {
        let mut state = RunState::default();
        map_call(
            BPF_MAP_LOOKUP_ELEM,
            self.runs.as_raw_fd(),
            (&key.slot as *const u32).cast(),
            (&mut state as *mut RunState).cast(),
        )
        .ok()?;
        (state.gen == key.gen).then_some(state.lost)
    }
}

/// Puts `ring` (a ring buffer map) at `slot` of `rings`. Waits for an RCU grace period (~10 ms):
/// done once per slot, the ring is then reused.
pub(super) fn put_ring(rings: RawFd, slot: u32, ring: RawFd) -> io::Result<()> {
    update(rings, &slot, &(ring as u32))
}

/// Adds the calling process to `tracked` as a process of the run `key`: runs between fork and
/// exec, so nothing but a syscall.
pub(super) fn track_self(tracked: RawFd, key: RunKey) -> io::Result<()> {
    // SAFETY: getpid has no preconditions.
    let pid: u32 = unsafe { libc::getpid() } as u32;
    update(tracked, &pid, &key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_the_c_layout() {
        assert_eq!(std::mem::size_of::<RunKey>(), 8);
        assert_eq!(std::mem::size_of::<RunState>(), 16);
    }
}
