//! Injected time: the [`Clock`] trait, the system clock, and a manual clock.
//!
//! Every durable time in this workspace is Unix milliseconds. Library code
//! reads time only through a [`Clock`], so tests and simulations drive time
//! by hand and never sleep for real.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;

use futures::future::BoxFuture;
use tokio::sync::oneshot;

/// The largest integer a JavaScript number (and so the seeds' stored times)
/// represents exactly: `2^53 - 1`.
pub const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// A source of Unix-millisecond time and of sleeps measured against it.
pub trait Clock: Send + Sync + 'static {
    /// The current time in Unix milliseconds.
    fn now_ms(&self) -> i64;

    /// A future that completes once [`Clock::now_ms`] is at least `at_ms`.
    fn sleep_until(&self, at_ms: i64) -> BoxFuture<'static, ()>;
}

/// The wall clock, with sleeps on the tokio timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // This is the one place that reads the wall clock.
    fn now_ms(&self) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
    }

    fn sleep_until(&self, at_ms: i64) -> BoxFuture<'static, ()> {
        let wait = at_ms.saturating_sub(self.now_ms()).max(0);
        let wait = std::time::Duration::from_millis(u64::try_from(wait).unwrap_or(0));
        Box::pin(tokio::time::sleep(wait))
    }
}

/// A clock that moves only when told to; sleepers wake as it passes them.
///
/// Cloning shares the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    inner: Arc<Mutex<ManualInner>>,
}

#[derive(Debug)]
struct ManualInner {
    now: i64,
    next_id: u64,
    sleepers: BTreeMap<(i64, u64), oneshot::Sender<()>>,
}

impl ManualClock {
    /// A manual clock starting at `start_ms`.
    pub fn new(start_ms: i64) -> Self {
        Self {
            inner: Arc::new(Mutex::new(ManualInner {
                now: start_ms,
                next_id: 0,
                sleepers: BTreeMap::new(),
            })),
        }
    }

    /// Moves time forward by `ms` and wakes every sleeper now due.
    pub fn advance(&self, ms: i64) {
        let mut inner = lock(&self.inner);
        let to = inner.now.saturating_add(ms.max(0));
        Self::move_to(&mut inner, to);
    }

    /// Sets time to `at_ms` (never backwards) and wakes every sleeper now due.
    pub fn set(&self, at_ms: i64) {
        let mut inner = lock(&self.inner);
        let to = inner.now.max(at_ms);
        Self::move_to(&mut inner, to);
    }

    /// The earliest time some sleeper waits for, if any.
    pub fn next_wake(&self) -> Option<i64> {
        let mut inner = lock(&self.inner);
        inner.prune();
        inner.sleepers.keys().next().map(|(at, _)| *at)
    }

    fn move_to(inner: &mut ManualInner, to: i64) {
        inner.now = to;
        let later = inner.sleepers.split_off(&(to.saturating_add(1), 0));
        let due = std::mem::replace(&mut inner.sleepers, later);
        for (_, waker) in due {
            let _ = waker.send(());
        }
    }
}

impl ManualInner {
    /// Forgets sleepers whose futures were dropped before they woke (a
    /// deadline that lost its race), so they neither count as waiting nor
    /// pile up.
    fn prune(&mut self) {
        self.sleepers.retain(|_, waker| !waker.is_closed());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        lock(&self.inner).now
    }

    fn sleep_until(&self, at_ms: i64) -> BoxFuture<'static, ()> {
        let mut inner = lock(&self.inner);
        if at_ms <= inner.now {
            return Box::pin(async {});
        }
        inner.prune();
        let (tx, rx) = oneshot::channel();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.sleepers.insert((at_ms, id), tx);
        Box::pin(async move {
            // A dropped clock never wakes the sleeper: it waits forever, as a
            // stopped clock would.
            if rx.await.is_err() {
                futures::future::pending::<()>().await;
            }
        })
    }
}
