//! Round trips of an object transaction, as the waits its caller parked
//! in (`parked_waits`, feature `testkit`): the `BEGIN`, the object row lock
//! and the fence read go out when the transaction starts and are answered
//! with its first statement, so a fenced transaction of one statement waits
//! twice (that statement, and `COMMIT`), and the fence is still checked
//! inside the transaction, before anything the statement did can commit.

use durability_scheduler::{SchedulerTx, Storage, StorageError, StorageErrorKind};
use durability_storage_postgres::object::{PostgresObjectStorage, parked_waits};

use crate::object_fence::claim;
use crate::object_support::TestDeployment;

const INCR: &str = "INSERT INTO counter (id, n) VALUES (0, 1)
     ON CONFLICT (id) DO UPDATE SET n = counter.n + 1 RETURNING n";

fn incr(s: &PostgresObjectStorage) -> Result<i64, StorageError> {
    s.transaction(|tx| {
        tx.sql()
            .query_one(INCR, &[])?
            .try_get::<_, i64>(0)
            .map_err(|e| StorageError::backend("read n", e))
    })
}

#[test]
fn a_fenced_transaction_of_one_statement_waits_for_two_round_trips() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let s = d.objects.open("rt-1").unwrap();
    s.fence(&claim("a", 1)).unwrap();
    s.transaction(|tx| {
        tx.sql().batch_execute(
            "CREATE TABLE counter (id INT PRIMARY KEY CHECK (id = 0), n BIGINT NOT NULL)",
        )
    })
    .unwrap();
    // Statements are prepared once per connection: warm every pooled one.
    for _ in 0..16 {
        incr(&s).unwrap();
    }

    let before = parked_waits();
    assert_eq!(incr(&s).unwrap(), 17);
    assert_eq!(
        parked_waits() - before,
        2,
        "BEGIN, lock, fence read and the statement answered together; COMMIT"
    );

    // No statement: the begin is waited for before COMMIT.
    let before = parked_waits();
    s.transaction(|_| Ok::<_, StorageError>(())).unwrap();
    assert_eq!(parked_waits() - before, 2, "the begin; COMMIT");

    // A stale owner's statement went out with the begin, and ran; the
    // fence refuses it before its result is handed out, and it is rolled
    // back.
    let b = d.objects.open("rt-1").unwrap();
    b.fence(&claim("b", 2)).unwrap();
    let err = incr(&s).unwrap_err();
    assert_eq!(err.kind(), StorageErrorKind::Fenced, "{err}");
    assert_eq!(
        incr(&b).unwrap(),
        18,
        "the stale owner's increment did not land"
    );
}

#[test]
fn a_refused_begin_is_the_outcome_whatever_the_closure_makes_of_it() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let a = d.objects.open("shop-1").unwrap();
    a.fence(&claim("a", 1)).unwrap();
    a.transaction(|tx| tx.set_alarm(Some(10))).unwrap();
    let b = d.objects.open("shop-1").unwrap();
    b.fence(&claim("b", 2)).unwrap();
    // The stale owner's closure swallows its statement's error.
    let err = a
        .transaction(|tx| {
            let swallowed = tx.set_alarm(Some(99));
            assert_eq!(
                swallowed.as_ref().map_err(StorageError::kind),
                Err(StorageErrorKind::Fenced),
                "the statement waited for the fence's verdict"
            );
            Ok::<_, StorageError>(())
        })
        .unwrap_err();
    assert_eq!(err.kind(), StorageErrorKind::Fenced, "{err}");
    // Or fails with an error of its own, before any statement.
    let err = a
        .transaction(|_| {
            Err::<(), _>(StorageError::new(
                StorageErrorKind::Backend,
                "the closure's own",
            ))
        })
        .unwrap_err();
    assert_eq!(err.kind(), StorageErrorKind::Fenced, "{err}");
    assert_eq!(b.transaction(|tx| tx.alarm()).unwrap(), Some(10));
}
