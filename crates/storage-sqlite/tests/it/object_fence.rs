//! The owner fence wired into the object storage: once fenced, every
//! transaction checks the generation, and a stale owner's commit is refused
//! by the storage with nothing written.
#![cfg(all(feature = "scheduler", feature = "ownership"))]
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use durability_ownership::{
    ClassName, Generation, LifecycleId, OwnerRecord, OwnerScope, ShardCount, StorageId, TaskId,
};
use durability_scheduler::{SchedulerTx, Storage, StorageError, StorageErrorKind};
use durability_storage_sqlite::{SqliteOptions, SqliteStorage};

fn scope() -> OwnerScope {
    OwnerScope::new(
        StorageId::new("store-1").unwrap(),
        ClassName::new("Shop").unwrap(),
        3,
        ShardCount::new(16).unwrap(),
    )
    .unwrap()
}

fn claim(task: &str, g: u64) -> OwnerRecord {
    OwnerRecord::new(
        scope(),
        LifecycleId::new("ns:shop").unwrap(),
        TaskId::new(task).unwrap(),
        Generation::new(g).unwrap(),
    )
}

/// A path for an object database in a directory of its own (removed when
/// the returned directory is dropped).
fn object_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("object.db");
    (dir, path)
}

/// The object database at `path`, opened and fenced by `task`'s claim at
/// generation `g` (a host that took the scope).
fn open_fenced(path: &Path, task: &str, g: u64) -> SqliteStorage {
    let s = SqliteStorage::open(path, SqliteOptions::default()).unwrap();
    s.fence(&claim(task, g)).unwrap();
    s
}

#[test]
fn a_stale_owner_commit_is_refused_by_the_object_database() {
    let (_dir, path) = object_db();
    // Host A owns the scope at generation 1 and fences the object database.
    let a = open_fenced(&path, "a", 1);
    a.transaction(|tx| tx.set_alarm(Some(10))).unwrap();

    // Host A pauses past its lease; host B claims generation 2 and fences.
    let b = open_fenced(&path, "b", 2);
    b.transaction(|tx| tx.set_alarm(Some(20))).unwrap();

    // Host A resumes: its late commit is refused, and nothing it wrote lands.
    let err = a.transaction(|tx| tx.set_alarm(Some(99))).unwrap_err();
    assert_eq!(err.kind(), StorageErrorKind::Fenced, "{err}");
    let stored = b.transaction(|tx| tx.alarm()).unwrap();
    assert_eq!(stored, Some(20), "the stale write did not land");

    // A cannot fence itself back to an older generation either.
    let err = a.fence(&claim("a", 1)).unwrap_err();
    assert_eq!(err.kind(), StorageErrorKind::Fenced);
    assert_eq!(b.transaction(|tx| tx.alarm()).unwrap(), Some(20));
}

#[test]
fn an_unfenced_storage_does_not_check() {
    let s = SqliteStorage::open_in_memory().unwrap();
    let r: Result<(), StorageError> = s.transaction(|tx| tx.set_alarm(Some(1)));
    assert!(r.is_ok());
}

/// Issue 32, item 1: a host with another shard count owns the same object
/// under another shard of the same storage id and class. The object's fence
/// refuses that claim, and the other host's commit never lands.
#[test]
fn an_object_fenced_under_one_shard_refuses_a_claim_under_another() {
    let (_dir, path) = object_db();
    let a = open_fenced(&path, "a", 1);
    a.transaction(|tx| tx.set_alarm(Some(10))).unwrap();

    // The same object, as a host with 8 shards places it (shard 5 of 8).
    let eight = OwnerScope::new(
        StorageId::new("store-1").unwrap(),
        ClassName::new("Shop").unwrap(),
        5,
        ShardCount::new(8).unwrap(),
    )
    .unwrap();
    let other = OwnerRecord::new(
        eight.clone(),
        LifecycleId::new("ns:shop").unwrap(),
        TaskId::new("b").unwrap(),
        Generation::new(7).unwrap(),
    );
    let b = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    let err = durability_ownership::ObjectFence::fence_claim(&b, &other, None).unwrap_err();
    match &err {
        durability_ownership::OwnershipError::ObjectScopeMismatch {
            recorded,
            attempted,
        } => {
            assert_eq!(recorded, scope().host_id());
            assert_eq!(attempted, eight.host_id());
        }
        e => panic!("expected object_scope_mismatch, got {e:?}"),
    }
    let err = b.fence(&other).unwrap_err();
    assert_eq!(err.kind(), StorageErrorKind::Fenced, "{err}");
    // Nothing of b's claim was recorded: a's claim still holds the fence.
    a.transaction(|tx| tx.set_alarm(Some(11))).unwrap();
    assert_eq!(a.transaction(|tx| tx.alarm()).unwrap(), Some(11));
}
