//! Tests of admission, renewal, drain, the watchdog and the probe.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

use super::*;
use crate::hooked::{Action, HookedStore, Hooks, Method};
use crate::memory::InMemoryLeaseStore;
use crate::scope::{ShardCount, StorageId};
use crate::store::LifecycleAdmin;
use durability_time::ManualClock;

mod admission;
mod drain;
mod duplicate;
mod hand_off;
mod metrics;
mod renew_all;

/// A store wrapper counting every call, to prove admission does no I/O.
type Counting = HookedStore<Arc<InMemoryLeaseStore<ManualClock>>>;

/// A task of the tests: its calls counted, on the manual clock.
type Task = Ownership<Counting, ManualClock>;

struct Fixture {
    clock: ManualClock,
    store: Arc<InMemoryLeaseStore<ManualClock>>,
    calls: Hooks,
    scope: OwnerScope,
    lifecycle: LifecycleId,
}

fn settings() -> OwnershipSettings {
    OwnershipSettings {
        owner_ttl_ms: 10_000,
        lease_guard_ms: 1000,
        drain_in_flight_timeout_ms: 8000,
        ..Default::default()
    }
}

async fn fixture() -> Fixture {
    let (clock, store, scope, lifecycle) = crate::memory::test_world().await;
    Fixture {
        clock,
        store,
        calls: Hooks::new(),
        scope,
        lifecycle,
    }
}

impl Fixture {
    fn task(&self, name: &str) -> Task {
        self.task_with(name, settings())
    }

    /// A task whose admission trusts its cached lease ([`Admission::Cached`]).
    fn cached_task(&self, name: &str) -> Task {
        let s = OwnershipSettings {
            admission: Admission::Cached,
            ..settings()
        };
        self.task_with(name, s)
    }

    fn task_with(&self, name: &str, s: OwnershipSettings) -> Task {
        let store = HookedStore::new(Arc::clone(&self.store), self.calls.clone());
        Ownership::new(
            store,
            self.clock.clone(),
            TaskId::new(name).expect("task"),
            s,
        )
    }

    async fn claim(&self, o: &Task) -> Generation {
        match o
            .resolve(&self.scope, &self.lifecycle)
            .await
            .expect("resolve")
        {
            Resolution::Local(g) => g,
            other => panic!("expected local ownership, got {other:?}"),
        }
    }

    /// A task named `name` holding the scope, and its generation.
    async fn claimed(&self, name: &str) -> (Task, Generation) {
        let task = self.task(name);
        let generation = self.claim(&task).await;
        (task, generation)
    }

    /// A task named `name` with [`Admission::Cached`] holding the scope, and
    /// its generation.
    async fn cached_claimed(&self, name: &str) -> (Task, Generation) {
        let task = self.cached_task(name);
        let generation = self.claim(&task).await;
        (task, generation)
    }

    /// The code `o`'s admission of the scope at `g` is refused with.
    async fn admit_refused(&self, o: &Task, g: Generation) -> &'static str {
        let admitted = o.admit(&self.scope, g).await;
        admitted.expect_err("admission refused").code()
    }

    /// The code `o`'s checked admission of the scope at `g` is refused with.
    async fn checked_refused(&self, o: &Task, g: Generation) -> &'static str {
        let admitted = o.admit_checked(&self.scope, g).await;
        admitted.expect_err("checked admission refused").code()
    }

    /// The scope's snapshot on the store.
    async fn snapshot(&self) -> crate::store::OwnerSnapshot {
        let snapshot = self.store.snapshot(&self.scope, &self.lifecycle).await;
        snapshot.expect("snapshot")
    }

    /// Points the lifecycle at the storage id `storage` (`None`: no pointer).
    async fn point_at(&self, storage: Option<&str>) {
        let storage = storage.map(|s| StorageId::new(s).expect("storage"));
        let store = &self.store;
        let set = store.set_active_storage(&self.lifecycle, storage.as_ref());
        set.await.expect("pointer");
    }

    /// Sets (or with `None` clears) the lifecycle's delete lock.
    async fn lock(&self, lock: Option<crate::store::DeleteLock>) {
        let set = self.store.set_delete_lock(&self.lifecycle, lock);
        set.await.expect("lock");
    }

    /// The code `o`'s resolve of the scope is refused with.
    async fn refused(&self, o: &Task) -> &'static str {
        let resolved = o.resolve(&self.scope, &self.lifecycle).await;
        resolved.expect_err("refused").code()
    }
}

/// Runs `o`'s drain in its own task.
fn spawn_drain<S, C>(o: &Ownership<S, C>) -> tokio::task::JoinHandle<DrainReport>
where
    S: LeaseStore + 'static,
    C: Clock + 'static,
{
    let o = o.clone();
    tokio::spawn(async move { o.drain().await })
}

/// Task `a` holding the scope with one admitted permit, and its drain
/// started (and settled) in its own task.
async fn draining_with_work(
    f: &Fixture,
) -> (
    Task,
    Generation,
    AdmissionPermit,
    tokio::task::JoinHandle<DrainReport>,
) {
    let (a, g) = f.claimed("a").await;
    let permit = a.admit(&f.scope, g).await.expect("admitted");
    let drain = spawn_drain(&a);
    settle().await;
    (a, g, permit, drain)
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn admission_with_ample_budget_does_no_io() {
    let f = fixture().await;
    let (a, g) = f.cached_claimed("a").await;
    let before = f.calls.total();
    for _ in 0..100 {
        let p = a.admit(&f.scope, g).await.expect("admitted");
        assert_eq!(p.generation(), g);
        assert_eq!(a.in_flight(), 1);
    }
    assert_eq!(
        f.calls.total(),
        before,
        "admission with ample budget did I/O"
    );
    assert_eq!(a.in_flight(), 0);
}

#[tokio::test]
async fn admission_below_guard_renews_same_generation() {
    let f = fixture().await;
    let (a, g) = f.cached_claimed("a").await;
    assert_admission_below_guard_renews(&f, &a, g, 1, "exactly one renew").await;
}

/// Admits `a` (holding the scope at `g`) 500 ms before its lease ends and
/// asserts that the admission made `calls` store calls (`why`) and renewed
/// the lease in the same generation.
async fn assert_admission_below_guard_renews(
    f: &Fixture,
    a: &Task,
    g: Generation,
    calls: usize,
    why: &str,
) {
    f.clock.advance(9_500);
    let before = f.calls.total();
    let p = a.admit(&f.scope, g).await.expect("renewed and admitted");
    assert_eq!(f.calls.total(), before + calls, "{why}");
    assert_eq!(p.generation(), g);
    assert_eq!(a.probe().scopes[0].lease_remaining_ms, 10_000);
}

/// A renew answered `owner_race` wrote nothing (the SQLite store answers it
/// when the file is busy): the lease stands until its deadline, as after an
/// unreachable store, so the scope and its objects are kept; the next
/// renew decides.
#[tokio::test]
async fn a_renew_answered_owner_race_keeps_the_scope_until_the_store_decides() {
    let f = fixture().await;
    let (a, g) = f.cached_claimed("a").await;
    let scope = f.scope.clone();
    f.calls.set(move |m, s| {
        if matches!(m, Method::Renew | Method::RenewMany) && s == Some(&scope) {
            Action::Fail(OwnershipError::OwnerRace {
                scope: scope.to_string(),
            })
        } else {
            Action::Pass
        }
    });
    f.clock.advance(2_000);
    let renewed = a.renew_all().await;
    assert!(
        matches!(renewed[..], [(_, Err(OwnershipError::OwnerRace { .. }))]),
        "{renewed:?}"
    );
    assert!(
        matches!(
            a.renew(&f.scope).await,
            Err(OwnershipError::OwnerRace { .. })
        ),
        "a single renew meets the same race"
    );
    assert_eq!(a.probe().scopes.len(), 1, "the scope is still owned");
    assert_eq!(a.probe().scopes[0].lease_remaining_ms, 8_000);
    let p = a
        .admit(&f.scope, g)
        .await
        .expect("admitted within the lease");
    drop(p);
    f.calls.clear();
    let renewed = a.renew_all().await;
    assert!(
        matches!(renewed[..], [(_, Ok(renewed_at))] if renewed_at == g),
        "{renewed:?}"
    );
    assert_eq!(a.probe().scopes[0].lease_remaining_ms, 10_000);
}

#[tokio::test]
async fn admission_fails_closed_after_takeover() {
    let f = fixture().await;
    let a = f.task("a");
    let b = f.task("b");
    let g1 = f.claim(&a).await;
    f.clock.advance(10_000);
    let g2 = f.claim(&b).await;
    assert!(g2 > g1, "generation bumps on takeover");
    assert_eq!(f.admit_refused(&a, g1).await, "lease_expired");
    // Even with a local lease still believed valid, the guard renew fails closed.
    let c = f.task("c");
    f.clock.advance(10_000);
    let g3 = f.claim(&c).await;
    f.store.expire_owner(&f.scope);
    let (d, g4) = f.claimed("d").await;
    f.clock.advance(9_500);
    let err = c.admit(&f.scope, g3).await.expect_err("renew must fail");
    assert_eq!(err.code(), "stale_owner");
    assert!(err.may_retry(false));
    assert!(d.admit(&f.scope, g4).await.is_ok());
    assert_eq!(c.probe().scopes.len(), 0, "stale scope forgotten");
}

#[tokio::test]
async fn admission_checks_generation_and_ownership() {
    let f = fixture().await;
    let a = f.task("a");
    let other = OwnerScope::parse("st1:Room:shard2", ShardCount::default()).expect("scope");
    let g = f.claim(&a).await;
    let wrong = Generation::new(g.get() + 1).expect("gen");
    assert_eq!(f.admit_refused(&a, wrong).await, "stale_owner");
    assert_eq!(
        a.admit(&other, g).await.expect_err("not owned").code(),
        "stale_owner"
    );
    let b = f.task("b");
    match b.resolve(&f.scope, &f.lifecycle).await.expect("resolve") {
        Resolution::Remote {
            task,
            generation,
            endpoint,
        } => {
            assert_eq!(task.as_str(), "a");
            assert_eq!(generation, g);
            assert_eq!(endpoint, None);
        }
        other => panic!("expected remote, got {other:?}"),
    }
}

#[tokio::test]
async fn lifecycle_changes_fail_renewal_and_claims() {
    let f = fixture().await;
    let a = f.task("a");
    f.claim(&a).await;
    f.lock(Some(crate::store::DeleteLock::Whole)).await;
    assert_eq!(
        a.renew(&f.scope).await.expect_err("locked").code(),
        "worker_delete_locked"
    );
    let b = f.task("b");
    f.clock.advance(20_000);
    assert_eq!(f.refused(&b).await, "worker_delete_locked");
}

#[tokio::test]
async fn checked_admission_reads_a_fresh_snapshot() {
    let f = fixture().await;
    let (a, g) = f.cached_claimed("a").await;
    let before = f.calls.total();
    drop(a.admit_checked(&f.scope, g).await.expect("admitted"));
    assert_eq!(f.calls.total(), before + 1, "one snapshot");
    // The active storage pointer moves: cached admission cannot see it, the
    // checked one fails closed and forgets the scope.
    f.point_at(Some("st2")).await;
    assert!(a.admit(&f.scope, g).await.is_ok());
    assert_eq!(f.checked_refused(&a, g).await, "storage_inactive");
    assert!(a.probe().scopes.is_empty());
    // The owner record is replaced behind this task's back.
    f.point_at(Some("st1")).await;
    let b = f.task("b");
    f.clock.advance(20_000);
    let gb = f.claim(&b).await;
    f.store.expire_owner(&f.scope);
    let c = f.task("c");
    f.claim(&c).await;
    assert_eq!(f.checked_refused(&b, gb).await, "stale_owner");
}

#[tokio::test]
async fn drain_waits_for_in_flight_then_releases() {
    let f = fixture().await;
    let (a, g, permit, drain) = draining_with_work(&f).await;
    assert!(!drain.is_finished(), "drain must wait for admitted work");
    assert!(a.is_draining());
    assert_eq!(f.admit_refused(&a, g).await, "draining");
    assert_eq!(f.refused(&a).await, "draining");
    let snap = f.snapshot().await;
    assert!(snap.owner.is_some(), "lease still held while work runs");
    drop(permit);
    let report = drain.await.expect("drain task");
    assert_eq!(
        report,
        DrainReport::Drained {
            released: vec![(f.scope.clone(), g)],
            not_released: vec![]
        }
    );
    let snap = f.snapshot().await;
    assert!(snap.owner.is_none(), "released");
    assert_eq!(snap.generation, g.get(), "generation survives release");
    let b = f.task("b");
    assert!(f.claim(&b).await > g);
}

#[tokio::test]
async fn drain_past_its_timeout_keeps_leases() {
    let f = fixture().await;
    let (a, g, permit, drain) = draining_with_work(&f).await;
    f.clock.advance(7_999);
    settle().await;
    assert!(!drain.is_finished());
    f.clock.advance(1);
    settle().await;
    let report = drain.await.expect("drain task");
    assert_eq!(report, DrainReport::TimedOut { in_flight: 1 });
    let snap = f.snapshot().await;
    assert_eq!(
        snap.owner.map(|l| l.record.generation()),
        Some(g),
        "lease kept"
    );
    assert_eq!(a.probe().scopes.len(), 1);
    drop(permit);
}

#[tokio::test]
async fn watchdog_renews_then_cancels_when_ownership_moves() {
    let f = fixture().await;
    let (a, g) = f.claimed("a").await;
    let token = CancellationToken::new();
    let watcher = a.clone();
    let (scope, t) = (f.scope.clone(), token.clone());
    let watch = tokio::spawn(async move { watcher.watch(&scope, g, t).await });
    settle().await;
    let renews_before = f.calls.total();
    f.clock.advance(9_000); // guard interval before expiry
    settle().await;
    assert_eq!(f.calls.total(), renews_before + 1, "watchdog renewed");
    assert!(!token.is_cancelled());
    // Ownership moves: the record disappears and another task claims.
    f.store.expire_owner(&f.scope);
    let b = f.task("b");
    f.claim(&b).await;
    f.clock.advance(9_000);
    settle().await;
    assert!(token.is_cancelled(), "work cancelled when ownership moved");
    match watch.await.expect("watch task") {
        WatchExit::Lost(e) => assert_eq!(e.code(), "stale_owner"),
        WatchExit::Finished => panic!("expected lost"),
    }
    assert!(a.probe().scopes.is_empty(), "scope forgotten");
}

#[tokio::test]
async fn watchdog_finishes_with_the_work() {
    let f = fixture().await;
    let (a, g) = f.claimed("a").await;
    let token = CancellationToken::new();
    let (w, scope, t) = (a.clone(), f.scope.clone(), token.clone());
    let watch = tokio::spawn(async move { w.watch(&scope, g, t).await });
    settle().await;
    token.cancel();
    assert!(matches!(watch.await.expect("watch"), WatchExit::Finished));
    assert_eq!(a.probe().scopes.len(), 1, "still owned");
}

#[tokio::test]
async fn a_guard_not_below_the_ttl_is_capped_at_half_the_ttl() {
    let f = fixture().await;
    let store = HookedStore::new(Arc::clone(&f.store), f.calls.clone());
    let s = OwnershipSettings {
        owner_ttl_ms: 1000,
        lease_guard_ms: 5000,
        admission: Admission::Cached,
        ..settings()
    };
    let a = Ownership::new(store, f.clock.clone(), TaskId::new("a").expect("task"), s);
    let g = f.claim(&a).await;
    let before = f.calls.total();
    drop(
        a.admit(&f.scope, g)
            .await
            .expect("ample budget under the capped guard"),
    );
    assert_eq!(
        f.calls.total(),
        before,
        "no renew with 1000 ms left and a 500 ms guard"
    );
    f.clock.advance(600);
    drop(a.admit(&f.scope, g).await.expect("renewed"));
    assert_eq!(f.calls.total(), before + 1);
}

#[tokio::test]
async fn probe_reports_scopes_generations_and_leases() {
    let f = fixture().await;
    let a = f.task("task-a");
    let g = f.claim(&a).await;
    f.clock.advance(2_500);
    let p = a.probe();
    assert_eq!(p.task, "task-a");
    assert!(!p.draining);
    assert_eq!(
        p.scopes,
        vec![ProbeScope {
            scope: "st1:Room:shard1".into(),
            generation: g.get(),
            lease_remaining_ms: 7_500
        }]
    );
    let json = serde_json::to_string(&p).expect("json");
    assert!(json.contains("\"generation\":1"), "{json}");
}

#[test]
fn public_futures_are_send() {
    fn check<T: Send>(_: &T) {}
    let clock = ManualClock::new(0);
    let o = Ownership::new(
        InMemoryLeaseStore::new(clock.clone(), ShardCount::default()),
        clock,
        TaskId::new("t").expect("task"),
        OwnershipSettings::default(),
    );
    let scope = OwnerScope::parse("s:C:shard0", ShardCount::default()).expect("scope");
    let l = LifecycleId::new("l").expect("l");
    let g = Generation::new(1).expect("g");
    check(&o.resolve(&scope, &l));
    check(&o.admit(&scope, g));
    check(&o.drain());
    check(&o.watch(&scope, g, CancellationToken::new()));
}

impl Fixture {
    fn task_at(&self, name: &str, endpoint: &str) -> Task {
        let store = HookedStore::new(Arc::clone(&self.store), self.calls.clone());
        Ownership::with_endpoint(
            store,
            self.clock.clone(),
            TaskId::new(name).expect("task"),
            Some(OwnerEndpoint::new(endpoint).expect("endpoint")),
            settings(),
        )
    }
}

#[tokio::test]
async fn claims_advertise_the_endpoint_and_a_restart_on_a_new_one_waits_out_the_old_lease() {
    let f = fixture().await;
    let a1 = f.task_at("a", "http://10.0.0.1:7001");
    let Resolution::Local(g1) = a1.resolve(&f.scope, &f.lifecycle).await.expect("a1") else {
        panic!("a1 claims");
    };
    let b = f.task("b");
    assert_eq!(
        b.resolve(&f.scope, &f.lifecycle).await.expect("b"),
        Resolution::Remote {
            task: TaskId::new("a").expect("task"),
            generation: g1,
            endpoint: Some(OwnerEndpoint::new("http://10.0.0.1:7001").expect("endpoint")),
        }
    );
    // Task a restarts on another port while its old lease is live (the old
    // run crashed: it renews no more). The new run neither adopts nor gives
    // back a record it did not write: it waits for the lease to end.
    let a2 = f.task_at("a", "http://10.0.0.1:7002");
    for _ in 0..3 {
        let e = a2.resolve(&f.scope, &f.lifecycle).await.expect_err("held");
        assert_eq!(e.code(), "owner_race", "{e}");
        f.clock.advance(1000);
    }
    assert!(a2.duplicate_task().is_none(), "a lease that never moves");
    f.clock.advance(10_000);
    let Resolution::Local(g2) = a2.resolve(&f.scope, &f.lifecycle).await.expect("a2") else {
        panic!("a2 owns");
    };
    assert!(g2 > g1, "{g2:?} > {g1:?}");
    let held = f.snapshot().await.owner.expect("owner").record;
    assert_eq!(
        held.endpoint().map(OwnerEndpoint::as_str),
        Some("http://10.0.0.1:7002")
    );
    assert_eq!(held.generation(), g2);
    // The old run's admission fails closed at its generation (its local
    // lease ran out while the new run waited).
    let e = a1.admit(&f.scope, g1).await.expect_err("stale");
    assert!(matches!(e.code(), "stale_owner" | "lease_expired"), "{e}");
}
