//! Shards, the mapping store and the allocation ledger of
//! `durability-migration` ([`SkeletonShard`], [`SkeletonMappingStore`],
//! [`SkeletonLedger`]).
//!
//! A SQL backend implements only [`Shard`]: the migration crate's
//! `ShardMappingStore` and `ShardLedger` are the mapping store and the
//! ledger over any shard of a known dialect. The stub mapping store and
//! ledger below are for a backend that is not SQL (as Redis is not).

use durability_migration::{
    AllocationLedger, BackendError, BatchSupport, BoxFuture, Dialect, MappingStore, Row, Shard,
    Statement,
};

use crate::Unsupported;

/// One database of the shard set (stub).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct SkeletonShard {}

impl SkeletonShard {
    /// The stub shard. A real backend connects here.
    pub fn new() -> Self {
        Self {}
    }
}

impl Shard for SkeletonShard {
    fn dialect(&self) -> Dialect {
        // The dialect statements are generated for; `Other` routes reads and refuses moves.
        Dialect::Other("skeleton".to_owned())
    }

    fn batch_support(&self) -> BatchSupport {
        // `Atomic` only when a failing statement rolls the whole batch back.
        BatchSupport::None
    }

    fn execute<'a>(&'a self, _stmt: &'a Statement) -> BoxFuture<'a, Result<u64, BackendError>> {
        // Execute one statement with its bound parameters; the number of rows it changed.
        Box::pin(async { Err(Unsupported::boxed("execute")) })
    }

    fn query<'a>(&'a self, _stmt: &'a Statement) -> BoxFuture<'a, Result<Vec<Row>, BackendError>> {
        // Run one query; its rows as column name → value, never a silent type conversion.
        Box::pin(async { Err(Unsupported::boxed("query")) })
    }

    fn batch<'a>(
        &'a self,
        _stmts: &'a [Statement],
    ) -> BoxFuture<'a, Result<Vec<u64>, BackendError>> {
        // Run the statements as one batch (one transaction when `Atomic`); each one's changed-row count.
        Box::pin(async { Err(Unsupported::boxed("batch")) })
    }
}

/// Key → shard mappings (stub, for a backend that is not SQL).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct SkeletonMappingStore {}

impl SkeletonMappingStore {
    /// The stub store. A real backend connects here.
    pub fn new() -> Self {
        Self {}
    }
}

impl MappingStore for SkeletonMappingStore {
    fn get<'a>(&'a self, _key: &'a str) -> BoxFuture<'a, Result<Option<String>, BackendError>> {
        // The key's shard, if mapped.
        Box::pin(async { Err(Unsupported::boxed("mapping get")) })
    }

    fn put<'a>(
        &'a self,
        _key: &'a str,
        _shard: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        // Map the key to `shard`, replacing any mapping; one atomic single-key write.
        Box::pin(async { Err(Unsupported::boxed("mapping put")) })
    }

    fn put_if_absent<'a>(
        &'a self,
        _key: &'a str,
        _shard: &'a str,
    ) -> BoxFuture<'a, Result<String, BackendError>> {
        // Map the key only when unmapped; return whichever mapping holds afterwards.
        Box::pin(async { Err(Unsupported::boxed("mapping put_if_absent")) })
    }

    fn remove<'a>(&'a self, _key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>> {
        // Remove the mapping; whether one existed.
        Box::pin(async { Err(Unsupported::boxed("mapping remove")) })
    }

    fn scan<'a>(
        &'a self,
        _after: Option<&'a str>,
        _limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
        // One page of mappings with keys strictly after `after`, in byte order.
        Box::pin(async { Err(Unsupported::boxed("mapping scan")) })
    }
}

/// The coordinator's allocation ledger (stub, for a backend that is not SQL).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct SkeletonLedger {}

impl SkeletonLedger {
    /// The stub ledger. A real backend connects here.
    pub fn new() -> Self {
        Self {}
    }
}

impl AllocationLedger for SkeletonLedger {
    fn record<'a>(
        &'a self,
        _key: &'a str,
        _shard: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        // Record that the key was allocated to `shard`, replacing any row.
        Box::pin(async { Err(Unsupported::boxed("ledger record")) })
    }

    fn scan<'a>(
        &'a self,
        _after: Option<&'a str>,
        _limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
        // One page of rows with keys strictly after `after`, in byte order.
        Box::pin(async { Err(Unsupported::boxed("ledger scan")) })
    }

    fn remove_if<'a>(
        &'a self,
        _key: &'a str,
        _shard: &'a str,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        // Remove the key's row only while it still names `shard`; whether it did.
        Box::pin(async { Err(Unsupported::boxed("ledger remove_if")) })
    }
}
