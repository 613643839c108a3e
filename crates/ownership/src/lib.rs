//! Owner leases with generation fencing.
//!
//! One task owns a class shard — an [`OwnerScope`] `<storage id>:<class>:shard<N>`
//! — at a time. A claim bumps a never-decreasing [`Generation`] and writes the
//! [`OwnerRecord`] with its lease in one atomic step on a [`LeaseStore`],
//! checking the lifecycle state (active storage pointer, whole-delete lock).
//! [`Ownership`] keeps one task's owned scopes: it resolves owners, renews
//! leases (exact record compare), admits work ([`Ownership::admit`]: one
//! owner/lifecycle snapshot per admission by default, no I/O with ample
//! budget under [`Admission::Cached`]), drains, and watches running work
//! ([`Ownership::watch`]). Backends implement [`LeaseStore`]
//! (`RedisLeaseStore` in `durability-storage-redis`, `SqliteLeaseStore` in
//! `durability-storage-sqlite`); the SQLite backend also fences commits in the
//! object's own database to one claim (generation and holder), and
//! [`fence_with_floor`] opens an object through that fence so that a lease
//! store that lost its generation counters (a wiped Redis without
//! persistence) never hands out a generation the fence already accepted.
//!
//! The shard count is a property of the storage id: the store records it
//! once (the first claim that writes, or [`LeaseStore::record_shard_count`],
//! which a host calls at start) and refuses every claim, renewal and
//! admission under another count ([`OwnershipError::ShardCountMismatch`]).
//! A task id runs in one process: [`Ownership`] adopts only records it
//! wrote, waits out another run's lease (a restart with the same task id
//! waits up to the owner TTL), and reports a live duplicate as
//! [`OwnershipError::DuplicateTaskId`] ([`Ownership::duplicate_task`]).
//! Hosts sharing a class balance its shards through the lease store alone
//! ([`balance`]: presence records via [`LeaseStore::announce`] /
//! [`LeaseStore::live_tasks`], the pure decision [`balance::decide`],
//! [`LeaseStore::claim_many`] and the graceful [`Ownership::hand_off`]).
//! See `docs/leases.md`.
//!
//! What a lease store must persist: its generation counters. A Redis lease
//! store needs AOF or RDB persistence, or every object must be opened
//! through [`fence_with_floor`]: it restores monotonicity for every object
//! opened through it; an object never opened again keeps its fence, which
//! refuses every stale writer.
//!
//! Key types: [`OwnerScope`], [`OwnerRecord`], [`LeaseStore`], [`Ownership`],
//! [`OwnerHintCache`], [`OwnershipSettings`], [`OwnershipError`], [`Clock`].
//!
//! # Example
//!
//! Two tasks on the in-memory lease store ([`memory::InMemoryLeaseStore`];
//! production uses the Redis or SQLite store): the first claims the scope,
//! the second is routed to it; once the first's lease runs out the second
//! claims a higher generation, and the first can no longer admit work
//! (`lease_expired`).
//!
//! ```
//! use std::sync::Arc;
//! use durability_ownership::memory::InMemoryLeaseStore;
//! use durability_ownership::{
//!     LifecycleAdmin, LifecycleId, ManualClock, OwnerScope, Ownership, OwnershipSettings,
//!     Resolution, ShardCount, StorageId, TaskId,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new(1_000_000);
//! let store = Arc::new(InMemoryLeaseStore::new(clock.clone(), ShardCount::default()));
//! let lifecycle = LifecycleId::new("ns:shop")?;
//! store.set_active_storage(&lifecycle, Some(&StorageId::new("st1")?)).await?;
//! let scope = OwnerScope::parse("st1:Cart:shard3", ShardCount::default())?;
//! let settings = OwnershipSettings { owner_ttl_ms: 10_000, ..OwnershipSettings::default() };
//! let a = Ownership::new(store.clone(), clock.clone(), TaskId::new("task-a")?, settings.clone());
//! let b = Ownership::new(store.clone(), clock.clone(), TaskId::new("task-b")?, settings);
//!
//! let Resolution::Local(first) = a.resolve(&scope, &lifecycle).await? else { panic!("a claims") };
//! assert!(matches!(b.resolve(&scope, &lifecycle).await?, Resolution::Remote { .. }));
//! drop(a.admit(&scope, first).await?); // admitted: a owns it at `first`
//!
//! clock.advance(10_001); // a stops renewing; its lease runs out
//! let Resolution::Local(second) = b.resolve(&scope, &lifecycle).await? else { panic!("b claims") };
//! assert!(second > first);
//! let stale = a.admit(&scope, first).await.unwrap_err();
//! assert_eq!(stale.code(), "lease_expired", "{stale}");
//! # Ok(())
//! # }
//! ```
//!
//! Feature flags:
//! - `conformance`: the `conformance` module, the suite every [`LeaseStore`] backend runs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

pub mod balance;
mod error;
mod floor;
mod hints;
pub mod listing;
mod manager;
pub mod memory;
mod metrics;
mod readopt;
mod record;
mod scope;
mod settings;
mod store;

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(any(test, feature = "conformance"))]
#[cfg_attr(not(feature = "conformance"), allow(unreachable_pub, dead_code))]
mod hooked;

/// The cancellation token [`Ownership::watch`] cancels (tokio-util's), so
/// callers need not depend on tokio-util themselves.
pub use tokio_util::sync::CancellationToken;

pub use durability_time::{Clock, ManualClock, SystemClock};
pub use error::{BoxError, DispatchOutcome, OwnershipError};
pub use floor::{
    BudgetCheck, Fenced, FloorSettings, LeaseBudget, MAX_FLOOR_ROUNDS, ObjectFence,
    fence_with_floor,
};
pub use hints::{DEFAULT_HINT_CAPACITY, OwnerHint, OwnerHintCache};
pub use manager::{
    AdmissionPermit, DrainReport, HandOff, Ownership, Probe, ProbeScope, Resolution, WatchExit,
};
pub use readopt::Readoption;
pub use record::{
    Generation, MAX_OWNER_ENDPOINT_BYTES, OwnerEndpoint, OwnerRecord, RECORD_VERSION,
    RecordTemplate,
};
pub use scope::{
    ClassName, DEFAULT_SHARD_COUNT, LifecycleId, MAX_CLASS_NAME_BYTES, MAX_HOST_ID_BYTES,
    MAX_LIFECYCLE_ID_BYTES, MAX_SAFE_INTEGER, MAX_SHARD_COUNT, MAX_STORAGE_ID_BYTES,
    MAX_TASK_ID_BYTES, ObjectName, OwnerScope, ShardCount, StorageId, TaskId, parse_shard,
    stable_hash,
};
pub use settings::{
    Admission, DEFAULT_DRAIN_IN_FLIGHT_TIMEOUT_MS, DEFAULT_DRAIN_TIMEOUT_MS,
    DEFAULT_LEASE_GUARD_MS, DEFAULT_OWNER_TTL_SECONDS, ENV_DRAIN_IN_FLIGHT_TIMEOUT_MS,
    ENV_DRAIN_TIMEOUT_MS, ENV_OWNER_LEASE_GUARD_MS, ENV_OWNER_TTL_SECONDS, MAX_OWNER_TTL_SECONDS,
    OwnershipSettings, drain_timeout_ms, owner_ttl_ms, parse_canonical_positive,
};
pub use store::{
    ClaimOutcome, Claimant, DeleteLock, Lease, LeaseStore, LifecycleAdmin, OwnerSnapshot, Presence,
    PresenceEntry, PresenceGroup, check_lifecycle, check_shard_count, parse_generation_counter,
    parse_shard_count, stored_shard_count, ttl_refusals, validate_presence, validate_ttl,
};

pub mod docs;
