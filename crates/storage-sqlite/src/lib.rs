//! rusqlite implementations of the durability storage traits.
//!
//! SQLite is the embedded default backend. Every table this crate creates is
//! prefixed `durability_`. Feature flags select which capability's traits are
//! implemented (`default` enables all of them):
//!
//! Every file is opened through [`open_connection`] (WAL, `synchronous`,
//! busy timeout as parameters).
//!
//! - `scheduler`: [`SqliteStorage`], the object storage of
//!   `durability-scheduler` (synchronous transactions, the one alarm, schema
//!   migrations), and the `inspect` module: a read-only view of an object
//!   database's scheduler rows for operators.
//! - `outbox`: the outbox store of `durability-outbox` on [`SqliteTx`].
//! - `ownership`: the `ownership` module, the owner lease store and the object storage
//!   fence of `durability-ownership`.
//! - `migration`: the `migration` module (SQLite shards and the mapping store
//!   of `durability-migration`) and the `ledger` module (its allocation
//!   ledger).
//! - `topology`: the `topology` module, the coordinator's tables
//!   (`TopologyTx`) and the key-value publication store of `durability-topology`.
//! - `alarms`: the `alarms` module, the object-side alarm rows and the
//!   embedded alarm job index of `durability-alarms`.
//! - `semaphore`: the semaphore store of `durability-semaphore` (pools,
//!   requests, the id counter) on [`SqliteTx`].
//!
//! Every database here is for processes on ONE machine (WAL needs shared
//! memory and locks a network file system does not give across machines):
//! [`local_fs`] tells a local path from one on a network file system, and
//! the host refuses an object root on one at start.
//!
//! # Example
//!
//! An object on an in-memory database (`SqliteStorage::open(path, ..)` for a
//! file): the application's own rows and the scheduler's due time commit in
//! one SQLite transaction, and a failed closure rolls both back.
//!
//! ```
//! use std::sync::Arc;
//! use durability_scheduler::{ObjectContext, ObjectId, Scheduler, StorageError};
//! use durability_storage_sqlite::SqliteStorage;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let storage = Arc::new(SqliteStorage::open_in_memory()?);
//! let scheduler = Scheduler::new(ObjectContext::new(ObjectId::new("shop-1")?, storage))?;
//! let sql = |e| StorageError::backend("sql", e);
//! scheduler.transaction(|tx| {
//!     tx.sql().execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)").map_err(sql)?;
//!     tx.sql().execute("INSERT INTO orders (id) VALUES (7)", []).map_err(sql)?;
//!     tx.set_due("reports", Some(60_000))
//! })?;
//! assert_eq!(scheduler.alarm_at(), Some(60_000));
//!
//! let failed = scheduler.transaction(|tx| {
//!     tx.sql().execute("INSERT INTO orders (id) VALUES (8)", []).map_err(sql)?;
//!     tx.set_due("reports", Some(1_000))?;
//!     Err::<(), _>(StorageError::corrupt("the application gave up"))
//! });
//! assert!(failed.is_err());
//! let count: i64 = scheduler.transaction(|tx| {
//!     tx.sql().query_row("SELECT count(*) FROM orders", [], |r| r.get(0)).map_err(sql)
//! })?;
//! assert_eq!(count, 1, "the failed transaction's row was rolled back");
//! assert_eq!(scheduler.alarm_at(), Some(60_000), "and so was its alarm move");
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

/// The SQLite binding this crate is built on: [`SqliteTx::sql`] hands out a
/// [`rusqlite::Connection`], so applications use the same version.
pub use rusqlite;

pub mod connection;
pub mod local_fs;
pub use connection::{ConnectionOptions, Synchronous, open_connection};

#[cfg(feature = "scheduler")]
mod idempotency;
#[cfg(feature = "scheduler")]
pub mod image;
#[cfg(feature = "scheduler")]
mod object;
#[cfg(feature = "scheduler")]
pub use idempotency::IDEMPOTENCY_TABLE;
#[cfg(feature = "scheduler")]
pub use object::{DEFAULT_BUSY_TIMEOUT, SqliteOptions, SqliteSchemaStep, SqliteStorage, SqliteTx};

#[cfg(feature = "scheduler")]
pub mod inspect;

#[cfg(feature = "outbox")]
mod outbox;

#[cfg(feature = "ownership")]
pub mod ownership;

#[cfg(feature = "migration")]
pub mod migration;

#[cfg(feature = "migration")]
pub mod ledger;

#[cfg(feature = "topology")]
pub mod topology;

#[cfg(feature = "alarms")]
pub mod alarms;

pub mod docs;
#[cfg(feature = "semaphore")]
mod semaphore;
