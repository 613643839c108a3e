//! Support for the alarm tests: a recording handler, a host that routes
//! deliveries to objects, a crash-injecting index wrapper, and Redis setup.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};

use durability_alarms::conformance::{GatedCall, GatedIndex, IndexCall, IndexGate};
use durability_alarms::{
    AlarmError, AlarmHandler, AlarmIndex, AlarmTx, Alarms, BoxError, Delivery, Dispatch,
    DispatchOutcome, Fired, ObjectId,
};
use durability_scheduler::testkit::{CrashGate, CrashPoint, MemoryStorage};
use durability_scheduler::{ManualClock, ObjectContext, Scheduler, Storage};
use durability_storage_redis::alarms::{IndexTime, RedisAlarmIndex};
use durability_storage_redis::testkit::delete_prefix;

/// The manual clock's start: a realistic Unix time.
pub const START: i64 = 1_700_000_000_000;

/// One thing that happened, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The handler of `object` ran for the alarm scheduled at `at`.
    Fired {
        object: String,
        at: i64,
        ok: bool,
        final_attempt: bool,
    },
    /// `delete_alarm` returned `Ok` for `object`.
    Deleted { object: String },
}

/// A shared, ordered log of handler runs and completed deletes.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<Event>>>);

impl Log {
    pub fn push(&self, e: Event) {
        self.0.lock().unwrap().push(e);
    }
    pub fn events(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }
    pub fn successes(&self, object: &str) -> usize {
        self.events()
            .iter()
            .filter(|e| matches!(e, Event::Fired { object: o, ok: true, .. } if o == object))
            .count()
    }
}

/// Decides whether a handler run fails.
pub trait FailPlan: Send + Sync + 'static {
    fn fails(&self, object: &str, fired: &Fired) -> bool;
}

/// Never fails.
pub struct NoFail;
impl FailPlan for NoFail {
    fn fails(&self, _: &str, _: &Fired) -> bool {
        false
    }
}

/// Fails the first `n` tries of every object.
pub struct FailFirst(pub u32);
impl FailPlan for FailFirst {
    fn fails(&self, _: &str, fired: &Fired) -> bool {
        fired.attempt <= self.0
    }
}

/// Fails at random with probability `p` (seeded).
pub struct FailRandom(pub Mutex<rand::rngs::StdRng>, pub f64);
impl FailPlan for FailRandom {
    fn fails(&self, _: &str, _: &Fired) -> bool {
        use rand::Rng;
        self.0.lock().unwrap().random_bool(self.1)
    }
}

/// The handler of one object: logs its runs, fails as planned.
pub struct Handler {
    pub name: String,
    pub log: Log,
    pub plan: Arc<dyn FailPlan>,
}

impl AlarmHandler for Handler {
    async fn alarm(&self, fired: Fired) -> Result<(), BoxError> {
        let fail = self.plan.fails(&self.name, &fired);
        self.log.push(Event::Fired {
            object: self.name.clone(),
            at: fired.scheduled_at,
            ok: !fail,
            final_attempt: fired.final_attempt,
        });
        if fail {
            Err("planned failure".into())
        } else {
            Ok(())
        }
    }
}

/// One object: its alarms and handler.
pub struct Obj<S, I> {
    pub alarms: Alarms<S, I>,
    pub handler: Handler,
}

/// A host that owns every object it knows; unknown objects are gone.
pub struct Host<S, I> {
    pub objects: Mutex<BTreeMap<ObjectId, Arc<Obj<S, I>>>>,
}

impl<S, I> Default for Host<S, I> {
    fn default() -> Self {
        Self {
            objects: Mutex::new(BTreeMap::new()),
        }
    }
}

impl<I: AlarmIndex> Host<MemoryStorage, I> {
    /// [`Host::open`] of `name` on a fresh in-memory storage.
    pub fn open_in_memory(
        &self,
        name: &str,
        clock: &ManualClock,
        index: &Arc<I>,
        log: &Log,
        plan: &Arc<dyn FailPlan>,
    ) -> Arc<Obj<MemoryStorage, I>> {
        let storage = Arc::new(durability_alarms::conformance::memory_storage());
        self.open(
            name,
            storage,
            clock,
            Arc::clone(index),
            log,
            Arc::clone(plan),
        )
    }
}

impl<S, I> Host<S, I>
where
    S: Storage,
    for<'t> S::Tx<'t>: AlarmTx,
    I: AlarmIndex,
{
    /// Opens object `name` on `storage` and registers it.
    pub fn open(
        &self,
        name: &str,
        storage: Arc<S>,
        clock: &ManualClock,
        index: Arc<I>,
        log: &Log,
        plan: Arc<dyn FailPlan>,
    ) -> Arc<Obj<S, I>> {
        let id = ObjectId::new(name).unwrap();
        let ctx = ObjectContext::with_clock(id.clone(), storage, Arc::new(clock.clone()));
        let sched = Scheduler::new(ctx).unwrap();
        let obj = Arc::new(Obj {
            alarms: Alarms::new(&sched, index).unwrap(),
            handler: Handler {
                name: name.to_owned(),
                log: log.clone(),
                plan,
            },
        });
        self.objects.lock().unwrap().insert(id, Arc::clone(&obj));
        obj
    }

    pub fn get(&self, name: &str) -> Arc<Obj<S, I>> {
        let id = ObjectId::new(name).unwrap();
        Arc::clone(self.objects.lock().unwrap().get(&id).unwrap())
    }
}

impl<S, I> Dispatch for Host<S, I>
where
    S: Storage,
    for<'t> S::Tx<'t>: AlarmTx,
    I: AlarmIndex,
{
    async fn dispatch(&self, d: Delivery) -> DispatchOutcome {
        let obj = self.objects.lock().unwrap().get(&d.object).cloned();
        match obj {
            None => DispatchOutcome::Gone,
            Some(obj) => obj.alarms.deliver(&d, &obj.handler).await,
        }
    }
}

/// Where an injected index crash happens relative to the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// The call is lost before it reaches the index.
    Before,
    /// The call is applied, then the process dies before seeing the reply.
    After,
}

/// "Kills the dispatcher" at the n-th call of the index it gates
/// ([`GatedIndex`]): that call and every later one fail.
pub struct Crashy(CrashPoint<CrashMode>);

/// An index behind a [`Crashy`] gate.
pub type CrashyIndex<I> = GatedIndex<I, Crashy>;

impl Crashy {
    /// An index gated to crash at its `crash_at`-th call (never when `None`).
    pub fn index<I: AlarmIndex>(
        inner: I,
        crash_at: Option<u64>,
        mode: CrashMode,
    ) -> CrashyIndex<I> {
        GatedIndex::gated(inner, Self(CrashPoint::new(crash_at, mode)))
    }
    pub fn calls(&self) -> u64 {
        self.0.calls()
    }
    pub fn crashed(&self) -> bool {
        self.0.crashed()
    }
}

impl IndexGate for Crashy {
    async fn pass<T: Send>(&self, _: IndexCall, call: GatedCall<'_, T>) -> Result<T, AlarmError> {
        match self.0.next() {
            CrashGate::Dead => Err(AlarmError::unavailable("dispatcher is dead")),
            CrashGate::Pass => call.await,
            CrashGate::Crash(mode) => {
                if mode == CrashMode::After {
                    let _ = call.await;
                }
                Err(AlarmError::unknown("injected crash"))
            }
        }
    }
}

/// The Redis URL under test.
pub fn redis_url() -> String {
    std::env::var("DURABILITY_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A unique key prefix for one test.
pub fn unique_prefix(test: &str) -> String {
    let unique = RandomState::new().build_hasher().finish();
    format!("durability:test:{unique:016x}:{test}:")
}

/// A Redis index on the caller's clock with `prefix`, or `None` (printed)
/// when Redis is unreachable and services are not required.
pub async fn redis_index(test: &str, prefix: &str) -> Option<RedisAlarmIndex> {
    redis_index_with(test, prefix, IndexTime::Caller).await
}

pub async fn redis_index_with(
    test: &str,
    prefix: &str,
    time: IndexTime,
) -> Option<RedisAlarmIndex> {
    let url = redis_url();
    match RedisAlarmIndex::connect(&url, prefix, time).await {
        Ok(ix) => Some(ix),
        Err(e) if std::env::var("DURABILITY_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("Redis at {url} is required (DURABILITY_REQUIRE_SERVICES=1): {e}")
        }
        Err(e) => {
            eprintln!("skipped {test}: Redis at {url} unreachable: {e}");
            None
        }
    }
}

/// Deletes every key under `prefix`.
pub async fn redis_cleanup(ix: &RedisAlarmIndex) {
    delete_prefix(ix.connection(), ix.prefix()).await.unwrap();
}
