//! Property test: random claims, renews, releases and clock moves on the
//! in-memory lease store, checked against a simple model of one lease per scope.

use durability_ownership::memory::InMemoryLeaseStore;
use durability_ownership::{
    ClaimOutcome, Clock, LeaseStore, LifecycleAdmin, LifecycleId, ManualClock, OwnerRecord,
    OwnerScope, ShardCount, TaskId,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Claim(usize),
    Renew(usize),
    Release(usize),
    Advance(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize).prop_map(Op::Claim),
        (0..3usize).prop_map(Op::Renew),
        (0..3usize).prop_map(Op::Release),
        (0..1500i64).prop_map(Op::Advance),
    ]
}

/// The model: the live owner (task index, generation, expiry) and the counter.
#[derive(Debug, Default)]
struct Model {
    owner: Option<(usize, u64, u64)>,
    generation: u64,
}

const TTL: u64 = 1000;

proptest! {
    #[test]
    fn lease_store_matches_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let clock = ManualClock::new(10_000);
            let store = InMemoryLeaseStore::new(clock.clone(), ShardCount::default());
            let lifecycle = LifecycleId::new("ns:model").unwrap();
            let scope = OwnerScope::parse("st:Model:shard0", ShardCount::default()).unwrap();
            store.set_active_storage(&lifecycle, Some(scope.storage_id())).await.unwrap();
            let tasks: Vec<TaskId> = ["a", "b", "c"].iter().map(|t| TaskId::new(t).unwrap()).collect();
            let mut held: Vec<Option<OwnerRecord>> = vec![None, None, None];
            let mut m = Model::default();
            for op in ops {
                let now = clock.now_ms_u64();
                if matches!(m.owner, Some((_, _, exp)) if exp <= now) {
                    m.owner = None;
                }
                match op {
                    Op::Claim(t) => match store.claim(&scope, &lifecycle, &tasks[t], TTL).await.unwrap() {
                        ClaimOutcome::Claimed(l) => {
                            prop_assert!(m.owner.is_none(), "claimed a live scope");
                            m.generation += 1;
                            prop_assert_eq!(l.record.generation().get(), m.generation);
                            m.owner = Some((t, m.generation, now + TTL));
                            held[t] = Some(l.record);
                        }
                        ClaimOutcome::Held(l) => {
                            let (owner, generation, _) = m.owner.expect("held implies a live owner");
                            prop_assert_eq!(l.record.task(), &tasks[owner]);
                            prop_assert_eq!(l.record.generation().get(), generation);
                        }
                    },
                    Op::Renew(t) => {
                        let Some(record) = held[t].clone() else { continue };
                        let expected = matches!(m.owner, Some((o, g, _)) if o == t && g == record.generation().get());
                        let got = store.renew(&record, TTL).await;
                        prop_assert_eq!(got.is_ok(), expected, "renew of {:?}", record.generation());
                        if expected {
                            m.owner = Some((t, record.generation().get(), now + TTL));
                        } else {
                            prop_assert_eq!(got.unwrap_err().code(), "stale_owner");
                        }
                    }
                    Op::Release(t) => {
                        let Some(record) = held[t].take() else { continue };
                        let expected = matches!(m.owner, Some((o, g, _)) if o == t && g == record.generation().get());
                        prop_assert_eq!(store.release(&record).await.unwrap(), expected);
                        if expected {
                            m.owner = None;
                        }
                    }
                    Op::Advance(ms) => clock.advance(ms),
                }
                let snap = store.snapshot(&scope, &lifecycle).await.unwrap();
                prop_assert_eq!(snap.generation, m.generation, "generation never decreases and matches");
                let live = if matches!(m.owner, Some((_, _, exp)) if exp <= clock.now_ms_u64()) { None } else { m.owner };
                prop_assert_eq!(snap.owner.map(|l| l.record.generation().get()), live.map(|(_, g, _)| g));
            }
            Ok(())
        })?;
    }
}
