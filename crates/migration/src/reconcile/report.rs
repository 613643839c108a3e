//! What a reconciliation found: the report and its capped key lists.

use super::MAX_RECONCILE_KEYS;

/// A ledger row whose shard is not the shard routing names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Disagreement {
    /// The key.
    pub key: String,
    /// The shard the ledger records.
    pub ledger_shard: String,
    /// The shard routing names; `None` when the key has no mapping and no
    /// computed owner.
    pub routed_shard: Option<String>,
    /// Whether `routed_shard` comes from an explicit mapping (else from
    /// computed placement, or nothing).
    pub mapped: bool,
}

/// A ledger key whose row no listed table holds on the probed shard.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MissingRecord {
    /// The key.
    pub key: String,
    /// The shard probed (routing's shard, or the ledger shard of an
    /// unrouted key).
    pub shard: String,
}

/// Why a requested probe could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UncheckedReason {
    /// [`VerifyRecords::tables`](super::VerifyRecords::tables) is empty.
    NoTables,
    /// The shard to probe is not configured.
    UnknownShard,
    /// A probe query failed and no other listed table held the key.
    ProbeFailed {
        /// The first table whose probe failed.
        table: String,
        /// The backend error's message.
        error: String,
    },
}

/// A ledger key whose requested probe could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UncheckedRecord {
    /// The key.
    pub key: String,
    /// The shard that was to be probed.
    pub shard: String,
    /// Why the probe could not run.
    pub reason: UncheckedReason,
}

/// What [`Router::reconcile_allocations`](crate::Router::reconcile_allocations) found and did.
///
/// Counts are exact; each list keeps at most [`MAX_RECONCILE_KEYS`] entries,
/// in ledger key order. `routing_agreed + disagreeing_count == examined` and
/// `record_verified + record_missing_count + record_unchecked == examined`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconcileReport {
    /// Ledger rows examined.
    pub examined: u64,
    /// Rows whose ledger shard is the shard routing names.
    pub routing_agreed: u64,
    /// Rows whose ledger shard is not the shard routing names (unrouted
    /// keys included, with `routed_shard: None`).
    pub disagreeing_count: u64,
    /// The first disagreeing rows.
    pub disagreeing: Vec<Disagreement>,
    /// Rows whose key has no mapping and no computed owner (a subset of the
    /// disagreeing rows).
    pub unrouted: u64,
    /// Rows whose key a listed table holds on the probed shard.
    pub record_verified: u64,
    /// Rows whose key no listed table holds on the probed shard.
    pub record_missing_count: u64,
    /// The first missing rows.
    pub record_missing: Vec<MissingRecord>,
    /// Rows not probed: no `verify_records`, or the probe could not run.
    pub record_unchecked: u64,
    /// The first rows whose requested probe could not run (empty without
    /// `verify_records`, where nothing was requested).
    pub unchecked: Vec<UncheckedRecord>,
    /// Mappings written by `repair`.
    pub repaired_count: u64,
    /// The first keys `repair` mapped (each to its ledger shard).
    pub repaired: Vec<String>,
    /// Ledger rows removed by `prune_verified`.
    pub pruned_count: u64,
    /// The first keys whose ledger row was pruned.
    pub pruned: Vec<String>,
    /// Ledger pages read that held rows.
    pub pages: u64,
    /// The last key examined when the run stopped at `limit` with ledger
    /// rows left after it; `None` when the ledger was read to its end.
    pub resume_after: Option<String>,
}

pub(super) fn push_capped<T>(v: &mut Vec<T>, x: T) {
    if v.len() < MAX_RECONCILE_KEYS {
        v.push(x);
    }
}
