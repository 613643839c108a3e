//! The one error type of the host crate.

use durability_alarms::AlarmError;
use durability_ownership::{DispatchOutcome, OwnershipError};
use durability_scheduler::{SchedulerError, StorageError, StorageErrorKind};

/// A boxed error from user code (a factory or a call body).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Every failure of the host: configuration, lifecycle records, dispatch.
///
/// Each variant has a stable machine code ([`HostError::code`]), says
/// whether retrying can help ([`HostError::is_retryable`]) and whether the
/// refused work may have run ([`HostError::outcome`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// A setting (a `DO_*` variable or a builder field) is invalid: the host
    /// refuses to start, before anything is opened, claimed or spawned.
    #[error("invalid setting {setting}: {reason}")]
    InvalidSetting {
        /// The setting's name (`DO_PREVENT_EVICTION`, `storage_id`, ...).
        setting: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// The lifecycle record ownership needs is missing or names another
    /// storage: the host refuses to start.
    #[error(
        "lifecycle {lifecycle}: active storage pointer is {found}, expected {storage_id}; \
         {how_to_fix}"
    )]
    LifecycleRecord {
        /// The lifecycle whose pointer was read.
        lifecycle: String,
        /// The storage id this host serves.
        storage_id: String,
        /// What was found (`missing`, or the other storage id, or `whole-delete locked`).
        found: String,
        /// How to create or fix it.
        how_to_fix: String,
    },
    /// No object class of that name is configured.
    #[error("unknown object class {class}")]
    UnknownClass {
        /// The class asked for.
        class: String,
    },
    /// The class exists but its objects are of another Rust type than the
    /// call asked for.
    #[error("object class {class} is not of the requested type")]
    ClassType {
        /// The class asked for.
        class: String,
    },
    /// The object name (or the object id built from it) breaks a limit.
    #[error("invalid object name: {reason}")]
    InvalidObjectName {
        /// Why it was rejected.
        reason: String,
    },
    /// The host is draining or stopped: no new work is accepted.
    #[error("host is draining")]
    Draining,
    /// Another task owns the object's scope; calls between hosts are the
    /// transport's (not started here).
    #[error("object is owned by task {owner} at generation {generation}")]
    NotOwner {
        /// The owning task.
        owner: String,
        /// Its generation.
        generation: u64,
    },
    /// Owner resolution, fencing or admission refused the work (the
    /// ownership error says whether it started: see [`HostError::outcome`]).
    #[error("ownership refused the work: {0}")]
    Ownership(#[source] OwnershipError),
    /// The object's storage refused the commit: a newer claim is recorded in
    /// it, or this claim's lease budget was spent before the commit. Nothing
    /// of that transaction was written.
    #[error("commit refused by the storage fence: {0}")]
    Fenced(#[source] StorageError),
    /// Ownership moved while the work ran: the watchdog cancelled it. What
    /// it committed before stays committed; what it did not commit never
    /// will be. The outcome is unknown.
    #[error("ownership of {scope} was lost while the work ran")]
    OwnershipLost {
        /// The scope.
        scope: String,
    },
    /// The object's storage failed (not a fence refusal).
    #[error("object storage failed: {0}")]
    Storage(#[source] StorageError),
    /// The object's factory failed: the object was not opened.
    #[error("opening object {object} failed: {source}")]
    Factory {
        /// The object id.
        object: String,
        /// The factory's error.
        #[source]
        source: BoxError,
    },
    /// The call body failed (its own error).
    #[error("the call failed: {0}")]
    Handler(#[source] BoxError),
    /// Wiring the object's alarm failed.
    #[error("object alarm failed: {0}")]
    Alarm(#[source] AlarmError),
}

impl HostError {
    /// Every stable code, in declaration order.
    pub const CODES: &'static [&'static str] = &[
        "host_invalid_setting",
        "host_lifecycle_record",
        "host_unknown_class",
        "host_class_type",
        "host_invalid_object_name",
        "host_draining",
        "host_not_owner",
        "host_ownership_refused",
        "host_fenced",
        "host_ownership_lost",
        "host_storage_failed",
        "host_factory_failed",
        "host_handler_failed",
        "host_alarm_failed",
    ];

    /// The stable machine code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidSetting { .. } => "host_invalid_setting",
            Self::LifecycleRecord { .. } => "host_lifecycle_record",
            Self::UnknownClass { .. } => "host_unknown_class",
            Self::ClassType { .. } => "host_class_type",
            Self::InvalidObjectName { .. } => "host_invalid_object_name",
            Self::Draining => "host_draining",
            Self::NotOwner { .. } => "host_not_owner",
            Self::Ownership(_) => "host_ownership_refused",
            Self::Fenced(_) => "host_fenced",
            Self::OwnershipLost { .. } => "host_ownership_lost",
            Self::Storage(_) => "host_storage_failed",
            Self::Factory { .. } => "host_factory_failed",
            Self::Handler(_) => "host_handler_failed",
            Self::Alarm(_) => "host_alarm_failed",
        }
    }

    /// Whether retrying (through a fresh owner resolution, possibly on
    /// another host) can help.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Draining
            | Self::NotOwner { .. }
            | Self::Fenced(_)
            | Self::OwnershipLost { .. } => true,
            Self::Ownership(e) => e.is_retryable(),
            Self::Storage(e) => e.kind() == StorageErrorKind::Backend,
            Self::Alarm(e) => e.is_retryable(),
            _ => false,
        }
    }

    /// What the error proves about the work: refused before it started, or
    /// possibly run.
    pub fn outcome(&self) -> DispatchOutcome {
        match self {
            Self::Ownership(e) => e.outcome(),
            Self::OwnershipLost { .. } | Self::Handler(_) | Self::Storage(_) | Self::Alarm(_) => {
                DispatchOutcome::Unknown
            }
            _ => DispatchOutcome::NotStarted,
        }
    }

    /// The ownership error inside, if any.
    pub fn ownership(&self) -> Option<&OwnershipError> {
        match self {
            Self::Ownership(e) => Some(e),
            _ => None,
        }
    }

    /// Classifies a storage error: a fence refusal or another failure.
    pub fn from_storage(e: StorageError) -> Self {
        if e.kind() == StorageErrorKind::Fenced {
            Self::Fenced(e)
        } else {
            Self::Storage(e)
        }
    }

    pub(crate) fn from_scheduler(e: SchedulerError) -> Self {
        match e {
            SchedulerError::Storage(s) => Self::from_storage(s),
            other => Self::Storage(StorageError::new(
                StorageErrorKind::Backend,
                other.to_string(),
            )),
        }
    }

    pub(crate) fn setting(setting: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidSetting {
            setting,
            reason: reason.into(),
        }
    }
}

impl From<OwnershipError> for HostError {
    fn from(e: OwnershipError) -> Self {
        Self::Ownership(e)
    }
}

impl From<StorageError> for HostError {
    fn from(e: StorageError) -> Self {
        Self::from_storage(e)
    }
}
