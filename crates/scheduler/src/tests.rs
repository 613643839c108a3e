//! Unit tests of the scheduler on the in-memory storage.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use futures::future::BoxFuture;

use crate::testkit::{MemoryStorage, conformance};
use crate::*;

use conformance::STEPS;

fn storage() -> Arc<MemoryStorage> {
    Arc::new(
        MemoryStorage::new()
            .with_schema("conformance", STEPS)
            .with_schema("counter", STEPS),
    )
}

fn scheduler(storage: Arc<MemoryStorage>, clock: &ManualClock) -> Scheduler<MemoryStorage> {
    let ctx = ObjectContext::with_clock(
        ObjectId::new("object-1").unwrap(),
        storage,
        Arc::new(clock.clone()),
    );
    Scheduler::new(ctx).unwrap()
}

/// A capability that counts its runs and clears its due time.
struct Counter {
    name: &'static str,
    runs: AtomicU32,
    scheduler: Scheduler<MemoryStorage>,
}

impl Capability for Counter {
    fn run(&self, _now: i64) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.runs.fetch_add(1, Ordering::SeqCst);
            self.scheduler
                .transaction(|tx| tx.set_due(self.name, None))
                .unwrap();
        })
    }
}

fn counter(s: &Scheduler<MemoryStorage>, name: &'static str) -> Arc<Counter> {
    let c = Arc::new(Counter {
        name,
        runs: AtomicU32::new(0),
        scheduler: s.clone(),
    });
    s.attach(name, None, c.clone()).unwrap();
    c
}

#[test]
fn memory_storage_passes_conformance() {
    conformance::run(|| MemoryStorage::new().with_schema("conformance", STEPS));
}

#[test]
fn object_id_is_validated() {
    for (bad, code) in [
        ("", "SCHEDULER_INVALID_OBJECT_ID"),
        ("a\0b", "SCHEDULER_INVALID_OBJECT_ID"),
    ] {
        assert_eq!(ObjectId::new(bad).unwrap_err().code(), code);
    }
    // Any other well-formed Unicode, control characters included.
    for good in ["a\nb", "st:Cart:🛒 カート", "st:C:\u{1}\u{7f}"] {
        assert_eq!(ObjectId::new(good).unwrap().as_str(), good);
    }
    assert!(ObjectId::new("x".repeat(MAX_OBJECT_ID_BYTES + 1)).is_err());
    assert!(ObjectId::new("x".repeat(MAX_OBJECT_ID_BYTES)).is_ok());
}

#[test]
fn attaching_a_name_twice_is_an_error_and_changes_nothing() {
    let clock = ManualClock::new(1_000);
    let store = storage();
    let s = scheduler(store.clone(), &clock);
    s.attach("counter", Some("counter"), Arc::new(NoOp))
        .unwrap();
    let applied = store.applied_steps();
    assert_eq!(applied.len(), 2, "both steps applied on attach");
    let err = s
        .attach("counter", Some("counter"), Arc::new(NoOp))
        .unwrap_err();
    assert_eq!(err.code(), "SCHEDULER_DUPLICATE_CAPABILITY");
    assert_eq!(store.applied_steps(), applied, "nothing applied again");
    assert_eq!(
        s.attach("", None, Arc::new(NoOp)).unwrap_err().code(),
        "SCHEDULER_INVALID_CAPABILITY_NAME"
    );
    let err = s
        .attach("other", Some("no-schema"), Arc::new(NoOp))
        .unwrap_err();
    assert_eq!(err.code(), "SCHEDULER_UNKNOWN_SCHEMA");
    assert!(!s.is_attached("other"), "a failed attach attaches nothing");
}

struct NoOp;
impl Capability for NoOp {
    fn run(&self, _now: i64) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

#[test]
fn alarm_is_the_earliest_due_and_moves_in_the_same_transaction() {
    let clock = ManualClock::new(1_000);
    let store = storage();
    let s = scheduler(store.clone(), &clock);
    s.transaction(|tx| tx.set_due("a", Some(5_000))).unwrap();
    assert_eq!(s.alarm_at(), Some(5_000));
    s.transaction(|tx| tx.set_due("b", Some(3_000))).unwrap();
    assert_eq!(s.alarm_at(), Some(3_000));
    s.transaction(|tx| tx.lower_due("a", 4_000)).unwrap();
    assert_eq!(
        s.alarm_at(),
        Some(3_000),
        "a later due never moves the alarm"
    );
    s.transaction(|tx| tx.set_due("b", None)).unwrap();
    assert_eq!(s.alarm_at(), Some(4_000));
    // A rolled-back change leaves both the stored and the published alarm.
    let r: Result<(), StorageError> = s.transaction(|tx| {
        tx.set_due("a", Some(10))?;
        Err(StorageError::corrupt("rollback"))
    });
    assert!(r.is_err());
    assert_eq!(s.alarm_at(), Some(4_000));
    assert_eq!(store.transaction(|tx| tx.alarm()).unwrap(), Some(4_000));
}

#[tokio::test]
async fn alarm_runs_every_due_capability_and_reschedules() {
    let clock = ManualClock::new(1_000);
    let s = scheduler(storage(), &clock);
    let a = counter(&s, "a");
    let b = counter(&s, "b");
    s.transaction(|tx| {
        tx.set_due("a", Some(1_000))?;
        tx.set_due("b", Some(9_000))
    })
    .unwrap();
    let next = s.alarm().await.unwrap();
    assert_eq!(a.runs.load(Ordering::SeqCst), 1);
    assert_eq!(b.runs.load(Ordering::SeqCst), 0, "b is not due yet");
    assert_eq!(next, Some(9_000));
    clock.advance(8_000);
    assert_eq!(s.alarm().await.unwrap(), None);
    assert_eq!(b.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn driver_fires_the_stored_alarm_and_rearms_after_restart() {
    let clock = ManualClock::new(1_000);
    let store = storage();
    {
        let s = scheduler(store.clone(), &clock);
        s.transaction(|tx| tx.set_due("a", Some(2_000))).unwrap();
        // The process dies here: no driver ran.
    }
    let s = scheduler(store.clone(), &clock);
    assert_eq!(
        s.alarm_at(),
        Some(2_000),
        "a new scheduler reads the stored alarm"
    );
    let a = counter(&s, "a");
    let driver = Driver::start(s.clone());
    let mut changes = s.watch_alarm();
    wait_for_sleeper(&clock).await;
    clock.advance(1_000);
    while changes.borrow_and_update().is_some() {
        changes.changed().await.unwrap();
    }
    assert_eq!(a.runs.load(Ordering::SeqCst), 1);
    driver.stop();
}

async fn wait_for_sleeper(clock: &ManualClock) {
    while clock.next_wake().is_none() {
        tokio::task::yield_now().await;
    }
}

#[test]
fn migrate_forward_back_and_unknown_target() {
    let store = storage();
    assert_eq!(
        migrate(store.as_ref(), "counter", &SchemaTarget::Latest).unwrap(),
        Some(2)
    );
    assert_eq!(
        migrate(
            store.as_ref(),
            "counter",
            &SchemaTarget::Named("initial".into())
        )
        .unwrap(),
        Some(1)
    );
    let before = store.applied_steps();
    let err = migrate(
        store.as_ref(),
        "counter",
        &SchemaTarget::Named("nope".into()),
    )
    .unwrap_err();
    assert_eq!(err.code(), "SCHEDULER_UNKNOWN_SCHEMA_TARGET");
    assert_eq!(
        store.applied_steps(),
        before,
        "unknown target applies nothing"
    );
    assert_eq!(
        migrate(store.as_ref(), "counter", &SchemaTarget::Nothing).unwrap(),
        None
    );
    let dirs: Vec<_> = store
        .applied_steps()
        .iter()
        .map(|(_, v, d)| (*v, *d))
        .collect();
    assert_eq!(
        dirs,
        vec![
            (1, Direction::Up),
            (2, Direction::Up),
            (2, Direction::Down),
            (1, Direction::Down)
        ]
    );
}

#[test]
fn a_schema_newer_than_the_code_is_refused() {
    let store = storage();
    store
        .transaction(|tx| tx.set_schema_version("counter", Some(9)))
        .unwrap();
    let err = migrate(store.as_ref(), "counter", &SchemaTarget::Latest).unwrap_err();
    assert_eq!(err.code(), "SCHEDULER_SCHEMA_AHEAD");
}

#[test]
fn error_codes_are_unique() {
    let mut codes = SchedulerError::CODES.to_vec();
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), SchedulerError::CODES.len());
}

#[test]
fn every_storage_error_kind_has_its_own_listed_code() {
    use crate::StorageErrorKind as K;
    let codes: Vec<&str> = [K::Backend, K::Corrupt, K::Crash, K::Unknown, K::Fenced]
        .into_iter()
        .map(|kind| StorageError::new(kind, "x").code())
        .collect();
    assert_eq!(codes, StorageError::CODES);
    // Via a constructor, not only `new`.
    let backend = StorageError::backend("write", std::io::Error::other("disk"));
    assert_eq!(backend.code(), "STORAGE_BACKEND");
}

#[tokio::test]
async fn driver_backs_off_when_a_due_capability_makes_no_progress() {
    let clock = ManualClock::new(1_000);
    let s = scheduler(storage(), &clock);
    // Due work for a capability this process never attached.
    s.transaction(|tx| tx.set_due("detached", Some(1_000)))
        .unwrap();
    let driver = Driver::with_idle_retry(s.clone(), std::time::Duration::from_millis(250));
    // The first firing finds nothing to run; the driver then sleeps until
    // the idle retry instead of spinning.
    loop {
        if clock.next_wake() == Some(1_250) {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(s.alarm_at(), Some(1_000), "the stored alarm is untouched");
    driver.stop();
}

#[test]
fn a_dropped_sleep_is_not_a_waiting_sleeper() {
    let clock = ManualClock::new(0);
    let kept = clock.sleep_until(20);
    drop(clock.sleep_until(10));
    assert_eq!(
        clock.next_wake(),
        Some(20),
        "the dropped sleep is forgotten"
    );
    drop(kept);
    assert_eq!(clock.next_wake(), None);
}

/// A transaction that moves the alarm and queues a callback, then fails
/// through `fail`; afterwards a committing transaction that changes nothing
/// must publish nothing and run nothing of it.
fn nothing_of_a_failed_transaction_survives(fail: impl FnOnce()) {
    let clock = ManualClock::new(1_000);
    let store = storage();
    let s = scheduler(store.clone(), &clock);
    s.transaction(|tx| tx.set_due("a", Some(5_000))).unwrap();
    let ran = Arc::new(AtomicU32::new(0));
    let hook = Arc::clone(&ran);
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        s.transaction(|tx| {
            tx.set_due("a", Some(10))?;
            tx.after_commit(move || {
                hook.fetch_add(1, Ordering::SeqCst);
            });
            fail();
            Err::<(), _>(StorageError::corrupt("rollback"))
        })
    }));
    assert!(!matches!(failed, Ok(Ok(()))));
    assert_eq!(
        s.alarm_at(),
        Some(5_000),
        "the failed alarm is not published"
    );
    // The next transaction commits without touching any due time.
    s.transaction(|tx| tx.alarm().map(|_| ())).unwrap();
    assert_eq!(s.alarm_at(), Some(5_000), "nor by the next commit");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the failed callback never runs"
    );
    assert_eq!(store.transaction(|tx| tx.alarm()).unwrap(), Some(5_000));
    // A later committed change publishes and runs its own effects only.
    let mine = Arc::new(AtomicU32::new(0));
    let hook = Arc::clone(&mine);
    s.transaction(|tx| {
        tx.after_commit(move || {
            hook.fetch_add(1, Ordering::SeqCst);
        });
        tx.set_due("b", Some(2_000))
    })
    .unwrap();
    assert_eq!(s.alarm_at(), Some(2_000));
    assert_eq!(
        (ran.load(Ordering::SeqCst), mine.load(Ordering::SeqCst)),
        (0, 1)
    );
}

#[test]
fn an_error_in_the_closure_leaves_nothing_pending() {
    nothing_of_a_failed_transaction_survives(|| {});
}

#[test]
fn a_panic_in_the_closure_leaves_nothing_pending() {
    nothing_of_a_failed_transaction_survives(|| panic!("the closure panics after staging"));
}
