//! The crate's one error type, with stable machine codes.

use std::error::Error as StdError;

/// A boxed error from a backend (a shard or a mapping store).
pub type BackendError = Box<dyn StdError + Send + Sync + 'static>;

/// A backend error a shard reports when a statement violated a primary key
/// or unique constraint: a definite rejection (the statement applied
/// nothing), never an unknown outcome. Shards wrap the driver's error in it
/// (SQLite `SQLITE_CONSTRAINT_PRIMARYKEY` / `_UNIQUE`, PostgreSQL SQLSTATE
/// `23505`, MariaDB/MySQL error 1062); the router reports a routed write
/// that fails with it as `DUPLICATE_KEY`.
#[derive(Debug, thiserror::Error)]
#[error("unique constraint violated")]
pub struct UniqueViolation(#[source] pub BackendError);

impl UniqueViolation {
    /// Whether `e` (or an error it wraps) is a [`UniqueViolation`].
    pub fn is(e: &(dyn StdError + 'static)) -> bool {
        let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
        while let Some(x) = cur {
            if x.is::<Self>() {
                return true;
            }
            cur = x.source();
        }
        false
    }
}

/// A backend error a shard reports when a statement was refused for the
/// data it carries (a NOT NULL, CHECK or foreign-key constraint, a value the
/// column's type cannot hold, a value out of range): a definite rejection
/// (the statement applied nothing), never an unknown outcome. Shards wrap
/// the driver's error in it (the SQLite shard: `SQLITE_CONSTRAINT_*` other
/// than unique, `SQLITE_MISMATCH`, `SQLITE_TOOBIG`; the PostgreSQL shard:
/// SQLSTATE classes `22` and `23` and values its parameters cannot hold;
/// the MariaDB/MySQL shard: its data-refusal server errors), naming the
/// column when the driver's error does. A move whose copy fails with it (or
/// with a [`UniqueViolation`]) aborts with `MIGRATION_COPY_REJECTED`; a
/// routed write is `ROW_REJECTED`.
#[derive(Debug, thiserror::Error)]
#[error("the statement's data was refused")]
pub struct DataRejected {
    /// The table the refusal names, when the driver names one.
    pub table: Option<String>,
    /// The column the refusal names, when the driver names one.
    pub column: Option<String>,
    /// The driver's error.
    #[source]
    pub source: BackendError,
}

impl DataRejected {
    /// The driver's error `source`, refused for its data, as a backend
    /// error: a [`DataRejected`] naming `table` and `column` when the
    /// driver's error names them.
    pub fn boxed(
        table: Option<String>,
        column: Option<String>,
        source: impl Into<BackendError>,
    ) -> BackendError {
        Box::new(Self {
            table,
            column,
            source: source.into(),
        })
    }

    /// The [`DataRejected`] in `e` or an error it wraps, if any.
    pub fn find<'e>(e: &'e (dyn StdError + 'static)) -> Option<&'e Self> {
        let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
        while let Some(x) = cur {
            if let Some(d) = x.downcast_ref::<Self>() {
                return Some(d);
            }
            cur = x.source();
        }
        None
    }
}

/// An error and its sources, outermost first, joined by `": "` (a
/// driver's error often says only "db error" and keeps the server's words
/// in its source).
pub fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// Every failure the migration crate reports.
///
/// Each variant has a stable machine code ([`MigrationError::code`]) and says
/// whether retrying the same call can help ([`MigrationError::is_retryable`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrationError {
    /// `journal_shard` names a shard that is not configured.
    #[error("journal shard {0:?} is not a configured shard")]
    InvalidJournalShard(String),
    /// Several shards are configured and none is the journal shard.
    #[error("several shards are configured and no journal shard is set")]
    JournalNotConfigured,
    /// The configuration is invalid (no shards, bad scope, bad TTL).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A write cannot tell which shard owns the key while a move is in flight.
    /// The write was not applied and is not acknowledged.
    #[error("key {key:?} is being moved and its owner is not settled; the write was not applied")]
    CutoverPending {
        /// The key.
        key: String,
    },
    /// A tombstone lookup failed or names an unconfigured shard.
    #[error("tombstone lookup for key {key:?} is unavailable: {reason}")]
    LookupUnavailable {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// A `moved_to` chain is longer than four hops or has a cycle.
    #[error("moved_to chain for key {key:?} exceeds four hops or has a cycle")]
    ChainExceeded {
        /// The key.
        key: String,
    },
    /// A shard is not on a proven dialect.
    #[error("shard {shard:?} is on dialect {dialect:?}, which moves do not support")]
    UnsupportedDialect {
        /// The shard.
        shard: String,
        /// The dialect name.
        dialect: String,
    },
    /// A shard has no batch support at all.
    #[error("shard {0:?} cannot run batches")]
    NoBatch(String),
    /// A shard's batch is not declared atomic.
    #[error("shard {0:?} does not declare an atomic batch")]
    NoAtomicBatch(String),
    /// The key has no mapping.
    #[error("key {0:?} has no mapping")]
    MappingNotFound(String),
    /// Another recovery holds the journal scope's lease.
    #[error("another recovery holds the lease of journal scope {0:?}")]
    RecoveryInProgress(String),
    /// This recovery lost its lease and stopped without further writes.
    #[error("recovery of journal scope {0:?} lost its lease")]
    RecoveryFenced(String),
    /// The destination holds a different row (`on_conflict: fail`).
    #[error("destination holds a different row for key {0:?}")]
    DestinationConflict(String),
    /// The retention period of a retired operation has not elapsed.
    #[error("retention of operation {0} has not elapsed")]
    RetentionNotElapsed(String),
    /// No clean verification pass ran since the operation finished.
    #[error("no clean verification pass since operation {0} finished")]
    NotVerified(String),
    /// A shard name is not configured.
    #[error("shard {0:?} is not configured")]
    UnknownShard(String),
    /// A table is not configured or does not exist on a shard.
    #[error("table {0:?} is not configured or does not exist")]
    UnknownTable(String),
    /// A table's key column does not exist.
    #[error("key column {column:?} does not exist in table {table:?}")]
    UnknownKeyColumn {
        /// The table.
        table: String,
        /// The column.
        column: String,
    },
    /// A row names a column the table does not have.
    #[error("column {column:?} does not exist in table {table:?}")]
    UnknownColumn {
        /// The table.
        table: String,
        /// The column.
        column: String,
    },
    /// An identifier failed validation (grammar, length, reserved prefix).
    #[error("invalid identifier {0:?}")]
    InvalidIdentifier(String),
    /// A key is empty or longer than [`crate::MAX_KEY_BYTES`].
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// Another move of the same key is active, or moved the key after
    /// this call located it (a losing concurrent move always gets this).
    #[error("a move of key {0:?} is already active")]
    AlreadyActive(String),
    /// The key already lives on the target shard.
    #[error("key {key:?} already lives on shard {shard:?}")]
    SameShard {
        /// The key.
        key: String,
        /// The shard.
        shard: String,
    },
    /// The key has no row in any of the tables to move.
    #[error("key {0:?} has no row to move")]
    RowNotFound(String),
    /// The move aborted without moving the key (source changed three times, or gone).
    #[error("move of key {key:?} aborted: {reason}")]
    Aborted {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// Recovery took the operation over; this mover stopped without further writes.
    #[error("operation {0} was taken over by recovery")]
    TakenOver(String),
    /// A shard failed; for a write the outcome is unknown.
    #[error("shard {shard:?} failed")]
    ShardUnavailable {
        /// The shard.
        shard: String,
        /// The backend error.
        #[source]
        source: BackendError,
    },
    /// The mapping store failed; for a write the outcome is unknown.
    #[error("mapping store failed")]
    MappingUnavailable(#[source] BackendError),
    /// A stored record could not be decoded.
    #[error("corrupt stored record: {0}")]
    Corrupt(String),
    /// Creating an epoch would make the manifest hold more than eight.
    #[error("the placement manifest already holds {0} epochs; prune before adding one")]
    TooManyEpochs(usize),
    /// The manifest compare-and-swap lost five times in a row.
    #[error("placement manifest update lost {0} compare-and-swaps in a row")]
    PlacementConflict(u32),
    /// A write could not confirm a fresh manifest; nothing was routed.
    #[error("the placement manifest could not be confirmed for a write")]
    PlacementUnverified(#[source] BackendError),
    /// A shard's generation fence is above the write's manifest, even after
    /// one reload. Nothing was written.
    #[error("shard {shard:?} fences generation {fence}, above the write's generation {generation}")]
    StaleTopology {
        /// The shard.
        shard: String,
        /// The fence on the shard.
        fence: i64,
        /// The generation the write routed with.
        generation: i64,
    },
    /// A write could not find the shard that holds its row; nothing was written.
    #[error("write of key {key:?} could not probe shard {shard:?}")]
    WriteUnresolved {
        /// The key.
        key: String,
        /// The shard whose probe failed.
        shard: String,
        /// The backend error.
        #[source]
        source: BackendError,
    },
    /// Epoch pruning could not read the exception set.
    #[error("epoch pruning refused: {0}")]
    PruneRefused(String),
    /// `repair` needs `verify_records`.
    #[error("reconcile repair requires verify_records")]
    ReconcileVerifyRequired,
    /// The configuration has no coordinator (allocation ledger).
    #[error("no coordinator (allocation ledger) is configured")]
    CoordinatorNotConfigured,
    /// The coordinator's allocation ledger failed; for a prune the outcome
    /// is unknown.
    #[error("the coordinator's allocation ledger failed")]
    CoordinatorUnavailable(#[source] BackendError),
    /// A move names only some of the configured tables that hold a row of
    /// the key: moving it would strand the others (the key's mapping would
    /// point away from them). Nothing was written; move every table listed
    /// here with the others in one `reassign_keys`.
    #[error("key {key:?} also has rows in tables {tables:?}, which the move does not include")]
    PartialMove {
        /// The key.
        key: String,
        /// Configured tables outside the move that hold a row of the key.
        tables: Vec<String>,
    },
    /// A routed insert found a row of the key already there (a primary key
    /// or unique constraint refused it): a definite rejection, nothing was
    /// written. Use `upsert` or `update` to change an existing row.
    #[error("table {table:?} already holds a row of key {key:?}")]
    DuplicateKey {
        /// The key.
        key: String,
        /// The table.
        table: String,
    },
    /// A table's key column compares more coarsely than bytes (a case- or
    /// accent-insensitive or PAD SPACE collation, `citext`): two keys the
    /// router keeps apart would be one row on the shard. Refused when the
    /// table is first used on the shard; `fix` says what to declare.
    #[error(
        "key column {column:?} of table {table:?} compares with {collation}, not by bytes: {fix}"
    )]
    KeyColumnNotBytewise {
        /// The table.
        table: String,
        /// The key column.
        column: String,
        /// The collation (or type) that compares it.
        collation: String,
        /// What to change.
        fix: String,
    },
    /// A move's copy was definitely refused by the destination (a value
    /// its dialect or column cannot hold, a constraint the source does not
    /// have): the move can never succeed as it is, so it was aborted (the
    /// key stays on its source, every copy dropped) and its claim released.
    /// Nothing is retried; change the row or the destination's table.
    #[error(
        "destination {shard:?} refused the copy of key {key:?} into {table:?}{}: {reason}",
        column.as_deref().map(|c| format!(" (column {c:?})")).unwrap_or_default()
    )]
    CopyRejected {
        /// The key.
        key: String,
        /// The destination shard.
        shard: String,
        /// The table whose row was refused.
        table: String,
        /// The column, when known (always for a value the destination's
        /// dialect cannot hold).
        column: Option<String>,
        /// Why.
        reason: String,
    },
    /// A routed write was definitely refused by its shard for the data it
    /// carries (a [`DataRejected`] from the shard: a NOT NULL, CHECK or
    /// foreign-key constraint, a value its column cannot hold): nothing was
    /// written. Change the row; retrying it as it is fails again.
    #[error(
        "shard {shard:?} refused the write of key {key:?} into {table:?}{}: {reason}",
        column.as_deref().map(|c| format!(" (column {c:?})")).unwrap_or_default()
    )]
    RowRejected {
        /// The key.
        key: String,
        /// The shard that refused it.
        shard: String,
        /// The table written.
        table: String,
        /// The column, when the shard names it.
        column: Option<String>,
        /// The shard's reason.
        reason: String,
    },
    /// No operation with this id exists in the journal scope.
    #[error("operation {0} does not exist")]
    OperationNotFound(String),
    /// The operation cannot be aborted: it has cut over (or may have), or
    /// finished moving the key. `cutover_pending` operations are settled by
    /// `recover_migrations` (which checks the source).
    #[error("operation {op_id} is {state} and cannot be aborted")]
    NotAbortable {
        /// The operation.
        op_id: String,
        /// Its state.
        state: String,
    },
}

impl MigrationError {
    /// Whether retrying the same call later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::CutoverPending { .. }
                | Self::LookupUnavailable { .. }
                | Self::RecoveryInProgress(_)
                | Self::RecoveryFenced(_)
                | Self::RetentionNotElapsed(_)
                | Self::NotVerified(_)
                | Self::AlreadyActive(_)
                | Self::Aborted { .. }
                | Self::TakenOver(_)
                | Self::ShardUnavailable { .. }
                | Self::MappingUnavailable(_)
                | Self::PlacementConflict(_)
                | Self::PlacementUnverified(_)
                | Self::StaleTopology { .. }
                | Self::WriteUnresolved { .. }
                | Self::PruneRefused(_)
                | Self::CoordinatorUnavailable(_)
        )
    }

    /// Whether the outcome of the failed call is unknown (a backend failed
    /// mid-call), as opposed to a definite rejection that changed nothing.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(
            self,
            Self::ShardUnavailable { .. }
                | Self::MappingUnavailable(_)
                | Self::TakenOver(_)
                | Self::CoordinatorUnavailable(_)
        )
    }

    pub(crate) fn shard(shard: &str, source: BackendError) -> Self {
        Self::ShardUnavailable {
            shard: shard.to_owned(),
            source,
        }
    }
}

durability_time::error_codes! {
    MigrationError {
        Self::InvalidJournalShard(_) => "INVALID_JOURNAL_SHARD",
        Self::JournalNotConfigured => "JOURNAL_NOT_CONFIGURED",
        Self::InvalidConfig(_) => "INVALID_CONFIG",
        Self::CutoverPending { .. } => "MIGRATION_CUTOVER_PENDING",
        Self::LookupUnavailable { .. } => "MIGRATION_LOOKUP_UNAVAILABLE",
        Self::ChainExceeded { .. } => "MIGRATION_CHAIN_EXCEEDED",
        Self::UnsupportedDialect { .. } => "MIGRATION_UNSUPPORTED_DIALECT",
        Self::NoBatch(_) => "MIGRATION_NO_BATCH",
        Self::NoAtomicBatch(_) => "MIGRATION_NO_ATOMIC_BATCH",
        Self::MappingNotFound(_) => "MAPPING_NOT_FOUND",
        Self::RecoveryInProgress(_) => "RECOVERY_IN_PROGRESS",
        Self::RecoveryFenced(_) => "RECOVERY_FENCED",
        Self::DestinationConflict(_) => "DESTINATION_CONFLICT",
        Self::RetentionNotElapsed(_) => "RETENTION_NOT_ELAPSED",
        Self::NotVerified(_) => "NOT_VERIFIED",
        Self::UnknownShard(_) => "UNKNOWN_SHARD",
        Self::UnknownTable(_) => "UNKNOWN_TABLE",
        Self::UnknownKeyColumn { .. } => "UNKNOWN_KEY_COLUMN",
        Self::UnknownColumn { .. } => "UNKNOWN_COLUMN",
        Self::InvalidIdentifier(_) => "INVALID_IDENTIFIER",
        Self::InvalidKey(_) => "INVALID_KEY",
        Self::AlreadyActive(_) => "MIGRATION_ALREADY_ACTIVE",
        Self::SameShard { .. } => "MIGRATION_SAME_SHARD",
        Self::RowNotFound(_) => "MIGRATION_ROW_NOT_FOUND",
        Self::Aborted { .. } => "MIGRATION_ABORTED",
        Self::TakenOver(_) => "MIGRATION_TAKEN_OVER",
        Self::ShardUnavailable { .. } => "SHARD_UNAVAILABLE",
        Self::MappingUnavailable(_) => "MAPPING_UNAVAILABLE",
        Self::Corrupt(_) => "CORRUPT_RECORD",
        Self::TooManyEpochs(_) => "TOO_MANY_EPOCHS",
        Self::PlacementConflict(_) => "PLACEMENT_CONFLICT",
        Self::PlacementUnverified(_) => "PLACEMENT_UNVERIFIED",
        Self::StaleTopology { .. } => "STALE_TOPOLOGY",
        Self::WriteUnresolved { .. } => "WRITE_UNRESOLVED",
        Self::PruneRefused(_) => "PRUNE_REFUSED",
        Self::ReconcileVerifyRequired => "RECONCILE_VERIFY_REQUIRED",
        Self::CoordinatorNotConfigured => "COORDINATOR_NOT_CONFIGURED",
        Self::CoordinatorUnavailable(_) => "COORDINATOR_UNAVAILABLE",
        Self::PartialMove { .. } => "MIGRATION_PARTIAL_MOVE",
        Self::DuplicateKey { .. } => "DUPLICATE_KEY",
        Self::KeyColumnNotBytewise { .. } => "KEY_COLUMN_NOT_BYTEWISE",
        Self::CopyRejected { .. } => "MIGRATION_COPY_REJECTED",
        Self::RowRejected { .. } => "ROW_REJECTED",
        Self::OperationNotFound(_) => "MIGRATION_OPERATION_NOT_FOUND",
        Self::NotAbortable { .. } => "MIGRATION_NOT_ABORTABLE",
    }
}

/// The crate's result type.
pub type Result<T, E = MigrationError> = std::result::Result<T, E>;
