//! The outbox's metrics, recorded through the `metrics` facade (names in
//! ARCHITECTURE.md, "Metrics"). Handles are registered per channel when it
//! is attached, with the recorder installed at that moment (install it
//! before attaching channels; with none, recording is a no-op).

use metrics::{Counter, Histogram, counter, histogram};

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
        }
    }

    /// Counts one lifecycle event (attempt starts are not counted).
    pub(crate) fn record(&self, kind: &EventKind) {
        let c = match kind {
            EventKind::Staged => &self.staged,
            EventKind::Delivered => &self.delivered,
            EventKind::RetryScheduled { .. } => &self.retried,
            EventKind::DeadLettered { .. } => &self.dead_lettered,
            EventKind::Dropped { .. } => &self.dropped,
            EventKind::Discarded => &self.discarded,
            EventKind::Quarantined { .. } => &self.quarantined,
            _ => return,
        };
        c.increment(1);
    }

    /// Records how late a delivered entry was: from its due time to the
    /// sink's acknowledgement (its staging time for a first attempt),
    /// once the settlement committed.
    pub(crate) fn delivered_late_by(&self, ms: i64) {
        #[allow(clippy::cast_precision_loss)] // milliseconds well below 2^52
        self.lateness_ms.record(ms.max(0) as f64);
    }
}

#[cfg(test)]
mod tests;
