//! The one error type of the ownership crate and its retry classification.

use std::error::Error as StdError;

/// A boxed backend error kept as the source of an [`OwnershipError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What an error proves about the work it guarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchOutcome {
    /// The guarded work never started (or its commit was refused and rolled
    /// back): one retry through a fresh owner resolution is safe for every
    /// method, idempotent or not.
    NotStarted,
    /// The guarded work may have run: only idempotent reads may be retried.
    Unknown,
}

/// Every failure of owner resolution, leases, admission, drain and fencing.
///
/// Each variant has a stable machine code ([`OwnershipError::code`]), says
/// whether retrying can help ([`OwnershipError::is_retryable`]) and what it
/// proves about the guarded work ([`OwnershipError::outcome`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OwnershipError {
    /// A name, id or number given to the ownership layer breaks its grammar or limit.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// Which input was rejected (`storage id`, `class name`, `shard`, ...).
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// A persisted owner record is malformed or does not reconstruct the
    /// scope it was read under; the scope fails closed.
    #[error("invalid owner record for {scope}: {reason}")]
    InvalidOwnerRecord {
        /// The scope under which the record was read.
        scope: String,
        /// Why the record was rejected.
        reason: String,
    },
    /// Persisted lifecycle state (active storage pointer, delete lock, generation
    /// counter) is malformed; the scope fails closed.
    #[error("invalid lifecycle state for {lifecycle}: {reason}")]
    InvalidLifecycleState {
        /// The lifecycle (or scope) whose state is malformed.
        lifecycle: String,
        /// Why it was rejected.
        reason: String,
    },
    /// This task does not hold the current owner lease of the scope (the
    /// generation moved on, the record changed, or the scope was never claimed
    /// here). Proven pre-dispatch.
    #[error("stale owner for {scope}")]
    StaleOwner {
        /// The scope.
        scope: String,
    },
    /// A concurrent claimant changed the owner state while this claim was
    /// being decided; nothing was written.
    #[error("owner race for {scope}")]
    OwnerRace {
        /// The scope.
        scope: String,
    },
    /// The local lease of the scope has expired.
    #[error("owner lease expired for {scope}")]
    LeaseExpired {
        /// The scope.
        scope: String,
    },
    /// The active storage pointer of the lifecycle no longer names the scope's
    /// storage id (missing or moved).
    #[error("storage {storage_id} is not the active storage")]
    StorageInactive {
        /// The scope's storage id.
        storage_id: String,
    },
    /// A whole-delete lock is held on the lifecycle: ownership is rejected.
    #[error("whole delete lock held on {lifecycle}")]
    DeleteLocked {
        /// The locked lifecycle.
        lifecycle: String,
    },
    /// This task is draining and accepts no new ownership or work.
    #[error("task is draining")]
    Draining,
    /// The lease store could not be reached; the request was never sent.
    #[error("owner store unavailable: {source}")]
    StoreUnavailable {
        /// The backend error.
        #[source]
        source: BoxError,
    },
    /// The lease store failed after the request may have been applied: the
    /// outcome is unknown.
    #[error("owner unavailable (the outcome is unknown): {source}")]
    OwnerUnavailable {
        /// The backend error.
        #[source]
        source: BoxError,
    },
    /// Running work lost its ownership (renewal stopped or ownership moved);
    /// the watchdog cancelled it.
    #[error("ownership lost while work was running for {scope}")]
    OwnershipLost {
        /// The scope.
        scope: String,
    },
    /// The object storage fence refused a commit from an older generation;
    /// the transaction did not commit.
    #[error("stale generation {attempted} for {scope}: storage is fenced at {stored}")]
    StaleGeneration {
        /// The scope.
        scope: String,
        /// The generation the commit carried.
        attempted: u64,
        /// The generation recorded in the object's storage.
        stored: u64,
    },
    /// The object storage fence has not recorded this generation yet (record
    /// it at the first dispatch after the claim).
    #[error("generation {attempted} for {scope} is not recorded in the storage fence")]
    FenceNotRecorded {
        /// The scope.
        scope: String,
        /// The generation the commit carried.
        attempted: u64,
    },
    /// The storage id's recorded shard count differs from the count this
    /// scope was built under: two hosts with different counts would own one
    /// object under two scopes. Nothing was written; fix the configuration
    /// (the count is a property of the storage id, recorded once).
    #[error(
        "storage {storage_id} is recorded with {recorded} shards per class, not {requested}: \
         start every host of this storage id with {recorded} shards"
    )]
    ShardCountMismatch {
        /// The storage id.
        storage_id: String,
        /// The count recorded in the lifecycle record.
        recorded: u32,
        /// The count the refused scope was built under.
        requested: u32,
    },
    /// An object's storage fence recorded another scope for the object than
    /// the claim's (the same object under another shard count): the claim is
    /// refused and nothing is written.
    #[error("object fenced under scope {recorded}, refused a claim of scope {attempted}")]
    ObjectScopeMismatch {
        /// The scope recorded in the object's fence.
        recorded: String,
        /// The scope of the refused claim.
        attempted: String,
    },
    /// Another live process runs with this process's task id: it renewed an
    /// owner record of this task id that this process did not write. Task
    /// ids must be unique per process; this process must stop.
    #[error(
        "another process runs with task id {task_id} (it renews {scope}): task ids must be unique"
    )]
    DuplicateTaskId {
        /// The duplicated task id.
        task_id: String,
        /// The scope where the other process was seen renewing.
        scope: String,
    },
}

impl OwnershipError {
    /// What this error proves about the guarded work.
    ///
    /// Everything raised before dispatch proves the work never started; an
    /// unavailable owner and work cancelled mid-flight leave it unknown.
    pub fn outcome(&self) -> DispatchOutcome {
        match self {
            Self::OwnerUnavailable { .. } | Self::OwnershipLost { .. } => DispatchOutcome::Unknown,
            _ => DispatchOutcome::NotStarted,
        }
    }

    /// Whether retrying (through a fresh owner resolution) can help.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::StaleOwner { .. }
                | Self::OwnerRace { .. }
                | Self::LeaseExpired { .. }
                | Self::Draining
                | Self::StoreUnavailable { .. }
                | Self::OwnerUnavailable { .. }
                | Self::OwnershipLost { .. }
                | Self::StaleGeneration { .. }
        )
    }

    /// Whether one retry is allowed for a request: retryable errors that prove
    /// the work never started allow it for every method; outcome-unknown
    /// errors allow it only for idempotent reads.
    pub fn may_retry(&self, idempotent: bool) -> bool {
        self.is_retryable() && (idempotent || self.outcome() == DispatchOutcome::NotStarted)
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            what,
            reason: reason.into(),
        }
    }
}

durability_time::error_codes! {
    OwnershipError {
        Self::InvalidInput { .. } => "invalid_input",
        Self::InvalidOwnerRecord { .. } => "invalid_owner_record",
        Self::InvalidLifecycleState { .. } => "invalid_lifecycle_state",
        Self::StaleOwner { .. } => "stale_owner",
        Self::OwnerRace { .. } => "owner_race",
        Self::LeaseExpired { .. } => "lease_expired",
        Self::StorageInactive { .. } => "storage_inactive",
        Self::DeleteLocked { .. } => "worker_delete_locked",
        Self::Draining => "draining",
        Self::StoreUnavailable { .. } => "owner_store_unavailable",
        Self::OwnerUnavailable { .. } => "owner_unavailable",
        Self::OwnershipLost { .. } => "ownership_lost",
        Self::StaleGeneration { .. } => "stale_generation",
        Self::FenceNotRecorded { .. } => "fence_not_recorded",
        Self::ShardCountMismatch { .. } => "shard_count_mismatch",
        Self::ObjectScopeMismatch { .. } => "object_scope_mismatch",
        Self::DuplicateTaskId { .. } => "duplicate_task_id",
    }
}

#[cfg(test)]
mod tests;
