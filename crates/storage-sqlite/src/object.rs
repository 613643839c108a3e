//! SQLite object storage: one database file per object, synchronous
//! transactions, the scheduler's rows and registered schema migrations.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use durability_scheduler::{
    Direction, SchedulerTx, SchemaStep, Storage, StorageError, StorageErrorKind,
};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

pub(crate) use crate::connection::Synchronous;
use crate::connection::{ConnectionOptions, OpenError};

/// Options for opening an object database.
#[derive(Debug, Clone, Copy)]
pub struct SqliteOptions {
    /// Durability of commits; default [`Synchronous::Full`].
    pub synchronous: Synchronous,
    /// How long one transaction waits for another connection's write lock
    /// before failing; default [`DEFAULT_BUSY_TIMEOUT`] (1 s, the owner
    /// lease guard). A holder paused inside its transaction keeps the lock
    /// while it is paused: each attempt of the new owner then fails after
    /// this long (retryable) instead of hanging, until the paused holder
    /// resumes and rolls back (its lease budget is spent) or dies.
    pub busy_timeout: Duration,
}

/// The default busy timeout of an object database: 1 s, no longer than the
/// owner lease guard (`DO_OWNER_LEASE_GUARD_MS`, default 1000).
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_millis(1000);

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
        }
    }
}

impl SqliteOptions {
    fn connection(self, wal: bool) -> ConnectionOptions {
        ConnectionOptions {
            wal,
            synchronous: self.synchronous,
            busy_timeout: self.busy_timeout,
        }
    }
}

fn open_error(e: OpenError) -> StorageError {
    match e {
        OpenError::Sqlite { step, source } => backend(step, source),
        OpenError::NotWal(_) => StorageError::new(StorageErrorKind::Backend, e.to_string()),
    }
}

/// One schema step with its SQL, as an application registers it for its own
/// capability with [`SqliteStorage::register_schema`].
#[derive(Debug, Clone, Copy)]
pub struct SqliteSchemaStep {
    /// The step's version and name.
    pub step: SchemaStep,
    /// SQL applied going up (may hold several statements).
    pub up: &'static str,
    /// SQL applied going down.
    pub down: &'static str,
}

/// An object's storage in one SQLite database (WAL mode).
pub struct SqliteStorage {
    conn: Mutex<Connection>,
    /// The block of outbox versions reserved by the last committed
    /// transaction that issued one; revalidated by every transaction.
    #[cfg(feature = "outbox")]
    versions: Mutex<Option<crate::outbox::VersionBlock>>,
    schemas: BTreeMap<String, (&'static [SchemaStep], &'static [SqliteSchemaStep])>,
    /// The owner claim every transaction checks, once fenced.
    #[cfg(feature = "ownership")]
    fence: Mutex<Option<Fence>>,
}

impl std::fmt::Debug for SqliteStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStorage")
            .field("schemas", &self.schemas.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The claim a fenced storage checks after `BEGIN`, and the lease budget it
/// checks right before `COMMIT`.
#[cfg(feature = "ownership")]
type Fence = (
    durability_ownership::OwnerRecord,
    Option<std::sync::Arc<dyn durability_ownership::BudgetCheck>>,
);

/// A transaction on a [`SqliteStorage`]. [`SqliteTx::sql`] gives the
/// application the same transaction for its own rows.
pub struct SqliteTx<'t> {
    tx: rusqlite::Transaction<'t>,
    /// The outbox versions this transaction may issue without writing the
    /// counter (see `crate::outbox::TxVersions`).
    #[cfg(feature = "outbox")]
    pub(crate) versions: crate::outbox::TxVersions,
}

impl std::fmt::Debug for SqliteTx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteTx").finish_non_exhaustive()
    }
}

impl SqliteTx<'_> {
    /// The underlying SQLite transaction, for the application's own rows.
    /// Everything written through it commits or rolls back with the
    /// capabilities' rows.
    pub fn sql(&self) -> &Connection {
        &self.tx
    }

    /// The `COUNT(*)` that the cached statement `sql` reads with `params`;
    /// a failure is a backend error saying `what` failed.
    #[cfg(any(feature = "outbox", feature = "semaphore"))]
    pub(crate) fn count(
        &self,
        what: &str,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<u64, StorageError> {
        let n: i64 = self
            .tx
            .prepare_cached(sql)
            .and_then(|mut st| st.query_row(params, |r| r.get(0)))
            .map_err(|e| backend(what, e))?;
        // `COUNT(*)` is never negative.
        Ok(n.unsigned_abs())
    }

    /// Runs the cached statement `sql` with `params` and returns how many
    /// rows it changed; a failure is a backend error saying `what` failed.
    #[cfg(any(feature = "outbox", feature = "semaphore"))]
    pub(crate) fn exec(
        &self,
        what: &str,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<usize, StorageError> {
        self.tx
            .prepare_cached(sql)
            .and_then(|mut st| st.execute(params))
            .map_err(|e| backend(what, e))
    }

    /// Drops up to `limit` of the object's own schema objects (tables,
    /// views and triggers whose names do not start with the reserved
    /// `durability_` or `sqlite_`, in any case; a table's indexes and
    /// triggers go with it), in this transaction, and returns the names
    /// dropped and whether more may be left (the page listed `limit`
    /// names; shadow tables go with their virtual table and are not named,
    /// so a page can name fewer than it listed). Views go first, then
    /// virtual tables (their shadow tables go with them), then tables,
    /// then triggers on reserved tables. The capabilities' `durability_*`
    /// tables are never touched. One page of a paged delete-all.
    ///
    /// # Errors
    /// A SQLite failure; the transaction should roll back.
    pub fn drop_own_schema_objects(
        &self,
        limit: usize,
    ) -> Result<(Vec<String>, bool), StorageError> {
        let listed: Vec<(String, String)> = self
            .tx
            .prepare(
                "SELECT type, name FROM sqlite_schema
                 WHERE type IN ('table', 'view', 'trigger')
                   AND lower(substr(name, 1, 11)) <> 'durability_'
                   AND lower(substr(name, 1, 7)) <> 'sqlite_'
                 ORDER BY CASE
                     WHEN type = 'view' THEN 0
                     WHEN type = 'table' AND upper(sql) LIKE 'CREATE VIRTUAL%' THEN 1
                     WHEN type = 'table' THEN 2
                     ELSE 3 END, name
                 LIMIT ?1",
            )
            .and_then(|mut st| {
                st.query_map([i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?
                .collect()
            })
            .map_err(|e| backend("list schema objects", e))?;
        let more = listed.len() >= limit;
        let mut dropped = Vec::with_capacity(listed.len());
        for (kind, name) in listed {
            let kind = match kind.as_str() {
                "view" => "VIEW",
                "trigger" => "TRIGGER",
                _ => "TABLE",
            };
            // A virtual table dropped earlier in the page took its shadow
            // tables with it (and a table its triggers): not dropped here.
            let exists: bool = self
                .tx
                .prepare_cached("SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE name = ?1)")
                .and_then(|mut st| st.query_row([&name], |r| r.get(0)))
                .map_err(|e| backend("read schema object", e))?;
            if !exists {
                continue;
            }
            let quoted = name.replace('"', "\"\"");
            self.tx
                .execute_batch(&format!("DROP {kind} IF EXISTS \"{quoted}\""))
                .map_err(|e| backend(&format!("drop {name}"), e))?;
            dropped.push(name);
        }
        Ok((dropped, more))
    }

    /// The capabilities that have a due time stored, by name.
    ///
    /// # Errors
    /// A SQLite failure.
    pub fn due_capabilities(&self) -> Result<Vec<String>, StorageError> {
        self.tx
            .prepare_cached("SELECT capability FROM durability_scheduler_due ORDER BY capability")
            .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
            .map_err(|e| backend("list capability due times", e))
    }
}

pub(crate) fn backend(context: &str, e: rusqlite::Error) -> StorageError {
    StorageError::backend(context.to_owned(), e)
}

const BASE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS durability_schema (
    capability TEXT PRIMARY KEY NOT NULL,
    version INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS durability_scheduler_due (
    capability TEXT PRIMARY KEY NOT NULL,
    due INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS durability_scheduler_due_by_time
    ON durability_scheduler_due (due);
CREATE TABLE IF NOT EXISTS durability_scheduler_alarm (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    at INTEGER
);
";

impl SqliteStorage {
    /// Opens (or creates) the object database at `path` in WAL mode.
    ///
    /// # Errors
    /// A SQLite failure opening the file or creating the base tables.
    pub fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, StorageError> {
        let conn = crate::connection::open_connection(path, &options.connection(true))
            .map_err(open_error)?;
        Self::init(conn)
    }

    /// An in-memory database: for logic tests only (nothing survives).
    ///
    /// # Errors
    /// A SQLite failure creating the base tables.
    pub fn open_in_memory() -> Result<Self, StorageError> {
        let conn = Connection::open_in_memory().map_err(|e| backend("open database", e))?;
        crate::connection::configure(&conn, &SqliteOptions::default().connection(false))
            .map_err(open_error)?;
        Self::init(conn)
    }

    fn init(conn: Connection) -> Result<Self, StorageError> {
        conn.execute_batch(BASE_SCHEMA)
            .map_err(|e| backend("create base tables", e))?;
        #[allow(unused_mut)] // The built-in schemas depend on the features.
        let mut schemas = BTreeMap::new();
        #[cfg(feature = "outbox")]
        schemas.insert(
            durability_outbox::SCHEMA.to_owned(),
            (crate::outbox::STEPS, crate::outbox::SQL_STEPS),
        );
        #[cfg(feature = "topology")]
        schemas.insert(
            durability_topology::SCHEMA.to_owned(),
            (crate::topology::STEPS, crate::topology::SQL_STEPS),
        );
        #[cfg(feature = "alarms")]
        schemas.insert(
            durability_alarms::SCHEMA.to_owned(),
            (crate::alarms::STEPS, crate::alarms::SQL_STEPS),
        );
        #[cfg(feature = "semaphore")]
        schemas.insert(
            durability_semaphore::SCHEMA.to_owned(),
            (crate::semaphore::STEPS, crate::semaphore::SQL_STEPS),
        );
        Ok(Self {
            conn: Mutex::new(conn),
            #[cfg(feature = "outbox")]
            versions: Mutex::new(None),
            schemas,
            #[cfg(feature = "ownership")]
            fence: Mutex::new(None),
        })
    }

    /// Registers schema steps for an application capability, applied by the
    /// scheduler on attach and by `migrate`.
    ///
    /// `steps` and `sql` list the same versions in the same order.
    ///
    /// # Errors
    /// A backend error when the lists disagree or the name is taken by a
    /// built-in capability.
    pub fn register_schema(
        &mut self,
        capability: &str,
        steps: &'static [SchemaStep],
        sql: &'static [SqliteSchemaStep],
    ) -> Result<(), StorageError> {
        durability_scheduler::check_schema_steps(capability, steps, sql.iter().map(|s| s.step))?;
        if self.schemas.contains_key(capability) {
            return Err(StorageError::new(
                StorageErrorKind::Backend,
                format!("a schema for {capability} is already registered"),
            ));
        }
        self.schemas.insert(capability.to_owned(), (steps, sql));
        Ok(())
    }
}

#[cfg(feature = "ownership")]
impl SqliteStorage {
    /// Fences this object database to an owner claim: records its
    /// generation and holder (the exact owner record bytes) in the database
    /// (the fence only rises; one generation has one holder) and, from then
    /// on, checks inside every transaction that the fence still holds
    /// exactly this claim, so a commit from an older generation, or from
    /// another claim of the same generation, is refused by the storage
    /// itself (`StorageErrorKind::Fenced`), not only at dispatch. Call it
    /// at the first dispatch after a claim; a host opens objects through
    /// `durability_ownership::fence_with_floor`, which also gives the
    /// fence the claim's lease budget ([`durability_ownership::ObjectFence`]).
    ///
    /// # Errors
    /// `StorageErrorKind::Fenced` when a newer generation, or the same
    /// generation from another claim, is already recorded (nothing is
    /// written); a backend failure.
    pub fn fence(&self, record: &durability_ownership::OwnerRecord) -> Result<(), StorageError> {
        durability_ownership::ObjectFence::fence_claim(self, record, None).map_err(fenced)
    }
}

#[cfg(feature = "ownership")]
impl durability_ownership::ObjectFence for SqliteStorage {
    fn fence_claim(
        &self,
        record: &durability_ownership::OwnerRecord,
        budget: Option<std::sync::Arc<dyn durability_ownership::BudgetCheck>>,
    ) -> Result<(), durability_ownership::OwnershipError> {
        use durability_ownership::OwnershipError;
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| match e.sqlite_error_code() {
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                    OwnershipError::OwnerRace {
                        scope: record.scope().to_string(),
                    }
                }
                _ => OwnershipError::StoreUnavailable {
                    source: Box::new(e),
                },
            })?;
        crate::ownership::ensure_fence_schema(&tx)?;
        crate::ownership::check_fenced_scope(&tx, record)?;
        crate::ownership::record_generation(&tx, record)?;
        tx.commit().map_err(|e| OwnershipError::OwnerUnavailable {
            source: Box::new(e),
        })?;
        *self.fence.lock().unwrap_or_else(PoisonError::into_inner) = Some((record.clone(), budget));
        Ok(())
    }
}

#[cfg(feature = "ownership")]
fn fenced(e: durability_ownership::OwnershipError) -> StorageError {
    let kind = match e {
        durability_ownership::OwnershipError::StaleGeneration { .. }
        | durability_ownership::OwnershipError::FenceNotRecorded { .. }
        | durability_ownership::OwnershipError::StaleOwner { .. }
        | durability_ownership::OwnershipError::ObjectScopeMismatch { .. } => {
            StorageErrorKind::Fenced
        }
        _ => StorageErrorKind::Backend,
    };
    StorageError::new(kind, e.to_string())
}

impl SchedulerTx for SqliteTx<'_> {
    fn capability_due(&mut self, capability: &str) -> Result<Option<i64>, StorageError> {
        self.tx
            .prepare_cached("SELECT due FROM durability_scheduler_due WHERE capability = ?1")
            .and_then(|mut st| st.query_row([capability], |r| r.get(0)).optional())
            .map_err(|e| backend("read capability due", e))
    }

    fn set_capability_due(
        &mut self,
        capability: &str,
        due: Option<i64>,
    ) -> Result<(), StorageError> {
        let result = match due {
            Some(due) => self
                .tx
                .prepare_cached(
                    "INSERT INTO durability_scheduler_due (capability, due) VALUES (?1, ?2)
                     ON CONFLICT (capability) DO UPDATE SET due = excluded.due",
                )
                .and_then(|mut st| st.execute(params![capability, due])),
            None => self
                .tx
                .prepare_cached("DELETE FROM durability_scheduler_due WHERE capability = ?1")
                .and_then(|mut st| st.execute([capability])),
        };
        result
            .map(|_| ())
            .map_err(|e| backend("write capability due", e))
    }

    fn earliest_capability_due(&mut self) -> Result<Option<i64>, StorageError> {
        self.tx
            .prepare_cached("SELECT MIN(due) FROM durability_scheduler_due")
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .map_err(|e| backend("read earliest due", e))
    }

    fn alarm(&mut self) -> Result<Option<i64>, StorageError> {
        self.tx
            .prepare_cached("SELECT at FROM durability_scheduler_alarm WHERE id = 0")
            .and_then(|mut st| st.query_row([], |r| r.get::<_, Option<i64>>(0)).optional())
            .map(Option::flatten)
            .map_err(|e| backend("read alarm", e))
    }

    fn set_alarm(&mut self, at: Option<i64>) -> Result<(), StorageError> {
        self.tx
            .prepare_cached(
                "INSERT INTO durability_scheduler_alarm (id, at) VALUES (0, ?1)
                 ON CONFLICT (id) DO UPDATE SET at = excluded.at",
            )
            .and_then(|mut st| st.execute([at]))
            .map(|_| ())
            .map_err(|e| backend("write alarm", e))
    }

    fn schema_version(&mut self, capability: &str) -> Result<Option<u32>, StorageError> {
        self.tx
            .prepare_cached("SELECT version FROM durability_schema WHERE capability = ?1")
            .and_then(|mut st| st.query_row([capability], |r| r.get(0)).optional())
            .map_err(|e| backend("read schema version", e))
    }

    fn set_schema_version(
        &mut self,
        capability: &str,
        version: Option<u32>,
    ) -> Result<(), StorageError> {
        let result = match version {
            Some(v) => self.tx.execute(
                "INSERT INTO durability_schema (capability, version) VALUES (?1, ?2)
                 ON CONFLICT (capability) DO UPDATE SET version = excluded.version",
                params![capability, v],
            ),
            None => self.tx.execute(
                "DELETE FROM durability_schema WHERE capability = ?1",
                [capability],
            ),
        };
        result
            .map(|_| ())
            .map_err(|e| backend("write schema version", e))
    }
}

impl Storage for SqliteStorage {
    type Tx<'t> = SqliteTx<'t>;

    fn transaction<R, E>(&self, f: impl FnOnce(&mut SqliteTx<'_>) -> Result<R, E>) -> Result<R, E>
    where
        E: From<StorageError>,
    {
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| E::from(backend("begin transaction", e)))?;
        let mut tx = SqliteTx {
            tx,
            #[cfg(feature = "outbox")]
            versions: crate::outbox::TxVersions::new(
                *self.versions.lock().unwrap_or_else(PoisonError::into_inner),
            ),
        };
        #[cfg(feature = "ownership")]
        let budget = match &*self.fence.lock().unwrap_or_else(PoisonError::into_inner) {
            Some((record, budget)) => {
                crate::ownership::check_generation(&tx.tx, record)
                    .map_err(|e| E::from(fenced(e)))?;
                budget.clone().map(|b| (record.scope().clone(), b))
            }
            None => None,
        };
        let value = f(&mut tx)?;
        // The last step before the commit system call: a holder paused
        // inside its transaction past its lease rolls back (dropping `tx`)
        // instead of committing late.
        #[cfg(feature = "ownership")]
        if let Some((scope, budget)) = budget
            && budget.spent()
        {
            return Err(E::from(fenced(
                durability_ownership::OwnershipError::StaleOwner {
                    scope: scope.to_string(),
                },
            )));
        }
        #[cfg(feature = "outbox")]
        let versions = tx.versions.committed();
        if let Err(e) = tx.tx.commit() {
            // Whether the commit landed is unknown: forget the block, so
            // the next transaction reserves a fresh one above the counter
            // rather than reissue a version that may have committed.
            #[cfg(feature = "outbox")]
            {
                *self.versions.lock().unwrap_or_else(PoisonError::into_inner) = None;
            }
            return Err(E::from(backend("commit transaction", e)));
        }
        // Only a committed reservation is remembered: a rolled-back one
        // never reached the counter.
        #[cfg(feature = "outbox")]
        if let Some(block) = versions {
            *self.versions.lock().unwrap_or_else(PoisonError::into_inner) = Some(block);
        }
        Ok(value)
    }

    fn schema(&self, capability: &str) -> &'static [SchemaStep] {
        self.schemas.get(capability).map_or(&[], |(steps, _)| steps)
    }

    fn apply_schema_step(
        &self,
        tx: &mut SqliteTx<'_>,
        capability: &str,
        version: u32,
        direction: Direction,
    ) -> Result<(), StorageError> {
        let step = self
            .schemas
            .get(capability)
            .and_then(|(_, sql)| sql.iter().find(|s| s.step.version == version))
            .ok_or_else(|| {
                StorageError::new(
                    StorageErrorKind::Backend,
                    format!("no schema step {version} for {capability}"),
                )
            })?;
        let sql = match direction {
            Direction::Up => step.up,
            Direction::Down => step.down,
        };
        tx.tx
            .execute_batch(sql)
            .map_err(|e| backend("apply schema step", e))
    }
}
