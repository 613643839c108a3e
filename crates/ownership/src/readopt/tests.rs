//! Re-adoption takes the store's word: this task's claim at the same
//! generation is adopted again; a moved claim is lost; a store that cannot
//! answer leaves the decision for later.

use std::sync::Arc;

use durability_time::ManualClock;

use super::Readoption;
use crate::error::OwnershipError;
use crate::hooked::{Action, HookedStore, Hooks, Method};
use crate::manager::{Ownership, Resolution};
use crate::memory::InMemoryLeaseStore;
use crate::record::Generation;
use crate::scope::TaskId;
use crate::scope::{LifecycleId, OwnerScope};
use crate::settings::OwnershipSettings;

type Store = HookedStore<Arc<InMemoryLeaseStore<ManualClock>>>;

use crate::memory::test_world as world;

fn task(
    clock: &ManualClock,
    store: &Arc<InMemoryLeaseStore<ManualClock>>,
    name: &str,
    hooks: Hooks,
) -> Ownership<Store, ManualClock> {
    let settings = OwnershipSettings {
        owner_ttl_ms: 10_000,
        lease_guard_ms: 1000,
        ..Default::default()
    };
    let store = HookedStore::new(Arc::clone(store), hooks);
    Ownership::new(
        store,
        clock.clone(),
        TaskId::new(name).expect("task"),
        settings,
    )
}

async fn claim(
    o: &Ownership<Store, ManualClock>,
    scope: &OwnerScope,
    l: &LifecycleId,
) -> Generation {
    match o.resolve(scope, l).await.expect("resolve") {
        Resolution::Local(g) => g,
        other => panic!("expected local ownership, got {other:?}"),
    }
}

#[tokio::test]
async fn a_forgotten_claim_still_in_the_store_is_readopted_at_its_generation() {
    let (clock, store, scope, lifecycle) = world().await;
    let a = task(&clock, &store, "a", Hooks::new());
    let g = claim(&a, &scope, &lifecycle).await;
    a.forget(&scope);
    assert!(a.probe().scopes.is_empty(), "forgotten");
    assert_eq!(
        a.readopt(&scope, &lifecycle, g).await,
        Readoption::Readopted
    );
    let probe = a.probe();
    assert_eq!(probe.scopes.len(), 1, "owned again");
    assert_eq!(probe.scopes[0].generation, g.get());
}

#[tokio::test]
async fn a_claim_that_moved_is_lost_and_never_claimed_anew() {
    let (clock, store, scope, lifecycle) = world().await;
    let a = task(&clock, &store, "a", Hooks::new());
    let b = task(&clock, &store, "b", Hooks::new());
    let g = claim(&a, &scope, &lifecycle).await;
    a.forget(&scope);
    clock.advance(20_000);
    let gb = claim(&b, &scope, &lifecycle).await;
    assert!(gb > g);
    assert_eq!(a.readopt(&scope, &lifecycle, g).await, Readoption::Lost);
    assert!(a.probe().scopes.is_empty());
    // Expired and free: still not claimed anew by a re-adoption.
    b.forget(&scope);
    clock.advance(20_000);
    assert_eq!(b.readopt(&scope, &lifecycle, gb).await, Readoption::Lost);
    assert!(b.probe().scopes.is_empty());
}

#[tokio::test]
async fn a_store_that_cannot_answer_leaves_the_decision_for_later() {
    let (clock, store, scope, lifecycle) = world().await;
    let hooks = Hooks::new();
    let a = task(&clock, &store, "a", hooks.clone());
    let g = claim(&a, &scope, &lifecycle).await;
    a.forget(&scope);
    hooks.set(|method, _| {
        if method == Method::Snapshot {
            Action::Fail(OwnershipError::StoreUnavailable {
                source: "injected".into(),
            })
        } else {
            Action::Pass
        }
    });
    assert_eq!(
        a.readopt(&scope, &lifecycle, g).await,
        Readoption::Undecided
    );
    assert!(a.probe().scopes.is_empty(), "nothing admitted meanwhile");
    hooks.set(|_, _| Action::Pass);
    assert_eq!(
        a.readopt(&scope, &lifecycle, g).await,
        Readoption::Readopted
    );
}
