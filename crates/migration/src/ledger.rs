//! The coordinator's allocation ledger: an advisory record of which shard
//! each key was allocated to, reconciled against routing by
//! [`crate::Router::reconcile_allocations`].

use crate::pairs::{AllocationRows, PairMap, ShardPairs};
use crate::shard::{BackendFuture, Shard};

/// The coordinator's allocation ledger (key → shard it was allocated to).
///
/// The mapping store is the record of routing; the ledger is advisory.
pub trait AllocationLedger: Send + Sync {
    /// Records that `key` was allocated to `shard` (replacing any row).
    fn record<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, ()>;

    /// One page of ledger rows with keys strictly after `after`, in key order.
    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BackendFuture<'a, Vec<(String, String)>>;

    /// Removes the row of `key` only while it still names `shard`; returns
    /// whether a row was removed.
    fn remove_if<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, bool>;
}

/// An in-memory allocation ledger (tests and single-process use).
///
/// Keys are kept in byte order, like the SQL ledgers (`SqliteLedger`,
/// `PostgresLedger`), so pages come back in the same order on every backend.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    rows: PairMap,
}

impl MemoryLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }
}

impl AllocationLedger for MemoryLedger {
    fn record<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, ()> {
        Box::pin(async move {
            self.rows.with(|m| {
                m.insert(key.to_owned(), shard.to_owned());
            })
        })
    }

    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BackendFuture<'a, Vec<(String, String)>> {
        Box::pin(async move { self.rows.page(after, limit) })
    }

    fn remove_if<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, bool> {
        Box::pin(async move {
            self.rows.with(|m| {
                if m.get(key).is_some_and(|s| s == shard) {
                    m.remove(key);
                    true
                } else {
                    false
                }
            })
        })
    }
}

/// Key → allocated shard rows in a `durability_allocations` table on any SQL
/// [`Shard`] (SQLite, PostgreSQL, MariaDB/MySQL): [`ShardPairs`] over the
/// ledger table, with the statements its [`Shard::dialect`] needs: keys are
/// compared and iterated in byte order on every dialect, like
/// [`MemoryLedger`]. Every method is one statement.
///
/// Backends name it after themselves (`SqliteLedger`, `PostgresLedger`).
pub type ShardLedger<S> = ShardPairs<S, AllocationRows>;

impl<S: Shard> AllocationLedger for ShardLedger<S> {
    fn record<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, ()> {
        Box::pin(async move {
            self.execute(|t| t.upsert(key, shard)).await?;
            Ok(())
        })
    }

    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BackendFuture<'a, Vec<(String, String)>> {
        Box::pin(self.page(move |t| match after {
            Some(a) => t.page_after(a, limit),
            None => t.page_first(limit),
        }))
    }

    fn remove_if<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, bool> {
        Box::pin(async move { Ok(self.execute(|t| t.delete_if(key, shard)).await? > 0) })
    }
}
