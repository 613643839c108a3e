//! The client's error type.

use std::fmt;

/// Why a group's topology could not be served.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnavailableReason {
    /// The store holds no snapshot for the group.
    Missing,
    /// The stored snapshot failed validation.
    Invalid(String),
    /// The read did not finish within the read timeout.
    Timeout {
        /// The timeout, in milliseconds.
        after_ms: u64,
    },
    /// The store read failed.
    ReadFailed(String),
    /// The published snapshot is older than a version this client already
    /// served for the group from the same coordinator (the store went back,
    /// or an older write landed late): serving it would go back in time.
    Regressed {
        /// The highest version served from that coordinator.
        served: u64,
        /// The version read.
        read: u64,
    },
}

impl UnavailableReason {
    /// A stable short code: `missing`, `invalid`, `timeout`, `read_failed`,
    /// `regressed`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Invalid(_) => "invalid",
            Self::Timeout { .. } => "timeout",
            Self::ReadFailed(_) => "read_failed",
            Self::Regressed { .. } => "regressed",
        }
    }
}

impl fmt::Display for UnavailableReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing => f.write_str("no snapshot is published"),
            Self::Invalid(reason) => write!(f, "the published snapshot is invalid: {reason}"),
            Self::Timeout { after_ms } => write!(f, "the read timed out after {after_ms} ms"),
            Self::ReadFailed(reason) => write!(f, "the read failed: {reason}"),
            Self::Regressed { served, read } => write!(
                f,
                "the published version {read} is older than version {served} already served from the same coordinator"
            ),
        }
    }
}

/// Everything that can go wrong reading topology.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyClientError {
    /// The group's topology could not be served and no fallback answered.
    #[error("topology of group {group:?} is unavailable: {reason}")]
    TopologyUnavailable {
        /// The group.
        group: String,
        /// Why.
        reason: UnavailableReason,
    },
    /// Bytes that are not a valid published snapshot.
    #[error("invalid topology snapshot: {reason}")]
    InvalidSnapshot {
        /// Why it was refused.
        reason: String,
    },
    /// The group name is empty, too long or holds control characters.
    #[error("invalid group name: {reason}")]
    InvalidGroup {
        /// Why.
        reason: &'static str,
    },
    /// A client setting is out of range.
    #[error("invalid client config: {field} {reason}")]
    InvalidConfig {
        /// The setting.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl TopologyClientError {
    /// Whether retrying the same call can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::TopologyUnavailable { .. })
    }
}

durability_time::error_codes! {
    TopologyClientError {
        Self::TopologyUnavailable { .. } => "TOPOLOGY_UNAVAILABLE",
        Self::InvalidSnapshot { .. } => "TOPOLOGY_INVALID_SNAPSHOT",
        Self::InvalidGroup { .. } => "TOPOLOGY_CLIENT_INVALID_GROUP",
        Self::InvalidConfig { .. } => "TOPOLOGY_CLIENT_INVALID_CONFIG",
    }
}
