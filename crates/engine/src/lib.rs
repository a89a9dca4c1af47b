//! roar's recording engine: the one place where what an observer saw becomes a record.
//!
//! Observers only translate: the preload shim's datagrams, ptrace stops, eBPF records and the
//! mount's FUSE requests each become [`Event`]s, and [`classify::Rules`] decides from them alone
//! which paths a job read, made, replaced or removed (docs/SEMANTICS.md's role table is this
//! rule's documentation). What content a version had is [`content`]'s rule: a hash taken from a
//! write stream names a version only while that stream saw every change to the file.
//! [`journal`] keeps those inputs on disk as they arrive, so a job outlives its observer.

pub mod classify;
pub mod content;
pub mod event;
pub mod journal;

pub use classify::{
    classify, Classified, Fact, HashMap, HashSet, Judge, PathState, Rules, Version,
};
pub use event::Event;
