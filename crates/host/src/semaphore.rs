#![doc = include_str!("../docs/semaphore.md")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use durability_alarms::AlarmIndex;
use durability_scheduler::{Permit, PermitError, Permits, Storage, Transaction};
use durability_semaphore::{
    Acquire, Acquired, EventKind, Grant, PoolConfig, Semaphore, SemaphoreConfig, SemaphoreError,
    SemaphoreTx,
};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::config::HostConfig;
use crate::error::{BoxError, HostError};
use crate::object::{Class, Handle, ObjectCtx};
use crate::rpc::MethodError;
use crate::store::ObjectStore;

/// The class name of semaphore holders.
pub const SEMAPHORE_CLASS: &str = "Semaphore";

/// Longest a queued `acquire` call waits on the holder for its grant
/// before it answers `queued` (the caller asks again with the same key):
/// below the transport's invoke timeout, so a long poll is never an
/// unknown outcome.
pub const MAX_POLL_MS: i64 = 10_000;

/// One semaphore holder object: the semaphore of its storage and the
/// signal that wakes its waiting calls.
pub struct SemaphoreHolder<D: Storage> {
    semaphore: Semaphore<D>,
    wake: Arc<Notify>,
}

impl<D: Storage> std::fmt::Debug for SemaphoreHolder<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemaphoreHolder").finish_non_exhaustive()
    }
}

impl<D: Storage> Class for SemaphoreHolder<D> {
    const NAME: &'static str = SEMAPHORE_CLASS;
}

impl<D> SemaphoreHolder<D>
where
    D: Storage,
    for<'t> D::Tx<'t>: SemaphoreTx,
{
    /// The holder of an object being opened: attaches the semaphore to its
    /// scheduler; every committed grant, release, expiry or capacity change
    /// wakes the calls waiting on it.
    ///
    /// # Errors
    /// The semaphore's attach error.
    pub fn open<I>(ctx: &ObjectCtx<I, D>) -> Result<Self, SemaphoreError> {
        let wake = Arc::new(Notify::new());
        let signal = Arc::clone(&wake);
        let config = SemaphoreConfig::default().on_event(move |e| {
            if matches!(
                e.kind,
                EventKind::Granted { .. }
                    | EventKind::Finished { .. }
                    | EventKind::Configured { .. }
            ) {
                signal.notify_waiters();
            }
        });
        let semaphore = Semaphore::attach(&ctx.scheduler, config)?;
        Ok(Self { semaphore, wake })
    }

    /// The semaphore (for in-process use and inspection).
    pub fn semaphore(&self) -> &Semaphore<D> {
        &self.semaphore
    }

    /// Runs `op` on the semaphore in one transaction of the holder's
    /// storage; a semaphore error is the method's error ([`method_error`]).
    fn in_transaction<R>(
        &self,
        op: impl FnOnce(&Semaphore<D>, &mut Transaction<'_, '_, D>) -> Result<R, SemaphoreError>,
    ) -> Result<R, BoxError> {
        let sem = &self.semaphore;
        sem.scheduler()
            .transaction(|tx| op(sem, tx))
            .map_err(|e| method_error(&e))
    }

    /// Acquires, waiting for the grant up to `poll_ms` (at most
    /// [`MAX_POLL_MS`]) while the request is queued: woken when permits
    /// return or the capacity changes, and at the earliest due time of the
    /// holder (a lease or queue deadline), never by polling.
    async fn acquire_waiting(
        &self,
        req: &Acquire,
        poll_ms: i64,
    ) -> Result<Acquired, SemaphoreError> {
        let scheduler = self.semaphore.scheduler();
        let clock = Arc::clone(scheduler.context().clock());
        let until = clock.now_ms().saturating_add(poll_ms.clamp(0, MAX_POLL_MS));
        loop {
            let notified = self.wake.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let got = scheduler.transaction(|tx| self.semaphore.acquire(tx, req))?;
            let Acquired::Queued { deadline, .. } = got else {
                return Ok(got);
            };
            let next_due = scheduler
                .transaction(|tx| Ok::<_, SemaphoreError>(tx.semaphore_next_due()?))?
                .unwrap_or(deadline);
            if clock.now_ms() >= until {
                return Ok(got);
            }
            let wake_at = until.min(deadline).min(next_due.max(clock.now_ms() + 1));
            // Woken by an event, or at the wake time: either way ask again.
            let _ = durability_time::timeout_at(&*clock, wake_at, notified).await;
        }
    }
}

/// The arguments of the holder's `acquire` method.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct AcquireArgs {
    pool: String,
    key: String,
    holder: String,
    count: u64,
    lease_ms: i64,
    wait_ms: i64,
    /// How long this call may wait on the holder (ms).
    #[serde(default)]
    poll_ms: i64,
}

/// The arguments of `renew`, `used` and `release`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GrantArgs {
    holder: String,
    id: u64,
    #[serde(default)]
    total: u64,
}

/// The arguments of `pool` and `delete_pool`.
#[derive(Debug, Clone, Deserialize)]
struct PoolArgs {
    pool: String,
}

/// The arguments of `configure`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ConfigureArgs {
    pool: String,
    capacity: u64,
    #[serde(default)]
    max_queue: Option<u64>,
    #[serde(default)]
    key_retention_ms: Option<i64>,
}

fn grant_json(g: &Grant) -> Value {
    json!({"granted": {"id": g.id, "count": g.count, "used": g.used, "lease_until": g.lease_until}})
}

fn acquired_json(a: &Acquired) -> Value {
    match a {
        Acquired::Granted(g) => grant_json(g),
        Acquired::Queued {
            id,
            position,
            deadline,
        } => json!({"queued": {"id": id, "position": position, "deadline": deadline}}),
        Acquired::Finished { id, outcome } => {
            json!({"finished": {"id": id, "outcome": outcome.code()}})
        }
    }
}

/// A semaphore error as the method's error: its code in lower case (the
/// wire's grammar), so it reaches callers on other hosts.
fn method_error(e: &SemaphoreError) -> BoxError {
    Box::new(MethodError::new(
        e.code().to_ascii_lowercase(),
        e.to_string(),
    ))
}

fn args<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, BoxError> {
    serde_json::from_value(v).map_err(|e| -> BoxError {
        Box::new(MethodError::new(
            "semaphore_invalid_args",
            format!("invalid arguments: {e}"),
        ))
    })
}

impl<S, I, O> HostConfig<S, I, O>
where
    I: AlarmIndex + Send + Sync + 'static,
    O: ObjectStore,
    for<'t> <O::Storage as Storage>::Tx<'t>: SemaphoreTx,
{
    /// Registers the semaphore holder class ([`SEMAPHORE_CLASS`]) and its
    /// methods: `configure`, `acquire` (a long poll while queued), `renew`,
    /// `used`, `release`, `pool` (the pool's counters) and `delete_pool`
    /// (the repair of a corrupt pool row). Shards call them
    /// through [`crate::Host::object`] or a thin client; [`SemaphorePermits`]
    /// wraps them as a [`Permits`] source.
    #[must_use]
    pub fn semaphore_holder(self) -> Self {
        type H<O> = SemaphoreHolder<<O as ObjectStore>::Storage>;
        self.class_of::<H<O>, _>(|ctx| SemaphoreHolder::open(ctx).map_err(Into::into))
            .method(
                "configure",
                |h: Handle<H<O>, I, O::Storage>, a| async move {
                    let a: ConfigureArgs = args(a)?;
                    let mut config = PoolConfig::new(a.capacity);
                    config.max_queue = a.max_queue.unwrap_or(config.max_queue);
                    config.key_retention_ms = a.key_retention_ms.unwrap_or(config.key_retention_ms);
                    h.object
                        .in_transaction(|sem, tx| sem.configure(tx, &a.pool, config))?;
                    Ok(json!({}))
                },
            )
            .method("acquire", |h: Handle<H<O>, I, O::Storage>, a| async move {
                let a: AcquireArgs = args(a)?;
                let req = Acquire::new(a.pool, a.key, a.holder, a.count)
                    .lease_ms(a.lease_ms)
                    .wait_ms(a.wait_ms);
                let got = h.object.acquire_waiting(&req, a.poll_ms).await;
                Ok(acquired_json(&got.map_err(|e| method_error(&e))?))
            })
            .method("renew", |h: Handle<H<O>, I, O::Storage>, a| async move {
                let a: GrantArgs = args(a)?;
                let g = h
                    .object
                    .in_transaction(|sem, tx| sem.renew(tx, &a.holder, a.id))?;
                Ok(grant_json(&g))
            })
            .method("used", |h: Handle<H<O>, I, O::Storage>, a| async move {
                let a: GrantArgs = args(a)?;
                let g = h
                    .object
                    .in_transaction(|sem, tx| sem.used(tx, &a.holder, a.id, a.total))?;
                Ok(grant_json(&g))
            })
            .method("release", |h: Handle<H<O>, I, O::Storage>, a| async move {
                let a: GrantArgs = args(a)?;
                let r = h
                    .object
                    .in_transaction(|sem, tx| sem.release(tx, &a.holder, a.id))?;
                let (now, outcome) = match r {
                    durability_semaphore::Released::Now(o) => (true, o),
                    durability_semaphore::Released::Already(o) => (false, o),
                };
                Ok(json!({"now": now, "outcome": outcome.code()}))
            })
            .method(
                "delete_pool",
                |h: Handle<H<O>, I, O::Storage>, a| async move {
                    let a: PoolArgs = args(a)?;
                    let existed = h
                        .object
                        .in_transaction(|sem, tx| sem.delete_pool(tx, &a.pool))?;
                    Ok(json!({ "existed": existed }))
                },
            )
            .method("pool", |h: Handle<H<O>, I, O::Storage>, a| async move {
                let a: PoolArgs = args(a)?;
                let row = h
                    .object
                    .in_transaction(|_, tx| Ok(tx.semaphore_pool(&a.pool)?))?;
                Ok(row.map_or(Value::Null, |p| {
                    json!({"capacity": p.capacity, "held": p.held, "queued": p.queued,
                        "granted": p.granted, "released": p.released, "expired": p.expired,
                        "timed_out": p.timed_out, "cancelled": p.cancelled, "used": p.used})
                }))
            })
            .done()
    }
}

/// How a shard reaches a holder: through its host's router
/// ([`crate::ObjectRef`]) or a thin client. Implemented for both.
pub trait HolderCall: Send + Sync + 'static {
    /// Calls `method` of the holder with `args`.
    fn call_holder<'a>(
        &'a self,
        method: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Value, HostError>>;
}

impl<S, I, O> HolderCall for crate::ObjectRef<S, I, O>
where
    S: durability_ownership::LeaseStore
        + durability_ownership::LifecycleAdmin
        + Send
        + Sync
        + 'static,
    I: AlarmIndex + Send + Sync + 'static,
    O: ObjectStore,
{
    fn call_holder<'a>(
        &'a self,
        method: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Value, HostError>> {
        self.call(method, args).boxed()
    }
}

/// A holder reached through a thin client ([`crate::FailoverClient`]).
#[derive(Debug, Clone)]
pub struct ClientHolder {
    /// The client.
    pub client: Arc<crate::FailoverClient>,
    /// The holder object's name.
    pub name: String,
}

impl HolderCall for ClientHolder {
    fn call_holder<'a>(
        &'a self,
        method: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Value, HostError>> {
        self.client
            .call(SEMAPHORE_CLASS, &self.name, method, args)
            .boxed()
    }
}

/// What a permit of [`SemaphorePermits`] stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// At most the pool's capacity of deliveries in flight: one permit
    /// per delivery, held until it ended, then released.
    Concurrency,
    /// At most the pool's capacity of items per `interval_ms`: one permit
    /// per item (up to `per_delivery` in one delivery), never released:
    /// each returns at its lease deadline, `interval_ms` after its grant.
    Rate {
        /// The interval (ms).
        interval_ms: i64,
        /// Items one delivery may take (at most the pool's capacity).
        per_delivery: u64,
    },
}

/// A [`Permits`] source on a semaphore holder's pool: the cross-host limit
/// of an outbox channel (`ChannelConfig::permits` of `durability-outbox`)
/// or an alarm dispatcher (`Dispatcher::with_permits`).
pub struct SemaphorePermits {
    holder: Arc<dyn HolderCall>,
    pool: String,
    shard: String,
    limit: Limit,
    lease_ms: i64,
    wait_ms: i64,
    retry_ms: i64,
    next: AtomicU64,
    nonce: u64,
}

impl std::fmt::Debug for SemaphorePermits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemaphorePermits")
            .field("pool", &self.pool)
            .field("shard", &self.shard)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// What one acquire came to.
enum Answer {
    Granted { id: u64, count: u64 },
    Queued,
    Finished,
}

fn answer(v: &Value) -> Option<Answer> {
    if let Some(g) = v.get("granted") {
        return Some(Answer::Granted {
            id: g.get("id")?.as_u64()?,
            count: g.get("count")?.as_u64()?,
        });
    }
    if v.get("queued").is_some() {
        return Some(Answer::Queued);
    }
    v.get("finished").map(|_| Answer::Finished)
}

impl SemaphorePermits {
    /// Permits of `pool` on `holder`, asked for by `shard` (its name, unique
    /// among the shards: the holder knows shards only by it). Concurrency
    /// permits lease for 30 s (renew nothing: set a lease above the
    /// longest delivery, [`SemaphorePermits::lease_ms`]); every request
    /// waits up to 30 s in the pool's queue.
    pub fn new(holder: Arc<dyn HolderCall>, pool: &str, shard: &str, limit: Limit) -> Self {
        let lease_ms = match limit {
            Limit::Concurrency => 30_000,
            Limit::Rate { interval_ms, .. } => interval_ms,
        };
        Self {
            holder,
            pool: pool.to_owned(),
            shard: shard.to_owned(),
            limit,
            lease_ms,
            wait_ms: 30_000,
            retry_ms: 1_000,
            next: AtomicU64::new(0),
            nonce: rand_nonce(),
        }
    }

    /// The lease of a concurrency permit (a delivery that outlives it runs
    /// without its permit counted: keep it above the attempt timeout).
    #[must_use]
    pub fn lease_ms(mut self, ms: i64) -> Self {
        if self.limit == Limit::Concurrency {
            self.lease_ms = ms;
        }
        self
    }

    /// How long a request may wait in the pool's queue, and after a refusal
    /// how long the delivery loop waits before it asks again.
    #[must_use]
    pub fn wait_ms(mut self, wait_ms: i64, retry_ms: i64) -> Self {
        self.wait_ms = wait_ms;
        self.retry_ms = retry_ms;
        self
    }

    fn refused(&self, reason: impl Into<String>) -> PermitError {
        PermitError::new(self.retry_ms, reason)
    }

    async fn take(&self, want: usize) -> Result<Permit, PermitError> {
        let count = match self.limit {
            Limit::Concurrency => 1,
            Limit::Rate { per_delivery, .. } => (want as u64).clamp(1, per_delivery.max(1)),
        };
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let key = format!("{}:{:016x}:{n}", self.shard, self.nonce);
        let args = json!({"pool": self.pool, "key": key, "holder": self.shard, "count": count,
            "lease_ms": self.lease_ms, "wait_ms": self.wait_ms, "poll_ms": MAX_POLL_MS});
        // The same key until an answer: a retry after an unknown outcome
        // never grants twice, and a queued request keeps its place.
        let mut unknown = 0;
        let (id, count) = loop {
            match self.holder.call_holder("acquire", args.clone()).await {
                Ok(v) => match answer(&v) {
                    Some(Answer::Granted { id, count }) => break (id, count),
                    Some(Answer::Queued) => {}
                    Some(Answer::Finished) => {
                        return Err(self.refused("the request left the queue ungranted"));
                    }
                    None => return Err(self.refused(format!("unreadable answer {v}"))),
                },
                Err(e)
                    if matches!(e.outcome(), durability_ownership::DispatchOutcome::Unknown)
                        && unknown < 3 =>
                {
                    unknown += 1;
                }
                Err(e) => return Err(self.refused(format!("{}: {e}", e.code()))),
            }
        };
        let entries = usize::try_from(count).unwrap_or(usize::MAX);
        let permit = Permit::new(entries);
        if self.limit != Limit::Concurrency {
            // A rate permit returns at its lease deadline, never earlier.
            return Ok(permit);
        }
        let holder = Arc::clone(&self.holder);
        let shard = self.shard.clone();
        Ok(permit.on_release(move || release_later(holder, shard, id)))
    }
}

/// Releases grant `id` in the background (a permit is dropped in
/// synchronous code); a release that fails leaves the grant to its lease.
fn release_later(holder: Arc<dyn HolderCall>, shard: String, id: u64) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let args = json!({"holder": shard, "id": id});
        if let Err(e) = holder.call_holder("release", args).await {
            tracing::info!(
                event = "durability.host.semaphore_release_failed",
                id,
                code = e.code(),
                error = %e,
                "releasing a permit failed; it returns at its lease deadline"
            );
        }
    });
}

/// A random number per permit source (the hasher's keys are drawn from
/// the OS per process and advanced per `RandomState`), so the keys of two
/// sources with one shard name never collide.
fn rand_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(0);
    h.finish()
}

impl Permits for SemaphorePermits {
    fn acquire(&self, want: usize) -> BoxFuture<'_, Result<Permit, PermitError>> {
        self.take(want).boxed()
    }
}
