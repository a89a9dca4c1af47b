//! The eBPF backend of a roar built without it (the lean build: `--no-default-features`, no
//! clang, no libelf). Every entry point says so, the way an eBPF backend that cannot load says
//! why: `roar tracer check ebpf` fails with this reason, `--tracer auto` passes over it, and
//! `--tracer ebpf` stops before the command starts.

use std::ffi::OsString;

use crate::{Keep, Tap, TraceError, Traced};

pub(crate) const ABSENT: &str = "this roar was built without eBPF (the lean build); install the \
     wheel or the .deb, or build with default features (scripts/build.sh)";

fn absent() -> TraceError {
    TraceError::Unavailable {
        backend: "ebpf",
        reason: ABSENT.into(),
    }
}

pub fn probe() -> Result<std::time::Duration, TraceError> {
    Err(absent())
}

pub fn run(
    _argv: &[OsString],
    _env: &crate::EnvChanges,
    _tap: &Tap,
    _keep: &Keep,
) -> Result<Traced, TraceError> {
    Err(absent())
}

pub mod helper {
    /// The resident helper's first argument (never passed by a roar without eBPF).
    pub const HELPER_ARG: &str = "__ebpf-helper";

    pub fn serve() -> i32 {
        eprintln!("roar: {}", super::ABSENT);
        1
    }
}
