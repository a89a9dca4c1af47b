//! Background work (hashing an object the gateway never streamed whole) that must finish before
//! its access is handed over: `roar run` waits for it before it records the job.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct Pending {
    count: AtomicUsize,
    idle: Notify,
}

/// One piece of background work; dropping it marks the work done.
pub(crate) struct Guard(Arc<Pending>);

impl Pending {
    pub(crate) fn start(self: &Arc<Self>) -> Guard {
        self.count.fetch_add(1, Ordering::SeqCst);
        Guard(Arc::clone(self))
    }

    /// Waits until no background work is left.
    pub(crate) async fn wait(&self) {
        loop {
            let idle = self.idle.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
