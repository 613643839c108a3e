//! Corrupt alarm data (issue 14, alarms item 9): a corrupt object-side row
//! stays deletable; a corrupt job in the SQLite or Redis index is a typed
//! `do_alarm_corrupt` error or is quarantined at claim time, and never
//! blocks healthy jobs.
#![allow(clippy::unwrap_used)]

use crate::alarms::support;

use std::sync::Arc;

use durability_alarms::{AlarmIndex, AlarmTx, ClaimReady, ObjectId, Token};
use durability_scheduler::{ManualClock, Storage, StorageError};
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::{SqliteStorage, Synchronous};
use support::{Host, Log, NoFail, START, redis_cleanup, redis_index, unique_prefix};

fn obj(s: &str) -> ObjectId {
    ObjectId::new(s).unwrap()
}

fn tok(s: &str) -> Token {
    Token::new(s).unwrap()
}

fn corrupt_row(storage: &SqliteStorage, at: &str, token: &str) {
    storage
        .transaction(|tx| {
            tx.sql()
                .execute(
                    "INSERT OR REPLACE INTO durability_alarm (id, at, token, fence) VALUES (0, ?1, ?2, NULL)",
                    [at, token],
                )
                .map_err(|e| StorageError::backend("seed", e))
        })
        .unwrap();
}

fn row_count(storage: &SqliteStorage) -> i64 {
    storage
        .transaction(|tx| {
            tx.sql()
                .query_row("SELECT COUNT(*) FROM durability_alarm", [], |r| r.get(0))
                .map_err(|e| StorageError::backend("count", e))
        })
        .unwrap()
}

#[tokio::test]
async fn a_row_with_a_corrupt_time_stays_deletable() {
    let clock = ManualClock::new(START);
    let index = Arc::new(durability_alarms::MemoryAlarmIndex::new());
    let storage = Arc::new(SqliteStorage::open_in_memory().unwrap());
    let host = Host::default();
    let o = host.open(
        "room-1",
        Arc::clone(&storage),
        &clock,
        Arc::clone(&index),
        &Log::default(),
        Arc::new(NoFail),
    );
    // A legacy/corrupt row: the time is text, the token is valid, and the
    // index holds the job of that token.
    corrupt_row(&storage, "not-a-time", "tok1");
    index
        .upsert(&obj("room-1"), &tok("tok1"), START)
        .await
        .unwrap();
    assert!(storage.transaction(|tx| tx.alarm_row()).is_err());

    o.alarms.delete_alarm().await.unwrap();
    assert_eq!(row_count(&storage), 0, "the corrupt row is deleted");
    assert_eq!(
        index.job(&obj("room-1")).await.unwrap(),
        None,
        "its backend job too"
    );
}

#[tokio::test]
async fn a_row_with_a_corrupt_token_is_deleted_locally() {
    let clock = ManualClock::new(START);
    let index = Arc::new(durability_alarms::MemoryAlarmIndex::new());
    let storage = Arc::new(SqliteStorage::open_in_memory().unwrap());
    let host = Host::default();
    let o = host.open(
        "room-2",
        Arc::clone(&storage),
        &clock,
        Arc::clone(&index),
        &Log::default(),
        Arc::new(NoFail),
    );
    corrupt_row(&storage, "12", "bad token!");
    o.alarms.delete_alarm().await.unwrap();
    assert_eq!(row_count(&storage), 0);
}

fn raw_index(path: &std::path::Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(path).unwrap();
    c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    c
}

#[tokio::test]
async fn sqlite_claim_quarantines_a_corrupt_job_before_claiming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index.db");
    let ix = SqliteAlarmIndex::open(&path, Synchronous::Normal).unwrap();
    ix.upsert(&obj("healthy"), &tok("t1"), START + 10)
        .await
        .unwrap();
    // Two corrupt ready jobs that sort before the healthy one: an object id
    // holding NUL (no valid id does) and a due time stored as text.
    let raw = raw_index(&path);
    raw.execute(
        "INSERT INTO durability_alarm_index_jobs (object, token, due_at, state, run, tries, score)
         VALUES (?1, 'tc', ?2, 1, NULL, 0, ?2)",
        rusqlite::params!["bad\0id", START],
    )
    .unwrap();
    raw.execute(
        "INSERT INTO durability_alarm_index_jobs (object, token, due_at, state, run, tries, score)
         VALUES ('bad-time', 'tt', 'soon', 1, NULL, 0, 0)",
        [],
    )
    .unwrap();
    assert_eq!(ix.promote(START + 10, 100).await.unwrap(), 1);

    let run = tok("r1");
    let claim = ix
        .claim(ClaimReady {
            now: START + 10,
            lease_ms: 1_000,
            run: &run,
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claim.object, obj("healthy"), "the healthy job is claimed");
    assert_eq!(ix.quarantined().unwrap(), 1, "the corrupt id sorted first");
    // The text due time sorts after every integer: the next claim meets it.
    assert!(
        ix.claim(ClaimReady {
            now: START + 10,
            lease_ms: 1_000,
            run: &tok("r2")
        })
        .await
        .unwrap()
        .is_none()
    );
    assert_eq!(
        ix.quarantined().unwrap(),
        2,
        "both corrupt jobs quarantined"
    );
    let running: i64 = raw
        .query_row(
            "SELECT COUNT(*) FROM durability_alarm_index_jobs WHERE state = 2",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(running, 1, "no corrupt job was left claimed");
}

#[tokio::test]
async fn redis_reports_a_corrupt_stored_field_as_corrupt() {
    let prefix = unique_prefix("redis_corrupt_field");
    let Some(ix) = redis_index("redis_reports_a_corrupt_stored_field_as_corrupt", &prefix).await
    else {
        return;
    };
    let a = obj("a");
    ix.upsert(&a, &tok("t1"), START).await.unwrap();
    let mut c = ix.connection();
    let _: () = redis::cmd("HSET")
        .arg(ix.job_key(&a))
        .arg("due_at")
        .arg("yesterday")
        .query_async(&mut c)
        .await
        .unwrap();
    let e = ix.job(&a).await.unwrap_err();
    assert_eq!(e.code(), "do_alarm_corrupt", "{e}");
    redis_cleanup(&ix).await;
}

#[tokio::test]
async fn redis_claim_quarantines_a_corrupt_job_and_claims_the_healthy_one() {
    let prefix = unique_prefix("redis_corrupt_claim");
    let Some(ix) = redis_index(
        "redis_claim_quarantines_a_corrupt_job_and_claims_the_healthy_one",
        &prefix,
    )
    .await
    else {
        return;
    };
    ix.upsert(&obj("bad"), &tok("t0"), START).await.unwrap();
    ix.upsert(&obj("good"), &tok("t1"), START + 5)
        .await
        .unwrap();
    let mut c = ix.connection();
    let _: () = redis::cmd("HSET")
        .arg(ix.job_key(&obj("bad")))
        .arg("tries")
        .arg("many")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(ix.promote(START + 5, 10).await.unwrap(), 2);
    let claim = ix
        .claim(ClaimReady {
            now: START + 5,
            lease_ms: 1_000,
            run: &tok("r1"),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claim.object, obj("good"));
    let q: Vec<String> = redis::cmd("SMEMBERS")
        .arg(ix.quarantine_key())
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(q, vec!["bad".to_owned()]);
    assert!(
        ix.claim(ClaimReady {
            now: START + 5,
            lease_ms: 1_000,
            run: &tok("r2")
        })
        .await
        .unwrap()
        .is_none()
    );
    redis_cleanup(&ix).await;
}

#[tokio::test]
async fn a_delivery_to_a_corrupt_row_fails_instead_of_spinning() {
    use durability_alarms::{Dispatcher, DispatcherConfig};
    let clock = ManualClock::new(START);
    let index = Arc::new(durability_alarms::MemoryAlarmIndex::new());
    let storage = Arc::new(SqliteStorage::open_in_memory().unwrap());
    let host = Arc::new(Host::default());
    host.open(
        "room-3",
        Arc::clone(&storage),
        &clock,
        Arc::clone(&index),
        &Log::default(),
        Arc::new(NoFail),
    );
    corrupt_row(&storage, "not-a-time", "tok3");
    index
        .upsert(&obj("room-3"), &tok("tok3"), START)
        .await
        .unwrap();
    let d = Dispatcher::new(
        Arc::clone(&index),
        host,
        Arc::new(clock.clone()),
        DispatcherConfig {
            seed: Some(1),
            ..DispatcherConfig::default()
        },
    )
    .unwrap();
    d.tick().await.unwrap();
    let c = d.counters().snapshot();
    assert_eq!((c.retried, c.retry_scheduled), (0, 1), "{c:?}");
    let job = index.job(&obj("room-3")).await.unwrap().unwrap();
    assert_eq!(job.tries, 1, "the try is used");
}

#[tokio::test]
async fn redis_claim_quarantines_a_job_with_a_corrupt_object_id() {
    let prefix = unique_prefix("redis_corrupt_id");
    let Some(ix) = redis_index(
        "redis_claim_quarantines_a_job_with_a_corrupt_object_id",
        &prefix,
    )
    .await
    else {
        return;
    };
    ix.upsert(&obj("good"), &tok("t1"), START + 5)
        .await
        .unwrap();
    // A job whose stored fields decode but whose object id (the set member)
    // does not: it holds NUL.
    let bad = "bad\0id";
    let mut c = ix.connection();
    let _: () = redis::cmd("HSET")
        .arg(format!("{prefix}wf:internal:do-alarm:job:{bad}"))
        .arg("token")
        .arg("t0")
        .arg("due_at")
        .arg(START.to_string())
        .arg("state")
        .arg("due")
        .arg("tries")
        .arg("0")
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(ix.due_key())
        .arg(START)
        .arg(bad)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(ix.promote(START + 5, 10).await.unwrap(), 2);
    let claims = ix
        .claim_batch(START + 5, 1_000, &[tok("r1"), tok("r2")])
        .await
        .unwrap();
    let objects: Vec<&str> = claims.iter().map(|c| c.object.as_str()).collect();
    assert_eq!(objects, vec!["good"], "the healthy job only");
    let q: Vec<String> = redis::cmd("SMEMBERS")
        .arg(ix.quarantine_key())
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(q, vec![bad.to_owned()]);
    let due: Vec<String> = redis::cmd("ZRANGE")
        .arg(ix.due_key())
        .arg(0)
        .arg(-1)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(
        due,
        vec!["good".to_owned()],
        "no lease left for the bad job"
    );
    redis_cleanup(&ix).await;
}
