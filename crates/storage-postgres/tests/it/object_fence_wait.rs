//! A stale owner's transaction that waits for the object row while a new
//! owner raises the fence is refused once it gets the row: the fence is
//! read after the row lock, never from a snapshot taken before the wait.
//! (Found by the process test `pg_export`: an owner's increment queued
//! behind its own transaction committed at generation 1 after an export
//! had fenced the object at generation 2.)

use std::time::Duration;

use durability_scheduler::{SchedulerTx, Storage, StorageErrorKind};
use durability_storage_postgres::object::PostgresObjectOptions;

use crate::object_fence::claim;
use crate::object_support::TestDeployment;

#[test]
fn a_transaction_that_waited_for_the_row_while_the_fence_rose_is_refused() {
    let Some(d) = TestDeployment::with_options(PostgresObjectOptions {
        lock_timeout: Duration::from_secs(60),
        ..PostgresObjectOptions::default()
    }) else {
        return;
    };
    let a = d.objects.open("shop-1").unwrap();
    a.fence(&claim("a", 1)).unwrap();
    a.transaction(|tx| tx.set_alarm(Some(10))).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (c, conn) = rt
        .block_on(tokio_postgres::connect(&d.url, tokio_postgres::NoTls))
        .unwrap();
    rt.spawn(conn);
    let s = &d.name;
    // The new owner holds the object row while it raises the fence.
    rt.block_on(c.batch_execute(&format!(
        "BEGIN; SELECT 1 FROM {s}.durability_objects WHERE id = 'shop-1' FOR UPDATE"
    )))
    .unwrap();
    let late = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| a.transaction(|tx| tx.set_alarm(Some(99))));
        // Until a's transaction waits for the row.
        let mut polls = 0;
        while rt
            .block_on(c.query_one(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'",
                &[],
            ))
            .unwrap()
            .get::<_, i64>(0)
            == 0
        {
            polls += 1;
            assert!(polls < 6_000, "a's transaction never waited for the row");
            std::thread::sleep(Duration::from_millis(10));
        }
        let b = claim("b", 2);
        let g = 2_i64;
        rt.block_on(c.execute(
            &format!(
                "INSERT INTO {s}.durability_object_fences (object_id, scope, generation, holder) \
                 VALUES ('shop-1', $1, $2, $3) ON CONFLICT (object_id, scope) DO UPDATE \
                 SET generation = EXCLUDED.generation, holder = EXCLUDED.holder"
            ),
            &[&b.scope().host_id(), &g, &b.encoded().as_bytes()],
        ))
        .unwrap();
        rt.block_on(c.batch_execute("COMMIT")).unwrap();
        waiting.join().unwrap()
    });
    let err = late.expect_err("a's late transaction commits past the raised fence");
    assert_eq!(err.kind(), StorageErrorKind::Fenced, "{err}");
    let b = d.objects.open("shop-1").unwrap();
    b.fence(&claim("b", 2)).unwrap();
    assert_eq!(
        b.transaction(|tx| tx.alarm()).unwrap(),
        Some(10),
        "nothing of the late transaction landed"
    );
}
