//! The conformance suite for [`SemaphoreTx`] backends.
//!
//! The suite is a list of named cases ([`CASES`]). A backend's test file is
//! one [`semaphore_conformance!`](crate::semaphore_conformance) call with a
//! factory of fresh, empty storages (`impl Fn() -> S`); it emits one
//! `#[test]` per case. Each check panics with a message naming the broken
//! rule. The last case runs the whole semaphore on the backend.

use std::sync::Arc;

use durability_scheduler::{
    ManualClock, ObjectContext, ObjectId, Scheduler, SchemaTarget, Storage, StorageError, migrate,
};

use crate::decide::{Acquire, PoolConfig};
use crate::semaphore::{Acquired, Released, SCHEMA, Semaphore, SemaphoreConfig};
use crate::store::{Outcome, PoolRow, RequestRow, RequestState, SemaphoreTx};

/// The body of this crate's conformance macro (see `durability_scheduler`).
#[doc(hidden)]
pub use durability_scheduler::storage_suite;

/// The names of the suite's cases, in order (each runs on a fresh storage).
pub const CASES: &[&str] = crate::semaphore_conformance!(@cases names);

/// Runs the case `name` on a fresh storage from `make`.
///
/// # Panics
/// When the case fails (naming the broken rule), or when `name` is not in
/// [`CASES`].
pub fn run_case<S>(name: &str, make: impl Fn() -> S)
where
    S: Storage,
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    let s = make();
    if name == "semaphore_end_to_end" {
        return semaphore_end_to_end(s);
    }
    migrate(&s, SCHEMA, &SchemaTarget::Latest).expect("semaphore schema applies");
    match name {
        "ids_only_increase" => ids_only_increase(&s),
        "pool_round_trips" => pool_round_trips(&s),
        "request_states_round_trip" => request_states_round_trip(&s),
        "due_order_limit_and_pools" => due_order_limit_and_pools(&s),
        "queue_order_and_position" => queue_order_and_position(&s),
        "rollback_leaves_nothing" => rollback_leaves_nothing(&s),
        "quarantine_keeps_healthy_rows" => quarantine_keeps_healthy_rows(&s),
        other => panic!("no semaphore conformance case {other:?}"),
    }
}

/// Runs every case in order, each on a fresh storage from `make`.
///
/// # Panics
/// On the first broken rule, naming it.
pub fn run<S>(make: impl Fn() -> S)
where
    S: Storage,
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    for name in CASES {
        run_case(name, &make);
    }
}

fn tx<S: Storage, R>(s: &S, f: impl FnOnce(&mut S::Tx<'_>) -> Result<R, StorageError>) -> R {
    s.transaction(f).expect("transaction")
}

fn request(pool: &str, key: &str, id: u64, state: RequestState) -> RequestRow {
    RequestRow {
        pool: pool.to_owned(),
        key: key.to_owned(),
        id,
        holder: format!("shard-{id}"),
        count: id % 7 + 1,
        lease_ms: 1_000 + i64::try_from(id).unwrap_or(0),
        state,
    }
}

fn queued(pool: &str, key: &str, id: u64, deadline: i64) -> RequestRow {
    request(pool, key, id, RequestState::Queued { deadline })
}

fn ids_only_increase<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    let a = tx(s, |t| t.semaphore_next_id());
    let b = tx(s, |t| t.semaphore_next_id());
    assert!(a >= 1, "ids start at 1");
    assert!(b > a, "ids increase across transactions");
    let r: Result<(), StorageError> = s.transaction(|t| {
        t.semaphore_next_id()?;
        Err(StorageError::corrupt("roll back"))
    });
    assert!(r.is_err());
    let c = tx(s, |t| t.semaphore_next_id());
    assert!(c > b, "ids keep increasing after a rollback");
}

fn pool_round_trips<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    assert_eq!(tx(s, |t| t.semaphore_pool("p")), None, "no pool yet");
    let mut pool = PoolRow::new("p", 10, 3, 60_000);
    pool.held = 4;
    pool.queued = 2;
    pool.granted = 9;
    pool.used = 3;
    pool.released = 4;
    pool.expired = 1;
    pool.timed_out = 5;
    pool.cancelled = 6;
    tx(s, |t| t.semaphore_put_pool(&pool));
    assert_eq!(
        tx(s, |t| t.semaphore_pool("p")),
        Some(pool.clone()),
        "every field round-trips"
    );
    pool.capacity = 2;
    pool.held = 0;
    tx(s, |t| t.semaphore_put_pool(&pool));
    assert_eq!(
        tx(s, |t| t.semaphore_pool("p")),
        Some(pool),
        "a put replaces the row"
    );
    assert_eq!(tx(s, |t| t.semaphore_pool("q")), None, "pools are separate");
}

fn request_states_round_trip<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    let mut rows = vec![
        queued("p", "q", 1, 500),
        request(
            "p",
            "g",
            2,
            RequestState::Granted {
                lease_until: 700,
                used: 2,
            },
        ),
    ];
    for (i, outcome) in [
        Outcome::Released,
        Outcome::Expired,
        Outcome::TimedOut,
        Outcome::Cancelled,
    ]
    .into_iter()
    .enumerate()
    {
        let id = 3 + i as u64;
        let state = RequestState::Finished {
            outcome,
            forget_at: 900,
            was_granted: i % 2 == 0,
        };
        rows.push(request("p", &format!("f{i}"), id, state));
    }
    tx(s, |t| {
        rows.iter().try_for_each(|r| t.semaphore_put_request(r))
    });
    for r in &rows {
        assert_eq!(
            tx(s, |t| t.semaphore_request("p", &r.key)).as_ref(),
            Some(r),
            "{} by key",
            r.key
        );
        assert_eq!(
            tx(s, |t| t.semaphore_request_by_id(r.id)).as_ref(),
            Some(r),
            "{} by id",
            r.key
        );
    }
    let granted = request(
        "p",
        "q",
        1,
        RequestState::Granted {
            lease_until: 800,
            used: 0,
        },
    );
    tx(s, |t| t.semaphore_put_request(&granted));
    assert_eq!(
        tx(s, |t| t.semaphore_request("p", "q")),
        Some(granted),
        "a put replaces the key's row"
    );
    assert_eq!(
        tx(s, |t| t.semaphore_request("other", "q")),
        None,
        "keys are per pool"
    );
    assert!(tx(s, |t| t.semaphore_delete_request("p", "q")));
    assert!(
        !tx(s, |t| t.semaphore_delete_request("p", "q")),
        "a second delete finds nothing"
    );
    assert_eq!(tx(s, |t| t.semaphore_request_by_id(1)), None);
}

fn due_order_limit_and_pools<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    assert_eq!(
        tx(s, |t| t.semaphore_next_due()),
        None,
        "nothing due in an empty store"
    );
    let rows = [
        queued("a", "late", 1, 500),
        request(
            "a",
            "lease",
            3,
            RequestState::Granted {
                lease_until: 100,
                used: 0,
            },
        ),
        queued("a", "wait", 2, 100),
        request(
            "a",
            "gone",
            4,
            RequestState::Finished {
                outcome: Outcome::Released,
                forget_at: 50,
                was_granted: true,
            },
        ),
        queued("b", "other", 5, 20),
        queued("c", "later", 6, 1_000),
    ];
    tx(s, |t| {
        rows.iter().try_for_each(|r| t.semaphore_put_request(r))
    });
    let due: Vec<String> = tx(s, |t| t.semaphore_due("a", 100, 10))
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(
        due,
        ["gone", "wait", "lease"],
        "due order: time, then id; one pool only"
    );
    assert_eq!(
        tx(s, |t| t.semaphore_due("a", 1_000, 2)).len(),
        2,
        "limit bounds the page"
    );
    assert!(tx(s, |t| t.semaphore_due("a", 49, 10)).is_empty());
    assert_eq!(
        tx(s, |t| t.semaphore_due_pools(100, 10)),
        ["a", "b"],
        "distinct pools with a row due"
    );
    assert_eq!(
        tx(s, |t| t.semaphore_due_pools(100, 1)).len(),
        1,
        "limit bounds the pools"
    );
    assert_eq!(
        tx(s, |t| t.semaphore_next_due()),
        Some(20),
        "earliest over every pool"
    );
}

fn queue_order_and_position<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    let rows = [
        queued("p", "c", 30, 1),
        queued("p", "a", 10, 9),
        request(
            "p",
            "g",
            20,
            RequestState::Granted {
                lease_until: 5,
                used: 0,
            },
        ),
        queued("p", "b", 25, 5),
        queued("other", "x", 5, 1),
    ];
    tx(s, |t| {
        rows.iter().try_for_each(|r| t.semaphore_put_request(r))
    });
    let ids = |after, limit| -> Vec<u64> {
        tx(s, |t| t.semaphore_queue("p", after, limit))
            .into_iter()
            .map(|r| r.id)
            .collect()
    };
    assert_eq!(
        ids(0, 10),
        [10, 25, 30],
        "FIFO by id, queued rows of the pool only"
    );
    assert_eq!(ids(10, 1), [25], "after and limit page through the queue");
    assert_eq!(ids(30, 10), Vec::<u64>::new());
    assert_eq!(
        tx(s, |t| t.semaphore_queued_before("p", 30)),
        2,
        "two wait ahead of 30"
    );
    assert_eq!(tx(s, |t| t.semaphore_queued_before("p", 10)), 0, "the head");
}

fn rollback_leaves_nothing<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    let r: Result<(), StorageError> = s.transaction(|t| {
        t.semaphore_put_pool(&PoolRow::new("r", 1, 1, 1))?;
        t.semaphore_put_request(&queued("r", "k", 1, 1))?;
        Err(StorageError::corrupt("roll back"))
    });
    assert!(r.is_err());
    assert_eq!(
        tx(s, |t| t.semaphore_pool("r")),
        None,
        "a rolled-back pool is gone"
    );
    assert_eq!(
        tx(s, |t| t.semaphore_request("r", "k")),
        None,
        "a rolled-back request is gone"
    );
}

fn quarantine_keeps_healthy_rows<S: Storage>(s: &S)
where
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    let rows = [
        queued("p", "a", 1, 10),
        request(
            "p",
            "b",
            2,
            RequestState::Granted {
                lease_until: 5,
                used: 1,
            },
        ),
    ];
    tx(s, |t| {
        rows.iter().try_for_each(|r| t.semaphore_put_request(r))
    });
    assert!(
        tx(s, |t| t.semaphore_quarantine("p", 100)).is_empty(),
        "healthy rows are not corrupt"
    );
    for r in &rows {
        assert_eq!(
            tx(s, |t| t.semaphore_request("p", &r.key)).as_ref(),
            Some(r),
            "{} stays",
            r.key
        );
    }
}

/// The semaphore itself on the backend: grant, queue, FIFO hand-over on
/// release, expiry at the lease deadline through the alarm, a retried key.
fn semaphore_end_to_end<S>(s: S)
where
    S: Storage,
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    let clock = ManualClock::new(1_000);
    let id = ObjectId::new("holder").expect("object id");
    let ctx = ObjectContext::with_clock(id, Arc::new(s), Arc::new(clock.clone()));
    let scheduler = Scheduler::new(ctx).expect("scheduler");
    let sem = Semaphore::attach(&scheduler, SemaphoreConfig::default()).expect("attach");
    let run = |f: &dyn Fn(
        &mut durability_scheduler::Transaction<'_, '_, S>,
    ) -> Result<Acquired, crate::SemaphoreError>| {
        scheduler.transaction(|t| f(t)).expect("semaphore call")
    };
    scheduler
        .transaction(|t| sem.configure(t, "p", PoolConfig::new(2)))
        .expect("configure");
    let a = Acquire::new("p", "a", "s1", 2).lease_ms(100);
    let Acquired::Granted(first) = run(&|t| sem.acquire(t, &a)) else {
        panic!("the first request is granted");
    };
    assert_eq!(first.lease_until, 1_100, "lease on the holder's clock");
    assert_eq!(
        scheduler.alarm_at(),
        Some(1_100),
        "the alarm follows the lease"
    );
    let b = Acquire::new("p", "b", "s2", 1).lease_ms(100).wait_ms(1_000);
    let c = Acquire::new("p", "c", "s3", 1).lease_ms(100).wait_ms(1_000);
    assert!(matches!(
        run(&|t| sem.acquire(t, &b)),
        Acquired::Queued { position: 1, .. }
    ));
    assert!(matches!(
        run(&|t| sem.acquire(t, &c)),
        Acquired::Queued { position: 2, .. }
    ));
    assert_eq!(
        run(&|t| sem.acquire(t, &a)),
        Acquired::Granted(first.clone()),
        "a retry gets the same grant"
    );
    let released = scheduler
        .transaction(|t| sem.release(t, "s1", first.id))
        .expect("release");
    assert_eq!(released, Released::Now(Outcome::Released));
    let Acquired::Granted(gb) = run(&|t| sem.acquire(t, &b)) else {
        panic!("the head was granted on release");
    };
    assert!(
        matches!(run(&|t| sem.acquire(t, &c)), Acquired::Granted(_)),
        "FIFO: both fit"
    );
    clock.advance(100);
    run_alarm(&scheduler).expect("the alarm handler runs");
    let pool = scheduler.transaction(|t| sem.pool(t, "p")).expect("pool");
    assert_eq!(
        (pool.held, pool.granted, pool.released, pool.expired),
        (0, 4, 2, 2),
        "leases expired through the alarm"
    );
    assert_eq!(
        run(&|t| sem.acquire(t, &a)),
        Acquired::Finished {
            id: first.id,
            outcome: Outcome::Released
        },
        "never granted twice"
    );
    let renew = scheduler
        .transaction(|t| sem.renew(t, "s2", gb.id))
        .expect_err("expired");
    assert_eq!(renew.code(), "SEMAPHORE_FINISHED");
}

/// Runs the object's alarm handler once and returns what it returned. The
/// semaphore's work is synchronous, so the handler is ready on its first
/// poll.
///
/// # Errors
/// The handler's error (a storage failure reading the due times).
///
/// # Panics
/// When the handler is not ready at once.
pub fn run_alarm<S: Storage>(
    scheduler: &Scheduler<S>,
) -> Result<Option<i64>, durability_scheduler::SchedulerError> {
    use std::future::Future as _;
    use std::task::{Context, Poll, Waker};
    let mut alarm = std::pin::pin!(scheduler.alarm());
    match alarm.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(result) => result,
        Poll::Pending => panic!("the semaphore's alarm work is synchronous"),
    }
}

/// A scheduler test storage with the semaphore schema registered: the
/// in-memory implementation of [`SemaphoreTx`].
pub fn memory_storage() -> durability_scheduler::testkit::MemoryStorage {
    durability_scheduler::testkit::MemoryStorage::new().with_schema(SCHEMA, crate::SCHEMA_STEPS)
}

/// Emits one `#[test]` per case of the semaphore conformance suite
/// ([`conformance::CASES`](crate::conformance::CASES)), in a module named
/// `$module`, each running the case on fresh storages from the factory
/// `$make` (an expression evaluated in each test, inside the new module,
/// which sees the caller's items through `use super::*`).
///
/// ```text
/// durability_semaphore::semaphore_conformance!(on_memory, durability_semaphore::conformance::memory_storage);
/// ```
#[macro_export]
macro_rules! semaphore_conformance {
    ($($args:tt)*) => {
        $crate::conformance::storage_suite! { $crate::conformance::run_case, [
            ids_only_increase
            pool_round_trips
            request_states_round_trip
            due_order_limit_and_pools
            queue_order_and_position
            rollback_leaves_nothing
            quarantine_keeps_healthy_rows
            semaphore_end_to_end
        ], $($args)* }
    };
}
