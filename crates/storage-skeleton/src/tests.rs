//! Every stub, called behind its trait, returns the trait's typed
//! "unavailable" error with an [`Unsupported`] source, and never panics.

use std::error::Error as StdError;

use durability_alarms::{AlarmIndex, AlarmTx};
use durability_migration::{AllocationLedger, MappingStore, Shard, Statement};
use durability_outbox::OutboxTx;
use durability_ownership::{LeaseStore, LifecycleAdmin, LifecycleId, OwnerScope, ShardCount};
use durability_scheduler::{SchedulerTx, Storage, StorageError, StorageErrorKind};
use durability_topology::{Publisher, SnapshotDeletion, TopologyTx};
use durability_topology_client::ReadStore;

use crate::alarms::SkeletonAlarmIndex;
use crate::migration::{SkeletonLedger, SkeletonMappingStore, SkeletonShard};
use crate::ownership::SkeletonLeaseStore;
use crate::topology::SkeletonPublication;
use crate::{SkeletonStorage, SkeletonTx, Unsupported};

/// The operation named by the [`Unsupported`] source of `e`.
fn operation(e: &(dyn StdError + 'static)) -> &'static str {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(u) = e.downcast_ref::<Unsupported>() {
            return u.operation;
        }
        cur = e.source();
    }
    panic!("no Unsupported source in {e}");
}

fn assert_storage_stub(e: &StorageError, op: &str) {
    assert_eq!(e.kind(), StorageErrorKind::Backend, "{op}");
    assert_eq!(operation(e), op);
}

fn assert_storage<S: Storage>(s: &S) {
    let e = s
        .transaction(|_tx| Ok::<_, StorageError>(()))
        .expect_err("no transaction begins");
    assert_storage_stub(&e, "transaction");
    assert!(s.schema("outbox").is_empty());
}

fn assert_scheduler_tx<T: SchedulerTx>(tx: &mut T) {
    assert_storage_stub(&tx.alarm().expect_err("stub"), "alarm");
    assert_storage_stub(
        &tx.set_capability_due("c", Some(1)).expect_err("stub"),
        "set_capability_due",
    );
}

fn assert_outbox_tx<T: OutboxTx>(tx: &mut T) {
    assert_storage_stub(&tx.outbox_get("c", "k").expect_err("stub"), "outbox_get");
}

fn assert_topology_tx<T: TopologyTx>(tx: &mut T) {
    assert_storage_stub(&tx.topology_group("g").expect_err("stub"), "topology_group");
}

fn assert_alarm_tx<T: AlarmTx>(tx: &mut T) {
    assert_storage_stub(&tx.alarm_row().expect_err("stub"), "alarm_row");
}

async fn assert_publisher<P: Publisher>(p: &P) {
    let deletion = SnapshotDeletion {
        group: "g",
        version: 1,
        coordinator: "c",
    };
    let e = p.delete(deletion).await.expect_err("stub");
    assert!(e.is_rejected(), "a stub refuses: nothing can land later");
    assert_eq!(operation(e.source()), "publisher delete");
}

async fn assert_read_store<R: ReadStore>(r: &R) {
    let e = r.read("g").await.expect_err("stub");
    assert_eq!(operation(&*e), "read");
}

async fn assert_alarm_index<I: AlarmIndex>(ix: &I) {
    let e = ix.next_due().await.expect_err("stub");
    assert_eq!(e.code(), "do_alarm_backend_unavailable");
    assert_eq!(operation(&e), "next_due");
}

async fn assert_lease_store<L: LeaseStore + LifecycleAdmin>(store: &L) {
    let lifecycle = LifecycleId::new("life").expect("valid lifecycle id");
    let scope = OwnerScope::parse(
        "storage:Counter:shard0",
        ShardCount::new(16).expect("valid count"),
    )
    .expect("valid scope");
    let e = store.snapshot(&scope, &lifecycle).await.expect_err("stub");
    assert_eq!(e.code(), "owner_store_unavailable");
    assert_eq!(operation(&e), "snapshot");
    let e = store
        .set_delete_lock(&lifecycle, None)
        .await
        .expect_err("stub");
    assert_eq!(e.code(), "owner_store_unavailable");
    let floor = durability_ownership::Generation::new(3).expect("valid generation");
    let e = store
        .raise_generation_floor(&scope, floor)
        .await
        .expect_err("stub");
    assert_eq!(operation(&e), "raise_generation_floor");
}

fn assert_object_fence<F: durability_ownership::ObjectFence>(f: &F) {
    let record = durability_ownership::OwnerRecord::new(
        OwnerScope::parse(
            "storage:Counter:shard0",
            ShardCount::new(16).expect("valid count"),
        )
        .expect("valid scope"),
        LifecycleId::new("life").expect("valid lifecycle id"),
        durability_ownership::TaskId::new("task-1").expect("valid task id"),
        durability_ownership::Generation::new(1).expect("valid generation"),
    );
    let e = f.fence_claim(&record, None).expect_err("stub");
    assert_eq!(e.code(), "owner_store_unavailable");
    assert_eq!(operation(&e), "fence_claim");
}

async fn assert_shard<S: Shard>(s: &S) {
    assert!(!s.dialect().is_proven(), "moves refuse the stub shard");
    let e = s
        .execute(&Statement::new("SELECT 1"))
        .await
        .expect_err("stub");
    assert_eq!(operation(&*e), "execute");
}

async fn assert_mapping_store<M: MappingStore>(m: &M) {
    let e = m.get("k").await.expect_err("stub");
    assert_eq!(operation(&*e), "mapping get");
}

async fn assert_ledger<L: AllocationLedger>(l: &L) {
    let e = l.scan(None, 10).await.expect_err("stub");
    assert_eq!(operation(&*e), "ledger scan");
}

#[tokio::test]
async fn every_stub_returns_its_traits_unavailable_error() {
    assert_storage(&SkeletonStorage::new());
    let mut tx = SkeletonTx::for_tests();
    assert_scheduler_tx(&mut tx);
    assert_outbox_tx(&mut tx);
    assert_topology_tx(&mut tx);
    assert_alarm_tx(&mut tx);
    assert_publisher(&SkeletonPublication::new()).await;
    assert_read_store(&SkeletonPublication::new()).await;
    assert_alarm_index(&SkeletonAlarmIndex::new()).await;
    assert_lease_store(&SkeletonLeaseStore::new()).await;
    assert_object_fence(&SkeletonStorage::new());
    assert_shard(&SkeletonShard::new()).await;
    assert_mapping_store(&SkeletonMappingStore::new()).await;
    assert_ledger(&SkeletonLedger::new()).await;
}
