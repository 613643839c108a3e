//! The lease store traits that backends implement.
//!
//! Every method is one atomic step on the store, and lease expiry is decided
//! by the store's own clock (Redis `TIME`; the injected clock on SQLite),
//! never by the caller's.

use std::future::Future;

use crate::error::OwnershipError;
use crate::record::{Generation, OwnerEndpoint, OwnerRecord};
use crate::scope::{ClassName, LifecycleId, OwnerScope, ShardCount, StorageId, TaskId};

/// A lease as the store reported it.
///
/// The lease runs on the store's clock; the store reports how much of it was
/// left when it answered, never an absolute time from the caller's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The owner record (exact bytes included).
    pub record: OwnerRecord,
    /// Lease time left on the store's clock when the store answered, in milliseconds.
    pub remaining_ms: u64,
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The scope was free or expired: the generation was bumped and this
    /// task's record written with its lease.
    Claimed(Lease),
    /// A live owner holds the scope (possibly this task).
    Held(Lease),
}

/// A lock taken by whole-worker or version deletion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteLock {
    /// Whole-worker delete: rejects ownership.
    Whole,
    /// Deleting an inactive version: does not interrupt the active storage.
    Version,
}

impl DeleteLock {
    /// The stored value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Whole => "whole",
            Self::Version => "version",
        }
    }

    /// Parses a stored value.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidLifecycleState`] for anything but `whole` or `version`.
    pub fn parse(raw: &[u8], lifecycle: &LifecycleId) -> Result<Self, OwnershipError> {
        match raw {
            b"whole" => Ok(Self::Whole),
            b"version" => Ok(Self::Version),
            _ => Err(OwnershipError::InvalidLifecycleState {
                lifecycle: lifecycle.as_str().to_owned(),
                reason: "unknown delete lock kind".to_owned(),
            }),
        }
    }
}

/// One consistent read of everything an owner-side assertion needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerSnapshot {
    /// The store's clock, in milliseconds.
    pub store_now_ms: u64,
    /// The live owner lease, if any.
    pub owner: Option<Lease>,
    /// The generation counter (0 before the first claim).
    pub generation: u64,
    /// The active storage pointer of the lifecycle.
    pub active_storage: Option<StorageId>,
    /// The delete lock on the lifecycle.
    pub delete_lock: Option<DeleteLock>,
    /// The shard count recorded for the scope's storage id (`None` until
    /// the first claim or [`LeaseStore::record_shard_count`] under it
    /// records one).
    pub shard_count: Option<ShardCount>,
}

/// The hosts of one class of one storage id, as presence records group
/// them (see [`crate::balance`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PresenceGroup {
    storage: StorageId,
    class: ClassName,
}

impl PresenceGroup {
    /// The group of `class` under `storage`.
    pub fn new(storage: StorageId, class: ClassName) -> Self {
        Self { storage, class }
    }

    /// The group of a scope's storage id and class.
    pub fn of(scope: &OwnerScope) -> Self {
        Self::new(scope.storage_id().clone(), scope.class().clone())
    }

    /// The storage id.
    pub fn storage_id(&self) -> &StorageId {
        &self.storage
    }

    /// The class.
    pub fn class(&self) -> &ClassName {
        &self.class
    }

    /// The key stores file the group's records under: `<storage id>:<class>`.
    pub fn key(&self) -> String {
        format!("{}:{}", self.storage.as_str(), self.class.as_str())
    }
}

/// A live presence record as the store reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceEntry {
    /// The announcing task.
    pub task: TaskId,
    /// The value it announced (see [`crate::balance::encode_presence`]).
    pub value: Vec<u8>,
    /// Time left on the store's clock when it answered, in milliseconds.
    pub remaining_ms: u64,
}

impl PresenceEntry {
    /// A stored record as a store read it: `None` when `task` is not a
    /// valid task id (skipped, never hiding the valid ones).
    pub fn stored(task: &str, value: Vec<u8>, remaining_ms: u64) -> Option<Self> {
        Some(Self {
            task: TaskId::new(task).ok()?,
            value,
            remaining_ms,
        })
    }
}

/// Validates a presence value and TTL before a store writes them.
///
/// # Errors
/// [`OwnershipError::InvalidInput`] for a TTL outside 1..=2^53-1 ms or a
/// value over [`crate::balance::MAX_PRESENCE_BYTES`].
pub fn validate_presence(value: &[u8], ttl_ms: u64) -> Result<(), OwnershipError> {
    validate_ttl(ttl_ms)?;
    if value.len() > crate::balance::MAX_PRESENCE_BYTES {
        return Err(OwnershipError::invalid(
            "presence record",
            format!(
                "{} bytes over {}",
                value.len(),
                crate::balance::MAX_PRESENCE_BYTES
            ),
        ));
    }
    Ok(())
}

/// A presence record to write, checked by [`Presence::new`]
/// ([`validate_presence`]): what [`LeaseStore::write_presence`] stores.
#[derive(Debug, Clone, Copy)]
pub struct Presence<'a> {
    group: &'a PresenceGroup,
    task: &'a TaskId,
    value: &'a [u8],
    ttl_ms: u64,
}

impl<'a> Presence<'a> {
    /// `task`'s record in `group` with `value` and a lease of `ttl_ms`.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidInput`] ([`validate_presence`]).
    pub fn new(
        group: &'a PresenceGroup,
        task: &'a TaskId,
        value: &'a [u8],
        ttl_ms: u64,
    ) -> Result<Self, OwnershipError> {
        validate_presence(value, ttl_ms)?;
        Ok(Self {
            group,
            task,
            value,
            ttl_ms,
        })
    }

    /// The group.
    pub fn group(&self) -> &'a PresenceGroup {
        self.group
    }

    /// The announcing task.
    pub fn task(&self) -> &'a TaskId {
        self.task
    }

    /// The value (at most [`crate::balance::MAX_PRESENCE_BYTES`]).
    pub fn value(&self) -> &'a [u8] {
        self.value
    }

    /// The lease length in milliseconds (1..=2^53-1).
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }
}

/// The default of the batched store calls: `one` on every item, one after
/// the other, its results in the items' order.
async fn each_in_order<'a, T, R, Fut>(items: &'a [T], mut one: impl FnMut(&'a T) -> Fut) -> Vec<R>
where
    Fut: Future<Output = R>,
{
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        out.push(one(item).await);
    }
    out
}

fn no_presence<T>() -> Result<T, OwnershipError> {
    Err(OwnershipError::StoreUnavailable {
        source: "this lease store keeps no presence records".into(),
    })
}

/// Who claims a scope ([`LeaseStore::claim_as`], [`LeaseStore::claim_many`]):
/// the lifecycle whose active storage pointer must name the scope's storage
/// id, the claiming task, the endpoint its record advertises (if any) and
/// the lease length on the store's clock.
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    /// The lifecycle checked (storage pointer and delete lock).
    pub lifecycle: &'a LifecycleId,
    /// The task whose record is written.
    pub task: &'a TaskId,
    /// The endpoint the record advertises.
    pub endpoint: Option<&'a OwnerEndpoint>,
    /// The lease length in milliseconds ([`validate_ttl`]).
    pub ttl_ms: u64,
}

impl<'a> Claimant<'a> {
    /// `task` claiming in `lifecycle` for `ttl_ms`, advertising no endpoint.
    pub const fn new(lifecycle: &'a LifecycleId, task: &'a TaskId, ttl_ms: u64) -> Self {
        Self {
            lifecycle,
            task,
            endpoint: None,
            ttl_ms,
        }
    }

    /// The same claimant advertising `endpoint` in its record.
    #[must_use]
    pub const fn with_endpoint(self, endpoint: Option<&'a OwnerEndpoint>) -> Self {
        Self { endpoint, ..self }
    }

    /// The record this claimant writes for `scope` at `generation`.
    pub fn record(&self, scope: &OwnerScope, generation: Generation) -> OwnerRecord {
        OwnerRecord::with_endpoint(
            scope.clone(),
            self.lifecycle.clone(),
            self.task.clone(),
            self.endpoint.cloned(),
            generation,
        )
    }
}

/// Where owner leases live.
pub trait LeaseStore: Send + Sync + 'static {
    /// Atomically: check that the claimant's lifecycle's active storage
    /// pointer names the scope's storage id and that no whole-delete lock is
    /// held; if a live owner exists return it; otherwise bump the generation
    /// and write the claimant's record ([`Claimant::record`]) with a lease
    /// of its `ttl_ms` on the store's clock.
    ///
    /// # Errors
    /// [`OwnershipError::StorageInactive`], [`OwnershipError::DeleteLocked`],
    /// [`OwnershipError::InvalidOwnerRecord`] (the held record is invalid: fail
    /// closed), [`OwnershipError::OwnerRace`], or a store error.
    fn claim_as(
        &self,
        scope: &OwnerScope,
        claimant: Claimant<'_>,
    ) -> impl Future<Output = Result<ClaimOutcome, OwnershipError>> + Send;

    /// [`LeaseStore::claim_as`] with a record that advertises no endpoint.
    ///
    /// # Errors
    /// As [`LeaseStore::claim_as`].
    fn claim(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
        task: &TaskId,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<ClaimOutcome, OwnershipError>> + Send {
        async move {
            self.claim_as(scope, Claimant::new(lifecycle, task, ttl_ms))
                .await
        }
    }

    /// Atomically compares the exact owner record and the active storage
    /// pointer (and the delete lock), then refreshes the lease to `ttl_ms`.
    ///
    /// # Errors
    /// [`OwnershipError::StaleOwner`] when the record differs or is gone,
    /// [`OwnershipError::StorageInactive`], [`OwnershipError::DeleteLocked`],
    /// or a store error.
    fn renew(
        &self,
        record: &OwnerRecord,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Lease, OwnershipError>> + Send;

    /// Claims every scope of `scopes` as [`LeaseStore::claim_as`] claims one,
    /// with one result per scope in the same order, each what `claim_as`
    /// alone would answer (a scope named twice is claimed once and then
    /// held). One scope's refusal never fails another. A backend batches
    /// them (PostgreSQL: one statement, one round trip); the default calls
    /// `claim_as` once per scope.
    fn claim_many(
        &self,
        scopes: &[OwnerScope],
        claimant: Claimant<'_>,
    ) -> impl Future<Output = Vec<Result<ClaimOutcome, OwnershipError>>> + Send {
        each_in_order(scopes, move |scope| self.claim_as(scope, claimant))
    }

    /// Writes `task`'s presence record in `group` with `value` and a lease
    /// of `ttl_ms` on the store's clock (replacing its earlier one): one
    /// atomic step. The unexpired records are the live hosts of the group
    /// ([`LeaseStore::live_tasks`]).
    ///
    /// Checks the record ([`Presence::new`]) and writes it with
    /// [`LeaseStore::write_presence`]; a store implements that one.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidInput`] ([`validate_presence`], nothing
    /// written), or a store error.
    fn announce(
        &self,
        group: &PresenceGroup,
        task: &TaskId,
        value: &[u8],
        ttl_ms: u64,
    ) -> impl Future<Output = Result<(), OwnershipError>> + Send {
        async move {
            let presence = Presence::new(group, task, value, ttl_ms)?;
            self.write_presence(presence).await
        }
    }

    /// The store's write of a checked presence record
    /// ([`LeaseStore::announce`]): one atomic step.
    ///
    /// The default refuses (a store without presence records: the host
    /// then claims free shards without balancing).
    ///
    /// # Errors
    /// A store error.
    fn write_presence(
        &self,
        presence: Presence<'_>,
    ) -> impl Future<Output = Result<(), OwnershipError>> + Send {
        let _ = presence;
        async { no_presence() }
    }

    /// Removes `task`'s presence record in `group` (a draining host);
    /// returns whether one was there, live or not.
    ///
    /// # Errors
    /// A store error (the default refuses, as for [`LeaseStore::announce`]).
    fn withdraw(
        &self,
        group: &PresenceGroup,
        task: &TaskId,
    ) -> impl Future<Output = Result<bool, OwnershipError>> + Send {
        let _ = (group, task);
        async { no_presence() }
    }

    /// The unexpired presence records of `group` on the store's clock,
    /// sorted by task id. A record whose task id is not valid is skipped
    /// (it never hides the valid ones); values are returned raw.
    ///
    /// # Errors
    /// A store error (the default refuses, as for [`LeaseStore::announce`]).
    fn live_tasks(
        &self,
        group: &PresenceGroup,
    ) -> impl Future<Output = Result<Vec<PresenceEntry>, OwnershipError>> + Send {
        let _ = group;
        async { no_presence() }
    }

    /// Renews every record of `records` as [`LeaseStore::renew`] would, with
    /// one result per record in the same order, identical to what `renew`
    /// alone would answer. A backend batches them into a handful of round
    /// trips (Redis: one script call per chunk of scopes; SQLite: one
    /// transaction); each record's checks stay atomic with its refresh. The
    /// default calls `renew` once per record.
    ///
    /// A store error is reported for each record it covers; one record's
    /// failure (stale, lifecycle, malformed state) never fails another.
    fn renew_many(
        &self,
        records: &[OwnerRecord],
        ttl_ms: u64,
    ) -> impl Future<Output = Vec<Result<Lease, OwnershipError>>> + Send {
        each_in_order(records, move |record| self.renew(record, ttl_ms))
    }

    /// Deletes the owner record if it is exactly `record`; the generation
    /// counter stays. Returns whether it was deleted.
    ///
    /// # Errors
    /// A store error.
    fn release(
        &self,
        record: &OwnerRecord,
    ) -> impl Future<Output = Result<bool, OwnershipError>> + Send;

    /// Reads owner, generation, lifecycle state and the store clock in one snapshot.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidOwnerRecord`] or
    /// [`OwnershipError::InvalidLifecycleState`] for invalid state, or a store error.
    fn snapshot(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> impl Future<Output = Result<OwnerSnapshot, OwnershipError>> + Send;

    /// Atomically: checks `lifecycle` as a claim of `scope` would (its
    /// active storage pointer names the scope's storage id, no whole-delete
    /// lock) and its recorded shard count, and records the scope's count
    /// when none is recorded yet. Writes nothing else.
    ///
    /// A host calls it once at start, before its first claim, with any
    /// scope built under its configured count: a host configured with
    /// another count than its storage id's refuses to start.
    ///
    /// # Errors
    /// [`OwnershipError::ShardCountMismatch`] (nothing written),
    /// [`OwnershipError::StorageInactive`], [`OwnershipError::DeleteLocked`],
    /// [`OwnershipError::InvalidLifecycleState`], or a store error.
    fn record_shard_count(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> impl Future<Output = Result<(), OwnershipError>> + Send;

    /// Atomically sets the generation counter of `scope` to
    /// `max(counter, floor)`: it never lowers it, and touches nothing else
    /// (the owner record and its lease stay). Returns the counter after the
    /// step, so the next claim hands out a generation above `floor`.
    ///
    /// This is how a store that lost its counters (a wiped or restarted
    /// Redis without persistence) is brought back above every generation an
    /// object fence accepted: see [`crate::fence_with_floor`].
    ///
    /// The default body refuses (nothing is written), so a store without it
    /// fails closed in the floor procedure.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidLifecycleState`] when the stored counter is
    /// invalid (nothing is written), or a store error.
    fn raise_generation_floor(
        &self,
        scope: &OwnerScope,
        floor: Generation,
    ) -> impl Future<Output = Result<u64, OwnershipError>> + Send {
        let _ = floor;
        let scope = scope.to_string();
        async move {
            Err(OwnershipError::StoreUnavailable {
                source: format!("this lease store cannot raise the generation floor of {scope}")
                    .into(),
            })
        }
    }
}

/// A shared store is a store: several `Ownership` handles (one per task in a
/// test, or a store shared with other components) can use one `Arc`.
impl<T: LeaseStore> LeaseStore for std::sync::Arc<T> {
    fn claim_as(
        &self,
        scope: &OwnerScope,
        claimant: Claimant<'_>,
    ) -> impl Future<Output = Result<ClaimOutcome, OwnershipError>> + Send {
        (**self).claim_as(scope, claimant)
    }

    fn renew(
        &self,
        record: &OwnerRecord,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Lease, OwnershipError>> + Send {
        (**self).renew(record, ttl_ms)
    }

    fn claim_many(
        &self,
        scopes: &[OwnerScope],
        claimant: Claimant<'_>,
    ) -> impl Future<Output = Vec<Result<ClaimOutcome, OwnershipError>>> + Send {
        (**self).claim_many(scopes, claimant)
    }

    fn write_presence(
        &self,
        presence: Presence<'_>,
    ) -> impl Future<Output = Result<(), OwnershipError>> + Send {
        (**self).write_presence(presence)
    }

    fn withdraw(
        &self,
        group: &PresenceGroup,
        task: &TaskId,
    ) -> impl Future<Output = Result<bool, OwnershipError>> + Send {
        (**self).withdraw(group, task)
    }

    fn live_tasks(
        &self,
        group: &PresenceGroup,
    ) -> impl Future<Output = Result<Vec<PresenceEntry>, OwnershipError>> + Send {
        (**self).live_tasks(group)
    }

    fn renew_many(
        &self,
        records: &[OwnerRecord],
        ttl_ms: u64,
    ) -> impl Future<Output = Vec<Result<Lease, OwnershipError>>> + Send {
        (**self).renew_many(records, ttl_ms)
    }

    fn release(
        &self,
        record: &OwnerRecord,
    ) -> impl Future<Output = Result<bool, OwnershipError>> + Send {
        (**self).release(record)
    }

    fn snapshot(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> impl Future<Output = Result<OwnerSnapshot, OwnershipError>> + Send {
        (**self).snapshot(scope, lifecycle)
    }

    fn raise_generation_floor(
        &self,
        scope: &OwnerScope,
        floor: Generation,
    ) -> impl Future<Output = Result<u64, OwnershipError>> + Send {
        (**self).raise_generation_floor(scope, floor)
    }

    fn record_shard_count(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> impl Future<Output = Result<(), OwnershipError>> + Send {
        (**self).record_shard_count(scope, lifecycle)
    }
}

/// Control-plane writes of lifecycle state (the active storage pointer and the
/// delete lock). The ownership layer only reads them; control and tests write them.
pub trait LifecycleAdmin: Send + Sync + 'static {
    /// Points `lifecycle` at `storage` (or removes the pointer). Shard
    /// counts are recorded per storage id and stay.
    ///
    /// # Errors
    /// A store error.
    fn set_active_storage(
        &self,
        lifecycle: &LifecycleId,
        storage: Option<&StorageId>,
    ) -> impl Future<Output = Result<(), OwnershipError>> + Send;

    /// Sets or removes the delete lock of `lifecycle`.
    ///
    /// # Errors
    /// A store error.
    fn set_delete_lock(
        &self,
        lifecycle: &LifecycleId,
        lock: Option<DeleteLock>,
    ) -> impl Future<Output = Result<(), OwnershipError>> + Send;
}

/// Checks lifecycle state for a claim or renew of a scope under `storage`.
///
/// # Errors
/// [`OwnershipError::StorageInactive`] or [`OwnershipError::DeleteLocked`].
pub fn check_lifecycle(
    storage: &StorageId,
    lifecycle: &LifecycleId,
    active: Option<&StorageId>,
    lock: Option<DeleteLock>,
) -> Result<(), OwnershipError> {
    if lock == Some(DeleteLock::Whole) {
        return Err(OwnershipError::DeleteLocked {
            lifecycle: lifecycle.as_str().to_owned(),
        });
    }
    if active != Some(storage) {
        return Err(OwnershipError::StorageInactive {
            storage_id: storage.as_str().to_owned(),
        });
    }
    Ok(())
}

/// Checks the shard count recorded for a scope's storage id against the
/// count the scope was built under.
///
/// The count is a property of the storage id, written once: a claim that
/// writes an owner record (or [`LeaseStore::record_shard_count`]) with
/// nothing recorded records the scope's count in the same atomic step (a
/// refused or held claim writes nothing), and nothing ever changes it (a storage id is never reused after
/// deletion). Claims, renewals, the start-up check and admission compare.
/// A storage id whose hosts ran before counts were recorded has none: its
/// first claim after the upgrade records the count it runs with.
///
/// # Errors
/// [`OwnershipError::ShardCountMismatch`] when a different count is recorded.
pub fn check_shard_count(
    scope: &OwnerScope,
    recorded: Option<ShardCount>,
) -> Result<(), OwnershipError> {
    match recorded {
        Some(recorded) if recorded != scope.shard_count() => {
            Err(OwnershipError::ShardCountMismatch {
                storage_id: scope.storage_id().as_str().to_owned(),
                recorded: recorded.get(),
                requested: scope.shard_count().get(),
            })
        }
        _ => Ok(()),
    }
}

/// Decodes the stored shard count of `storage` from its text (absent: none
/// recorded).
///
/// # Errors
/// [`OwnershipError::InvalidLifecycleState`] (naming the storage id) when
/// it is not a count in 1..=1024 in canonical decimal.
pub fn parse_shard_count(
    raw: Option<&[u8]>,
    storage: &StorageId,
) -> Result<Option<ShardCount>, OwnershipError> {
    let Some(raw) = raw else { return Ok(None) };
    let n = std::str::from_utf8(raw)
        .ok()
        .filter(|s| !s.starts_with('0'))
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or(0);
    stored_shard_count(Some(n), storage)
}

/// Decodes the stored shard count of `storage` from an integer column
/// (absent: none recorded).
///
/// # Errors
/// [`OwnershipError::InvalidLifecycleState`] (naming the storage id) when
/// it is not a count in 1..=1024.
pub fn stored_shard_count(
    n: Option<i64>,
    storage: &StorageId,
) -> Result<Option<ShardCount>, OwnershipError> {
    n.map(|n| {
        u32::try_from(n)
            .ok()
            .and_then(|n| ShardCount::new(n).ok())
            .ok_or_else(|| OwnershipError::InvalidLifecycleState {
                lifecycle: storage.as_str().to_owned(),
                reason: format!("recorded shard count {n} is not in 1..=1024"),
            })
    })
    .transpose()
}

/// Validates a lease TTL given to a store (1..=2^53-1 ms). Stores call it
/// before any write.
///
/// # Errors
/// [`OwnershipError::InvalidInput`] otherwise.
pub fn validate_ttl(ttl_ms: u64) -> Result<(), OwnershipError> {
    if ttl_ms == 0 || ttl_ms > crate::scope::MAX_SAFE_INTEGER {
        return Err(OwnershipError::invalid(
            "lease ttl",
            format!("{ttl_ms} ms not in 1..=2^53-1"),
        ));
    }
    Ok(())
}

/// A batch's refusal of an out-of-range lease TTL ([`validate_ttl`]): the
/// same error once for each of its `n` items, before anything is written;
/// `None` when the TTL is valid.
pub fn ttl_refusals<T>(n: usize, ttl_ms: u64) -> Option<Vec<Result<T, OwnershipError>>> {
    validate_ttl(ttl_ms).err()?;
    Some(
        (0..n)
            .filter_map(|_| validate_ttl(ttl_ms).err())
            .map(Err)
            .collect(),
    )
}

/// Validates a generation counter value read from a store.
///
/// # Errors
/// [`OwnershipError::InvalidLifecycleState`] when not a safe integer.
pub fn parse_generation_counter(
    raw: Option<&[u8]>,
    scope: &OwnerScope,
) -> Result<u64, OwnershipError> {
    let Some(raw) = raw else { return Ok(0) };
    std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|g| Generation::new(*g).is_ok())
        .ok_or_else(|| OwnershipError::InvalidLifecycleState {
            lifecycle: scope.to_string(),
            reason: "generation counter is not a positive safe integer".to_owned(),
        })
}
