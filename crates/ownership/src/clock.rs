//! Injected time: a [`Clock`] trait, the system clock and a manual clock for tests.
//!
//! This is the only module allowed to read the system clock.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// A source of milliseconds and of sleeping until a given millisecond.
///
/// Local lease budgets are computed on this clock; lease expiry itself is
/// decided by the lease store's clock.
pub trait Clock: Send + Sync + 'static {
    /// The current time in milliseconds (Unix milliseconds for [`SystemClock`]).
    fn now_ms(&self) -> u64;

    /// Completes once [`Clock::now_ms`] has reached `deadline_ms`.
    fn sleep_until_ms(&self, deadline_ms: u64) -> impl Future<Output = ()> + Send;
}

/// The system clock: Unix milliseconds at construction, advanced monotonically.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    base: Instant,
    base_unix_ms: u64,
}

impl SystemClock {
    /// Reads the system clock once.
    #[allow(
        clippy::disallowed_methods,
        reason = "the clock module is where system time is read"
    )]
    pub fn new() -> Self {
        let base_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            base: Instant::now(),
            base_unix_ms,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.base_unix_ms.saturating_add(elapsed)
    }

    fn sleep_until_ms(&self, deadline_ms: u64) -> impl Future<Output = ()> + Send {
        let wait = deadline_ms.saturating_sub(self.now_ms());
        tokio::time::sleep(Duration::from_millis(wait))
    }
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<watch::Sender<u64>>,
}

impl ManualClock {
    /// A manual clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self {
            now: Arc::new(watch::Sender::new(start_ms)),
        }
    }

    /// Moves the clock forward by `ms`, waking sleepers whose deadline passed.
    pub fn advance(&self, ms: u64) {
        self.now.send_modify(|t| *t = t.saturating_add(ms));
    }

    /// Sets the clock to `ms` if that is later than now.
    pub fn set(&self, ms: u64) {
        self.now.send_modify(|t| *t = (*t).max(ms));
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        *self.now.borrow()
    }

    fn sleep_until_ms(&self, deadline_ms: u64) -> impl Future<Output = ()> + Send {
        let mut rx = self.now.subscribe();
        async move {
            // The sender lives as long as any clone of this clock; if it is
            // gone, time can never reach the deadline, so wait forever.
            if rx.wait_for(|t| *t >= deadline_ms).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}
