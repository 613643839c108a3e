//! Alarms across crates: the `AlarmIndex` conformance suite on SQLite and
//! Redis, the object-side rows on SQLite, end-to-end delivery with an
//! injected clock, crash injection (dispatcher between promote, claim,
//! dispatch and complete; object between local commit and backend flush),
//! and a small soak with random failures, deletes and crashes.
#![allow(clippy::unwrap_used)]

pub(crate) mod support;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

use durability_alarms::conformance::{Fault, FaultIndex};
use durability_alarms::{
    AlarmIndex, AlarmTx, Dispatcher, DispatcherConfig, ObjectId, Token, conformance,
};
use durability_scheduler::testkit::MemoryStorage;
use durability_scheduler::{Clock, ManualClock, Storage, StorageErrorKind};
use durability_storage_redis::alarms::IndexTime;
use durability_storage_redis::testkit::delete_prefix;
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::{SqliteOptions, SqliteStorage, Synchronous};
use rand::{Rng, SeedableRng};
use support::{
    CrashMode, Crashy, Event, FailFirst, FailPlan, FailRandom, Host, Log, NoFail, Obj, START,
    redis_cleanup, redis_index, redis_index_with, unique_prefix,
};

fn config(seed: u64) -> DispatcherConfig {
    DispatcherConfig {
        seed: Some(seed),
        ..DispatcherConfig::default()
    }
}

/// A dispatcher on `index` delivering through `host`, on the manual clock,
/// with `config(seed)`.
fn dispatcher<I: AlarmIndex, D: durability_alarms::Dispatch>(
    index: &Arc<I>,
    host: &Arc<D>,
    clock: &ManualClock,
    seed: u64,
) -> Dispatcher<I, D> {
    Dispatcher::new(
        Arc::clone(index),
        Arc::clone(host),
        Arc::new(clock.clone()),
        config(seed),
    )
    .unwrap()
}

fn sqlite_object(path: &std::path::Path) -> Arc<SqliteStorage> {
    Arc::new(
        SqliteStorage::open(
            path,
            SqliteOptions {
                synchronous: Synchronous::Off,
                ..SqliteOptions::default()
            },
        )
        .unwrap(),
    )
}

durability_alarms::alarm_index_conformance!(sqlite_index_passes_the_conformance_suite, async {
    Some((SqliteAlarmIndex::open_in_memory().unwrap(), ()))
});

durability_alarms::alarm_index_conformance!(
    sqlite_file_index_passes_the_conformance_suite,
    async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index-1.db");
        Some((
            SqliteAlarmIndex::open(path, Synchronous::Normal).unwrap(),
            dir,
        ))
    }
);

#[tokio::test]
async fn sqlite_index_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index.db");
    let a = ObjectId::new("a").unwrap();
    let t = Token::new("t").unwrap();
    {
        let ix = SqliteAlarmIndex::open(&path, Synchronous::Full).unwrap();
        ix.upsert(&a, &t, START).await.unwrap();
        ix.promote(START, 10).await.unwrap();
        ix.claim(durability_alarms::ClaimReady {
            now: START,
            lease_ms: 1_000,
            run: &Token::new("r").unwrap(),
        })
        .await
        .unwrap()
        .unwrap();
    }
    let ix = SqliteAlarmIndex::open(&path, Synchronous::Full).unwrap();
    let job = ix.job(&a).await.unwrap().unwrap();
    assert_eq!((job.token, job.tries), (t, 1));
    assert_eq!(
        ix.next_due().await.unwrap(),
        Some(START + 1_000),
        "lease survives"
    );
}

durability_alarms::alarm_tx_conformance!(sqlite_alarm_rows_pass_the_conformance_suite, || {
    SqliteStorage::open_in_memory().unwrap()
});

#[test]
fn a_corrupt_sqlite_alarm_row_is_an_error_not_a_panic() {
    use durability_scheduler::{SchemaTarget, StorageError, migrate};
    let s = SqliteStorage::open_in_memory().unwrap();
    migrate(&s, durability_alarms::SCHEMA, &SchemaTarget::Latest).unwrap();
    s.transaction(|tx| {
        tx.sql()
            .execute(
                "INSERT INTO durability_alarm (id, at, token) VALUES (0, -5, 'x y')",
                [],
            )
            .map_err(|e| StorageError::backend("seed", e))
    })
    .unwrap();
    let e = s.transaction(|tx| tx.alarm_row()).unwrap_err();
    assert_eq!(e.kind(), StorageErrorKind::Corrupt);
}

durability_alarms::alarm_index_conformance!(
    redis_index_passes_the_conformance_suite,
    async {
        let prefix = unique_prefix("redis_conformance");
        redis_index(
            "redis_index_passes_the_conformance_suite",
            &format!("{prefix}1:"),
        )
        .await
        .map(|ix| (ix, ()))
    },
    finish = redis_cleanup
);

#[tokio::test]
async fn redis_leases_run_on_server_time() {
    let prefix = unique_prefix("redis_server_time");
    let Some(ix) = redis_index_with(
        "redis_leases_run_on_server_time",
        &prefix,
        IndexTime::Server,
    )
    .await
    else {
        return;
    };
    let mut c = ix.connection();
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let server_now = secs * 1000 + micros / 1000;
    let a = ObjectId::new("a").unwrap();
    ix.upsert(&a, &Token::new("t").unwrap(), 5).await.unwrap();
    // The caller's `now` (0) is ignored: the job due at 5 ms is promoted by server time.
    assert_eq!(ix.promote(0, 10).await.unwrap(), 1);
    let claim = ix
        .claim(durability_alarms::ClaimReady {
            now: 0,
            lease_ms: 60_000,
            run: &Token::new("r").unwrap(),
        })
        .await
        .unwrap()
        .unwrap();
    let lease_from = claim.lease_until - 60_000;
    assert!(
        (server_now - 1_000..=server_now + 60_000).contains(&lease_from),
        "lease measured from server TIME ({lease_from} vs {server_now})"
    );
    redis_cleanup(&ix).await;
}

/// Ticks `dispatcher` and advances the clock until the index is empty.
async fn drain<I: AlarmIndex, D: durability_alarms::Dispatch>(
    d: &Dispatcher<I, D>,
    index: &I,
    clock: &ManualClock,
    step: i64,
    max_rounds: usize,
) {
    for _ in 0..max_rounds {
        d.tick().await.unwrap();
        if index.counts().await.unwrap().total() == 0 {
            return;
        }
        clock.advance(step);
    }
    panic!("index not drained: {:?}", index.counts().await.unwrap());
}

#[tokio::test]
async fn alarms_are_delivered_end_to_end_on_sqlite_files() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let index =
        Arc::new(SqliteAlarmIndex::open(dir.path().join("index.db"), Synchronous::Off).unwrap());
    let host: Arc<Host<SqliteStorage, SqliteAlarmIndex>> = Arc::default();
    let log = Log::default();
    let plan: Arc<dyn FailPlan> = Arc::new(FailFirst(2));
    for i in 0..5 {
        let storage = sqlite_object(&dir.path().join(format!("o{i}.db")));
        let o = host.open(
            &format!("o{i}"),
            storage,
            &clock,
            Arc::clone(&index),
            &log,
            Arc::clone(&plan),
        );
        o.alarms.set_alarm(START + i * 100).await.unwrap();
    }
    let d = dispatcher(&index, &host, &clock, 1);
    drain(&d, index.as_ref(), &clock, 10_000, 50).await;
    for i in 0..5 {
        assert_eq!(log.successes(&format!("o{i}")), 1);
        assert_eq!(
            host.get(&format!("o{i}")).alarms.get_alarm().await.unwrap(),
            None
        );
    }
    let c = d.counters().snapshot();
    assert_eq!((c.delivered, c.retry_scheduled), (5, 10));
}

/// Runs the dispatcher crash scenario once; returns the index calls made
/// before the crash point (or in total without one).
async fn dispatcher_crash_run<I, F, Fut>(open: &F, crash_at: Option<u64>, mode: CrashMode) -> u64
where
    I: AlarmIndex,
    F: Fn() -> Fut,
    Fut: Future<Output = I>,
{
    let clock = ManualClock::new(START);
    let setup = Arc::new(open().await);
    let host: Arc<Host<MemoryStorage, I>> = Arc::default();
    let log = Log::default();
    let plan: Arc<dyn FailPlan> = Arc::new(FailFirst(1));
    let names = ["a", "b", "c"];
    for (i, name) in names.iter().enumerate() {
        let o = host.open_in_memory(name, &clock, &setup, &log, &plan);
        o.alarms.set_alarm(START + i as i64 * 10).await.unwrap();
    }
    // Phase 1: a dispatcher that dies at its `crash_at`-th index call.
    let crashy = Arc::new(Crashy::index(open().await, crash_at, mode));
    let d1 = dispatcher(&crashy, &host, &clock, 3);
    for _ in 0..20 {
        let _ = d1.tick().await;
        if crashy.gate.crashed() {
            break;
        }
        clock.advance(5_000);
    }
    let calls = crashy.gate.calls();
    drop(d1);
    // Phase 2: a new dispatcher on the reopened index finishes the work.
    let index = Arc::new(open().await);
    let d2 = dispatcher(&index, &host, &clock, 4);
    drain(&d2, index.as_ref(), &clock, 60_000, 100).await;
    for name in names {
        assert!(
            log.successes(name) >= 1,
            "{name} delivered at least once (crash at {crash_at:?} {mode:?})"
        );
        assert_eq!(
            host.get(name).alarms.get_alarm().await.unwrap(),
            None,
            "{name} row cleared"
        );
    }
    calls
}

#[tokio::test]
async fn dispatcher_crash_at_every_index_call_on_sqlite_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let counter = Arc::new(Mutex::new(0u64));
    let base = dir.path().to_owned();
    // Each run gets its own file; within a run, every `open` reopens it.
    let current = Arc::new(Mutex::new(base.join("index-0.db")));
    let cur = Arc::clone(&current);
    let open = move || {
        let path = cur.lock().unwrap().clone();
        async move { SqliteAlarmIndex::open(path, Synchronous::Off).unwrap() }
    };
    // Rotate the file per run by wrapping the scenario.
    let rotate = |c: &Arc<Mutex<u64>>| {
        let mut n = c.lock().unwrap();
        *n += 1;
        *current.lock().unwrap() = base.join(format!("index-{n}.db"));
    };
    rotate(&counter);
    let total = dispatcher_crash_run(&open, None, CrashMode::Before).await;
    let mut tried = 0;
    for mode in [CrashMode::Before, CrashMode::After] {
        for n in 1..=total {
            rotate(&counter);
            dispatcher_crash_run(&open, Some(n), mode).await;
            tried += 1;
        }
    }
    assert!(tried >= 20);
    eprintln!(
        "alarms sqlite: dispatcher crash points tried: {tried} (index calls per run: {total})"
    );
}

#[tokio::test]
async fn dispatcher_crash_at_every_index_call_on_redis_loses_nothing() {
    let prefix = unique_prefix("redis_crash");
    let Some(probe) = redis_index("dispatcher_crash_on_redis", &prefix).await else {
        return;
    };
    let run = Arc::new(Mutex::new(0u64));
    let r = Arc::clone(&run);
    let p = prefix.clone();
    let open = move || {
        let prefix = format!("{p}{}:", r.lock().unwrap());
        async move { redis_index("crash", &prefix).await.unwrap() }
    };
    let total = dispatcher_crash_run(&open, None, CrashMode::Before).await;
    let mut tried = 0;
    for mode in [CrashMode::Before, CrashMode::After] {
        for n in 1..=total {
            *run.lock().unwrap() += 1;
            dispatcher_crash_run(&open, Some(n), mode).await;
            tried += 1;
        }
    }
    eprintln!(
        "alarms redis: dispatcher crash points tried: {tried} (index calls per run: {total})"
    );
    delete_prefix(probe.connection(), &prefix).await.unwrap();
}

/// A host of objects on SQLite files with a SQLite alarm index.
type FileHost = Host<SqliteStorage, SqliteAlarmIndex>;

/// An object of a [`FileHost`].
type FileObj = Obj<SqliteStorage, SqliteAlarmIndex>;

/// An object on a SQLite file whose backend flush of one alarm call is
/// lost: the call hangs at the index and is dropped with the process.
struct LostFlush {
    _dir: tempfile::TempDir,
    clock: ManualClock,
    index_path: std::path::PathBuf,
    obj_path: std::path::PathBuf,
    log: Log,
}

/// The alarm call whose flush is lost.
enum LostCall {
    /// `set_alarm(START + 10)`.
    Set,
    /// `delete_alarm()` after a `set_alarm(START + 10)` that landed.
    Delete,
}

impl LostFlush {
    /// Opens object `o` on a faulty index, makes `call` hang at the index
    /// and drops the call and the process.
    async fn crash(call: LostCall) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let lost = Self {
            clock: ManualClock::new(START),
            index_path: dir.path().join("index.db"),
            obj_path: dir.path().join("o.db"),
            log: Log::default(),
            _dir: dir,
        };
        let faulty = Arc::new(FaultIndex::new(
            SqliteAlarmIndex::open(&lost.index_path, Synchronous::Off).unwrap(),
        ));
        let host1: Arc<Host<SqliteStorage, FaultIndex<SqliteAlarmIndex>>> = Arc::default();
        let o = host1.open(
            "o",
            sqlite_object(&lost.obj_path),
            &lost.clock,
            Arc::clone(&faulty),
            &lost.log,
            Arc::new(NoFail),
        );
        let calls = match call {
            LostCall::Set => 1,
            LostCall::Delete => {
                o.alarms.set_alarm(START + 10).await.unwrap();
                2
            }
        };
        faulty.fail_next(Fault::Hang);
        let alarms = o.alarms.clone();
        let call = tokio::spawn(async move {
            match call {
                LostCall::Set => alarms.set_alarm(START + 10).await,
                LostCall::Delete => alarms.delete_alarm().await,
            }
        });
        while faulty.calls() < calls {
            tokio::task::yield_now().await;
        }
        call.abort();
        let _ = call.await;
        drop((o, host1));
        lost
    }

    /// The index reopened from its file.
    fn index(&self) -> Arc<SqliteAlarmIndex> {
        Arc::new(SqliteAlarmIndex::open(&self.index_path, Synchronous::Off).unwrap())
    }

    /// A fresh host with object `o` reopened from its file on `index`.
    fn reopen(&self, index: &Arc<SqliteAlarmIndex>) -> (Arc<FileHost>, Arc<FileObj>) {
        let host: Arc<FileHost> = Arc::default();
        let o = host.open(
            "o",
            sqlite_object(&self.obj_path),
            &self.clock,
            Arc::clone(index),
            &self.log,
            Arc::new(NoFail),
        );
        (host, o)
    }

    /// Reopens the index and the object as [`LostFlush::reopen`] does,
    /// checking first that the index holds `jobs.0` jobs, then that the
    /// object reads its alarm as `alarm.0` (each with its message).
    async fn reopen_expecting(
        &self,
        jobs: (u64, &str),
        alarm: (Option<i64>, &str),
    ) -> (Arc<SqliteAlarmIndex>, Arc<FileHost>, Arc<FileObj>) {
        let index = self.index();
        assert_eq!(index.counts().await.unwrap().total(), jobs.0, "{}", jobs.1);
        let (host, o) = self.reopen(&index);
        assert_eq!(o.alarms.get_alarm().await.unwrap(), alarm.0, "{}", alarm.1);
        (index, host, o)
    }

    /// Drains the index with a dispatcher of id `n` on the fresh `host`.
    async fn dispatch(
        &self,
        index: &Arc<SqliteAlarmIndex>,
        host: &Arc<FileHost>,
        n: u64,
    ) -> Dispatcher<SqliteAlarmIndex, FileHost> {
        let d = dispatcher(index, host, &self.clock, n);
        drain(&d, index.as_ref(), &self.clock, 1_000, 10).await;
        d
    }
}

/// Kills the object between its local commit and the backend flush (the
/// flush hangs and the call is dropped), reopens it from its SQLite file,
/// and checks the invariants.
#[tokio::test]
async fn object_crash_between_commit_and_flush_on_sqlite() {
    let mut tried = 0;
    // A set lost before the backend saw it: get_alarm repairs it, and it is delivered.
    {
        let lost = LostFlush::crash(LostCall::Set).await;
        tried += 1;
        let (index, host, _o) = lost
            .reopen_expecting(
                (0, "the flush never landed"),
                (Some(START + 10), "local row committed"),
            )
            .await;
        assert_eq!(
            index.counts().await.unwrap().total(),
            1,
            "read repair rewrote the job"
        );
        lost.dispatch(&index, &host, 5).await;
        assert_eq!(lost.log.successes("o"), 1);
    }
    // A delete lost before the backend saw it: the fenced row never runs.
    {
        let lost = LostFlush::crash(LostCall::Delete).await;
        tried += 1;
        let (index, host, o) = lost
            .reopen_expecting(
                (1, "the backend job is still there"),
                (None, "a pending delete reads as no alarm"),
            )
            .await;
        let d = lost.dispatch(&index, &host, 6).await;
        assert!(lost.log.events().is_empty(), "the fenced alarm never ran");
        assert_eq!(d.counters().snapshot().ignored, 1);
        o.alarms.delete_alarm().await.unwrap();
        let row = o.alarms.storage().transaction(|tx| tx.alarm_row()).unwrap();
        assert_eq!(row, None, "deleting again settles the row");
    }
    eprintln!("alarms: object crash points tried: {tried}");
}

/// The small soak: many alarms, random handler failures, random deletes and
/// dispatcher crashes; every alarm ends delivered, discarded or deleted, and
/// nothing runs after its delete returned.
async fn soak<I, F, Fut>(n: usize, seed: u64, open: F)
where
    I: AlarmIndex,
    F: Fn() -> Fut,
    Fut: Future<Output = I>,
{
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let clock = ManualClock::new(START);
    let setup = Arc::new(open().await);
    let host: Arc<Host<MemoryStorage, I>> = Arc::default();
    let log = Log::default();
    let plan: Arc<dyn FailPlan> = Arc::new(FailRandom(
        Mutex::new(rand::rngs::StdRng::seed_from_u64(seed + 1)),
        0.3,
    ));
    let names: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
    for name in &names {
        let o = host.open_in_memory(name, &clock, &setup, &log, &plan);
        o.alarms
            .set_alarm(START + rng.random_range(0..20_000))
            .await
            .unwrap();
    }
    let mut deleted = BTreeSet::new();
    let mut crashes = 0;
    let mut rounds = 0;
    loop {
        rounds += 1;
        assert!(rounds < 10_000, "soak did not converge");
        let crash_at = rng.random_range(1..400);
        let crashy = Arc::new(Crashy::index(
            open().await,
            Some(crash_at),
            CrashMode::After,
        ));
        let d = dispatcher(&crashy, &host, &clock, seed + rounds);
        while !crashy.gate.crashed() {
            let _ = d.tick().await;
            // Delete a few random alarms between ticks.
            for _ in 0..rng.random_range(0..3) {
                let name = &names[rng.random_range(0..n)];
                if host.get(name).alarms.delete_alarm().await.is_ok() {
                    deleted.insert(name.clone());
                    log.push(Event::Deleted {
                        object: name.clone(),
                    });
                }
            }
            clock.advance(rng.random_range(0..60_000));
            if setup.counts().await.unwrap().total() == 0 {
                break;
            }
        }
        crashes += u64::from(crashy.gate.crashed());
        if setup.counts().await.unwrap().total() == 0 {
            break;
        }
    }
    // Account for every alarm.
    let events = log.events();
    let (mut delivered, mut discarded, mut only_deleted) = (0, 0, 0);
    for name in &names {
        let fired: Vec<&Event> = events
            .iter()
            .filter(|e| matches!(e, Event::Fired { object, .. } if object == name))
            .collect();
        let ok = fired
            .iter()
            .any(|e| matches!(e, Event::Fired { ok: true, .. }));
        let last_failed = fired.iter().any(|e| {
            matches!(
                e,
                Event::Fired {
                    ok: false,
                    final_attempt: true,
                    ..
                }
            )
        });
        if ok {
            delivered += 1;
        } else if last_failed {
            discarded += 1;
        } else {
            assert!(
                deleted.contains(name),
                "{name} neither delivered, discarded nor deleted"
            );
            only_deleted += 1;
        }
        // Nothing runs after a delete of this object returned (no re-set in the soak).
        if let Some(pos) = events
            .iter()
            .position(|e| matches!(e, Event::Deleted { object } if object == name))
        {
            assert!(
                !events[pos..]
                    .iter()
                    .any(|e| matches!(e, Event::Fired { object, .. } if object == name)),
                "{name} ran after its delete returned"
            );
        }
        let row = host.get(name).alarms.get_alarm().await.unwrap();
        assert_eq!(row, None, "{name} row settled");
    }
    eprintln!(
        "alarms soak: {n} alarms, {delivered} delivered, {discarded} discarded, {only_deleted} deleted, {crashes} dispatcher crashes, {rounds} rounds"
    );
    assert_eq!(delivered + discarded + only_deleted, n);
}

#[tokio::test]
async fn soak_2k_alarms_with_failures_deletes_and_crashes_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("soak.db");
    soak(2_000, 11, || {
        let path = path.clone();
        async move { SqliteAlarmIndex::open(path, Synchronous::Off).unwrap() }
    })
    .await;
}

#[tokio::test]
async fn soak_500_alarms_with_failures_deletes_and_crashes_on_redis() {
    let prefix = unique_prefix("redis_soak");
    let Some(probe) = redis_index("soak_on_redis", &prefix).await else {
        return;
    };
    let p = prefix.clone();
    soak(500, 12, move || {
        let p = p.clone();
        async move { redis_index("soak", &p).await.unwrap() }
    })
    .await;
    redis_cleanup(&probe).await;
}

#[tokio::test]
async fn the_manual_clock_drives_everything() {
    // Guard: the dispatcher never reads the wall clock; a run under a
    // manual clock far in the past still delivers exactly at its times.
    let clock = ManualClock::new(1_000);
    let index = Arc::new(SqliteAlarmIndex::open_in_memory().unwrap());
    let host: Arc<Host<MemoryStorage, SqliteAlarmIndex>> = Arc::default();
    let log = Log::default();
    let o = host.open(
        "o",
        Arc::new(conformance::memory_storage()),
        &clock,
        Arc::clone(&index),
        &log,
        Arc::new(NoFail),
    );
    o.alarms.set_alarm(2_000).await.unwrap();
    let d = dispatcher(&index, &host, &clock, 9);
    d.tick().await.unwrap();
    assert!(log.events().is_empty());
    clock.set(2_000);
    assert_eq!(clock.now_ms(), 2_000);
    d.tick().await.unwrap();
    assert_eq!(log.successes("o"), 1);
}

#[derive(Debug, Clone)]
enum Op {
    Set(usize, i64),
    Delete(usize),
    Tick,
    Advance(i64),
    FailNext(usize),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        (0..3usize, 0..5_000i64).prop_map(|(o, t)| Op::Set(o, t)),
        (0..3usize).prop_map(Op::Delete),
        Just(Op::Tick),
        (0..200_000i64).prop_map(Op::Advance),
        (0..3usize).prop_map(Op::FailNext),
    ]
}

/// Fails the tries the test asks for.
struct Planned(Mutex<BTreeSet<String>>);
impl FailPlan for Planned {
    fn fails(&self, object: &str, _: &durability_alarms::Fired) -> bool {
        self.0.lock().unwrap().remove(object)
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Against a model of "the live alarm per object": after any sequence
    /// of sets, deletes, ticks, clock moves and handler failures, draining
    /// the dispatcher runs each live alarm (or discards it after its last
    /// try), nothing runs after its delete returned, and local rows and
    /// backend jobs agree.
    #[test]
    fn alarms_match_a_model_of_live_alarms(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let clock = ManualClock::new(START);
            let index = Arc::new(SqliteAlarmIndex::open_in_memory().unwrap());
            let host: Arc<Host<MemoryStorage, SqliteAlarmIndex>> = Arc::default();
            let log = Log::default();
            let plan = Arc::new(Planned(Mutex::new(BTreeSet::new())));
            let names = ["p0", "p1", "p2"];
            for name in names {
                let p: Arc<dyn FailPlan> = plan.clone();
                host.open(name, Arc::new(conformance::memory_storage()), &clock, Arc::clone(&index), &log, p);
            }
            let d = Dispatcher::new(Arc::clone(&index), Arc::clone(&host), Arc::new(clock.clone()), config(1)).unwrap();
            // The model: the live alarm time per object, if any.
            let mut live: [Option<i64>; 3] = [None; 3];
            for op in ops {
                match op {
                    Op::Set(o, t) => {
                        let at = clock.now_ms() + t;
                        host.get(names[o]).alarms.set_alarm(at).await.unwrap();
                        live[o] = Some(at);
                    }
                    Op::Delete(o) => {
                        host.get(names[o]).alarms.delete_alarm().await.unwrap();
                        log.push(Event::Deleted { object: names[o].to_owned() });
                        live[o] = None;
                    }
                    Op::Tick => {
                        let before = log.events().len();
                        d.tick().await.unwrap();
                        for e in &log.events()[before..] {
                            if let Event::Fired { object, at, ok, final_attempt } = e {
                                let o = names.iter().position(|n| n == object).unwrap();
                                assert_eq!(live[o], Some(*at), "only the live alarm runs");
                                if *ok || *final_attempt {
                                    live[o] = None;
                                }
                            }
                        }
                    }
                    Op::Advance(ms) => clock.advance(ms),
                    Op::FailNext(o) => {
                        plan.0.lock().unwrap().insert(names[o].to_owned());
                    }
                }
                for (o, name) in names.iter().enumerate() {
                    let local = host.get(name).alarms.get_alarm().await.unwrap();
                    assert_eq!(local, live[o], "{name}: local row matches the model");
                    let job = index.job(&ObjectId::new(*name).unwrap()).await.unwrap();
                    assert_eq!(job.map(|j| j.due_at), live[o], "{name}: backend job matches the model");
                }
            }
            plan.0.lock().unwrap().clear();
            let before = log.events().len();
            drain(&d, index.as_ref(), &clock, 400_000, 50).await;
            for (o, name) in names.iter().enumerate() {
                let fired_ok = log.events()[before..].iter().any(|e| matches!(e, Event::Fired { object, ok: true, at, .. } if object == name && Some(*at) == live[o]));
                assert_eq!(fired_ok, live[o].is_some(), "{name}: every live alarm ran at the end");
            }
        });
    }
}
