//! A host on PostgreSQL alone (`HostConfig::postgres`): its leases, alarm
//! jobs and objects are rows of one database schema (the test's own), and
//! no directory is involved. Real time (the lease store and the alarm index
//! run on the server's clock); every wait is bounded.

use std::sync::Arc;
use std::time::Duration;

use durability_host::store::postgres::{PostgresAlarmIndex, PostgresLeaseStore};
use durability_host::{
    BoxError, DatabaseSettings, DeleteAll, Host, HostConfig, HostError, HostIds, HostSettings,
    ObjectCtx, ObjectStore, PostgresObjectStore,
};
use durability_ownership::{Clock, LifecycleId, StorageId, SystemClock, TaskId};
use durability_scheduler::{Scheduler, StorageError, Transaction};
use durability_storage_postgres::object::PostgresObjectStorage;
use durability_storage_postgres::testkit::{TestSchema, url};

use crate::support::Timer;

type PgHost = Host<PostgresLeaseStore, PostgresAlarmIndex, PostgresObjectStore>;

fn pg(e: tokio_postgres::Error) -> StorageError {
    StorageError::backend("counter sql", e)
}

struct Counter {
    inner: Arc<CounterInner>,
}

struct CounterInner {
    sched: Scheduler<PostgresObjectStorage>,
}

impl CounterInner {
    /// Records that the timer fired, in the object's own table.
    fn fire(&self, now_ms: i64) {
        let _ = self.sched.transaction(|tx| {
            tx.sql()
                .execute("INSERT INTO fired (t) VALUES ($1)", &[&now_ms])?;
            tx.set_due("timer", None)
        });
    }
}

impl Counter {
    fn open(ctx: &ObjectCtx<PostgresAlarmIndex, PostgresObjectStorage>) -> Result<Self, BoxError> {
        ctx.scheduler.transaction(|tx| {
            tx.sql().batch_execute(
                "CREATE TABLE IF NOT EXISTS counter (id INT PRIMARY KEY CHECK (id = 0), n BIGINT NOT NULL);
                 CREATE TABLE IF NOT EXISTS fired (t BIGINT NOT NULL);
                 CREATE OR REPLACE VIEW counter_view AS SELECT n FROM counter;",
            )
        })?;
        let inner = Arc::new(CounterInner {
            sched: ctx.scheduler.clone(),
        });
        ctx.scheduler
            .attach("timer", None, Timer::of(&inner, CounterInner::fire))?;
        Ok(Self { inner })
    }

    fn incr(&self) -> Result<i64, StorageError> {
        self.inner.sched.transaction(incr_in)
    }
}

/// Adds one to the counter in `tx` and returns the new value.
fn incr_in(tx: &mut Transaction<'_, '_, PostgresObjectStorage>) -> Result<i64, StorageError> {
    tx.sql()
        .query_one(
            "INSERT INTO counter (id, n) VALUES (0, 1)
             ON CONFLICT (id) DO UPDATE SET n = counter.n + 1 RETURNING n",
            &[],
        )?
        .try_get(0)
        .map_err(pg)
}

fn ids(task: &str) -> HostIds {
    HostIds {
        storage: StorageId::new("st1").unwrap(),
        lifecycle: LifecycleId::new("ns:app").unwrap(),
        task: TaskId::new(task).unwrap(),
    }
}

async fn start(schema: &TestSchema, task: &str) -> Result<PgHost, HostError> {
    let config = HostConfig::postgres(
        &DatabaseSettings::new(&url(), schema.name()),
        HostSettings::default(),
        ids(task),
    )
    .await?
    .class("Counter", Counter::open)
    .create_active_storage_if_absent(true);
    Host::start(config).await
}

async fn incr(host: &PgHost, name: &str) -> i64 {
    host.call::<Counter, _, _, _>("Counter", name, |h| async move { Ok(h.object.incr()?) })
        .await
        .unwrap()
}

/// A client on the test's schema, for reading the stored rows.
async fn client(schema: &TestSchema) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!("SET search_path TO {}", schema.name()))
        .await
        .unwrap();
    client
}

async fn count(c: &tokio_postgres::Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.unwrap().get(0)
}

/// Waits (real time, bounded) until `sql` counts at least `n`.
async fn wait_count(c: &tokio_postgres::Client, sql: &str, n: i64) -> i64 {
    let clock = SystemClock::new();
    let end = clock.now_ms() + 20_000;
    loop {
        let found = count(c, sql).await;
        if found >= n || clock.now_ms() > end {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_on_postgres_alone_keeps_objects_leases_and_alarm_jobs_in_the_database() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let host = start(&schema, "task-a").await.unwrap();
    assert_eq!(incr(&host, "c1").await, 1);
    assert_eq!(incr(&host, "c1").await, 2);
    assert_eq!(incr(&host, "c2").await, 1);
    let c = client(&schema).await;
    // The objects: recorded, fenced at the host's claim, their own rows.
    assert_eq!(
        count(&c, "SELECT count(*) FROM durability_objects WHERE id IN ('st1:Counter:c1', 'st1:Counter:c2')").await,
        2
    );
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM durability_object_fences WHERE object_id = 'st1:Counter:c1'"
        )
        .await,
        1
    );
    let seq: i64 = c
        .query_one(
            "SELECT seq FROM durability_objects WHERE id = 'st1:Counter:c1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let n: i64 = c
        .query_one(
            &format!("SELECT n FROM {}_o{seq}.counter", schema.name()),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 2, "the acknowledged writes are the stored rows");
    // The leases: the host's claims are rows of the same schema.
    assert!(count(&c, "SELECT count(*) FROM durability_owner_leases").await >= 1);
    // An alarm: its job is a row of the index, and it fires.
    let at = SystemClock::new().now_ms() + 2_000;
    host.call::<Counter, _, _, _>("Counter", "c1", |h| async move {
        Ok(h.scheduler
            .transaction(|tx| tx.set_due("timer", Some(at)))?)
    })
    .await
    .unwrap();
    // The index is written after the commit (the scheduler alarm's move).
    assert_eq!(
        wait_count(
            &c,
            "SELECT count(*) FROM durability_alarm_jobs WHERE object = 'st1:Counter:c1'",
            1
        )
        .await,
        1
    );
    let fired = wait_count(
        &c,
        &format!("SELECT count(*) FROM {}_o{seq}.fired", schema.name()),
        1,
    )
    .await;
    assert_eq!(fired, 1, "the alarm fired once");
    let report = host.shutdown().await;
    assert!(!report.timed_out());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_all_and_storage_deletion_on_postgres_leave_nothing_but_the_tombstone() {
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    let host = start(&schema, "task-a").await.unwrap();
    for name in ["d1", "d2", "d3"] {
        assert_eq!(incr(&host, name).await, 1);
    }
    let c = client(&schema).await;
    // Delete-all drops the object's own relations (view first), nothing else.
    let report = host
        .delete_all("Counter", "d1", DeleteAll::default())
        .await
        .unwrap();
    assert_eq!(report.dropped, ["counter_view", "counter", "fired"]);
    assert_eq!(incr(&host, "d1").await, 1, "the object restarts empty");
    // Listing by class and name prefix, paged.
    let store = PostgresObjectStore::connect(&url(), schema.name(), Default::default()).unwrap();
    let storage = StorageId::new("st1").unwrap();
    let page = store
        .list_prefix(&storage, Some("Counter"), "d", None, 2)
        .unwrap();
    let names: Vec<&str> = page.objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["d1", "d2"]);
    let next = store
        .list_prefix(&storage, Some("Counter"), "d", page.cursor.as_deref(), 2)
        .unwrap();
    assert_eq!(next.objects.len(), 1);
    assert_eq!(next.objects[0].name, "d3");
    assert_eq!(next.cursor, None);
    assert!(
        store
            .list_prefix(&storage, Some("Counter"), "x", None, 2)
            .unwrap()
            .objects
            .is_empty()
    );
    // The whole storage id: objects, own schemas, fences; the tombstone stays.
    let schemas_before = count(
        &c,
        &format!(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE '{}\\_o%'",
            schema.name()
        ),
    )
    .await;
    assert_eq!(schemas_before, 3);
    let report = host.delete_storage_id().await.unwrap();
    assert!(report.complete(), "{report:?}");
    assert_eq!(report.objects_deleted, 3);
    assert_eq!(
        count(&c, "SELECT count(*) FROM durability_objects").await,
        0
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM durability_object_fences").await,
        0
    );
    assert_eq!(
        count(
            &c,
            &format!(
                "SELECT count(*) FROM pg_namespace WHERE nspname LIKE '{}\\_o%'",
                schema.name()
            )
        )
        .await,
        0
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM durability_tombstones WHERE storage_id = 'st1' AND state = 'deleted'").await,
        1
    );
    assert!(store.tombstone(&storage).is_some());
    // Calls after the deletion, on an object that was there and on a new
    // one, are refused and record nothing.
    for name in ["d1", "never-seen"] {
        let refused = host
            .call::<Counter, _, _, _>("Counter", name, |h| async move { Ok(h.object.incr()?) })
            .await;
        assert!(refused.is_err(), "{name}: {refused:?}");
    }
    assert_eq!(
        count(&c, "SELECT count(*) FROM durability_objects").await,
        0
    );
    drop(host);
    // No host serves a tombstoned storage id again.
    let refused = start(&schema, "task-b").await.unwrap_err();
    assert!(
        matches!(refused, HostError::LifecycleRecord { ref found, .. } if found.contains("tombstoned")),
        "{refused}"
    );
    // Deleting an object that is gone is not an error.
    let gone = store
        .delete_object(
            &storage,
            &durability_host::store::ObjectKey {
                class: "Counter".to_owned(),
                name: "d1".to_owned(),
            },
        )
        .await
        .unwrap();
    assert!(!gone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_database_settings_are_refused_before_anything_is_written() {
    let lookup = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    assert_eq!(DatabaseSettings::from_lookup(lookup(&[])).unwrap(), None);
    let s =
        DatabaseSettings::from_lookup(lookup(&[("DO_DATABASE_URL", "postgres://u:secret@h/db")]))
            .unwrap()
            .unwrap();
    assert_eq!(s.schema(), "durability");
    assert!(
        !format!("{s:?}").contains("secret"),
        "the URL stays out of Debug"
    );
    let err =
        DatabaseSettings::from_lookup(lookup(&[("DO_DATABASE_URL", "/srv/objects")])).unwrap_err();
    assert_eq!(err.code(), "host_invalid_setting");
    assert!(err.to_string().contains("DO_DATABASE_URL"), "{err}");
    assert_eq!(s.commit_timeout_ms(), None, "the store's default");
    let timed = DatabaseSettings::from_lookup(lookup(&[
        ("DO_DATABASE_URL", "postgres://u@h/db"),
        ("DO_DATABASE_COMMIT_TIMEOUT_MS", "2500"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(timed.commit_timeout_ms(), Some(2500));
    for bad in ["0", "-1", "2s", ""] {
        let pairs: &'static [(&'static str, &'static str)] = Box::leak(Box::new([
            ("DO_DATABASE_URL", "postgres://u@h/db"),
            ("DO_DATABASE_COMMIT_TIMEOUT_MS", bad),
        ]));
        let err = DatabaseSettings::from_lookup(lookup(pairs)).unwrap_err();
        assert_eq!(err.code(), "host_invalid_setting", "{bad:?}");
        assert!(
            err.to_string().contains("DO_DATABASE_COMMIT_TIMEOUT_MS"),
            "{bad:?}: {err}"
        );
    }
    // A schema the stores refuse: no connection is made at all.
    let err = HostConfig::postgres(
        &DatabaseSettings::new("postgres://nobody@127.0.0.1:1/none", "Bad-Schema"),
        HostSettings::default(),
        ids("task-a"),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("DO_DATABASE_SCHEMA"), "{err}");
}

/// `incr_once` on object `name`: the counter's increment under `key`
/// (`durability_host::idempotency::once`), answering `{ "n": n }`.
async fn incr_once(
    host: &PgHost,
    name: &str,
    key: &durability_host::idempotency::IdempotencyKey,
) -> Result<serde_json::Value, HostError> {
    let key = key.clone();
    host.call::<Counter, _, _, _>("Counter", name, |h| async move {
        let v = h.scheduler.transaction(|tx| {
            durability_host::idempotency::once(tx, "incr_once", &key, |tx| {
                Ok(serde_json::json!({ "n": incr_in(tx)? }))
            })
        })?;
        Ok(v)
    })
    .await
}

/// [`incr_once`] on `z1`, which must answer: its `n`.
async fn n_once(host: &PgHost, key: &durability_host::idempotency::IdempotencyKey) -> i64 {
    incr_once(host, "z1", key).await.unwrap()["n"]
        .as_i64()
        .unwrap()
}

/// Prunes up to `limit` recorded keys of `z1`; how many.
async fn prune_keys(host: &PgHost, limit: u32) -> usize {
    host.call::<Counter, _, _, _>("Counter", "z1", |h| async move {
        Ok(h.scheduler
            .transaction(|tx| durability_host::idempotency::prune(tx, limit))?)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_on_postgres_run_a_call_once_keep_a_corrupt_result_to_its_key_and_prune() {
    use durability_host::idempotency::{IdempotencyKey, TABLE};
    let Some(schema) = TestSchema::create().await else {
        return;
    };
    assert_eq!(
        TABLE,
        durability_storage_postgres::object::IDEMPOTENCY_TABLE
    );
    assert_eq!(TABLE, durability_storage_sqlite::IDEMPOTENCY_TABLE);
    let host = start(&schema, "a").await.unwrap();
    let (k1, k2) = (
        IdempotencyKey::new("k-1").unwrap(),
        IdempotencyKey::new("k-2").unwrap(),
    );
    // One key, sent three times: it runs once, every answer the first.
    for _ in 0..3 {
        assert_eq!(n_once(&host, &k1).await, 1);
    }
    assert_eq!(n_once(&host, &k2).await, 2);
    assert_eq!(incr(&host, "z1").await, 3, "the counter moved once per key");
    // The keys are rows of the object's own schema.
    let c = client(&schema).await;
    let seq: i64 = c
        .query_one(
            "SELECT seq FROM durability_objects WHERE id = 'st1:Counter:z1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let own = format!("{}_o{seq}", schema.name());
    assert_eq!(
        count(&c, &format!("SELECT count(*) FROM {own}.{TABLE}")).await,
        2
    );
    // A corrupt recorded result is a typed error for its key only, and
    // changes nothing.
    c.execute(
        &format!("UPDATE {own}.{TABLE} SET result = 'not json' WHERE key = 'k-1'"),
        &[],
    )
    .await
    .unwrap();
    let e = incr_once(&host, "z1", &k1).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("recorded result of key k-1 is not JSON"),
        "{e}"
    );
    assert_eq!(n_once(&host, &k2).await, 2);
    assert_eq!(incr(&host, "z1").await, 4);
    // Pruning removes the keys; a key then runs again.
    assert_eq!(prune_keys(&host, 10).await, 2);
    assert_eq!(n_once(&host, &k2).await, 5);
    // Oldest first: with k-2 (n 5) then k-3 (n 6) recorded, pruning one
    // removes k-2's row.
    let k3 = IdempotencyKey::new("k-3").unwrap();
    assert_eq!(n_once(&host, &k3).await, 6);
    assert_eq!(prune_keys(&host, 1).await, 1);
    assert_eq!(n_once(&host, &k3).await, 6);
    assert_eq!(n_once(&host, &k2).await, 7);
    host.shutdown().await;
}
