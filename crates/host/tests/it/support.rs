//! The test world and a `Counter` object class.

use std::sync::{Arc, Mutex, Weak};

use durability_alarms::DispatcherConfig;
use durability_host::{
    BoxError, Host, HostConfig, HostIds, HostSettings, LifecycleId, ObjectCtx, OwnPolicy,
    Residency, StorageId, TaskId,
};
use durability_ownership::{ManualClock, OwnershipSettings, ShardCount};
use durability_scheduler::{Capability, Scheduler, StorageError, Transaction};
use durability_storage_sqlite::alarms::SqliteAlarmIndex;
use durability_storage_sqlite::ownership::SqliteLeaseStore;
use durability_storage_sqlite::{SqliteStorage, Synchronous};
use futures::future::BoxFuture;

pub(crate) const START: i64 = 1_700_000_000_000;
pub(crate) const TTL: u64 = 10_000;
pub(crate) const GUARD: u64 = 1_000;
pub(crate) const STORAGE: &str = "st1";
pub(crate) const LIFECYCLE: &str = "ns:app";

pub(crate) type Store = SqliteLeaseStore<ManualClock>;
pub(crate) type TestHost = Host<Store, SqliteAlarmIndex>;
pub(crate) type TestConfig = HostConfig<Store, SqliteAlarmIndex>;
pub(crate) type Log = Arc<Mutex<Vec<String>>>;

/// A counter with one timer capability; every fired timer is logged as
/// `<task> <object>`.
pub(crate) struct Counter {
    inner: Arc<CounterInner>,
}

struct CounterInner {
    sched: Scheduler<SqliteStorage>,
    task: String,
    name: String,
    fired: Log,
}

/// A counter's timer capability: when it fires, `fire` runs on the
/// counter's state, if the object is still open.
pub(crate) struct Timer<T> {
    counter: Weak<T>,
    fire: fn(&T, i64),
}

impl<T> Timer<T> {
    pub(crate) fn of(counter: &Arc<T>, fire: fn(&T, i64)) -> Arc<Self> {
        Arc::new(Self {
            counter: Arc::downgrade(counter),
            fire,
        })
    }
}

impl<T: Send + Sync + 'static> Capability for Timer<T> {
    fn run(&self, now_ms: i64) -> BoxFuture<'_, ()> {
        let counter = self.counter.upgrade();
        Box::pin(async move {
            if let Some(counter) = counter {
                (self.fire)(&counter, now_ms);
            }
        })
    }
}

fn sql(e: rusqlite::Error) -> StorageError {
    StorageError::backend("counter sql", e)
}

impl CounterInner {
    /// Records the fired timer in the object and in the world's log.
    fn fire(&self, now_ms: i64) {
        let done = self.sched.transaction(|tx| {
            tx.sql()
                .execute("INSERT INTO fired (t) VALUES (?1)", [now_ms])
                .map_err(sql)?;
            tx.set_due("timer", None)
        });
        if done.is_ok() {
            self.fired
                .lock()
                .unwrap()
                .push(format!("{} {}", self.task, self.name));
        }
    }
}

impl Counter {
    pub(crate) fn open<I>(ctx: &ObjectCtx<I>, task: &str, fired: Log) -> Result<Self, BoxError> {
        ctx.scheduler.transaction(|tx| {
            tx.sql()
                .execute_batch(
                    "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL);
                     CREATE TABLE IF NOT EXISTS fired (t INTEGER NOT NULL);",
                )
                .map_err(sql)
        })?;
        let inner = Arc::new(CounterInner {
            sched: ctx.scheduler.clone(),
            task: task.to_owned(),
            name: ctx.name.clone(),
            fired,
        });
        ctx.scheduler
            .attach("timer", None, Timer::of(&inner, CounterInner::fire))?;
        Ok(Self { inner })
    }

    /// Adds one and returns the new value.
    pub(crate) fn incr(
        &self,
        tx: &mut Transaction<'_, '_, SqliteStorage>,
    ) -> Result<i64, StorageError> {
        let _ = &self.inner;
        tx.sql()
            .query_row(
                "INSERT INTO counter (id, n) VALUES (0, 1)
                 ON CONFLICT (id) DO UPDATE SET n = n + 1 RETURNING n",
                [],
                |r| r.get(0),
            )
            .map_err(sql)
    }

    /// Sets the timer to fire at `at`.
    pub(crate) fn set_timer(
        &self,
        tx: &mut Transaction<'_, '_, SqliteStorage>,
        at: i64,
    ) -> Result<(), StorageError> {
        tx.set_due("timer", Some(at))
    }
}

pub(crate) struct World {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) clock: ManualClock,
    pub(crate) fired: Log,
}

pub(crate) fn settings() -> HostSettings {
    HostSettings {
        ownership: OwnershipSettings {
            owner_ttl_ms: TTL,
            lease_guard_ms: GUARD,
            ..OwnershipSettings::default()
        },
        renew_interval_ms: Some(3_000),
        // The tests' dispatcher (part of the settings, so a test that
        // replaces the settings keeps it).
        alarms: DispatcherConfig {
            poll_ms: 100,
            idle_ms: 10,
            owner_wait_max_ms: 500,
            ..DispatcherConfig::fast()
        },
        ..HostSettings::default()
    }
}

/// The ids of host `task` serving `storage` of the tests' lifecycle.
pub(crate) fn ids(storage: &str, task: &str) -> HostIds {
    HostIds::new(
        StorageId::new(storage).unwrap(),
        LifecycleId::new(LIFECYCLE).unwrap(),
        TaskId::new(task).unwrap(),
    )
}

impl World {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            clock: ManualClock::new(START),
            fired: Arc::default(),
        }
    }

    pub(crate) fn store(&self) -> Arc<Store> {
        Arc::new(
            SqliteLeaseStore::open(
                self.dir.path().join("leases.db"),
                self.clock.clone(),
                ShardCount::default(),
            )
            .unwrap(),
        )
    }

    pub(crate) fn index(&self) -> Arc<SqliteAlarmIndex> {
        Arc::new(
            SqliteAlarmIndex::open(self.dir.path().join("alarms.db"), Synchronous::Normal).unwrap(),
        )
    }

    pub(crate) fn root(&self) -> std::path::PathBuf {
        self.dir.path().join("objects")
    }

    pub(crate) fn config(&self, task: &str) -> HostConfig<Store, SqliteAlarmIndex> {
        self.config_for(task, STORAGE)
    }

    /// A host config without any class.
    pub(crate) fn bare(&self, task: &str, storage: &str) -> HostConfig<Store, SqliteAlarmIndex> {
        HostConfig::new(self.store(), self.index(), self.root(), ids(storage, task))
            .clock(Arc::new(self.clock.clone()))
            .settings(settings())
    }

    pub(crate) fn config_for(
        &self,
        task: &str,
        storage: &str,
    ) -> HostConfig<Store, SqliteAlarmIndex> {
        let fired = Arc::clone(&self.fired);
        let owner = task.to_owned();
        self.bare(task, storage)
            .endpoint(&format!("http://127.0.0.1:8788/{task}"))
            .class("Counter", move |ctx| {
                Counter::open(ctx, &owner, Arc::clone(&fired))
            })
            .create_active_storage_if_absent(true)
    }

    pub(crate) async fn host(&self, task: &str) -> TestHost {
        Host::start(self.config(task)).await.unwrap()
    }

    /// A new world with host `a` started on it.
    pub(crate) async fn with_a() -> (Self, TestHost) {
        let w = Self::new();
        let a = w.host("a").await;
        (w, a)
    }

    /// A new world with hosts `a` and `b` started on it.
    pub(crate) async fn with_a_and_b() -> (Self, TestHost, TestHost) {
        let (w, a) = Self::with_a().await;
        let b = w.host("b").await;
        (w, a, b)
    }

    pub(crate) async fn host_with(
        &self,
        task: &str,
        own: OwnPolicy,
        residency: Residency,
    ) -> TestHost {
        let mut s = settings();
        s.residency = residency;
        s.eviction_idle_ms = 2_000;
        Host::start(self.config(task).own(own).settings(s))
            .await
            .unwrap()
    }

    /// A resident host that claims every shard.
    pub(crate) async fn all_shards(&self, task: &str) -> TestHost {
        self.host_with(task, OwnPolicy::AllShards, Residency::Resident)
            .await
    }

    /// A host whose lease store is wrapped in a `HookedStore` (faults and
    /// call counts).
    pub(crate) async fn hooked(
        &self,
        task: &str,
        hooks: &durability_ownership::conformance::Hooks,
    ) -> Host<durability_ownership::conformance::HookedStore<Store>, SqliteAlarmIndex> {
        self.hooked_owning(task, hooks, OwnPolicy::default()).await
    }

    /// [`Self::hooked`], claiming the scopes `own` names.
    pub(crate) async fn hooked_owning(
        &self,
        task: &str,
        hooks: &durability_ownership::conformance::Hooks,
        own: OwnPolicy,
    ) -> Host<durability_ownership::conformance::HookedStore<Store>, SqliteAlarmIndex> {
        let store = SqliteLeaseStore::open(
            self.dir.path().join("leases.db"),
            self.clock.clone(),
            ShardCount::default(),
        )
        .unwrap();
        let fired = Arc::clone(&self.fired);
        let owner = task.to_owned();
        let config = HostConfig::new(
            Arc::new(durability_ownership::conformance::HookedStore::new(
                store,
                hooks.clone(),
            )),
            self.index(),
            self.root(),
            ids(STORAGE, task),
        )
        .class("Counter", move |ctx| {
            Counter::open(ctx, &owner, Arc::clone(&fired))
        })
        .clock(Arc::new(self.clock.clone()))
        .settings(settings())
        .own(own)
        .create_active_storage_if_absent(true);
        Host::start(config).await.unwrap()
    }

    pub(crate) fn fired(&self) -> Vec<String> {
        self.fired.lock().unwrap().clone()
    }

    /// Sets the timer of `Counter` `name` on `host` due `in_ms` from now.
    /// `host` forgets the scope of `Counter` `name` (it stops renewing it,
    /// as a paused host does) and the clock passes the lease's end: another
    /// host may claim the scope now.
    pub(crate) async fn lapse(&self, host: &TestHost, name: &str) {
        host.ownership()
            .forget(&host.scope_for("Counter", name).unwrap());
        self.clock.advance(i64::try_from(TTL).unwrap() + 1);
        spin().await;
    }

    pub(crate) async fn set_timer_in(&self, host: &TestHost, name: &str, in_ms: i64) {
        let at = durability_ownership::Clock::now_ms(&self.clock) + in_ms;
        host.transaction::<Counter, _, _>("Counter", name, |c, tx| c.set_timer(tx, at))
            .await
            .unwrap();
    }

    /// Advances the clock in 100 ms steps until `fired` (`<task> <name>`)
    /// was recorded, at most 5 s; returns whether it was.
    pub(crate) async fn fires(&self, fired: &str) -> bool {
        advance_until(&self.clock, 100, 5_000, || {
            self.fired().iter().any(|f| f == fired)
        })
        .await
    }
}

/// Runs `f` to completion on a current-thread runtime of its own.
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Lets the hosts' tasks run (a current-thread runtime: each yield runs
/// whatever is ready).
pub(crate) async fn spin() {
    for _ in 0..300 {
        tokio::task::yield_now().await;
    }
}

/// Moves the clock in steps, letting the hosts run after each, until
/// `done` holds (at most `max_ms`); returns whether it held.
pub(crate) async fn advance_until(
    clock: &ManualClock,
    step: i64,
    max_ms: i64,
    done: impl Fn() -> bool,
) -> bool {
    let mut moved = 0;
    loop {
        spin().await;
        if done() {
            return true;
        }
        if moved >= max_ms {
            return false;
        }
        clock.advance(step);
        moved += step;
    }
}

pub(crate) async fn incr(host: &TestHost, name: &str) -> Result<i64, durability_host::HostError> {
    host.transaction::<Counter, _, _>("Counter", name, |c, tx| c.incr(tx))
        .await
}
