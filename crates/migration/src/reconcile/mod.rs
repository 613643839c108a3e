//! `reconcile_allocations`: compares the coordinator's allocation ledger
//! with routing, optionally checks that each key's row exists where routing
//! points, and — only when asked — writes a missing mapping or prunes a
//! settled ledger row.
//!
//! Routing is the record: a key routes to its mapping in the mapping store,
//! or, with no mapping, to the owner computed placement gives it
//! ([`Router::computed_owner`](crate::Router::computed_owner)). The ledger
//! is advisory. A disagreement between the two is reported and never
//! resolved here.

//!
//! By concern: `diff` (the ledger walk and each row's comparison with
//! routing), `probe` (the record probe), `repair` (a missing mapping
//! written), `report` (what a run found).

mod diff;
mod probe;
mod repair;
mod report;

pub use report::{Disagreement, MissingRecord, ReconcileReport, UncheckedReason, UncheckedRecord};

/// Most entries kept in each key list of a [`ReconcileReport`] (the counts
/// stay exact).
pub const MAX_RECONCILE_KEYS: usize = 1000;
/// Default number of ledger rows read per page.
pub const DEFAULT_RECONCILE_PAGE_SIZE: usize = 500;
/// Largest accepted [`ReconcileOptions::page_size`].
pub const MAX_RECONCILE_PAGE_SIZE: usize = 10_000;

/// One table whose rows [`VerifyRecords`] probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordTable {
    /// The table name (validated with [`Ident::new`](crate::Ident::new)).
    pub table: String,
    /// The table's key column. `None` uses the key column the table was
    /// configured with ([`crate::MigrationConfig::table_with_key_column`]),
    /// else `id`.
    pub key_column: Option<String>,
}

impl RecordTable {
    /// A table probed by its configured key column (else `id`).
    pub fn new(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            key_column: None,
        }
    }

    /// A table probed by an explicit key column.
    pub fn with_key_column(table: impl Into<String>, key_column: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            key_column: Some(key_column.into()),
        }
    }
}

/// Which tables to probe for each ledger key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyRecords {
    /// The tables, probed in order until one holds the key. An empty list
    /// makes every probe unable to run (every row counts as unchecked).
    pub tables: Vec<RecordTable>,
}

impl VerifyRecords {
    /// Probes the given tables, each by its configured key column (else `id`).
    pub fn tables<I, T>(tables: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        Self {
            tables: tables.into_iter().map(RecordTable::new).collect(),
        }
    }
}

/// Options of [`Router::reconcile_allocations`](crate::Router::reconcile_allocations).
#[derive(Debug, Clone)]
pub struct ReconcileOptions {
    /// Ledger rows read per page, `1..=10_000` (default 500).
    pub page_size: usize,
    /// Most ledger rows examined; `None` walks the whole ledger. `Some(0)`
    /// is refused with `INVALID_CONFIG`.
    pub limit: Option<usize>,
    /// Start after this ledger key (exclusive): pass a previous report's
    /// [`ReconcileReport::resume_after`] to continue a limited run.
    pub after: Option<String>,
    /// Probe each key's row on the shard routing points at. Without it no
    /// shard is queried and every examined row counts as unchecked.
    pub verify_records: Option<VerifyRecords>,
    /// Write a mapping to the ledger shard for each key that has neither a
    /// mapping nor a computed owner, when the probe found its row there
    /// and, with a journal, the journal neither is moving the key nor moved
    /// it to another shard (for moved keys the journal is the record).
    /// Requires `verify_records` (`RECONCILE_VERIFY_REQUIRED`).
    pub repair: bool,
    /// Remove ledger rows that agree with an explicit mapping (and, with
    /// `verify_records`, whose row was verified).
    pub prune_verified: bool,
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        Self {
            page_size: DEFAULT_RECONCILE_PAGE_SIZE,
            limit: None,
            after: None,
            verify_records: None,
            repair: false,
            prune_verified: false,
        }
    }
}

#[cfg(test)]
mod tests;
