//! A semaphore held by one object: named pools of permits that shards pull.
//!
//! Seed 000 sends one kind of user here: "a shard asks a central object for
//! something it needs, such as permits or capacity: shards pull, and the
//! holder learns about them from their requests". The holder is one object
//! (its storage, its one alarm, its clock); this crate is the capability it
//! runs. Values that are accounted for in both directions (granted, used,
//! returned) live here, not in a topology state channel.
//!
//! - [`Semaphore::configure`] creates a named pool with a capacity (and a
//!   queue bound and key retention, [`PoolConfig`]) or changes it.
//! - [`Semaphore::acquire`] takes an [`Acquire`] request: pool, idempotency
//!   key, holder (the shard's name: the only way the holder learns about
//!   shards), count, lease and wait. It returns a [`Grant`] (id, count,
//!   lease deadline on the holder's clock) or queues the request in FIFO
//!   order until its wait passes. A retry with the same key returns the
//!   same grant, the queued position, or how the request finished: it never
//!   grants twice. The same key with other parameters is
//!   [`SemaphoreError::KeyConflict`].
//! - [`Semaphore::renew`] extends a grant's lease by its `lease_ms` from
//!   now; [`Semaphore::used`] reports how many permits of a grant were
//!   used so far (a total, so a retried report counts once);
//!   [`Semaphore::release`] returns a grant's permits (or withdraws a
//!   queued request) and grants the queue's head.
//! - A grant that is not renewed returns to the pool at its lease deadline:
//!   the semaphore keeps its earliest due time (leases, queue deadlines,
//!   forgotten keys) as the object's alarm through the scheduler, and the
//!   alarm settles every due pool ([`Semaphore::run_due`]). Every call also
//!   settles its pool first, so a lapsed lease is over even before the
//!   alarm runs.
//!
//! Every call runs in the caller's transaction ([`Scheduler::transaction`](durability_scheduler::Scheduler::transaction)),
//! so the holder's own rows commit with the semaphore's, and events are
//! reported only after the commit.
//!
//! # Accounting
//!
//! Each pool's row ([`PoolRow`]) keeps, exactly:
//!
//! | counter | meaning |
//! |---|---|
//! | `held` | permits in live grants now (their counts summed) |
//! | `queued` | requests waiting now |
//! | `granted` | permits ever granted |
//! | `used` | permits ever reported used ([`Semaphore::used`]); a used permit stays held until its grant ends |
//! | `released` | permits ever returned by [`Semaphore::release`] |
//! | `expired` | permits ever returned at a lease deadline |
//! | `timed_out` | requests that ever left the queue at their deadline |
//! | `cancelled` | requests that ever left the queue ungranted otherwise |
//!
//! After every commit `granted == released + expired + held`, and `held`
//! never exceeds the capacity through a new grant.
//!
//! # Corrupt rows
//!
//! A backend decodes stored rows strictly: a count, time or state out of
//! range or of the wrong type is a storage error with the code
//! `SEMAPHORE_CORRUPT`, never a misread number. The alarm isolates it: it
//! settles each due pool in a transaction of its own, and a pool that
//! fails on a corrupt request row has that row moved to the quarantine
//! ([`Semaphore::quarantine`], reported as
//! `durability.semaphore.quarantined`) and is settled again, so one bad row
//! never blocks the pool's healthy requests or the other pools. The
//! permits of a quarantined grant stay counted as held (the pool never
//! grants past its capacity on a guess) until an operator reconfigures or
//! repairs the pool. A corrupt pool row fails only that pool's calls.
//!
//! # Guarantees and limits
//!
//! - **No barging.** A request is granted on arrival only when nothing
//!   waits; the queue is granted strictly from its head: a head that does
//!   not fit holds everyone behind it until permits return or its deadline
//!   passes.
//! - **Capacity changes never revoke.** Shrinking below what is held blocks
//!   new grants until enough permits return; a queued request asking for
//!   more than the new capacity leaves the queue (`Cancelled`) when it
//!   reaches the head. Growing
//!   grants the queue's head at once.
//! - **Leases run on the holder's clock.** A shard that stops renewing
//!   loses its permits at `lease_until` (give the shard a margin for its
//!   own clock and the call's latency). The permits return when the next
//!   call or the alarm settles the pool; no grant is made past capacity in
//!   between.
//! - **Idempotency keys are remembered** for the pool's key retention
//!   (default 24 h, at most 2^31-1 ms) after their request finished; a
//!   retry later than that is a new request.
//! - **Refusals write nothing**: names of 1..=256 bytes without control
//!   characters; count 1..=capacity; capacity 1..=10^9; queue bound
//!   0..=100 000 (default 1 000); lease 1..=2^31-1 ms (default 30 s); wait
//!   0..=2^31-1 ms (default 30 s; 0 means now or never,
//!   [`SemaphoreError::NoPermits`]); the clock a safe integer.
//! - **Waiters are not woken by this crate**: a queued shard learns of its
//!   grant by retrying its key, or through the host, which wakes it on the
//!   [`EventKind::Granted`] event ([`SemaphoreConfig::on_event`]).
//! - One semaphore per object; pools are rows, read a page at a time:
//!   a call costs a few indexed reads plus one row per request it settles.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use durability_scheduler::{ManualClock, ObjectContext, ObjectId, Scheduler};
//! use durability_semaphore::conformance::memory_storage;
//! use durability_semaphore::{Acquire, Acquired, PoolConfig, Semaphore, SemaphoreConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new(1_000);
//! let ctx = ObjectContext::with_clock(
//!     ObjectId::new("limits")?,
//!     Arc::new(memory_storage()),
//!     Arc::new(clock.clone()),
//! );
//! let scheduler = Scheduler::new(ctx)?;
//! let sem = Semaphore::attach(&scheduler, SemaphoreConfig::default())?;
//! scheduler.transaction(|tx| sem.configure(tx, "sink", PoolConfig::new(1)))?;
//!
//! let first = Acquire::new("sink", "job-1", "shard-a", 1).lease_ms(10_000);
//! let Acquired::Granted(grant) = scheduler.transaction(|tx| sem.acquire(tx, &first))? else {
//!     unreachable!("the pool is free");
//! };
//! assert_eq!(grant.lease_until, 11_000);
//!
//! let second = Acquire::new("sink", "job-2", "shard-b", 1);
//! let queued = scheduler.transaction(|tx| sem.acquire(tx, &second))?;
//! assert!(matches!(queued, Acquired::Queued { position: 1, .. }));
//!
//! scheduler.transaction(|tx| sem.release(tx, "shard-a", grant.id))?;
//! let retried = scheduler.transaction(|tx| sem.acquire(tx, &second))?;
//! assert!(matches!(retried, Acquired::Granted(_)), "the head was granted on release");
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! - `conformance`: the `conformance` module, the suite every
//!   [`SemaphoreTx`] backend runs, and the in-memory implementation on the
//!   scheduler's testkit storage.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

pub mod decide;
mod error;
mod event;
mod semaphore;
mod store;

#[cfg(any(test, feature = "conformance"))]
mod memory;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use decide::{
    Acquire, DEFAULT_KEY_RETENTION_MS, DEFAULT_LEASE_MS, DEFAULT_MAX_QUEUE, DEFAULT_WAIT_MS,
    MAX_CAPACITY, MAX_KEY_RETENTION_MS, MAX_LEASE_MS, MAX_NAME_BYTES, MAX_QUEUE, MAX_WAIT_MS,
    PoolConfig,
};
pub use error::SemaphoreError;
pub use event::{EventHook, EventKind, SemaphoreEvent};
pub use semaphore::{Acquired, Grant, Released, SCHEMA, SCHEMA_STEPS, Semaphore, SemaphoreConfig};
pub use store::{CorruptRequest, Outcome, PoolRow, RequestRow, RequestState, SemaphoreTx};

#[cfg(test)]
mod tests;
