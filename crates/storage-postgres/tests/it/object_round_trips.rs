//! Round trips of an object transaction, as the waits its caller parked
//! in (`parked_waits`, feature `testkit`): the `BEGIN`, the object row lock
//! and the fence read go out when the transaction starts and are answered
//! with its first statement, so a fenced transaction of one statement waits
//! twice (that statement, and `COMMIT`), and the fence is still checked
//! inside the transaction, before anything the statement did can commit.

use durability_scheduler::{SchedulerTx, Storage, StorageError, StorageErrorKind};
use durability_storage_postgres::object::{PostgresObjectStorage, handed_off_waits, parked_waits};

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

/// The object `id`, fenced, with its counter table at 16, every pooled
/// connection warm (statements are prepared once per connection).
fn counter(d: &TestDeployment, id: &str) -> PostgresObjectStorage {
    let s = d.objects.open(id).unwrap();
    s.fence(&claim("a", 1)).unwrap();
    s.transaction(|tx| {
        tx.sql().batch_execute(
            "CREATE TABLE counter (id INT PRIMARY KEY CHECK (id = 0), n BIGINT NOT NULL)",
        )
    })
    .unwrap();
    for _ in 0..16 {
        incr(&s).unwrap();
    }
    s
}

#[test]
fn a_fenced_transaction_of_one_statement_waits_for_two_round_trips() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let s = counter(&d, "rt-1");

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

/// `f`'s value, and the waits and hand-offs it made on this thread.
fn counted<T>(f: impl FnOnce() -> T) -> (T, u64, u64) {
    let (waits, handed) = (parked_waits(), handed_off_waits());
    let out = f();
    (out, parked_waits() - waits, handed_off_waits() - handed)
}

/// A caller that may drive the connections' runtime (a plain thread, a
/// task of a multi-thread runtime, inside `block_in_place`) waits for
/// both round trips on its own thread; a task of a current-thread runtime
/// cannot, and is answered by the background thread.
#[test]
fn a_transaction_drives_its_connection_unless_its_thread_cannot() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let s = std::sync::Arc::new(counter(&d, "rt-drive"));

    let (n, waits, handed) = counted(|| incr(&s).unwrap());
    assert_eq!((n, waits, handed), (17, 2, 0), "a plain thread drives");

    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let on_worker = std::sync::Arc::clone(&s);
    let (n, waits, handed) = multi
        .block_on(multi.spawn(async move { counted(|| incr(&on_worker).unwrap()) }))
        .unwrap();
    assert_eq!(
        (n, waits, handed),
        (18, 2, 0),
        "a multi-thread worker drives"
    );

    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Every wait that waited is the background thread's; how many waited
    // is timing (that thread may have read a reply before the caller
    // looked), so only the driving cases above count exactly 2.
    let (n, waits, handed) = current.block_on(async { counted(|| incr(&s).unwrap()) });
    assert_eq!(n, 19);
    assert!(
        waits <= 2 && handed == waits,
        "a current-thread runtime's task is answered by the background thread: \
         {waits} waits, {handed} handed off"
    );
}

/// A caller paused inside its transaction, between two waits, drives
/// nothing meanwhile: a caller that cannot drive still gets its answers
/// (from the background thread), and the paused one then commits.
#[test]
fn a_paused_driver_does_not_starve_a_caller_that_cannot_drive() {
    let Some(d) = TestDeployment::create() else {
        return;
    };
    let (a, b) = (
        d.objects.open("rt-a").unwrap(),
        d.objects.open("rt-b").unwrap(),
    );
    let (paused_tx, paused) = std::sync::mpsc::channel();
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        let a = &a;
        let driver = scope.spawn(move || {
            a.transaction(|tx| {
                tx.set_alarm(Some(10))?;
                paused_tx.send(()).unwrap();
                done.recv().unwrap();
                tx.set_alarm(Some(20))
            })
        });
        paused.recv().unwrap();
        let current = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (set, _, handed) =
            current.block_on(async { counted(|| b.transaction(|tx| tx.set_alarm(Some(30)))) });
        set.unwrap();
        assert!(handed > 0, "the background thread answered");
        done_tx.send(()).unwrap();
        driver.join().unwrap().unwrap();
    });
    assert_eq!(a.transaction(|tx| tx.alarm()).unwrap(), Some(20));
    assert_eq!(b.transaction(|tx| tx.alarm()).unwrap(), Some(30));
}
