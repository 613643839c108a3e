//! What the semaphore reports: lifecycle events to a hook, `tracing`
//! events named `durability.semaphore.*`, and counters through the
//! `metrics` facade.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use metrics::counter;

use crate::store::Outcome;

/// What happened to a request or a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventKind {
    /// Permits were granted (on arrival, or to a waiter when permits
    /// returned). A host wakes the waiting shard on this.
    Granted {
        /// The lease deadline (Unix ms, the holder's clock).
        lease_until: i64,
    },
    /// The request joined the queue.
    Queued {
        /// When it leaves the queue ungranted.
        deadline: i64,
    },
    /// The grant's lease was renewed.
    Renewed {
        /// The new lease deadline.
        lease_until: i64,
    },
    /// More permits of the grant were reported used.
    Used {
        /// Permits this report added to the grant's used total.
        n: u64,
    },
    /// The request finished: released, expired, timed out or cancelled.
    Finished {
        /// How.
        outcome: Outcome,
    },
    /// The pool was created or its settings changed; `count` is the new
    /// capacity.
    Configured {
        /// The capacity before (`None` for a new pool).
        from: Option<u64>,
    },
}

/// One lifecycle event, reported after its transaction committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreEvent {
    /// The pool.
    pub pool: String,
    /// The request's idempotency key (empty for a pool event).
    pub key: String,
    /// The request's holder (empty for a pool event).
    pub holder: String,
    /// The request's id (0 for a pool event).
    pub id: u64,
    /// The request's permits (the capacity, for a pool event).
    pub count: u64,
    /// What happened.
    pub kind: EventKind,
}

/// A lifecycle hook. A panic in it is caught and logged: hooks never break
/// the semaphore.
pub type EventHook = Arc<dyn Fn(&SemaphoreEvent) + Send + Sync>;

/// Reports one committed event: the hook, a `tracing` event, a counter.
pub(crate) fn emit(hook: Option<&EventHook>, e: &SemaphoreEvent) {
    record(e);
    let Some(hook) = hook else { return };
    if catch_unwind(AssertUnwindSafe(|| hook(e))).is_err() {
        tracing::warn!(
            event = "durability.semaphore.hook_failed",
            pool = %e.pool,
            id = e.id,
            "semaphore event hook panicked; the semaphore continues"
        );
    }
}

fn record(e: &SemaphoreEvent) {
    let pool = e.pool.clone();
    match &e.kind {
        EventKind::Granted { lease_until } => {
            counter!("durability_semaphore_granted_total", "pool" => pool).increment(e.count);
            tracing::debug!(event = "durability.semaphore.granted", pool = %e.pool, id = e.id, holder = %e.holder, count = e.count, lease_until, "permits granted");
        }
        EventKind::Queued { deadline } => {
            counter!("durability_semaphore_queued_total", "pool" => pool).increment(1);
            tracing::debug!(event = "durability.semaphore.queued", pool = %e.pool, id = e.id, holder = %e.holder, count = e.count, deadline, "request queued");
        }
        EventKind::Renewed { lease_until } => {
            tracing::debug!(event = "durability.semaphore.renewed", pool = %e.pool, id = e.id, lease_until, "grant renewed");
        }
        EventKind::Used { n } => {
            counter!("durability_semaphore_used_total", "pool" => pool).increment(*n);
            tracing::debug!(event = "durability.semaphore.used", pool = %e.pool, id = e.id, n, "permits used");
        }
        EventKind::Finished { outcome } => finished(e, *outcome),
        EventKind::Configured { from } => {
            tracing::info!(event = "durability.semaphore.configured", pool = %e.pool, capacity = e.count, from = ?from, "pool configured");
        }
    }
}

/// Reports a request row moved to the quarantine (after its commit).
pub(crate) fn quarantined(row: &crate::store::CorruptRequest) {
    counter!("durability_semaphore_quarantined_total", "pool" => row.pool.clone()).increment(1);
    tracing::warn!(
        event = "durability.semaphore.quarantined",
        pool = %row.pool,
        key = %row.key,
        reason = %row.reason,
        "a corrupt semaphore request row was moved to the quarantine; its permits stay held"
    );
}

/// Reports a deleted pool (after its commit).
pub(crate) fn pool_deleted(pool: &str, existed: bool) {
    tracing::warn!(
        event = "durability.semaphore.pool_deleted",
        pool = %pool,
        existed,
        "a semaphore pool and its requests were deleted; its live grants are forgotten"
    );
}

fn finished(e: &SemaphoreEvent, outcome: Outcome) {
    let pool = e.pool.clone();
    match outcome {
        Outcome::Released => {
            counter!("durability_semaphore_released_total", "pool" => pool).increment(e.count);
            tracing::debug!(event = "durability.semaphore.released", pool = %e.pool, id = e.id, count = e.count, "permits released");
        }
        Outcome::Expired => {
            counter!("durability_semaphore_expired_total", "pool" => pool).increment(e.count);
            tracing::warn!(event = "durability.semaphore.expired", pool = %e.pool, id = e.id, holder = %e.holder, count = e.count, "a grant's lease passed without renewal; its permits returned to the pool");
        }
        Outcome::TimedOut => {
            counter!("durability_semaphore_timed_out_total", "pool" => pool).increment(1);
            tracing::info!(event = "durability.semaphore.timed_out", pool = %e.pool, id = e.id, holder = %e.holder, "a queued request reached its deadline ungranted");
        }
        Outcome::Cancelled => {
            counter!("durability_semaphore_cancelled_total", "pool" => pool).increment(1);
            tracing::debug!(event = "durability.semaphore.cancelled", pool = %e.pool, id = e.id, "a queued request left the queue ungranted");
        }
    }
}
