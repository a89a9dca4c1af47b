//! The session's two ends: INIT, where the mount asks the kernel for what it relies on
//! (passthrough, writeback caching, the caller's umask, killpriv, ACLs, cached listings), and
//! DESTROY, where the handles the kernel never released (it drops pending releases when the
//! connection ends) get their release's work.

use super::*;

impl RoarFs {
    pub(super) fn on_init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // ROAR_MOUNT_PASSTHROUGH=0 serves every read here too (a kernel whose passthrough
        // misbehaves; the tests of the userspace data path).
        let wanted = std::env::var_os("ROAR_MOUNT_PASSTHROUGH").is_none_or(|v| v != "0");
        if wanted && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok() {
            // Backing files live on the directory's own filesystem: one level of stacking.
            if config.set_max_stack_depth(1).is_ok() {
                self.passthrough.store(true, Ordering::Relaxed);
            }
        }
        // Listings with attributes only where the program then stats what it listed (ls -l, not
        // find): each entry costs the kernel a lookup here, and round trips are what a FUSE
        // mount pays for. Lookups in one directory may run in parallel.
        let _ = config.add_capabilities(
            InitFlags::FUSE_DO_READDIRPLUS
                | InitFlags::FUSE_READDIRPLUS_AUTO
                | InitFlags::FUSE_PARALLEL_DIROPS,
        );
        // ACLs: the kernel checks them (it reads them through getxattr) and leaves the umask to
        // the backing filesystem, which applies a default ACL instead where there is one.
        if config.add_capabilities(InitFlags::FUSE_POSIX_ACL).is_err() {
            tracing::warn!("roarfs: the kernel does not offer FUSE_POSIX_ACL: ACLs are not enforced through the mount");
        }
        // `open(O_TRUNC)` reaches us as one open with O_TRUNC, not an open the kernel follows
        // with a truncate: without it an overwrite (`echo x > f`, `cp a f`) first opens the old
        // content for writing, and that content would count as the job's input.
        if config
            .add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC)
            .is_err()
        {
            tracing::warn!("roarfs: the kernel does not offer FUSE_ATOMIC_O_TRUNC: overwrites may be recorded as reads of the old content");
        }
        // The daemon drops setuid/setgid bits itself (`has_sxid`), so the kernel remembers per
        // inode that a file has nothing to drop (SB_NOSEC) instead of asking GETXATTR
        // security.capability before every write(2).
        if config
            .add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
            .is_err()
        {
            tracing::info!("roarfs: the kernel does not offer FUSE_HANDLE_KILLPRIV_V2: every write asks for security.capability first");
        }
        if config.add_capabilities(InitFlags::FUSE_DONT_MASK).is_ok() {
            self.dont_mask.store(true, Ordering::Relaxed);
        }
        // ROAR_MOUNT_URING=1: requests through per-CPU io_uring queues where the kernel offers
        // them (Linux 6.14+ with `enable_uring` set), served on the CPU of the process that made
        // them. Faster for streams of requests (`ls -lR`, small files), but the scheduler then
        // moves a job between CPUs at replies, which costs jobs that compute between opens more
        // CPU (bench/NOTES.md): asked for, not the default.
        let uring = std::env::var_os("ROAR_MOUNT_URING").is_some_and(|v| v == "1");
        if uring {
            match config.add_capabilities(InitFlags::FUSE_OVER_IO_URING) {
                Ok(_) => self.uring.store(true, Ordering::Relaxed),
                Err(_) => tracing::warn!("roarfs: ROAR_MOUNT_URING=1 but the kernel does not offer FUSE over io_uring (Linux 6.14+, /sys/module/fuse/parameters/enable_uring): serving /dev/fuse"),
            }
        }
        Ok(())
    }

    /// Runs once the session has ended and every request thread has returned. The kernel does
    /// not wait for the release of a file closed just before an unmount, nor of the last file of
    /// a detached mount: when the connection ends it drops them unsent. Their handles are still
    /// here and are released now, the same way, so what their writers left is recorded.
    pub(super) fn on_destroy(&mut self) {
        let left: Vec<_> = self
            .handles
            .write()
            .expect("handles lock")
            .drain()
            .map(|(_, h)| h)
            .collect();
        if !left.is_empty() {
            tracing::info!(
                "roarfs: {} handle(s) without a release from the kernel released at the end",
                left.len()
            );
        }
        for open in left {
            self.released(&open.handle);
        }
    }
}
