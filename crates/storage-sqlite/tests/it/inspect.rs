//! Read-only inspection of object databases and alarm index files.

use std::sync::Arc;

use durability_alarms::AlarmIndex;
use durability_scheduler::{ManualClock, ObjectContext, ObjectId, Scheduler};
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::inspect::{InspectError, inspect_object, outbox_entries};
use durability_storage_sqlite::{SqliteOptions, SqliteStorage, Synchronous};

#[test]
fn an_object_open_in_another_connection_is_read_with_its_uncheckpointed_commits() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("object.db");
    let storage = Arc::new(SqliteStorage::open(&db, SqliteOptions::default()).unwrap());
    let clock = Arc::new(ManualClock::new(1_000));
    let sched = Scheduler::new(ObjectContext::with_clock(
        ObjectId::new("o").unwrap(),
        storage,
        clock,
    ))
    .unwrap();
    sched
        .transaction(|tx| tx.set_due("reports", Some(5_000)))
        .unwrap();
    // The writer still has the file open: the commit is in the WAL only.
    let report = inspect_object(&db, 1_000).unwrap();
    assert_eq!(report.alarm, Some(5_000));
    assert_eq!(report.capabilities.len(), 1);
    assert_eq!(report.capabilities[0].name, "reports");
    // The writer keeps working after the read.
    sched
        .transaction(|tx| tx.set_due("reports", Some(6_000)))
        .unwrap();
    assert_eq!(inspect_object(&db, 1_000).unwrap().alarm, Some(6_000));
    // No outbox tables were created on this object: nothing to list.
    let listing = outbox_entries(&db, None, 1_000, 10).unwrap();
    assert!(listing.entries.is_empty() && listing.quarantined.is_empty());
}

#[test]
fn inspect_error_codes_are_distinct() {
    let dir = tempfile::tempdir().unwrap();
    let missing = inspect_object(&dir.path().join("missing.db"), 0).unwrap_err();
    assert!(matches!(missing, InspectError::NotFound { .. }));
    let text = dir.path().join("text");
    std::fs::write(&text, "x".repeat(4096)).unwrap();
    let foreign = inspect_object(&text, 0).unwrap_err();
    assert!(
        matches!(foreign, InspectError::NotObjectDatabase { .. }),
        "{foreign}"
    );
    assert_ne!(missing.code(), foreign.code());
    assert!(missing.code().starts_with("SQLITE_INSPECT_"));
}

#[tokio::test]
async fn a_read_only_alarm_index_reads_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("alarms.db");
    let object = ObjectId::new("a").unwrap();
    let token = durability_alarms::Token::new("t1").unwrap();
    {
        let ix = SqliteAlarmIndex::open(&db, Synchronous::Full).unwrap();
        ix.upsert(&object, &token, 10).await.unwrap();
    }
    let before = std::fs::read(&db).unwrap();
    let ix = SqliteAlarmIndex::open_read_only(&db).unwrap();
    assert_eq!(ix.counts().await.unwrap().total(), 1);
    assert_eq!(ix.next_due().await.unwrap(), Some(10));
    assert!(
        ix.upsert(&object, &token, 20).await.is_err(),
        "a write fails"
    );
    assert!(ix.delete(&object, &token).await.is_err(), "a write fails");
    drop(ix);
    assert_eq!(std::fs::read(&db).unwrap(), before, "the file is unchanged");
    let missing = dir.path().join("missing.db");
    assert!(SqliteAlarmIndex::open_read_only(&missing).is_err());
    assert!(!missing.exists());
}
