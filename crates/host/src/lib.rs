//! The host: a runnable object runtime built from
//! the workspace's parts.
//!
//! A user writes object classes (factories that build an object from its
//! [`ObjectCtx`]) and a short `main`: a [`HostConfig`] (lease store, alarm
//! index, the object-storage root every host shares, storage id, classes,
//! task id, endpoint, the `DO_*` settings), [`Host::start`], calls
//! through [`Host::call`] / [`Host::transaction`], and
//! [`Host::run_until_signal`] (SIGTERM or ctrl-c drains).
//!
//! What the host does, and with which part:
//!
//! - **Lifecycle records**: at start it checks the lifecycle's active
//!   storage pointer names its storage id (creating it only with
//!   [`HostConfig::create_active_storage_if_absent`]) and that no
//!   whole-delete lock is held, or refuses to start with
//!   [`HostError::LifecycleRecord`] naming the record and how to create it.
//! - **Owner loop** (`durability-ownership`'s `Ownership`): every renew
//!   interval one batched `renew_all`; a scope whose renew fails is dropped,
//!   its objects closed and its running work cancelled; configured scopes
//!   ([`OwnPolicy`]) are claimed when free; with [`OwnPolicy::AllShards`]
//!   the live hosts balance them ([`HostSettings::balance`]: presence
//!   records on the lease store, an even share each, graceful hand-off of
//!   the excess); changes are published as [`OwnerEvent`]s
//!   ([`Host::subscribe`]).
//! - **Object store** ([`ObjectStore`], [`store`]): where objects live.
//!   The default is the SQLite directory ([`SqliteObjectStore`]: one
//!   SQLite file per object under a root every host shares), and it is the
//!   only module of the host that knows SQLite; another backend is one
//!   module implementing the trait, used through [`HostConfig::with_store`].
//! - **Object registry**: an object is opened on first use (through the
//!   object store) and fenced at its scope's claim through
//!   `Ownership::open_fenced` (the generation floor) before its first
//!   dispatch; it is closed when the scope is lost. Residency as
//!   `DO_PREVENT_EVICTION` says ([`Residency`]).
//! - **Fenced dispatch**: every call and alarm delivery is admitted
//!   (`Ownership::admit`: task, generation and lease budget; with the
//!   default `Admission::Snapshot` also the owner record, the active storage
//!   pointer and the delete lock in one store snapshot, while
//!   `Admission::Cached` trusts the last claim or renew for those),
//!   counted in flight, run under the watchdog (`Ownership::watch`), and
//!   commits through the object's storage fence (generation, holder and
//!   lease budget checked inside the storage's transaction).
//! - **Alarms** (`durability-alarms`): one `Dispatcher` per host, routed
//!   through `OwnerRouted`; each open object's scheduler alarm is backed by
//!   the alarm index (`SchedulerAlarm`), so its pending work resumes on
//!   whichever host owns it after a crash. A host that acquires a scope
//!   an earlier claim held opens each of the scope's closed objects once
//!   to sync and repair its alarm (the takeover sweep): an alarm a killed
//!   host committed but never synced to the index still fires.
//! - **Drain** ([`Host::shutdown`]): stop new ownership, reject new work,
//!   stop the dispatcher, wait for admitted work, release matching leases,
//!   within the drain budgets (`DO_DRAIN_*`).
//! - **Storage lifecycle**: [`Host::delete_all`] drops one object's own
//!   tables in fenced pages of [`DELETE_PAGE`] and cancels its timers
//!   (unless [`DeleteAll::keep_alarm`]); [`delete_storage_id`] deletes a
//!   whole storage id (tombstone, delete lock and pointer, object files,
//!   alarm jobs) and reports what it could not delete. Neither is atomic;
//!   running either again finishes an interrupted one.
//! - **Probe** ([`Host::probe`]): task, owned scopes and generations, the
//!   in-flight gauge, dispatch and alarm outcome counters.
//!
//! A whole service (compiled by the doctests):
//!
//! ```no_run
//! use std::sync::Arc;
//! use durability_host::{BoxError, DeleteAll, Host, HostConfig, HostIds, HostSettings, OwnPolicy};
//! use durability_host::{LifecycleId, StorageId, TaskId};
//! use durability_ownership::{ShardCount, SystemClock};
//! use durability_storage_sqlite::alarms::SqliteAlarmIndex;
//! use durability_storage_sqlite::ownership::SqliteLeaseStore;
//! use durability_storage_sqlite::Synchronous;
//!
//! struct Counter;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), BoxError> {
//!     let shared = std::path::Path::new("/srv/objects"); // every host mounts it
//!     let leases = SqliteLeaseStore::open(shared.join("leases.db"), SystemClock::new(), ShardCount::default())?;
//!     let index = SqliteAlarmIndex::open(shared.join("alarms.db"), Synchronous::Full)?;
//!     let ids = HostIds::new(StorageId::new("st1")?, LifecycleId::new("ns:shop")?, TaskId::new("task-1")?);
//!     let config = HostConfig::new(Arc::new(leases), Arc::new(index), shared, ids)
//!         .endpoint("http://10.0.0.7:8788")
//!         .class("Counter", |ctx| {
//!             ctx.scheduler.transaction(|tx| {
//!                 tx.sql()
//!                     .execute_batch("CREATE TABLE IF NOT EXISTS counter (n INTEGER NOT NULL)")
//!                     .map_err(|e| durability_scheduler::StorageError::backend("schema", e))
//!             })?;
//!             Ok::<_, BoxError>(Counter)
//!         })
//!         .settings(HostSettings::from_env()?) // DO_OWNER_TTL_SECONDS, DO_PREVENT_EVICTION, ...
//!         .own(OwnPolicy::AllShards);
//!     let host = Host::start(config).await?;
//!     host.transaction::<Counter, _, _>("Counter", "c1", |_, tx| {
//!         tx.sql()
//!             .execute("INSERT INTO counter (n) VALUES (1)", [])
//!             .map_err(|e| durability_scheduler::StorageError::backend("insert", e))?;
//!         Ok(())
//!     })
//!     .await?;
//!     // Drop the object's own tables and cancel its timers (paged, fenced).
//!     host.delete_all("Counter", "c2", DeleteAll::default()).await?;
//!     host.run_until_signal().await; // SIGTERM or ctrl-c: drain
//!     Ok(())
//! }
//! ```
//!
//! **Classes as types** ([`Class`]): a class type knows its name;
//! [`HostConfig::class_of`] registers it and returns a [`ClassBuilder`]
//! whose handlers get a [`Handle`] of exactly that type, and
//! `host.object::<Cart>("cart-42")` ([`Object`]) calls, runs and
//! transacts on it without naming the class again. The string API
//! ([`HostConfig::class`], [`Host::object_by_name`]) stays for classes
//! chosen at run time.
//!
//! **Typed methods** ([`typed`], [`Method`]): a method is a serde type
//! that names its class, wire name, result and error;
//! [`ClassBuilder::rpc`] registers its handler and
//! `host.object::<Cart>("cart-42").call(AddItem { .. })` returns its
//! result or its own error ([`CallError::Method`]), with the same JSON on
//! the wire as the untyped [`ObjectRef::call`]; a mismatch of class,
//! arguments or result is a compile error. A method's own error is one
//! [`HostError::Method`] (code, message, details) whether the call ran
//! here or on another host.
//!
//! **An object's own alarm** ([`alarm`]): [`ClassBuilder::alarm`]
//! registers the class's `alarm()`, and [`Handle::set_alarm`] sets it
//! (Durable Objects' `setAlarm`); the handler runs once the time has come,
//! on whichever host owns the object. Example:
//! `cargo run -p durability-host --example alarm`.
//!
//! **Calls between hosts** ([`Host::object_by_name`], [`rpc`], [`transport`],
//! [`RpcClient`]): an object class registers named RPC methods
//! ([`HostConfig::method`]); `host.object_by_name(class, name).call(method, args)`
//! runs the method once on the host that owns the object's scope. An
//! uncached call enters this host's router (owner resolution): owned here,
//! it runs here; owned elsewhere, it is forwarded once over HTTP/1.1
//! ([`transport::serve`], [`transport::HttpTransport`]) with the route
//! fence, and the owner's trusted headers teach an owner hint (an LRU of
//! 10,000 keyed by storage id, class and shard) so the next call goes
//! straight to the owner. One rediscovery follows a trusted pre-dispatch
//! `stale_owner`/`owner_race`; anything untrusted evicts the hint and is
//! `owner_unavailable`; an unreadable success is `do_rpc_result_unknown`;
//! RPC is never replayed after an unknown outcome. Internal endpoints need
//! the shared token ([`HostConfig::internal_token`], compared in constant
//! time); owner endpoints come from the owner's record (every host with a
//! token advertises its endpoint in the records it writes), else from a
//! [`transport::PeerDirectory`], and must pass the
//! [`transport::EndpointPolicy`] before the token is attached: by default
//! loopback and private addresses on the port of the host's own
//! [`HostConfig::endpoint`] only (the internal port every host of a
//! deployment shares; a host with a token and no endpoint must set
//! [`HostConfig::endpoint_policy`]). An alarm delivery claimed by
//! this host's dispatcher for an object owned elsewhere is forwarded the
//! same way (`POST /internal/do/alarm`, fenced at the owner's generation),
//! unless a custom [`HostForward`] is set; a host without an internal token
//! uses [`NoTransport`] (the delivery waits for the owner's lease).
//!
//! **The public edge** ([`Edge`], [`Host::edge`]): an `axum::Router` the
//! user mounts next to their own routes, mapping tenant paths to objects
//! by name (`.route("/orders/{name}", "Orders")`, or a closure) through
//! the same router as [`ObjectRef::fetch`], under the fetch limits (414,
//! 431, 413 with the host's JSON error shape, nothing dispatched) and
//! with hop-by-hop and `x-durability-` headers stripped both ways.
//! **Several entry hosts** ([`FailoverClient`]): a client for programs
//! that are not hosts; an entry that refuses connections is skipped within
//! the call and backed off on an injected clock, an unknown outcome is
//! never replayed, and [`idempotency`] keys let a caller re-send a call
//! that still runs once. Both, with their limits: [`docs::edge_and_client`].
//!
//! **WebSocket sessions** ([`connect`], [`ObjectRef::connect`]): a class
//! registers a connect handler ([`HostConfig::connect`]);
//! `host.object_by_name(class, name).connect(request)` returns the caller's
//! [`connect::Socket`]. The `101` comes only from the owner's endpoint,
//! after admission at the route fence: a router that does not own the
//! object hands the connect off (a trusted owner hint) and the caller
//! connects to the owner directly; at most one rediscovery, and no
//! fallback to another host's upgrade.
//!
//! ```no_run
//! use std::collections::BTreeMap;
//! use std::sync::Arc;
//! use durability_host::transport::{StaticPeers, serve};
//! use durability_host::{AppError, BoxError, CallError, Class, Handle, Host, HostConfig, HostIds};
//! use durability_host::{LifecycleId, Method, OwnPolicy, StorageId, TaskId};
//! use durability_ownership::{ShardCount, SystemClock};
//! use durability_storage_sqlite::alarms::SqliteAlarmIndex;
//! use durability_storage_sqlite::ownership::SqliteLeaseStore;
//! use durability_storage_sqlite::Synchronous;
//! use serde::{Deserialize, Serialize};
//! use durability_host::CancellationToken;
//!
//! struct Cart;
//!
//! impl Class for Cart {
//!     const NAME: &'static str = "Cart";
//! }
//!
//! /// The arguments of `Cart.add` (the JSON `{ "sku": 7 }` on the wire).
//! #[derive(Serialize, Deserialize)]
//! struct AddItem {
//!     sku: u32,
//! }
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! struct Added {
//!     added: u32,
//! }
//!
//! #[derive(Debug, Serialize, Deserialize, thiserror::Error)]
//! enum CartError {
//!     #[error("sku {0} is not sold")]
//!     NotSold(u32),
//! }
//!
//! impl AppError for CartError {
//!     fn code(&self) -> &str {
//!         "not_sold"
//!     }
//! }
//!
//! impl Method for AddItem {
//!     type Class = Cart;
//!     const NAME: &'static str = "add";
//!     type Out = Added;
//!     type Error = CartError;
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), BoxError> {
//!     let shared = std::path::Path::new("/srv/objects");
//!     let leases = SqliteLeaseStore::open(shared.join("leases.db"), SystemClock::new(), ShardCount::default())?;
//!     let index = SqliteAlarmIndex::open(shared.join("alarms.db"), Synchronous::Full)?;
//!     let peers = StaticPeers(BTreeMap::from([("task-2".to_owned(), "http://10.0.0.8:8788".to_owned())]));
//!     let ids = HostIds::new(StorageId::new("st1")?, LifecycleId::new("ns:shop")?, TaskId::new("task-1")?);
//!     let config = HostConfig::new(Arc::new(leases), Arc::new(index), shared, ids)
//!         .endpoint("http://10.0.0.7:8788")
//!         .internal_token(&std::env::var("DURABILITY_INTERNAL_TOKEN")?)
//!         .peers(peers)
//!         .own(OwnPolicy::AllShards)
//!         .class_of(|_ctx| Ok::<_, BoxError>(Cart))
//!         .rpc(|_cart: Handle<Cart, SqliteAlarmIndex>, add: AddItem| async move {
//!             if add.sku == 0 {
//!                 return Err(CartError::NotSold(add.sku));
//!             }
//!             Ok(Added { added: add.sku })
//!         })
//!         .done();
//!     let host = Host::start(config).await?;
//!     let listener = tokio::net::TcpListener::bind("10.0.0.7:8788").await?;
//!     tokio::spawn(serve(host.clone(), listener, CancellationToken::new()));
//!     // Runs once on whichever host owns cart-42's shard.
//!     let cart = host.object::<Cart>("cart-42");
//!     assert_eq!(cart.call(AddItem { sku: 7 }).await?, Added { added: 7 });
//!     // The method's own error, typed, on this host or another.
//!     assert!(matches!(cart.call(AddItem { sku: 0 }).await, Err(CallError::Method(CartError::NotSold(0)))));
//!     host.run_until_signal().await;
//!     Ok(())
//! }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

pub mod alarm;
mod bounds;
mod client;
mod config;
pub mod connect;
pub mod docs;
pub mod edge;
mod error;
pub mod fetch;
mod host;
pub mod idempotency;
mod metrics;
mod object;
mod protocol;
mod route_table;
mod routing;
pub mod rpc;
pub mod semaphore;
mod settings;
mod storage;
pub mod store;
pub mod transport;
pub mod typed;

pub mod wire;

/// The cancellation token [`transport::serve`] stops on (tokio-util's), so
/// callers need not depend on tokio-util themselves.
pub use tokio_util::sync::CancellationToken;

pub use alarm::{AlarmFired, OBJECT_ALARM};
pub use bounds::{HostAlarms, HostLeases};
pub use client::{
    ClientCalls, ClientStats, EntryBackoff, EntryState, FailoverClient, FailoverStats, RpcClient,
};
pub use config::ClassBuilder;
pub use config::{HostConfig, HostForward, HostIds, NoTransport, OwnPolicy};
/// The checked ids of [`HostIds`] (the ownership crate's), so callers need
/// not depend on it for them.
pub use durability_ownership::{LifecycleId, StorageId, TaskId};
pub use edge::Edge;
pub use error::{BoxError, HostError, WireError};
pub use host::{CycleReport, DispatchStats, Host, HostProbe, OwnerEvent, shutdown_signal};
pub use object::{Class, Handle, Handler, MAX_OBJECT_NAME_BYTES, ObjectCtx, validate_object_name};
pub use routing::Object;
pub use routing::{ObjectRef, RoutingStats};
pub use rpc::{MethodError, RpcArgs};
pub use settings::{
    ADVISORY_CACHE_ENTRIES, DEFAULT_DATABASE_SCHEMA, DEFAULT_EVICTION_IDLE_MS,
    DEFAULT_MAX_RESIDENT_OBJECTS, DatabaseSettings, ENV_BALANCE_SHARDS,
    ENV_DATABASE_COMMIT_TIMEOUT_MS, ENV_DATABASE_SCHEMA, ENV_DATABASE_URL, ENV_PREVENT_EVICTION,
    HostSettings, Residency,
};
pub use storage::{
    DELETE_PAGE, DeleteAll, DeleteAllReport, DeleteFailure, StorageDeleteReport, delete_storage_id,
};
#[cfg(feature = "postgres")]
pub use store::postgres::{PostgresBackends, PostgresObjectStore};
pub use store::sqlite::{ADMISSION_FILE, MAX_ROOT_BYTES, SqliteObjectStore, TOMBSTONE_FILE};
pub use store::{ObjectStore, StoreTx};
pub use typed::{AppError, CallError, Method};
