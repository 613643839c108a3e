//! Owner leases ([`SkeletonLeaseStore`]: `LeaseStore` and `LifecycleAdmin`).

use durability_ownership::{
    ClaimOutcome, Claimant, DeleteLock, Generation, Lease, LeaseStore, LifecycleAdmin, LifecycleId,
    OwnerRecord, OwnerScope, OwnerSnapshot, OwnershipError, StorageId,
};

use crate::Unsupported;

/// The lease store (stub).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct SkeletonLeaseStore {}

impl SkeletonLeaseStore {
    /// The stub store. A real backend connects here.
    pub fn new() -> Self {
        Self {}
    }
}

/// The stub ownership error: the store could not be reached, nothing was sent.
fn unavailable(operation: &'static str) -> OwnershipError {
    OwnershipError::StoreUnavailable {
        source: Unsupported::boxed(operation),
    }
}

impl LeaseStore for SkeletonLeaseStore {
    async fn claim_as(
        &self,
        _scope: &OwnerScope,
        _claimant: Claimant<'_>,
    ) -> Result<ClaimOutcome, OwnershipError> {
        // One atomic step on the store's clock: check lifecycle, return a live owner, or bump the generation and write the record.
        Err(unavailable("claim"))
    }

    async fn renew(&self, _record: &OwnerRecord, _ttl_ms: u64) -> Result<Lease, OwnershipError> {
        // Atomically compare the exact record bytes, the storage pointer and the delete lock, then refresh the lease.
        Err(unavailable("renew"))
    }

    async fn renew_many(
        &self,
        records: &[OwnerRecord],
        _ttl_ms: u64,
    ) -> Vec<Result<Lease, OwnershipError>> {
        // Renew every record with every check of `renew`, in as few round trips as the store allows; one result per record, in order.
        records
            .iter()
            .map(|_| Err(unavailable("renew_many")))
            .collect()
    }

    async fn raise_generation_floor(
        &self,
        _scope: &OwnerScope,
        _floor: Generation,
    ) -> Result<u64, OwnershipError> {
        // Atomically set the scope's generation counter to max(counter, floor), never lowering it; return the counter. The generation counters are what the store must persist.
        Err(unavailable("raise_generation_floor"))
    }

    async fn release(&self, _record: &OwnerRecord) -> Result<bool, OwnershipError> {
        // Delete the owner record only if it is exactly `record`; the generation counter stays.
        Err(unavailable("release"))
    }

    async fn snapshot(
        &self,
        _scope: &OwnerScope,
        _lifecycle: &LifecycleId,
    ) -> Result<OwnerSnapshot, OwnershipError> {
        // One consistent read of owner, generation, lifecycle state (with the recorded shard count) and the store's clock.
        Err(unavailable("snapshot"))
    }

    async fn record_shard_count(
        &self,
        _scope: &OwnerScope,
        _lifecycle: &LifecycleId,
    ) -> Result<(), OwnershipError> {
        // Atomically: the lifecycle checks of a claim, then the recorded shard count (refuse another; record the scope's when none). A claim does the same in its own step; set_active_storage keeps the count for the same storage id and clears it when the pointer moves.
        Err(unavailable("record_shard_count"))
    }
}

impl LifecycleAdmin for SkeletonLeaseStore {
    async fn set_active_storage(
        &self,
        _lifecycle: &LifecycleId,
        _storage: Option<&StorageId>,
    ) -> Result<(), OwnershipError> {
        // Point the lifecycle at `storage`, or remove the pointer.
        Err(unavailable("set_active_storage"))
    }

    async fn set_delete_lock(
        &self,
        _lifecycle: &LifecycleId,
        _lock: Option<DeleteLock>,
    ) -> Result<(), OwnershipError> {
        // Set or remove the lifecycle's delete lock.
        Err(unavailable("set_delete_lock"))
    }
}

#[cfg(feature = "scheduler")]
impl durability_ownership::ObjectFence for crate::SkeletonStorage {
    fn fence_claim(
        &self,
        _record: &OwnerRecord,
        _budget: Option<std::sync::Arc<dyn durability_ownership::BudgetCheck>>,
    ) -> Result<(), OwnershipError> {
        // In one object transaction: refuse a higher fenced generation, or the same generation held by another record; else record `record` as the holder. From then on every commit checks the holder and, right before COMMIT, that `budget` is not spent.
        Err(unavailable("fence_claim"))
    }
}
