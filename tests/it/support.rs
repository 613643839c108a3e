//! Shared test support: a programmable recording sink and object helpers.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use durability_alarms::{Delivery, Dispatch, DispatchOutcome, ObjectId as AlarmObject, ScopeOf};
use durability_outbox::{
    ChannelConfig, Entry, EventHook, Outbox, OutboxEvent, OutboxTx, Sink, SinkError,
};
use durability_ownership::memory::InMemoryLeaseStore;
use durability_ownership::{
    ClassName, LifecycleAdmin, LifecycleId, ObjectName, OwnerScope, ShardCount, StorageId,
};
use durability_scheduler::StorageError;
use durability_scheduler::testkit::MemoryStorage;
use durability_scheduler::{Clock, ManualClock, ObjectContext, ObjectId, Scheduler, Storage};
use durability_storage_sqlite::{SqliteOptions, SqliteStorage};
use tokio::sync::Notify;

/// The manual clock's start: a realistic Unix time.
pub const START: i64 = 1_700_000_000_000;

/// How the sink behaves on its next calls.
#[derive(Clone)]
pub enum Mode {
    /// Acknowledge everything.
    Ok,
    /// Fail this many calls, then acknowledge.
    Fail(u32),
    /// Fail every n-th call.
    FailEvery(u32),
    /// Never return.
    Hang,
    /// Signal `entered`, wait for `release`, then acknowledge.
    Gate,
    /// Never return, but land the batch 2 s later on this clock.
    LandLate(ManualClock),
}

/// A sink that records what it applied, like a version-aware store.
#[derive(Clone)]
pub struct Recorder {
    mode: Arc<Mutex<Mode>>,
    log: Arc<Mutex<Vec<(String, u64, String)>>>,
    pub calls: Arc<AtomicU32>,
    current: Arc<AtomicUsize>,
    pub max_concurrent: Arc<AtomicUsize>,
    pub max_batch: Arc<AtomicUsize>,
    pub entered: Arc<Notify>,
    pub release: Arc<Notify>,
    delivered: Arc<Notify>,
    late: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::with_mode(Mode::Ok)
    }
}

impl Recorder {
    pub fn with_mode(mode: Mode) -> Self {
        Self {
            mode: Arc::new(Mutex::new(mode)),
            log: Arc::default(),
            calls: Arc::default(),
            current: Arc::default(),
            max_concurrent: Arc::default(),
            max_batch: Arc::default(),
            entered: Arc::default(),
            release: Arc::default(),
            delivered: Arc::default(),
            late: Arc::default(),
        }
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// Every successful delivery, in order.
    pub fn delivered(&self) -> Vec<(String, u64, String)> {
        self.log.lock().unwrap().clone()
    }

    /// Deliveries with repeats of the same key and version removed.
    pub fn delivered_first_times(&self) -> Vec<(String, u64, String)> {
        let mut seen = BTreeSet::new();
        self.delivered()
            .into_iter()
            .filter(|(k, v, _)| seen.insert((k.clone(), *v)))
            .collect()
    }

    /// What a sink keeping the highest version per key holds.
    pub fn applied(&self, key: &str) -> Option<(u64, String)> {
        let mut best: BTreeMap<&str, (u64, String)> = BTreeMap::new();
        let log = self.log.lock().unwrap();
        for (k, v, value) in log.iter() {
            if best.get(k.as_str()).is_none_or(|b| b.0 < *v) {
                best.insert(k, (*v, value.clone()));
            }
        }
        best.get(key).cloned()
    }

    pub async fn wait_delivered(&self, n: usize) {
        loop {
            let notified = self.delivered.notified();
            if self.log.lock().unwrap().len() >= n {
                return;
            }
            notified.await;
        }
    }

    pub async fn settle_late(&self) {
        let handles = std::mem::take(&mut *self.late.lock().unwrap());
        for h in handles {
            h.await.unwrap();
        }
    }

    fn record(&self, batch: &[(String, u64, String)]) {
        self.log.lock().unwrap().extend(batch.iter().cloned());
        self.delivered.notify_waiters();
    }
}

/// A countdown fault mode (`Fail(left)` and the like) in `mode`: while
/// `left` > 0, stores `again(left - 1)` and fails with `error()`; then
/// succeeds.
pub fn fail_while<M, E>(
    mode: &Mutex<M>,
    left: u32,
    again: impl FnOnce(u32) -> M,
    error: impl FnOnce() -> E,
) -> Result<(), E> {
    if left == 0 {
        return Ok(());
    }
    *mode.lock().unwrap() = again(left - 1);
    Err(error())
}

impl Sink<String> for Recorder {
    async fn publish(&self, batch: &[Entry<String>]) -> Result<(), SinkError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let now = self.current.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_concurrent.fetch_max(now, Ordering::SeqCst);
        self.max_batch.fetch_max(batch.len(), Ordering::SeqCst);
        let rows: Vec<(String, u64, String)> = batch
            .iter()
            .map(|e| (e.key().to_owned(), e.version(), e.value().clone()))
            .collect();
        let mode = self.mode.lock().unwrap().clone();
        let result = match mode {
            Mode::Ok => Ok(()),
            Mode::Fail(left) => {
                fail_while(&self.mode, left, Mode::Fail, || SinkError::new("sink down"))
            }
            Mode::FailEvery(k) => {
                if n.is_multiple_of(k) {
                    Err(SinkError::new("flaky"))
                } else {
                    Ok(())
                }
            }
            Mode::Hang => {
                self.entered.notify_one();
                std::future::pending::<()>().await;
                Ok(())
            }
            Mode::Gate => {
                self.entered.notify_one();
                self.release.notified().await;
                Ok(())
            }
            Mode::LandLate(clock) => {
                let me = self.clone();
                let at = clock.now_ms() + 2_000;
                let rows = rows.clone();
                let sleep = clock.sleep_until(at);
                self.late.lock().unwrap().push(tokio::spawn(async move {
                    sleep.await;
                    me.record(&rows);
                }));
                self.entered.notify_one();
                std::future::pending::<()>().await;
                Ok(())
            }
        };
        self.current.fetch_sub(1, Ordering::SeqCst);
        if result.is_ok() {
            self.record(&rows);
        }
        result
    }
}

/// One object: its scheduler and one outbox channel.
pub struct Obj<S: Storage> {
    pub sched: Scheduler<S>,
    pub outbox: Outbox<S, String, Recorder>,
    pub sink: Recorder,
    pub events: Arc<Mutex<Vec<OutboxEvent>>>,
}

pub fn memory() -> Arc<MemoryStorage> {
    Arc::new(durability_outbox::conformance::memory_storage())
}

/// A scheduler for object `id` on `storage` and the manual clock (`None`:
/// the scheduler refused to open).
pub fn scheduler_on<S: Storage>(
    id: &str,
    storage: Arc<S>,
    clock: &ManualClock,
) -> Option<Scheduler<S>> {
    let ctx =
        ObjectContext::with_clock(ObjectId::new(id).unwrap(), storage, Arc::new(clock.clone()));
    Scheduler::new(ctx).ok()
}

/// A log of lifecycle events and the hook that appends every event to it.
pub fn event_log() -> (Arc<Mutex<Vec<OutboxEvent>>>, EventHook) {
    let events: Arc<Mutex<Vec<OutboxEvent>>> = Arc::default();
    let e = Arc::clone(&events);
    (
        events,
        Arc::new(move |ev| e.lock().unwrap().push(ev.clone())),
    )
}

/// Opens an object on `storage`, recording every lifecycle event.
pub fn try_open<S: Storage>(
    storage: Arc<S>,
    clock: &ManualClock,
    sink: Recorder,
    config: ChannelConfig<String>,
) -> Option<Obj<S>>
where
    for<'t> S::Tx<'t>: OutboxTx,
{
    let sched = scheduler_on("object-1", storage, clock)?;
    let (events, hook) = event_log();
    let config = config.on_event(hook);
    let outbox = Outbox::attach(&sched, config, sink.clone()).ok()?;
    Some(Obj {
        sched,
        outbox,
        sink,
        events,
    })
}

pub fn open<S: Storage>(
    storage: Arc<S>,
    clock: &ManualClock,
    sink: Recorder,
    config: ChannelConfig<String>,
) -> Obj<S>
where
    for<'t> S::Tx<'t>: OutboxTx,
{
    try_open(storage, clock, sink, config).expect("object opens")
}

pub async fn wait_for_sleeper(clock: &ManualClock) {
    while clock.next_wake().is_none() {
        tokio::task::yield_now().await;
    }
}

/// What the alarm tests' hosts record, one line an event.
pub type Log = Arc<Mutex<Vec<String>>>;

/// Runs the alarm on this host (named by the first field): records it.
pub struct Local(pub &'static str, pub Log);

impl Dispatch for Local {
    async fn dispatch(&self, d: Delivery) -> DispatchOutcome {
        self.1
            .lock()
            .unwrap()
            .push(format!("{} ran {}", self.0, d.object));
        DispatchOutcome::Delivered
    }
}

/// An in-memory lease store on `clock` (the default shard count) on which
/// lifecycle `ns:rooms` has the active storage `st1`.
pub struct Rooms {
    pub store: Arc<InMemoryLeaseStore<ManualClock>>,
    pub lifecycle: LifecycleId,
    /// The owner scope and lifecycle of a `Room` object.
    pub scope_of: ScopeOf,
}

/// [`Rooms`] on `clock`.
pub async fn rooms(clock: &ManualClock) -> Rooms {
    let count = ShardCount::default();
    let lifecycle = LifecycleId::new("ns:rooms").unwrap();
    let storage = StorageId::new("st1").unwrap();
    let store = Arc::new(InMemoryLeaseStore::new(clock.clone(), count));
    store
        .set_active_storage(&lifecycle, Some(&storage))
        .await
        .unwrap();
    let l = lifecycle.clone();
    let scope_of: ScopeOf = Arc::new(move |object: &AlarmObject| {
        let scope = OwnerScope::for_object(
            storage.clone(),
            ClassName::new("Room").map_err(|e| e.to_string())?,
            &ObjectName::new(object.as_str()),
            count,
        )
        .map_err(|e| e.to_string())?;
        Ok((scope, l.clone()))
    });
    Rooms {
        store,
        lifecycle,
        scope_of,
    }
}

/// A manual clock at [`START`] and an object's SQLite storage in a fresh
/// directory (which holds the database file: keep it alive).
pub fn fresh_sqlite() -> (ManualClock, tempfile::TempDir, Arc<SqliteStorage>) {
    let dir = tempfile::tempdir().unwrap();
    let storage = sqlite(&dir);
    (ManualClock::new(START), dir, storage)
}

/// An object's SQLite storage in `dir` (file `obj.db`, default options).
pub fn sqlite(dir: &tempfile::TempDir) -> Arc<SqliteStorage> {
    Arc::new(SqliteStorage::open(dir.path().join("obj.db"), SqliteOptions::default()).unwrap())
}

/// Runs one SQL statement on `storage` in a transaction of its own (to
/// corrupt or change stored rows behind the library's back).
pub fn sql(storage: &SqliteStorage, statement: &str) {
    storage
        .transaction(|tx| {
            tx.sql()
                .execute(statement, [])
                .map_err(|e| StorageError::backend("test sql", e))
        })
        .unwrap();
}

/// The first column of the one row `statement` selects on `storage`.
pub fn query_one<T: rusqlite::types::FromSql>(storage: &SqliteStorage, statement: &str) -> T {
    storage
        .transaction(|tx| {
            tx.sql()
                .query_row(statement, [], |r| r.get(0))
                .map_err(|e| StorageError::backend("test sql", e))
        })
        .unwrap()
}

/// Runs `f` to completion on a current-thread runtime of its own (for tests
/// that install a thread-local metrics recorder or tracing subscriber).
pub fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}
