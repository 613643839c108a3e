//! [`HostConfig`]: what a host needs to start, set with a builder.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use durability_alarms::{Delivery, DispatchOutcome, DispatcherConfig, Forward, RemoteOwner};
use durability_ownership::{LifecycleId, StorageId, TaskId};
use durability_scheduler::{Clock, SystemClock};
use futures::future::BoxFuture;

use crate::connect::SessionHandler;
use crate::error::{BoxError, HostError};
use crate::object::{Class, Handler, Instance, ObjectCtx, erase};
use crate::settings::HostSettings;
use crate::store::sqlite::{SqliteObjectStore, SqliteOptions};
use crate::store::{DefaultObjectStore, ObjectStore};

pub(crate) type Factory<I, D> =
    Arc<dyn Fn(&ObjectCtx<I, D>) -> Result<Instance, BoxError> + Send + Sync>;

/// Which scopes the owner loop claims (besides those a call claims on
/// first use).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum OwnPolicy {
    /// Every shard of every class: the live hosts share them evenly
    /// ([`crate::HostSettings::balance`], on by default: a joining host gets
    /// its share by graceful hand-off, a dead host's shards spread over the
    /// survivors once their leases expire); with balancing off, the loop
    /// claims whichever is unowned.
    AllShards,
    /// These shards of these classes.
    Shards(Vec<(String, u32)>),
    /// None: scopes are claimed only by calls and alarm deliveries.
    #[default]
    OnDemand,
}

/// A custom transport to another host for alarm deliveries whose object is
/// owned elsewhere (the [`Forward`] hook, object safe). Without one, a host
/// with an internal token sends them over its [`crate::transport::Transport`]
/// (`POST /internal/do/alarm`), and a host without a token uses
/// [`NoTransport`].
pub trait HostForward: Send + Sync + 'static {
    /// Delivers on `owner`, fenced at its generation, and reports the
    /// outcome there.
    fn forward(
        &self,
        owner: &RemoteOwner,
        delivery: Delivery,
    ) -> BoxFuture<'static, DispatchOutcome>;
}

/// No transport. A delivery for an object owned elsewhere is reported never
/// started, and the dispatcher retries it once that owner's lease could
/// have run out (the owner's own dispatcher usually claims it first).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTransport;

impl HostForward for NoTransport {
    fn forward(
        &self,
        owner: &RemoteOwner,
        _delivery: Delivery,
    ) -> BoxFuture<'static, DispatchOutcome> {
        let reason = format!("no transport to task {}", owner.task.as_str());
        Box::pin(async move { DispatchOutcome::NeverStarted { reason } })
    }
}

/// [`HostForward`] as the alarms crate's [`Forward`].
pub(crate) struct ForwardHook(pub(crate) Arc<dyn HostForward>);

impl Forward for ForwardHook {
    fn forward(
        &self,
        owner: &RemoteOwner,
        delivery: Delivery,
    ) -> impl Future<Output = DispatchOutcome> + Send {
        self.0.forward(owner, delivery)
    }
}

/// Who a host is: the storage id it serves, the lifecycle (the logical
/// worker whose active storage pointer names the storage) and its task,
/// each checked when it was made ([`HostConfig::new`],
/// [`HostConfig::with_store`]). Each is its own type, so passing the task
/// where the storage id belongs does not compile.
///
/// ```
/// use durability_host::{HostIds, LifecycleId, StorageId, TaskId};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ids = HostIds::new(
///     StorageId::new("st1")?,
///     LifecycleId::new("ns:shop")?,
///     TaskId::new("task-1")?,
/// );
/// assert_eq!(ids.task.as_str(), "task-1");
/// // A bad id never reaches a configuration.
/// assert!(StorageId::new("bad:id").is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIds {
    /// The storage id served.
    pub storage: StorageId,
    /// The lifecycle.
    pub lifecycle: LifecycleId,
    /// This host's task.
    pub task: TaskId,
}

impl HostIds {
    /// The ids of a host: storage id, lifecycle, task.
    pub fn new(storage: StorageId, lifecycle: LifecycleId, task: TaskId) -> Self {
        Self {
            storage,
            lifecycle,
            task,
        }
    }
}

/// Everything a host needs. Build it with [`HostConfig::new`] and the
/// setters; [`crate::Host::start`] validates it all before anything starts.
pub struct HostConfig<S, I, O: ObjectStore = DefaultObjectStore> {
    pub(crate) lease_store: Arc<S>,
    pub(crate) alarm_index: Arc<I>,
    pub(crate) objects: O,
    pub(crate) ids: HostIds,
    pub(crate) endpoint: Option<String>,
    pub(crate) classes: BTreeMap<String, Factory<I, O::Storage>>,
    pub(crate) settings: HostSettings,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) own: OwnPolicy,
    pub(crate) create_active_storage: bool,
    pub(crate) forward: Option<Arc<dyn HostForward>>,
    pub(crate) run_dispatcher: bool,
    pub(crate) alarm_permits: Option<Arc<dyn durability_scheduler::Permits>>,
    pub(crate) methods: crate::rpc::Methods<I, O::Storage>,
    pub(crate) method_names: Vec<(String, String)>,
    pub(crate) fetchers: crate::fetch::Fetchers<I, O::Storage>,
    pub(crate) connectors: crate::connect::Connectors<I, O::Storage>,
    pub(crate) internal_token: Option<String>,
    pub(crate) peers: Arc<dyn crate::protocol::PeerDirectory>,
    pub(crate) endpoint_policy: Option<crate::protocol::EndpointPolicy>,
    pub(crate) transport: Arc<dyn crate::protocol::Transport>,
    pub(crate) sqlite_stores_on_network_fs: bool,
}

impl<S, I, O: ObjectStore> std::fmt::Debug for HostConfig<S, I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the internal token.
        f.debug_struct("HostConfig")
            .field("storage_id", &self.ids.storage.as_str())
            .field("task", &self.ids.task.as_str())
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl<S, I, O: ObjectStore> HostConfig<S, I, O> {
    /// A host of task `task` serving storage `storage_id` of lifecycle
    /// `lifecycle` (the logical worker whose active storage pointer names
    /// the storage), with leases in `lease_store`, alarm jobs in
    /// `alarm_index`, and its objects in `objects` (a store every host of
    /// the deployment shares). The ids are typed: each was checked when it
    /// was made. With the default SQLite directory: [`HostConfig::new`].
    pub fn with_store(lease_store: Arc<S>, alarm_index: Arc<I>, objects: O, ids: HostIds) -> Self {
        Self {
            lease_store,
            alarm_index,
            objects,
            ids,
            endpoint: None,
            classes: BTreeMap::new(),
            settings: HostSettings::default(),
            clock: Arc::new(SystemClock::new()),
            own: OwnPolicy::default(),
            create_active_storage: false,
            forward: None,
            run_dispatcher: true,
            alarm_permits: None,
            methods: BTreeMap::new(),
            method_names: Vec::new(),
            fetchers: BTreeMap::new(),
            connectors: BTreeMap::new(),
            internal_token: None,
            peers: Arc::new(crate::protocol::StaticPeers::default()),
            endpoint_policy: None,
            transport: Arc::new(crate::protocol::HttpTransport::default()),
            sqlite_stores_on_network_fs: false,
        }
    }

    /// The endpoint other hosts reach this one at (diagnostics and the
    /// transport; not used for local calls).
    #[must_use]
    pub fn endpoint(mut self, endpoint: &str) -> Self {
        self.endpoint = Some(endpoint.to_owned());
        self
    }

    /// Adds an object class: `factory` builds an object from its context
    /// when the object is opened (on first use, and again after an
    /// eviction or an ownership move).
    #[must_use]
    pub fn class<T, F>(mut self, name: &str, factory: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(&ObjectCtx<I, O::Storage>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        let factory: Factory<I, O::Storage> =
            Arc::new(move |ctx| factory(ctx).map(|t| Arc::new(t) as Instance));
        self.classes.insert(name.to_owned(), factory);
        self
    }

    /// Adds the object class `T` (named [`Class::NAME`]), built by
    /// `factory`, and returns its builder: the handlers registered there
    /// get a [`crate::Handle`] of `T`, so a handler of another type does
    /// not compile. [`ClassBuilder::done`] returns the configuration.
    #[must_use]
    pub fn class_of<T, F>(self, factory: F) -> ClassBuilder<S, I, O, T>
    where
        T: Class,
        F: Fn(&ObjectCtx<I, O::Storage>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        ClassBuilder {
            config: self.class(T::NAME, factory),
            alarm: None,
            class: std::marker::PhantomData,
        }
    }

    /// The settings, set in code.
    #[must_use]
    pub fn settings(mut self, settings: HostSettings) -> Self {
        self.settings = settings;
        self
    }

    /// The clock every loop, lease budget and object runs on (default: the
    /// system clock; tests inject a `ManualClock`).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Which scopes the owner loop claims.
    #[must_use]
    pub fn own(mut self, policy: OwnPolicy) -> Self {
        self.own = policy;
        self
    }

    /// When the lifecycle has no active storage pointer at start, create it
    /// (pointing at this host's storage id) instead of refusing to start.
    /// Meant for embedded deployments where the host is its own control
    /// plane; a pointer naming another storage is never overwritten.
    #[must_use]
    pub fn create_active_storage_if_absent(mut self, create: bool) -> Self {
        self.create_active_storage = create;
        self
    }

    /// The alarm dispatcher's configuration (its `stop_grace_ms` is capped
    /// at the drain's in-flight timeout): sets [`HostSettings::alarms`], so
    /// a later [`HostConfig::settings`] replaces it.
    #[must_use]
    pub fn dispatcher(mut self, config: DispatcherConfig) -> Self {
        self.settings.alarms = config;
        self
    }

    /// Whether this host runs an alarm dispatcher (default `true`). A host
    /// without one claims no alarm jobs; the deliveries of the objects it
    /// owns reach it from other hosts' dispatchers over the transport.
    #[must_use]
    pub fn alarm_dispatcher(mut self, run: bool) -> Self {
        self.run_dispatcher = run;
        self
    }

    /// Permits this host's alarm dispatcher holds while each delivery runs
    /// (`Dispatcher::with_permits`): with a cross-host source such as
    /// [`crate::semaphore::SemaphorePermits`], the deliveries of every host
    /// share one concurrency or rate limit. Without a permit a job waits,
    /// due again after the permit source's delay, with no try used.
    #[must_use]
    pub fn alarm_permits(mut self, permits: Arc<dyn durability_scheduler::Permits>) -> Self {
        self.alarm_permits = Some(permits);
        self
    }

    /// Registers RPC method `method` on objects of `class`: `handler` gets
    /// the object's handle and the JSON arguments and returns JSON. The
    /// name is checked at [`crate::Host::start`] (identifier grammar, at
    /// most 256 ASCII bytes). A [`crate::MethodError`] a handler returns is
    /// the caller's [`crate::HostError::Method`], locally and across hosts
    /// alike; a fence refusal anywhere in an error's chain is
    /// [`crate::HostError::Fenced`]; any other error is
    /// [`crate::HostError::Handler`] locally and `internal_error` across
    /// hosts. Typed methods: [`HostConfig::rpc`].
    #[must_use]
    pub fn method<T, F>(self, class: &str, method: &str, handler: F) -> Self
    where
        T: Send + Sync + 'static,
        I: Send + Sync + 'static,
        F: Handler<T, I, O::Storage, serde_json::Value, serde_json::Value>,
    {
        let body = erase(class, handler);
        let wrapped: crate::rpc::Method<I, O::Storage> = Arc::new(move |input, args| {
            let run = body(input, args);
            Box::pin(async move { run.await.map_err(HostError::Handler) })
        });
        self.register(class, method, wrapped)
    }

    /// Registers the typed method `M` on its class [`crate::Method::Class`]
    /// (see [`crate::typed`]): `handler` gets the object's handle and the
    /// decoded arguments and returns `M::Out` or an error (`M::Error` is the
    /// method's own, reaching the caller as [`crate::HostError::Method`] /
    /// [`crate::CallError::Method`]). Arguments that do not decode are
    /// refused with [`crate::HostError::InvalidArgs`] before the handler
    /// runs. The untyped [`crate::ObjectRef::call`] reaches it with the
    /// same JSON.
    #[must_use]
    pub fn rpc<M, F, Fut, E>(self, handler: F) -> Self
    where
        M: crate::Method,
        I: Send + Sync + 'static,
        F: Fn(crate::object::Handle<M::Class, I, O::Storage>, M) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<M::Out, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let wrapped = crate::typed::server::<M, I, O::Storage, F, Fut, E>(handler);
        self.register(<M::Class as Class>::NAME, M::NAME, wrapped)
    }

    fn register(
        mut self,
        class: &str,
        method: &str,
        wrapped: crate::rpc::Method<I, O::Storage>,
    ) -> Self {
        self.method_names
            .push((class.to_owned(), method.to_owned()));
        self.methods
            .entry(class.to_owned())
            .or_default()
            .insert(method.to_owned(), wrapped);
        self
    }

    /// Registers the fetch handler of `class` (one per class; a later one
    /// replaces it): `handler` gets the object's handle and the validated
    /// [`crate::fetch::FetchRequest`] (control headers stripped) and
    /// answers a [`crate::fetch::FetchResponse`], which is checked against
    /// the same limits. The class is checked at [`crate::Host::start`].
    /// Errors are handled as an RPC method's are (see
    /// [`HostConfig::method`]).
    #[must_use]
    pub fn fetch<T, F>(mut self, class: &str, handler: F) -> Self
    where
        T: Send + Sync + 'static,
        I: Send + Sync + 'static,
        F: Handler<T, I, O::Storage, crate::fetch::FetchRequest, crate::fetch::FetchResponse>,
    {
        let wrapped: crate::fetch::Fetcher<I, O::Storage> = erase(class, handler);
        self.fetchers.insert(class.to_owned(), wrapped);
        self
    }

    /// Registers the WebSocket connect handler of `class` (one per class; a
    /// later one replaces it): `handler` gets the object's handle, the
    /// validated [`crate::connect::ConnectRequest`] (control headers
    /// stripped) and the server end of the session
    /// ([`crate::connect::Socket`]), and runs the session until it returns
    /// (see [`crate::connect`] for when a session ends). The class is
    /// checked at [`crate::Host::start`]. An error it returns is logged
    /// (the session has already been upgraded, so no caller sees it).
    #[must_use]
    pub fn connect<T, F>(mut self, class: &str, handler: F) -> Self
    where
        T: Send + Sync + 'static,
        I: Send + Sync + 'static,
        F: SessionHandler<T, I, O::Storage>,
    {
        let session = erase(class, move |h, (request, socket)| {
            handler(h, request, socket)
        });
        let wrapped: crate::connect::Connector<I, O::Storage> =
            Arc::new(move |input, request, socket| session(input, (request, socket)));
        self.connectors.insert(class.to_owned(), wrapped);
        self
    }

    /// The shared internal token: required on every internal endpoint this
    /// host serves and attached to every call it sends to another host.
    /// Without one, calls between hosts are off.
    #[must_use]
    pub fn internal_token(mut self, token: &str) -> Self {
        self.internal_token = Some(token.to_owned());
        self
    }

    /// Where other tasks are reached when their owner record advertises no
    /// endpoint (records written by a host without a token, or by an older
    /// version). Every endpoint is checked against the endpoint policy
    /// before the token is attached.
    #[must_use]
    pub fn peers(mut self, peers: impl crate::protocol::PeerDirectory) -> Self {
        self.peers = Arc::new(peers);
        self
    }

    /// Which owner endpoints calls are forwarded to. Without one, a host
    /// with an internal token derives
    /// [`crate::transport::EndpointPolicy::internal_port`] from its own
    /// [`HostConfig::endpoint`] (loopback and private addresses on that
    /// port only); a host with a token and no endpoint must set one
    /// ([`crate::HostError::InvalidSetting`] `endpoint_policy` at start).
    /// The host's own endpoint must pass the policy too.
    #[must_use]
    pub fn endpoint_policy(mut self, policy: crate::protocol::EndpointPolicy) -> Self {
        self.endpoint_policy = Some(policy);
        self
    }

    /// The transport for calls between hosts (default: HTTP/1.1).
    #[must_use]
    pub fn transport(mut self, transport: impl crate::protocol::Transport) -> Self {
        self.transport = Arc::new(transport);
        self
    }

    /// A custom transport for alarm deliveries owned elsewhere, instead of
    /// the default (the host's [`crate::transport::Transport`] when an
    /// internal token is set, else [`NoTransport`]).
    #[must_use]
    pub fn forward(mut self, forward: impl HostForward) -> Self {
        self.forward = Some(Arc::new(forward));
        self
    }
}

impl<S, I> HostConfig<S, I, SqliteObjectStore> {
    /// A host with the [`HostIds`] `ids` (its storage id, lifecycle and
    /// task, each a checked type: swapping two is a compile error), with
    /// leases in `lease_store`, alarm jobs in `alarm_index`, and one SQLite
    /// file per object under `root` (a directory every host of the
    /// deployment shares). Another object store: [`HostConfig::with_store`].
    pub fn new(
        lease_store: Arc<S>,
        alarm_index: Arc<I>,
        root: impl Into<PathBuf>,
        ids: HostIds,
    ) -> Self {
        Self::with_store(lease_store, alarm_index, SqliteObjectStore::new(root), ids)
    }

    /// Options of every object database.
    #[must_use]
    pub fn sqlite(mut self, options: SqliteOptions) -> Self {
        self.objects = self.objects.options(options);
        self
    }
}

#[cfg(feature = "postgres")]
impl
    HostConfig<
        crate::store::postgres::PostgresLeaseStore,
        crate::store::postgres::PostgresAlarmIndex,
        crate::store::postgres::PostgresObjectStore,
    >
{
    /// A host on PostgreSQL alone (feature `postgres`): its leases, alarm
    /// jobs and objects in `database` ([`crate::DatabaseSettings::from_env`] reads
    /// `DO_DATABASE_URL` and `DO_DATABASE_SCHEMA`), their tables created
    /// when missing, with `settings` (whose shard count the lease store
    /// uses: a later [`HostConfig::settings`] must keep it). No directory
    /// is shared with another host. Custom object options:
    /// [`crate::store::postgres::PostgresBackends::connect_with`] and
    /// [`HostConfig::with_store`].
    ///
    /// # Errors
    /// [`crate::HostError::InvalidSetting`] `DO_DATABASE_URL` or
    /// `DO_DATABASE_SCHEMA` (nothing is written); the store's error when
    /// the database cannot be reached or set up.
    pub async fn postgres(
        database: &crate::settings::DatabaseSettings,
        settings: HostSettings,
        ids: HostIds,
    ) -> Result<Self, HostError> {
        let stores = crate::store::postgres::PostgresBackends::connect(
            database,
            settings.ownership.shard_count,
        )
        .await?;
        Ok(
            Self::with_store(stores.lease_store, stores.alarm_index, stores.objects, ids)
                .settings(settings),
        )
    }
}

/// The SQLite lease store's override of the start check.
const STORES_OVERRIDE: &str = "HostConfig::allow_sqlite_stores_on_network_file_system(true)";

impl<S: 'static, I: 'static, O: ObjectStore> HostConfig<S, I, O> {
    /// The documented override of the start check of the SQLite lease
    /// store and alarm index (default `false`): with `true` the host starts
    /// even when their files are on a network, cluster or FUSE file
    /// system. Only for processes of ONE machine over a file system known
    /// to give them working locks and shared memory; never for hosts on
    /// several machines (SQLite's WAL is not safe there, so two hosts could
    /// both take one lease). The object root has its own:
    /// [`SqliteObjectStore::allow_network_file_system`].
    #[must_use]
    pub fn allow_sqlite_stores_on_network_file_system(mut self, allow: bool) -> Self {
        self.sqlite_stores_on_network_fs = allow;
        self
    }

    /// The start check: the object store's placement, then the file
    /// system (`check`) of each SQLite file among the lease store and
    /// alarm index ([`crate::store::sqlite::store_files`]), unless
    /// overridden.
    pub(crate) fn check_placement_with(
        &self,
        check: impl Fn(&std::path::Path) -> Result<(), crate::store::sqlite::PlacementError>,
    ) -> Result<(), HostError> {
        self.objects.check_placement()?;
        if self.sqlite_stores_on_network_fs {
            return Ok(());
        }
        let files =
            crate::store::sqlite::store_files(self.lease_store.as_ref(), self.alarm_index.as_ref());
        for (what, setting, file) in files {
            crate::store::sqlite::placement((what, setting), check(&file), STORES_OVERRIDE)?;
        }
        Ok(())
    }
}

/// The handlers of one object class `T` ([`HostConfig::class_of`]).
pub struct ClassBuilder<S, I, O: ObjectStore, T> {
    config: HostConfig<S, I, O>,
    alarm: Option<crate::alarm::AlarmHook<I, O::Storage>>,
    class: std::marker::PhantomData<fn() -> T>,
}

impl<S, I, O: ObjectStore, T> std::fmt::Debug for ClassBuilder<S, I, O, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S, I: Send + Sync + 'static, O: ObjectStore, T: Class> ClassBuilder<S, I, O, T> {
    /// Registers RPC method `method` of `T` (see [`HostConfig::method`]).
    #[must_use]
    pub fn method<F, Fut>(mut self, method: &str, handler: F) -> Self
    where
        F: Fn(crate::object::Handle<T, I, O::Storage>, serde_json::Value) -> Fut
            + Send
            + Sync
            + 'static,
        Fut: Future<Output = Result<serde_json::Value, BoxError>> + Send + 'static,
    {
        self.config = self.config.method(T::NAME, method, handler);
        self
    }

    /// Registers the typed method `M` of `T` (see [`HostConfig::rpc`]): a
    /// method of another class does not compile.
    #[must_use]
    pub fn rpc<M, F, Fut, E>(mut self, handler: F) -> Self
    where
        M: crate::Method<Class = T>,
        F: Fn(crate::object::Handle<T, I, O::Storage>, M) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<M::Out, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.config = self.config.rpc::<M, F, Fut, E>(handler);
        self
    }

    /// Registers the fetch handler of `T` (see [`HostConfig::fetch`]).
    #[must_use]
    pub fn fetch<F>(mut self, handler: F) -> Self
    where
        F: Handler<T, I, O::Storage, crate::fetch::FetchRequest, crate::fetch::FetchResponse>,
    {
        self.config = self.config.fetch(T::NAME, handler);
        self
    }

    /// Registers the connect handler of `T` (see [`HostConfig::connect`]).
    #[must_use]
    pub fn connect<F>(mut self, handler: F) -> Self
    where
        F: SessionHandler<T, I, O::Storage>,
    {
        self.config = self.config.connect(T::NAME, handler);
        self
    }

    /// Registers the alarm handler of `T` (one per class; a later one
    /// replaces it): an object's own `alarm()`, run once the time its code
    /// set with [`crate::Handle::set_alarm`] has come, on whichever host
    /// owns the object (see [`crate::alarm`] for the contract: durable
    /// once set, cleared after an `Ok` unless the handler set a new time,
    /// at least once, retried after an error).
    #[must_use]
    pub fn alarm<F>(mut self, handler: F) -> Self
    where
        F: Handler<T, I, O::Storage, crate::alarm::AlarmFired, ()>,
    {
        self.alarm = Some(crate::alarm::hook(T::NAME, handler));
        self
    }

    /// The configuration, with the class and its handlers.
    pub fn done(mut self) -> HostConfig<S, I, O> {
        if let Some(hook) = self.alarm
            && let Some(factory) = self.config.classes.remove(T::NAME)
        {
            // The object's alarm is attached when the object is opened,
            // after the class's own factory built it.
            let with_alarm: Factory<I, O::Storage> = Arc::new(move |ctx| {
                let instance = factory(ctx)?;
                crate::alarm::attach(ctx, Arc::clone(&instance), Arc::clone(&hook))?;
                Ok(instance)
            });
            self.config.classes.insert(T::NAME.to_owned(), with_alarm);
        }
        self.config
    }
}
