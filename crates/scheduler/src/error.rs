//! The scheduler's error type.

use crate::storage::StorageError;

/// Everything that can go wrong in the scheduler.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchedulerError {
    /// The object ID is empty, too long, or holds NUL.
    #[error("invalid object id: {reason}")]
    InvalidObjectId {
        /// Why the ID was refused.
        reason: &'static str,
    },
    /// A capability name is empty, too long, or holds control characters.
    #[error("invalid capability name {name:?}: {reason}")]
    InvalidCapabilityName {
        /// The refused name.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A capability with this name is already attached to the scheduler.
    #[error("capability {name:?} is already attached")]
    DuplicateCapability {
        /// The name attached twice.
        name: String,
    },
    /// The backend registers no schema for this capability.
    #[error("no schema is registered for capability {capability:?}")]
    UnknownSchema {
        /// The capability.
        capability: String,
    },
    /// `migrate` named a version the capability's schema does not have.
    #[error("capability {capability:?} has no schema version named {target:?}")]
    UnknownSchemaTarget {
        /// The capability.
        capability: String,
        /// The unknown target.
        target: String,
    },
    /// The stored schema is newer than any version this code knows.
    #[error("stored schema of {capability:?} is at version {stored}, newer than {latest}")]
    SchemaAhead {
        /// The capability.
        capability: String,
        /// The stored version.
        stored: u32,
        /// The newest version this code registers.
        latest: u32,
    },
    /// The storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl SchedulerError {
    /// Whether retrying the same call can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Storage(_))
    }
}

durability_time::error_codes! {
    SchedulerError {
        Self::InvalidObjectId { .. } => "SCHEDULER_INVALID_OBJECT_ID",
        Self::InvalidCapabilityName { .. } => "SCHEDULER_INVALID_CAPABILITY_NAME",
        Self::DuplicateCapability { .. } => "SCHEDULER_DUPLICATE_CAPABILITY",
        Self::UnknownSchema { .. } => "SCHEDULER_UNKNOWN_SCHEMA",
        Self::UnknownSchemaTarget { .. } => "SCHEDULER_UNKNOWN_SCHEMA_TARGET",
        Self::SchemaAhead { .. } => "SCHEDULER_SCHEMA_AHEAD",
        Self::Storage(_) => "SCHEDULER_STORAGE",
    }
}
