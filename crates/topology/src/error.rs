//! The coordinator's error type.

use durability_outbox::OutboxError;
use durability_scheduler::{SchedulerError, StorageError, StorageErrorKind};
use durability_topology_client::BoxError;

/// Everything that can go wrong in the coordinator. Every rejection happens
/// before anything is written: the stored state is exactly as before.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// The group name is empty, too long, or holds control characters.
    #[error("invalid group name: {reason}")]
    InvalidGroup {
        /// Why.
        reason: &'static str,
    },
    /// A member's ID or location hint is refused.
    #[error("invalid member {id:?}: {reason}")]
    InvalidMember {
        /// The member ID as given.
        id: String,
        /// Why.
        reason: String,
    },
    /// The same member ID appears twice in a draft.
    #[error("duplicate member {id:?}")]
    DuplicateMember {
        /// The repeated ID.
        id: String,
    },
    /// A draft set an empty member list: use `delete`.
    #[error("a group needs at least one member; use delete to remove it")]
    EmptyMembers,
    /// More members than [`durability_topology_client::MAX_MEMBERS`].
    #[error("{count} members exceeds the limit of {limit}")]
    TooManyMembers {
        /// Members in the draft.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// A member's metadata is larger than
    /// [`durability_topology_client::MAX_META_BYTES`].
    #[error("metadata of member {id:?} is {size} bytes, over the limit of {limit}")]
    MetadataTooLarge {
        /// The member.
        id: String,
        /// Its canonical JSON size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A member's typed metadata could not be encoded as JSON.
    #[error("metadata of member {id:?} cannot be stored: {reason}")]
    InvalidMetadata {
        /// The member.
        id: String,
        /// Why.
        reason: String,
    },
    /// The group does not exist and the draft sets no members.
    #[error("group {group:?} does not exist; set members to create it")]
    GroupNotFound {
        /// The group.
        group: String,
    },
    /// The draft sets a state channel that is not configured.
    #[error("unknown topology channel {channel:?}")]
    UnknownChannel {
        /// The channel.
        channel: String,
    },
    /// A typed state value could not be encoded as JSON.
    #[error("value of channel {channel:?} cannot be stored: {reason}")]
    InvalidState {
        /// The channel.
        channel: String,
        /// Why.
        reason: String,
    },
    /// A state value is larger than [`crate::MAX_STATE_BYTES`].
    #[error("value of channel {channel:?} is {size} bytes, over the limit of {limit}")]
    StateTooLarge {
        /// The channel.
        channel: String,
        /// The JSON size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The encoded snapshot would exceed
    /// [`durability_topology_client::MAX_SNAPSHOT_BYTES`].
    #[error("encoded snapshot of {size} bytes exceeds the limit of {limit}")]
    SnapshotTooLarge {
        /// The encoded size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A configuration setting is invalid.
    #[error("invalid topology config: {field} {reason}")]
    InvalidConfig {
        /// The setting.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A stored row failed validation.
    #[error("corrupt topology row: {reason}")]
    Corrupt {
        /// Why.
        reason: String,
    },
    /// A publisher call or a member delivery did not finish within its
    /// attempt timeout. Its outcome is unknown: it may still land.
    #[error("topology {operation} timed out after {after_ms} ms")]
    Timeout {
        /// `"publish"` or `"delivery"`.
        operation: &'static str,
        /// The attempt timeout, in milliseconds.
        after_ms: u64,
    },
    /// The publisher definitely refused a write or delete: it never lands.
    #[error("the publisher refused the call: {source}")]
    PublishRejected {
        /// The publisher's error.
        source: BoxError,
    },
    /// A publisher call failed and may or may not have been applied.
    #[error("the publisher call failed with an unknown outcome: {source}")]
    PublishOutcomeUnknown {
        /// The publisher's error.
        source: BoxError,
    },
    /// A member refused or failed a state delivery.
    #[error("the state delivery failed: {source}")]
    DeliveryFailed {
        /// The member's (deliver function's) error.
        source: BoxError,
    },
    /// The outbox refused a stage or a channel.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// The scheduler failed (schema migration, attach).
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    /// The storage failed; the transaction rolled back. A corrupt stored
    /// row (`StorageErrorKind::Corrupt`) has the code `TOPOLOGY_CORRUPT` and
    /// is not retryable, nor is a fenced writer.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl TopologyError {
    /// Whether retrying the same call can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            // A corrupt row stays corrupt and a fenced writer stays stale.
            Self::Storage(e) => !matches!(
                e.kind(),
                StorageErrorKind::Corrupt | StorageErrorKind::Fenced
            ),
            Self::Timeout { .. }
            | Self::PublishRejected { .. }
            | Self::PublishOutcomeUnknown { .. }
            | Self::DeliveryFailed { .. } => true,
            Self::Outbox(e) => e.is_retryable(),
            Self::Scheduler(e) => e.is_retryable(),
            _ => false,
        }
    }
}

durability_time::error_codes! {
    TopologyError {
        Self::InvalidGroup { .. } => "TOPOLOGY_INVALID_GROUP",
        Self::InvalidMember { .. } => "TOPOLOGY_INVALID_MEMBER",
        Self::DuplicateMember { .. } => "TOPOLOGY_DUPLICATE_MEMBER",
        Self::EmptyMembers => "TOPOLOGY_EMPTY_MEMBERS",
        Self::TooManyMembers { .. } => "TOPOLOGY_TOO_MANY_MEMBERS",
        Self::MetadataTooLarge { .. } => "TOPOLOGY_METADATA_TOO_LARGE",
        Self::InvalidMetadata { .. } => "TOPOLOGY_INVALID_METADATA",
        Self::GroupNotFound { .. } => "TOPOLOGY_GROUP_NOT_FOUND",
        Self::UnknownChannel { .. } => "TOPOLOGY_UNKNOWN_CHANNEL",
        Self::InvalidState { .. } => "TOPOLOGY_INVALID_STATE",
        Self::StateTooLarge { .. } => "TOPOLOGY_STATE_TOO_LARGE",
        Self::SnapshotTooLarge { .. } => "TOPOLOGY_SNAPSHOT_TOO_LARGE",
        Self::InvalidConfig { .. } => "TOPOLOGY_INVALID_CONFIG",
        Self::Corrupt { .. } => "TOPOLOGY_CORRUPT",
        Self::Storage(e) if e.kind() == StorageErrorKind::Corrupt => "TOPOLOGY_CORRUPT",
        Self::Timeout { .. } => "TOPOLOGY_TIMEOUT",
        Self::PublishRejected { .. } => "TOPOLOGY_PUBLISH_REJECTED",
        Self::PublishOutcomeUnknown { .. } => "TOPOLOGY_PUBLISH_OUTCOME_UNKNOWN",
        Self::DeliveryFailed { .. } => "TOPOLOGY_DELIVERY_FAILED",
        Self::Outbox(e) => e.code(),
        Self::Scheduler(e) => e.code(),
        Self::Storage(_) => "TOPOLOGY_STORAGE",
    }
}
