//! Lifecycle events an outbox channel reports to its hook.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

/// What happened to an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventKind {
    /// A value was staged (reported after its transaction committed).
    Staged,
    /// A publish attempt started.
    AttemptStarted,
    /// The sink acknowledged the entry.
    Delivered,
    /// The attempt failed; the entry is due again at `next_at`.
    RetryScheduled {
        /// When the entry is next due (Unix ms).
        next_at: i64,
        /// Why the attempt failed.
        error: String,
    },
    /// The pending entry was discarded (reported after commit).
    Discarded,
    /// The entry went to the dead-letter sink: it reached its maximum
    /// attempts, or its stored value cannot be decoded (`error` says which).
    DeadLettered {
        /// The last failure.
        error: String,
    },
    /// The entry reached its maximum attempts, or its stored value cannot
    /// be decoded, and, with no dead-letter sink, was dropped.
    Dropped {
        /// The last failure.
        error: String,
    },
    /// A corrupt stored row (a version, attempt or value that fails strict
    /// decoding) was moved to the quarantine; version and attempt are 0.
    /// Reported after commit.
    Quarantined {
        /// What is wrong with the row.
        reason: String,
    },
}

/// One lifecycle event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    /// The channel.
    pub channel: String,
    /// The entry's key.
    pub key: String,
    /// The entry's version (0 for a discard of nothing).
    pub version: u64,
    /// The attempt number (0 before any attempt).
    pub attempt: u32,
    /// What happened.
    pub kind: EventKind,
}

/// A lifecycle hook. A panic in it is caught and logged: hooks never break
/// delivery.
pub type EventHook = Arc<dyn Fn(&OutboxEvent) + Send + Sync>;

pub(crate) fn emit(hook: Option<&EventHook>, event: &OutboxEvent) {
    let Some(hook) = hook else { return };
    if catch_unwind(AssertUnwindSafe(|| hook(event))).is_err() {
        tracing::warn!(
            event = "durability.outbox.hook_failed",
            channel = %event.channel,
            key = %event.key,
            "lifecycle hook panicked; delivery continues"
        );
    }
}
