//! Durable per-object alarms with at-least-once delivery.
//!
//! Three parts:
//!
//! - **Object side** ([`Alarms`]): `set_alarm` / `get_alarm` /
//!   `delete_alarm` keep the object's one alarm row (with a row token) in
//!   the object's own storage ([`AlarmTx`]) and flush the matching job
//!   mutation to the backend index after the local commit, in API order.
//!   Inside [`Alarms::transaction`] the effect is coalesced and flushed once
//!   after commit. A pending delete fences its row so a stale delivery can
//!   never run a deleted alarm. Failures are typed with stable codes:
//!   `do_alarm_backend_unavailable`, `do_alarm_backend_failed`,
//!   `do_alarm_result_unknown`.
//! - **Backend index** ([`AlarmIndex`]): one job per object with due /
//!   ready / running state, run tokens and claim leases. Implementations:
//!   [`MemoryAlarmIndex`] here, `SqliteAlarmIndex` in
//!   `durability-storage-sqlite`, `RedisAlarmIndex` in
//!   `durability-storage-redis`.
//! - **Dispatcher** ([`Dispatcher`]): promotes due jobs in batches, claims
//!   ready ones in batches, runs up to `concurrency` deliveries through
//!   [`Dispatch`] at once (one per object) and settles by outcome (success,
//!   never started, owner elsewhere, definite failure with backoff and
//!   jitter up to `max_tries`, unknown outcome held until lease expiry),
//!   counting `do_alarm_dispatches` by outcome ([`DispatchCounters`]);
//!   [`Dispatcher::stop`] drains it, releasing what it will not finish.
//!
//! - **Scheduler bridge** ([`SchedulerAlarm`]): backs the scheduler's one
//!   alarm with this crate, so outbox and topology work resumes on whichever
//!   host owns the object after a crash. An owner opening the object
//!   re-asserts a pending alarm row's job ([`Alarms::repair`]), so a row
//!   whose flush failed on an earlier owner is scheduled again.
//!
//! - **Operator views** ([`listing`]): a page of jobs by object-id prefix
//!   and the job counts of any [`AlarmIndex`], as `Serialize` reports.
//!
//! This crate holds logic only: no SQL and no network client.
//!
//! # Example
//!
//! The object side on the in-memory storage of the `conformance` feature
//! and [`MemoryAlarmIndex`] (production uses SQLite object storage and the
//! SQLite or Redis index): setting the alarm commits the row locally, then
//! writes the job to the index; deleting it removes both.
//!
//! ```
//! use std::sync::Arc;
//! use durability_alarms::conformance::memory_storage;
//! use durability_alarms::{AlarmIndex, Alarms, MemoryAlarmIndex};
//! use durability_scheduler::{ObjectContext, ObjectId, Scheduler};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let id = ObjectId::new("shop-1")?;
//! let scheduler = Scheduler::new(ObjectContext::new(id.clone(), Arc::new(memory_storage())))?;
//! let index = Arc::new(MemoryAlarmIndex::new());
//! let alarms = Alarms::new(&scheduler, index.clone())?;
//!
//! alarms.set_alarm(1_800_000_000_000).await?;
//! assert_eq!(alarms.get_alarm().await?, Some(1_800_000_000_000));
//! assert_eq!(index.job(&id).await?.map(|job| job.due_at), Some(1_800_000_000_000));
//!
//! alarms.delete_alarm().await?;
//! assert_eq!(alarms.get_alarm().await?, None);
//! assert!(index.job(&id).await?.is_none());
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! - `conformance`: the `conformance` module (the [`AlarmIndex`] and
//!   [`AlarmTx`] suites every backend runs) and the [`AlarmTx`]
//!   implementation on the scheduler's in-memory test storage.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

mod bridge;
mod dispatcher;
mod error;
mod index;
pub mod listing;
mod log_limit;
mod memory;
mod object;
#[cfg(feature = "ownership")]
mod owner_routed;
mod policy;
mod store;
mod token;
mod wire;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

/// The capability name the alarm row's schema is registered under.
pub const SCHEMA: &str = "alarms";

pub use bridge::{DEFAULT_SCHEDULER_IDLE_MS, SchedulerAlarm};
pub use dispatcher::{
    Delivery, Dispatch, DispatchCounters, DispatchCounts, DispatchOutcome, Dispatcher, TickReport,
};
pub use error::{AlarmError, BoxError};
pub use index::{
    AlarmIndex, Claim, ClaimReady, IndexCounts, JobPage, JobPageRequest, JobState, JobView,
    RetryJob, validate_page_limit,
};
pub use memory::MemoryAlarmIndex;
pub use object::{AlarmHandler, AlarmTxn, Alarms, Fired};
#[cfg(feature = "ownership")]
pub use owner_routed::{Forward, OwnerRouted, RemoteOwner, ScopeOf};
pub use policy::{
    DEFAULT_CLAIM_LEASE_MS, DEFAULT_CONCURRENCY, DEFAULT_DISPATCH_TIMEOUT_MS,
    DEFAULT_LOG_INTERVAL_MS, DEFAULT_MAX_TRIES, DEFAULT_OWNER_WAIT_MAX_MS, DEFAULT_PROMOTE_BATCH,
    DEFAULT_RETRY_DELAY_MS, DEFAULT_RETRY_JITTER, DEFAULT_RETRY_MAX_DELAY_MS,
    DEFAULT_STOP_GRACE_MS, DispatcherConfig, ENV_CLAIM_LEASE_MS, ENV_DISPATCH_TIMEOUT_MS,
    ENV_RETRY_DELAY_MS, ENV_RETRY_JITTER, ENV_RETRY_MAX_DELAY_MS, ENV_RETRY_MAX_TRIES,
    MAX_DELAY_MS, MAX_RESPONSE_BYTES, MUTATION_DEADLINE_MS, RESPONSE_DEADLINE_MS, RetryPolicy,
    SEED_OWNER_TTL_MS,
};
pub use store::{AlarmRow, AlarmTx};
pub use token::{MAX_TOKEN_BYTES, Token, validate_time};
pub use wire::{
    DISPATCH_FAILED, DISPATCH_NOT_DUE, DISPATCH_RESULT_UNKNOWN, DISPATCH_STORAGE_GONE,
    decode_dispatch_response, encode_dispatch_outcome, read_dispatch_response,
};

/// The object ID type, re-exported so backends need no scheduler dependency.
pub use durability_scheduler::ObjectId;

#[cfg(test)]
mod tests;

pub mod docs;
