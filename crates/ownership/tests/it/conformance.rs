//! The lease store conformance suite on [`InMemoryLeaseStore`].

use durability_ownership::conformance::{self, Harness, RawState};
use durability_ownership::memory::InMemoryLeaseStore;
use durability_ownership::{ManualClock, OwnerScope, PresenceGroup, ShardCount, TaskId};

struct Memory(InMemoryLeaseStore<ManualClock>);

impl Harness for Memory {
    type Store = InMemoryLeaseStore<ManualClock>;

    fn store(&self) -> &Self::Store {
        &self.0
    }

    async fn expire_owner(&self, scope: &OwnerScope) {
        self.0.expire_owner(scope);
    }

    async fn put_raw_owner(&self, scope: &OwnerScope, raw: &[u8]) {
        self.0.put_raw_owner(scope, raw, conformance::TTL_MS);
    }

    async fn raw_state(&self, scope: &OwnerScope) -> RawState {
        let (owner, generation) = self.0.raw_state(scope);
        RawState { owner, generation }
    }

    async fn expire_presence(&self, group: &PresenceGroup, task: &TaskId) {
        self.0.expire_presence(group, task);
    }
}

durability_ownership::ownership_conformance!(
    in_memory_store_passes_the_conformance_suite,
    "mem",
    async {
        Some(Memory(InMemoryLeaseStore::new(
            ManualClock::new(1_000),
            ShardCount::default(),
        )))
    }
);
