//! Calls, ownership moves, fencing, alarms, residency and drain, on a
//! manual clock.

use durability_host::{BoxError, Handle, Host, HostError, OwnPolicy, OwnerEvent, Residency};
use durability_ownership::conformance::{Action, HookedStore, Hooks, Method};
use durability_ownership::{DrainReport, OwnershipError};
use durability_scheduler::StorageErrorKind;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use tokio::sync::oneshot::{Receiver, Sender};
use tokio::task::JoinHandle;

use crate::support::{Counter, Store, TTL, TestHost, World, advance_until, incr, settings, spin};

fn fence_generation(w: &World, name: &str) -> i64 {
    let path = w
        .root()
        .join("st1")
        .join("Counter")
        .join(format!("{name}.sqlite"));
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("SELECT generation FROM durability_owner_fence", [], |r| {
            r.get(0)
        })
        .unwrap()
}

/// Runs `body` as a call to `Counter` `name` on `host`, in a task of its
/// own; `body` gets a gate, which the returned sender opens.
fn spawn_call<F, Fut>(
    host: &TestHost,
    name: &str,
    body: F,
) -> (Sender<()>, JoinHandle<Result<(), HostError>>)
where
    F: FnOnce(Handle<Counter, SqliteAlarmIndex>, Receiver<()>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    let (open, gate) = tokio::sync::oneshot::channel();
    let host = host.clone();
    let name = name.to_owned();
    let call = tokio::spawn(async move {
        host.call::<Counter, _, _, _>("Counter", &name, |h| body(h, gate))
            .await
    });
    (open, call)
}

/// Drains `host` in a task of its own.
fn spawn_drain(host: &TestHost) -> JoinHandle<DrainReport> {
    let host = host.clone();
    tokio::spawn(async move { host.shutdown().await })
}

#[tokio::test]
async fn a_call_opens_the_object_fenced_at_its_generation_and_commits() {
    let (w, a) = World::with_a().await;
    let mut events = a.subscribe();
    assert_eq!(incr(&a, "c1").await.unwrap(), 1);
    assert_eq!(incr(&a, "c1").await.unwrap(), 2);
    assert_eq!(fence_generation(&w, "c1"), 1);
    let scope = a.scope_for("Counter", "c1").unwrap();
    assert_eq!(
        events.try_recv().unwrap(),
        OwnerEvent::Acquired {
            scope: scope.to_string(),
            generation: 1
        }
    );
    let probe = a.probe();
    assert_eq!(probe.task, "a");
    assert_eq!(probe.state, "running");
    assert_eq!(probe.residency, "resident");
    assert_eq!(probe.scopes.len(), 1);
    assert_eq!(probe.scopes[0].scope, scope.to_string());
    assert_eq!(probe.scopes[0].generation, 1);
    assert_eq!(probe.in_flight, 0);
    assert_eq!(probe.open_objects, 1);
    assert_eq!(probe.dispatch.completed, 2);
    assert_eq!(probe.dispatch.cold, 1);
    // Bad input: typed, nothing opened.
    assert_eq!(
        incr(&a, "").await.unwrap_err().code(),
        "host_invalid_object_name"
    );
    assert_eq!(
        incr(&a, "bad\0name").await.unwrap_err().code(),
        "host_invalid_object_name"
    );
    let unknown = a
        .transaction::<Counter, _, _>("Room", "r1", |c, tx| c.incr(tx))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), "host_unknown_class");
    let wrong = a
        .transaction::<String, _, _>("Counter", "c1", |_, _| Ok(()))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), "host_class_type");
    // The in-flight gauge counts a running call.
    let (tx, running) = spawn_call(&a, "c1", |_, gate| async move {
        gate.await.ok();
        Ok(())
    });
    spin().await;
    assert_eq!(a.probe().in_flight, 1);
    tx.send(()).unwrap();
    running.await.unwrap().unwrap();
    assert_eq!(a.probe().in_flight, 0);
    a.shutdown().await;
}

#[tokio::test]
async fn a_stale_host_is_refused_at_admission_and_at_commit() {
    let (w, a, b) = World::with_a_and_b().await;
    let mut a_events = a.subscribe();
    assert_eq!(incr(&a, "c1").await.unwrap(), 1);
    // A keeps a handle on the object's scheduler past its ownership.
    let stolen = a
        .call::<Counter, _, _, _>("Counter", "c1", |h| async move { Ok(h.scheduler) })
        .await
        .unwrap();
    match incr(&b, "c1").await.unwrap_err() {
        HostError::NotOwner { owner, generation } => {
            assert_eq!((owner.as_str(), generation), ("a", 1));
        }
        other => panic!("{other}"),
    }
    // A stops renewing (as if paused): its lease runs out on the store.
    w.lapse(&a, "c1").await;
    assert_eq!(incr(&b, "c1").await.unwrap(), 2, "B continues A's state");
    assert_eq!(fence_generation(&w, "c1"), 2);
    // A's late commit through the object it had open is refused by the
    // storage fence, and writes nothing.
    let late = stolen.transaction(|tx| {
        tx.sql()
            .execute("UPDATE counter SET n = 100", [])
            .map_err(|e| durability_scheduler::StorageError::backend("late", e))
    });
    assert_eq!(late.unwrap_err().kind(), StorageErrorKind::Fenced);
    // A's new work is refused before it starts.
    let refused = incr(&a, "c1").await.unwrap_err();
    assert!(
        matches!(refused, HostError::NotOwner { ref owner, generation: 2 } if owner == "b"),
        "{refused}"
    );
    assert_eq!(incr(&b, "c1").await.unwrap(), 3);
    let mut saw_lost = false;
    while let Ok(e) = a_events.try_recv() {
        saw_lost |= matches!(e, OwnerEvent::Lost { .. });
    }
    assert!(saw_lost, "A published the loss of its scope");
    assert_eq!(
        a.probe().open_objects,
        0,
        "A closed the lost scope's objects"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_call_running_when_ownership_moves_is_cancelled_or_fenced() {
    let (w, a, b) = World::with_a_and_b().await;
    let (go, running) = spawn_call(&a, "c1", |h, gate| async move {
        h.scheduler.transaction(|tx| h.object.incr(tx))?;
        gate.await.ok();
        // The late second write of a call whose owner moved on.
        h.scheduler.transaction(|tx| h.object.incr(tx))?;
        Ok(())
    });
    spin().await;
    w.lapse(&a, "c1").await;
    assert_eq!(incr(&b, "c1").await.unwrap(), 2);
    let _ = go.send(());
    let result = running.await.unwrap();
    let err = result.unwrap_err();
    eprintln!("the running call ended with {err}");
    assert!(
        matches!(err, HostError::OwnershipLost { .. } | HostError::Fenced(_)),
        "{err}"
    );
    assert_eq!(
        incr(&b, "c1").await.unwrap(),
        3,
        "A's late write never landed"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_pending_alarm_fires_on_the_owner_and_moves_with_a_drain() {
    let (w, a) = World::with_a().await;
    w.set_timer_in(&a, "c1", 1_000).await;
    w.set_timer_in(&a, "c2", 30_000).await;
    assert!(w.fires("a c1").await);
    assert!(a.probe().alarms.delivered >= 1);
    // Drain A: c2's alarm is pending; B claims at once (no lease expiry).
    let report = a.shutdown().await;
    assert!(
        matches!(report, DrainReport::Drained { ref released, .. } if released.len() == 2),
        "{report:?}"
    );
    assert_eq!(incr(&a, "c2").await.unwrap_err().code(), "host_draining");
    let b = w.all_shards("b").await;
    let cycle = b.owner_cycle().await;
    assert!(
        cycle
            .claimed
            .contains(&b.scope_for("Counter", "c2").unwrap().to_string())
            || b.probe().scopes.len() == 16
    );
    assert_eq!(b.probe().scopes.len(), 16, "B owns every shard at once");
    assert!(
        advance_until(&w.clock, 500, 40_000, || w
            .fired()
            .contains(&"b c2".to_owned()))
        .await,
        "{:?}",
        w.fired()
    );
    assert_eq!(w.fired(), ["a c1", "b c2"]);
    b.shutdown().await;
}

#[tokio::test]
async fn drain_waits_for_admitted_work_and_a_timed_out_drain_keeps_the_leases() {
    let (w, a, b) = World::with_a_and_b().await;
    // Work that finishes in time: the drain waits for it, then releases.
    let (done, call) = spawn_call(&a, "c1", |h, gate| async move {
        gate.await.ok();
        h.scheduler.transaction(|tx| h.object.incr(tx))?;
        Ok(())
    });
    spin().await;
    let drain = spawn_drain(&a);
    spin().await;
    assert!(
        !drain.is_finished(),
        "the drain waits for the admitted call"
    );
    assert_eq!(incr(&a, "c9").await.unwrap_err().code(), "host_draining");
    done.send(()).unwrap();
    call.await.unwrap().unwrap();
    let report = drain.await.unwrap();
    assert!(
        matches!(report, DrainReport::Drained { ref released, .. } if released.len() == 1),
        "{report:?}"
    );
    assert_eq!(incr(&b, "c1").await.unwrap(), 2, "B claims at once");

    // Work that does not finish: the drain times out and keeps B's lease.
    let c = w.host("c").await;
    let (_never, _stuck) = spawn_call(&b, "c1", |_, _| futures::future::pending());
    spin().await;
    let drain = spawn_drain(&b);
    assert!(advance_until(&w.clock, 500, 8_000, || drain.is_finished()).await);
    let report = drain.await.unwrap();
    assert_eq!(report, DrainReport::TimedOut { in_flight: 1 });
    assert!(
        matches!(incr(&c, "c1").await.unwrap_err(), HostError::NotOwner { ref owner, .. } if owner == "b")
    );
    c.shutdown().await;
}

#[tokio::test]
async fn evictable_mode_closes_idle_objects_and_counts_the_next_call_cold() {
    let w = World::new();
    let a = w
        .host_with("a", OwnPolicy::OnDemand, Residency::Evictable)
        .await;
    assert_eq!(incr(&a, "c1").await.unwrap(), 1);
    assert_eq!(incr(&a, "c1").await.unwrap(), 2);
    assert_eq!(a.probe().dispatch.cold, 1);
    w.clock.advance(1_000);
    assert_eq!(a.owner_cycle().await.evicted, 0, "not idle long enough");
    w.clock.advance(1_500);
    assert_eq!(a.owner_cycle().await.evicted, 1);
    let probe = a.probe();
    assert_eq!((probe.open_objects, probe.dispatch.evicted), (0, 1));
    assert_eq!(
        probe.registry_entries, 0,
        "an evicted object leaves no entry"
    );
    assert_eq!(probe.scopes.len(), 1, "the scope stays owned");
    assert_eq!(incr(&a, "c1").await.unwrap(), 3, "state survives eviction");
    assert_eq!(incr(&a, "c1").await.unwrap(), 4);
    assert_eq!(
        a.probe().dispatch.cold,
        2,
        "only the first call after eviction is cold"
    );
    // The resident mode never evicts.
    let r = w
        .host_with("r", OwnPolicy::OnDemand, Residency::Resident)
        .await;
    incr(&r, "c2").await.unwrap();
    w.clock.advance(60_000);
    spin().await;
    r.owner_cycle().await;
    assert_eq!(r.probe().dispatch.evicted, 0);
    a.shutdown().await;
    r.shutdown().await;
}

#[tokio::test]
async fn resident_mode_keeps_at_most_its_bound_open_closing_the_least_recently_used() {
    let w = World::new();
    let mut s = settings();
    s.max_resident_objects = 3;
    let r = Host::start(w.config("r").own(OwnPolicy::OnDemand).settings(s))
        .await
        .unwrap();
    for i in 0..10 {
        assert_eq!(incr(&r, &format!("o{i}")).await.unwrap(), 1);
        w.clock.advance(10);
    }
    assert_eq!(
        r.probe().open_objects,
        10,
        "the bound holds per owner cycle"
    );
    // o7, o8, o9 were used last; they stay open, the other seven close.
    assert_eq!(r.owner_cycle().await.evicted, 7);
    let probe = r.probe();
    assert_eq!((probe.open_objects, probe.dispatch.evicted), (3, 7));
    let cold = probe.dispatch.cold;
    assert_eq!(
        incr(&r, "o9").await.unwrap(),
        2,
        "an open object stays warm"
    );
    assert_eq!(r.probe().dispatch.cold, cold);
    // A closed object reopens from storage with its state, counted cold.
    assert_eq!(incr(&r, "o0").await.unwrap(), 2);
    assert_eq!(r.probe().dispatch.cold, cold + 1);
    r.owner_cycle().await;
    assert!(r.probe().open_objects <= 3);
    r.shutdown().await;
}

#[tokio::test]
async fn the_owner_loop_renews_on_the_clock_and_drops_a_scope_whose_renew_fails() {
    let (w, a) = World::with_a().await;
    let mut events = a.subscribe();
    incr(&a, "c1").await.unwrap();
    let scope = a.scope_for("Counter", "c1").unwrap();
    // Far past one TTL, renewed all along by the loop.
    assert!(!advance_until(&w.clock, 1_000, 3 * i64::try_from(TTL).unwrap(), || false).await);
    assert_eq!(a.probe().scopes.len(), 1);
    assert_eq!(incr(&a, "c1").await.unwrap(), 2);
    // Another task takes the record over (an operator's move): the next
    // renew fails, the scope is dropped and its objects closed.
    use durability_ownership::LeaseStore;
    let store = w.store();
    let lifecycle = durability_ownership::LifecycleId::new("ns:app").unwrap();
    let snap = store.snapshot(&scope, &lifecycle).await.unwrap();
    store.release(&snap.owner.unwrap().record).await.unwrap();
    let report = a.owner_cycle().await;
    assert_eq!(report.lost, [scope.to_string()]);
    assert_eq!(a.probe().open_objects, 0);
    let mut lost = None;
    while let Ok(e) = events.try_recv() {
        if let OwnerEvent::Lost { code, .. } = e {
            lost = Some(code);
        }
    }
    assert_eq!(
        lost,
        Some(
            OwnershipError::StaleOwner {
                scope: String::new()
            }
            .code()
        )
    );
    // The next call claims again, at a higher generation.
    assert_eq!(incr(&a, "c1").await.unwrap(), 3);
    assert_eq!(fence_generation(&w, "c1"), 2);
    a.shutdown().await;
}

#[tokio::test]
async fn a_call_that_sets_the_alarm_returns_once_the_index_holds_its_job() {
    use durability_alarms::AlarmIndex;
    let (w, a) = World::with_a().await;
    let index = w.index();
    let at = durability_ownership::Clock::now_ms(&w.clock) + 60_000;
    a.transaction::<Counter, _, _>("Counter", "c1", |c, tx| c.set_timer(tx, at))
        .await
        .unwrap();
    // No yield in between: a crash right after the call must find the job.
    let id = durability_scheduler::ObjectId::new("st1:Counter:c1").unwrap();
    let job = index
        .job(&id)
        .await
        .unwrap()
        .expect("the alarm job is indexed");
    assert_eq!(job.due_at, at);
    a.shutdown().await;
}

#[tokio::test]
async fn an_alarm_of_inactive_storage_discards_itself() {
    use durability_ownership::{LifecycleAdmin, LifecycleId, StorageId};
    let (w, a) = World::with_a().await;
    let at = durability_ownership::Clock::now_ms(&w.clock) + 1_000;
    a.transaction::<Counter, _, _>("Counter", "c1", |c, tx| c.set_timer(tx, at))
        .await
        .unwrap();
    // The control plane moves the lifecycle to another storage id.
    w.store()
        .set_active_storage(
            &LifecycleId::new("ns:app").unwrap(),
            Some(&StorageId::new("st2").unwrap()),
        )
        .await
        .unwrap();
    assert!(
        advance_until(&w.clock, 200, 10_000, || a.probe().alarms.gone == 1).await,
        "{:?}",
        a.probe().alarms
    );
    assert!(
        w.fired().is_empty(),
        "the alarm of inactive storage never ran"
    );
    use durability_alarms::AlarmIndex;
    let id = durability_scheduler::ObjectId::new("st1:Counter:c1").unwrap();
    assert_eq!(
        w.index().job(&id).await.unwrap(),
        None,
        "the job discarded itself"
    );
    // New work on the inactive storage is refused before it starts.
    let refused = incr(&a, "c1").await.unwrap_err();
    assert!(
        matches!(
            refused,
            HostError::Ownership(OwnershipError::StorageInactive { .. })
        ),
        "{refused}"
    );
    a.shutdown().await;
}

#[tokio::test]
async fn the_owner_loop_claims_exactly_the_configured_shards() {
    let w = World::new();
    let a = w
        .host_with(
            "a",
            OwnPolicy::Shards(vec![("Counter".to_owned(), 3), ("Counter".to_owned(), 7)]),
            Residency::Resident,
        )
        .await;
    spin().await;
    let report = a.owner_cycle().await;
    let mut owned: Vec<String> = a.probe().scopes.into_iter().map(|s| s.scope).collect();
    owned.sort();
    assert_eq!(
        owned,
        ["st1:Counter:shard3", "st1:Counter:shard7"],
        "{report:?}"
    );
    a.shutdown().await;
}

#[tokio::test]
async fn a_renew_that_meets_a_busy_store_keeps_the_scope_and_its_objects() {
    let (_w, hooks, a) = hooked_a().await;
    let mut events = a.subscribe();
    incr_hooked(&a).await;
    let scope = a.scope_for("Counter", "c1").unwrap().to_string();
    // The lease store is busy for the renew (nothing written).
    busy(&hooks, &[Method::RenewMany, Method::Renew]);
    let report = a.owner_cycle().await;
    hooks.clear();
    assert_eq!(report.renewed, 0);
    assert!(report.lost.is_empty(), "{report:?}");
    let probe = a.probe();
    assert_eq!(probe.scopes.len(), 1, "re-adopted at the same generation");
    assert_eq!(
        (probe.scopes[0].scope.clone(), probe.scopes[0].generation),
        (scope, 1)
    );
    assert_eq!(probe.open_objects, 1, "its object stayed open");
    while let Ok(e) = events.try_recv() {
        assert!(!matches!(e, OwnerEvent::Lost { .. }), "{e:?}");
    }
    assert_eq!(a.owner_cycle().await.renewed, 1);
    assert_eq!(incr_hooked(&a).await, 2);
    assert_eq!(a.probe().dispatch.cold, 1, "never reopened");
    a.shutdown().await;
}

#[tokio::test]
async fn a_scope_whose_renew_and_readoption_meet_a_busy_store_is_kept_until_the_store_answers() {
    let (_w, hooks, a) = hooked_a().await;
    incr_hooked(&a).await;
    // Renew and the re-adopting claim both meet a busy store.
    busy(&hooks, &[Method::RenewMany, Method::Renew, Method::Claim]);
    let report = a.owner_cycle().await;
    assert!(report.lost.is_empty(), "{report:?}");
    assert_eq!(a.probe().open_objects, 1);
    hooks.clear();
    let report = a.owner_cycle().await;
    assert!(report.lost.is_empty(), "{report:?}");
    assert_eq!(
        a.probe().scopes.len(),
        1,
        "re-adopted once the store answered"
    );
    assert_eq!(incr_hooked(&a).await, 2);
    assert_eq!(a.probe().dispatch.cold, 1);
    a.shutdown().await;
}

/// The hooked lease store answers `methods` busy (`owner_race`, nothing
/// written), and every other method as usual.
fn busy(hooks: &Hooks, methods: &'static [Method]) {
    hooks.set(move |method, _| {
        if methods.contains(&method) {
            Action::Fail(OwnershipError::OwnerRace {
                scope: String::new(),
            })
        } else {
            Action::Pass
        }
    });
}

type HookedHost = Host<HookedStore<Store>, SqliteAlarmIndex>;

/// A new world with host `a` on a hooked lease store, and the hooks.
async fn hooked_a() -> (World, Hooks, HookedHost) {
    let w = World::new();
    let hooks = Hooks::new();
    let a = w.hooked("a", &hooks).await;
    (w, hooks, a)
}

/// Counts `c1` up on the hooked host `a`.
async fn incr_hooked(a: &HookedHost) -> i64 {
    a.transaction::<Counter, _, _>("Counter", "c1", |c, tx| c.incr(tx))
        .await
        .unwrap()
}

#[tokio::test]
async fn the_first_subscriber_sees_every_owner_change_since_start() {
    // The owner loop starts claiming inside `Host::start`: a subscriber that
    // arrives after the first claims (a user's `main` subscribing right
    // after start) still sees each one.
    let w = World::new();
    let a = w.all_shards("a").await;
    spin().await;
    assert_eq!(a.probe().scopes.len(), 16, "the owner loop claimed first");
    let mut events = a.subscribe();
    let mut acquired = 0;
    while let Ok(e) = events.try_recv() {
        assert!(
            matches!(e, OwnerEvent::Acquired { generation: 1, .. }),
            "{e:?}"
        );
        acquired += 1;
    }
    assert_eq!(acquired, 16);
    // A later subscriber starts at its own subscription.
    let mut later = a.subscribe();
    assert!(later.try_recv().is_err());
}

/// An application's own error type wrapping a storage error.
#[derive(Debug)]
struct AppError(durability_scheduler::StorageError);

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "placing the order failed")
    }
}

impl std::error::Error for AppError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[tokio::test]
async fn a_fence_refusal_wrapped_in_the_applications_error_is_still_fenced() {
    use durability_scheduler::StorageError;
    let (_w, a) = World::with_a().await;
    // Before: only a bare `StorageError` was recognised; wrapped in the
    // application's own error it became an opaque handler failure.
    let wrapped = a
        .call::<Counter, (), _, _>("Counter", "c1", |_| async move {
            Err(AppError(StorageError::new(StorageErrorKind::Fenced, "a newer claim")).into())
        })
        .await
        .unwrap_err();
    assert!(matches!(wrapped, HostError::Fenced(_)), "{wrapped:?}");
    assert_eq!(wrapped.code(), "host_fenced");
    // A bare one, as before.
    let bare = a
        .call::<Counter, (), _, _>("Counter", "c1", |_| async move {
            Err(StorageError::new(StorageErrorKind::Fenced, "a newer claim").into())
        })
        .await
        .unwrap_err();
    assert!(matches!(bare, HostError::Fenced(_)), "{bare:?}");
    // Another storage failure wrapped by the application stays the
    // handler's own error, its chain kept.
    let other = a
        .call::<Counter, (), _, _>("Counter", "c1", |_| async move {
            Err(AppError(StorageError::new(StorageErrorKind::Backend, "disk full")).into())
        })
        .await
        .unwrap_err();
    match other {
        HostError::Handler(e) => {
            assert_eq!(e.to_string(), "placing the order failed");
            assert!(
                e.source()
                    .is_some_and(|s| s.to_string().contains("disk full"))
            );
        }
        e => panic!("{e:?}"),
    }
    a.shutdown().await;
}
