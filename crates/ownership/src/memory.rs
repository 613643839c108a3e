//! An in-memory [`LeaseStore`], the reference the conformance suite is written against.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::error::OwnershipError;
use crate::record::{Generation, OwnerRecord};
use crate::scope::{LifecycleId, OwnerScope, ShardCount, StorageId, TaskId};
use crate::store::{
    ClaimOutcome, Claimant, DeleteLock, Lease, LeaseStore, LifecycleAdmin, OwnerSnapshot, Presence,
    PresenceEntry, PresenceGroup, check_lifecycle, check_shard_count, validate_ttl,
};
use durability_time::Clock;

#[derive(Debug, Default)]
struct State {
    owners: HashMap<String, (Vec<u8>, u64)>,
    generations: HashMap<String, u64>,
    active: HashMap<String, StorageId>,
    locks: HashMap<String, DeleteLock>,
    /// Shard counts by storage id.
    counts: HashMap<String, ShardCount>,
    /// Presence records by group key, then task id: value and expiry.
    presence: HashMap<String, std::collections::BTreeMap<String, (Vec<u8>, u64)>>,
}

/// A lease store in process memory, timed by an injected clock.
#[derive(Debug)]
pub struct InMemoryLeaseStore<C> {
    clock: C,
    count: ShardCount,
    state: Mutex<State>,
}

impl<C: Clock> InMemoryLeaseStore<C> {
    /// An empty store on `clock`.
    pub fn new(clock: C, count: ShardCount) -> Self {
        Self {
            clock,
            count,
            state: Mutex::new(State::default()),
        }
    }

    /// Writes raw bytes as the owner record of `scope` with a lease of `ttl_ms`
    /// (for tests of malformed records).
    pub fn put_raw_owner(&self, scope: &OwnerScope, raw: &[u8], ttl_ms: u64) {
        let exp = self.clock.now_ms_u64().saturating_add(ttl_ms);
        self.lock()
            .owners
            .insert(scope.to_string(), (raw.to_vec(), exp));
    }

    /// Removes the owner record of `scope`, as if its lease expired.
    pub fn expire_owner(&self, scope: &OwnerScope) {
        self.lock().owners.remove(scope.host_id());
    }

    /// Removes the presence record of `task` in `group`, as if it expired.
    pub fn expire_presence(&self, group: &PresenceGroup, task: &TaskId) {
        if let Some(g) = self.lock().presence.get_mut(&group.key()) {
            g.remove(task.as_str());
        }
    }

    /// The raw stored owner record (live or not) and generation counter of `scope`.
    pub fn raw_state(&self, scope: &OwnerScope) -> (Option<Vec<u8>>, Option<u64>) {
        let st = self.lock();
        (
            st.owners.get(scope.host_id()).map(|(raw, _)| raw.clone()),
            st.generations.get(scope.host_id()).copied(),
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`check_lifecycle`] on the stored pointer and lock of `lifecycle`.
    fn check(
        st: &State,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<(), OwnershipError> {
        check_lifecycle(
            scope.storage_id(),
            lifecycle,
            st.active.get(lifecycle.as_str()),
            st.locks.get(lifecycle.as_str()).copied(),
        )?;
        check_shard_count(scope, st.counts.get(scope.storage_id().as_str()).copied())
    }

    /// Records the scope's shard count for its storage id if none is.
    fn record_count(st: &mut State, scope: &OwnerScope) {
        st.counts
            .entry(scope.storage_id().as_str().to_owned())
            .or_insert(scope.shard_count());
    }

    fn live_owner(
        &self,
        st: &mut State,
        scope: &OwnerScope,
        now: u64,
    ) -> Result<Option<Lease>, OwnershipError> {
        let key = scope.host_id();
        match st.owners.get(key) {
            Some((_, exp)) if *exp <= now => {
                st.owners.remove(key);
                Ok(None)
            }
            Some((raw, exp)) => {
                let record = OwnerRecord::decode(raw, scope, self.count)?;
                Ok(Some(Lease {
                    record,
                    remaining_ms: exp - now,
                }))
            }
            None => Ok(None),
        }
    }
}

impl<C: Clock> LeaseStore for InMemoryLeaseStore<C> {
    async fn claim_as(
        &self,
        scope: &OwnerScope,
        claimant: Claimant<'_>,
    ) -> Result<ClaimOutcome, OwnershipError> {
        validate_ttl(claimant.ttl_ms)?;
        let now = self.clock.now_ms_u64();
        let mut st = self.lock();
        Self::check(&st, scope, claimant.lifecycle)?;
        if let Some(lease) = self.live_owner(&mut st, scope, now)? {
            return Ok(ClaimOutcome::Held(lease));
        }
        let next = st.generations.get(scope.host_id()).copied().unwrap_or(0) + 1;
        let generation = Generation::new(next)?;
        Self::record_count(&mut st, scope);
        let record = claimant.record(scope, generation);
        let exp = now.saturating_add(claimant.ttl_ms);
        st.generations.insert(scope.to_string(), next);
        st.owners.insert(
            scope.to_string(),
            (record.encoded().as_bytes().to_vec(), exp),
        );
        Ok(ClaimOutcome::Claimed(Lease {
            record,
            remaining_ms: claimant.ttl_ms,
        }))
    }

    async fn renew(&self, record: &OwnerRecord, ttl_ms: u64) -> Result<Lease, OwnershipError> {
        validate_ttl(ttl_ms)?;
        let now = self.clock.now_ms_u64();
        let mut st = self.lock();
        let scope = record.scope();
        let live = matches!(st.owners.get(scope.host_id()),
            Some((raw, exp)) if *exp > now && raw.as_slice() == record.encoded().as_bytes());
        if !live {
            return Err(OwnershipError::StaleOwner {
                scope: scope.to_string(),
            });
        }
        Self::check(&st, scope, record.lifecycle())?;
        let exp = now.saturating_add(ttl_ms);
        if let Some(entry) = st.owners.get_mut(scope.host_id()) {
            entry.1 = exp;
        }
        Ok(Lease {
            record: record.clone(),
            remaining_ms: ttl_ms,
        })
    }

    async fn release(&self, record: &OwnerRecord) -> Result<bool, OwnershipError> {
        let mut st = self.lock();
        let key = record.scope().host_id();
        let matches = st
            .owners
            .get(key)
            .is_some_and(|(raw, _)| raw.as_slice() == record.encoded().as_bytes());
        if matches {
            st.owners.remove(key);
        }
        Ok(matches)
    }

    async fn snapshot(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<OwnerSnapshot, OwnershipError> {
        let now = self.clock.now_ms_u64();
        let mut st = self.lock();
        let owner = self.live_owner(&mut st, scope, now)?;
        Ok(OwnerSnapshot {
            store_now_ms: now,
            owner,
            generation: st.generations.get(scope.host_id()).copied().unwrap_or(0),
            active_storage: st.active.get(lifecycle.as_str()).cloned(),
            delete_lock: st.locks.get(lifecycle.as_str()).copied(),
            shard_count: st.counts.get(scope.storage_id().as_str()).copied(),
        })
    }

    async fn raise_generation_floor(
        &self,
        scope: &OwnerScope,
        floor: Generation,
    ) -> Result<u64, OwnershipError> {
        let mut st = self.lock();
        let counter = st.generations.entry(scope.to_string()).or_insert(0);
        *counter = (*counter).max(floor.get());
        Ok(*counter)
    }

    async fn record_shard_count(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<(), OwnershipError> {
        let mut st = self.lock();
        Self::check(&st, scope, lifecycle)?;
        Self::record_count(&mut st, scope);
        Ok(())
    }

    async fn write_presence(&self, presence: Presence<'_>) -> Result<(), OwnershipError> {
        let exp = self.clock.now_ms_u64().saturating_add(presence.ttl_ms());
        self.lock()
            .presence
            .entry(presence.group().key())
            .or_default()
            .insert(
                presence.task().as_str().to_owned(),
                (presence.value().to_vec(), exp),
            );
        Ok(())
    }

    async fn withdraw(&self, group: &PresenceGroup, task: &TaskId) -> Result<bool, OwnershipError> {
        Ok(self
            .lock()
            .presence
            .get_mut(&group.key())
            .and_then(|g| g.remove(task.as_str()))
            .is_some())
    }

    async fn live_tasks(
        &self,
        group: &PresenceGroup,
    ) -> Result<Vec<PresenceEntry>, OwnershipError> {
        let now = self.clock.now_ms_u64();
        let st = self.lock();
        let Some(records) = st.presence.get(&group.key()) else {
            return Ok(Vec::new());
        };
        Ok(records
            .iter()
            .filter(|(_, (_, exp))| *exp > now)
            .filter_map(|(task, (value, exp))| {
                PresenceEntry::stored(task, value.clone(), exp - now)
            })
            .collect())
    }
}

impl<C: Clock> InMemoryLeaseStore<C> {
    /// Forgets every owner record and generation counter, as a Redis without
    /// persistence does on `FLUSHALL` or a restart (lifecycle state stays).
    pub fn wipe(&self) {
        let mut st = self.lock();
        st.owners.clear();
        st.generations.clear();
    }
}

impl<C: Clock> LifecycleAdmin for InMemoryLeaseStore<C> {
    async fn set_active_storage(
        &self,
        lifecycle: &LifecycleId,
        storage: Option<&StorageId>,
    ) -> Result<(), OwnershipError> {
        let mut st = self.lock();
        match storage {
            Some(s) => st.active.insert(lifecycle.as_str().to_owned(), s.clone()),
            None => st.active.remove(lifecycle.as_str()),
        };
        Ok(())
    }

    async fn set_delete_lock(
        &self,
        lifecycle: &LifecycleId,
        lock: Option<DeleteLock>,
    ) -> Result<(), OwnershipError> {
        let mut st = self.lock();
        match lock {
            Some(l) => st.locks.insert(lifecycle.as_str().to_owned(), l),
            None => st.locks.remove(lifecycle.as_str()),
        };
        Ok(())
    }
}

/// The crate's unit tests' world: a store on a manual clock at 1,000,000 ms,
/// the lifecycle `ns:w` pointing at the storage id `st1`, and the scope
/// `st1:Room:shard1`.
#[cfg(test)]
pub(crate) async fn test_world() -> (
    durability_time::ManualClock,
    std::sync::Arc<InMemoryLeaseStore<durability_time::ManualClock>>,
    OwnerScope,
    LifecycleId,
) {
    let clock = durability_time::ManualClock::new(1_000_000);
    let store = std::sync::Arc::new(InMemoryLeaseStore::new(
        clock.clone(),
        ShardCount::default(),
    ));
    let lifecycle = LifecycleId::new("ns:w").expect("lifecycle");
    let storage = StorageId::new("st1").expect("storage");
    store
        .set_active_storage(&lifecycle, Some(&storage))
        .await
        .expect("pointer");
    let scope = OwnerScope::parse("st1:Room:shard1", ShardCount::default()).expect("scope");
    (clock, store, scope, lifecycle)
}
