//! The outbox's error type.

use durability_scheduler::{SchedulerError, StorageError, StorageErrorKind};

/// Everything that can go wrong staging or configuring an outbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The channel name is empty, too long, or holds control characters.
    #[error("invalid channel name {name:?}: {reason}")]
    InvalidChannel {
        /// The refused name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The key is empty, too long, or holds control characters.
    #[error("invalid key: {reason}")]
    InvalidKey {
        /// Why.
        reason: &'static str,
    },
    /// The encoded value is larger than [`crate::MAX_VALUE_BYTES`].
    #[error("value of {size} bytes exceeds the limit of {limit} bytes")]
    ValueTooLarge {
        /// The encoded size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The value could not be encoded.
    #[error("value could not be encoded: {0}")]
    Encode(String),
    /// The value does not read back through the channel's codec (postcard
    /// cannot decode `#[serde(tag = ...)]` enums or `serde_json::Value`,
    /// say); nothing was written. Choose another codec
    /// ([`crate::ChannelConfig::codec`]) or change the type.
    #[error("value does not round-trip through the {codec} codec: {reason}")]
    ValueDoesNotRoundTrip {
        /// The channel's codec.
        codec: &'static str,
        /// Why.
        reason: String,
    },
    /// A policy setting is out of range.
    #[error("invalid policy: {field} {reason}")]
    InvalidPolicy {
        /// The setting.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The object-wide version counter reached 2^53-1.
    #[error("outbox versions are exhausted")]
    VersionsExhausted,
    /// Attaching the channel to the scheduler failed (a duplicate channel, a
    /// schema problem).
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    /// The storage failed; the transaction rolled back. A stored value that
    /// fails strict decoding (a corrupt version counter) has the code
    /// `OUTBOX_CORRUPT` and is not retryable.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl OutboxError {
    /// Whether retrying the same call can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Storage(e) => e.kind() != StorageErrorKind::Corrupt,
            Self::Scheduler(e) => e.is_retryable(),
            _ => false,
        }
    }
}

durability_time::error_codes! {
    OutboxError {
        Self::InvalidChannel { .. } => "OUTBOX_INVALID_CHANNEL",
        Self::InvalidKey { .. } => "OUTBOX_INVALID_KEY",
        Self::ValueTooLarge { .. } => "OUTBOX_VALUE_TOO_LARGE",
        Self::Encode(_) => "OUTBOX_ENCODE_FAILED",
        Self::ValueDoesNotRoundTrip { .. } => "OUTBOX_VALUE_NOT_ROUND_TRIP",
        Self::InvalidPolicy { .. } => "OUTBOX_INVALID_POLICY",
        Self::VersionsExhausted => "OUTBOX_VERSIONS_EXHAUSTED",
        Self::Scheduler(e) => e.code(),
        Self::Storage(e) if e.kind() != StorageErrorKind::Corrupt => "OUTBOX_STORAGE",
        Self::Storage(_) => "OUTBOX_CORRUPT",
    }
}

/// The error a sink or dead-letter sink returns for a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SinkError(pub String);

impl SinkError {
    /// A sink error with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}
