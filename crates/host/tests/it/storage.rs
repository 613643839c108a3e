//! Storage lifecycle: one object's delete-all (paged, fenced, alarm
//! cancelled or kept) and the deletion of a whole storage id (objects,
//! alarm jobs, pointer, tombstone), including a run that finishes what an
//! interrupted one left.

use std::path::{Path, PathBuf};

use durability_alarms::{AlarmIndex, Token};
use durability_host::{
    DeleteAll, Host, HostError, SqliteObjectStore, TOMBSTONE_FILE, delete_storage_id,
};
use durability_ownership::{
    ClassName, DeleteLock, LeaseStore, LifecycleAdmin, LifecycleId, OwnerScope, OwnershipError,
    ShardCount, StorageId,
};
use durability_scheduler::{ObjectId, StorageError};

use crate::support::{Counter, LIFECYCLE, STORAGE, TTL, World, advance_until, incr, spin};

fn object_file(w: &World, storage: &str, name: &str) -> PathBuf {
    w.root()
        .join(storage)
        .join("Counter")
        .join(format!("{name}.sqlite"))
}

/// The names in the object file's schema (tables, views, triggers, indexes).
fn schema_names(path: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut st = conn
        .prepare("SELECT name FROM sqlite_schema ORDER BY name")
        .unwrap();
    st.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn sql(e: rusqlite::Error) -> StorageError {
    StorageError::backend("test sql", e)
}

fn id(s: &str) -> ObjectId {
    ObjectId::new(s).unwrap()
}

fn lifecycle() -> LifecycleId {
    LifecycleId::new(LIFECYCLE).unwrap()
}

fn probe_scope(storage: &str) -> OwnerScope {
    OwnerScope::new(
        StorageId::new(storage).unwrap(),
        ClassName::new("Counter").unwrap(),
        0,
        ShardCount::default(),
    )
    .unwrap()
}

#[tokio::test]
async fn delete_all_drops_the_objects_own_tables_in_fenced_pages_and_cancels_its_timer() {
    let w = World::new();
    let a = w.host("a").await;
    assert_eq!(incr(&a, "c1").await.unwrap(), 1);
    let now = durability_ownership::Clock::now_ms(&w.clock);
    // 300 more tables, a view, a trigger and an index of the object's own,
    // its timer, and an outbox-named due time (committed deliveries stay).
    a.transaction::<Counter, _, _>("Counter", "c1", |c, tx| {
        for i in 0..300 {
            tx.sql()
                .execute_batch(&format!("CREATE TABLE \"t {i}\" (x)"))
                .map_err(sql)?;
        }
        tx.sql()
            .execute_batch(
                "CREATE VIEW v AS SELECT n FROM counter;
                 CREATE VIRTUAL TABLE docs USING fts5(body);
                 CREATE INDEX counter_n ON counter (n);
                 CREATE TRIGGER on_fire AFTER INSERT ON fired BEGIN SELECT 1; END;",
            )
            .map_err(sql)?;
        c.set_timer(tx, now + 1_000)?;
        tx.set_due("outbox:events", Some(now + 500_000))
    })
    .await
    .unwrap();
    let job = w.index().job(&id("st1:Counter:c1")).await.unwrap().unwrap();
    assert_eq!(job.due_at, now + 1_000);

    let report = a
        .delete_all("Counter", "c1", DeleteAll::default())
        .await
        .unwrap();
    eprintln!(
        "delete-all: {} dropped in {} pages, due cleared {:?}",
        report.dropped.len(),
        report.pages,
        report.cancelled_due
    );
    // 300 + counter + fired + the view + the virtual table (its shadow
    // tables, the trigger and the index went with their tables): 304, in
    // three pages of at most 128 listed names.
    assert_eq!(report.dropped.len(), 304, "{:?}", report.dropped);
    assert_eq!(
        report.dropped[..2],
        ["v", "docs"],
        "views, then virtual tables"
    );
    assert_eq!(report.pages, 3);
    assert_eq!(report.cancelled_due, ["timer"]);
    let left = schema_names(&object_file(&w, STORAGE, "c1"));
    assert!(
        left.iter()
            .all(|n| n.starts_with("durability_") || n.starts_with("sqlite_autoindex_durability_")),
        "only the capabilities' tables stay: {left:?}"
    );
    assert!(left.contains(&"durability_owner_fence".to_owned()));
    // The alarm moved to the outbox's due time; the timer never fires.
    let job = w.index().job(&id("st1:Counter:c1")).await.unwrap().unwrap();
    assert_eq!(job.due_at, now + 500_000, "the alarm follows the outbox");
    advance_until(&w.clock, 500, 5_000, || false).await;
    assert!(w.fired().is_empty(), "the cancelled timer never ran");
    // The object reopens on the emptied storage: its factory recreates it.
    assert_eq!(a.probe().open_objects, 0, "the object was closed");
    assert_eq!(incr(&a, "c1").await.unwrap(), 1, "a fresh counter");
    // Running it again is a no-op delete of the recreated tables.
    let again = a
        .delete_all("Counter", "c1", DeleteAll::default())
        .await
        .unwrap();
    assert_eq!(again.pages, 1);
    assert_eq!(again.dropped, ["counter", "fired"]);
    assert!(again.cancelled_due.is_empty());
    a.shutdown().await;
}

#[tokio::test]
async fn delete_all_keeping_the_alarm_still_fires_the_timer() {
    let w = World::new();
    let a = w.host("a").await;
    let now = durability_ownership::Clock::now_ms(&w.clock);
    a.transaction::<Counter, _, _>("Counter", "c1", |c, tx| {
        c.incr(tx)?;
        c.set_timer(tx, now + 1_000)
    })
    .await
    .unwrap();
    let report = a
        .delete_all("Counter", "c1", DeleteAll::default().keep_alarm(true))
        .await
        .unwrap();
    assert_eq!(report.dropped, ["counter", "fired"]);
    assert!(report.cancelled_due.is_empty());
    let job = w.index().job(&id("st1:Counter:c1")).await.unwrap().unwrap();
    assert_eq!(job.due_at, now + 1_000, "the alarm job stays");
    assert!(
        advance_until(&w.clock, 200, 5_000, || w.fired() == ["a c1"]).await,
        "{:?}",
        w.fired()
    );
    a.shutdown().await;
}

#[tokio::test]
async fn a_stale_hosts_delete_all_is_refused_and_deletes_nothing() {
    let w = World::new();
    let a = w.host("a").await;
    let b = w.host("b").await;
    assert_eq!(incr(&a, "c1").await.unwrap(), 1);
    a.ownership().forget(&a.scope_for("Counter", "c1").unwrap());
    w.clock.advance(i64::try_from(TTL).unwrap() + 1);
    spin().await;
    assert_eq!(incr(&b, "c1").await.unwrap(), 2);
    let refused = a
        .delete_all("Counter", "c1", DeleteAll::default())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, HostError::NotOwner { generation: 2, .. }),
        "{refused}"
    );
    assert_eq!(incr(&b, "c1").await.unwrap(), 3, "nothing was deleted");
    // Draining: refused too.
    b.shutdown().await;
    assert_eq!(
        b.delete_all("Counter", "c1", DeleteAll::default())
            .await
            .unwrap_err()
            .code(),
        "host_draining"
    );
    a.shutdown().await;
}

#[tokio::test]
async fn deleting_a_storage_id_removes_its_objects_jobs_and_pointer_and_tombstones_it() {
    let w = World::new();
    let a = w.host("a").await;
    let now = durability_ownership::Clock::now_ms(&w.clock);
    for i in 0..5 {
        a.transaction::<Counter, _, _>("Counter", &format!("c{i}"), |c, tx| {
            c.incr(tx)?;
            c.set_timer(tx, now + 60_000)
        })
        .await
        .unwrap();
    }
    // Jobs of other storage ids, one sharing a leading substring.
    let index = w.index();
    for other in ["st10:Counter:x", "st2:Counter:y"] {
        index
            .upsert(&id(other), &Token::new("keep").unwrap(), now + 60_000)
            .await
            .unwrap();
    }
    let report = a.delete_storage_id().await.unwrap();
    eprintln!("storage delete: {report:?}");
    assert!(report.complete(), "{report:?}");
    assert!(report.pointer_removed);
    assert_eq!(report.objects_deleted, 5);
    assert_eq!(report.jobs_deleted, 5);
    for i in 0..5 {
        assert!(!object_file(&w, STORAGE, &format!("c{i}")).exists());
        assert_eq!(
            index.job(&id(&format!("st1:Counter:c{i}"))).await.unwrap(),
            None
        );
    }
    for other in ["st10:Counter:x", "st2:Counter:y"] {
        assert!(
            index.job(&id(other)).await.unwrap().is_some(),
            "{other} is another storage's job"
        );
    }
    let tombstone = std::fs::read_to_string(w.root().join(STORAGE).join(TOMBSTONE_FILE)).unwrap();
    assert!(tombstone.contains("state=deleted"), "{tombstone}");
    let snap = w
        .store()
        .snapshot(&probe_scope(STORAGE), &lifecycle())
        .await
        .unwrap();
    assert_eq!(snap.active_storage, None, "the pointer is gone");
    assert_eq!(snap.delete_lock, None, "the lock was released");

    // The host serving it refuses new work, and creates no object file,
    // even for an object of a scope it still holds a local lease on.
    let held = a.scope_for("Counter", "c0").unwrap();
    let sibling = (0..10_000)
        .map(|i| format!("n{i}"))
        .find(|n| a.scope_for("Counter", n).unwrap() == held)
        .unwrap();
    let refused = incr(&a, &sibling).await.unwrap_err();
    assert!(
        matches!(
            refused,
            HostError::Ownership(
                OwnershipError::StorageInactive { .. } | OwnershipError::DeleteLocked { .. }
            )
        ),
        "{refused}"
    );
    assert!(
        !object_file(&w, STORAGE, &sibling).exists(),
        "no object file is created under a deleted storage id"
    );
    let refused = incr(&a, "c9").await.unwrap_err();
    assert!(
        matches!(
            refused,
            HostError::Ownership(
                OwnershipError::StorageInactive { .. } | OwnershipError::DeleteLocked { .. }
            )
        ),
        "{refused}"
    );
    assert!(!object_file(&w, STORAGE, "c9").exists());
    a.shutdown().await;
    // No host starts on the deleted storage id, even asked to create the
    // pointer; a new storage id in the same lifecycle does.
    let err = Host::start(w.config("a")).await.err().unwrap();
    eprintln!("tombstoned: {err}");
    assert!(
        matches!(&err, HostError::LifecycleRecord { found, .. } if found.starts_with("tombstoned")),
        "{err}"
    );
    let snap = w
        .store()
        .snapshot(&probe_scope(STORAGE), &lifecycle())
        .await
        .unwrap();
    assert_eq!(snap.active_storage, None, "the refusal wrote nothing");
    let b = Host::start(w.config_for("b", "st2")).await.unwrap();
    assert_eq!(
        b.transaction::<Counter, _, _>("Counter", "y", |c, tx| c.incr(tx))
            .await
            .unwrap(),
        1
    );
    b.shutdown().await;
}

#[tokio::test]
async fn a_storage_deletion_interrupted_at_any_step_is_finished_by_running_it_again() {
    // The states a deletion leaves when it stops after each of its writes:
    // (pointer still set, lock) for "tombstone written", "lock taken",
    // "pointer removed" (files and jobs still there in all three).
    for (case, pointer, lock) in [
        ("after the tombstone", true, false),
        ("after the lock", true, true),
        ("after the pointer", false, true),
    ] {
        let w = World::new();
        let a = w.host("a").await;
        let now = durability_ownership::Clock::now_ms(&w.clock);
        for i in 0..3 {
            a.transaction::<Counter, _, _>("Counter", &format!("c{i}"), |c, tx| {
                c.set_timer(tx, now + 60_000)
            })
            .await
            .unwrap();
        }
        a.shutdown().await;
        let store = w.store();
        std::fs::write(
            w.root().join(STORAGE).join(TOMBSTONE_FILE),
            "state=deleting\n",
        )
        .unwrap();
        if lock {
            store
                .set_delete_lock(&lifecycle(), Some(DeleteLock::Whole))
                .await
                .unwrap();
        }
        if !pointer {
            store.set_active_storage(&lifecycle(), None).await.unwrap();
        }
        let report = delete_storage_id(
            store.as_ref(),
            w.index().as_ref(),
            &SqliteObjectStore::new(w.root()),
            LIFECYCLE,
            STORAGE,
        )
        .await
        .unwrap();
        eprintln!("{case}: {report:?}");
        assert!(report.complete(), "{case}: {report:?}");
        assert_eq!(report.pointer_removed, pointer, "{case}");
        assert_eq!(report.objects_deleted, 3, "{case}");
        assert_eq!(report.jobs_deleted, 3, "{case}");
        let snap = store
            .snapshot(&probe_scope(STORAGE), &lifecycle())
            .await
            .unwrap();
        assert_eq!(
            (snap.active_storage, snap.delete_lock),
            (None, None),
            "{case}"
        );
        assert_eq!(w.index().counts().await.unwrap().total(), 0, "{case}");
        // Once more: nothing left, still complete.
        let again = delete_storage_id(
            store.as_ref(),
            w.index().as_ref(),
            &SqliteObjectStore::new(w.root()),
            LIFECYCLE,
            STORAGE,
        )
        .await
        .unwrap();
        assert!(again.complete() && again.objects_deleted == 0 && again.jobs_deleted == 0);
    }
}

#[tokio::test]
async fn a_storage_deletion_leaves_a_redeployed_lifecycle_alone() {
    let w = World::new();
    let a = w.host("a").await;
    incr(&a, "c1").await.unwrap();
    a.shutdown().await;
    // A redeploy points the lifecycle at st2 before the old st1 is cleaned.
    let store = w.store();
    store
        .set_active_storage(&lifecycle(), Some(&StorageId::new("st2").unwrap()))
        .await
        .unwrap();
    let report = delete_storage_id(
        store.as_ref(),
        w.index().as_ref(),
        &SqliteObjectStore::new(w.root()),
        LIFECYCLE,
        STORAGE,
    )
    .await
    .unwrap();
    assert!(report.complete() && !report.pointer_removed, "{report:?}");
    assert_eq!(report.objects_deleted, 1);
    let snap = store
        .snapshot(&probe_scope("st2"), &lifecycle())
        .await
        .unwrap();
    assert_eq!(snap.active_storage, Some(StorageId::new("st2").unwrap()));
    assert_eq!(snap.delete_lock, None);
    // Bad input: typed, nothing touched.
    let err = delete_storage_id(
        store.as_ref(),
        w.index().as_ref(),
        &SqliteObjectStore::new(w.root()),
        LIFECYCLE,
        "bad:id",
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "host_invalid_setting");
    let snap = store
        .snapshot(&probe_scope("st2"), &lifecycle())
        .await
        .unwrap();
    assert_eq!(snap.active_storage, Some(StorageId::new("st2").unwrap()));
}

#[tokio::test]
async fn a_storage_deletion_that_cannot_reach_the_alarm_index_reports_a_partial_result() {
    let w = World::new();
    let a = w.host("a").await;
    incr(&a, "c1").await.unwrap();
    a.shutdown().await;
    // The index's job table is gone: listing the storage's jobs fails.
    let broken = w.dir.path().join("broken-alarms.db");
    let index = durability_storage_sqlite::alarms::SqliteAlarmIndex::open(
        &broken,
        durability_storage_sqlite::Synchronous::Normal,
    )
    .unwrap();
    rusqlite::Connection::open(&broken)
        .unwrap()
        .execute_batch("DROP TABLE durability_alarm_index_jobs")
        .unwrap();
    let store = w.store();
    let report = delete_storage_id(
        store.as_ref(),
        &index,
        &SqliteObjectStore::new(w.root()),
        LIFECYCLE,
        STORAGE,
    )
    .await
    .unwrap();
    eprintln!("partial: {report:?}");
    assert!(!report.complete());
    assert_eq!(report.objects_deleted, 1, "what could be deleted was");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    assert!(report.failures[0].what.contains("alarm jobs of st1:"));
    let tombstone = std::fs::read_to_string(w.root().join(STORAGE).join(TOMBSTONE_FILE)).unwrap();
    assert!(
        tombstone.contains("state=deleting"),
        "an incomplete deletion is not marked deleted: {tombstone}"
    );
    let snap = store
        .snapshot(&probe_scope(STORAGE), &lifecycle())
        .await
        .unwrap();
    assert_eq!(
        (snap.active_storage, snap.delete_lock),
        (None, None),
        "the pointer is gone and the lock released either way"
    );
}
