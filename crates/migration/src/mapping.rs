//! The `MappingStore` trait (key → shard) and an in-memory implementation.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::error::BackendError;
use crate::shard::BoxFuture;

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
