//! [`Host`]: the owner loop, the object registry, fenced dispatch, alarms
//! and drain, over the ownership, alarms and scheduler crates.

use std::collections::HashMap;
use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use durability_alarms::{
    AlarmIndex, Alarms, Delivery, Dispatch, DispatchCounts, DispatchOutcome, Dispatcher,
    OwnerRouted, SchedulerAlarm, ScopeOf,
};
use durability_ownership::{
    AdmissionPermit, DrainReport, Generation, LeaseBudget, LeaseStore, LifecycleAdmin, LifecycleId,
    ObjectName, OwnerHintCache, OwnerRecord, OwnerScope, Ownership, OwnershipError, ProbeScope,
    Resolution, StorageId,
};
use durability_scheduler::{Clock, ObjectContext, ObjectId, Scheduler, StorageError, Transaction};
use durability_time::timeout_at;
use futures::future::{Either, select};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::bounds::{HostAlarms, HostLeases};
use crate::config::{ForwardHook, HostConfig};
use crate::error::{BoxError, HostError};
use crate::metrics::{self, Figure};
use crate::object::{Handle, Instance, MethodInput, ObjectCtx};
use crate::protocol::InternalToken;
use crate::route_table::{RoutingCounters, RoutingState, RoutingStats};
use crate::settings::{ADVISORY_CACHE_ENTRIES, HostSettings};
use crate::storage::{DELETE_PAGE, DeleteAll, DeleteAllReport, StorageDeleteReport};
use crate::store::{DefaultObjectStore, ObjectKey, ObjectStore};

mod dispatch;
mod drain;
mod owner_loop;
mod registry;
mod start;
mod sweep;

pub use drain::shutdown_signal;

/// The owner-routed dispatch of a host.
pub(crate) type HostRouted<S, I, O> =
    OwnerRouted<HostLocal<S, I, O>, ForwardHook, Arc<S>, Arc<dyn Clock>>;
/// The dispatcher type of a host.
type HostDispatcher<S, I, O> = Dispatcher<I, HostRouted<S, I, O>>;

/// A change of this host's ownership, published to
/// [`Host::subscribe`]rs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OwnerEvent {
    /// This host now owns the scope at this generation (claimed by the
    /// owner loop, or by a call or alarm delivery on first use).
    Acquired {
        /// The scope's host id.
        scope: String,
        /// The generation owned.
        generation: u64,
    },
    /// This host lost the scope (a renew or an admission found the lease
    /// gone or moved): its objects were closed and its running work
    /// cancelled.
    Lost {
        /// The scope's host id.
        scope: String,
        /// The generation that was owned.
        generation: u64,
        /// The ownership error code that proved the loss.
        code: &'static str,
    },
    /// A drain released the scope: another host may claim it at once.
    Released {
        /// The scope's host id.
        scope: String,
        /// The generation released.
        generation: u64,
    },
}

/// Dispatch outcome counters (the runtime's dispatch metrics, as plain numbers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatchStats {
    /// Calls that ran to completion (their own result, ok or not).
    pub completed: u64,
    /// Calls whose body returned an error.
    pub handler_failed: u64,
    /// Dispatches that opened their object (first use, reopen after an
    /// eviction or an ownership move): cold dispatches.
    pub cold: u64,
    /// Objects closed by the evictable mode.
    pub evicted: u64,
    /// Calls refused because the host was draining.
    pub refused_draining: u64,
    /// Calls refused because another task owns the object.
    pub refused_not_owner: u64,
    /// Calls refused by owner resolution, fencing or admission.
    pub refused_ownership: u64,
    /// Commits refused by the storage fence.
    pub fenced: u64,
    /// Calls cancelled by the watchdog (ownership moved while running).
    pub ownership_lost: u64,
}

/// The dispatch figures (plain numbers and facade counters, see
/// [`crate::metrics`]). Each dispatch counts under exactly one outcome;
/// the probe's `completed` adds the calls whose body failed.
#[derive(Debug)]
struct Counters {
    completed: Figure,
    handler_failed: Figure,
    refused_draining: Figure,
    refused_not_owner: Figure,
    refused_ownership: Figure,
    fenced: Figure,
    ownership_lost: Figure,
    /// Every other error (bad name or class, open or alarm failures, a
    /// stale route fence): only on the facade.
    failed: Figure,
    cold: Figure,
    evicted: Figure,
}

impl Counters {
    fn new(task: &str) -> Self {
        Self {
            completed: metrics::dispatch(task, "completed"),
            handler_failed: metrics::dispatch(task, "handler_failed"),
            refused_draining: metrics::dispatch(task, "refused_draining"),
            refused_not_owner: metrics::dispatch(task, "refused_not_owner"),
            refused_ownership: metrics::dispatch(task, "refused_ownership"),
            fenced: metrics::dispatch(task, "fenced"),
            ownership_lost: metrics::dispatch(task, "ownership_lost"),
            failed: metrics::dispatch(task, "failed"),
            cold: Figure::new("durability_host_cold_opens_total", task, &[]),
            evicted: Figure::new("durability_host_evictions_total", task, &[]),
        }
    }

    fn snapshot(&self) -> DispatchStats {
        DispatchStats {
            completed: self.completed.get() + self.handler_failed.get(),
            handler_failed: self.handler_failed.get(),
            cold: self.cold.get(),
            evicted: self.evicted.get(),
            refused_draining: self.refused_draining.get(),
            refused_not_owner: self.refused_not_owner.get(),
            refused_ownership: self.refused_ownership.get(),
            fenced: self.fenced.get(),
            ownership_lost: self.ownership_lost.get(),
        }
    }

    fn count(&self, result: &Result<impl Sized, HostError>) {
        let c = match result {
            Ok(_) => &self.completed,
            Err(HostError::Handler(_) | HostError::Method { .. }) => &self.handler_failed,
            Err(HostError::Draining) => &self.refused_draining,
            Err(HostError::NotOwner { .. }) => &self.refused_not_owner,
            Err(HostError::Ownership(_)) => &self.refused_ownership,
            Err(HostError::Fenced(_)) => &self.fenced,
            Err(HostError::OwnershipLost { .. }) => &self.ownership_lost,
            Err(_) => &self.failed,
        };
        c.bump();
    }
}

/// Diagnostics: the probe (task and owner state) plus the in-flight
/// gauge and the dispatch outcome counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostProbe {
    /// This task.
    pub task: String,
    /// The advertised endpoint, if configured.
    pub endpoint: Option<String>,
    /// The storage id served.
    pub storage_id: String,
    /// `running`, `draining` or `stopped`.
    pub state: &'static str,
    /// `resident` or `evictable`.
    pub residency: &'static str,
    /// Owned scopes, generations and local lease budgets, sorted.
    pub scopes: Vec<ProbeScope>,
    /// Admitted work in flight (calls and alarm deliveries).
    pub in_flight: u64,
    /// Objects open now.
    pub open_objects: usize,
    /// Registry entries (open objects, and objects being opened or closed).
    pub registry_entries: usize,
    /// Dispatch outcomes.
    pub dispatch: DispatchStats,
    /// Alarm dispatcher outcomes (`do_alarm_dispatches`).
    pub alarms: DispatchCounts,
    /// Routing outcomes (calls between hosts).
    pub routing: RoutingStats,
    /// The effective owner lease, in milliseconds.
    pub owner_ttl_ms: u64,
    /// The effective owner-loop period, in milliseconds.
    pub renew_interval_ms: u64,
    /// The failover budget these give ([`HostSettings::failover_budget_ms`]).
    pub failover_budget_ms: u64,
    /// Whether the class shards are balanced over the live hosts.
    pub balance: bool,
}

/// What one owner-loop cycle did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CycleReport {
    /// Scopes renewed.
    pub renewed: usize,
    /// Scopes dropped (renew failed or ownership moved).
    pub lost: Vec<String>,
    /// Scopes newly claimed.
    pub claimed: Vec<String>,
    /// Objects closed as idle (evictable mode).
    pub evicted: usize,
    /// Scopes handed off to balance the class (drained and released).
    pub handed_off: Vec<String>,
}

const RUNNING: u8 = 0;
const DRAINING: u8 = 1;
const STOPPED: u8 = 2;

/// A validated object address (the advisory name cache's entries).
#[derive(Debug, Clone)]
struct Address {
    key: ObjectKey,
    scope: OwnerScope,
    id: ObjectId,
}

/// An object's owner scope, shared with its cached address
/// ([`Host::shared_scope`]).
pub(crate) struct SharedScope(Arc<Address>);

impl std::ops::Deref for SharedScope {
    type Target = OwnerScope;

    fn deref(&self) -> &OwnerScope {
        &self.0.scope
    }
}

/// One open object.
struct OpenObject<I, D> {
    address: Address,
    generation: Generation,
    record: OwnerRecord,
    budget: Arc<LeaseBudget>,
    scheduler: Scheduler<D>,
    alarms: Alarms<D, I>,
    bridge: SchedulerAlarm<D, I>,
    instance: Instance,
    watcher: JoinHandle<()>,
    last_used: AtomicI64,
    in_flight: AtomicU64,
    closed: AtomicBool,
}

impl<I, D: durability_scheduler::Storage> OpenObject<I, D> {
    fn close(&self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            // The object's alarm capability holds the object and its
            // scheduler: detached, the cycle is gone.
            self.scheduler.detach(crate::alarm::OBJECT_ALARM);
            self.watcher.abort();
            self.scheduler.abort_background();
        }
    }
}

/// Counts a call on its object while it runs (eviction skips busy objects).
struct Busy<'a, I, D>(&'a OpenObject<I, D>);

impl<I, D> Drop for Busy<'_, I, D> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A WebSocket session's hold on its object: the object counts as busy
/// (idle eviction skips it) until the hold is dropped.
pub(crate) struct SessionHold<I, D> {
    open: Arc<OpenObject<I, D>>,
    ended: CancellationToken,
    stop: CancellationToken,
}

impl<I, D> SessionHold<I, D> {
    /// Resolves when the session must end: its scope was lost here (or
    /// moved to another generation), or the host started draining.
    pub(crate) async fn ended(&self) {
        tokio::select! {
            () = self.ended.cancelled() => {}
            () = self.stop.cancelled() => {}
        }
    }
}

impl<I, D> Drop for SessionHold<I, D> {
    fn drop(&mut self) {
        self.open.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

type Slot<I, D> = Arc<tokio::sync::Mutex<Option<Arc<OpenObject<I, D>>>>>;

struct ScopeEntry {
    generation: Generation,
    token: CancellationToken,
}

struct Inner<S, I, O: ObjectStore> {
    ownership: Ownership<Arc<S>, Arc<dyn Clock>>,
    index: Arc<I>,
    clock: Arc<dyn Clock>,
    storage_id: StorageId,
    lifecycle: LifecycleId,
    endpoint: Option<String>,
    objects: O,
    classes: start::Classes<I, O::Storage>,
    settings: HostSettings,
    targets: Vec<OwnerScope>,
    state: AtomicU8,
    scopes: Mutex<HashMap<OwnerScope, ScopeEntry>>,
    registry: registry::Registry<I, O::Storage>,
    events: broadcast::Sender<OwnerEvent>,
    /// The receiver made with the channel, before the owner loop ran: the
    /// first [`Host::subscribe`] takes it, so it sees every change since
    /// start.
    first_events: Mutex<Option<broadcast::Receiver<OwnerEvent>>>,
    counters: Counters,
    stop: CancellationToken,
    /// Cancelled when the host found it cannot go on (another live process
    /// runs under its task id): [`Host::run_until_signal`] then drains.
    fatal: CancellationToken,
    dispatcher: OnceLock<Arc<HostDispatcher<S, I, O>>>,
    routed: OnceLock<Arc<HostRouted<S, I, O>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    routing: RoutingState<I, O::Storage>,
    /// The balancing state between owner cycles.
    balancer: Mutex<durability_ownership::balance::Balancer>,
    /// Scopes acquired at a later generation, for the takeover sweep.
    sweeps: sweep::Queue,
}

/// The runtime: owns class shards, opens objects fenced at the current
/// generation, admits and runs calls and alarm deliveries under the
/// watchdog, and drains. Clones share one host.
///
/// # Example
///
/// Two hosts over one lease store, alarm index and object directory (on a
/// shared file system in production; a temporary directory here). The
/// first call on `a` claims the object's shard and opens the object fenced
/// at that generation; `b` refuses the object while `a` owns it (with no
/// transport between them); `a` drains, releasing its leases, and `b`
/// claims at once at a higher generation, with the object's state intact.
///
/// ```
/// use std::sync::Arc;
/// use durability_host::{BoxError, Host, HostConfig, HostIds, OwnPolicy};
/// use durability_host::{LifecycleId, StorageId, TaskId};
/// use durability_ownership::{DrainReport, ShardCount, SystemClock};
/// use durability_scheduler::StorageError;
/// use durability_storage_sqlite::Synchronous;
/// use durability_storage_sqlite::alarms::SqliteAlarmIndex;
/// use durability_storage_sqlite::ownership::SqliteLeaseStore;
///
/// struct Counter;
/// fn sql(e: impl std::error::Error + Send + Sync + 'static) -> StorageError {
///     StorageError::backend("counter", e)
/// }
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), BoxError> {
/// let dir = tempfile::tempdir()?;
/// let host = |task: &str, create: bool| {
///     let leases = SqliteLeaseStore::open(dir.path().join("leases.db"), SystemClock::new(), ShardCount::default())?;
///     let index = SqliteAlarmIndex::open(dir.path().join("alarms.db"), Synchronous::Full)?;
///     let ids = HostIds::new(StorageId::new("st1")?, LifecycleId::new("ns:shop")?, TaskId::new(task)?);
///     let config = HostConfig::new(Arc::new(leases), Arc::new(index), dir.path().join("objects"), ids)
///         .class("Counter", |ctx| {
///             ctx.scheduler.transaction(|tx| {
///                 tx.sql().execute_batch("CREATE TABLE IF NOT EXISTS counter (n INTEGER NOT NULL)").map_err(sql)
///             })?;
///             Ok::<_, BoxError>(Counter)
///         })
///         .own(OwnPolicy::OnDemand)
///         .create_active_storage_if_absent(create);
///     Ok::<_, BoxError>(Host::start(config))
/// };
/// let incr = |h: Host<_, _>| async move {
///     h.transaction::<Counter, _, _>("Counter", "c1", |_, tx| {
///         tx.sql().execute("INSERT INTO counter (n) VALUES (1)", []).map_err(sql)?;
///         tx.sql().query_row("SELECT COUNT(*) FROM counter", [], |r| r.get::<_, i64>(0)).map_err(sql)
///     })
///     .await
/// };
/// let a = host("a", true)?.await?;
/// let b = host("b", false)?.await?;
///
/// assert_eq!(incr(a.clone()).await?, 1);
/// let first = a.probe().scopes[0].generation;
/// assert_eq!(incr(b.clone()).await.unwrap_err().code(), "host_not_owner");
///
/// let DrainReport::Drained { released, .. } = a.shutdown().await else { panic!("drained") };
/// assert_eq!(released.len(), 1);
/// assert_eq!(incr(b.clone()).await?, 2, "the state moved with the object");
/// assert!(b.probe().scopes[0].generation > first);
/// b.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub struct Host<S, I, O: ObjectStore = DefaultObjectStore> {
    inner: Arc<Inner<S, I, O>>,
}

impl<S, I, O: ObjectStore> std::fmt::Debug for Host<S, I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the internal token, and no per-object state.
        f.debug_struct("Host")
            .field("storage_id", &self.inner.storage_id)
            .field("endpoint", &self.inner.endpoint)
            .finish_non_exhaustive()
    }
}

impl<S, I, O: ObjectStore> Clone for Host<S, I, O> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<S, I, O: ObjectStore> Host<S, I, O>
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
    O: ObjectStore,
{
    /// Validates `config`, checks (or creates, when asked) the lifecycle's
    /// active storage pointer, then starts the owner loop and the alarm
    /// dispatcher. Nothing is opened, claimed or spawned before every check
    /// passed.
    ///
    /// # Errors
    /// [`HostError::InvalidSetting`] naming the bad setting;
    /// [`HostError::LifecycleRecord`] when the active storage pointer is
    /// missing (and not to be created), names another storage, or a
    /// whole-delete lock is held; [`HostError::Ownership`] when the lease
    /// store cannot be read.
    pub async fn start(mut config: HostConfig<S, I, O>) -> Result<Self, HostError> {
        let validated = start::validate(&mut config)?;
        start::check_records(&config, &validated).await?;
        let (host, spawn) = Self::build(config, validated);
        host.spawn(spawn)?;
        Ok(host)
    }

    /// The host's state, from a validated configuration (nothing runs
    /// yet), and what [`Self::spawn`] needs.
    fn build(
        config: HostConfig<S, I, O>,
        v: start::Validated<I, O::Storage>,
    ) -> (Self, start::Spawn<I>) {
        let clock = Arc::clone(&config.clock);
        let ownership = Ownership::with_endpoint(
            Arc::clone(&config.lease_store),
            Arc::clone(&clock),
            v.task,
            v.advertised,
            v.settings.ownership,
        );
        let (events, first_events) = broadcast::channel(1024);
        let task = ownership.task().as_str().to_owned();
        let inner = Arc::new(Inner {
            ownership,
            index: Arc::clone(&config.alarm_index),
            clock,
            storage_id: v.storage_id,
            lifecycle: v.lifecycle,
            endpoint: config.endpoint,
            objects: config.objects,
            classes: v.classes,
            settings: v.settings,
            targets: v.targets,
            state: AtomicU8::new(RUNNING),
            scopes: Mutex::new(HashMap::new()),
            registry: registry::Registry::new(),
            events,
            first_events: Mutex::new(Some(first_events)),
            counters: Counters::new(&task),
            stop: CancellationToken::new(),
            fatal: CancellationToken::new(),
            dispatcher: OnceLock::new(),
            routed: OnceLock::new(),
            tasks: Mutex::new(Vec::new()),
            routing: RoutingState {
                methods: config.methods,
                fetchers: config.fetchers,
                connectors: config.connectors,
                token: v.token,
                peers: config.peers,
                policy: crate::route_table::Endpoints::new(v.policy),
                transport: config.transport,
                hints: OwnerHintCache::default(),
                counters: RoutingCounters::new(&task),
            },
            balancer: Mutex::new(durability_ownership::balance::Balancer::default()),
            sweeps: sweep::Queue::default(),
        });
        let spawn = start::Spawn {
            index: config.alarm_index,
            forward: config.forward,
            dispatcher: v.dispatcher,
            run_dispatcher: config.run_dispatcher,
            permits: config.alarm_permits,
        };
        (Self { inner }, spawn)
    }

    /// Starts the owner loop and (unless turned off) the alarm dispatcher,
    /// which delivers through the owner-routed dispatch.
    fn spawn(&self, spawn: start::Spawn<I>) -> Result<(), HostError> {
        let inner = &self.inner;
        tracing::info!(
            event = "durability.host.residency_configured",
            residency = inner.settings.residency.as_str(),
            task = inner.ownership.task().as_str(),
            storage_id = inner.storage_id.as_str(),
            shard_count = inner.settings.ownership.shard_count.get(),
            owner_ttl_ms = inner.settings.ownership.owner_ttl_ms,
            lease_guard_ms = inner.settings.ownership.lease_guard_ms,
            renew_interval_ms = inner.settings.renew_interval(),
            failover_budget_ms = inner.settings.failover_budget_ms(),
            drain_in_flight_timeout_ms = inner.settings.ownership.drain_in_flight_timeout_ms,
            drain_timeout_ms = inner.settings.ownership.drain_timeout_ms,
            balance = inner.settings.balance,
            "host configured: a dead host's shards move within failover_budget_ms (owner TTL + one owner-loop period)"
        );
        let forward: Arc<dyn crate::config::HostForward> = match spawn.forward {
            Some(custom) => custom,
            None if inner.routing.token.is_some() => {
                Arc::new(TransportForward(Arc::downgrade(inner)))
            }
            None => Arc::new(crate::config::NoTransport),
        };
        let routed = Arc::new(OwnerRouted::new(
            HostLocal(Arc::downgrade(inner)),
            ForwardHook(forward),
            inner.ownership.clone(),
            self.scope_of(),
        ));
        let _ = inner.routed.set(Arc::clone(&routed));
        let dispatcher = Dispatcher::new(
            spawn.index,
            routed,
            Arc::clone(&inner.clock),
            spawn.dispatcher,
        )
        .map_err(|e| HostError::setting("dispatcher", e.to_string()))?;
        let dispatcher = Arc::new(match spawn.permits {
            Some(permits) => dispatcher.with_permits(permits),
            None => dispatcher,
        });
        let _ = inner.dispatcher.set(Arc::clone(&dispatcher));
        let looper = self.clone();
        let owner_loop = tokio::spawn(async move { looper.owner_loop().await });
        lock(&inner.tasks).push(owner_loop);
        let sweeper = self.clone();
        let sweeper = tokio::spawn(async move { sweeper.sweeper().await });
        lock(&inner.tasks).push(sweeper);
        if spawn.run_dispatcher {
            let run = tokio::spawn(async move { dispatcher.run().await });
            lock(&inner.tasks).push(run);
        }
        Ok(())
    }

    fn scope_of(&self) -> ScopeOf {
        let weak = Arc::downgrade(&self.inner);
        Arc::new(move |object: &ObjectId| {
            let inner = weak.upgrade().ok_or_else(|| "host stopped".to_owned())?;
            let (storage, rest) = object
                .as_str()
                .split_once(':')
                .ok_or_else(|| format!("object id {object} is not <storage>:<class>:<name>"))?;
            let (class, name) = rest
                .split_once(':')
                .ok_or_else(|| format!("object id {object} is not <storage>:<class>:<name>"))?;
            let storage = StorageId::new(storage).map_err(|e| e.to_string())?;
            let (class, _) = inner
                .classes
                .get(class)
                .ok_or_else(|| format!("object class {class} is not configured"))?;
            let scope = OwnerScope::for_object(
                storage,
                class.clone(),
                &ObjectName::new(name),
                inner.settings.ownership.shard_count,
            )
            .map_err(|e| e.to_string())?;
            Ok((scope, inner.lifecycle.clone()))
        })
    }

    /// Subscribes to this host's owner changes.
    ///
    /// The owner loop starts claiming inside [`Host::start`], so the first
    /// subscriber receives every change since start (up to the channel's
    /// 1,024 buffered events; beyond that the receiver reports `Lagged`);
    /// every later subscriber receives the changes after its own
    /// subscription. [`Host::probe`] gives the current state.
    pub fn subscribe(&self) -> broadcast::Receiver<OwnerEvent> {
        lock(&self.inner.first_events)
            .take()
            .unwrap_or_else(|| self.inner.events.subscribe())
    }

    /// The ownership state (for diagnostics and tests).
    pub fn ownership(&self) -> &Ownership<Arc<S>, Arc<dyn Clock>> {
        &self.inner.ownership
    }

    /// The owner scope of an object.
    ///
    /// # Errors
    /// [`HostError::UnknownClass`] or [`HostError::InvalidObjectName`].
    pub fn scope_for(&self, class: &str, name: &str) -> Result<OwnerScope, HostError> {
        Ok(self.address(class, name)?.scope.clone())
    }

    /// [`Self::scope_for`] without copying the scope: it is borrowed from
    /// the object's cached address (the per-call paths).
    pub(crate) fn shared_scope(&self, class: &str, name: &str) -> Result<SharedScope, HostError> {
        self.address(class, name).map(SharedScope)
    }

    fn running(&self) -> bool {
        self.inner.state.load(Ordering::SeqCst) == RUNNING
    }

    /// Remembers that this host owns `scope` at `generation` (publishing
    /// `Acquired` when new) and returns its cancellation token.
    fn note_scope(&self, scope: &OwnerScope, generation: Generation) -> CancellationToken {
        let mut scopes = lock(&self.inner.scopes);
        if let Some(entry) = scopes.get(scope) {
            if entry.generation == generation {
                return entry.token.clone();
            }
            entry.token.cancel();
        }
        let token = CancellationToken::new();
        scopes.insert(
            scope.clone(),
            ScopeEntry {
                generation,
                token: token.clone(),
            },
        );
        drop(scopes);
        self.inner.sweeps.push(scope, generation);
        tracing::info!(
            event = "durability.host.owner_acquired",
            scope = %scope,
            generation = generation.get(),
            "owner scope acquired"
        );
        let _ = self.inner.events.send(OwnerEvent::Acquired {
            scope: scope.to_string(),
            generation: generation.get(),
        });
        token
    }

    /// Forgets `scope`: cancels its running work, closes its objects and
    /// publishes `Lost`.
    async fn drop_scope(&self, scope: &OwnerScope, code: &'static str) {
        self.inner.ownership.forget(scope);
        if let Some(entry) = self.close_scope(scope).await {
            tracing::warn!(
                event = "durability.host.owner_lost",
                scope = %scope,
                generation = entry.generation.get(),
                code,
                "owner scope lost; its objects were closed"
            );
            let _ = self.inner.events.send(OwnerEvent::Lost {
                scope: scope.to_string(),
                generation: entry.generation.get(),
                code,
            });
        }
    }

    /// Removes `scope` from the held scopes, closes its objects and
    /// cancels its running work; its entry, when it was held.
    async fn close_scope(&self, scope: &OwnerScope) -> Option<ScopeEntry> {
        let entry = lock(&self.inner.scopes).remove(scope);
        self.close_where(|a| &a.scope == scope).await;
        if let Some(entry) = &entry {
            entry.token.cancel();
        }
        entry
    }

    pub(crate) fn routing(&self) -> &RoutingState<I, O::Storage> {
        &self.inner.routing
    }

    pub(crate) fn lifecycle(&self) -> &LifecycleId {
        &self.inner.lifecycle
    }

    pub(crate) fn endpoint(&self) -> Option<&str> {
        self.inner.endpoint.as_deref()
    }

    pub(crate) fn internal_token(&self) -> Option<&InternalToken> {
        self.inner.routing.token.as_ref()
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The owner-routed dispatch (set once the host started).
    pub(crate) fn routed(&self) -> Option<&Arc<HostRouted<S, I, O>>> {
        self.inner.routed.get()
    }

    /// Deletes this host's whole storage id ([`crate::delete_storage_id`]
    /// with this host's lease store, alarm index, object store and lifecycle). Every
    /// host serving it, this one included, then refuses its work
    /// (`delete_locked`, `storage_inactive`) and drops its scopes; drain
    /// them afterwards.
    ///
    /// # Errors
    /// As [`crate::delete_storage_id`].
    pub async fn delete_storage_id(&self) -> Result<StorageDeleteReport, HostError> {
        let inner = &self.inner;
        crate::storage::delete_storage_id(
            inner.ownership.store().as_ref(),
            inner.index.as_ref(),
            &inner.objects,
            inner.lifecycle.as_str(),
            inner.storage_id.as_str(),
        )
        .await
    }

    /// Readiness: `true` while the host runs, `false` from the moment its
    /// drain starts (served as `GET /ready`; liveness is `GET /health`).
    pub fn is_ready(&self) -> bool {
        self.inner.state.load(Ordering::SeqCst) == RUNNING
    }

    /// The probe: task, owner state, in-flight gauge, dispatch outcomes.
    pub fn probe(&self) -> HostProbe {
        let inner = &self.inner;
        let ownership = inner.ownership.probe();
        let (open_objects, registry_entries) = inner.registry.counts();
        HostProbe {
            task: ownership.task,
            endpoint: inner.endpoint.clone(),
            storage_id: inner.storage_id.as_str().to_owned(),
            state: match inner.state.load(Ordering::SeqCst) {
                RUNNING => "running",
                DRAINING => "draining",
                _ => "stopped",
            },
            residency: inner.settings.residency.as_str(),
            scopes: ownership.scopes,
            in_flight: ownership.in_flight,
            open_objects,
            registry_entries,
            dispatch: inner.counters.snapshot(),
            alarms: inner
                .dispatcher
                .get()
                .map(|d| d.counters().snapshot())
                .unwrap_or_default(),
            routing: inner.routing.counters.snapshot(),
            owner_ttl_ms: inner.settings.ownership.owner_ttl_ms,
            renew_interval_ms: inner.settings.renew_interval(),
            failover_budget_ms: inner.settings.failover_budget_ms(),
            balance: inner.settings.balance,
        }
    }
}

/// The local side of owner-routed alarm dispatch.
pub(crate) struct HostLocal<S, I, O: ObjectStore>(Weak<Inner<S, I, O>>);

impl<S, I, O: ObjectStore> Dispatch for HostLocal<S, I, O>
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
    O: ObjectStore,
{
    async fn dispatch(&self, delivery: Delivery) -> DispatchOutcome {
        match self.0.upgrade() {
            Some(inner) => Host { inner }.deliver(delivery).await,
            None => DispatchOutcome::NeverStarted {
                reason: "the host stopped".to_owned(),
            },
        }
    }
}

/// The default alarm forward of a host with an internal token: its
/// transport (see [`Host::forward_alarm`]).
struct TransportForward<S, I, O: ObjectStore>(Weak<Inner<S, I, O>>);

impl<S: HostLeases, I: HostAlarms, O: ObjectStore> crate::config::HostForward
    for TransportForward<S, I, O>
where
    O: ObjectStore,
{
    fn forward(
        &self,
        owner: &durability_alarms::RemoteOwner,
        delivery: Delivery,
    ) -> futures::future::BoxFuture<'static, DispatchOutcome> {
        let inner = self.0.upgrade();
        let owner = owner.clone();
        Box::pin(async move {
            match inner {
                Some(inner) => Host { inner }.forward_alarm(&owner, delivery).await,
                None => DispatchOutcome::NeverStarted {
                    reason: "the host stopped".to_owned(),
                },
            }
        })
    }
}
