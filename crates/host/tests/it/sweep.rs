//! The takeover sweep (`host/sweep.rs`), in process on a standing clock: an
//! object whose alarm was committed but never synced to the index (what a
//! host killed between a call's commit and its sync leaves) gets its index
//! job from the host that takes its scope over, with no call to it; the
//! sweep leaves it closed, and a sweep the lease store interrupted runs
//! again one owner-loop period later. The process tests
//! (`tests/it/host_processes.rs`) kill a real host.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use durability_alarms::AlarmIndex as _;
use durability_host::OwnPolicy;
use durability_ownership::conformance::{Action, Hooks, Method};
use durability_ownership::{Clock as _, OwnershipError};
use durability_scheduler::{ObjectContext, ObjectId, Scheduler};
use durability_storage_sqlite::{SqliteOptions, SqliteStorage};

use crate::support::{STORAGE, World, advance_until, incr, spin};

/// Commits `name`'s timer at `at` in its file, as a call's transaction
/// does, without the alarm row and index job its host writes after the
/// commit.
fn commit_timer_without_sync(w: &World, name: &str, at: i64) {
    let path = w
        .root()
        .join(STORAGE)
        .join("Counter")
        .join(format!("{name}.sqlite"));
    let storage = SqliteStorage::open(path, SqliteOptions::default()).unwrap();
    let scheduler = Scheduler::new(ObjectContext::new(id(name), Arc::new(storage))).unwrap();
    scheduler
        .transaction(|tx| tx.set_due("timer", Some(at)))
        .unwrap();
}

fn id(name: &str) -> ObjectId {
    ObjectId::new(format!("{STORAGE}:Counter:{name}")).unwrap()
}

/// `u1` stored by host `a` (drained), then its timer committed `in_ms`
/// from now with no index job; returns when it is due.
async fn unsynced_after_a(w: &World, in_ms: i64) -> i64 {
    let a = w.all_shards("a").await;
    assert_eq!(incr(&a, "u1").await.unwrap(), 1);
    a.shutdown().await;
    let at = w.clock.now_ms() + in_ms;
    commit_timer_without_sync(w, "u1", at);
    assert!(w.index().job(&id("u1")).await.unwrap().is_none());
    at
}

/// Lets the hosts run, the clock moving in 100 ms steps, until the index
/// holds `u1`'s job at `at` (at most `max_ms`); whether it did.
async fn job_appears(w: &World, at: i64, max_ms: i64) -> bool {
    let index = w.index();
    let mut moved = 0;
    loop {
        spin().await;
        if index
            .job(&id("u1"))
            .await
            .unwrap()
            .is_some_and(|j| j.due_at == at)
        {
            return true;
        }
        if moved >= max_ms {
            return false;
        }
        w.clock.advance(100);
        moved += 100;
    }
}

#[tokio::test]
async fn the_new_owner_schedules_a_committed_but_unsynced_alarm_and_leaves_the_object_closed() {
    let w = World::new();
    let at = unsynced_after_a(&w, 60_000).await;
    let b = w.all_shards("b").await;
    assert!(job_appears(&w, at, 1_000).await, "the sweep wrote the job");
    let probe = b.probe();
    let scope = b.scope_for("Counter", "u1").unwrap().to_string();
    assert!(
        probe
            .scopes
            .iter()
            .any(|s| s.scope == scope && s.generation == 2),
        "{probe:?}"
    );
    assert_eq!(probe.open_objects, 0, "the swept object was closed again");
    assert_eq!(probe.dispatch.cold, 0, "no call opened it");
    // The alarm then fires on b, once.
    w.clock.advance(60_000);
    assert!(w.fires("b u1").await, "{:?}", w.fired());
    assert_eq!(w.fired(), ["b u1"]);
    b.shutdown().await;
}

#[tokio::test]
async fn a_sweep_the_lease_store_interrupted_runs_again_one_owner_loop_period_later() {
    let w = World::new();
    let at = unsynced_after_a(&w, 60_000).await;
    // Every owner snapshot fails while `down` holds (from just after the
    // start): the claim goes on without its read, the sweep's admission
    // cannot check the owner.
    let down = Arc::new(AtomicBool::new(false));
    let hooks = Hooks::new();
    let failing = Arc::clone(&down);
    hooks.set(move |method, _| {
        if method == Method::Snapshot && failing.load(Ordering::SeqCst) {
            Action::Fail(OwnershipError::OwnerUnavailable {
                source: "the test's lease store is down".into(),
            })
        } else {
            Action::Pass
        }
    });
    let b = w.hooked_owning("b", &hooks, OwnPolicy::AllShards).await;
    down.store(true, Ordering::SeqCst);
    assert!(
        advance_until(&w.clock, 100, 1_000, || b.probe().scopes.len() == 16).await,
        "b claimed every shard"
    );
    assert!(
        !job_appears(&w, at, 1_000).await,
        "not while the store is down"
    );
    down.store(false, Ordering::SeqCst);
    // The retry comes one owner-loop period (3 s here) after the failure.
    assert!(
        job_appears(&w, at, 4_000).await,
        "the retried sweep wrote it"
    );
    assert_eq!(b.probe().open_objects, 0);
    b.shutdown().await;
}
