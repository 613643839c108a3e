//! The coordinator's allocation ledger: an advisory record of which shard
//! each key was allocated to, reconciled against routing by
//! [`crate::Router::reconcile_allocations`].

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Mutex;

use crate::dialect::Dialect;
use crate::error::BackendError;
use crate::pairs::{self, ALLOCATIONS, PairTable};
use crate::shard::{BoxFuture, Shard};

/// The coordinator's allocation ledger (key → shard it was allocated to).
///
/// The mapping store is the record of routing; the ledger is advisory.
pub trait AllocationLedger: Send + Sync {
    /// Records that `key` was allocated to `shard` (replacing any row).
    fn record<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>>;

    /// One page of ledger rows with keys strictly after `after`, in key order.
    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>>;

    /// Removes the row of `key` only while it still names `shard`; returns
    /// whether a row was removed.
    fn remove_if<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<bool, BackendError>>;
}

/// An in-memory allocation ledger (tests and single-process use).
///
/// Keys are kept in byte order, like the SQL ledgers (`SqliteLedger`,
/// `PostgresLedger`), so pages come back in the same order on every backend.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    rows: Mutex<BTreeMap<String, String>>,
}

impl MemoryLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, String>) -> T,
    ) -> Result<T, BackendError> {
        let mut g = self.rows.lock().map_err(|_| "ledger mutex poisoned")?;
        Ok(f(&mut g))
    }
}

impl AllocationLedger for MemoryLedger {
    fn record<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            self.with(|m| {
                m.insert(key.to_owned(), shard.to_owned());
            })
        })
    }

    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
        Box::pin(async move {
            self.with(|m| {
                let lower = match after {
                    Some(a) => Bound::Excluded(a),
                    None => Bound::Unbounded,
                };
                m.range::<str, _>((lower, Bound::Unbounded))
                    .take(limit)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
        })
    }

    fn remove_if<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            self.with(|m| {
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
/// [`Shard`] (SQLite, PostgreSQL, MariaDB/MySQL), with the statements its
/// [`Shard::dialect`] needs: keys are compared and iterated in byte order on
/// every dialect, like [`MemoryLedger`]. Every method is one statement.
///
/// Backends name it after themselves (`SqliteLedger`, `PostgresLedger`).
#[derive(Debug, Clone)]
pub struct ShardLedger<S> {
    shard: S,
}

impl<S: Shard> ShardLedger<S> {
    /// A ledger on `shard`; creates its table when missing.
    ///
    /// # Errors
    /// A dialect without pair-table SQL (`Dialect::Other`), or the shard's
    /// error.
    pub async fn new(shard: S) -> Result<Self, BackendError> {
        let dialect = shard.dialect();
        PairTable::check(&dialect)?;
        shard
            .execute(&PairTable::new(&dialect, ALLOCATIONS).schema())
            .await?;
        Ok(Self { shard })
    }

    /// A ledger on `shard`, whose table already exists (a backend that
    /// created it with [`ShardLedger::schema_sql`]).
    pub fn with_table(shard: S) -> Self {
        Self { shard }
    }

    /// The `CREATE TABLE IF NOT EXISTS` text of the table on `dialect`,
    /// for a backend that runs its setup outside [`Shard`] (a dialect without
    /// pair-table SQL of its own gets SQLite's text; [`ShardLedger::new`]
    /// refuses it).
    pub fn schema_sql(dialect: &Dialect) -> String {
        PairTable::new(dialect, ALLOCATIONS).schema().sql
    }

    /// The shard holding the table.
    pub fn shard(&self) -> &S {
        &self.shard
    }
}

impl<S: Shard> AllocationLedger for ShardLedger<S> {
    fn record<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let dialect = self.shard.dialect();
            self.shard
                .execute(&PairTable::new(&dialect, ALLOCATIONS).upsert(key, shard))
                .await?;
            Ok(())
        })
    }

    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
        Box::pin(async move {
            let dialect = self.shard.dialect();
            let table = PairTable::new(&dialect, ALLOCATIONS);
            let st = match after {
                Some(a) => table.page_after(a, limit),
                None => table.page_first(limit),
            };
            pairs::pairs_of("allocation", self.shard.query(&st).await?)
        })
    }

    fn remove_if<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let dialect = self.shard.dialect();
            Ok(self
                .shard
                .execute(&PairTable::new(&dialect, ALLOCATIONS).delete_if(key, shard))
                .await?
                > 0)
        })
    }
}
