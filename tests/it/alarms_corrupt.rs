//! Corrupt alarm data (issue 14, alarms item 9): a corrupt object-side row
//! stays deletable; a corrupt job in the SQLite or Redis index is a typed
//! `do_alarm_corrupt` error or is quarantined at claim time, and never
//! blocks healthy jobs.
#![allow(clippy::unwrap_used)]

use crate::alarms::support;

use std::sync::Arc;

use durability_alarms::{
    AlarmIndex, AlarmTx, Claim, ClaimReady, MemoryAlarmIndex, ObjectId, Token,
};
use durability_scheduler::{ManualClock, Storage, StorageError};
use durability_storage_redis::alarms::RedisAlarmIndex;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::{SqliteStorage, Synchronous};
use redis::aio::ConnectionManager;
use support::{Host, Log, NoFail, Obj, START, redis_cleanup, redis_index, unique_prefix};

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

/// One object on an in-memory SQLite file, registered with a host and the
/// memory index, whose alarm row was then overwritten behind its back.
struct Room {
    clock: ManualClock,
    index: Arc<MemoryAlarmIndex>,
    storage: Arc<SqliteStorage>,
    host: Arc<Host<SqliteStorage, MemoryAlarmIndex>>,
    o: Arc<Obj<SqliteStorage, MemoryAlarmIndex>>,
}

/// Opens `name` and writes the alarm row `(at, token)` with
/// [`corrupt_row`].
fn room_with_corrupt_row(name: &str, at: &str, token: &str) -> Room {
    let clock = ManualClock::new(START);
    let index = Arc::new(MemoryAlarmIndex::new());
    let storage = Arc::new(SqliteStorage::open_in_memory().unwrap());
    let host = Arc::new(Host::default());
    let o = host.open(
        name,
        Arc::clone(&storage),
        &clock,
        Arc::clone(&index),
        &Log::default(),
        Arc::new(NoFail),
    );
    corrupt_row(&storage, at, token);
    Room {
        clock,
        index,
        storage,
        host,
        o,
    }
}

/// [`room_with_corrupt_row`], then a job of `token` due at `START` in
/// the index.
async fn room_with_corrupt_row_and_job(name: &str, at: &str, token: &str) -> Room {
    let room = room_with_corrupt_row(name, at, token);
    room.index
        .upsert(&obj(name), &tok(token), START)
        .await
        .unwrap();
    room
}

/// A claim of the next ready job at `now` for run `run`, leased 1 s.
async fn claim_at(ix: &impl AlarmIndex, now: i64, run: &str) -> Option<Claim> {
    ix.claim(ClaimReady {
        now,
        lease_ms: 1_000,
        run: &tok(run),
    })
    .await
    .unwrap()
}

/// A Redis index under a unique prefix of its own (returned too) made of
/// `what`, or `None` as [`redis_index`] says.
async fn fresh_redis_index(what: &str) -> Option<(RedisAlarmIndex, String)> {
    let prefix = unique_prefix(what);
    Some((redis_index(what, &prefix).await?, prefix))
}

/// Sets `fields` of the Redis hash `key`.
async fn hset(c: &mut ConnectionManager, key: &str, fields: &[(&str, &str)]) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(key);
    for (field, value) in fields {
        cmd.arg(*field).arg(*value);
    }
    let _: () = cmd.query_async(c).await.unwrap();
}

/// The object ids in the Redis index's quarantine set.
async fn quarantined(ix: &RedisAlarmIndex, c: &mut ConnectionManager) -> Vec<String> {
    redis::cmd("SMEMBERS")
        .arg(ix.quarantine_key())
        .query_async(c)
        .await
        .unwrap()
}

fn row_count(storage: &SqliteStorage) -> i64 {
    crate::support::query_one(storage, "SELECT COUNT(*) FROM durability_alarm")
}

#[tokio::test]
async fn a_row_with_a_corrupt_time_stays_deletable() {
    // A legacy/corrupt row: the time is text, the token is valid, and the
    // index holds the job of that token.
    let Room {
        index, storage, o, ..
    } = room_with_corrupt_row_and_job("room-1", "not-a-time", "tok1").await;
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
    let Room { storage, o, .. } = room_with_corrupt_row("room-2", "12", "bad token!");
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

    let claim = claim_at(&ix, START + 10, "r1").await.unwrap();
    assert_eq!(claim.object, obj("healthy"), "the healthy job is claimed");
    assert_eq!(ix.quarantined().unwrap(), 1, "the corrupt id sorted first");
    // The text due time sorts after every integer: the next claim meets it.
    assert!(claim_at(&ix, START + 10, "r2").await.is_none());
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
    let Some((ix, _)) = fresh_redis_index("redis_corrupt_field").await else {
        return;
    };
    let a = obj("a");
    ix.upsert(&a, &tok("t1"), START).await.unwrap();
    let mut c = ix.connection();
    hset(&mut c, &ix.job_key(&a), &[("due_at", "yesterday")]).await;
    let e = ix.job(&a).await.unwrap_err();
    assert_eq!(e.code(), "do_alarm_corrupt", "{e}");
    redis_cleanup(&ix).await;
}

#[tokio::test]
async fn redis_claim_quarantines_a_corrupt_job_and_claims_the_healthy_one() {
    let Some((ix, _)) = fresh_redis_index("redis_corrupt_claim").await else {
        return;
    };
    ix.upsert(&obj("bad"), &tok("t0"), START).await.unwrap();
    ix.upsert(&obj("good"), &tok("t1"), START + 5)
        .await
        .unwrap();
    let mut c = ix.connection();
    hset(&mut c, &ix.job_key(&obj("bad")), &[("tries", "many")]).await;
    assert_eq!(ix.promote(START + 5, 10).await.unwrap(), 2);
    let claim = claim_at(&ix, START + 5, "r1").await.unwrap();
    assert_eq!(claim.object, obj("good"));
    assert_eq!(quarantined(&ix, &mut c).await, vec!["bad".to_owned()]);
    assert!(claim_at(&ix, START + 5, "r2").await.is_none());
    redis_cleanup(&ix).await;
}

#[tokio::test]
async fn a_delivery_to_a_corrupt_row_fails_instead_of_spinning() {
    use durability_alarms::{Dispatcher, DispatcherConfig};
    let Room {
        clock, index, host, ..
    } = room_with_corrupt_row_and_job("room-3", "not-a-time", "tok3").await;
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
    let Some((ix, prefix)) = fresh_redis_index("redis_corrupt_id").await else {
        return;
    };
    ix.upsert(&obj("good"), &tok("t1"), START + 5)
        .await
        .unwrap();
    // A job whose stored fields decode but whose object id (the set member)
    // does not: it holds NUL.
    let bad = "bad\0id";
    let mut c = ix.connection();
    let due_at = START.to_string();
    hset(
        &mut c,
        &format!("{prefix}wf:internal:do-alarm:job:{bad}"),
        &[
            ("token", "t0"),
            ("due_at", &due_at),
            ("state", "due"),
            ("tries", "0"),
        ],
    )
    .await;
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
    assert_eq!(quarantined(&ix, &mut c).await, vec![bad.to_owned()]);
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
