//! The object context every object-local capability runs in.
//!
//! A Durable Object gives its code an ID, a transactional storage, one alarm
//! and `waitUntil`. This crate is that context for Rust:
//!
//! - [`ObjectId`] and [`ObjectContext`]: the object's identity, its
//!   [`Storage`] and its [`Clock`].
//! - [`Storage`]: synchronous transactions (a closure that commits on `Ok`
//!   and rolls back on `Err`). Each capability crate defines the narrow
//!   transaction trait it needs and a backend implements all of them on one
//!   transaction type, so one commit covers every capability's rows.
//! - [`Scheduler`]: capabilities attach under unique names; each records its
//!   earliest due time with [`Transaction::set_due`] inside its transaction,
//!   and the object's one alarm is kept, in that same transaction, at the
//!   earliest due time over all of them. [`Scheduler::alarm`] runs every due
//!   capability.
//! - [`Transaction`]: the handle [`Scheduler::transaction`] gives its
//!   closure. It dereferences to the backend transaction and owns the alarm
//!   move and the after-commit callbacks of that one transaction, published
//!   only when it commits.
//! - Time comes from `durability-time` ([`Clock`], [`SystemClock`],
//!   [`ManualClock`], [`MAX_SAFE_INTEGER`]), re-exported here because the
//!   context's signatures use it.
//! - [`Driver`]: an in-process tokio task that sleeps until the stored alarm
//!   and fires it; started again after a restart, it re-arms from storage.
//! - [`ObjectReport`]: a read-only view of an object's scheduler rows
//!   (schema versions, due times, the alarm) for operators.
//! - [`migrate`]: versioned schema migrations per capability, forward and
//!   back to a named version, applied in one transaction.
//!
//! # Example
//!
//! One capability on the in-memory testkit storage (any [`Storage`]
//! backend works the same way), its due time set in a transaction and run
//! by the alarm once the clock reaches it:
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use durability_scheduler::testkit::MemoryStorage;
//! use durability_scheduler::{Capability, ManualClock, ObjectContext, ObjectId, Scheduler};
//! use futures::future::BoxFuture;
//!
//! struct Reports(AtomicU32);
//! impl Capability for Reports {
//!     fn run(&self, _now_ms: i64) -> BoxFuture<'_, ()> {
//!         self.0.fetch_add(1, Ordering::SeqCst);
//!         Box::pin(async {})
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new(1_000);
//! let id = ObjectId::new("shop-1")?;
//! let ctx = ObjectContext::with_clock(id, Arc::new(MemoryStorage::new()), Arc::new(clock.clone()));
//! let scheduler = Scheduler::new(ctx)?;
//! let reports = Arc::new(Reports(AtomicU32::new(0)));
//! scheduler.attach("reports", None, reports.clone())?;
//!
//! scheduler.transaction(|tx| tx.set_due("reports", Some(61_000)))?;
//! assert_eq!(scheduler.alarm_at(), Some(61_000)); // the one alarm moved with the commit
//!
//! scheduler.alarm().await?; // not due yet: nothing runs
//! assert_eq!(reports.0.load(Ordering::SeqCst), 0);
//! clock.advance(60_000);
//! scheduler.alarm().await?;
//! assert_eq!(reports.0.load(Ordering::SeqCst), 1);
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! - `conformance`: the `conformance` module (the suite for backends, run with
//!   [`scheduler_conformance!`]) and the `testkit` module it re-exports: an
//!   in-memory storage and a crash-injecting storage wrapper.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

mod driver;
mod error;
pub mod image;
mod inspect;
pub mod permits;
mod scheduler;
mod schema;
mod storage;

#[cfg(any(test, feature = "conformance"))]
pub mod testkit;
#[cfg(any(test, feature = "conformance"))]
pub use testkit::conformance;

pub use driver::{DEFAULT_IDLE_RETRY, Driver};
pub use durability_time::{Clock, MAX_SAFE_INTEGER, ManualClock, SystemClock};
pub use error::SchedulerError;
pub use inspect::{CapabilityReport, ObjectReport};
pub use permits::{Permit, PermitError, Permits};
pub use scheduler::{
    Capability, MAX_CAPABILITY_NAME_BYTES, MAX_OBJECT_ID_BYTES, ObjectContext, ObjectId, Scheduler,
    Transaction,
};
pub use schema::{SchemaTarget, check_schema_steps, migrate, migrate_within};
pub use storage::{Direction, SchedulerTx, SchemaStep, Storage, StorageError, StorageErrorKind};

#[cfg(test)]
mod tests;

pub mod docs;
