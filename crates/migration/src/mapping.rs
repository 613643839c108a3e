//! The `MappingStore` trait (key → shard), an in-memory implementation, and
//! [`ShardMappingStore`], the one implementation over any SQL [`Shard`].

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::dialect::Dialect;
use crate::error::BackendError;
use crate::pairs::{self, MAPPING, PairTable};
use crate::shard::{BoxFuture, Shard};

/// Where each key lives: key → shard name.
///
/// The mapping is the record of routing. Writes are single-key and atomic.
pub trait MappingStore: Send + Sync {
    /// The key's shard, if mapped.
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<String>, BackendError>>;

    /// Maps `key` to `shard`, replacing any mapping.
    fn put<'a>(&'a self, key: &'a str, shard: &'a str) -> BoxFuture<'a, Result<(), BackendError>>;

    /// Maps `key` to `shard` unless it is mapped; returns the mapping that holds.
    fn put_if_absent<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<String, BackendError>>;

    /// Removes the mapping; returns whether one existed.
    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>>;

    /// One page of mappings with keys strictly after `after`, in key order.
    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>>;
}

/// An in-memory mapping store (tests and single-process use).
#[derive(Debug, Default)]
pub struct MemoryMappingStore {
    map: Mutex<BTreeMap<String, String>>,
}

impl MemoryMappingStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, String>) -> T,
    ) -> Result<T, BackendError> {
        let mut g = self
            .map
            .lock()
            .map_err(|_| "mapping store mutex poisoned")?;
        Ok(f(&mut g))
    }
}

impl MappingStore for MemoryMappingStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<String>, BackendError>> {
        Box::pin(async move { self.with(|m| m.get(key).cloned()) })
    }
    fn put<'a>(&'a self, key: &'a str, shard: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            self.with(|m| {
                m.insert(key.to_owned(), shard.to_owned());
            })
        })
    }
    fn put_if_absent<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<String, BackendError>> {
        Box::pin(async move {
            self.with(|m| {
                m.entry(key.to_owned())
                    .or_insert_with(|| shard.to_owned())
                    .clone()
            })
        })
    }
    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move { self.with(|m| m.remove(key).is_some()) })
    }
    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
        Box::pin(async move {
            self.with(|m| {
                let it: Box<dyn Iterator<Item = (&String, &String)>> = match after {
                    Some(a) => Box::new(m.range::<str, _>((
                        std::ops::Bound::Excluded(a),
                        std::ops::Bound::Unbounded,
                    ))),
                    None => Box::new(m.iter()),
                };
                it.take(limit)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
        })
    }
}

/// Key → shard mappings in a `durability_mapping` table on any SQL
/// [`Shard`] (SQLite, PostgreSQL, MariaDB/MySQL), with the statements its
/// [`Shard::dialect`] needs: keys are compared and iterated in byte order on
/// every dialect (PostgreSQL `COLLATE "C"`, MariaDB/MySQL `VARBINARY`).
///
/// Backends name it after themselves (`SqliteMappingStore`,
/// `PostgresMappingStore`, `MysqlMappingStore`). Every method is one
/// statement, except `put_if_absent`: an insert that keeps an existing row,
/// then a read of the row that holds.
#[derive(Debug, Clone)]
pub struct ShardMappingStore<S> {
    shard: S,
}

impl<S: Shard> ShardMappingStore<S> {
    /// A mapping store on `shard`; creates its table when missing.
    ///
    /// # Errors
    /// A dialect without pair-table SQL (`Dialect::Other`), or the shard's
    /// error.
    pub async fn new(shard: S) -> Result<Self, BackendError> {
        let dialect = shard.dialect();
        PairTable::check(&dialect)?;
        shard
            .execute(&PairTable::new(&dialect, MAPPING).schema())
            .await?;
        Ok(Self { shard })
    }

    /// A mapping store on `shard`, whose table already exists (a backend
    /// that created it with [`ShardMappingStore::schema_sql`]).
    pub fn with_table(shard: S) -> Self {
        Self { shard }
    }

    /// The `CREATE TABLE IF NOT EXISTS` text of the table on `dialect`,
    /// for a backend that runs its setup outside [`Shard`] (a dialect without
    /// pair-table SQL of its own gets SQLite's text; [`ShardMappingStore::new`]
    /// refuses it).
    pub fn schema_sql(dialect: &Dialect) -> String {
        PairTable::new(dialect, MAPPING).schema().sql
    }

    /// The shard holding the table.
    pub fn shard(&self) -> &S {
        &self.shard
    }

    async fn lookup(&self, key: &str) -> Result<Option<String>, BackendError> {
        let dialect = self.shard.dialect();
        let rows = self
            .shard
            .query(&PairTable::new(&dialect, MAPPING).get(key))
            .await?;
        match rows.into_iter().next() {
            None => Ok(None),
            Some(mut r) => Ok(Some(pairs::text_of("mapping", r.remove("shard"))?)),
        }
    }
}

impl<S: Shard> MappingStore for ShardMappingStore<S> {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<String>, BackendError>> {
        Box::pin(self.lookup(key))
    }
    fn put<'a>(&'a self, key: &'a str, shard: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let dialect = self.shard.dialect();
            self.shard
                .execute(&PairTable::new(&dialect, MAPPING).upsert(key, shard))
                .await?;
            Ok(())
        })
    }
    fn put_if_absent<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<String, BackendError>> {
        Box::pin(async move {
            let dialect = self.shard.dialect();
            self.shard
                .execute(&PairTable::new(&dialect, MAPPING).insert_absent(key, shard))
                .await?;
            self.lookup(key)
                .await?
                .ok_or_else(|| "mapping vanished after put_if_absent".into())
        })
    }
    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let dialect = self.shard.dialect();
            Ok(self
                .shard
                .execute(&PairTable::new(&dialect, MAPPING).delete(key))
                .await?
                > 0)
        })
    }
    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
        Box::pin(async move {
            let dialect = self.shard.dialect();
            let st = PairTable::new(&dialect, MAPPING).page_after(after.unwrap_or(""), limit);
            pairs::pairs_of("mapping", self.shard.query(&st).await?)
        })
    }
}
