//! The semaphore on SQLite files: the conformance suite, a crash at every
//! transaction of the holder (before and after its commit) with the object
//! reopened from its file and the interrupted call retried, and strict
//! decoding of corrupt rows.
#![cfg(feature = "semaphore")]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use durability_scheduler::conformance::{CrashMode, CrashStorage};
use durability_scheduler::{ManualClock, ObjectContext, ObjectId, Scheduler, Storage};
use durability_semaphore::conformance::run_alarm;
use durability_semaphore::{
    Acquire, Acquired, PoolConfig, PoolRow, RequestRow, Semaphore, SemaphoreConfig, SemaphoreError,
    SemaphoreTx,
};
use durability_storage_sqlite::{SqliteOptions, SqliteStorage, Synchronous};

fn options() -> SqliteOptions {
    SqliteOptions {
        synchronous: Synchronous::Normal,
        ..SqliteOptions::default()
    }
}

/// A factory of fresh SQLite file storages in a temporary directory it owns.
fn file_storages() -> impl Fn() -> SqliteStorage {
    let dir = tempfile::tempdir().unwrap();
    let n = AtomicU32::new(0);
    move || {
        let i = n.fetch_add(1, Ordering::SeqCst);
        SqliteStorage::open(dir.path().join(format!("holder-{i}.db")), options()).unwrap()
    }
}

durability_semaphore::semaphore_conformance!(
    semaphore_conformance_on_sqlite_files,
    file_storages()
);

/// One call of a shard (or the holder's alarm) in the crash script.
#[derive(Debug, Clone)]
enum Step {
    Configure(u64),
    Acquire(Acquire),
    Renew(&'static str, &'static str),
    Used(&'static str, &'static str, u64),
    Release(&'static str, &'static str),
    Advance(i64),
    Alarm,
}

fn script() -> Vec<Step> {
    let req = |key: &str, holder: &str, count, wait| {
        Step::Acquire(
            Acquire::new("p", key, holder, count)
                .lease_ms(100)
                .wait_ms(wait),
        )
    };
    vec![
        Step::Configure(2),
        req("a", "s1", 1, 0),
        req("b", "s2", 2, 500),
        req("c", "s3", 1, 500),
        Step::Used("s1", "a", 1),
        Step::Advance(50),
        Step::Renew("s1", "a"),
        Step::Release("s1", "a"),
        req("a", "s1", 1, 0),
        Step::Advance(120),
        Step::Alarm,
        Step::Configure(1),
        req("d", "s1", 1, 0),
        Step::Release("s3", "c"),
        req("d", "s1", 1, 0),
        Step::Advance(300),
        Step::Alarm,
    ]
}

/// An object reopened from its file: its scheduler and semaphore.
struct Holder<S: Storage> {
    scheduler: Scheduler<S>,
    sem: Semaphore<S>,
}

fn open<S: Storage>(storage: Arc<S>, clock: &ManualClock) -> Result<Holder<S>, SemaphoreError>
where
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    let ctx = ObjectContext::with_clock(ObjectId::new("holder")?, storage, Arc::new(clock.clone()));
    let scheduler = Scheduler::new(ctx)?;
    let sem = Semaphore::attach(&scheduler, SemaphoreConfig::default())?;
    Ok(Holder { scheduler, sem })
}

/// A holder on a fresh SQLite file with its clock at 1 000 ms, and the
/// storage under it (to write rows behind the holder's back); the file's
/// directory lives as long as the factory returned first.
fn holder_on_a_file() -> (
    impl Fn() -> SqliteStorage,
    Arc<SqliteStorage>,
    ManualClock,
    Holder<SqliteStorage>,
) {
    let make = file_storages();
    let storage = Arc::new(make());
    let clock = ManualClock::new(1_000);
    let h = open(Arc::clone(&storage), &clock).unwrap();
    (make, storage, clock, h)
}

/// What the holder stores: the pool, every request, the alarm.
type Stored = (Option<PoolRow>, Vec<RequestRow>, Option<i64>);

fn stored(path: &Path) -> Stored {
    let s = SqliteStorage::open(path, options()).unwrap();
    s.transaction(|tx| {
        let pool = tx.semaphore_pool("p")?;
        let rows = tx.semaphore_due("p", i64::MAX, usize::MAX)?;
        let alarm = durability_scheduler::SchedulerTx::alarm(tx)?;
        Ok::<_, SemaphoreError>((pool, rows, alarm))
    })
    .unwrap()
}

fn id_of<S: Storage>(h: &Holder<S>, key: &str) -> u64
where
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    let row = h
        .scheduler
        .context()
        .storage()
        .transaction(|tx| tx.semaphore_request("p", key));
    row.ok().flatten().map_or(0, |r| r.id)
}

/// Runs one step; its answer, as text.
fn run<S: Storage>(h: &Holder<S>, clock: &ManualClock, step: &Step) -> String
where
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    let t = |f: &dyn Fn(
        &mut durability_scheduler::Transaction<'_, '_, S>,
    ) -> Result<String, SemaphoreError>| {
        h.scheduler
            .transaction(|tx| f(tx))
            .unwrap_or_else(|e| e.code().to_owned())
    };
    match step {
        Step::Configure(c) => t(&|tx| {
            h.sem
                .configure(tx, "p", PoolConfig::new(*c))
                .map(|p| p.capacity.to_string())
        }),
        Step::Acquire(req) => t(&|tx| h.sem.acquire(tx, req).map(|a| format!("{a:?}"))),
        Step::Renew(holder, key) => {
            let id = id_of(h, key);
            t(&|tx| h.sem.renew(tx, holder, id).map(|g| format!("{g:?}")))
        }
        Step::Used(holder, key, n) => {
            let id = id_of(h, key);
            t(&|tx| h.sem.used(tx, holder, id, *n).map(|g| format!("{g:?}")))
        }
        Step::Release(holder, key) => {
            let id = id_of(h, key);
            t(&|tx| h.sem.release(tx, holder, id).map(|r| format!("{r:?}")))
        }
        Step::Advance(ms) => {
            clock.advance(*ms);
            String::new()
        }
        Step::Alarm => {
            // A crashed storage fails the handler; the step is retried.
            let _ = run_alarm(&h.scheduler);
            String::new()
        }
    }
}

/// The accounting that must hold after every step.
fn check_invariants(path: &Path, context: &str) {
    let (pool, rows, alarm) = stored(path);
    let Some(pool) = pool else { return };
    assert_eq!(
        pool.granted,
        pool.released + pool.expired + pool.held,
        "{context}: granted = returned + held"
    );
    let live: u64 = rows
        .iter()
        .filter(|r| matches!(r.state, durability_semaphore::RequestState::Granted { .. }))
        .map(|r| r.count)
        .sum();
    assert_eq!(pool.held, live, "{context}: held is the sum of live grants");
    assert!(
        pool.held <= 2,
        "{context}: never more than the largest capacity held"
    );
    assert_eq!(
        alarm,
        rows.iter().map(RequestRow::due_at).min(),
        "{context}: the alarm is the earliest due row"
    );
}

/// Runs the script on a fresh file, crashing at transaction `crash_at`
/// (none: the reference run). After the crash the object is reopened from
/// its file and the interrupted step is retried, as a shard retries its
/// call. Returns the answers, the stored end state, and the transactions
/// counted.
fn crash_run(dir: &Path, crash_at: Option<u64>, mode: CrashMode) -> (Vec<String>, Stored, u64) {
    let path = dir.join(format!("crash-{crash_at:?}-{mode:?}.db"));
    let clock = ManualClock::new(1_000);
    let crashing = Arc::new(CrashStorage::new(
        Arc::new(SqliteStorage::open(&path, options()).unwrap()),
        crash_at,
        mode,
    ));
    let reopen = || {
        open(
            Arc::new(SqliteStorage::open(&path, options()).unwrap()),
            &clock,
        )
        .unwrap()
    };
    let mut answers = Vec::new();
    let first = open(Arc::clone(&crashing), &clock);
    let mut plain = None;
    if first.is_err() {
        assert!(crashing.crashed(), "only the injected crash fails the open");
        plain = Some(reopen());
    }
    let mut crashed_holder = first.ok();
    for (i, step) in script().iter().enumerate() {
        let answer = match (&plain, &crashed_holder) {
            (Some(h), _) => run(h, &clock, step),
            (None, Some(h)) => {
                let answer = run(h, &clock, step);
                if crashing.crashed() {
                    // The process died in this step: reopen from the file
                    // and retry the step (the clock does not go back).
                    crashed_holder = None;
                    check_invariants(&path, &format!("after the crash in step {i}"));
                    let h = reopen();
                    let retried = run_retry(&h, &clock, step);
                    plain = Some(h);
                    retried
                } else {
                    answer
                }
            }
            (None, None) => unreachable!("one holder is always open"),
        };
        answers.push(answer);
        check_invariants(
            &path,
            &format!("crash at {crash_at:?} {mode:?}, step {i} {step:?}"),
        );
    }
    drop((plain, crashed_holder));
    let transactions = crashing.transactions();
    (answers, stored(&path), transactions)
}

/// Retries the step a crash interrupted: the clock already moved for an
/// `Advance`, so it is not moved again.
fn run_retry<S: Storage>(h: &Holder<S>, clock: &ManualClock, step: &Step) -> String
where
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    match step {
        Step::Advance(_) => String::new(),
        other => run(h, clock, other),
    }
}

#[test]
fn a_crash_at_every_transaction_of_the_holder_grants_nothing_twice_and_loses_no_permit() {
    let dir = tempfile::tempdir().unwrap();
    let (reference, end, total) = crash_run(dir.path(), None, CrashMode::BeforeCommit);
    assert!(total >= 15, "the script runs its transactions ({total})");
    let pool = end.0.clone().unwrap();
    assert_eq!(
        (pool.granted, pool.released, pool.expired, pool.held),
        (5, 2, 3, 0),
        "every permit returned: {pool:?}"
    );
    let mut tried = 0;
    for mode in [CrashMode::BeforeCommit, CrashMode::AfterCommit] {
        for at in 1..=total {
            let (answers, state, _) = crash_run(dir.path(), Some(at), mode);
            tried += 1;
            // Only the retried step may answer differently, and only a
            // release or a configure whose first attempt had committed.
            for (i, (got, want)) in answers.iter().zip(&reference).enumerate() {
                let retried_release = got.starts_with("Already") && want.starts_with("Now");
                assert!(
                    got == want || retried_release,
                    "crash at {at} {mode:?}, step {i}: {got} != {want}"
                );
            }
            assert_eq!(
                state, end,
                "crash at {at} {mode:?}: the same end state, nothing granted twice"
            );
        }
    }
    eprintln!("semaphore crash points tried: {tried} ({total} transactions x 2 modes)");
}

#[test]
fn a_corrupt_row_is_a_typed_error_and_stays_deletable() {
    let (_dir, storage, _, h) = holder_on_a_file();
    h.scheduler
        .transaction(|tx| h.sem.configure(tx, "p", PoolConfig::new(2)))
        .unwrap();
    h.scheduler
        .transaction(|tx| h.sem.acquire(tx, &Acquire::new("p", "a", "s1", 1)))
        .unwrap();
    let corrupt = |sql: &str| {
        storage
            .transaction(|tx| {
                tx.sql()
                    .execute_batch(sql)
                    .map_err(|e| durability_scheduler::StorageError::backend("test", e))
            })
            .unwrap();
    };
    corrupt("UPDATE durability_semaphore_request SET count = 'many' WHERE key = 'a'");
    let err = h
        .scheduler
        .transaction(|tx| h.sem.acquire(tx, &Acquire::new("p", "a", "s1", 1)))
        .unwrap_err();
    assert_eq!(err.code(), "SEMAPHORE_CORRUPT", "{err}");
    assert!(
        err.to_string().contains("count"),
        "the error names the column: {err}"
    );
    assert!(!err.is_retryable());
    let deleted = storage
        .transaction(|tx| tx.semaphore_delete_request("p", "a"))
        .unwrap();
    assert!(deleted, "a corrupt row stays deletable");
    corrupt("UPDATE durability_semaphore_pool SET held = -1");
    let err = h
        .scheduler
        .transaction(|tx| h.sem.pool(tx, "p"))
        .unwrap_err();
    assert_eq!(err.code(), "SEMAPHORE_CORRUPT", "{err}");

    // Isolated: another pool works; deletable: the pool goes, rows and all.
    h.scheduler
        .transaction(|tx| h.sem.configure(tx, "q", PoolConfig::new(1)))
        .unwrap();
    let other = h
        .scheduler
        .transaction(|tx| h.sem.acquire(tx, &Acquire::new("q", "b", "s2", 1)))
        .unwrap();
    assert!(matches!(other, Acquired::Granted(_)), "{other:?}");
    h.scheduler
        .transaction(|tx| h.sem.acquire(tx, &Acquire::new("p", "c", "s1", 1)))
        .unwrap_err();
    let deleted = h
        .scheduler
        .transaction(|tx| h.sem.delete_pool(tx, "p"))
        .unwrap();
    assert!(deleted);
    let gone = h
        .scheduler
        .transaction(|tx| h.sem.pool(tx, "p"))
        .unwrap_err();
    assert_eq!(gone.code(), "SEMAPHORE_UNKNOWN_POOL");
    h.scheduler
        .transaction(|tx| h.sem.configure(tx, "p", PoolConfig::new(2)))
        .unwrap();
    let fresh = h.scheduler.transaction(|tx| h.sem.pool(tx, "p")).unwrap();
    assert_eq!((fresh.held, fresh.granted), (0, 0));
    let q = h.scheduler.transaction(|tx| h.sem.pool(tx, "q")).unwrap();
    assert_eq!(q.held, 1, "the other pool kept its grant");
}

#[test]
fn the_alarm_quarantines_a_corrupt_row_and_settles_every_pool() {
    let (_dir, storage, clock, h) = holder_on_a_file();
    for (pool, key) in [("p", "bad"), ("p", "good"), ("q", "other")] {
        h.scheduler
            .transaction(|tx| {
                h.sem.configure(tx, pool, PoolConfig::new(3))?;
                h.sem
                    .acquire(tx, &Acquire::new(pool, key, "s1", 1).lease_ms(100))
            })
            .unwrap();
    }
    storage
        .transaction(|tx| {
            tx.sql()
                .execute_batch(
                    "UPDATE durability_semaphore_request SET count = 'many' WHERE key = 'bad'",
                )
                .map_err(|e| durability_scheduler::StorageError::backend("test", e))
        })
        .unwrap();
    clock.advance(100);
    run_alarm(&h.scheduler).unwrap();
    let (p, q) = storage
        .transaction(|tx| {
            Ok::<_, SemaphoreError>((
                tx.semaphore_pool("p")?.unwrap(),
                tx.semaphore_pool("q")?.unwrap(),
            ))
        })
        .unwrap();
    assert_eq!((q.held, q.expired), (0, 1), "the other pool was settled");
    assert_eq!(
        (p.held, p.expired),
        (1, 1),
        "the healthy grant expired; the quarantined one's permit stays held"
    );
    let quarantined: (i64, String) = storage
        .transaction(|tx| {
            tx.sql()
                .query_row(
                    "SELECT count(*), max(reason) FROM durability_semaphore_quarantine",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(|e| durability_scheduler::StorageError::backend("test", e))
        })
        .unwrap();
    assert_eq!(quarantined.0, 1);
    assert!(quarantined.1.contains("count"), "{quarantined:?}");
    assert_eq!(
        h.scheduler.alarm_at(),
        Some(1_100 + durability_semaphore::DEFAULT_KEY_RETENTION_MS),
        "the alarm moved on"
    );
    let again = h
        .scheduler
        .transaction(|tx| h.sem.acquire(tx, &Acquire::new("p", "new", "s2", 2)));
    assert!(
        matches!(again, Ok(Acquired::Granted(_))),
        "the pool serves again: {again:?}"
    );
}
