//! The generation floor procedure end to end on the SQLite object storage:
//! a lease store that lost its counters (wiped) hands out generations the
//! object's fence already accepted; `fence_with_floor` raises the store's
//! floor from the fence and claims again, so no generation is committed by
//! two holders. And the lease budget a fence is given is checked right
//! before every commit.
#![cfg(all(feature = "scheduler", feature = "ownership"))]
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use durability_ownership::memory::InMemoryLeaseStore;
use durability_ownership::{
    ClaimOutcome, ClassName, Clock, FloorSettings, Lease, LeaseStore, LifecycleAdmin, LifecycleId,
    ManualClock, ObjectFence, OwnerScope, ShardCount, StorageId, TaskId, fence_with_floor,
};
use durability_scheduler::{SchedulerTx, Storage, StorageErrorKind};
use durability_storage_sqlite::ownership::fenced_claim;
use durability_storage_sqlite::{SqliteOptions, SqliteStorage};

const TTL: u64 = 1000;

fn scope() -> OwnerScope {
    OwnerScope::new(
        StorageId::new("st1").unwrap(),
        ClassName::new("Shop").unwrap(),
        3,
        ShardCount::default(),
    )
    .unwrap()
}

fn lifecycle() -> LifecycleId {
    LifecycleId::new("ns:shop").unwrap()
}

async fn store(clock: &ManualClock) -> InMemoryLeaseStore<ManualClock> {
    let s = InMemoryLeaseStore::new(clock.clone(), ShardCount::default());
    s.set_active_storage(&lifecycle(), Some(&StorageId::new("st1").unwrap()))
        .await
        .unwrap();
    s
}

/// A temporary directory, its object database's path, a manual clock and
/// a lease store on it (storage `st1` active).
async fn world() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    ManualClock,
    InMemoryLeaseStore<ManualClock>,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("object.db");
    let clock = ManualClock::new(1_000_000);
    let leases = store(&clock).await;
    (dir, path, clock, leases)
}

async fn claim(store: &InMemoryLeaseStore<ManualClock>, task: &str) -> Lease {
    match store
        .claim(&scope(), &lifecycle(), &TaskId::new(task).unwrap(), TTL)
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed(l) => l,
        ClaimOutcome::Held(l) => panic!("held by {:?}", l.record.task()),
    }
}

fn settings(clock: &ManualClock) -> FloorSettings {
    FloorSettings {
        clock: Arc::new(clock.clone()),
        ttl_ms: TTL,
        guard_ms: 100,
    }
}

fn set(s: &SqliteStorage, v: i64) -> Result<(), durability_scheduler::StorageError> {
    s.transaction(|tx| tx.set_alarm(Some(v)))
}

#[tokio::test]
async fn a_wiped_lease_store_is_raised_above_the_fence_before_anything_is_dispatched() {
    let (_dir, path, clock, leases) = world().await;
    let cfg = settings(&clock);

    // Host A claims generation 1 and fences the object through the floor.
    let a = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    let la = claim(&leases, "task-a").await;
    let fa = fence_with_floor(&leases, &a, &cfg, la, clock.now_ms())
        .await
        .unwrap();
    assert_eq!(fa.lease.record.generation().get(), 1);
    set(&a, 1).unwrap();

    // The lease store loses everything (FLUSHALL); A is paused meanwhile.
    leases.wipe();
    let b = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    let lb = claim(&leases, "task-b").await;
    assert_eq!(
        lb.record.generation().get(),
        1,
        "the wiped store reissues 1"
    );
    // The bare fence refuses the equal generation of another claim ...
    let e = b.fence_claim(&lb.record, None).unwrap_err();
    assert_eq!(e.code(), "stale_generation", "{e}");
    // ... and the floor procedure claims again above the fence.
    let fb = fence_with_floor(&leases, &b, &cfg, lb.clone(), clock.now_ms())
        .await
        .unwrap();
    assert_eq!(fb.lease.record.generation().get(), 2);
    assert_eq!(fb.lease.record.task().as_str(), "task-b");
    assert_ne!(fb.lease.record, lb.record);
    let (owner, counter) = leases.raw_state(&scope());
    assert_eq!(counter, Some(2));
    assert_eq!(
        owner.as_deref(),
        Some(fb.lease.record.encoded().as_bytes()),
        "the claim at generation 1 was given up, exactly"
    );
    set(&b, 2).unwrap();

    // A resumes: its late commit is refused, nothing it wrote lands.
    let e = set(&a, 99).unwrap_err();
    assert_eq!(e.kind(), StorageErrorKind::Fenced, "{e}");
    assert_eq!(b.transaction(|tx| tx.alarm()).unwrap(), Some(2));

    // Wiped again, and far behind: one round lands above the fence.
    leases.wipe();
    let a2 = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    let la = claim(&leases, "task-a").await;
    let fa = fence_with_floor(&leases, &a2, &cfg, la, clock.now_ms())
        .await
        .unwrap();
    assert_eq!(fa.lease.record.generation().get(), 3);
    set(&a2, 3).unwrap();
    assert_eq!(set(&b, 98).unwrap_err().kind(), StorageErrorKind::Fenced);
    let stored = a2
        .transaction(|tx| {
            Ok::<_, durability_scheduler::StorageError>(fenced_claim(tx.sql(), &scope()))
        })
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(stored.generation, 3);
    assert_eq!(
        stored.holder.as_deref(),
        Some(fa.lease.record.encoded().as_bytes())
    );
}

#[tokio::test]
async fn reopening_with_the_same_claim_is_accepted() {
    let (_dir, path, _clock, leases) = world().await;
    let a = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    let la = claim(&leases, "task-a").await;
    a.fence(&la.record).unwrap();
    drop(a);
    // The same claim reopens the object (after an eviction): same holder.
    let a = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    a.fence(&la.record).unwrap();
    set(&a, 1).unwrap();
}

#[tokio::test]
async fn a_spent_lease_budget_rolls_the_commit_back() {
    let (_dir, path, clock, leases) = world().await;
    let a = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    let la = claim(&leases, "task-a").await;
    let fa = fence_with_floor(&leases, &a, &settings(&clock), la, clock.now_ms())
        .await
        .unwrap();
    set(&a, 1).unwrap();
    assert_eq!(fa.budget.remaining_ms(), TTL - 100);
    // The holder stalls inside its transaction past its lease (minus the guard).
    let e = a
        .transaction(|tx| {
            tx.set_alarm(Some(2))?;
            clock.advance(901);
            Ok::<_, durability_scheduler::StorageError>(())
        })
        .unwrap_err();
    assert_eq!(e.kind(), StorageErrorKind::Fenced, "{e}");
    assert!(e.to_string().contains("stale owner"), "{e}");
    assert_eq!(
        a.transaction(|tx| tx.alarm()).unwrap_err().kind(),
        StorageErrorKind::Fenced
    );
    let fresh = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    assert_eq!(
        fresh.transaction(|tx| tx.alarm()).unwrap(),
        Some(1),
        "rolled back"
    );
    // A renew moves the budget; commits go through again.
    let renewed = leases.renew(&fa.lease.record, TTL).await.unwrap();
    fa.budget.renewed(clock.now_ms(), &renewed);
    set(&a, 3).unwrap();
    assert_eq!(fresh.transaction(|tx| tx.alarm()).unwrap(), Some(3));
}

#[tokio::test]
async fn the_owner_opens_an_object_through_the_floor_and_admits_at_the_new_generation() {
    use durability_ownership::{Ownership, OwnershipSettings, Resolution};
    let (_dir, path, clock, leases) = world().await;
    let leases = Arc::new(leases);
    let settings = OwnershipSettings {
        owner_ttl_ms: TTL,
        lease_guard_ms: 100,
        ..OwnershipSettings::default()
    };
    let owner = |t: &str| {
        Ownership::new(
            Arc::clone(&leases),
            clock.clone(),
            TaskId::new(t).unwrap(),
            settings,
        )
    };
    let (host_a, host_b) = (owner("task-a"), owner("task-b"));
    let a = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    let fa = host_a
        .open_fenced(&scope(), &lifecycle(), &a, Arc::new(clock.clone()))
        .await
        .unwrap();
    assert_eq!(fa.lease.record.generation().get(), 1);
    set(&a, 1).unwrap();

    // The lease store is wiped; host A is paused; host B opens the object.
    leases.wipe();
    host_a.forget(&scope());
    let b = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    let fb = host_b
        .open_fenced(&scope(), &lifecycle(), &b, Arc::new(clock.clone()))
        .await
        .unwrap();
    assert_eq!(fb.lease.record.generation().get(), 2, "above the fence");
    match host_b.resolve(&scope(), &lifecycle()).await.unwrap() {
        Resolution::Local(g) => assert_eq!(g.get(), 2, "the manager uses the new claim"),
        other => panic!("{other:?}"),
    }
    let permit = host_b
        .admit(&scope(), fb.lease.record.generation())
        .await
        .unwrap();
    set(&b, 2).unwrap();
    drop(permit);
    assert_eq!(set(&a, 99).unwrap_err().kind(), StorageErrorKind::Fenced);
    // Another task cannot open it while B owns it.
    let e = host_a
        .open_fenced(&scope(), &lifecycle(), &a, Arc::new(clock.clone()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "stale_owner");
    assert_eq!(b.transaction(|tx| tx.alarm()).unwrap(), Some(2));
}

#[test]
fn a_fence_written_before_holders_were_recorded_gains_the_column_and_matches_no_claim() {
    use durability_ownership::{Generation, OwnerRecord};
    use durability_storage_sqlite::ownership::{
        check_generation, ensure_fence_schema, record_generation,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut c = rusqlite::Connection::open(dir.path().join("old.db")).unwrap();
    c.execute_batch(
        "CREATE TABLE durability_owner_fence (scope TEXT PRIMARY KEY NOT NULL,
         generation INTEGER NOT NULL CHECK (generation > 0)) STRICT;",
    )
    .unwrap();
    c.execute(
        "INSERT INTO durability_owner_fence (scope, generation) VALUES (?1, 3)",
        [scope().host_id()],
    )
    .unwrap();
    ensure_fence_schema(&c).unwrap();
    ensure_fence_schema(&c).unwrap();
    let rec = |g: u64| {
        OwnerRecord::new(
            scope(),
            lifecycle(),
            TaskId::new("task-a").unwrap(),
            Generation::new(g).unwrap(),
        )
    };
    let tx = c.transaction().unwrap();
    assert_eq!(
        check_generation(&tx, &rec(3)).unwrap_err().code(),
        "stale_generation"
    );
    assert_eq!(
        record_generation(&tx, &rec(3)).unwrap_err().code(),
        "stale_generation",
        "no claim matches the holder-less row at its generation"
    );
    record_generation(&tx, &rec(4)).unwrap();
    check_generation(&tx, &rec(4)).unwrap();
    tx.commit().unwrap();
}
