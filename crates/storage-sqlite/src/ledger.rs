//! The coordinator's allocation ledger on SQLite, for
//! `durability-migration`'s `Router::reconcile_allocations`.
//!
//! [`SqliteLedger`] keeps key → allocated shard rows in a
//! `durability_allocations` table (created when missing): it is the
//! migration crate's [`ShardLedger`] on a [`SqliteShard`] of its own. Keys
//! compare byte-wise (SQLite's default `BINARY` collation), so pages come
//! back in the same order as from the other ledgers. Every value is a bound
//! parameter.

use std::path::Path;

use durability_migration::{AllocationLedger, BackendError, BoxFuture, ShardLedger};

use crate::migration::{SqliteShard, open_pairs};

/// Key → allocated shard rows in a SQLite table (`durability_allocations`).
#[derive(Debug)]
pub struct SqliteLedger(ShardLedger<SqliteShard>);

impl SqliteLedger {
    /// Opens (or creates) a ledger file in WAL mode with
    /// `synchronous=NORMAL`, and creates its table when missing.
    ///
    /// # Errors
    /// The SQLite error when the file cannot be opened or configured.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, rusqlite::Error> {
        open_pairs(Some(path.as_ref())).map(Self)
    }

    /// An in-memory ledger.
    ///
    /// # Errors
    /// The SQLite error.
    pub fn open_in_memory() -> Result<Self, rusqlite::Error> {
        open_pairs(None).map(Self)
    }
}

impl AllocationLedger for SqliteLedger {
    fn record<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.0.record(key, shard)
    }

    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
        self.0.scan(after, limit)
    }

    fn remove_if<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.0.remove_if(key, shard)
    }
}
