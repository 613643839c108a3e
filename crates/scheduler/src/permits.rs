//! Flow control for capabilities: a permit hook a delivery loop holds while
//! a delivery runs.
//!
//! A capability that calls out of the object (the outbox's sink, the alarm
//! dispatcher's deliveries) can be given a [`Permits`] source. It asks for
//! a [`Permit`] before it starts a delivery and holds it until the delivery
//! ended; dropping the permit gives it back. Where the permits come from is
//! not this crate's business: a cluster-wide semaphore held by one object
//! (`durability-host`'s `semaphore` module), a local limiter, a test double.
//!
//! The contract a delivery loop keeps:
//!
//! - **Nothing is delivered outside a permit.** The permit is taken before
//!   the delivery starts and dropped after it ended (settled, failed or
//!   timed out).
//! - **Nothing is lost without one.** A [`PermitError`] means the delivery
//!   did not start: the work stays pending, unclaimed and with no attempt
//!   used, and is looked at again after [`PermitError::retry_in_ms`].
//! - **At most [`Permit::entries`] items go under one permit**: a permit
//!   source that counts items (a rate limit: R per interval) grants for a
//!   number of items; one that counts calls (a concurrency limit: N in
//!   flight) grants for as many as were asked.

use std::fmt;

use futures::future::BoxFuture;

/// Permission to run one delivery of at most [`Permit::entries`] items.
/// Dropping it gives the permit back (runs its release hook once).
pub struct Permit {
    entries: usize,
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("entries", &self.entries)
            .field("release", &self.release.is_some())
            .finish()
    }
}

impl Permit {
    /// A permit for at most `entries` items (at least 1), with nothing to
    /// do on release.
    pub fn new(entries: usize) -> Self {
        Self {
            entries: entries.max(1),
            release: None,
        }
    }

    /// Runs `release` when the permit is dropped (the holder gives the
    /// permit back; a panic in it is the caller's).
    #[must_use]
    pub fn on_release(mut self, release: impl FnOnce() + Send + 'static) -> Self {
        self.release = Some(Box::new(release));
        self
    }

    /// How many items may go under this permit.
    pub fn entries(&self) -> usize {
        self.entries
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// No permit now: the delivery does not start and its work stays pending.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no permit: {reason} (retry in {retry_in_ms} ms)")]
pub struct PermitError {
    /// When to ask again (ms, at least 1).
    pub retry_in_ms: i64,
    /// Why (for logs): the pool is busy, the holder is unreachable, the
    /// answer was lost (an unknown outcome is never a delivery).
    pub reason: String,
}

impl PermitError {
    /// No permit; ask again after `retry_in_ms` (clamped to at least 1 ms).
    pub fn new(retry_in_ms: i64, reason: impl Into<String>) -> Self {
        Self {
            retry_in_ms: retry_in_ms.max(1),
            reason: reason.into(),
        }
    }
}

durability_time::error_codes! { PermitError { Self { .. } => "SCHEDULER_PERMIT_UNAVAILABLE" } }

/// A source of permits a delivery loop holds while a delivery runs.
pub trait Permits: Send + Sync + 'static {
    /// A permit for a delivery of up to `want` items (at least 1), or why
    /// not. The permit may allow fewer items than asked
    /// ([`Permit::entries`]); the caller delivers at most that many.
    fn acquire(&self, want: usize) -> BoxFuture<'_, Result<Permit, PermitError>>;
}

impl<P: Permits + ?Sized> Permits for std::sync::Arc<P> {
    fn acquire(&self, want: usize) -> BoxFuture<'_, Result<Permit, PermitError>> {
        (**self).acquire(want)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn a_permit_runs_its_release_once_when_dropped_and_allows_at_least_one_item() {
        let released = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&released);
        let permit = Permit::new(0).on_release(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(permit.entries(), 1);
        assert_eq!(released.load(Ordering::SeqCst), 0);
        drop(permit);
        assert_eq!(released.load(Ordering::SeqCst), 1);
        let e = PermitError::new(-5, "busy");
        assert_eq!((e.retry_in_ms, e.code()), (1, PermitError::CODES[0]));
    }
}
