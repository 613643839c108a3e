//! The cached read client.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use durability_time::{Clock, Random, SystemClock, timeout_at};
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use lru::LruCache;

use crate::error::{TopologyClientError, UnavailableReason};
use crate::snapshot::{Snapshot, check_group, decode_for};
use crate::store::{BoxError, ReadStore};

/// Default cache lifetime of a snapshot: 30 s (jittered ±20 %).
pub const DEFAULT_TTL_MS: u64 = 30_000;
/// Default lifetime of a remembered missing or failed read: 5 s.
pub const DEFAULT_NEGATIVE_TTL_MS: u64 = 5_000;
/// Default read timeout: 1 s.
pub const DEFAULT_READ_TIMEOUT_MS: u64 = 1_000;
/// Default bound of the cache: 10,000 groups (least recently used evicted).
pub const DEFAULT_MAX_GROUPS: usize = 10_000;
/// Default bound of the version floors: 100,000 (group, coordinator) pairs,
/// least recently used evicted. A floor is a few dozen bytes, so it outlives
/// the cache entry of its group by far; an evicted floor ends the
/// never-older guard of its pair and is reported
/// (`durability.topology_client.version_floor_evicted`).
pub const DEFAULT_MAX_VERSION_FLOORS: usize = 100_000;

/// Derives a group's members locally, without I/O (`None`: no seed for it).
pub type SeedFn = Arc<dyn Fn(&str) -> Option<Snapshot> + Send + Sync>;
/// Application fallback: called last, never cached.
pub type FallbackFn = Arc<
    dyn Fn(String, UnavailableReason) -> BoxFuture<'static, Result<Snapshot, BoxError>>
        + Send
        + Sync,
>;
/// Reports each fallback served.
pub type FallbackHook = Arc<dyn Fn(&FallbackReport) + Send + Sync>;

/// Which fallback served a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FallbackSource {
    /// This client's last good snapshot, expired less than `stale_if_error` ago.
    StaleIfError,
    /// The seed function.
    Seed,
    /// The application fallback.
    Fallback,
}

/// One fallback served, as reported to the hook.
#[derive(Debug, Clone)]
pub struct FallbackReport {
    /// The group.
    pub group: String,
    /// Which fallback.
    pub source: FallbackSource,
    /// Why the published copy could not be used.
    pub reason: UnavailableReason,
}

/// The client's settings.
#[derive(Clone)]
pub struct ClientConfig {
    ttl_ms: u64,
    negative_ttl_ms: u64,
    read_timeout_ms: u64,
    stale_if_error_ms: Option<u64>,
    max_groups: usize,
    max_floors: usize,
    seed: Option<SeedFn>,
    fallback: Option<FallbackFn>,
    on_fallback: Option<FallbackHook>,
    clock: Arc<dyn Clock>,
    jitter: Random,
}

durability_time::debug_fields!(ClientConfig {
    ttl_ms,
    negative_ttl_ms,
    read_timeout_ms,
    stale_if_error_ms,
    max_groups
});

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            ttl_ms: DEFAULT_TTL_MS,
            negative_ttl_ms: DEFAULT_NEGATIVE_TTL_MS,
            read_timeout_ms: DEFAULT_READ_TIMEOUT_MS,
            stale_if_error_ms: None,
            max_groups: DEFAULT_MAX_GROUPS,
            max_floors: DEFAULT_MAX_VERSION_FLOORS,
            seed: None,
            fallback: None,
            on_fallback: None,
            clock: Arc::new(SystemClock),
            jitter: Random::os(),
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl ClientConfig {
    /// The defaults: 30 s TTL, 5 s negative TTL, 1 s read timeout, no
    /// fallbacks, 10,000 groups, the system clock.
    pub fn new() -> Self {
        Self::default()
    }
    /// How long a snapshot is served from cache (jittered ±20 %).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl_ms = ms(ttl);
        self
    }
    /// How long a missing or failed read is remembered.
    #[must_use]
    pub fn negative_ttl(mut self, ttl: Duration) -> Self {
        self.negative_ttl_ms = ms(ttl);
        self
    }
    /// How long one store read may take.
    #[must_use]
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout_ms = ms(timeout);
        self
    }
    /// Serve the last good snapshot for this long after it expired when a
    /// read fails (never for a missing group).
    #[must_use]
    pub fn stale_if_error(mut self, window: Duration) -> Self {
        self.stale_if_error_ms = Some(ms(window));
        self
    }
    /// The most groups cached at once.
    #[must_use]
    pub fn max_groups(mut self, n: usize) -> Self {
        self.max_groups = n;
        self
    }
    /// The most (group, coordinator) version floors kept (default
    /// [`DEFAULT_MAX_VERSION_FLOORS`], 100,000). A floor is the highest
    /// version served for the group from that coordinator; it outlives the
    /// group's cache entry, so a group read again after its entry was
    /// evicted never comes back older. The guarantee holds for at most this
    /// many pairs: past the bound the least recently used floor is evicted
    /// (the event `durability.topology_client.version_floor_evicted`,
    /// counted by [`TopologyClient::version_floors_evicted`]), and that pair
    /// may then be served older than before.
    #[must_use]
    pub fn max_version_floors(mut self, n: usize) -> Self {
        self.max_floors = n;
        self
    }
    /// Derives members locally when the published copy is unusable.
    #[must_use]
    pub fn seed(mut self, seed: SeedFn) -> Self {
        self.seed = Some(seed);
        self
    }
    /// Application code run last; its answer is not cached.
    #[must_use]
    pub fn fallback(mut self, fallback: FallbackFn) -> Self {
        self.fallback = Some(fallback);
        self
    }
    /// Reports each fallback and its source.
    #[must_use]
    pub fn on_fallback(mut self, hook: FallbackHook) -> Self {
        self.on_fallback = Some(hook);
        self
    }
    /// The clock (tests inject a manual one).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
    /// The random source of the TTL jitter (tests seed or fix it).
    #[must_use]
    pub fn jitter(mut self, jitter: Random) -> Self {
        self.jitter = jitter;
        self
    }
}

type ReadOutcome = Result<Arc<Snapshot>, UnavailableReason>;

#[derive(Default)]
struct Slot {
    good: Option<Good>,
    negative: Option<(UnavailableReason, i64)>,
    inflight: Option<Shared<BoxFuture<'static, ReadOutcome>>>,
}

struct Good {
    snapshot: Arc<Snapshot>,
    fresh_until: i64,
}

struct Cache {
    groups: LruCache<String, Slot>,
    /// (group, coordinator) → the highest version served: the never-older
    /// guard, bounded apart from (and far beyond) the groups.
    floors: LruCache<(String, String), u64>,
    /// How many floors were evicted to make room (each ended a guard).
    floors_evicted: u64,
}

struct Inner<R> {
    store: R,
    config: ClientConfig,
    cache: Mutex<Cache>,
    metrics: ClientMetrics,
}

/// The client's metric handles, bound when it is built (a lookup in the
/// recorder per read would sit on the cache-hit fast path).
struct ClientMetrics {
    hits: metrics::Counter,
    store_reads: metrics::Counter,
    unavailable: metrics::Counter,
    stale_if_error: metrics::Counter,
    seed: metrics::Counter,
    fallback: metrics::Counter,
}

impl ClientMetrics {
    fn new() -> Self {
        let fallbacks = |source: &'static str| metrics::counter!("durability_topology_client_fallbacks_total", "source" => source);
        Self {
            hits: metrics::counter!("durability_topology_client_cache_hits_total"),
            store_reads: metrics::counter!("durability_topology_client_store_reads_total"),
            unavailable: metrics::counter!("durability_topology_client_unavailable_total"),
            stale_if_error: fallbacks("stale_if_error"),
            seed: fallbacks("seed"),
            fallback: fallbacks("fallback"),
        }
    }
}

/// A read-only topology client. It reads the published copy through a
/// [`ReadStore`] and never contacts the coordinator.
///
/// Cloning shares the cache.
///
/// # Example
///
/// Reads within the TTL are served from the cache without a store read; a
/// newer publication is seen once the entry expires; while the store
/// fails, the last good copy is served for the `stale_if_error` window,
/// then the group is unavailable (a typed error, never an empty group).
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use durability_topology_client::{
///     BoxError, ClientConfig, ManualClock, Random, ReadStore, TopologyClient,
/// };
///
/// #[derive(Clone, Default)]
/// struct Store(Arc<Mutex<(Option<Vec<u8>>, bool, u32)>>); // (copy, down, reads)
/// impl ReadStore for Store {
///     async fn read(&self, _group: &str) -> Result<Option<Vec<u8>>, BoxError> {
///         let mut s = self.0.lock().unwrap();
///         s.2 += 1;
///         if s.1 { Err("store down".into()) } else { Ok(s.0.clone()) }
///     }
/// }
/// fn publish(store: &Store, version: u64) {
///     let json = format!(
///         r#"{{"format":1,"group":"chat","version":{version},"coordinator":"c1","members":[{{"id":"node-a","state":"active","joinedAt":1}}]}}"#
///     );
///     store.0.lock().unwrap().0 = Some(json.into_bytes());
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Store::default();
/// publish(&store, 1);
/// let clock = ManualClock::new(1_700_000_000_000);
/// let client = TopologyClient::new(
///     store.clone(),
///     ClientConfig::new()
///         .ttl(Duration::from_secs(1))
///         .stale_if_error(Duration::from_secs(60))
///         .clock(Arc::new(clock.clone()))
///         .jitter(Random::fixed(0.5)),
/// )?;
///
/// assert_eq!(client.get("chat").await?.version, 1);
/// publish(&store, 2);
/// assert_eq!(client.get("chat").await?.version, 1, "cached within the TTL");
/// assert_eq!(store.0.lock().unwrap().2, 1, "one store read so far");
///
/// clock.advance(2_000);
/// assert_eq!(client.get("chat").await?.version, 2);
///
/// store.0.lock().unwrap().1 = true; // the store fails from now on
/// clock.advance(2_000);
/// assert_eq!(client.get("chat").await?.version, 2, "the last good copy");
/// clock.advance(61_000);
/// assert_eq!(client.get("chat").await.unwrap_err().code(), "TOPOLOGY_UNAVAILABLE");
/// # Ok(())
/// # }
/// ```
pub struct TopologyClient<R> {
    inner: Arc<Inner<R>>,
}

impl<R> std::fmt::Debug for TopologyClient<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopologyClient").finish_non_exhaustive()
    }
}

impl<R> Clone for TopologyClient<R> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

fn i64_ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

enum Step {
    Hit(Arc<Snapshot>),
    Failed(UnavailableReason),
    Wait(Shared<BoxFuture<'static, ReadOutcome>>),
}

impl<R: ReadStore> TopologyClient<R> {
    /// A client over `store`.
    ///
    /// # Errors
    /// [`TopologyClientError::InvalidConfig`] for a zero TTL, read timeout or
    /// cache bound.
    pub fn new(store: R, config: ClientConfig) -> Result<Self, TopologyClientError> {
        let bad = |field: &'static str, reason: &str| TopologyClientError::InvalidConfig {
            field,
            reason: reason.to_owned(),
        };
        if config.ttl_ms == 0 {
            return Err(bad("ttl", "must be positive"));
        }
        if config.read_timeout_ms == 0 {
            return Err(bad("read_timeout", "must be positive"));
        }
        let max = NonZeroUsize::new(config.max_groups)
            .ok_or_else(|| bad("max_groups", "must be positive"))?;
        let floors = NonZeroUsize::new(config.max_floors)
            .ok_or_else(|| bad("max_version_floors", "must be positive"))?;
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                config,
                cache: Mutex::new(Cache {
                    groups: LruCache::new(max),
                    floors: LruCache::new(floors),
                    floors_evicted: 0,
                }),
                metrics: ClientMetrics::new(),
            }),
        })
    }

    /// How many groups the cache holds now (at most the configured bound).
    pub fn cached_groups(&self) -> usize {
        self.inner.lock().groups.len()
    }

    /// How many version floors are kept now (at most the configured bound).
    pub fn version_floors(&self) -> usize {
        self.inner.lock().floors.len()
    }

    /// How many version floors this client evicted to make room, each
    /// ending the never-older guard of its (group, coordinator) pair (each
    /// also logged as `durability.topology_client.version_floor_evicted`).
    pub fn version_floors_evicted(&self) -> u64 {
        self.inner.lock().floors_evicted
    }

    /// The group's topology: from cache, or one store read shared by every
    /// concurrent caller, or a fallback.
    ///
    /// # Errors
    /// [`TopologyClientError::InvalidGroup`] for a bad name;
    /// [`TopologyClientError::TopologyUnavailable`] with the reason when the
    /// published copy is missing, invalid, slow or unreadable and no fallback
    /// answered.
    pub async fn get(&self, group: &str) -> Result<Arc<Snapshot>, TopologyClientError> {
        // Fast path: a cached group was validated when it was first read.
        if let Some(snapshot) = self.fresh(group) {
            self.inner.metrics.hits.increment(1);
            return Ok(snapshot);
        }
        check_group(group).map_err(|reason| TopologyClientError::InvalidGroup { reason })?;
        let step = self.lookup(group);
        let reason = match step {
            Step::Hit(snapshot) => {
                self.inner.metrics.hits.increment(1);
                return Ok(snapshot);
            }
            Step::Failed(reason) => reason,
            Step::Wait(read) => match read.await {
                Ok(snapshot) => return Ok(snapshot),
                Err(reason) => reason,
            },
        };
        self.fall_back(group, reason).await
    }

    fn fresh(&self, group: &str) -> Option<Arc<Snapshot>> {
        let now = self.inner.config.clock.now_ms();
        let mut cache = self.inner.lock();
        let good = cache.groups.get(group)?.good.as_ref()?;
        (now < good.fresh_until).then(|| Arc::clone(&good.snapshot))
    }

    fn lookup(&self, group: &str) -> Step {
        let inner = &self.inner;
        let now = inner.config.clock.now_ms();
        let mut cache = inner.lock();
        let slot = cache
            .groups
            .get_or_insert_mut(group.to_owned(), Slot::default);
        if let Some(good) = &slot.good
            && now < good.fresh_until
        {
            return Step::Hit(Arc::clone(&good.snapshot));
        }
        if let Some((reason, until)) = &slot.negative
            && now < *until
        {
            return Step::Failed(reason.clone());
        }
        if let Some(read) = &slot.inflight {
            return Step::Wait(read.clone());
        }
        let read = Self::read(Arc::clone(inner), group.to_owned())
            .boxed()
            .shared();
        slot.inflight = Some(read.clone());
        Step::Wait(read)
    }

    async fn read(inner: Arc<Inner<R>>, group: String) -> ReadOutcome {
        inner.metrics.store_reads.increment(1);
        {
            let clock = Arc::clone(&inner.config.clock);
            let timeout = inner.config.read_timeout_ms;
            let deadline = clock.now_ms().saturating_add(i64_ms(timeout));
            let outcome = match timeout_at(&*clock, deadline, inner.store.read(&group)).await {
                Ok(Ok(Some(bytes))) => decode_for(&group, &bytes)
                    .map(Arc::new)
                    .map_err(UnavailableReason::Invalid),
                Ok(Ok(None)) => Err(UnavailableReason::Missing),
                Ok(Err(e)) => Err(UnavailableReason::ReadFailed(e.to_string())),
                Err(_) => Err(UnavailableReason::Timeout { after_ms: timeout }),
            };
            inner.settle(&group, outcome)
        }
    }

    async fn fall_back(
        &self,
        group: &str,
        reason: UnavailableReason,
    ) -> Result<Arc<Snapshot>, TopologyClientError> {
        let config = &self.inner.config;
        tracing::debug!(
            event = "durability.topology_client.read_unavailable",
            group, reason = %reason, "published topology unavailable"
        );
        if reason != UnavailableReason::Missing
            && let Some(window) = config.stale_if_error_ms
        {
            let now = config.clock.now_ms();
            let cache = self.inner.lock();
            if let Some(good) = cache.groups.peek(group).and_then(|s| s.good.as_ref())
                && now < good.fresh_until.saturating_add(i64_ms(window))
            {
                let snapshot = Arc::clone(&good.snapshot);
                drop(cache);
                self.report(group, FallbackSource::StaleIfError, &reason);
                return Ok(snapshot);
            }
        }
        if let Some(seed) = &config.seed
            && let Some(snapshot) = seed(group)
        {
            self.report(group, FallbackSource::Seed, &reason);
            return Ok(Arc::new(snapshot));
        }
        if let Some(fallback) = &config.fallback {
            match fallback(group.to_owned(), reason.clone()).await {
                Ok(snapshot) => {
                    self.report(group, FallbackSource::Fallback, &reason);
                    return Ok(Arc::new(snapshot));
                }
                Err(error) => tracing::warn!(
                    event = "durability.topology_client.fallback_failed",
                    group, %error, "topology fallback failed"
                ),
            }
        }
        self.inner.metrics.unavailable.increment(1);
        Err(TopologyClientError::TopologyUnavailable {
            group: group.to_owned(),
            reason,
        })
    }

    fn report(&self, group: &str, source: FallbackSource, reason: &UnavailableReason) {
        let m = &self.inner.metrics;
        match source {
            FallbackSource::StaleIfError => &m.stale_if_error,
            FallbackSource::Seed => &m.seed,
            FallbackSource::Fallback => &m.fallback,
        }
        .increment(1);
        tracing::info!(
            event = "durability.topology_client.fallback",
            group, ?source, reason = %reason, "served topology from a fallback"
        );
        if let Some(hook) = &self.inner.config.on_fallback {
            let report = FallbackReport {
                group: group.to_owned(),
                source,
                reason: reason.clone(),
            };
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(&report))).is_err() {
                tracing::warn!(
                    event = "durability.topology_client.hook_failed",
                    group,
                    "fallback hook panicked"
                );
            }
        }
    }
}

impl<R> Inner<R> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fresh_until(&self, now: i64) -> i64 {
        let r = self.config.jitter.unit();
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        let ttl = (self.config.ttl_ms as f64 * (0.8 + 0.4 * r)).round() as i64;
        now.saturating_add(ttl.max(1))
    }

    /// The least recently used version floor made room for another: the
    /// never-older guard of that (group, coordinator) lapsed, so this client
    /// may serve an older snapshot of it than it served before.
    fn floor_evicted(
        cache: &mut Cache,
        max_floors: usize,
        (group, coordinator, version): (&str, &str, u64),
    ) {
        cache.floors_evicted = cache.floors_evicted.saturating_add(1);
        tracing::warn!(
            event = "durability.topology_client.version_floor_evicted",
            group,
            coordinator,
            version,
            max_version_floors = max_floors,
            "a version floor was evicted: this client no longer guards the group against an older snapshot from this coordinator"
        );
    }

    /// Records a finished read: a snapshot replaces the cached one unless it
    /// is an older version from the same coordinator; a snapshot older than
    /// the version floor of its coordinator (its cache entry was evicted) is
    /// refused as [`UnavailableReason::Regressed`]; a failure is remembered
    /// for the negative TTL.
    fn settle(&self, group: &str, outcome: ReadOutcome) -> ReadOutcome {
        let now = self.config.clock.now_ms();
        let fresh_until = self.fresh_until(now);
        let mut guard = self.lock();
        let cache = &mut *guard;
        let outcome = outcome.and_then(|snapshot| {
            let key = (group.to_owned(), snapshot.coordinator.clone());
            match cache.floors.get(&key).copied() {
                Some(served) if served > snapshot.version => {
                    let cached_newer = cache
                        .groups
                        .peek(group)
                        .and_then(|s| s.good.as_ref())
                        .filter(|g| g.snapshot.coordinator == snapshot.coordinator)
                        .map(|g| Arc::clone(&g.snapshot));
                    tracing::debug!(
                        event = "durability.topology_client.older_snapshot_ignored",
                        group,
                        served,
                        read = snapshot.version,
                        "an older snapshot from the same coordinator was not served"
                    );
                    cached_newer.ok_or(UnavailableReason::Regressed {
                        served,
                        read: snapshot.version,
                    })
                }
                _ => {
                    if let Some(((g, coordinator), version)) =
                        cache.floors.push(key.clone(), snapshot.version)
                        && (g.as_str(), coordinator.as_str()) != (key.0.as_str(), key.1.as_str())
                    {
                        let max = self.config.max_floors;
                        Self::floor_evicted(cache, max, (&g, &coordinator, version));
                    }
                    Ok(snapshot)
                }
            }
        });
        let slot = cache
            .groups
            .get_or_insert_mut(group.to_owned(), Slot::default);
        slot.inflight = None;
        match outcome {
            Ok(snapshot) => {
                slot.negative = None;
                slot.good = Some(Good {
                    snapshot: Arc::clone(&snapshot),
                    fresh_until,
                });
                Ok(snapshot)
            }
            Err(reason) => {
                let until = now.saturating_add(i64_ms(self.config.negative_ttl_ms));
                slot.negative = Some((reason.clone(), until));
                Err(reason)
            }
        }
    }
}
