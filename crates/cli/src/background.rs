//! The work a roar command leaves to a detached `roar` after it returns, so the user does not
//! wait for it: the store's checkpoint (`roar checkpoint-store`), the keep budget's `roar gc`.

use std::path::Path;

/// Starts `roar ARGS` detached from this command: its own process group (the terminal's Ctrl-C
/// after roar returned is not meant for it), no standard streams, nothing run before exec (std
/// starts it with posix_spawn). `what` names it in the warning when it cannot start.
pub fn roar_in_background(args: &[&std::ffi::OsStr], what: &str) {
    use std::os::unix::process::CommandExt;
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let spawned = std::process::Command::new(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn();
    if let Err(e) = spawned {
        tracing::warn!("could not start {what}: {e}");
    }
}

/// Starts `roar checkpoint-store` detached if the WAL has outgrown its limit. A checkpoint
/// fsyncs the WAL and the database (tens of milliseconds on a virtual disk); done inline it would
/// land on this command's exit, which the user waits for, after every megabyte or so of records.
/// The copy does not block other writers, so the next `roar run` need not wait for it either.
/// It runs in a process group of its own, so the terminal's Ctrl-C after roar returned is not
/// meant for it (though cutting a checkpoint short is harmless), and lowers its own priority
/// ([`checkpoint_store`]). Nothing runs in the child before exec, so std starts it with
/// posix_spawn, without copying this process's page tables.
pub(crate) fn checkpoint_in_background(db: &Path) {
    if !roar_store::checkpoint_due(db) {
        return;
    }
    roar_in_background(
        &["checkpoint-store".as_ref(), db.as_os_str()],
        "the store checkpoint",
    );
}

/// `roar checkpoint-store DB`: the background checkpoint, niced so that it yields the CPU to the
/// user's next command.
pub fn checkpoint_store(db: &Path) -> roar_store::Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: nice only changes this process's priority.
    unsafe {
        libc::nice(10);
    }
    roar_store::checkpoint(db)
}
