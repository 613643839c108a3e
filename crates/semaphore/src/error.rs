//! The semaphore's error type.

use durability_scheduler::{SchedulerError, StorageError, StorageErrorKind};

use crate::store::Outcome;

/// Everything that can go wrong asking a semaphore for permits or
/// configuring a pool. Every refusal is decided before anything is written:
/// the stored state is exactly as before.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SemaphoreError {
    /// A pool name, idempotency key or holder name is empty, too long or
    /// holds control characters.
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidName {
        /// Which name (`pool`, `key`, `holder`).
        field: &'static str,
        /// The refused value.
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// A number (count, capacity, lease, wait, queue bound, retention, or
    /// the clock's time) is out of its range.
    #[error("invalid {field} {value}: {reason}")]
    InvalidNumber {
        /// Which number.
        field: &'static str,
        /// The refused value.
        value: i128,
        /// The range it must be in.
        reason: String,
    },
    /// No pool of this name was configured.
    #[error("no semaphore pool {pool:?}")]
    UnknownPool {
        /// The pool asked for.
        pool: String,
    },
    /// No request or grant has this id (it never existed, or its key was
    /// forgotten after the pool's retention).
    #[error("no semaphore request {id}")]
    UnknownGrant {
        /// The id asked for.
        id: u64,
    },
    /// A request asked for more permits than the pool's capacity: it could
    /// never be granted.
    #[error("{count} permits exceed the capacity {capacity} of pool {pool:?}")]
    CountExceedsCapacity {
        /// The pool.
        pool: String,
        /// Permits asked for.
        count: u64,
        /// The pool's capacity.
        capacity: u64,
    },
    /// A request without a wait (`wait_ms = 0`) found too few free permits,
    /// or others waiting ahead of it. Nothing was written; retry later.
    #[error("no permits free in pool {pool:?} for {count}")]
    NoPermits {
        /// The pool.
        pool: String,
        /// Permits asked for.
        count: u64,
    },
    /// The pool's queue is at its bound. Nothing was written; retry later.
    #[error("the queue of pool {pool:?} is full ({max_queue} waiting)")]
    QueueFull {
        /// The pool.
        pool: String,
        /// Its queue bound.
        max_queue: u64,
    },
    /// A retry of an idempotency key with other parameters (holder, count
    /// or lease) than the request stored under it.
    #[error("key {key:?} of pool {pool:?} was used by another request")]
    KeyConflict {
        /// The pool.
        pool: String,
        /// The key.
        key: String,
    },
    /// The grant belongs to another holder than the one calling.
    #[error("request {id} is held by {holder:?}, not the caller")]
    NotHolder {
        /// The request's id.
        id: u64,
        /// Its holder.
        holder: String,
    },
    /// The request is still queued: it holds no permits to renew or use.
    #[error("request {id} is queued, not granted")]
    NotGranted {
        /// The request's id.
        id: u64,
    },
    /// The grant is over (released, expired, timed out or cancelled): it
    /// can no longer be renewed or used. Acquire again for new permits.
    #[error("request {id} is finished ({outcome:?})")]
    Finished {
        /// The request's id.
        id: u64,
        /// How it finished.
        outcome: Outcome,
    },
    /// More permits reported used than the grant holds.
    #[error("request {id}: {used} used of {count} permits")]
    UsedExceedsCount {
        /// The request's id.
        id: u64,
        /// What would be used with this report.
        used: u64,
        /// The grant's count.
        count: u64,
    },
    /// Attaching to the scheduler failed (a second semaphore on one
    /// object, a schema problem).
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    /// The storage failed; the transaction rolled back. A stored row that
    /// fails strict decoding has the code `SEMAPHORE_CORRUPT` and is not
    /// retryable; a commit whose outcome is unknown has the code
    /// `SEMAPHORE_OUTCOME_UNKNOWN` (retry with the same key: it never
    /// grants twice).
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl SemaphoreError {
    /// Whether retrying the same call can succeed: a busy pool (no permits,
    /// full queue), a storage failure, an unknown outcome. A refusal of the
    /// request itself is not retryable.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::NoPermits { .. } | Self::QueueFull { .. } | Self::NotGranted { .. } => true,
            Self::Storage(e) => e.kind() != StorageErrorKind::Corrupt,
            Self::Scheduler(e) => e.is_retryable(),
            _ => false,
        }
    }
}

durability_time::error_codes! {
    SemaphoreError {
        Self::InvalidName { .. } => "SEMAPHORE_INVALID_NAME",
        Self::InvalidNumber { .. } => "SEMAPHORE_INVALID_NUMBER",
        Self::UnknownPool { .. } => "SEMAPHORE_UNKNOWN_POOL",
        Self::UnknownGrant { .. } => "SEMAPHORE_UNKNOWN_GRANT",
        Self::CountExceedsCapacity { .. } => "SEMAPHORE_COUNT_EXCEEDS_CAPACITY",
        Self::NoPermits { .. } => "SEMAPHORE_NO_PERMITS",
        Self::QueueFull { .. } => "SEMAPHORE_QUEUE_FULL",
        Self::KeyConflict { .. } => "SEMAPHORE_KEY_CONFLICT",
        Self::NotHolder { .. } => "SEMAPHORE_NOT_HOLDER",
        Self::NotGranted { .. } => "SEMAPHORE_NOT_GRANTED",
        Self::Finished { .. } => "SEMAPHORE_FINISHED",
        Self::UsedExceedsCount { .. } => "SEMAPHORE_USED_EXCEEDS_COUNT",
        Self::Scheduler(e) => e.code(),
        Self::Storage(e) if !matches!(e.kind(), StorageErrorKind::Corrupt | StorageErrorKind::Unknown) =>
            "SEMAPHORE_STORAGE",
        Self::Storage(e) if e.kind() == StorageErrorKind::Corrupt => "SEMAPHORE_CORRUPT",
        Self::Storage(_) => "SEMAPHORE_OUTCOME_UNKNOWN",
    }
}
