//! The alarms error type: one enum with stable codes (`do_alarm_*`,
//! the alarm API's wire spelling).

use durability_scheduler::StorageError;

/// A boxed backend error kept as a source (never shown to tenants).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong with alarms.
///
/// The three backend variants are the classes a tenant sees:
/// [`AlarmError::BackendUnavailable`] (request setup failed: nothing
/// changed), [`AlarmError::BackendFailed`] (the backend rejected the request
/// before mutating its index) and [`AlarmError::ResultUnknown`] (the backend
/// may or may not have applied it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AlarmError {
    /// A time is not a non-negative safe integer of Unix milliseconds.
    #[error("invalid alarm time {at}: must be an integer in 0..=2^53-1 ms")]
    InvalidTime {
        /// The refused time.
        at: i64,
    },
    /// A token is empty, too long or not `[0-9A-Za-z_-]`.
    #[error("invalid alarm token: {reason}")]
    InvalidToken {
        /// Why it was refused.
        reason: &'static str,
    },
    /// A configuration value is out of range.
    #[error("invalid alarm configuration: {reason}")]
    InvalidConfig {
        /// Why it was refused.
        reason: String,
    },
    /// The backend request could not be set up; nothing changed.
    #[error("alarm backend unavailable")]
    BackendUnavailable {
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// The backend rejected the request before mutating its index.
    #[error("alarm backend rejected the request")]
    BackendFailed {
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// The backend may or may not have applied the mutation (transport
    /// failure, deadline, malformed reply). Call again to be sure.
    #[error("alarm backend result unknown")]
    ResultUnknown {
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// Alarm writes are refused inside a synchronous transaction: it cannot
    /// await the backend flush.
    #[error("alarm writes are not supported in a synchronous transaction")]
    SyncTransaction,
    /// Alarm calls are refused inside a nested transaction: releasing it is
    /// not a commit boundary.
    #[error("alarm calls are not supported in a nested transaction")]
    NestedTransaction,
    /// The transaction was rolled back (or already finished): no further
    /// alarm calls on it.
    #[error("the transaction is closed")]
    TransactionClosed,
    /// A backend reply or stored row failed validation.
    #[error("malformed alarm data: {reason}")]
    Corrupt {
        /// What was wrong.
        reason: String,
    },
    /// A dispatch response exceeded the 16 KiB cap.
    #[error("alarm response exceeds {limit} bytes")]
    ResponseTooLarge {
        /// The cap in bytes.
        limit: usize,
    },
    /// The object's storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The object's alarm schema could not be applied: most often it was
    /// stored by newer code (`SchedulerError::SchemaAhead`), which this
    /// code must never run on. Nothing was changed.
    #[error("alarm schema refused: {0}")]
    Schema(#[source] durability_scheduler::SchedulerError),
}

impl AlarmError {
    /// Whether retrying the same call can help.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::BackendUnavailable { .. }
                | Self::BackendFailed { .. }
                | Self::ResultUnknown { .. }
                | Self::Storage(_)
        )
    }

    /// Whether the backend may have changed: the outcome is unknown.
    pub fn is_result_unknown(&self) -> bool {
        matches!(self, Self::ResultUnknown { .. })
    }

    /// A backend setup failure (nothing changed).
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::BackendUnavailable {
            source: source.into(),
        }
    }

    /// A backend rejection before any mutation.
    pub fn failed(source: impl Into<BoxError>) -> Self {
        Self::BackendFailed {
            source: source.into(),
        }
    }

    /// A backend failure whose effect is unknown.
    pub fn unknown(source: impl Into<BoxError>) -> Self {
        Self::ResultUnknown {
            source: source.into(),
        }
    }
}

durability_time::error_codes! {
    AlarmError {
        Self::InvalidTime { .. } => "do_alarm_invalid_time",
        Self::InvalidToken { .. } => "do_alarm_invalid_token",
        Self::InvalidConfig { .. } => "do_alarm_invalid_config",
        Self::BackendUnavailable { .. } => "do_alarm_backend_unavailable",
        Self::BackendFailed { .. } => "do_alarm_backend_failed",
        Self::ResultUnknown { .. } => "do_alarm_result_unknown",
        Self::SyncTransaction => "do_alarm_sync_transaction",
        Self::NestedTransaction => "do_alarm_nested_transaction",
        Self::TransactionClosed => "do_alarm_transaction_closed",
        Self::Corrupt { .. } => "do_alarm_corrupt",
        Self::ResponseTooLarge { .. } => "do_alarm_response_too_large",
        Self::Storage(_) => "do_alarm_storage",
        Self::Schema(_) => "do_alarm_schema",
    }
}
