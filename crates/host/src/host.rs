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

use crate::config::{ForwardHook, HostConfig};
use crate::error::{BoxError, HostError};
use crate::metrics::{self, Figure};
use crate::object::{Handle, Instance, MethodInput, ObjectCtx};
use crate::route_table::{RoutingCounters, RoutingState, RoutingStats};
use crate::settings::{ADVISORY_CACHE_ENTRIES, HostSettings};
use crate::storage::{DELETE_PAGE, DeleteAll, DeleteAllReport, StorageDeleteReport};
use crate::store::{DefaultObjectStore, ObjectKey, ObjectStore};
use crate::transport::InternalToken;

mod owner_loop;
mod start;

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
            Err(HostError::Handler(_)) => &self.handler_failed,
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
    open: Mutex<HashMap<ObjectId, Slot<I, O::Storage>>>,
    addresses: Mutex<lru::LruCache<(String, String), Arc<Address>>>,
    events: broadcast::Sender<OwnerEvent>,
    /// The receiver made with the channel, before the owner loop ran: the
    /// first [`Host::subscribe`] takes it, so it sees every change since
    /// start.
    first_events: Mutex<Option<broadcast::Receiver<OwnerEvent>>>,
    counters: Counters,
    stop: CancellationToken,
    dispatcher: OnceLock<Arc<HostDispatcher<S, I, O>>>,
    routed: OnceLock<Arc<HostRouted<S, I, O>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    routing: RoutingState<I, O::Storage>,
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
/// use durability_host::{BoxError, Host, HostConfig, OwnPolicy};
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
///     let config = HostConfig::new(Arc::new(leases), Arc::new(index), dir.path().join("objects"), "st1", "ns:shop", task)
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
            open: Mutex::new(HashMap::new()),
            addresses: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(ADVISORY_CACHE_ENTRIES).unwrap_or(NonZeroUsize::MIN),
            )),
            events,
            first_events: Mutex::new(Some(first_events)),
            counters: Counters::new(&task),
            stop: CancellationToken::new(),
            dispatcher: OnceLock::new(),
            routed: OnceLock::new(),
            tasks: Mutex::new(Vec::new()),
            routing: RoutingState {
                methods: config.methods,
                fetchers: config.fetchers,
                connectors: config.connectors,
                token: v.token,
                peers: config.peers,
                policy: config.endpoint_policy,
                transport: config.transport,
                hints: OwnerHintCache::default(),
                counters: RoutingCounters::new(&task),
            },
        });
        let spawn = start::Spawn {
            index: config.alarm_index,
            forward: config.forward,
            dispatcher: v.dispatcher,
            run_dispatcher: config.run_dispatcher,
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
            "host configured"
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
        let dispatcher = Arc::new(dispatcher);
        let _ = inner.dispatcher.set(Arc::clone(&dispatcher));
        let looper = self.clone();
        let owner_loop = tokio::spawn(async move { looper.owner_loop().await });
        lock(&inner.tasks).push(owner_loop);
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

    fn address(&self, class: &str, name: &str) -> Result<Arc<Address>, HostError> {
        let key = (class.to_owned(), name.to_owned());
        if let Some(a) = lock(&self.inner.addresses).get(&key) {
            return Ok(Arc::clone(a));
        }
        let (class_name, _) =
            self.inner
                .classes
                .get(class)
                .ok_or_else(|| HostError::UnknownClass {
                    class: class.to_owned(),
                })?;
        if name.is_empty() {
            return Err(HostError::InvalidObjectName {
                reason: "the name is empty".to_owned(),
            });
        }
        let id = ObjectId::new(format!("{}:{class}:{name}", self.inner.storage_id.as_str()))
            .map_err(|e| HostError::InvalidObjectName {
                reason: e.to_string(),
            })?;
        let scope = OwnerScope::for_object(
            self.inner.storage_id.clone(),
            class_name.clone(),
            &ObjectName::new(name),
            self.inner.settings.ownership.shard_count,
        )?;
        let address = Arc::new(Address {
            key: ObjectKey {
                class: class.to_owned(),
                name: name.to_owned(),
            },
            scope,
            id,
        });
        lock(&self.inner.addresses).put(key, Arc::clone(&address));
        Ok(address)
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
        let entry = lock(&self.inner.scopes).remove(scope);
        self.close_where(|a| &a.scope == scope).await;
        if let Some(entry) = entry {
            entry.token.cancel();
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

    async fn close_where(&self, matches: impl Fn(&Address) -> bool) -> usize {
        let slots: Vec<Slot<I, O::Storage>> = lock(&self.inner.open).values().cloned().collect();
        let mut closed = 0;
        for slot in slots {
            let mut guard = slot.lock().await;
            if guard.as_ref().is_some_and(|o| matches(&o.address))
                && let Some(o) = guard.take()
            {
                o.close();
                closed += 1;
            }
        }
        self.prune_slots();
        closed
    }

    /// Forgets registry slots that hold no open object and that nobody is
    /// using, so the registry stays as large as the set of open objects.
    fn prune_slots(&self) {
        lock(&self.inner.open).retain(|_, slot| {
            Arc::strong_count(slot) > 1 || slot.try_lock().map_or(true, |g| g.is_some())
        });
    }

    fn slot(&self, address: &Address) -> Slot<I, O::Storage> {
        let mut objects = lock(&self.inner.open);
        if let Some(slot) = objects.get(&address.id) {
            return Arc::clone(slot);
        }
        Arc::clone(objects.entry(address.id.clone()).or_default())
    }

    /// Resolves the object's owner and opens it (fenced) if needed.
    async fn resolve_open(
        &self,
        address: &Address,
    ) -> Result<(Arc<OpenObject<I, O::Storage>>, CancellationToken), HostError> {
        let inner = &self.inner;
        let generation = match inner
            .ownership
            .resolve(&address.scope, &inner.lifecycle)
            .await?
        {
            Resolution::Local(g) => g,
            Resolution::Remote {
                task, generation, ..
            } => {
                tracing::debug!(
                    event = "durability.host.owner_resolved",
                    scope = %address.scope,
                    owner = task.as_str(),
                    generation = generation.get(),
                    "object owned by another task"
                );
                return Err(HostError::NotOwner {
                    owner: task.as_str().to_owned(),
                    generation: generation.get(),
                });
            }
        };
        let slot = self.slot(address);
        let mut guard = slot.lock().await;
        if let Some(open) = guard.as_ref()
            && !open.closed.load(Ordering::SeqCst)
            && open.generation == generation
        {
            let open = Arc::clone(open);
            drop(guard);
            let token = self.note_scope(&address.scope, open.generation);
            return Ok((open, token));
        }
        if let Some(old) = guard.take() {
            old.close();
        }
        // Nothing is created for a scope the store no longer grants (an
        // inactive or deleted storage id): admission before the file, and
        // never under a tombstone.
        drop(inner.ownership.admit(&address.scope, generation).await?);
        if inner.objects.tombstone(&inner.storage_id).is_some() {
            return Err(HostError::Ownership(OwnershipError::StorageInactive {
                storage_id: inner.storage_id.as_str().to_owned(),
            }));
        }
        let open = Arc::new(self.open(address).await?);
        *guard = Some(Arc::clone(&open));
        drop(guard);
        inner.counters.cold.bump();
        tracing::info!(
            event = "durability.host.residency_selected",
            object = %address.id,
            residency = inner.settings.residency.as_str(),
            generation = open.generation.get(),
            dispatch = "cold",
            "object opened"
        );
        let token = self.note_scope(&address.scope, open.generation);
        Ok((open, token))
    }

    /// Opens an object: its storage in the object store, fenced at the scope's claim
    /// (through the generation floor), its scheduler, alarm and bridge.
    async fn open(&self, address: &Address) -> Result<OpenObject<I, O::Storage>, HostError> {
        let inner = &self.inner;
        let storage = inner.objects.open(&inner.storage_id, &address.key).await?;
        let fenced = inner
            .ownership
            .open_fenced(
                &address.scope,
                &inner.lifecycle,
                storage.as_ref(),
                Arc::clone(&inner.clock),
            )
            .await?;
        let scheduler = Scheduler::new(ObjectContext::with_clock(
            address.id.clone(),
            Arc::clone(&storage),
            Arc::clone(&inner.clock),
        ))
        .map_err(HostError::from_scheduler)?;
        let alarms = Alarms::new(&scheduler, Arc::clone(&inner.index)).map_err(HostError::Alarm)?;
        let bridge = SchedulerAlarm::new(&scheduler, alarms.clone());
        let ctx = ObjectCtx {
            class: address.key.class.clone(),
            name: address.key.name.clone(),
            id: address.id.clone(),
            scheduler: scheduler.clone(),
            alarms: alarms.clone(),
        };
        let (_, factory) =
            inner
                .classes
                .get(&address.key.class)
                .ok_or_else(|| HostError::UnknownClass {
                    class: address.key.class.clone(),
                })?;
        let instance = factory(&ctx).map_err(|source| HostError::Factory {
            object: address.id.to_string(),
            source,
        })?;
        // Keep the alarm row (and the index job) at the scheduler's alarm.
        let watcher = tokio::spawn(bridge.clone().watch());
        Ok(OpenObject {
            address: address.clone(),
            generation: fenced.lease.record.generation(),
            record: fenced.lease.record.clone(),
            budget: fenced.budget,
            scheduler,
            alarms,
            bridge,
            instance,
            watcher,
            last_used: AtomicI64::new(inner.clock.now_ms()),
            in_flight: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        })
    }

    /// Runs `work` on the object under admission and the watchdog.
    async fn dispatch<R, Fut>(
        &self,
        class: &str,
        name: &str,
        work: impl FnOnce(Arc<OpenObject<I, O::Storage>>, Generation) -> Fut,
    ) -> Result<R, HostError>
    where
        Fut: Future<Output = Result<R, HostError>>,
    {
        self.dispatch_with(class, name, None, work).await
    }

    /// [`Self::dispatch`], refusing with [`HostError::StaleFence`] unless
    /// the object is owned here at `expect` (a route fence).
    async fn dispatch_with<R, Fut>(
        &self,
        class: &str,
        name: &str,
        expect: Option<u64>,
        work: impl FnOnce(Arc<OpenObject<I, O::Storage>>, Generation) -> Fut,
    ) -> Result<R, HostError>
    where
        Fut: Future<Output = Result<R, HostError>>,
    {
        let span = tracing::debug_span!("durability.host.dispatch", class, object = name);
        let result = self
            .dispatch_inner(class, name, expect, work)
            .instrument(span)
            .await;
        self.inner.counters.count(&result);
        tracing::debug!(
            event = "durability.host.dispatch",
            class,
            object = name,
            outcome = match &result {
                Ok(_) => "ok",
                Err(e) => e.code(),
            },
            "call dispatched"
        );
        // An admission that proved the scope gone drops it here at once
        // (its objects close), not only at the next renew.
        let code = match &result {
            Err(HostError::Ownership(
                e @ (OwnershipError::StaleOwner { .. }
                | OwnershipError::LeaseExpired { .. }
                | OwnershipError::StorageInactive { .. }
                | OwnershipError::DeleteLocked { .. }),
            )) => Some(e.code()),
            // Another task owns a scope this host still counted as its own.
            Err(HostError::NotOwner { .. }) => Some("stale_owner"),
            _ => None,
        };
        let lost = code.and_then(|code| {
            self.scope_for(class, name)
                .ok()
                .filter(|scope| lock(&self.inner.scopes).contains_key(scope))
                .map(|scope| (scope, code))
        });
        if let Some((scope, code)) = lost {
            self.drop_scope(&scope, code).await;
        }
        // Sent to this task at a generation it does not own: the route
        // fence is stale (a trusted pre-dispatch `stale_owner`).
        match (result, expect) {
            (Err(HostError::NotOwner { .. }), Some(generation)) => {
                Err(HostError::StaleFence { generation })
            }
            (result, _) => result,
        }
    }

    async fn dispatch_inner<R, Fut>(
        &self,
        class: &str,
        name: &str,
        expect: Option<u64>,
        work: impl FnOnce(Arc<OpenObject<I, O::Storage>>, Generation) -> Fut,
    ) -> Result<R, HostError>
    where
        Fut: Future<Output = Result<R, HostError>>,
    {
        if !self.running() {
            // A fence for a scope this draining host no longer holds at
            // that generation is stale (the caller rediscovers once).
            if let Some(g) = expect {
                let scope = self.address(class, name)?.scope.clone();
                let held = self
                    .inner
                    .ownership
                    .probe()
                    .scopes
                    .iter()
                    .any(|s| s.scope == scope.host_id() && s.generation == g);
                if !held {
                    return Err(HostError::StaleFence { generation: g });
                }
            }
            return Err(HostError::Draining);
        }
        let address = self.address(class, name)?;
        let (open, token) = self.resolve_open(&address).await?;
        if let Some(g) = expect
            && open.generation.get() != g
        {
            return Err(HostError::StaleFence { generation: g });
        }
        let permit: AdmissionPermit = self
            .inner
            .ownership
            .admit(&address.scope, open.generation)
            .await?;
        open.in_flight.fetch_add(1, Ordering::SeqCst);
        let _busy = Busy(open.as_ref());
        open.last_used
            .store(self.inner.clock.now_ms(), Ordering::SeqCst);
        let generation = open.generation;
        let alarm_before = open.scheduler.alarm_at();
        let mut result = self
            .watched(
                &address.scope,
                generation,
                &token,
                work(Arc::clone(&open), generation),
            )
            .await;
        // A call that moved the object's alarm returns once the alarm index
        // holds the matching job (the seed's setAlarm contract): a crash
        // right after the call cannot lose the pending alarm.
        if open.scheduler.alarm_at() != alarm_before
            && let Err(e) = open.bridge.sync().await
            && result.is_ok()
        {
            result = Err(HostError::Alarm(e));
        }
        open.last_used
            .store(self.inner.clock.now_ms(), Ordering::SeqCst);
        drop(permit);
        result
    }

    /// Runs `fut` while the watchdog watches the scope; cancels it (drops
    /// it) when ownership moves or the scope is dropped.
    async fn watched<R>(
        &self,
        scope: &OwnerScope,
        generation: Generation,
        scope_token: &CancellationToken,
        fut: impl Future<Output = Result<R, HostError>>,
    ) -> Result<R, HostError> {
        let token = scope_token.child_token();
        let watch = self.inner.ownership.watch(scope, generation, token.clone());
        let fut = std::pin::pin!(fut);
        let watch = std::pin::pin!(watch);
        match select(fut, watch).await {
            Either::Left((result, _)) => {
                token.cancel();
                result
            }
            Either::Right((_, _)) => Err(HostError::OwnershipLost {
                scope: scope.to_string(),
            }),
        }
    }

    /// Calls an object of `class` named `name` on this host: resolves its
    /// owner (claiming a free scope), opens it on first use fenced at the
    /// scope's generation, admits the call (task, generation, lease budget,
    /// lifecycle), counts it in flight and runs `body` under the watchdog.
    /// Transactions inside commit through the storage fence.
    ///
    /// # Errors
    /// [`HostError::Draining`], [`HostError::NotOwner`],
    /// [`HostError::Ownership`] (refused before it started),
    /// [`HostError::OwnershipLost`] (cancelled while running),
    /// [`HostError::Fenced`] (the body returned a fence refusal),
    /// [`HostError::Handler`] (the body's own error), and the name, class
    /// and open errors.
    pub async fn call<T, R, F, Fut>(&self, class: &str, name: &str, body: F) -> Result<R, HostError>
    where
        T: Send + Sync + 'static,
        F: FnOnce(Handle<T, I, O::Storage>) -> Fut,
        Fut: Future<Output = Result<R, BoxError>>,
    {
        self.dispatch(class, name, |open, generation| async move {
            let object =
                Arc::clone(&open.instance)
                    .downcast::<T>()
                    .map_err(|_| HostError::ClassType {
                        class: open.address.key.class.clone(),
                    })?;
            let handle = Handle {
                object,
                scheduler: open.scheduler.clone(),
                alarms: open.alarms.clone(),
                generation: generation.get(),
            };
            body(handle)
                .await
                .map_err(|e| match e.downcast::<StorageError>() {
                    Ok(s) => HostError::from_storage(*s),
                    Err(e) => HostError::Handler(e),
                })
        })
        .await
    }

    /// Runs a registered method's body under dispatch (see
    /// [`Self::dispatch_with`]); returns its value and the generation it
    /// ran under.
    pub(crate) async fn dispatch_expect<R, F, Fut>(
        &self,
        class: &str,
        name: &str,
        expect: Option<u64>,
        body: F,
    ) -> Result<(R, u64), HostError>
    where
        F: FnOnce(MethodInput<I, O::Storage>) -> Fut,
        Fut: Future<Output = Result<R, HostError>>,
    {
        self.dispatch_with(class, name, expect, |open, generation| async move {
            let input = MethodInput {
                instance: Arc::clone(&open.instance),
                scheduler: open.scheduler.clone(),
                alarms: open.alarms.clone(),
                generation: generation.get(),
            };
            let value = body(input).await.map_err(|e| match e {
                HostError::Handler(e) => match e.downcast::<StorageError>() {
                    Ok(s) => HostError::from_storage(*s),
                    Err(e) => HostError::Handler(e),
                },
                other => other,
            })?;
            Ok((value, generation.get()))
        })
        .await
    }

    /// Admits a WebSocket session on an object (see [`crate::connect`]):
    /// the checks of a dispatch ([`Self::dispatch_with`]: running host,
    /// owner at `expect`, admission), then the object's input and a hold
    /// that marks the object busy until the session ends.
    pub(crate) async fn admit_session(
        &self,
        class: &str,
        name: &str,
        expect: Option<u64>,
    ) -> Result<(MethodInput<I, O::Storage>, SessionHold<I, O::Storage>), HostError> {
        let scope = self.scope_for(class, name)?;
        self.dispatch_with(class, name, expect, |open, generation| async move {
            let ended = lock(&self.inner.scopes)
                .get(&scope)
                .filter(|e| e.generation == generation)
                .map(|e| e.token.child_token())
                .ok_or_else(|| HostError::StaleFence {
                    generation: generation.get(),
                })?;
            open.in_flight.fetch_add(1, Ordering::SeqCst);
            let input = MethodInput {
                instance: Arc::clone(&open.instance),
                scheduler: open.scheduler.clone(),
                alarms: open.alarms.clone(),
                generation: generation.get(),
            };
            let hold = SessionHold {
                open,
                ended,
                stop: self.inner.stop.clone(),
            };
            Ok((input, hold))
        })
        .await
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

    /// Runs one transaction on an object through the host (admission,
    /// fence, watchdog), like [`Host::call`] with a synchronous body.
    ///
    /// # Errors
    /// As [`Host::call`]; a storage error from the body or the commit is
    /// [`HostError::Fenced`] when the fence refused it, else
    /// [`HostError::Storage`].
    pub async fn transaction<T, R, F>(
        &self,
        class: &str,
        name: &str,
        body: F,
    ) -> Result<R, HostError>
    where
        T: Send + Sync + 'static,
        F: FnOnce(&T, &mut Transaction<'_, '_, O::Storage>) -> Result<R, StorageError>,
    {
        self.dispatch(class, name, |open, _| async move {
            let object =
                Arc::clone(&open.instance)
                    .downcast::<T>()
                    .map_err(|_| HostError::ClassType {
                        class: open.address.key.class.clone(),
                    })?;
            open.scheduler
                .transaction(|tx| body(&object, tx))
                .map_err(HostError::from_storage)
        })
        .await
    }

    /// Deletes one object's storage (Durable Objects' `deleteAll`): the object's
    /// own tables, views and triggers (every name not starting with the
    /// reserved `durability_` or `sqlite_`) are dropped in pages of at most
    /// [`DELETE_PAGE`], each page one transaction through the storage fence;
    /// then, unless [`DeleteAll::keep_alarm`], the due times of the
    /// object's own capabilities are cleared (the outbox's stay: committed
    /// entries are acknowledged work and still deliver), which moves or
    /// removes its alarm and the alarm index job; then the object is closed,
    /// so the next call reopens it (its factory runs on the emptied
    /// storage).
    ///
    /// It is admitted, counted in flight and watched like a call, so a
    /// stale host's delete fails closed at admission or at the first
    /// page's commit, and a drain waits for it.
    ///
    /// Not atomic and best-effort: a failure (or a lost
    /// ownership) leaves the pages already dropped; calling it again
    /// finishes the job. It does not exclude concurrent calls on the same
    /// object, which may write between pages: do not race it with other
    /// writes of the object. Capability state is kept: pending outbox
    /// entries, topology groups, schema versions and the storage fence.
    ///
    /// # Errors
    /// As [`Host::call`]; [`HostError::Fenced`] when a page's commit was
    /// refused, [`HostError::Storage`] when a page failed.
    pub async fn delete_all(
        &self,
        class: &str,
        name: &str,
        options: DeleteAll,
    ) -> Result<DeleteAllReport, HostError> {
        let (report, open) = self
            .dispatch(class, name, |open, _| async move {
                let mut report = DeleteAllReport::default();
                loop {
                    let (page, more) = open
                        .scheduler
                        .transaction(|tx| O::drop_own_page(tx.storage_tx(), DELETE_PAGE))
                        .map_err(HostError::from_storage)?;
                    report.pages += 1;
                    report.dropped.extend(page);
                    if !more {
                        break;
                    }
                    // Between pages the watchdog may cancel the delete.
                    tokio::task::yield_now().await;
                }
                if !options.keep_alarm {
                    report.cancelled_due = open
                        .scheduler
                        .transaction(|tx| {
                            let mut cleared = Vec::new();
                            for capability in O::due_capabilities(tx.storage_tx())? {
                                if !capability.starts_with("outbox:") {
                                    tx.set_due(&capability, None)?;
                                    cleared.push(capability);
                                }
                            }
                            Ok::<_, StorageError>(cleared)
                        })
                        .map_err(HostError::from_storage)?;
                }
                Ok((report, open))
            })
            .await?;
        // Close the object (when the registry still holds this opening), so
        // its instance is rebuilt on the emptied storage.
        let slot = self.slot(&open.address);
        {
            let mut guard = slot.lock().await;
            if guard.as_ref().is_some_and(|o| Arc::ptr_eq(o, &open))
                && let Some(o) = guard.take()
            {
                o.close();
            }
        }
        drop(slot);
        self.prune_slots();
        tracing::info!(
            event = "durability.host.storage_delete_all",
            object = %open.address.id,
            dropped = report.dropped.len(),
            pages = report.pages,
            cancelled_due = report.cancelled_due.len(),
            "object storage deleted"
        );
        Ok(report)
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

    /// Delivers an alarm on this host (the local side of the owner-routed
    /// dispatch: already admitted there).
    async fn deliver(&self, delivery: Delivery) -> DispatchOutcome {
        let span = tracing::debug_span!(
            "durability.host.alarm_delivery",
            object = %delivery.object,
            attempt = delivery.attempt
        );
        self.deliver_inner(delivery).instrument(span).await
    }

    async fn deliver_inner(&self, delivery: Delivery) -> DispatchOutcome {
        let object = delivery.object.to_string();
        let Some((storage, (class, name))) = object
            .split_once(':')
            .and_then(|(storage, rest)| Some((storage, rest.split_once(':')?)))
        else {
            return DispatchOutcome::Failed {
                reason: format!("object id {object} is not <storage>:<class>:<name>"),
            };
        };
        if storage != self.inner.storage_id.as_str() {
            // Another storage id's job (an old deployment's): this host never
            // opens its objects; the owner path found it admitted, so its
            // storage cannot be the active one for long. Discard it.
            return DispatchOutcome::Gone;
        }
        let outcome = match self.address(class, name) {
            Err(e) => DispatchOutcome::Failed {
                reason: e.to_string(),
            },
            Ok(address) => match self.resolve_open(&address).await {
                Err(HostError::Ownership(
                    OwnershipError::StorageInactive { .. } | OwnershipError::DeleteLocked { .. },
                )) => DispatchOutcome::Gone,
                Err(e @ HostError::Factory { .. }) => DispatchOutcome::Failed {
                    reason: e.to_string(),
                },
                Err(e) => DispatchOutcome::NeverStarted {
                    reason: e.to_string(),
                },
                Ok((open, token)) => {
                    open.in_flight.fetch_add(1, Ordering::SeqCst);
                    let _busy = Busy(open.as_ref());
                    open.last_used
                        .store(self.inner.clock.now_ms(), Ordering::SeqCst);
                    let run = async {
                        Ok::<_, HostError>(open.alarms.deliver(&delivery, &open.bridge).await)
                    };
                    match self
                        .watched(&address.scope, open.generation, &token, run)
                        .await
                    {
                        Ok(outcome) => outcome,
                        Err(e) => DispatchOutcome::Unknown {
                            reason: e.to_string(),
                        },
                    }
                }
            },
        };
        tracing::info!(
            event = "durability.host.alarm_executed",
            object = %delivery.object,
            attempt = delivery.attempt,
            outcome = ?outcome,
            "alarm delivery ran on this host"
        );
        outcome
    }

    /// Drains: stops new ownership (the owner loop ends), rejects new work,
    /// stops the alarm dispatcher (its held claims are released at once),
    /// waits up to `DO_DRAIN_IN_FLIGHT_TIMEOUT_MS` for admitted work, then
    /// releases the leases of matching generations so another host can
    /// claim them at once, all within `DO_DRAIN_TIMEOUT_MS`. A drain that
    /// runs out of time keeps its leases (failover waits for their expiry).
    /// Objects are closed afterwards. Calling it again returns an empty
    /// report.
    pub async fn shutdown(&self) -> DrainReport {
        let inner = &self.inner;
        let started = inner.clock.now_ms();
        let _ = inner
            .state
            .compare_exchange(RUNNING, DRAINING, Ordering::SeqCst, Ordering::SeqCst);
        tracing::info!(
            event = "durability.host.drain_started",
            in_flight = inner.ownership.in_flight(),
            "drain started"
        );
        inner.stop.cancel();
        if let Some(d) = inner.dispatcher.get() {
            d.stop();
        }
        let report = inner.ownership.drain().await;
        let deadline = started.saturating_add(
            i64::try_from(inner.settings.ownership.drain_timeout_ms).unwrap_or(i64::MAX),
        );
        let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&inner.tasks));
        for task in tasks {
            let abort = task.abort_handle();
            if timeout_at(&inner.clock, deadline, task).await.is_err() {
                abort.abort();
            }
        }
        self.close_where(|_| true).await;
        let released: Vec<(OwnerScope, Generation)> = match &report {
            DrainReport::Drained { released, .. }
            | DrainReport::ReleaseTimedOut { released, .. } => released.clone(),
            _ => Vec::new(),
        };
        {
            let mut scopes = lock(&inner.scopes);
            for (scope, _) in &released {
                if let Some(e) = scopes.remove(scope) {
                    e.token.cancel();
                }
            }
        }
        for (scope, generation) in &released {
            let _ = inner.events.send(OwnerEvent::Released {
                scope: scope.to_string(),
                generation: generation.get(),
            });
        }
        inner.state.store(STOPPED, Ordering::SeqCst);
        tracing::info!(
            event = "durability.host.drained",
            released = released.len(),
            timed_out = report.timed_out(),
            "drain finished"
        );
        report
    }

    /// Waits for SIGTERM or ctrl-c, then drains ([`Host::shutdown`]).
    pub async fn run_until_signal(&self) -> DrainReport {
        shutdown_signal().await;
        self.shutdown().await
    }

    /// The probe: task, owner state, in-flight gauge, dispatch outcomes.
    pub fn probe(&self) -> HostProbe {
        let inner = &self.inner;
        let ownership = inner.ownership.probe();
        let (open_objects, registry_entries) = {
            let objects = lock(&inner.open);
            let open = objects
                .values()
                .filter(|slot| slot.try_lock().map_or(true, |g| g.is_some()))
                .count();
            (open, objects.len())
        };
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
        }
    }
}

/// Resolves when the process gets SIGTERM or ctrl-c (SIGINT).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                return;
            }
            Err(error) => tracing::warn!(
                event = "durability.host.signal_unavailable",
                %error,
                "cannot listen for SIGTERM; waiting for ctrl-c only"
            ),
        }
    }
    let _ = tokio::signal::ctrl_c().await;
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

impl<S, I, O: ObjectStore> crate::config::HostForward for TransportForward<S, I, O>
where
    S: LeaseStore + LifecycleAdmin + Send + Sync + 'static,
    I: AlarmIndex + Send + Sync + 'static,
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
