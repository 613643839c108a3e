//! The in-process alarm driver: a tokio task that sleeps until the stored
//! alarm and fires it.
//!
//! Started on a fresh [`Scheduler`] after a restart, it arms from the alarm
//! stored in the object's storage, so work left behind by a crash resumes.

use std::time::Duration;

use tokio::task::JoinHandle;

use durability_time::timeout_at;

use crate::scheduler::Scheduler;
use crate::storage::Storage;

/// How long the driver waits before firing again when a firing left the
/// alarm unchanged and still due (a capability failed or is not attached).
pub const DEFAULT_IDLE_RETRY: Duration = Duration::from_secs(1);

/// A running driver; dropping it stops the task.
#[derive(Debug)]
pub struct Driver {
    task: JoinHandle<()>,
}

impl Driver {
    /// Starts a driver for `scheduler` on the current tokio runtime.
    pub fn start<S: Storage>(scheduler: Scheduler<S>) -> Self {
        Self::with_idle_retry(scheduler, DEFAULT_IDLE_RETRY)
    }

    /// Starts a driver with a custom pause between fruitless firings.
    pub fn with_idle_retry<S: Storage>(scheduler: Scheduler<S>, idle_retry: Duration) -> Self {
        let idle_ms = i64::try_from(idle_retry.as_millis())
            .unwrap_or(i64::MAX)
            .max(1);
        Self {
            task: tokio::spawn(run(scheduler, idle_ms)),
        }
    }

    /// Stops the driver.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run<S: Storage>(scheduler: Scheduler<S>, idle_ms: i64) {
    let mut changes = scheduler.watch_alarm();
    let clock = std::sync::Arc::clone(scheduler.context().clock());
    // The earliest time the next firing may happen: pushed forward when a
    // firing leaves the alarm due, so a stuck capability cannot spin the task.
    let mut not_before = i64::MIN;
    loop {
        let alarm = *changes.borrow_and_update();
        let Some(at) = alarm else {
            if changes.changed().await.is_err() {
                return;
            }
            continue;
        };
        let fired_for = at;
        let at = at.max(not_before);
        // Sleep until the alarm, unless it changes first.
        if let Ok(changed) = timeout_at(&*clock, at, changes.changed()).await {
            if changed.is_err() {
                return;
            }
            continue;
        }
        match scheduler.alarm().await {
            Ok(next) => {
                let now = clock.now_ms();
                // Only a firing that left the alarm where it was (a failing
                // or detached capability) waits: one that made progress moved
                // the alarm, and a due alarm then fires again at once.
                not_before = if next == Some(fired_for) && fired_for <= now {
                    now.saturating_add(idle_ms)
                } else {
                    i64::MIN
                };
                // A firing may move the alarm through storage directly; make
                // the watch agree with what is stored.
                if *changes.borrow() != next {
                    scheduler.publish_alarm(next);
                }
            }
            Err(error) => {
                tracing::warn!(
                    event = "durability.scheduler.alarm_failed",
                    %error,
                    "alarm handler failed; retrying"
                );
                not_before = clock.now_ms().saturating_add(idle_ms);
            }
        }
    }
}
