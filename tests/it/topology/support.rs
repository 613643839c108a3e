//! Topology test support: a fault-injecting publisher over an in-memory
//! publication store, recording members, and object helpers.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use durability_outbox::OutboxEvent;
use durability_scheduler::{Clock, ManualClock, Scheduler, Storage};
use durability_topology::conformance::MemoryPublication;
use durability_topology::{
    BoxError, EncodedSnapshot, Member, PublishError, Publisher, Role, Snapshot, SnapshotDeletion,
    StateChannel, StateUpdate, Topology, TopologyConfig, TopologyEvent, TopologyEventHook,
    TopologyTx,
};
use durability_topology_client::{ReadStore, decode};

use crate::support::{fail_while, scheduler_on};

/// The manual clock's start.
pub const START: i64 = 1_700_000_000_000;
/// The attempt timeout the tests configure.
pub const TIMEOUT: u64 = 1_000;

/// How the next publisher calls behave.
#[derive(Clone, Debug)]
pub enum PubMode {
    Ok,
    /// The next calls are refused (a definite rejection: nothing lands).
    Fail(u32),
    /// The next calls fail with an unknown outcome (and do not land).
    Unknown(u32),
    /// Never returns and never lands.
    Hang,
    /// Returns (and lands) this many ms after it started, on the clock.
    Slow(i64),
}

/// A publisher over a [`MemoryPublication`], with injected faults.
#[derive(Clone)]
pub struct FaultyPublisher {
    pub store: MemoryPublication,
    mode: Arc<Mutex<PubMode>>,
    clock: ManualClock,
    pub calls: Arc<AtomicUsize>,
    /// Every call that landed: (group, version, is_delete).
    pub landed: Arc<Mutex<Vec<(String, u64, bool)>>>,
}

impl FaultyPublisher {
    pub fn new(store: MemoryPublication, clock: &ManualClock) -> Self {
        Self {
            store,
            mode: Arc::new(Mutex::new(PubMode::Ok)),
            clock: clock.clone(),
            calls: Arc::default(),
            landed: Arc::default(),
        }
    }

    pub fn set_mode(&self, mode: PubMode) {
        *self.mode.lock().unwrap() = mode;
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The published snapshot as a reader decodes it.
    pub async fn published(&self, group: &str) -> Option<Snapshot> {
        let bytes = self.store.read(group).await.unwrap()?;
        Some(decode(&bytes).unwrap())
    }

    async fn gate(&self) -> Result<(), PublishError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mode = self.mode.lock().unwrap().clone();
        match mode {
            PubMode::Ok => Ok(()),
            PubMode::Fail(n) => fail_while(&self.mode, n, PubMode::Fail, || {
                PublishError::rejected("publisher down")
            }),
            PubMode::Unknown(n) => fail_while(&self.mode, n, PubMode::Unknown, || {
                PublishError::unknown("connection reset")
            }),
            PubMode::Hang => std::future::pending().await,
            PubMode::Slow(ms) => {
                let at = self.clock.now_ms() + ms;
                self.clock.sleep_until(at).await;
                Ok(())
            }
        }
    }
}

impl Publisher for FaultyPublisher {
    async fn write(
        &self,
        snapshot: &Snapshot,
        encoded: &EncodedSnapshot,
    ) -> Result<(), PublishError> {
        self.gate().await?;
        self.store.write(snapshot, encoded).await?;
        self.landed
            .lock()
            .unwrap()
            .push((snapshot.group.clone(), snapshot.version, false));
        Ok(())
    }

    async fn delete(&self, deletion: SnapshotDeletion<'_>) -> Result<(), PublishError> {
        self.gate().await?;
        self.store.delete(deletion).await?;
        self.landed
            .lock()
            .unwrap()
            .push((deletion.group.to_owned(), deletion.version, true));
        Ok(())
    }
}

/// How a member answers deliveries.
#[derive(Clone, Debug)]
pub enum MemberMode {
    Ok,
    Fail,
    Hang,
}

/// What a member applied per (member, channel): (version, value).
pub type Applied = BTreeMap<(String, String), (u64, serde_json::Value)>;

/// Members that record every update and apply only newer versions.
#[derive(Clone, Default)]
pub struct Members {
    modes: Arc<Mutex<BTreeMap<String, MemberMode>>>,
    /// Every update received, in order, per member.
    pub received: Arc<Mutex<BTreeMap<String, Vec<StateUpdate>>>>,
    /// What each member applied: channel → (version, value), versions only rising.
    pub applied: Arc<Mutex<Applied>>,
    /// Counts updates offered with an older version than the member applied
    /// (the member ignores them).
    pub regressions: Arc<AtomicUsize>,
    /// Every call that started, (member, version), in order.
    pub started: Arc<Mutex<Vec<(String, u64)>>>,
    /// Every hanging call whose future was dropped, (member, version).
    pub dropped: Arc<Mutex<Vec<(String, u64)>>>,
}

/// Records its call as dropped when a hanging delivery's future goes.
struct DropGuard(Arc<Mutex<Vec<(String, u64)>>>, (String, u64));

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.lock().unwrap().push(self.1.clone());
    }
}

impl Members {
    pub fn set_mode(&self, member: &str, mode: MemberMode) {
        self.modes.lock().unwrap().insert(member.to_owned(), mode);
    }

    pub fn received(&self, member: &str) -> Vec<StateUpdate> {
        self.received
            .lock()
            .unwrap()
            .get(member)
            .cloned()
            .unwrap_or_default()
    }

    pub fn applied(&self, member: &str, channel: &str) -> Option<serde_json::Value> {
        self.applied
            .lock()
            .unwrap()
            .get(&(member.to_owned(), channel.to_owned()))
            .map(|(_, v)| v.clone())
    }

    pub fn channel(&self, role: Role) -> StateChannel {
        let me = self.clone();
        StateChannel::new(Arc::new(move |member: Member, update: StateUpdate| {
            let me = me.clone();
            Box::pin(async move { me.deliver(member, update).await })
        }))
        .role(role)
    }

    async fn deliver(&self, member: Member, update: StateUpdate) -> Result<(), BoxError> {
        let mode = self
            .modes
            .lock()
            .unwrap()
            .get(&member.id)
            .cloned()
            .unwrap_or(MemberMode::Ok);
        match mode {
            MemberMode::Ok => {}
            MemberMode::Fail => return Err("member down".into()),
            MemberMode::Hang => {
                let call = (member.id.clone(), update.version);
                self.started.lock().unwrap().push(call.clone());
                let _guard = DropGuard(Arc::clone(&self.dropped), call);
                std::future::pending::<()>().await;
            }
        }
        self.received
            .lock()
            .unwrap()
            .entry(member.id.clone())
            .or_default()
            .push(update.clone());
        let mut applied = self.applied.lock().unwrap();
        let key = (member.id, update.channel.clone());
        match applied.get(&key) {
            Some((v, _)) if *v > update.version => {
                self.regressions.fetch_add(1, Ordering::SeqCst);
            }
            // A redelivery of the applied version (at least once): ignored.
            Some((v, _)) if *v == update.version => {}
            _ => {
                applied.insert(key, (update.version, update.value));
            }
        }
        Ok(())
    }
}

/// One coordinator object.
pub struct Coord<S: Storage>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    pub sched: Scheduler<S>,
    pub topology: Topology<S, FaultyPublisher>,
    /// The outbox events of the publication and state channels.
    pub events: Arc<Mutex<Vec<OutboxEvent>>>,
    /// Every other lifecycle event: the failure reports.
    pub failures: Arc<Mutex<Vec<TopologyEvent>>>,
}

/// The outbox events, the failure reports, and the hook that records them.
pub type EventLogs = (
    Arc<Mutex<Vec<OutboxEvent>>>,
    Arc<Mutex<Vec<TopologyEvent>>>,
    TopologyEventHook,
);

/// Logs of a coordinator's lifecycle events and the hook that fills them.
pub fn topology_event_log() -> EventLogs {
    let events: Arc<Mutex<Vec<OutboxEvent>>> = Arc::default();
    let failures: Arc<Mutex<Vec<TopologyEvent>>> = Arc::default();
    let (e, f) = (Arc::clone(&events), Arc::clone(&failures));
    let hook: TopologyEventHook = Arc::new(move |ev| match ev {
        TopologyEvent::Outbox(o) => e.lock().unwrap().push(o.clone()),
        other => f.lock().unwrap().push(other.clone()),
    });
    (events, failures, hook)
}

pub fn try_open<S: Storage>(
    storage: Arc<S>,
    clock: &ManualClock,
    publisher: &FaultyPublisher,
    members: &Members,
) -> Option<Coord<S>>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    let sched = scheduler_on("coordinator-1", storage, clock)?;
    let (events, failures, hook) = topology_event_log();
    let config = TopologyConfig::new()
        .attempt_timeout_ms(TIMEOUT)
        .retry_delay(Arc::new(|_| 1_000.0))
        .publish(publisher.clone())
        .state("limits", members.channel(Role::Write))
        .state("schema", members.channel(Role::Read))
        .on_event(hook);
    let topology = Topology::attach(&sched, config).ok()?;
    Some(Coord {
        sched,
        topology,
        events,
        failures,
    })
}

pub fn open<S: Storage>(
    storage: Arc<S>,
    clock: &ManualClock,
    publisher: &FaultyPublisher,
    members: &Members,
) -> Coord<S>
where
    for<'t> S::Tx<'t>: TopologyTx,
{
    try_open(storage, clock, publisher, members).expect("coordinator opens")
}

/// Runs `fut` to completion, moving the clock to the next sleeper whenever
/// everything is waiting on time.
pub async fn with_clock<T: Send + 'static>(
    clock: &ManualClock,
    fut: impl Future<Output = T> + Send + 'static,
) -> T {
    let handle = tokio::spawn(fut);
    loop {
        for _ in 0..20 {
            if handle.is_finished() {
                return handle.await.unwrap();
            }
            tokio::task::yield_now().await;
        }
        if let Some(at) = clock.next_wake() {
            clock.set(at);
        }
    }
}

/// Lets spawned tasks run.
pub async fn idle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// A storage that fails exactly one chosen transaction (rolled back, a
/// retryable backend error) and passes every other: a transient fault, unlike
/// [`durability_scheduler::testkit::CrashStorage`], after which the object
/// keeps running.
pub struct FlakyStorage<S> {
    inner: Arc<S>,
    /// Transactions still to pass before the one that fails (`None`: none fails).
    countdown: Mutex<Option<u64>>,
    failed: AtomicUsize,
}

impl<S: Storage> FlakyStorage<S> {
    pub fn new(inner: Arc<S>) -> Self {
        Self {
            inner,
            countdown: Mutex::new(None),
            failed: AtomicUsize::new(0),
        }
    }

    /// Lets `pass` transactions through, then fails the next one.
    pub fn fail_after(&self, pass: u64) {
        *self.countdown.lock().unwrap() = Some(pass);
    }

    /// How many transactions were failed.
    pub fn failed(&self) -> usize {
        self.failed.load(Ordering::SeqCst)
    }
}

impl<S: Storage> Storage for FlakyStorage<S> {
    type Tx<'t> = S::Tx<'t>;

    fn transaction<R, E>(&self, f: impl FnOnce(&mut S::Tx<'_>) -> Result<R, E>) -> Result<R, E>
    where
        E: From<durability_scheduler::StorageError>,
    {
        let fail = {
            let mut c = self.countdown.lock().unwrap();
            match *c {
                Some(0) => {
                    *c = None;
                    true
                }
                Some(n) => {
                    *c = Some(n - 1);
                    false
                }
                None => false,
            }
        };
        if fail {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(durability_scheduler::StorageError::backend(
                "injected transient failure",
                "database is locked",
            )
            .into());
        }
        self.inner.transaction(f)
    }

    fn schema(&self, capability: &str) -> &'static [durability_scheduler::SchemaStep] {
        self.inner.schema(capability)
    }

    fn apply_schema_step(
        &self,
        tx: &mut S::Tx<'_>,
        capability: &str,
        version: u32,
        direction: durability_scheduler::Direction,
    ) -> Result<(), durability_scheduler::StorageError> {
        self.inner
            .apply_schema_step(tx, capability, version, direction)
    }
}
