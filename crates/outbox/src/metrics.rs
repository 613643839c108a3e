//! The outbox's metrics, recorded through the `metrics` facade (names in
//! ARCHITECTURE.md, "Metrics"). Handles are registered per channel when it
//! is attached, with the recorder installed at that moment (install it
//! before attaching channels; with none, recording is a no-op).
//!
//! The pending gauge (`durability_outbox_pending`) is the sum over every
//! attached channel of a name in the process (one per object): each
//! [`Pending`] adds what it knows of its own channel and takes it back when
//! the channel is dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

use crate::event::EventKind;

/// One channel's metric handles, labelled `channel`.
#[derive(Debug, Clone)]
pub(crate) struct ChannelMetrics {
    staged: Counter,
    delivered: Counter,
    retried: Counter,
    dead_lettered: Counter,
    dropped: Counter,
    discarded: Counter,
    quarantined: Counter,
    lateness_ms: Histogram,
    pending: Gauge,
}

impl ChannelMetrics {
    pub(crate) fn new(channel: &str) -> Self {
        let label = [("channel", channel.to_owned())];
        Self {
            staged: counter!("durability_outbox_staged_total", &label),
            delivered: counter!("durability_outbox_delivered_total", &label),
            retried: counter!("durability_outbox_retried_total", &label),
            dead_lettered: counter!("durability_outbox_dead_lettered_total", &label),
            dropped: counter!("durability_outbox_dropped_total", &label),
            discarded: counter!("durability_outbox_discarded_total", &label),
            quarantined: counter!("durability_outbox_quarantined_total", &label),
            lateness_ms: histogram!("durability_outbox_delivery_lateness_ms", &label),
            pending: gauge!("durability_outbox_pending", &label),
        }
    }

    /// The channel's share of the pending gauge, starting at zero.
    pub(crate) fn pending(&self) -> Pending {
        Pending {
            gauge: self.pending.clone(),
            tickets: AtomicU64::new(0),
            state: Mutex::new(PendingState::default()),
        }
    }

    /// Counts one lifecycle event (attempt starts are not counted).
    pub(crate) fn record(&self, kind: &EventKind) {
        if let Some(c) = self.counter(kind) {
            c.increment(1);
        }
    }

    /// The counter of a lifecycle event, if it is counted.
    pub(crate) fn counter(&self, kind: &EventKind) -> Option<&Counter> {
        Some(match kind {
            EventKind::Staged => &self.staged,
            EventKind::Delivered => &self.delivered,
            EventKind::RetryScheduled { .. } => &self.retried,
            EventKind::DeadLettered { .. } => &self.dead_lettered,
            EventKind::Dropped { .. } => &self.dropped,
            EventKind::Discarded => &self.discarded,
            EventKind::Quarantined { .. } => &self.quarantined,
            _ => return None,
        })
    }

    /// Records how late a delivered entry was: from its due time to the
    /// sink's acknowledgement (its staging time for a first attempt),
    /// once the settlement committed.
    pub(crate) fn delivered_late_by(&self, ms: i64) {
        #[allow(clippy::cast_precision_loss)] // milliseconds well below 2^52
        self.lateness_ms.record(ms.max(0) as f64);
    }
}

/// One attached channel's share of `durability_outbox_pending`.
///
/// Every transaction that changes the channel's pending rows takes a
/// ticket inside the transaction (the storage runs an object's
/// transactions one at a time, so tickets follow commit order) and reports
/// after its commit either the count it read from the store
/// ([`Pending::counted`]) or the change it made ([`Pending::changed`]). A
/// report older than the last count applied is already part of it and is
/// ignored. Reports arrive in commit order unless two threads race between
/// commit and callback; then the figure is off by that change until the
/// next count.
#[derive(Debug)]
pub(crate) struct Pending {
    gauge: Gauge,
    tickets: AtomicU64,
    state: Mutex<PendingState>,
}

#[derive(Debug, Default)]
struct PendingState {
    /// What this channel has added to the gauge.
    known: u64,
    /// The ticket of the last count applied.
    counted_at: u64,
}

impl Pending {
    /// A ticket for the transaction running now.
    pub(crate) fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The transaction holding `ticket` committed with `n` pending entries.
    pub(crate) fn counted(&self, ticket: u64, n: u64) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if ticket <= s.counted_at {
            return;
        }
        self.move_to(&mut s, n);
        s.counted_at = ticket;
    }

    /// The transaction holding `ticket` committed a change of `delta`
    /// pending entries.
    pub(crate) fn changed(&self, ticket: u64, delta: i64) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if ticket <= s.counted_at {
            return;
        }
        let n = s.known.saturating_add_signed(delta);
        self.move_to(&mut s, n);
    }

    fn move_to(&self, s: &mut PendingState, n: u64) {
        #[allow(clippy::cast_precision_loss)] // counts well below 2^52
        if n >= s.known {
            self.gauge.increment((n - s.known) as f64);
        } else {
            self.gauge.decrement((s.known - n) as f64);
        }
        s.known = n;
    }
}

impl Drop for Pending {
    /// A dropped channel takes its entries out of the gauge (they stay
    /// stored and count again when the channel is attached again).
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        #[allow(clippy::cast_precision_loss)]
        self.gauge.decrement(s.known as f64);
    }
}

#[cfg(test)]
mod tests;
