//! The coordinator's allocation ledger on PostgreSQL, for
//! `durability-migration`'s `Router::reconcile_allocations`.
//!
//! [`PostgresLedger`] keeps key → allocated shard rows in a
//! `durability_allocations` table (created when missing) in the database and
//! search path of a [`PostgresShard`]'s connections. Keys use `COLLATE "C"`,
//! so pages come back in byte order, as from the other ledgers. Every value
//! is a bound parameter.

use durability_migration::ShardLedger;

use crate::PostgresShard;

/// Key → allocated shard rows in a PostgreSQL table
/// (`durability_allocations`, keys in byte order): the migration crate's
/// [`ShardLedger`] on a [`PostgresShard`]. `PostgresLedger::new(shard).await`
/// creates the table when missing.
pub type PostgresLedger = ShardLedger<PostgresShard>;
