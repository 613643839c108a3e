//! Unit tests of the semaphore on the in-memory store: error codes,
//! refusals that write nothing, the policies, and a model-based property
//! test of one pool.

#![allow(clippy::unwrap_used)]

mod model;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use durability_scheduler::testkit::MemoryStorage;
use durability_scheduler::{ManualClock, ObjectContext, ObjectId, Scheduler, Storage};

use crate::conformance::memory_storage;
use crate::{
    Acquire, Acquired, EventKind, Outcome, PoolConfig, PoolRow, Released, RequestRow, Semaphore,
    SemaphoreConfig, SemaphoreError, SemaphoreEvent, SemaphoreTx,
};

crate::semaphore_conformance!(conformance_on_memory, memory_storage);

/// A holder object on the memory store with a manual clock, recording events.
pub(crate) struct Holder {
    pub(crate) clock: ManualClock,
    pub(crate) scheduler: Scheduler<MemoryStorage>,
    pub(crate) sem: Semaphore<MemoryStorage>,
    pub(crate) events: Arc<Mutex<Vec<SemaphoreEvent>>>,
}

impl Holder {
    pub(crate) fn new(pool: Option<PoolConfig>) -> Self {
        let clock = ManualClock::new(1_000);
        let ctx = ObjectContext::with_clock(
            ObjectId::new("holder").unwrap(),
            Arc::new(memory_storage()),
            Arc::new(clock.clone()),
        );
        let scheduler = Scheduler::new(ctx).unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&events);
        let config =
            SemaphoreConfig::default().on_event(move |e| log.lock().unwrap().push(e.clone()));
        let sem = Semaphore::attach(&scheduler, config).unwrap();
        let holder = Self {
            clock,
            scheduler,
            sem,
            events,
        };
        if let Some(config) = pool {
            holder.configure(config).unwrap();
        }
        holder
    }

    pub(crate) fn configure(&self, config: PoolConfig) -> Result<PoolRow, SemaphoreError> {
        self.scheduler
            .transaction(|tx| self.sem.configure(tx, "p", config))
    }

    pub(crate) fn acquire(&self, req: &Acquire) -> Result<Acquired, SemaphoreError> {
        self.scheduler.transaction(|tx| self.sem.acquire(tx, req))
    }

    pub(crate) fn release(&self, holder: &str, id: u64) -> Result<Released, SemaphoreError> {
        self.scheduler
            .transaction(|tx| self.sem.release(tx, holder, id))
    }

    /// The stored rows, read without settling anything.
    pub(crate) fn raw(&self) -> (Option<PoolRow>, Vec<RequestRow>, Option<i64>) {
        self.scheduler
            .context()
            .storage()
            .transaction(|tx| {
                let pool = tx.semaphore_pool("p")?;
                let mut rows = tx.semaphore_due("p", i64::MAX, usize::MAX)?;
                rows.sort_by_key(|r| r.id);
                Ok::<_, SemaphoreError>((pool, rows, tx.alarm()?))
            })
            .unwrap()
    }

    fn granted(&self, req: &Acquire) -> crate::Grant {
        match self.acquire(req).unwrap() {
            Acquired::Granted(g) => g,
            other => panic!("expected a grant, got {other:?}"),
        }
    }
}

use durability_scheduler::SchedulerTx as _;

#[test]
fn error_codes_are_unique_listed_and_snapshotted() {
    let set: BTreeSet<&str> = SemaphoreError::CODES.iter().copied().collect();
    assert_eq!(set.len(), SemaphoreError::CODES.len(), "codes are unique");
    let storage = |kind| durability_scheduler::StorageError::new(kind, "x");
    use durability_scheduler::StorageErrorKind as K;
    let samples = [
        SemaphoreError::InvalidName {
            field: "pool",
            value: String::new(),
            reason: "x",
        },
        SemaphoreError::InvalidNumber {
            field: "count",
            value: 0,
            reason: "x".into(),
        },
        SemaphoreError::UnknownPool { pool: "p".into() },
        SemaphoreError::UnknownGrant { id: 1 },
        SemaphoreError::CountExceedsCapacity {
            pool: "p".into(),
            count: 2,
            capacity: 1,
        },
        SemaphoreError::NoPermits {
            pool: "p".into(),
            count: 1,
        },
        SemaphoreError::QueueFull {
            pool: "p".into(),
            max_queue: 0,
        },
        SemaphoreError::KeyConflict {
            pool: "p".into(),
            key: "k".into(),
        },
        SemaphoreError::NotHolder {
            id: 1,
            holder: "h".into(),
        },
        SemaphoreError::NotGranted { id: 1 },
        SemaphoreError::Finished {
            id: 1,
            outcome: Outcome::Expired,
        },
        SemaphoreError::UsedExceedsCount {
            id: 1,
            used: 2,
            count: 1,
        },
        SemaphoreError::Storage(storage(K::Backend)),
        SemaphoreError::Storage(storage(K::Corrupt)),
        SemaphoreError::Storage(storage(K::Unknown)),
    ];
    let produced: BTreeSet<_> = samples.iter().map(SemaphoreError::code).collect();
    assert_eq!(
        produced, set,
        "every listed code is produced, and only those"
    );
    let retryable: Vec<_> = samples
        .iter()
        .filter(|e| e.is_retryable())
        .map(|e| e.code())
        .collect();
    assert_eq!(
        retryable,
        [
            "SEMAPHORE_NO_PERMITS",
            "SEMAPHORE_QUEUE_FULL",
            "SEMAPHORE_NOT_GRANTED",
            "SEMAPHORE_STORAGE",
            "SEMAPHORE_OUTCOME_UNKNOWN"
        ]
    );
    insta::assert_snapshot!("error_codes", SemaphoreError::CODES.join("\n"));
}

#[test]
fn refusals_write_nothing() {
    let h = Holder::new(Some(PoolConfig::new(2).max_queue(1)));
    let g = h.granted(&Acquire::new("p", "a", "s1", 2));
    assert!(matches!(
        h.acquire(&Acquire::new("p", "b", "s2", 1)).unwrap(),
        Acquired::Queued { .. }
    ));
    let before = h.raw();
    let long = "x".repeat(257);
    let refused: Vec<(Acquire, &str)> = vec![
        (Acquire::new("", "k", "s", 1), "SEMAPHORE_INVALID_NAME"),
        (
            Acquire::new("p", long.as_str(), "s", 1),
            "SEMAPHORE_INVALID_NAME",
        ),
        (Acquire::new("p", "k", "s\n", 1), "SEMAPHORE_INVALID_NAME"),
        (Acquire::new("p", "k", "s", 0), "SEMAPHORE_INVALID_NUMBER"),
        (
            Acquire::new("p", "k", "s", 1).lease_ms(0),
            "SEMAPHORE_INVALID_NUMBER",
        ),
        (
            Acquire::new("p", "k", "s", 1).lease_ms(1 << 31),
            "SEMAPHORE_INVALID_NUMBER",
        ),
        (
            Acquire::new("p", "k", "s", 1).wait_ms(-1),
            "SEMAPHORE_INVALID_NUMBER",
        ),
        (Acquire::new("q", "k", "s", 1), "SEMAPHORE_UNKNOWN_POOL"),
        (
            Acquire::new("p", "k", "s", 3),
            "SEMAPHORE_COUNT_EXCEEDS_CAPACITY",
        ),
        (
            Acquire::new("p", "k", "s", 1).wait_ms(0),
            "SEMAPHORE_NO_PERMITS",
        ),
        (Acquire::new("p", "k", "s", 1), "SEMAPHORE_QUEUE_FULL"),
        (Acquire::new("p", "a", "other", 2), "SEMAPHORE_KEY_CONFLICT"),
        (Acquire::new("p", "a", "s1", 1), "SEMAPHORE_KEY_CONFLICT"),
    ];
    for (req, code) in refused {
        let err = h.acquire(&req).unwrap_err();
        assert_eq!(err.code(), code, "{req:?}");
        assert_eq!(h.raw(), before, "{code} wrote nothing");
    }
    let calls: Vec<(Result<(), SemaphoreError>, &str)> = vec![
        (
            h.scheduler
                .transaction(|tx| h.sem.renew(tx, "s9", g.id))
                .map(drop),
            "SEMAPHORE_NOT_HOLDER",
        ),
        (
            h.scheduler
                .transaction(|tx| h.sem.renew(tx, "s1", 999))
                .map(drop),
            "SEMAPHORE_UNKNOWN_GRANT",
        ),
        (
            h.scheduler
                .transaction(|tx| h.sem.renew(tx, "s2", g.id + 1))
                .map(drop),
            "SEMAPHORE_NOT_GRANTED",
        ),
        (
            h.scheduler
                .transaction(|tx| h.sem.used(tx, "s1", g.id, 3))
                .map(drop),
            "SEMAPHORE_USED_EXCEEDS_COUNT",
        ),
        (
            h.scheduler
                .transaction(|tx| h.sem.used(tx, "s1", g.id, 0))
                .map(drop),
            "SEMAPHORE_INVALID_NUMBER",
        ),
        (h.release("s2", g.id).map(drop), "SEMAPHORE_NOT_HOLDER"),
        (
            h.configure(PoolConfig::new(0)).map(drop),
            "SEMAPHORE_INVALID_NUMBER",
        ),
        (
            h.configure(PoolConfig::new(1).max_queue(100_001)).map(drop),
            "SEMAPHORE_INVALID_NUMBER",
        ),
        (
            h.configure(PoolConfig::new(1).key_retention_ms(0))
                .map(drop),
            "SEMAPHORE_INVALID_NUMBER",
        ),
    ];
    for (result, code) in calls {
        assert_eq!(result.unwrap_err().code(), code);
        assert_eq!(h.raw(), before, "{code} wrote nothing");
    }
    let bad_clock = Holder::new(Some(PoolConfig::new(1)));
    bad_clock
        .clock
        .set(durability_scheduler::MAX_SAFE_INTEGER + 1);
    let err = bad_clock
        .acquire(&Acquire::new("p", "k", "s", 1))
        .unwrap_err();
    assert_eq!(
        (err.code(), err.to_string().contains("now")),
        ("SEMAPHORE_INVALID_NUMBER", true)
    );
}

#[test]
fn the_head_that_does_not_fit_holds_the_queue_no_barging() {
    let h = Holder::new(Some(PoolConfig::new(3)));
    let a = h.granted(&Acquire::new("p", "a", "s1", 2));
    let big = Acquire::new("p", "big", "s2", 3);
    let small = Acquire::new("p", "small", "s3", 1);
    assert!(matches!(
        h.acquire(&big).unwrap(),
        Acquired::Queued { position: 1, .. }
    ));
    // One permit is free, but the head asks for three: the small one waits.
    assert!(matches!(
        h.acquire(&small).unwrap(),
        Acquired::Queued { position: 2, .. }
    ));
    assert_eq!(h.raw().0.unwrap().held, 2);
    h.release("s1", a.id).unwrap();
    assert!(
        matches!(h.acquire(&big).unwrap(), Acquired::Granted(_)),
        "the head first"
    );
    assert!(matches!(
        h.acquire(&small).unwrap(),
        Acquired::Queued { position: 1, .. }
    ));
}

#[test]
fn capacity_changes_never_revoke_live_grants() {
    let h = Holder::new(Some(PoolConfig::new(4)));
    let a = h.granted(&Acquire::new("p", "a", "s1", 3));
    let waiter = Acquire::new("p", "w", "s2", 1);
    let too_big = Acquire::new("p", "big", "s3", 2);
    let pool = h.configure(PoolConfig::new(2)).unwrap();
    assert_eq!(
        (pool.capacity, pool.held),
        (2, 3),
        "the grant stays, over the new capacity"
    );
    assert!(
        matches!(h.acquire(&waiter).unwrap(), Acquired::Queued { .. }),
        "new grants wait"
    );
    assert!(matches!(
        h.acquire(&too_big).unwrap(),
        Acquired::Queued { .. }
    ));
    let pool = h.configure(PoolConfig::new(1)).unwrap();
    assert_eq!(
        (pool.queued, pool.cancelled),
        (2, 0),
        "behind a waiting head nothing moves"
    );
    h.release("s1", a.id).unwrap();
    assert!(matches!(h.acquire(&waiter).unwrap(), Acquired::Granted(_)));
    assert!(
        matches!(
            h.acquire(&too_big).unwrap(),
            Acquired::Finished {
                outcome: Outcome::Cancelled,
                ..
            }
        ),
        "a waiter above the capacity leaves the queue when it reaches the head"
    );
    let pool = h.configure(PoolConfig::new(5)).unwrap();
    assert_eq!(
        (pool.held, pool.granted, pool.released, pool.cancelled),
        (1, 4, 3, 1)
    );
}

#[test]
fn growing_the_capacity_grants_the_head_at_once() {
    let h = Holder::new(Some(PoolConfig::new(1)));
    h.granted(&Acquire::new("p", "a", "s1", 1));
    let b = Acquire::new("p", "b", "s2", 1);
    assert!(matches!(h.acquire(&b).unwrap(), Acquired::Queued { .. }));
    h.events.lock().unwrap().clear();
    h.configure(PoolConfig::new(2)).unwrap();
    let kinds: Vec<_> = h
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.key.clone(), e.kind.clone()))
        .collect();
    assert!(
        matches!(kinds.as_slice(), [(k, EventKind::Granted { .. }), (_, EventKind::Configured { from: Some(1) })] if k == "b"),
        "{kinds:?}"
    );
}

#[test]
fn leases_expire_through_the_alarm_and_renewals_extend_them() {
    let h = Holder::new(Some(PoolConfig::new(2)));
    let a = h.granted(&Acquire::new("p", "a", "s1", 1).lease_ms(100));
    let b = h.granted(&Acquire::new("p", "b", "s2", 1).lease_ms(100));
    assert_eq!(h.scheduler.alarm_at(), Some(1_100));
    h.clock.advance(60);
    let renewed = h
        .scheduler
        .transaction(|tx| h.sem.renew(tx, "s1", a.id))
        .unwrap();
    assert_eq!(renewed.lease_until, 1_160);
    h.clock.advance(40);
    crate::conformance::run_alarm(&h.scheduler).unwrap();
    let pool = h.raw().0.unwrap();
    assert_eq!(
        (pool.held, pool.expired),
        (1, 1),
        "b expired at its deadline, a lives on"
    );
    assert_eq!(h.scheduler.alarm_at(), Some(1_160));
    let err = h
        .scheduler
        .transaction(|tx| h.sem.renew(tx, "s2", b.id))
        .unwrap_err();
    assert_eq!(err.code(), "SEMAPHORE_FINISHED");
    h.clock.advance(60);
    // No alarm ran: the call itself settles the lapsed lease.
    let err = h
        .scheduler
        .transaction(|tx| h.sem.used(tx, "s1", a.id, 1))
        .unwrap_err();
    assert!(matches!(
        err,
        SemaphoreError::Finished {
            outcome: Outcome::Expired,
            ..
        }
    ));
}

#[test]
fn used_totals_count_once_stay_held_until_release_and_a_retried_release_changes_nothing() {
    let h = Holder::new(Some(PoolConfig::new(3)));
    let g = h.granted(&Acquire::new("p", "a", "s1", 3));
    let used = |total| {
        h.scheduler
            .transaction(|tx| h.sem.used(tx, "s1", g.id, total))
            .unwrap()
    };
    assert_eq!(used(2).used, 2);
    let reported = h.raw();
    assert_eq!(used(2).used, 2, "a retried report");
    assert_eq!(used(1).used, 2, "a stale report");
    assert_eq!(h.raw(), reported, "neither counted again");
    let pool = h.raw().0.unwrap();
    assert_eq!((pool.used, pool.held), (2, 3));
    assert_eq!(
        h.release("s1", g.id).unwrap(),
        Released::Now(Outcome::Released)
    );
    let after = h.raw();
    assert_eq!(
        h.release("s1", g.id).unwrap(),
        Released::Already(Outcome::Released)
    );
    assert_eq!(h.raw(), after, "the retry wrote nothing");
    let pool = after.0.unwrap();
    assert_eq!(
        (pool.granted, pool.released, pool.used, pool.held),
        (3, 3, 2, 0)
    );
}

#[test]
fn queued_requests_time_out_and_keys_are_forgotten_after_retention() {
    let h = Holder::new(Some(PoolConfig::new(1).key_retention_ms(500)));
    let a = h.granted(&Acquire::new("p", "a", "s1", 1).lease_ms(10_000));
    let b = Acquire::new("p", "b", "s2", 1).wait_ms(100);
    let Acquired::Queued { id, deadline, .. } = h.acquire(&b).unwrap() else {
        panic!("queued")
    };
    assert_eq!((deadline, h.scheduler.alarm_at()), (1_100, Some(1_100)));
    h.clock.advance(100);
    crate::conformance::run_alarm(&h.scheduler).unwrap();
    assert_eq!(
        h.acquire(&b).unwrap(),
        Acquired::Finished {
            id,
            outcome: Outcome::TimedOut
        }
    );
    assert_eq!(
        h.scheduler.alarm_at(),
        Some(1_600),
        "the key is forgotten at 1100 + 500"
    );
    h.release("s1", a.id).unwrap();
    h.clock.advance(500);
    crate::conformance::run_alarm(&h.scheduler).unwrap();
    let Acquired::Granted(again) = h.acquire(&b).unwrap() else {
        panic!("a new request")
    };
    assert!(again.id > id, "after retention the key is a new request");
}

#[test]
fn a_rolled_back_transaction_reports_nothing() {
    let h = Holder::new(Some(PoolConfig::new(1)));
    h.events.lock().unwrap().clear();
    let before = h.raw();
    let r: Result<(), SemaphoreError> = h.scheduler.transaction(|tx| {
        h.sem.acquire(tx, &Acquire::new("p", "a", "s1", 1))?;
        Err(SemaphoreError::UnknownPool {
            pool: "rollback".into(),
        })
    });
    assert!(r.is_err());
    assert!(
        h.events.lock().unwrap().is_empty(),
        "no event of a rolled-back grant"
    );
    assert_eq!(h.raw(), before);
}

#[test]
fn a_second_semaphore_on_one_object_is_refused_and_leaves_the_first_attached() {
    let h = Holder::new(Some(PoolConfig::new(1)));
    let err = Semaphore::attach(&h.scheduler, SemaphoreConfig::default()).unwrap_err();
    assert_eq!(err.code(), "SCHEDULER_DUPLICATE_CAPABILITY");
    assert!(
        h.scheduler.is_attached(crate::SCHEMA),
        "the refused handle did not detach the first"
    );
}
