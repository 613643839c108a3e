//! The coordinator's lifecycle events: its outbox channels' events, and the
//! failures it reports (`publish_failed`, `restage_failed`,
//! `delivery_failed`), each with a typed error.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use durability_outbox::OutboxEvent;

use crate::error::TopologyError;

/// One lifecycle event of a coordinator.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum TopologyEvent {
    /// An event of the publication channel (`durability.topology`, keyed by
    /// group) or of a state channel (`durability.topology.<name>`, keyed by
    /// `["group","member"]` as JSON).
    Outbox(OutboxEvent),
    /// A publisher write or delete failed; the publication is retried.
    /// `error` is [`TopologyError::PublishRejected`],
    /// [`TopologyError::PublishOutcomeUnknown`], [`TopologyError::Timeout`]
    /// (operation `"publish"`), or a storage error settling the write.
    PublishFailed {
        /// The group.
        group: String,
        /// The outbox attempt (0: the publish attempt after a commit could
        /// not start).
        attempt: u32,
        /// Why.
        error: Arc<TopologyError>,
    },
    /// A write abandoned at its timeout settled later, and restaging the
    /// latest snapshot failed; the write record still holds newer writes
    /// until its landing deadline, when the snapshot is written again.
    RestageFailed {
        /// The group.
        group: String,
        /// Why.
        error: Arc<TopologyError>,
    },
    /// A state delivery to a member failed; that member is retried alone.
    /// `error` is [`TopologyError::DeliveryFailed`],
    /// [`TopologyError::Timeout`] (operation `"delivery"`) or
    /// [`TopologyError::Corrupt`] (a stored delivery that does not decode).
    DeliveryFailed {
        /// The group.
        group: String,
        /// The state channel.
        channel: String,
        /// The member ID (empty when the stored delivery does not decode).
        member: String,
        /// The outbox attempt.
        attempt: u32,
        /// Why.
        error: Arc<TopologyError>,
    },
    /// `delete` removed a group whose stored members do not decode. The
    /// deliveries of the members that could still be read (`discarded`)
    /// were discarded; the group is deleted and its deletion published as
    /// for any group.
    CorruptGroupDeleted {
        /// The group.
        group: String,
        /// The member IDs whose pending deliveries were discarded.
        discarded: Vec<String>,
        /// Why the stored members do not decode
        /// ([`TopologyError::Corrupt`]).
        error: Arc<TopologyError>,
    },
}

/// A lifecycle hook. A panic in it is caught and logged: hooks never break
/// publication or delivery.
pub type TopologyEventHook = Arc<dyn Fn(&TopologyEvent) + Send + Sync>;

pub(crate) fn emit(hook: Option<&TopologyEventHook>, event: &TopologyEvent) {
    let Some(hook) = hook else { return };
    if catch_unwind(AssertUnwindSafe(|| hook(event))).is_err() {
        tracing::warn!(
            event = "durability.topology.hook_failed",
            "lifecycle hook panicked; publication and delivery continue"
        );
    }
}
