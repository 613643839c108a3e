//! Routed shards and journaled key moves on SQLite, PostgreSQL and MariaDB.
//!
//! Moves run only between shards on a proven [`Dialect`] (`Sqlite`,
//! `Postgres`, `MySql`); any other dialect routes reads, writes and raw
//! statements, and every move refuses with `MIGRATION_UNSUPPORTED_DIALECT`.
//! What is tested: SQLite (files and `:memory:`), PostgreSQL 15 and
//! MariaDB, each alone and mixed, by the conformance suites, the crash
//! harness and the model campaign. `Dialect::MySql` is the dialect MariaDB
//! speaks; MySQL proper (Oracle's server) is untested: its SQL is meant to
//! be the same, but no test has run against it.
//!
//! A [`Router`] is built from a [`MigrationConfig`]: a [`MappingStore`]
//! (key → shard), named [`Shard`]s, a hash [`Strategy`], the journal shard
//! and scope, the mapping cache TTL and the keyed tables with their key
//! columns. It routes reads and writes by key and moves keys between shards
//! through a journal on the journal shard ([`Router::reassign_shard`],
//! [`Router::reassign_keys`]), recovers interrupted moves
//! ([`Router::recover_migrations`]), verifies and repairs leftovers
//! ([`Router::verify_migrations`]), aborts a move that cannot finish
//! ([`Router::abort_operation`]), purges archives
//! ([`Router::purge_retired`]), rebalances ([`Router::rebalance`]) and
//! reconciles the coordinator's allocation ledger
//! ([`Router::reconcile_allocations`], [`AllocationLedger`]).
//!
//! With [`Placement::Computed`], a key's shard is computed from a
//! [`Manifest`] of up to [`MAX_EPOCHS`] epochs kept on the journal shard
//! ([`Router::add_epoch`], [`Router::prune_epochs`]); every data shard holds
//! a generation fence that refuses writes routed with an older manifest.
//!
//! This crate holds logic only: SQL text is generated per [`Dialect`] and
//! executed by a backend's [`Shard`] (for example `SqliteShard` in
//! `durability-storage-sqlite`). It depends on no database client.
//!
//! Raw statements ([`Router::raw_execute`]) bypass routing and every fence.
//!
//! Features: `conformance` enables the `conformance` module, the suites every shard,
//! mapping store and allocation ledger backend runs, and the fault-injecting wrappers used by
//! crash tests.
//!
//! # Example
//!
//! This crate ships no shard: the backends do (`SqliteShard`,
//! `PostgresShard`, `MysqlShard`). The `migration` module of
//! `durability-storage-sqlite` has a runnable example that writes a key,
//! moves it and reads it back. A configuration is checked before anything
//! is touched; here one without any shard:
//!
//! ```
//! use std::sync::Arc;
//! use durability_migration::{MemoryMappingStore, MigrationConfig, Router};
//!
//! let config = MigrationConfig::new(Arc::new(MemoryMappingStore::new())).table("users");
//! let err = Router::new(config).unwrap_err();
//! assert_eq!(err.code(), "INVALID_CONFIG");
//! assert!(err.to_string().contains("shard"), "{err}");
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

mod abort;
mod api;
mod clocks;
mod config;
mod dialect;
mod error;
mod journal;
mod ledger;
mod mapping;
mod metrics;
mod moves;
mod pairs;
mod placement;
mod rebalance;
mod reconcile;
mod record;
mod recovery;
mod republish;
mod router;
mod shard;
mod status;
mod value;
mod verify;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use abort::AbortReport;
pub use config::{
    DEFAULT_CUTOVER_HOLD_MS, DEFAULT_JOURNAL_SCOPE, DEFAULT_KEY_COLUMN,
    DEFAULT_MAPPING_CACHE_TTL_MS, DEFAULT_SCHEMA_RECHECK_MS, MAX_CUTOVER_HOLD_MS, MAX_KEY_BYTES,
    MAX_MAPPING_CACHE_TTL_MS, MAX_NAME_BYTES, MigrationConfig, RESERVED_KEY_PREFIX, Strategy,
    hash_owner, validate_key,
};
pub use dialect::{Cutover, CutoverTable, Dialect, Generation, Ident, MAX_IDENT_BYTES, Sql};
pub use durability_time::{Clock, ManualClock, SystemClock};
pub use error::{
    BackendError, DataRejected, MigrationError, Result, UniqueViolation, chain as error_chain,
};
pub use journal::{
    DEFAULT_RETENTION_MS, MAX_RECOPIES, MOVE_LIVENESS_MS, MoveState, OpRecord, RECOVERY_LEASE_MS,
};
pub use ledger::{AllocationLedger, MemoryLedger, ShardLedger};
pub use mapping::{MappingStore, MemoryMappingStore, ShardMappingStore};
pub use moves::{MoveOptions, MoveOutcome, Retire};
pub use pairs::{AllocationRows, MappingRows, PairKind, ShardPairs};
pub use placement::{
    Algorithm, DEFAULT_MANIFEST_REFRESH_MS, DEFAULT_PRUNE_CONCURRENCY, DEFAULT_PRUNE_PAGE_SIZE,
    Epoch, MANIFEST_COPY_PREFIX, MAX_CAS_ATTEMPTS, MAX_EPOCHS, Manifest, Placement, PruneOptions,
    PruneReport,
};
pub use rebalance::{PlannedMove, RebalanceOptions, RebalanceReport};
pub use reconcile::{
    DEFAULT_RECONCILE_PAGE_SIZE, Disagreement, MAX_RECONCILE_KEYS, MAX_RECONCILE_PAGE_SIZE,
    MissingRecord, ReconcileOptions, ReconcileReport, RecordTable, UncheckedReason,
    UncheckedRecord, VerifyRecords,
};
pub use record::{MigrateOptions, OnConflict};
pub use recovery::{FailedOp, RecoveryReport};
pub use router::{MAX_CHAIN_HOPS, ReadOptions, Router};
pub use shard::{BackendFuture, BatchSupport, BoxFuture, Shard, Statement};
pub use status::{
    DEFAULT_STATUS_LIMIT, LeaseStatus, MAX_STATUS_OPERATIONS, Progress, StatusOptions, StatusReport,
};
pub use value::{Row, Value, decode_row, digest, encode_row, row};
pub use verify::{
    Leftover, MAX_REPORT_ENTRIES, MappingMismatch, PurgeReport, Refusal, StaleCutover,
    VerifyOptions, VerifyReport,
};

#[cfg(test)]
mod tests;

pub mod docs;
