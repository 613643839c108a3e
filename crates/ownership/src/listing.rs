//! Operator views of a lease store: the live leases, as `Serialize` reports.
//!
//! A backend lists its stored owner records a page at a time and describes
//! each with [`LeaseReport::from_stored`], which decodes the record strictly
//! (the same validation a claim applies): a record that fails is listed
//! with its problem, never misread and never hiding the healthy ones.

use serde::Serialize;

use crate::{OwnerRecord, OwnerScope, OwnershipError, ShardCount};

/// One live owner lease, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseReport {
    /// The scope's host id as the store keys it (`<storage>:<class>:shard<n>`).
    pub scope: String,
    /// The owning task (`None` when the record is invalid).
    pub owner: Option<String>,
    /// The lifecycle guarding the scope (`None` when the record is invalid).
    pub lifecycle: Option<String>,
    /// The owner's generation (`None` when the record is invalid).
    pub generation: Option<u64>,
    /// The endpoint the owner advertises (omitted when it advertises none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Lease time left on the store's own clock when it was read, in ms.
    pub lease_left_ms: u64,
    /// Why the stored record is invalid (claims of the scope fail closed).
    pub problem: Option<String>,
}

impl LeaseReport {
    /// Describes the record `raw` stored under the scope key `scope` with
    /// `lease_left_ms` left, decoding it strictly with `count` shards.
    pub fn from_stored(scope: &str, raw: &[u8], lease_left_ms: u64, count: ShardCount) -> Self {
        match decode(scope, raw, count) {
            Ok(record) => Self {
                scope: scope.to_owned(),
                owner: Some(record.task().as_str().to_owned()),
                lifecycle: Some(record.lifecycle().as_str().to_owned()),
                generation: Some(record.generation().get()),
                endpoint: record.endpoint().map(|e| e.as_str().to_owned()),
                lease_left_ms,
                problem: None,
            },
            Err(problem) => Self {
                scope: scope.to_owned(),
                owner: None,
                lifecycle: None,
                generation: None,
                endpoint: None,
                lease_left_ms,
                problem: Some(problem),
            },
        }
    }
}

/// Checks the page size a backend's lease listing was asked for: at
/// least 1 (a page of 0 would never advance).
///
/// # Errors
/// [`OwnershipError::InvalidInput`] for a `limit` of 0.
pub fn validate_list_limit(limit: usize) -> Result<(), OwnershipError> {
    if limit == 0 {
        return Err(OwnershipError::InvalidInput {
            what: "limit",
            reason: "must be at least 1".to_owned(),
        });
    }
    Ok(())
}

fn decode(scope: &str, raw: &[u8], count: ShardCount) -> Result<OwnerRecord, String> {
    let expected = OwnerScope::parse(scope, count).map_err(|e| e.to_string())?;
    OwnerRecord::decode(raw, &expected, count).map_err(|e| e.to_string())
}

/// One page of live leases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseListing {
    /// The leases of this page.
    pub leases: Vec<LeaseReport>,
    /// Pass this back to list the next page; `None` after the last one.
    pub cursor: Option<String>,
}

#[cfg(test)]
mod tests;
