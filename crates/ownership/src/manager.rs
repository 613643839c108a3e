//! [`Ownership`]: one task's owned scopes, dispatch admission, drain and the watchdog.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::error::OwnershipError;
use crate::metrics::OwnershipMetrics;
use crate::record::{Generation, OwnerEndpoint, OwnerRecord};
use crate::scope::{LifecycleId, OwnerScope, TaskId};
use crate::settings::{Admission, OwnershipSettings};
use crate::store::{ClaimOutcome, Claimant, Lease, LeaseStore};
use durability_time::{Clock, timeout_at};

/// Where a scope is owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// This task owns the scope at this generation.
    Local(Generation),
    /// Another task owns the scope: route there.
    Remote {
        /// The owning task.
        task: TaskId,
        /// Its generation.
        generation: Generation,
        /// The endpoint its record advertises, if any (grammar-checked
        /// only: check it against your policy before sending there).
        endpoint: Option<OwnerEndpoint>,
    },
}

#[derive(Debug, Clone)]
struct LocalLease {
    record: OwnerRecord,
    /// Lease deadline on the local clock: the local time before the request
    /// was sent plus the lease time the store reported left. Never later than
    /// the store's expiry.
    deadline_ms: u64,
}

struct Inner<S, C> {
    store: S,
    clock: C,
    task: TaskId,
    endpoint: Option<OwnerEndpoint>,
    settings: OwnershipSettings,
    leases: Mutex<HashMap<OwnerScope, LocalLease>>,
    draining: AtomicBool,
    in_flight: AtomicU64,
    idle: Notify,
    metrics: OwnershipMetrics,
    incarnation: incarnation::Incarnation,
    /// Scopes being handed off and admitted work per scope.
    scoped: Mutex<Scoped>,
    /// Notified when a scope's admitted work drops to zero.
    scope_idle: Notify,
}

/// Per-scope admission state for hand-offs.
#[derive(Debug, Default)]
struct Scoped {
    leaving: std::collections::HashSet<OwnerScope>,
    /// Admitted work per scope. A scope's entry stays when its count
    /// drops to zero (there are at most storage ids x classes x shards of
    /// them), so an admission finds it with one lookup and its permit
    /// shares the entry's copy of the scope (none of the scope's strings
    /// are copied, or freed, per call).
    in_flight: HashMap<OwnerScope, ScopeInFlight>,
}

/// One scope's admitted work, and the scope its permits share.
#[derive(Debug)]
struct ScopeInFlight {
    scope: Arc<OwnerScope>,
    count: u64,
}

/// The result of [`Ownership::hand_off`].
#[derive(Debug)]
pub enum HandOff {
    /// Admitted work on the scope finished and its lease (this generation)
    /// was released: another task may claim it at once.
    Released(Generation),
    /// Work on the scope did not finish in time: the scope stays owned here
    /// and admits work again.
    Busy {
        /// Work still in flight on the scope.
        in_flight: u64,
    },
    /// The scope was not owned here (or the stored record had moved).
    NotOwned,
    /// The release failed: the scope is forgotten here (it admits nothing)
    /// and its lease ends on the store by expiry.
    Failed(OwnershipError),
}

/// One task's view of ownership: claims, renewals, admission, drain and the
/// watchdog, over a [`LeaseStore`]. Clones share state.
///
/// # Example
///
/// A task renews what it owns on a timer (here by hand, on a manual
/// clock), then drains: admitted work finishes, the leases of matching
/// generations are released, and another task claims at once with a
/// higher generation, without waiting for the lease to run out.
///
/// ```
/// # use std::sync::Arc;
/// # use durability_ownership::memory::InMemoryLeaseStore;
/// # use durability_ownership::{
/// #     DrainReport, LifecycleAdmin, LifecycleId, ManualClock, OwnerScope, Ownership,
/// #     OwnershipSettings, Resolution, ShardCount, StorageId, TaskId,
/// # };
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let clock = ManualClock::new(1_000_000);
/// # let store = Arc::new(InMemoryLeaseStore::new(clock.clone(), ShardCount::default()));
/// # let lifecycle = LifecycleId::new("ns:shop")?;
/// # store.set_active_storage(&lifecycle, Some(&StorageId::new("st1")?)).await?;
/// let scope = OwnerScope::parse("st1:Cart:shard3", ShardCount::default())?;
/// let settings = OwnershipSettings { owner_ttl_ms: 10_000, ..OwnershipSettings::default() };
/// let a = Ownership::new(store.clone(), clock.clone(), TaskId::new("a")?, settings.clone());
/// let b = Ownership::new(store.clone(), clock.clone(), TaskId::new("b")?, settings);
///
/// let Resolution::Local(first) = a.resolve(&scope, &lifecycle).await? else { panic!() };
/// clock.advance(8_000);
/// for (_, renewed) in a.renew_all().await {
///     assert_eq!(renewed?, first); // a renew keeps the generation
/// }
/// clock.advance(8_000); // past the first lease, within the renewed one
/// assert!(matches!(b.resolve(&scope, &lifecycle).await?, Resolution::Remote { .. }));
///
/// let DrainReport::Drained { released, .. } = a.drain().await else { panic!() };
/// assert_eq!(released, [(scope.clone(), first)]);
/// let Resolution::Local(second) = b.resolve(&scope, &lifecycle).await? else { panic!() };
/// assert!(second > first);
/// # Ok(())
/// # }
/// ```
pub struct Ownership<S, C> {
    inner: Arc<Inner<S, C>>,
}

impl<S, C> std::fmt::Debug for Ownership<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ownership")
            .field("task", &self.inner.task)
            .finish_non_exhaustive()
    }
}

impl<S, C> Clone for Ownership<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// Admitted work. Dropping it ends the work and lets a drain proceed.
#[derive(Debug)]
#[must_use = "dropping the permit ends the admitted work"]
pub struct AdmissionPermit {
    scope: Arc<OwnerScope>,
    generation: Generation,
    counter: Arc<dyn InFlight>,
}

trait InFlight: Send + Sync + std::fmt::Debug {
    fn done(&self, scope: &OwnerScope);
}

impl<S: Send + Sync, C: Send + Sync> InFlight for Inner<S, C> {
    fn done(&self, scope: &OwnerScope) {
        {
            let mut scoped = self.scoped.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = scoped.in_flight.get_mut(scope) {
                n.count = n.count.saturating_sub(1);
                if n.count == 0 {
                    self.scope_idle.notify_waiters();
                }
            }
        }
        self.metrics.in_flight.decrement(1.0);
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }
}

impl<S, C> std::fmt::Debug for Inner<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ownership")
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

impl AdmissionPermit {
    /// The admitted scope.
    pub fn scope(&self) -> &OwnerScope {
        &self.scope
    }

    /// The generation the work runs under (carry it into fenced commits).
    pub fn generation(&self) -> Generation {
        self.generation
    }
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        self.counter.done(&self.scope);
    }
}

/// The result of a drain.
///
/// A drain is bounded twice: the wait for admitted work by
/// `drain_in_flight_timeout_ms`, and the whole drain (that wait and the
/// releases) by `drain_timeout_ms`, both on the ownership's clock.
/// [`DrainReport::TimedOut`] and [`DrainReport::ReleaseTimedOut`] are a
/// "drain timed out" (503): the supervisor must not treat the task's
/// scopes as released; the kept leases fail over by normal lease expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainReport {
    /// Admitted work finished; the listed scopes and generations were released.
    Drained {
        /// Scopes whose matching generation was released.
        released: Vec<(OwnerScope, Generation)>,
        /// Scopes whose release failed or no longer matched (they expire normally).
        not_released: Vec<OwnerScope>,
    },
    /// Admitted work did not finish in time (within the in-flight timeout or
    /// the drain timeout, whichever ends first): every lease is kept so
    /// failover waits for normal lease expiry.
    TimedOut {
        /// Work still in flight.
        in_flight: u64,
    },
    /// Admitted work finished, but the drain timeout ran out while releasing
    /// (releases run one at a time, in host id order). Releases already done
    /// stay done; the rest are kept: their leases stay on the store and in
    /// this task's state (no new work is admitted on them: the task is
    /// draining) and fail over by normal lease expiry. A later drain releases
    /// them again.
    ReleaseTimedOut {
        /// Scopes whose matching generation was released before the timeout.
        released: Vec<(OwnerScope, Generation)>,
        /// Scopes whose release failed or no longer matched before the timeout.
        not_released: Vec<OwnerScope>,
        /// The scope whose release was sent but not answered when time ran
        /// out: its outcome is unknown (released or kept). Release is exact
        /// and idempotent, so releasing it again is safe.
        in_doubt: Vec<OwnerScope>,
        /// Scopes whose release was never sent: kept.
        kept: Vec<OwnerScope>,
    },
}

impl DrainReport {
    /// Whether the drain ran out of time (a 503): leases not listed
    /// as released were kept or are in doubt.
    pub fn timed_out(&self) -> bool {
        !matches!(self, Self::Drained { .. })
    }
}

/// How a watchdog ended.
#[derive(Debug)]
pub enum WatchExit {
    /// The work finished (its token was cancelled by the caller) while owned.
    Finished,
    /// Renewal stopped or ownership moved: the scope was forgotten and the
    /// token cancelled.
    Lost(OwnershipError),
}

/// One owned scope in a [`Probe`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProbeScope {
    /// The scope's host id.
    pub scope: String,
    /// The owned generation.
    pub generation: u64,
    /// Local lease budget left, in milliseconds.
    pub lease_remaining_ms: u64,
}

/// Diagnostics: this task's owned scopes, generations and leases.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Probe {
    /// This task.
    pub task: String,
    /// Whether the task is draining.
    pub draining: bool,
    /// Admitted work in flight.
    pub in_flight: u64,
    /// Owned scopes, sorted by host id.
    pub scopes: Vec<ProbeScope>,
}

impl<S: LeaseStore, C: Clock> Ownership<S, C> {
    /// The ownership state of `task` over `store`; its owner records
    /// advertise no endpoint.
    pub fn new(store: S, clock: C, task: TaskId, settings: OwnershipSettings) -> Self {
        Self::with_endpoint(store, clock, task, None, settings)
    }

    /// The ownership state of `task` over `store`; every owner record it
    /// writes advertises `endpoint` (where other tasks reach it).
    pub fn with_endpoint(
        store: S,
        clock: C,
        task: TaskId,
        endpoint: Option<OwnerEndpoint>,
        settings: OwnershipSettings,
    ) -> Self {
        let metrics = OwnershipMetrics::new(task.as_str());
        Self {
            inner: Arc::new(Inner {
                store,
                clock,
                task,
                endpoint,
                settings,
                leases: Mutex::new(HashMap::new()),
                draining: AtomicBool::new(false),
                in_flight: AtomicU64::new(0),
                idle: Notify::new(),
                metrics,
                incarnation: incarnation::Incarnation::default(),
                scoped: Mutex::new(Scoped::default()),
                scope_idle: Notify::new(),
            }),
        }
    }

    /// The lease store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// This task.
    pub fn task(&self) -> &TaskId {
        &self.inner.task
    }

    /// The endpoint this task's owner records advertise.
    pub fn endpoint(&self) -> Option<&OwnerEndpoint> {
        self.inner.endpoint.as_ref()
    }

    /// The settings.
    pub fn settings(&self) -> &OwnershipSettings {
        &self.inner.settings
    }

    /// The effective lease guard: the configured guard, but never more than
    /// half the TTL (else every admission would renew and still fail, and the
    /// watchdog would renew in a loop).
    fn guard_ms(&self) -> u64 {
        let s = &self.inner.settings;
        s.lease_guard_ms.min(s.owner_ttl_ms / 2)
    }

    fn leases(&self) -> MutexGuard<'_, HashMap<OwnerScope, LocalLease>> {
        self.inner
            .leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn remember(&self, lease: &Lease, sent_ms: u64) -> Generation {
        let generation = lease.record.generation();
        let deadline_ms = sent_ms.saturating_add(lease.remaining_ms);
        self.leases().insert(
            lease.record.scope().clone(),
            LocalLease {
                record: lease.record.clone(),
                deadline_ms,
            },
        );
        generation
    }

    fn scoped(&self) -> MutexGuard<'_, Scoped> {
        self.inner
            .scoped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Admitted work in flight on `scope`.
    pub fn in_flight_on(&self, scope: &OwnerScope) -> u64 {
        self.scoped().in_flight.get(scope).map_or(0, |n| n.count)
    }

    /// Hands `scope` off gracefully (balancing): from now on admission of
    /// work on it is refused ([`OwnershipError::Draining`]); admitted work
    /// on it gets until `wait_until_ms` (the ownership's clock) to finish;
    /// then the scope is forgotten here and its exact record released, so
    /// another task claims it at once, at a higher generation. Work on
    /// other scopes is not touched. If work is still running at the
    /// deadline the scope stays owned and admits again ([`HandOff::Busy`]).
    pub async fn hand_off(&self, scope: &OwnerScope, wait_until_ms: i64) -> HandOff {
        let Some(record) = self.leases().get(scope).map(|l| l.record.clone()) else {
            return HandOff::NotOwned;
        };
        self.scoped().leaving.insert(scope.clone());
        let idle = until_notified(&self.inner.scope_idle, || self.in_flight_on(scope) == 0);
        if timeout_at(&self.inner.clock, wait_until_ms, idle)
            .await
            .is_err()
        {
            let in_flight = self.in_flight_on(scope);
            if in_flight != 0 {
                self.scoped().leaving.remove(scope);
                tracing::info!(
                    event = "durability.ownership.hand_off_busy",
                    scope = %scope,
                    in_flight,
                    "hand-off postponed: work still running on the scope"
                );
                return HandOff::Busy { in_flight };
            }
        }
        {
            let mut leases = self.leases();
            if leases.get(scope).is_some_and(|l| l.record == record) {
                leases.remove(scope);
            }
        }
        let released = self.inner.store.release(&record).await;
        self.scoped().leaving.remove(scope);
        match released {
            Ok(true) => {
                tracing::info!(
                    event = "durability.ownership.handed_off",
                    scope = %scope,
                    generation = record.generation().get(),
                    "owner scope handed off"
                );
                HandOff::Released(record.generation())
            }
            Ok(false) => HandOff::NotOwned,
            Err(e) => {
                scope_failed(
                    "durability.ownership.hand_off_failed",
                    scope,
                    &e,
                    "releasing a handed-off scope failed; its lease ends by expiry",
                );
                HandOff::Failed(e)
            }
        }
    }

    /// Forgets a scope locally (its lease is left to expire on the store).
    pub fn forget(&self, scope: &OwnerScope) {
        self.leases().remove(scope);
    }

    /// Resolves the owner of `scope`: a live local lease answers at once;
    /// otherwise claims it (bumping the generation if missing or expired), or
    /// reports the live owner on another task.
    ///
    /// A live record of this task id is adopted only when this process
    /// wrote it. One written by another run of the task id (a crashed
    /// predecessor, or another process started with the same task id) is
    /// never adopted or given back: the resolution answers
    /// [`OwnershipError::OwnerRace`] until its lease ends on the store's
    /// clock (a restart with the same task id waits out its predecessor's
    /// leases, at most the owner TTL), and
    /// [`OwnershipError::DuplicateTaskId`] once that lease is seen moving
    /// forward (or a newer generation of the task id appears) between two
    /// resolutions, and for every resolution after (see
    /// [`Ownership::duplicate_task`]).
    ///
    /// # Errors
    /// [`OwnershipError::Draining`] while draining,
    /// [`OwnershipError::DuplicateTaskId`], [`OwnershipError::OwnerRace`]
    /// (held by another run of this task id), and the errors of
    /// [`LeaseStore::claim`].
    pub async fn resolve(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<Resolution, OwnershipError> {
        let span = tracing::debug_span!("durability.ownership.resolve", scope = %scope);
        self.resolve_inner(scope, lifecycle).instrument(span).await
    }

    async fn resolve_inner(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> Result<Resolution, OwnershipError> {
        if self.inner.draining.load(Ordering::SeqCst) {
            return Err(OwnershipError::Draining);
        }
        if let Some(e) = self.inner.incarnation.duplicate(&self.inner.task) {
            return Err(e);
        }
        let now = self.inner.clock.now_ms_u64();
        if let Some(l) = self.leases().get(scope)
            && l.deadline_ms > now
            && l.record.lifecycle() == lifecycle
        {
            return Ok(Resolution::Local(l.record.generation()));
        }
        let sent = self.inner.clock.now_ms_u64();
        let claimant = self.claimant(lifecycle);
        let outcome = self.inner.store.claim_as(scope, claimant).await;
        self.apply_claim(scope, lifecycle, outcome, sent).await
    }

    /// Applies one claim's outcome as [`Ownership::resolve`] does.
    async fn apply_claim(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
        outcome: Result<ClaimOutcome, OwnershipError>,
        sent: u64,
    ) -> Result<Resolution, OwnershipError> {
        match outcome {
            Ok(ClaimOutcome::Claimed(lease)) => {
                self.inner.incarnation.wrote(&lease.record);
                self.inner.metrics.claimed.increment(1);
                tracing::info!(
                    event = "durability.ownership.claimed",
                    scope = %scope,
                    generation = lease.record.generation().get(),
                    "claimed owner scope"
                );
                if self.inner.draining.load(Ordering::SeqCst) {
                    // A drain started while claiming: give the scope straight back.
                    let _ = self.inner.store.release(&lease.record).await;
                    return Err(OwnershipError::Draining);
                }
                Ok(Resolution::Local(self.remember(&lease, sent)))
            }
            Ok(ClaimOutcome::Held(lease))
                if lease.record.task() == &self.inner.task
                    && self.inner.incarnation.is_ours(&lease.record) =>
            {
                self.inner.metrics.held_here.increment(1);
                tracing::debug!(
                    event = "durability.ownership.held_here",
                    scope = %scope,
                    generation = lease.record.generation().get(),
                    "the store's live record is one this process wrote; adopted"
                );
                Ok(Resolution::Local(self.remember(&lease, sent)))
            }
            // A record of this task id from another run (a crashed
            // predecessor, or a duplicate): never adopted or given back.
            Ok(ClaimOutcome::Held(lease)) if lease.record.task() == &self.inner.task => {
                Err(self.held_by_another_run(scope, lifecycle).await)
            }
            Ok(ClaimOutcome::Held(lease)) => {
                self.inner.metrics.held_elsewhere.increment(1);
                tracing::debug!(
                    event = "durability.ownership.held_elsewhere",
                    scope = %scope,
                    owner = lease.record.task().as_str(),
                    generation = lease.record.generation().get(),
                    "another task owns the scope"
                );
                self.forget(scope);
                Ok(Resolution::Remote {
                    task: lease.record.task().clone(),
                    generation: lease.record.generation(),
                    endpoint: lease.record.endpoint().cloned(),
                })
            }
            Err(e) => {
                self.inner.metrics.claim_failed.increment(1);
                self.forget(scope);
                if e.outcome() == crate::error::DispatchOutcome::Unknown {
                    self.inner.incarnation.unsure(scope);
                }
                scope_failed(
                    "durability.ownership.claim_failed",
                    scope,
                    &e,
                    "claiming the owner scope failed",
                );
                Err(e)
            }
        }
    }

    /// This task claiming in `lifecycle`: its endpoint and owner TTL.
    fn claimant<'a>(&'a self, lifecycle: &'a LifecycleId) -> Claimant<'a> {
        Claimant::new(
            lifecycle,
            &self.inner.task,
            self.inner.settings.owner_ttl_ms,
        )
        .with_endpoint(self.inner.endpoint.as_ref())
    }

    /// Claims every scope of `scopes` not already owned here in one
    /// [`LeaseStore::claim_many`] call (one round trip on a batching
    /// store), and applies each outcome exactly as [`Ownership::resolve`]
    /// applies its own. One result per scope, in order.
    pub async fn claim_many(
        &self,
        scopes: &[OwnerScope],
        lifecycle: &LifecycleId,
    ) -> Vec<(OwnerScope, Result<Resolution, OwnershipError>)> {
        if self.inner.draining.load(Ordering::SeqCst) {
            return scopes
                .iter()
                .map(|s| (s.clone(), Err(OwnershipError::Draining)))
                .collect();
        }
        if self.inner.incarnation.duplicate(&self.inner.task).is_some() {
            return scopes
                .iter()
                .map(|s| {
                    let e = self.inner.incarnation.duplicate(&self.inner.task);
                    (s.clone(), Err(e.unwrap_or(OwnershipError::Draining)))
                })
                .collect();
        }
        let sent = self.inner.clock.now_ms_u64();
        let claimant = self.claimant(lifecycle);
        let results = self.inner.store.claim_many(scopes, claimant).await;
        let mut results = results.into_iter();
        let mut out = Vec::with_capacity(scopes.len());
        for scope in scopes {
            let outcome = results.next().unwrap_or_else(|| {
                Err(OwnershipError::OwnerUnavailable {
                    source: "the lease store returned fewer claim results than scopes".into(),
                })
            });
            let applied = self.apply_claim(scope, lifecycle, outcome, sent).await;
            out.push((scope.clone(), applied));
        }
        out
    }

    /// Renews the local lease of `scope` (same task, same generation, exact
    /// record, active storage pointer), one atomic store step.
    ///
    /// # Errors
    /// [`OwnershipError::StaleOwner`] when the scope is not owned here or the
    /// record moved (the scope is forgotten), lifecycle errors (forgotten
    /// too), or a store error or [`OwnershipError::OwnerRace`] (nothing was
    /// written: the lease is kept until its deadline).
    pub async fn renew(&self, scope: &OwnerScope) -> Result<Generation, OwnershipError> {
        let Some(local) = self.leases().get(scope).cloned() else {
            return Err(OwnershipError::StaleOwner {
                scope: scope.to_string(),
            });
        };
        let sent = self.inner.clock.now_ms_u64();
        let result = self
            .inner
            .store
            .renew(&local.record, self.inner.settings.owner_ttl_ms)
            .await;
        self.renewed(scope, &local.record, sent, result)
    }

    /// Applies the store's answer to a renew of `record` sent at `sent`.
    fn renewed(
        &self,
        scope: &OwnerScope,
        record: &OwnerRecord,
        sent: u64,
        result: Result<Lease, OwnershipError>,
    ) -> Result<Generation, OwnershipError> {
        match result {
            Ok(lease) => {
                self.inner.metrics.renewed.increment(1);
                // Only update if the scope was not forgotten or replaced meanwhile.
                let mut leases = self.leases();
                if let Some(l) = leases.get_mut(scope)
                    && &l.record == record
                {
                    l.deadline_ms = sent.saturating_add(lease.remaining_ms);
                }
                Ok(lease.record.generation())
            }
            Err(e) => {
                // An unreachable store, an unknown outcome or a race that
                // wrote nothing (`owner_race`: the SQLite store's answer when
                // its file is busy) leave the lease as it was: it stands
                // until its deadline, admission still checks the budget and
                // commits are fenced, and the next renew decides. Every other
                // refusal is definite: the scope is forgotten.
                if matches!(
                    e,
                    OwnershipError::StoreUnavailable { .. }
                        | OwnershipError::OwnerUnavailable { .. }
                        | OwnershipError::OwnerRace { .. }
                ) {
                    self.inner.metrics.renew_unknown.increment(1);
                } else {
                    self.inner.metrics.renew_lost.increment(1);
                    self.leases().remove(scope);
                }
                scope_failed(
                    "durability.ownership.renew_failed",
                    scope,
                    &e,
                    "renewing the owner lease failed",
                );
                Err(e)
            }
        }
    }

    /// Renews every owned scope (the supervisor's periodic renew) through one
    /// [`LeaseStore::renew_many`] call, so a batching store needs a handful
    /// of round trips for any number of scopes. Each result is applied
    /// exactly as [`Ownership::renew`] applies its own. Results are sorted by
    /// host id.
    pub async fn renew_all(&self) -> Vec<(OwnerScope, Result<Generation, OwnershipError>)> {
        let mut owned: Vec<(OwnerScope, OwnerRecord)> = self
            .leases()
            .iter()
            .map(|(s, l)| (s.clone(), l.record.clone()))
            .collect();
        owned.sort_by(|a, b| a.0.host_id().cmp(b.0.host_id()));
        let records: Vec<OwnerRecord> = owned.iter().map(|(_, r)| r.clone()).collect();
        let sent = self.inner.clock.now_ms_u64();
        let results = self
            .inner
            .store
            .renew_many(&records, self.inner.settings.owner_ttl_ms)
            .await;
        let mut results = results.into_iter();
        owned
            .into_iter()
            .map(|(scope, record)| {
                let result = results.next().unwrap_or_else(|| {
                    Err(OwnershipError::OwnerUnavailable {
                        source: "the lease store returned fewer renew results than records".into(),
                    })
                });
                let applied = self.renewed(&scope, &record, sent, result);
                (scope, applied)
            })
            .collect()
    }

    /// Dispatch admission, as the settings' [`Admission`] mode says.
    ///
    /// With [`Admission::Snapshot`] (the default) it is
    /// [`Ownership::admit_checked`]: one snapshot read of the owner record,
    /// delete lock, active storage pointer and store clock, then the local
    /// checks. With [`Admission::Cached`] it does only the local checks: this
    /// task is not draining, owns `scope` at exactly `generation`, and the
    /// local lease has not expired; with ample budget that does no I/O.
    /// In both modes, with less than the guard left it first tries a
    /// same-task same-generation renew and fails closed if that fails.
    ///
    /// # Errors
    /// [`OwnershipError::Draining`], [`OwnershipError::StaleOwner`],
    /// [`OwnershipError::LeaseExpired`], or the renew error; in snapshot mode
    /// also the errors of [`Ownership::admit_checked`].
    pub async fn admit(
        &self,
        scope: &OwnerScope,
        generation: Generation,
    ) -> Result<AdmissionPermit, OwnershipError> {
        let admitted = match self.inner.settings.admission {
            Admission::Snapshot => self.admit_checked(scope, generation).await,
            Admission::Cached => self.admit_cached(scope, generation).await,
        };
        match &admitted {
            Ok(_) => self.inner.metrics.admitted.increment(1),
            Err(_) => self.inner.metrics.refused.increment(1),
        }
        admitted
    }

    /// The local part of admission (the whole of [`Admission::Cached`]):
    /// draining, task and generation, local lease budget, the guard renew.
    async fn admit_cached(
        &self,
        scope: &OwnerScope,
        generation: Generation,
    ) -> Result<AdmissionPermit, OwnershipError> {
        if self.inner.draining.load(Ordering::SeqCst) {
            return Err(OwnershipError::Draining);
        }
        let budget = self.budget(scope, generation)?;
        if budget < self.guard_ms() {
            let renewed = self.renew(scope).await?;
            if renewed != generation {
                return Err(OwnershipError::StaleOwner {
                    scope: scope.to_string(),
                });
            }
            if self.budget(scope, generation)? < self.guard_ms() {
                return Err(OwnershipError::LeaseExpired {
                    scope: scope.to_string(),
                });
            }
        }
        let key = {
            let mut scoped = self.scoped();
            if scoped.leaving.contains(scope) {
                return Err(OwnershipError::Draining);
            }
            if let Some(n) = scoped.in_flight.get_mut(scope) {
                n.count += 1;
                Arc::clone(&n.scope)
            } else {
                let key = Arc::new(scope.clone());
                let entry = ScopeInFlight {
                    scope: Arc::clone(&key),
                    count: 1,
                };
                scoped.in_flight.insert(scope.clone(), entry);
                key
            }
        };
        self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        self.inner.metrics.in_flight.increment(1.0);
        let permit = AdmissionPermit {
            scope: key,
            generation,
            counter: Arc::clone(&self.inner) as Arc<dyn InFlight>,
        };
        if self.inner.draining.load(Ordering::SeqCst) {
            drop(permit);
            return Err(OwnershipError::Draining);
        }
        Ok(permit)
    }

    /// Dispatch admission with the full owner-side assertion, whatever the
    /// [`Admission`] setting: first reads the owner record, generation, active
    /// storage pointer, delete lock and the store's clock in one snapshot (one
    /// round trip), requires the exact local record and a valid lifecycle,
    /// then does the local checks of [`Admission::Cached`]. It is what
    /// [`Ownership::admit`] does by default; call it directly where a fresh
    /// snapshot is required even when admission is configured cached (for
    /// example storage deletion).
    ///
    /// # Errors
    /// As [`Ownership::admit`], plus [`OwnershipError::StorageInactive`],
    /// [`OwnershipError::DeleteLocked`] and snapshot errors. A failed check
    /// forgets the scope.
    pub async fn admit_checked(
        &self,
        scope: &OwnerScope,
        generation: Generation,
    ) -> Result<AdmissionPermit, OwnershipError> {
        if self.inner.draining.load(Ordering::SeqCst) {
            return Err(OwnershipError::Draining);
        }
        // Refusals the local state already proves (not owned here, another
        // generation, an expired local lease) need no round trip.
        self.budget(scope, generation)?;
        let local = match self.leases().get(scope) {
            Some(l) if l.record.generation() == generation => l.clone(),
            _ => {
                return Err(OwnershipError::StaleOwner {
                    scope: scope.to_string(),
                });
            }
        };
        let sent = self.inner.clock.now_ms_u64();
        let checked = match self
            .inner
            .store
            .snapshot(scope, local.record.lifecycle())
            .await
        {
            Ok(snap) => crate::store::check_lifecycle(
                scope.storage_id(),
                local.record.lifecycle(),
                snap.active_storage.as_ref(),
                snap.delete_lock,
            )
            .and_then(|()| crate::store::check_shard_count(scope, snap.shard_count))
            .and_then(|()| match snap.owner {
                Some(lease) if lease.record == local.record => Ok(lease.remaining_ms),
                _ => Err(OwnershipError::StaleOwner {
                    scope: scope.to_string(),
                }),
            }),
            Err(e) => Err(e),
        };
        match checked {
            Ok(remaining) => {
                let mut leases = self.leases();
                if let Some(l) = leases.get_mut(scope)
                    && l.record == local.record
                {
                    l.deadline_ms = l.deadline_ms.min(sent.saturating_add(remaining));
                }
            }
            Err(e) => {
                if !matches!(
                    e,
                    OwnershipError::StoreUnavailable { .. }
                        | OwnershipError::OwnerUnavailable { .. }
                ) {
                    self.forget(scope);
                }
                scope_failed(
                    "durability.ownership.admission_refused",
                    scope,
                    &e,
                    "admission refused",
                );
                return Err(e);
            }
        }
        self.admit_cached(scope, generation).await
    }

    /// Lease budget left for `scope` at `generation` on the local clock.
    fn budget(&self, scope: &OwnerScope, generation: Generation) -> Result<u64, OwnershipError> {
        let now = self.inner.clock.now_ms_u64();
        let mut leases = self.leases();
        let Some(l) = leases.get(scope) else {
            return Err(OwnershipError::StaleOwner {
                scope: scope.to_string(),
            });
        };
        if l.record.generation() != generation {
            return Err(OwnershipError::StaleOwner {
                scope: scope.to_string(),
            });
        }
        if l.deadline_ms <= now {
            leases.remove(scope);
            return Err(OwnershipError::LeaseExpired {
                scope: scope.to_string(),
            });
        }
        Ok(l.deadline_ms - now)
    }

    /// Admitted work in flight.
    pub fn in_flight(&self) -> u64 {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// Whether the task is draining.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::SeqCst)
    }

    /// Drains: stops new ownership and admission, waits up to the in-flight
    /// timeout for admitted work, then releases the matching generation of
    /// every owned scope, one at a time in host id order. The whole drain,
    /// waiting and releasing, is bounded by `drain_timeout_ms` on the
    /// ownership's clock (the wait also by `drain_in_flight_timeout_ms`). A
    /// drain that times out keeps its leases (failover then waits for normal
    /// lease expiry): waiting, it keeps them all ([`DrainReport::TimedOut`]);
    /// releasing, it keeps those not yet released
    /// ([`DrainReport::ReleaseTimedOut`]). Draining is terminal: the task
    /// never takes new ownership again.
    ///
    /// The draining flag and the in-flight counter are both sequentially
    /// consistent, so either admission sees the flag or the drain sees the
    /// admitted work: no work is admitted after a drain found nothing in flight.
    pub async fn drain(&self) -> DrainReport {
        self.inner.draining.store(true, Ordering::SeqCst);
        let ms = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let started = self.inner.clock.now_ms();
        let deadline = started.saturating_add(ms(self.inner.settings.drain_timeout_ms));
        let in_flight_deadline = started
            .saturating_add(ms(self.inner.settings.drain_in_flight_timeout_ms))
            .min(deadline);
        let all_idle = until_notified(&self.inner.idle, || self.in_flight() == 0);
        if timeout_at(&self.inner.clock, in_flight_deadline, all_idle)
            .await
            .is_err()
        {
            let in_flight = self.in_flight();
            if in_flight != 0 {
                tracing::warn!(
                    event = "durability.ownership.drain_timed_out",
                    in_flight,
                    "drain timed out, keeping leases"
                );
                return DrainReport::TimedOut { in_flight };
            }
        }
        let mut owned: Vec<(OwnerScope, LocalLease)> = self.leases().drain().collect();
        owned.sort_by(|a, b| a.0.host_id().cmp(b.0.host_id()));
        let mut released = Vec::new();
        let mut not_released = Vec::new();
        let mut owned = owned.into_iter();
        while let Some((scope, l)) = owned.next() {
            match timeout_at(
                &self.inner.clock,
                deadline,
                self.inner.store.release(&l.record),
            )
            .await
            {
                Ok(Ok(true)) => released.push((scope, l.record.generation())),
                Ok(Ok(false)) => not_released.push(scope),
                Ok(Err(e)) => {
                    scope_failed(
                        "durability.ownership.release_failed",
                        &scope,
                        &e,
                        "releasing the owner lease failed",
                    );
                    not_released.push(scope);
                }
                Err(_) => {
                    let rest: Vec<(OwnerScope, LocalLease)> = owned.collect();
                    let kept: Vec<OwnerScope> = rest.iter().map(|(s, _)| s.clone()).collect();
                    {
                        // Kept leases stay this task's (for a later drain and
                        // the probe); the task is draining, so nothing is
                        // admitted on them.
                        let mut leases = self.leases();
                        for (s, kept_lease) in std::iter::once((scope.clone(), l)).chain(rest) {
                            leases.entry(s).or_insert(kept_lease);
                        }
                    }
                    tracing::warn!(
                        event = "durability.ownership.drain_release_timed_out",
                        released = released.len(),
                        in_doubt = %scope,
                        kept = kept.len(),
                        "drain timed out while releasing, keeping the leases not yet released"
                    );
                    return DrainReport::ReleaseTimedOut {
                        released,
                        not_released,
                        in_doubt: vec![scope],
                        kept,
                    };
                }
            }
        }
        tracing::info!(
            event = "durability.ownership.drained",
            released = released.len(),
            "drained"
        );
        DrainReport::Drained {
            released,
            not_released,
        }
    }

    /// Watches running work on `scope` at `generation`: wakes the guard
    /// interval before the lease deadline, renews, and when renewal fails or
    /// ownership moved forgets the scope and cancels `token`. Returns
    /// [`WatchExit::Finished`] once the caller cancels `token` itself.
    pub async fn watch(
        &self,
        scope: &OwnerScope,
        generation: Generation,
        token: CancellationToken,
    ) -> WatchExit {
        loop {
            let deadline = {
                let leases = self.leases();
                match leases.get(scope) {
                    Some(l) if l.record.generation() == generation => Some(l.deadline_ms),
                    _ => None,
                }
            };
            let Some(deadline) = deadline else {
                return self.lost(
                    scope,
                    &token,
                    OwnershipError::StaleOwner {
                        scope: scope.to_string(),
                    },
                );
            };
            let wake = i64::try_from(deadline.saturating_sub(self.guard_ms())).unwrap_or(i64::MAX);
            if timeout_at(&self.inner.clock, wake, token.cancelled())
                .await
                .is_ok()
            {
                return WatchExit::Finished;
            }
            match self.renew(scope).await {
                Ok(g) if g == generation => {}
                Ok(_) => {
                    return self.lost(
                        scope,
                        &token,
                        OwnershipError::StaleOwner {
                            scope: scope.to_string(),
                        },
                    );
                }
                Err(e) => return self.lost(scope, &token, e),
            }
        }
    }

    fn lost(
        &self,
        scope: &OwnerScope,
        token: &CancellationToken,
        cause: OwnershipError,
    ) -> WatchExit {
        self.forget(scope);
        token.cancel();
        scope_failed(
            "durability.ownership.watchdog_cancelled",
            scope,
            &cause,
            "ownership lost; cancelling in-flight work",
        );
        WatchExit::Lost(cause)
    }

    /// This task's owned scopes, generations and local lease budgets.
    pub fn probe(&self) -> Probe {
        let now = self.inner.clock.now_ms_u64();
        let mut scopes: Vec<ProbeScope> = self
            .leases()
            .iter()
            .map(|(s, l)| ProbeScope {
                scope: s.to_string(),
                generation: l.record.generation().get(),
                lease_remaining_ms: l.deadline_ms.saturating_sub(now),
            })
            .collect();
        scopes.sort_by(|a, b| a.scope.cmp(&b.scope));
        Probe {
            task: self.inner.task.as_str().to_owned(),
            draining: self.is_draining(),
            in_flight: self.in_flight(),
            scopes,
        }
    }
}

/// Waits until `done` holds, checking it again on each notification of
/// `notify` (registered before the check, so a notification between the
/// check and the wait is not lost).
async fn until_notified(notify: &Notify, done: impl Fn() -> bool) {
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if done() {
            return;
        }
        notified.await;
    }
}

/// Logs a failed step on `scope` at warn level: the one shape of the
/// ownership's failure events (`event`, `scope`, the error's `code`).
fn scope_failed(event: &'static str, scope: &OwnerScope, e: &OwnershipError, message: &str) {
    tracing::warn!(
        event,
        scope = %scope,
        code = e.code(),
        error = %e,
        "{message}"
    );
}

mod incarnation;

#[cfg(test)]
mod tests;
