//! The outbox in your own PostgreSQL transaction (feature `outbox`).
//!
//! A service that keeps its data in PostgreSQL stages outbox entries in the
//! transaction that changes that data, with the contract of the object
//! outbox ([`durability_outbox`]): only the newest value of a key is
//! pending, versions only increase, delivery is at least once, settlement
//! is guarded by version and attempt, claims are durable, entries that run
//! out of attempts go to a dead-letter sink, and the lifecycle hook sees
//! every step. The decisions are the outbox crate's own
//! ([`durability_outbox::rules`], [`durability_outbox::Publisher`]); this module
//! reads and writes rows.
//!
//! - [`PgOutbox`] names the tables (a schema and a table name, validated
//!   against `[a-z_][a-z0-9_]*` and always quoted). [`PgOutbox::setup`]
//!   creates them in one call; [`PgOutbox::schema_sql`] prints the same
//!   SQL for teams that run migrations themselves.
//! - [`PgOutbox::stage`] writes one entry (and [`PgOutbox::stage_batch`]
//!   many, in one statement) in the caller's
//!   `tokio_postgres::Transaction` (or, with the feature `sqlx`, its
//!   `sqlx::Transaction<'_, Postgres>`: see [`PgTransaction`]; runtime
//!   queries only, no database at compile time), in one round trip (a call of a
//!   staging function `setup` created, whose upsert the server plans once
//!   per session instead of on every call): it replaces the
//!   key's pending entry, takes a version from a sequence (under the key's
//!   row lock when the key is pending, so a key's versions follow its
//!   commit order), resets the attempt count, makes it due now, and sends a
//!   `NOTIFY` that fires when the caller commits. Nothing is written when
//!   the caller rolls back.
//! - [`PgDeliverer`] delivers one channel. Any number of them, in any
//!   number of processes, share one database: each claims a batch with
//!   `FOR UPDATE SKIP LOCKED` (reading only rows due, through the due-time
//!   index, whatever the plan) and records the claim (attempt count up, due
//!   again at the claim's deadline) before publishing, so no two claim the
//!   same entry and an attempt lost with its process is retried after the
//!   deadline. The attempt count is the claim's token: a settlement
//!   removes or reschedules an entry only while it is still at the version
//!   and attempt claimed. [`PgDeliverer::run`] wakes on `LISTEN/NOTIFY`,
//!   on the next due time, and on a fallback poll, and reconnects after the
//!   server restarts.
//!
//! # Guarantees and limits
//!
//! - A commit whose reply is lost is [`PgOutboxError::OutcomeUnknown`],
//!   never a definite failure; an entry whose settlement may not have
//!   landed is delivered again after its claim's deadline. Sinks must
//!   ignore versions older than the newest they applied.
//! - Rows are decoded strictly: a version, attempt or time out of range is
//!   quarantined (moved to `<table>_quarantine` in the claiming
//!   transaction, with a `Quarantined` event), never misread and never in
//!   the way of healthy entries; [`PgDeliverer::purge_quarantined`] deletes
//!   them.
//! - Claims and settlements commit with `synchronous_commit = off` on the
//!   deliverer's own connections (stages are the caller's commits, with the
//!   caller's settings): a server crash can forget the last few of them,
//!   and then those entries are delivered again (at least once), never
//!   lost. WAL order keeps it consistent: a stage that is durable makes
//!   every earlier settlement durable too.
//! - A batch's settlements are guarded statements that commit in the
//!   transaction of the deliverer's next claim (the run's last claim
//!   carries the last batch's, so a run ends with everything settled);
//!   settlements that did not land leave their entries claimed, delivered
//!   again after the claim's deadline.
//! - A deliverer claims its next batch while it publishes one (on a second
//!   pooled connection), so a process that dies mid-run can hold three
//!   batches until their deadline: the one it published whose
//!   settlements had not landed yet, the one it was publishing, and the
//!   one claimed ahead. On the wire a batch takes two round trips and one
//!   commit: `BEGIN` with the settlements of the batch before and the due
//!   rows' `SELECT`, then the claims' `UPDATE` with `COMMIT`.
//! - [`PgOutbox::stage`] reports no `Staged` event: the commit is the
//!   caller's. The deliverer's hook sees every later step.
//! - Times are the deliverers' and stagers' clocks (Unix ms): keep the
//!   machines' clocks synchronised, as for any lease.
//! - A key staged for the first time by two transactions at once gets the
//!   version of whichever inserts first plus a newer one for the other,
//!   under the row lock; only a key whose pending row is deleted between a
//!   stage's version draw and its insert (microseconds) can land with a
//!   version below the one just delivered, and a version-aware sink then
//!   ignores it.
//!
//! # Example
//!
//! ```
#![doc = include_str!("tour.md")]
//! ```

mod deliver;
mod error;
mod listen;
mod names;
mod sql;
mod stage;

use std::sync::Arc;

use durability_outbox::{Codec, Postcard};
use durability_time::{Clock, SystemClock};
use serde::Serialize;
use serde::de::DeserializeOwned;

#[cfg(feature = "testkit")]
pub use deliver::CrashAt;
pub use deliver::{DEFAULT_POLL_MS, PgDeliverer};
pub use error::PgOutboxError;
pub use names::MAX_NAME_BYTES;
use stage::Batch;
pub use stage::PgTransaction;

use names::Ident;
use sql::Sql;

/// The table name [`PgOutbox::new`] uses.
pub const DEFAULT_TABLE: &str = "outbox";

/// The advisory lock [`PgOutbox::setup`] holds while it creates the tables,
/// so concurrent setups do not race.
const SETUP_LOCK: i64 = 0x6475_7261_6f75_7462; // "duraoutb"

/// One outbox's tables: where entries are staged and delivered from.
/// Cheap to clone.
#[derive(Clone)]
pub struct PgOutbox {
    sql: Arc<Sql>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for PgOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOutbox")
            .field("notify_channel", &self.sql.notify_channel)
            .finish_non_exhaustive()
    }
}

impl PgOutbox {
    /// The outbox in table [`DEFAULT_TABLE`] of `schema`, on the system
    /// clock.
    ///
    /// # Errors
    /// [`PgOutboxError::InvalidName`] for a name outside
    /// `[a-z_][a-z0-9_]*` (at most [`MAX_NAME_BYTES`] bytes, not `pg_…`).
    pub fn new(schema: &str) -> Result<Self, PgOutboxError> {
        Self::with_table(schema, DEFAULT_TABLE)
    }

    /// The outbox in `schema.table` (with `table_version` and
    /// `table_quarantine` beside it).
    ///
    /// # Errors
    /// [`PgOutboxError::InvalidName`], as for [`PgOutbox::new`].
    pub fn with_table(schema: &str, table: &str) -> Result<Self, PgOutboxError> {
        let schema = Ident::new("schema", schema)?;
        let table = Ident::new("table", table)?;
        Ok(Self {
            sql: Arc::new(Sql::new(&schema, &table)),
            clock: Arc::new(SystemClock::new()),
        })
    }

    /// Uses `clock` for due times (tests use a manual clock).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The SQL [`PgOutbox::setup`] runs: idempotent `CREATE … IF NOT
    /// EXISTS` statements for the schema, the version sequence, the table,
    /// its due index and the quarantine table, and `CREATE OR REPLACE
    /// FUNCTION` for the two staging functions (`<table>_stage` and
    /// `<table>_stage_one`, PL/pgSQL) that [`PgOutbox::stage`] and
    /// [`PgOutbox::stage_batch`] call. Run it again after upgrading this
    /// crate: a later version may change the functions (replacing them
    /// needs the role that owns them).
    pub fn schema_sql(&self) -> String {
        self.sql.schema.clone()
    }

    /// The channel `NOTIFY` is sent on (`schema.table`).
    pub fn notify_channel(&self) -> &str {
        &self.sql.notify_channel
    }

    /// Creates the outbox's tables if they are missing and (re)creates its
    /// staging functions, in one transaction (concurrent setups wait for
    /// each other); [`PgOutbox::schema_sql`] is the SQL it runs.
    ///
    /// # Errors
    /// [`PgOutboxError::Rejected`] (the role may not create them, say) or
    /// [`PgOutboxError::Unavailable`]; nothing is created then.
    pub async fn setup(&self, client: &mut tokio_postgres::Client) -> Result<(), PgOutboxError> {
        let tx = client
            .transaction()
            .await
            .map_err(PgOutboxError::statement)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SETUP_LOCK])
            .await
            .map_err(PgOutboxError::statement)?;
        tx.batch_execute(&self.sql.schema)
            .await
            .map_err(PgOutboxError::statement)?;
        tx.commit().await.map_err(PgOutboxError::commit)
    }

    /// Stages `value` for `key` on `channel` in the caller's transaction,
    /// encoded with [`Postcard`] (the default codec of a channel); returns
    /// the version assigned. See [`PgOutbox::stage_with`].
    ///
    /// # Errors
    /// As [`PgOutbox::stage_with`].
    pub async fn stage<T>(
        &self,
        tx: impl PgTransaction,
        channel: &str,
        key: &str,
        value: &T,
    ) -> Result<u64, PgOutboxError>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        self.stage_with(tx, &Postcard, channel, key, value).await
    }

    /// Stages `value` with `codec` (the codec the channel's deliverer is
    /// configured with): replaces any pending entry of the key, assigns a
    /// new version, resets the attempt count, makes it due now and notifies
    /// the deliverers on commit. One round trip.
    ///
    /// # Errors
    /// Before anything is sent: [`PgOutboxError::Outbox`] for a bad
    /// channel, key or value (`OUTBOX_INVALID_CHANNEL`,
    /// `OUTBOX_INVALID_KEY`, `OUTBOX_VALUE_TOO_LARGE`, …). From the server:
    /// [`PgOutboxError::Rejected`] (the caller's transaction is aborted
    /// and must be rolled back), `OUTBOX_VERSIONS_EXHAUSTED` when the
    /// sequence reached 2^53-1, [`PgOutboxError::Unavailable`] when the
    /// connection was lost (the transaction cannot commit).
    pub async fn stage_with<T: Sync + 'static>(
        &self,
        tx: impl PgTransaction,
        codec: &dyn Codec<T>,
        channel: &str,
        key: &str,
        value: &T,
    ) -> Result<u64, PgOutboxError> {
        let entries = [(key, value)];
        Ok(self.stage_in(tx, codec, channel, &entries).await?[0])
    }

    /// Stages many values on one channel in the caller's transaction, in
    /// one round trip, encoded with [`Postcard`]: as many [`PgOutbox::stage`]
    /// calls, in order (a key given twice keeps its last value). Returns
    /// the version pending for each given entry's key, in order.
    ///
    /// # Errors
    /// As [`PgOutbox::stage_with`]; every entry is checked before anything
    /// is sent.
    pub async fn stage_batch<T>(
        &self,
        tx: impl PgTransaction,
        channel: &str,
        entries: &[(&str, T)],
    ) -> Result<Vec<u64>, PgOutboxError>
    where
        T: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        self.stage_in::<T, T>(tx, &Postcard, channel, entries).await
    }

    /// Stages `entries` in `tx` (either client's transaction): checks and
    /// encodes every entry with `codec`, then runs the staging statement
    /// (nothing is sent for no entries); the version pending for each
    /// given entry's key, in order.
    async fn stage_in<T: Sync + 'static, V: std::borrow::Borrow<T> + Sync>(
        &self,
        tx: impl PgTransaction,
        codec: &dyn Codec<T>,
        channel: &str,
        entries: &[(&str, V)],
    ) -> Result<Vec<u64>, PgOutboxError> {
        let batch = Batch::encode(codec, channel, entries)?;
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let staging = batch.staging(self.clock.now_ms(), &self.sql.notify_channel);
        let rows = tx.upsert(self.sql.staging(), &staging).await?;
        batch.versions(rows)
    }
}

#[cfg(test)]
mod tests;
