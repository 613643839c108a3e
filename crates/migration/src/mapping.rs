//! The `MappingStore` trait (key → shard), an in-memory implementation, and
//! [`ShardMappingStore`], the one implementation over any SQL [`Shard`].

use crate::pairs::{MappingRows, PairMap, ShardPairs};
use crate::shard::{BackendFuture, Shard};

/// Where each key lives: key → shard name.
///
/// The mapping is the record of routing. Writes are single-key and atomic.
pub trait MappingStore: Send + Sync {
    /// The key's shard, if mapped.
    fn get<'a>(&'a self, key: &'a str) -> BackendFuture<'a, Option<String>>;

    /// Maps `key` to `shard`, replacing any mapping.
    fn put<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, ()>;

    /// Maps `key` to `shard` unless it is mapped; returns the mapping that holds.
    fn put_if_absent<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, String>;

    /// Removes the mapping; returns whether one existed.
    fn remove<'a>(&'a self, key: &'a str) -> BackendFuture<'a, bool>;

    /// One page of mappings with keys strictly after `after`, in key order.
    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BackendFuture<'a, Vec<(String, String)>>;
}

/// An in-memory mapping store (tests and single-process use).
#[derive(Debug, Default)]
pub struct MemoryMappingStore {
    map: PairMap,
}

impl MemoryMappingStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl MappingStore for MemoryMappingStore {
    fn get<'a>(&'a self, key: &'a str) -> BackendFuture<'a, Option<String>> {
        Box::pin(async move { self.map.with(|m| m.get(key).cloned()) })
    }
    fn put<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, ()> {
        Box::pin(async move {
            self.map.with(|m| {
                m.insert(key.to_owned(), shard.to_owned());
            })
        })
    }
    fn put_if_absent<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, String> {
        Box::pin(async move {
            self.map.with(|m| {
                m.entry(key.to_owned())
                    .or_insert_with(|| shard.to_owned())
                    .clone()
            })
        })
    }
    fn remove<'a>(&'a self, key: &'a str) -> BackendFuture<'a, bool> {
        Box::pin(async move { self.map.with(|m| m.remove(key).is_some()) })
    }
    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BackendFuture<'a, Vec<(String, String)>> {
        Box::pin(async move { self.map.page(after, limit) })
    }
}

/// Key → shard mappings in a `durability_mapping` table on any SQL
/// [`Shard`] (SQLite, PostgreSQL, MariaDB/MySQL): [`ShardPairs`] over the
/// mapping table, with the statements its [`Shard::dialect`] needs: keys are
/// compared and iterated in byte order on every dialect (PostgreSQL
/// `COLLATE "C"`, MariaDB/MySQL `VARBINARY`).
///
/// Backends name it after themselves (`SqliteMappingStore`,
/// `PostgresMappingStore`, `MysqlMappingStore`). Every method is one
/// statement, except `put_if_absent`: an insert that keeps an existing row,
/// then a read of the row that holds.
pub type ShardMappingStore<S> = ShardPairs<S, MappingRows>;

impl<S: Shard> MappingStore for ShardMappingStore<S> {
    fn get<'a>(&'a self, key: &'a str) -> BackendFuture<'a, Option<String>> {
        Box::pin(self.lookup(key))
    }
    fn put<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, ()> {
        Box::pin(async move {
            self.execute(|t| t.upsert(key, shard)).await?;
            Ok(())
        })
    }
    fn put_if_absent<'a>(&'a self, key: &'a str, shard: &'a str) -> BackendFuture<'a, String> {
        Box::pin(async move {
            self.execute(|t| t.insert_absent(key, shard)).await?;
            self.lookup(key)
                .await?
                .ok_or_else(|| "mapping vanished after put_if_absent".into())
        })
    }
    fn remove<'a>(&'a self, key: &'a str) -> BackendFuture<'a, bool> {
        Box::pin(async move { Ok(self.execute(|t| t.delete(key)).await? > 0) })
    }
    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BackendFuture<'a, Vec<(String, String)>> {
        Box::pin(self.page(move |t| t.page_after(after.unwrap_or(""), limit)))
    }
}
