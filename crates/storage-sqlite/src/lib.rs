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
//!   migrations).
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
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

/// The SQLite binding this crate is built on: [`SqliteTx::sql`] hands out a
/// [`rusqlite::Connection`], so applications use the same version.
pub use rusqlite;

pub mod connection;
pub use connection::{ConnectionOptions, Synchronous, open_connection};

#[cfg(feature = "scheduler")]
mod object;
#[cfg(feature = "scheduler")]
pub use object::{DEFAULT_BUSY_TIMEOUT, SqliteOptions, SqliteSchemaStep, SqliteStorage, SqliteTx};

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
