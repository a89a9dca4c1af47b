//! How a job's values are kept in both kinds of store: paths as their exact bytes, roles and
//! outcomes as their names (a file record's role as one byte in the team store).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use roar_store::{Outcome, Role};

pub(crate) fn bytes(p: &Path) -> Vec<u8> {
    p.as_os_str().as_bytes().to_vec()
}

pub(crate) fn path(b: Vec<u8>) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(&b))
}

pub(crate) fn role(s: &str) -> Role {
    match s {
        "input" => Role::Input,
        "output" => Role::Output,
        _ => Role::Temp,
    }
}

/// A file record's role as the team store's one-byte code (schema 2).
pub(crate) fn role_code(role: Role) -> i8 {
    (match role {
        Role::Input => b'i',
        Role::Output => b'o',
        Role::Temp => b't',
    }) as i8
}

pub(crate) fn role_of_code(code: i8) -> Role {
    match code as u8 {
        b'i' => Role::Input,
        b'o' => Role::Output,
        _ => Role::Temp,
    }
}

/// A job's outcome from its `status`, `exit_code` and `signal` columns (a failed start's reason
/// is not stored).
pub(crate) fn outcome(status: &str, exit_code: Option<i32>, signal: Option<i32>) -> Outcome {
    match status {
        "exited" => Outcome::Exited(exit_code.unwrap_or_default()),
        "signaled" => Outcome::Signaled(signal.unwrap_or_default()),
        "failed_to_start" => Outcome::FailedToStart(String::new()),
        "running" => Outcome::Running,
        "killed" => Outcome::Killed,
        _ => Outcome::Ended,
    }
}
