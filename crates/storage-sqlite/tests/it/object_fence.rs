//! The owner fence wired into the object storage: once fenced, every
//! transaction checks the generation, and a stale owner's commit is refused
//! by the storage with nothing written.
#![cfg(all(feature = "scheduler", feature = "ownership"))]
#![allow(clippy::unwrap_used)]

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

#[test]
fn a_stale_owner_commit_is_refused_by_the_object_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("object.db");
    // Host A owns the scope at generation 1 and fences the object database.
    let a = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    a.fence(&claim("a", 1)).unwrap();
    a.transaction(|tx| tx.set_alarm(Some(10))).unwrap();

    // Host A pauses past its lease; host B claims generation 2 and fences.
    let b = SqliteStorage::open(&path, SqliteOptions::default()).unwrap();
    b.fence(&claim("b", 2)).unwrap();
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
