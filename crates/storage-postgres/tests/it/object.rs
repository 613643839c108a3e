//! PostgreSQL object storage: every object-level conformance suite
//! (scheduler, outbox, alarms object side, topology), the application's own
//! tables, failures and hostile names.

use durability_scheduler::{
    ObjectContext, ObjectId, Scheduler, SchedulerTx, Storage, StorageError, StorageErrorKind,
};
use durability_storage_postgres::object::{
    PostgresObjectOptions, PostgresObjectStorage, PostgresObjects,
};

use crate::object_support::TestDeployment;

/// One test per object-level conformance suite: every case of `$cases`
/// run by `$run` on a fresh object of one deployment.
macro_rules! conformance_on_postgres {
    ($($name:ident: $cases:expr, $run:path;)*) => {$(
        #[test]
        fn $name() {
            let Some(d) = TestDeployment::create() else {
                return;
            };
            for case in $cases {
                $run(case, || d.fresh());
            }
            eprintln!("{}: {} cases", stringify!($name), $cases.len());
        }
    )*};
}

conformance_on_postgres! {
    scheduler_conformance_on_postgres:
        durability_scheduler::conformance::CASES, durability_scheduler::conformance::run_case;
    outbox_conformance_on_postgres:
        durability_outbox::conformance::CASES, durability_outbox::conformance::run_case;
    alarm_rows_conformance_on_postgres:
        durability_alarms::conformance::TX_CASES, durability_alarms::conformance::run_tx_case;
    topology_conformance_on_postgres:
        durability_topology::conformance::TX_CASES, durability_topology::conformance::run_tx_case;
}

/// Object `id` of `d` and a scheduler on it (system clock).
fn scheduler_on(
    d: &TestDeployment,
    id: &str,
) -> (
    std::sync::Arc<PostgresObjectStorage>,
    Scheduler<PostgresObjectStorage>,
) {
    let storage = std::sync::Arc::new(d.objects.open(id).unwrap());
    let ctx = ObjectContext::new(ObjectId::new(id).unwrap(), storage.clone());
    (storage, Scheduler::new(ctx).unwrap())
}

fn kind<T: std::fmt::Debug>(r: Result<T, StorageError>) -> StorageErrorKind {
    r.expect_err("the transaction fails").kind()
}

fn orders(s: &PostgresObjectStorage) -> i64 {
    s.transaction(|tx| {
        tx.sql()
            .query_one("SELECT count(*) FROM orders", &[])?
            .try_get::<_, i64>(0)
            .map_err(|e| StorageError::backend("count", e))
    })
    .unwrap()
}

#[test]
fn own_tables_commit_and_roll_back_with_the_capability_rows() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let (storage, scheduler) = scheduler_on(&d, "shop-1");
    scheduler
        .transaction(|tx| {
            tx.sql()
                .batch_execute("CREATE TABLE orders (id BIGINT PRIMARY KEY)")?;
            tx.sql()
                .execute("INSERT INTO orders (id) VALUES ($1)", &[&7_i64])?;
            tx.set_due("reports", Some(60_000))
        })
        .unwrap();
    assert_eq!(scheduler.alarm_at(), Some(60_000));
    let failed = scheduler.transaction(|tx| {
        tx.sql()
            .execute("INSERT INTO orders (id) VALUES ($1)", &[&8_i64])?;
        tx.set_due("reports", Some(1_000))?;
        Err::<(), _>(StorageError::corrupt("the application gave up"))
    });
    assert!(failed.is_err());
    assert_eq!(
        orders(&storage),
        1,
        "the failed transaction's row was rolled back"
    );
    assert_eq!(
        scheduler.alarm_at(),
        Some(60_000),
        "and so was its alarm move"
    );
    // Another object's `orders` is its own table.
    let other = d.objects.open("shop-2").unwrap();
    other
        .transaction(|tx| {
            tx.sql()
                .batch_execute("CREATE TABLE orders (id TEXT PRIMARY KEY, note TEXT)")
        })
        .unwrap();
    assert_eq!(orders(&other), 0);
    assert_eq!(orders(&storage), 1);
}

#[test]
fn a_swallowed_statement_error_never_reports_a_commit() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let s = d.fresh();
    s.transaction(|tx| {
        tx.sql()
            .batch_execute("CREATE TABLE orders (id BIGINT PRIMARY KEY)")
    })
    .unwrap();
    let r = s.transaction(|tx| {
        tx.set_alarm(Some(5))?;
        tx.sql()
            .execute("INSERT INTO orders (id) VALUES ($1)", &[&1_i64])?;
        // A duplicate key aborts the PostgreSQL transaction; the closure
        // ignores the error and returns Ok.
        let _ = tx
            .sql()
            .execute("INSERT INTO orders (id) VALUES ($1)", &[&1_i64]);
        Ok::<_, StorageError>(())
    });
    assert_eq!(kind(r), StorageErrorKind::Backend);
    assert_eq!(orders(&s), 0, "nothing of the aborted transaction landed");
    assert_eq!(s.transaction(|tx| tx.alarm()).unwrap(), None);
}

#[test]
fn hostile_deployment_names_are_refused_before_anything_is_written() {
    let url = durability_storage_postgres::testkit::url();
    if crate::object_support::available(&url).is_none() {
        return;
    }
    let hostile = [
        "x; DROP SCHEMA public CASCADE; --",
        "a\"b",
        "Robert'); DROP TABLE students;--",
        "UpperCase",
        "pg_catalog",
        "",
        "1starts_with_digit",
        "has space",
        &"x".repeat(41),
    ];
    for name in hostile {
        let err =
            PostgresObjects::connect(&url, name, PostgresObjectOptions::default()).expect_err(name);
        assert_eq!(err.kind(), StorageErrorKind::Backend, "{name}: {err}");
        assert!(PostgresObjects::install_sql(name).is_err(), "{name}");
    }
    // The printable install SQL names the schema quoted.
    let sql = PostgresObjects::install_sql("shop_objects").unwrap();
    assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"shop_objects\".durability_objects"));
}

#[test]
fn hostile_object_ids_are_plain_data_and_nul_or_overlong_ids_are_refused() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let ids = [
        "'; DROP TABLE orders; --",
        "\"quoted\"",
        "ünï/cödé $1 %s",
        "line\nbreak\ttab",
    ];
    for (i, id) in ids.iter().enumerate() {
        let s = d.objects.open(id).unwrap();
        let at = i64::try_from(i).unwrap() + 1;
        s.transaction(|tx| tx.set_alarm(Some(at))).unwrap();
    }
    for (i, id) in ids.iter().enumerate() {
        let s = d.objects.open(id).unwrap();
        let at = i64::try_from(i).unwrap() + 1;
        assert_eq!(s.transaction(|tx| tx.alarm()).unwrap(), Some(at), "{id}");
    }
    assert_eq!(d.objects.object_count().unwrap(), 4);
    for bad in [
        "",
        "a\u{0}b",
        &"x".repeat(durability_scheduler::MAX_OBJECT_ID_BYTES + 1),
    ] {
        assert!(d.objects.open(bad).is_err(), "{bad:?} is refused");
    }
    assert_eq!(d.objects.object_count().unwrap(), 4, "nothing was recorded");
}

#[test]
fn two_handles_on_one_object_serialise_their_writers() {
    let Some(d) = TestDeployment::with_options(PostgresObjectOptions {
        lock_timeout: std::time::Duration::from_millis(50),
        ..PostgresObjectOptions::default()
    }) else {
        return;
    };
    let id = "shared-object";
    let a = d.objects.open(id).unwrap();
    let b = d.objects.open(id).unwrap();
    let (inside_tx, inside_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let a = &a;
        scope.spawn(move || {
            a.transaction(|tx| {
                tx.set_alarm(Some(1))?;
                inside_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                Ok::<_, StorageError>(())
            })
            .unwrap();
        });
        inside_rx.recv().unwrap();
        // B waits for the object row, past its lock timeout: a retryable
        // backend failure, nothing written.
        let err = b.transaction(|tx| tx.set_alarm(Some(2))).unwrap_err();
        assert_eq!(err.kind(), StorageErrorKind::Backend, "{err}");
        go_tx.send(()).unwrap();
    });
    assert_eq!(b.transaction(|tx| tx.alarm()).unwrap(), Some(1));
    b.transaction(|tx| tx.set_alarm(Some(2))).unwrap();
    assert_eq!(a.transaction(|tx| tx.alarm()).unwrap(), Some(2));
}

#[test]
fn a_connection_lost_at_commit_is_an_unknown_outcome() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let s = d.fresh();
    let url = d.url.clone();
    let r = s.transaction(|tx| {
        tx.set_alarm(Some(77))?;
        let pid: i32 = tx
            .sql()
            .query_one("SELECT pg_backend_pid()", &[])?
            .try_get(0)
            .map_err(|e| StorageError::backend("pid", e))?;
        // The connection dies between the last statement and COMMIT.
        crate::object_support::run_sql(&url, &format!("SELECT pg_terminate_backend({pid}, 5000)"))
            .unwrap();
        Ok::<_, StorageError>(())
    });
    assert_eq!(
        kind(r),
        StorageErrorKind::Unknown,
        "never a definite failure"
    );
    // The server rolled it back; the storage works on a fresh connection.
    assert_eq!(s.transaction(|tx| tx.alarm()).unwrap(), None);
    s.transaction(|tx| tx.set_alarm(Some(78))).unwrap();
    assert_eq!(s.transaction(|tx| tx.alarm()).unwrap(), Some(78));
}

#[tokio::test(flavor = "current_thread")]
async fn transactions_work_from_a_current_thread_runtime() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let s = d.fresh();
    // The connection is driven on the deployment's own thread: blocking
    // this runtime's only thread cannot deadlock.
    s.transaction(|tx| tx.set_alarm(Some(3))).unwrap();
    let ticker = tokio::spawn(async { 1 });
    assert_eq!(s.transaction(|tx| tx.alarm()).unwrap(), Some(3));
    assert_eq!(ticker.await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_transaction_on_a_worker_leaves_the_runtime_free() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let s = std::sync::Arc::new(d.fresh());
    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let s2 = s.clone();
    // The one worker runs a transaction that waits; with block_in_place
    // another task still runs on the runtime meanwhile.
    let held = tokio::spawn(async move {
        s2.transaction(|tx| {
            tx.set_alarm(Some(9))?;
            inside_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            Ok::<_, StorageError>(())
        })
    });
    inside_rx.await.unwrap();
    let other = tokio::spawn(async { 41 + 1 }).await.unwrap();
    assert_eq!(other, 42);
    go_tx.send(()).unwrap();
    held.await.unwrap().unwrap();
    assert_eq!(s.transaction(|tx| tx.alarm()).unwrap(), Some(9));
}

/// A second transaction, or a fence claim, on one storage handle waits for
/// the handle's transaction in progress without keeping a tokio worker:
/// the runtime's only worker stays free for other tasks meanwhile. (Before
/// the fix the waiter blocked on the handle's lock on the worker itself,
/// with the worker's queue held: any task the running transaction needed,
/// such as a proxy to the server on the same runtime, never ran again.)
#[test]
fn a_waiter_behind_a_transaction_of_the_same_handle_leaves_the_runtime_free() {
    type Waiter = fn(&PostgresObjectStorage) -> Result<(), StorageError>;
    let waiters: [(&str, Waiter); 2] = [
        ("a transaction", |s| {
            s.transaction(|tx| tx.set_alarm(Some(2)))
        }),
        ("a fence claim", |s| {
            s.fence(&crate::object_fence::claim("a", 1))
        }),
    ];
    let Some(d) = TestDeployment::create() else {
        return;
    };
    for (what, waiter) in waiters {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let s = std::sync::Arc::new(d.fresh());
        let (inside_tx, inside_rx) = std::sync::mpsc::channel::<()>();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let held = rt.spawn({
            let s = s.clone();
            async move {
                s.transaction(|tx| {
                    tx.set_alarm(Some(1))?;
                    inside_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    Ok::<_, StorageError>(())
                })
            }
        });
        inside_rx.recv().unwrap();
        // Queued first, so the worker picks the waiter before the probe.
        let queued = rt.spawn({
            let s = s.clone();
            async move { waiter(&s) }
        });
        let (ran_tx, ran_rx) = std::sync::mpsc::channel();
        rt.spawn(async move { ran_tx.send(()).unwrap() });
        // Bounded, so a blocked worker fails the test instead of hanging it.
        let ran = ran_rx.recv_timeout(std::time::Duration::from_secs(20));
        go_tx.send(()).unwrap();
        rt.block_on(held).unwrap().unwrap();
        rt.block_on(queued).unwrap().unwrap();
        assert!(
            ran.is_ok(),
            "{what} waiting for the handle blocked the runtime's only worker"
        );
    }
}

/// A sink that acknowledges everything and remembers the keys.
#[derive(Clone, Default)]
struct Keys(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl durability_outbox::Sink<String> for Keys {
    async fn publish(
        &self,
        batch: &[durability_outbox::Entry<String>],
    ) -> Result<(), durability_outbox::SinkError> {
        let mut keys = self.0.lock().unwrap();
        keys.extend(batch.iter().map(|e| e.key().to_owned()));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_outbox_row_is_quarantined_without_blocking_and_stays_deletable() {
    use durability_outbox::{ChannelConfig, Outbox};
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let (_storage, sched) = scheduler_on(&d, "corrupt");
    let sink = Keys::default();
    let outbox = Outbox::attach(&sched, ChannelConfig::new("c"), sink.clone()).unwrap();
    sched
        .transaction(|tx| outbox.stage(tx, "healthy", &"v".to_owned()))
        .unwrap();
    // A row whose version is out of range, written behind the storage's back.
    crate::object_support::run_sql(
        &d.url,
        &format!(
            "INSERT INTO {}.durability_object_outbox
               (object_id, channel, key, value, version, attempt, due_at)
             VALUES ('corrupt', 'c', 'broken', '\\x00', -4, 0, 0)",
            d.name
        ),
    )
    .unwrap();
    let report = outbox.deliver_due().await.unwrap();
    assert_eq!(report.quarantined.len(), 1, "{report:?}");
    assert_eq!(
        *sink.0.lock().unwrap(),
        ["healthy"],
        "the healthy entry was delivered"
    );
    assert!(outbox.is_empty().unwrap());
    assert_eq!(outbox.quarantined().unwrap(), 1);
    assert_eq!(outbox.purge_quarantined().unwrap(), 1);
    assert_eq!(
        outbox.quarantined().unwrap(),
        0,
        "the quarantined row is deleted"
    );
}

#[test]
fn the_own_schema_is_created_by_the_first_transaction_that_uses_it() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let observer = d.objects.open("observer").unwrap();
    let exists = |schema: &str| -> bool {
        let name = schema.trim_matches('"').to_owned();
        observer
            .transaction(|tx| {
                tx.sql()
                    .query_one(
                        "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
                        &[&name],
                    )?
                    .try_get::<_, i64>(0)
                    .map_err(|e| StorageError::backend("count", e))
            })
            .unwrap()
            == 1
    };
    let s = d.objects.open("lazy").unwrap();
    s.transaction(|tx| tx.set_alarm(Some(1))).unwrap();
    assert!(
        !exists(s.own_schema()),
        "capability rows need no schema of its own"
    );
    let r = s.transaction(|tx| {
        tx.sql().batch_execute("CREATE TABLE t (id BIGINT)")?;
        Err::<(), _>(StorageError::corrupt("give up"))
    });
    assert!(r.is_err());
    assert!(
        !exists(s.own_schema()),
        "a rolled-back first use leaves nothing"
    );
    s.transaction(|tx| tx.sql().batch_execute("CREATE TABLE t (id BIGINT)"))
        .unwrap();
    assert!(exists(s.own_schema()));
    // Another handle on the object finds it.
    let again = d.objects.open("lazy").unwrap();
    again
        .transaction(|tx| tx.sql().execute("INSERT INTO t (id) VALUES (1)", &[]))
        .unwrap();
}

#[test]
fn a_transaction_inside_another_executor_s_task_works() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let s = d.fresh();
    // A transaction called from a future that the `futures` executor
    // drives (as an async outbox delivery driven without tokio would).
    let got = futures::executor::block_on(async {
        s.transaction(|tx| tx.set_alarm(Some(4)))?;
        s.transaction(|tx| tx.alarm())
    })
    .unwrap();
    assert_eq!(got, Some(4));
}

#[test]
fn objects_and_storages_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<PostgresObjects>();
    check::<PostgresObjectStorage>();
}

/// A session ended while it commits answers the COMMIT with a FATAL error
/// instead of its outcome (after the commit record, PostgreSQL still sends
/// FATAL when it was asked to terminate): that is in doubt, never a
/// definite refusal. Here a deferred trigger ends its own session inside
/// the COMMIT.
#[test]
fn a_fatal_reply_to_commit_is_an_unknown_outcome() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let s = d.fresh();
    s.transaction(|tx| {
        tx.sql().batch_execute(
            "CREATE FUNCTION die() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END $$;
             CREATE TABLE doomed (id BIGINT);
             CREATE CONSTRAINT TRIGGER die_at_commit AFTER INSERT ON doomed
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION die();",
        )
    })
    .unwrap();
    let r = s.transaction(|tx| {
        tx.sql()
            .execute("INSERT INTO doomed (id) VALUES (1)", &[])?;
        tx.set_alarm(Some(5))
    });
    assert_eq!(
        kind(r),
        StorageErrorKind::Unknown,
        "a FATAL reply is in doubt"
    );
    assert_eq!(s.transaction(|tx| tx.alarm()).unwrap(), None);
}

/// A first record of an object and a storage id's tombstone are ordered by
/// the tombstone lock: once the tombstone is written, no object of that
/// storage id is recorded any more, while objects recorded before it (and
/// other storage ids) still open. Raced from several threads: every object
/// a deletion lists after the tombstone and deletes stays deleted, and no
/// object is recorded after it.
#[test]
fn no_object_is_recorded_under_a_storage_id_after_its_tombstone() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let objects = &d.objects;
    let before = objects
        .open_unless_tombstoned("st1:C:before", "st1")
        .unwrap();
    assert!(before.is_some(), "no tombstone yet");
    objects.write_tombstone("st1", "lc1", "deleting").unwrap();
    assert!(
        objects
            .open_unless_tombstoned("st1:C:after", "st1")
            .unwrap()
            .is_none(),
        "a first record after the tombstone is refused"
    );
    assert!(
        objects
            .open_unless_tombstoned("st1:C:before", "st1")
            .unwrap()
            .is_some(),
        "an object recorded before the tombstone still opens (its deletion fences it)"
    );
    assert!(
        objects
            .open_unless_tombstoned("st2:C:x", "st2")
            .unwrap()
            .is_some()
    );
    let (listed, _) = objects.list_objects("st1:", None, 100).unwrap();
    assert_eq!(
        listed,
        vec!["st1:C:before".to_owned()],
        "nothing else was recorded"
    );

    // The race: openers record new objects of st3 until they are refused;
    // the deletion writes the tombstone, lists and deletes what it finds.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let recorded = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (stop, recorded) = (&stop, &recorded);
            scope.spawn(move || {
                for i in 0.. {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    match objects.open_unless_tombstoned(&format!("st3:C:o{t}-{i}"), "st3") {
                        Ok(Some(_)) => {
                            recorded.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        Ok(None) => break,
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
        while recorded.load(std::sync::atomic::Ordering::SeqCst) < 20 {
            std::thread::yield_now();
        }
        objects.write_tombstone("st3", "lc3", "deleting").unwrap();
        let (listed, more) = objects.list_objects("st3:", None, 100_000).unwrap();
        assert!(!more);
        for id in &listed {
            objects.delete_object(id).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        eprintln!(
            "{} objects recorded before the tombstone, deleted",
            listed.len()
        );
    });
    let (left, _) = objects.list_objects("st3:", None, 100).unwrap();
    assert!(
        left.is_empty(),
        "recorded after the deletion listed: {left:?}"
    );
}

/// A host joining a running deployment connects while object transactions
/// hold their tables: the install runs no DDL on an installed deployment,
/// so it neither waits behind them nor deadlocks with them (it did: `CREATE
/// INDEX IF NOT EXISTS` locks its table even when the index exists, and a
/// joining host in the orders example failed with SQLSTATE 40P01).
#[test]
fn connecting_to_an_installed_deployment_takes_no_lock_live_transactions_hold() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let s = d.fresh();
    let (url, name) = (d.url.clone(), d.name.clone());
    s.transaction(|tx| {
        // This transaction now holds its writes' locks on the due table.
        tx.set_capability_due("conformance", Some(77))?;
        let (done, joined) = std::sync::mpsc::channel();
        let (url, name) = (url.clone(), name.clone());
        std::thread::spawn(move || {
            let r =
                PostgresObjects::connect(&url, &name, PostgresObjectOptions::default()).map(|_| ());
            let _ = done.send(r);
        });
        // Before the fix the connect waited for this transaction, which
        // waits for it: it never finished while the transaction was open.
        let joined = joined
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the joining connect waited behind a live transaction");
        joined.expect("connect");
        Ok::<_, StorageError>(())
    })
    .unwrap();
    assert_eq!(
        s.transaction(|tx| tx.capability_due("conformance"))
            .unwrap(),
        Some(77)
    );
}
