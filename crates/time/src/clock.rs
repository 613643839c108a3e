//! The [`Clock`] trait, the system clock, and a manual clock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use tokio::sync::oneshot;

/// A source of Unix-millisecond time and of sleeps measured against it.
///
/// Object-safe: capabilities hold an `Arc<dyn Clock>`; generic code takes
/// `C: Clock` (an `Arc<C>` is a clock too).
pub trait Clock: Send + Sync + 'static {
    /// The current time in Unix milliseconds.
    fn now_ms(&self) -> i64;

    /// A future that completes once [`Clock::now_ms`] is at least `at_ms`
    /// (at once when it already is).
    fn sleep_until(&self, at_ms: i64) -> BoxFuture<'static, ()>;

    /// [`Clock::now_ms`] as unsigned milliseconds (a time before 1970 reads
    /// as 0), for code that keeps lease budgets and TTLs unsigned.
    fn now_ms_u64(&self) -> u64 {
        u64::try_from(self.now_ms()).unwrap_or(0)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> i64 {
        (**self).now_ms()
    }

    fn sleep_until(&self, at_ms: i64) -> BoxFuture<'static, ()> {
        (**self).sleep_until(at_ms)
    }
}

/// The production clock: the wall clock read once per process, advanced by
/// the monotonic clock from then on.
///
/// Every `SystemClock` of a process shares that one reading, so two of them
/// never disagree and time never moves backwards when the wall clock is
/// stepped (an NTP correction, an operator's `date -s`). The price is that a
/// step of the wall clock after the first reading is not followed; a process
/// that must follow it restarts. Sleeps run on the tokio timer, so they need
/// a tokio runtime with the time driver.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// The process's one wall-clock reading and the instant it was taken.
fn base() -> &'static (Instant, i64) {
    static BASE: OnceLock<(Instant, i64)> = OnceLock::new();
    BASE.get_or_init(|| {
        #[allow(
            clippy::disallowed_methods,
            reason = "the system clock is the one place that reads the OS clocks"
        )]
        let (instant, wall) = (Instant::now(), SystemTime::now());
        let unix = wall
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        (instant, unix)
    })
}

impl SystemClock {
    /// The system clock (reads the wall clock on the process's first use).
    pub fn new() -> Self {
        let _ = base();
        Self
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        let (instant, unix) = base();
        let elapsed = i64::try_from(instant.elapsed().as_millis()).unwrap_or(i64::MAX);
        unix.saturating_add(elapsed)
    }

    fn sleep_until(&self, at_ms: i64) -> BoxFuture<'static, ()> {
        let wait = u64::try_from(at_ms.saturating_sub(self.now_ms())).unwrap_or(0);
        Box::pin(tokio::time::sleep(Duration::from_millis(wait)))
    }
}

/// A clock that moves only when told to; sleepers wake as it passes them.
///
/// It never moves backwards: [`ManualClock::set`] to an earlier time and
/// [`ManualClock::advance`] by a negative amount leave it where it is.
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

impl Default for ManualClock {
    fn default() -> Self {
        Self::new(0)
    }
}

impl ManualClock {
    /// A manual clock reading `start_ms`.
    pub fn new(start_ms: i64) -> Self {
        Self {
            inner: Arc::new(Mutex::new(ManualInner {
                now: start_ms,
                next_id: 0,
                sleepers: BTreeMap::new(),
            })),
        }
    }

    /// Moves time forward by `ms` (a negative `ms` is a no-op) and wakes
    /// every sleeper now due.
    pub fn advance(&self, ms: i64) {
        let mut inner = lock(&self.inner);
        let to = inner.now.saturating_add(ms.max(0));
        inner.move_to(to);
    }

    /// Sets time to `at_ms` and wakes every sleeper now due. Time never
    /// moves backwards: an `at_ms` earlier than now is a no-op.
    pub fn set(&self, at_ms: i64) {
        let mut inner = lock(&self.inner);
        let to = inner.now.max(at_ms);
        inner.move_to(to);
    }

    /// The earliest time some sleeper waits for, if any.
    pub fn next_wake(&self) -> Option<i64> {
        let mut inner = lock(&self.inner);
        inner.prune();
        inner.sleepers.keys().next().map(|(at, _)| *at)
    }
}

impl ManualInner {
    fn move_to(&mut self, to: i64) {
        self.now = to;
        let later = self.sleepers.split_off(&(to.saturating_add(1), 0));
        let due = std::mem::replace(&mut self.sleepers, later);
        for (_, waker) in due {
            let _ = waker.send(());
        }
    }

    /// Forgets sleepers whose futures were dropped before they woke (a
    /// deadline that lost its race), so they neither count as waiting nor
    /// pile up.
    fn prune(&mut self) {
        self.sleepers.retain(|_, waker| !waker.is_closed());
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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

/// The system clock shifted so that it read a chosen time when it was made:
/// time still passes at the system clock's rate (operator tools that report
/// "as of" a given time while a run goes on).
#[derive(Debug, Clone, Copy)]
pub struct ShiftedClock {
    offset: i64,
}

impl ShiftedClock {
    /// A clock reading `start_ms` now.
    pub fn starting_at(start_ms: i64) -> Self {
        Self {
            offset: start_ms.saturating_sub(SystemClock.now_ms()),
        }
    }
}

impl Clock for ShiftedClock {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms().saturating_add(self.offset)
    }

    fn sleep_until(&self, at_ms: i64) -> BoxFuture<'static, ()> {
        SystemClock.sleep_until(at_ms.saturating_sub(self.offset))
    }
}
