//! The SQL of the crate's key → shard pair tables, per [`Dialect`]: the
//! mapping store's `durability_mapping` ([`crate::ShardMappingStore`]) and
//! the allocation ledger's `durability_allocations`
//! ([`crate::ShardLedger`]).
//!
//! Both tables are `(mkey, shard)` with `mkey` as the primary key, and keys
//! compare and iterate in byte order on every dialect:
//!
//! - SQLite: `TEXT` keys (the default `BINARY` collation), `WITHOUT ROWID`;
//! - PostgreSQL: `TEXT COLLATE "C"` keys;
//! - MariaDB/MySQL: `VARBINARY(512)` keys and `VARBINARY(255)` shard names,
//!   bound and read as bytes (no collation folds case or ignores trailing
//!   spaces).
//!
//! The statements (`dialect::PairTable`) are exactly those the hand-written
//! stores issued before they were written once over [`crate::Shard`], so
//! existing tables keep working unchanged.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Bound;
use std::sync::Mutex;

use crate::dialect::{ALLOCATIONS, Dialect, MAPPING, PairTable};
use crate::error::BackendError;
use crate::shard::{Shard, Statement};
use crate::value::{Row, Value};

/// A stored key or shard name: text, or UTF-8 bytes (MariaDB/MySQL
/// `VARBINARY`).
pub(crate) fn text_of(what: &str, v: Option<Value>) -> Result<String, BackendError> {
    match v {
        Some(Value::Text(s)) => Ok(s),
        Some(Value::Blob(b)) => Ok(String::from_utf8(b)?),
        other => Err(format!("malformed {what} value {other:?}").into()),
    }
}

/// The `(mkey, shard)` pairs of a page's rows.
pub(crate) fn pairs_of(what: &str, rows: Vec<Row>) -> Result<Vec<(String, String)>, BackendError> {
    rows.into_iter()
        .map(|mut r| {
            Ok((
                text_of(what, r.remove("mkey"))?,
                text_of(what, r.remove("shard"))?,
            ))
        })
        .collect()
}

/// Which key → shard table a [`ShardPairs`] store keeps its rows in.
pub trait PairKind: Send + Sync + 'static {
    /// The table's name.
    const TABLE: &'static str;
    /// What a row is, in error messages.
    const WHAT: &'static str;
}

/// The mapping store's rows ([`crate::ShardMappingStore`]).
#[derive(Debug, Clone, Copy)]
pub enum MappingRows {}

impl PairKind for MappingRows {
    const TABLE: &'static str = MAPPING;
    const WHAT: &'static str = "mapping";
}

/// The allocation ledger's rows ([`crate::ShardLedger`]).
#[derive(Debug, Clone, Copy)]
pub enum AllocationRows {}

impl PairKind for AllocationRows {
    const TABLE: &'static str = ALLOCATIONS;
    const WHAT: &'static str = "allocation";
}

/// Key → shard rows of the table `K` names on any SQL [`Shard`] (SQLite,
/// PostgreSQL, MariaDB/MySQL), with the statements its [`Shard::dialect`]
/// needs: keys are compared and iterated in byte order on every dialect.
/// The mapping store and the allocation ledger are this store over their
/// tables ([`crate::ShardMappingStore`], [`crate::ShardLedger`]).
pub struct ShardPairs<S, K> {
    shard: S,
    kind: PhantomData<fn() -> K>,
}

impl<S: fmt::Debug, K: PairKind> fmt::Debug for ShardPairs<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardPairs")
            .field("table", &K::TABLE)
            .field("shard", &self.shard)
            .finish()
    }
}

impl<S: Clone, K> Clone for ShardPairs<S, K> {
    fn clone(&self) -> Self {
        Self {
            shard: self.shard.clone(),
            kind: PhantomData,
        }
    }
}

impl<S: Shard, K: PairKind> ShardPairs<S, K> {
    /// A store on `shard`; creates its table when missing.
    ///
    /// # Errors
    /// A dialect without pair-table SQL (`Dialect::Other`), or the shard's
    /// error.
    pub async fn new(shard: S) -> Result<Self, BackendError> {
        let dialect = shard.dialect();
        PairTable::check(&dialect)?;
        shard
            .execute(&PairTable::new(&dialect, K::TABLE).schema())
            .await?;
        Ok(Self::with_table(shard))
    }

    /// A store on `shard`, whose table already exists (a backend that
    /// created it with [`ShardPairs::schema_sql`]).
    pub fn with_table(shard: S) -> Self {
        Self {
            shard,
            kind: PhantomData,
        }
    }

    /// The `CREATE TABLE IF NOT EXISTS` text of the table on `dialect`,
    /// for a backend that runs its setup outside [`Shard`] (a dialect without
    /// pair-table SQL of its own gets SQLite's text; [`ShardPairs::new`]
    /// refuses it).
    pub fn schema_sql(dialect: &Dialect) -> String {
        PairTable::new(dialect, K::TABLE).schema().sql
    }

    /// The shard holding the table.
    pub fn shard(&self) -> &S {
        &self.shard
    }

    /// Executes the statement `build` makes for the table; returns the rows
    /// it changed.
    pub(crate) async fn execute(
        &self,
        build: impl FnOnce(&PairTable<'_>) -> Statement,
    ) -> Result<u64, BackendError> {
        let dialect = self.shard.dialect();
        let st = build(&PairTable::new(&dialect, K::TABLE));
        self.shard.execute(&st).await
    }

    /// The shard named by the row of `key`, if any.
    pub(crate) async fn lookup(&self, key: &str) -> Result<Option<String>, BackendError> {
        let dialect = self.shard.dialect();
        let rows = self
            .shard
            .query(&PairTable::new(&dialect, K::TABLE).get(key))
            .await?;
        match rows.into_iter().next() {
            None => Ok(None),
            Some(mut r) => Ok(Some(text_of(K::WHAT, r.remove("shard"))?)),
        }
    }

    /// The `(key, shard)` pairs of the page `build` selects.
    pub(crate) async fn page(
        &self,
        build: impl FnOnce(&PairTable<'_>) -> Statement,
    ) -> Result<Vec<(String, String)>, BackendError> {
        let dialect = self.shard.dialect();
        let st = build(&PairTable::new(&dialect, K::TABLE));
        pairs_of(K::WHAT, self.shard.query(&st).await?)
    }
}

/// Key → shard rows in memory, in byte order of the keys (the in-memory
/// mapping store and ledger).
#[derive(Debug, Default)]
pub(crate) struct PairMap {
    rows: Mutex<BTreeMap<String, String>>,
}

impl PairMap {
    /// Runs `f` on the rows.
    pub(crate) fn with<T>(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, String>) -> T,
    ) -> Result<T, BackendError> {
        let mut g = self.rows.lock().map_err(|_| "pair map mutex poisoned")?;
        Ok(f(&mut g))
    }

    /// Up to `limit` rows with keys strictly after `after` (all keys when
    /// `None`), in key order.
    pub(crate) fn page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>, BackendError> {
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
    }
}
