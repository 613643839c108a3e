//! Object storage on PostgreSQL (feature `object`): the scheduler's
//! [`Storage`] and every object-level capability's transaction trait
//! (`SchedulerTx`, `OutboxTx`, `AlarmTx`, `TopologyTx`), with the owner
//! fence checked inside every commit.
//!
//! # Shape
//!
//! [`PostgresObjects`] is one deployment: a schema of shared tables on one
//! database and a connection pool, whose connections each transaction's
//! caller drives while it waits. [`PostgresObjects::open`] gives the
//! [`PostgresObjectStorage`] of one object; its transactions are
//! synchronous closures exactly as on SQLite, so every capability's rules
//! (versions, coalescing, settlement, retries, membership diffs) stay the
//! one copy their crates hold, and SQLite keeps its speed.
//!
//! # Isolation of an object's data
//!
//! - The capabilities' rows (due times, the stored alarm, schema versions,
//!   outbox entries and version counter, the alarm row, topology tables)
//!   live in shared tables of the deployment schema, keyed by object id.
//!   A few tables serve every object: the catalog does not grow with the
//!   number of objects, and an operator can query across objects.
//! - The object's own tables live in a schema of its own,
//!   `<deployment>_o<n>` (`n` numbered by the database), created by the
//!   object's first transaction that touches its own tables (an object
//!   with no tables of its own costs no catalog entry). Every transaction
//!   sets the `search_path` to it, so object code names its tables
//!   without a schema, as on SQLite. An empty schema costs one catalog
//!   row; each table the object creates costs catalog rows and files (a
//!   table with a primary key and a text column: four `pg_class` rows),
//!   which is what bounds how many objects with tables of their own one
//!   database holds. The `object_scale` example measures it (numbers in
//!   ARCHITECTURE.md). This is isolation by naming, not a security
//!   boundary: every object uses the deployment's role.
//! - Alternatives weighed: a schema per object for everything (simple, but
//!   ~10 capability tables per object multiply the catalog and files by
//!   ten); rows keyed by object id for the object's own data too (no
//!   catalog growth, but object code would have to add the key to every
//!   statement, unlike on SQLite).
//!
//! # Synchronous transactions without tying up tokio workers
//!
//! The connections of every deployment of the process are tasks of one
//! current-thread runtime (module `runtime`). A transaction takes a pooled
//! connection and waits for each statement's reply by driving that
//! runtime on its own thread: it writes the request, waits on the socket
//! and reads the reply, with no hand-off to another thread. Called from a
//! worker of a multi-thread tokio runtime, the whole transaction runs in
//! [`tokio::task::block_in_place`], so the worker's other tasks move on;
//! on a plain thread it just blocks. On a current-thread tokio runtime
//! (whose thread cannot start another runtime) the caller parks while a
//! background thread, which drives the runtime whenever no caller does,
//! answers it (no deadlock either way). A second
//! transaction of the same handle waits for the first one inside that
//! blocking section too, never on the worker. The cost is one network
//! round trip per statement and one to commit: the `BEGIN`, the object
//! row lock and the fence read are sent when the transaction starts and
//! answered with its first statement (a transaction without statements
//! waits for them before `COMMIT`); statements are prepared once per
//! connection (the application's once per connection and object). All objects of a deployment share its pool
//! ([`PostgresObjectOptions::pool_size`]); a transaction holds one
//! connection from `BEGIN` to `COMMIT`, and waits at most
//! [`PostgresObjectOptions::connect_timeout`] for one. The alternative weighed is an async
//! transaction API (`AsyncFnOnce` closures over an async transaction
//! trait): it would let a task wait without a thread, but every
//! capability's transaction code would then need an async copy beside the
//! synchronous one SQLite needs (or SQLite would pay for async), which is
//! what the workspace refuses; it stays possible later as a second driver
//! over the same decisions.
//!
//! # Fencing inside the commit
//!
//! Every transaction starts with `SELECT … FOR UPDATE` of the object's row
//! in `durability_objects`: one object's writers are serialised across
//! hosts, as SQLite's write lock does. Once fenced
//! ([`PostgresObjectStorage::fence`] or `ObjectFence::fence_claim`), the
//! next statement (pipelined with it) reads the fence
//! (`durability_object_fences`: the generation and the exact owner record
//! bytes of its holder; a statement of its own, so it sees a fence raised
//! while the transaction waited for the row, which a join into the
//! locking statement would read from that statement's older snapshot) and the
//! transaction is refused (`StorageErrorKind::Fenced`, nothing written)
//! unless the fence holds exactly this storage's claim. The transaction's
//! first statement is pipelined behind the fence read: it runs after the
//! row lock, and its result is handed out only once the fence held (a
//! refused transaction rolls back whatever it did, and is reported as
//! fenced whatever its closure returned). The lease budget
//! ([`durability_ownership::BudgetCheck`]) is checked right before
//! `COMMIT`. The fence only rises, and one generation has one holder.
//!
//! Beyond SQLite: a new owner's `fence_claim` does not wait behind a stale
//! holder paused inside its transaction. It waits at most
//! [`PostgresObjectOptions::fence_wait`] for the row lock, then finds the
//! backend holding it (the row's locking transaction in `pg_locks`) and
//! ends it with `pg_terminate_backend`: the server aborts the holder's
//! transaction, which can then never commit, and the claim proceeds.
//! Whatever session holds the object row past `fence_wait` is ended (a
//! claim is made after the lease moved, so the holder is stale). The
//! new owner is blocked at most about `fence_wait` + `terminate_timeout`
//! per round, [`FENCE_ROUNDS`] rounds (3.3 s with the defaults; about
//! 0.2 s measured against a stopped holder). Ending another session needs the
//! same role, membership in `pg_signal_backend`, or a superuser; where the
//! role has no such right, the claim waits up to
//! [`PostgresObjectOptions::lock_timeout`] per round, as on SQLite, and
//! fails with the retryable `OwnerRace` if the holder still holds it.
//!
//! # Administration
//!
//! [`PostgresObjects::list_objects`] pages the recorded object ids by
//! prefix in byte order; [`PostgresObjects::delete_object`] deletes one
//! object (its rows in every shared `durability_object_*` table, its own
//! schema, its record) in one transaction behind the object row lock, so a
//! storage opened on it before fails every later transaction until it is
//! opened again. A storage id's tombstone (`durability_tombstones`:
//! [`PostgresObjects::write_tombstone`], [`PostgresObjects::tombstone`])
//! is what the host writes before it deletes a storage id. Inside a
//! transaction, [`PostgresObjectTx::due_capabilities`] lists the
//! capabilities with a due time and
//! [`PostgresObjectTx::drop_own_schema_objects`] drops one page of the
//! object's own relations.
//! [`PostgresObjectTx::export_image`] reads the object as a portable
//! image (`durability_scheduler::image`) and
//! [`PostgresObjects::import_image`] writes one in a single transaction
//! (module [`image`]: what is carried, what refuses the export).
//!
//! # Failures
//!
//! A commit is durable as PostgreSQL makes it (`synchronous_commit`, and a
//! synchronous standby where one is configured).
//! A statement's failure is a `Backend` error (the transaction is rolled
//! back). A `COMMIT` that the live session refused with an `ERROR` is
//! `Backend`; a `COMMIT` whose reply never came (connection lost,
//! unreadable reply) or came as `FATAL` (a session terminated while it
//! commits may have written its commit record first) is `Unknown`, never
//! a definite failure; so is a `COMMIT` with no reply within
//! [`PostgresObjectOptions::commit_timeout`] (a synchronous standby that
//! never answers; its connection is closed, no cancel is sent). Stored rows are decoded strictly;
//! a corrupt outbox row is a typed `Corrupt` row, quarantined and
//! deletable as on SQLite. The deployment schema name is validated
//! ([`MAX_DEPLOYMENT_NAME_BYTES`], `[a-z_][a-z0-9_]*`) and quoted; every
//! other name is a bound parameter.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use durability_scheduler::{ObjectContext, ObjectId, Scheduler};
//! use durability_storage_postgres::object::{PostgresObjectOptions, PostgresObjects};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let objects = PostgresObjects::connect(
//!     "postgres://postgres@127.0.0.1/app",
//!     "shop_objects",
//!     PostgresObjectOptions::default(),
//! )?;
//! let storage = Arc::new(objects.open("shop-1")?);
//! let scheduler = Scheduler::new(ObjectContext::new(ObjectId::new("shop-1")?, storage))?;
//! scheduler.transaction(|tx| {
//!     tx.sql().batch_execute("CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY)")?;
//!     tx.sql().execute("INSERT INTO orders (id) VALUES ($1)", &[&7_i64])?;
//!     tx.set_due("reports", Some(60_000))
//! })?;
//! # Ok(())
//! # }
//! ```

mod admin;
mod alarms;
mod commit;
mod driver;
mod fence;
mod idempotency;
pub mod image;
mod outbox;
mod rows;
mod runtime;
mod schema;
mod topology;
mod tx;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use durability_scheduler::{Direction, SchemaStep, Storage, StorageError, StorageErrorKind};

pub use admin::PgTombstone;
pub use idempotency::IDEMPOTENCY_TABLE;
pub use schema::{MAX_DEPLOYMENT_NAME_BYTES, PostgresSchemaStep};
pub use tx::{PostgresObjectTx, Sql};

use runtime::{Backend, blocking, wait};
#[cfg(feature = "testkit")]
pub use runtime::{handed_off_waits, parked_waits};

/// The advisory lock key of a storage id's tombstone: taken exclusively by
/// the tombstone write and shared by a first object record.
fn tombstone_lock_key(storage_id: &str) -> String {
    format!("durability_tombstone:{storage_id}")
}
use schema::{BUILTINS, Deployment, StepSql};

/// How many rounds `fence_claim` waits for (and ends) a holder before it
/// gives up with `OwnerRace`.
pub const FENCE_ROUNDS: u32 = 3;

/// [`PostgresObjectOptions::commit_timeout`]'s default.
pub const DEFAULT_COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Options of a [`PostgresObjects`] deployment.
#[derive(Debug, Clone, Copy)]
pub struct PostgresObjectOptions {
    /// Connections in the pool (a transaction holds one); default 8.
    pub pool_size: usize,
    /// How long a transaction waits for another writer of the same object
    /// (the object row lock) before failing, retryably; default 1 s, as
    /// SQLite's busy timeout. It is the transaction's `lock_timeout`, so it
    /// also bounds every other lock wait of the object code's statements.
    pub lock_timeout: Duration,
    /// How long a new owner's `fence_claim` waits for the holder of the
    /// object row before ending the holder's session; default 100 ms.
    pub fence_wait: Duration,
    /// How long `fence_claim` waits for an ended session to exit; default
    /// 1 s.
    pub terminate_timeout: Duration,
    /// How long a transaction waits for a pooled connection, and for a new
    /// connection to be made, before failing (retryably); default 5 s.
    pub connect_timeout: Duration,
    /// How long a transaction waits for its `COMMIT`'s reply; default
    /// 10 s. Past it the outcome is `Unknown` (the server may still
    /// commit) and the connection is closed: a synchronous standby that is
    /// gone otherwise makes every commit wait forever (module `commit`).
    pub commit_timeout: Duration,
}

impl Default for PostgresObjectOptions {
    fn default() -> Self {
        Self {
            pool_size: 8,
            lock_timeout: Duration::from_secs(1),
            fence_wait: Duration::from_millis(100),
            terminate_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            commit_timeout: DEFAULT_COMMIT_TIMEOUT,
        }
    }
}

type Schemas = BTreeMap<String, (&'static [SchemaStep], Vec<StepSql>)>;

/// What every object of a deployment shares.
#[derive(Debug)]
struct Shared {
    backend: Backend,
    deployment: Deployment,
    /// The quoted deployment schema.
    s: String,
    options: PostgresObjectOptions,
}

/// One deployment of objects on a PostgreSQL database: its shared tables,
/// its connections, and the schemas registered for application
/// capabilities.
#[derive(Debug, Clone)]
pub struct PostgresObjects {
    shared: Arc<Shared>,
    schemas: Arc<Schemas>,
}

fn builtin_schemas() -> Schemas {
    BUILTINS
        .iter()
        .map(|(name, steps, sql)| {
            let sql = sql
                .iter()
                .map(|(up, down)| StepSql::Shared { up, down })
                .collect();
            ((*name).to_owned(), (*steps, sql))
        })
        .collect()
}

impl PostgresObjects {
    /// Connects to the database at `url` and installs (idempotently) the
    /// deployment schema `deployment` and its shared tables. Safe to run
    /// from several processes at once.
    ///
    /// # Errors
    /// An invalid URL or schema name (nothing is written), or a backend
    /// failure.
    pub fn connect(
        url: &str,
        deployment: &str,
        options: PostgresObjectOptions,
    ) -> Result<Self, StorageError> {
        let deployment = Deployment::new(deployment)?;
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StorageError::backend("parse the PostgreSQL URL", e))?;
        let backend = Backend::new(config, options.pool_size, options.connect_timeout)?;
        let s = deployment.quoted();
        let this = Self {
            shared: Arc::new(Shared {
                backend,
                deployment,
                s,
                options,
            }),
            schemas: Arc::new(builtin_schemas()),
        };
        blocking(|| this.install())?;
        Ok(this)
    }

    /// The SQL that [`PostgresObjects::connect`] runs to install the
    /// deployment `deployment`, for teams that run migrations themselves.
    ///
    /// # Errors
    /// An invalid schema name.
    pub fn install_sql(deployment: &str) -> Result<String, StorageError> {
        Ok(schema::INSTALL.replace("{s}", &Deployment::new(deployment)?.quoted()))
    }

    fn install(&self) -> Result<(), StorageError> {
        let client = self.shared.backend.client()?;
        // Installed already (a host joining a running deployment): no DDL,
        // so no lock is taken on a table live objects write.
        let relations = schema::install_relations();
        let present: i64 = wait(client.query_one(
            "SELECT count(DISTINCT c.relname) FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = ANY($2)",
            &[&self.shared.deployment.name(), &relations],
        ))
        .and_then(|row| row.try_get(0))
        .map_err(|e| StorageError::backend("read the installed object tables", e))?;
        if usize::try_from(present).is_ok_and(|n| n == relations.len()) {
            return Ok(());
        }
        // One installer at a time: concurrent `CREATE … IF NOT EXISTS`
        // can collide in the catalog.
        let sql = format!(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtext('durability_objects:' || {lit})); {} COMMIT;",
            schema::INSTALL.replace("{s}", &self.shared.s),
            lit = literal(&self.shared.s),
        );
        let done = wait(client.batch_execute(&sql));
        if done.is_err() {
            // Leave no half-open transaction in the pool.
            drop(deadpool_postgres::Object::take(client));
        }
        done.map_err(|e| StorageError::backend("install the object tables", e))
    }

    /// Registers schema steps for an application capability (its own
    /// tables, in each object's schema), applied by the scheduler on attach
    /// and by `migrate`. Objects opened afterwards see it.
    ///
    /// # Errors
    /// A backend error when the lists disagree or the name is taken.
    pub fn register_schema(
        &mut self,
        capability: &str,
        steps: &'static [SchemaStep],
        sql: &'static [PostgresSchemaStep],
    ) -> Result<(), StorageError> {
        durability_scheduler::check_schema_steps(capability, steps, sql.iter().map(|s| s.step))?;
        if self.schemas.contains_key(capability) {
            return Err(StorageError::new(
                StorageErrorKind::Backend,
                format!("a schema for {capability} is already registered"),
            ));
        }
        let own = sql.iter().map(StepSql::Own).collect();
        Arc::make_mut(&mut self.schemas).insert(capability.to_owned(), (steps, own));
        Ok(())
    }

    /// The storage of the object `object_id`: records the object on first
    /// open (its own schema is created lazily, by its first transaction
    /// that uses [`PostgresObjectTx::sql`]).
    ///
    /// # Errors
    /// An invalid id (empty, over `MAX_OBJECT_ID_BYTES`, holding NUL: nothing
    /// is written), or a backend failure.
    pub fn open(&self, object_id: &str) -> Result<PostgresObjectStorage, StorageError> {
        durability_scheduler::ObjectId::new(object_id)
            .map_err(|e| StorageError::new(StorageErrorKind::Backend, e.to_string()))?;
        let seq = blocking(|| self.record(object_id, None))?
            .ok_or_else(|| StorageError::corrupt("an unguarded record found a tombstone"))?;
        Ok(self.storage_of(object_id, seq))
    }

    /// The storage handle of recorded object `object_id`, number `seq`.
    fn storage_of(&self, object_id: &str, seq: i64) -> PostgresObjectStorage {
        PostgresObjectStorage {
            shared: Arc::clone(&self.shared),
            schemas: Arc::clone(&self.schemas),
            object: object_id.to_owned(),
            own_schema: self.shared.deployment.object_schema(seq),
            own_ready: AtomicBool::new(false),
            serial: Mutex::new(()),
            fence: Mutex::new(None),
        }
    }

    /// The storage of the object `object_id` of storage id `storage_id`,
    /// or `None` when that storage id's tombstone exists and the object is
    /// not recorded. A first record is inserted only in a transaction
    /// that holds the storage id's tombstone lock shared
    /// ([`PostgresObjects::write_tombstone`] takes it exclusively) and
    /// found no tombstone, so it is either committed before the tombstone
    /// (and a deletion listing after the tombstone finds it) or refused.
    ///
    /// # Errors
    /// As [`PostgresObjects::open`].
    pub fn open_unless_tombstoned(
        &self,
        object_id: &str,
        storage_id: &str,
    ) -> Result<Option<PostgresObjectStorage>, StorageError> {
        durability_scheduler::ObjectId::new(object_id)
            .map_err(|e| StorageError::new(StorageErrorKind::Backend, e.to_string()))?;
        let Some(seq) = blocking(|| self.record(object_id, Some(storage_id)))? else {
            return Ok(None);
        };
        Ok(Some(self.storage_of(object_id, seq)))
    }

    /// The object's number: read when recorded, else recorded (its own
    /// schema is made by its first transaction that uses its own tables).
    /// With `guard` (a storage id), the first record is inserted only under
    /// that storage id's tombstone lock, shared, and only when no tombstone
    /// exists (`None` then; see [`Self::open_unless_tombstoned`]).
    fn record(&self, object_id: &str, guard: Option<&str>) -> Result<Option<i64>, StorageError> {
        let s = &self.shared.s;
        let fail = |what: &'static str| move |e| StorageError::backend(what, e);
        let read = format!("SELECT seq FROM {s}.durability_objects WHERE id = $1");
        let held = driver::Held(Some(self.shared.backend.client()?));
        let client = held.client();
        let seq_of =
            |row: &tokio_postgres::Row| row.try_get(0).map_err(fail("read the object number"));
        if let Some(row) =
            wait(client.query_opt(&read, &[&object_id])).map_err(fail("read the object"))?
        {
            let seq = seq_of(&row)?;
            held.release();
            return Ok(Some(seq));
        }
        // On an error `held` is dropped: the connection closes and the
        // server rolls the transaction back.
        wait(client.batch_execute("BEGIN")).map_err(fail("begin the record"))?;
        let tombstoned = match guard {
            None => false,
            Some(storage_id) => {
                wait(client.execute(
                    "SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))",
                    &[&tombstone_lock_key(storage_id)],
                ))
                .map_err(fail("take the tombstone lock"))?;
                wait(client.query_opt(
                    &format!("SELECT 1 FROM {s}.durability_tombstones WHERE storage_id = $1"),
                    &[&storage_id],
                ))
                .map_err(fail("read the tombstone"))?
                .is_some()
            }
        };
        let seq = if tombstoned {
            None
        } else {
            let insert = format!(
                "INSERT INTO {s}.durability_objects (id) VALUES ($1)
                 ON CONFLICT (id) DO NOTHING RETURNING seq"
            );
            let row = match wait(client.query_opt(&insert, &[&object_id]))
                .map_err(fail("record the object"))?
            {
                Some(row) => row,
                // Another process recorded it first.
                None => {
                    wait(client.query_one(&read, &[&object_id])).map_err(fail("read the object"))?
                }
            };
            Some(seq_of(&row)?)
        };
        commit::commit(client, self.shared.options.commit_timeout)?;
        held.release();
        Ok(seq)
    }

    /// How many objects the deployment holds.
    ///
    /// # Errors
    /// A backend failure.
    pub fn object_count(&self) -> Result<u64, StorageError> {
        let client = blocking(|| self.shared.backend.client())?;
        let s = &self.shared.s;
        let row = blocking(|| {
            wait(client.query_one(&format!("SELECT count(*) FROM {s}.durability_objects"), &[]))
        })
        .map_err(|e| StorageError::backend("count objects", e))?;
        let n: i64 = row
            .try_get(0)
            .map_err(|e| StorageError::backend("count objects", e))?;
        Ok(n.unsigned_abs())
    }
}

/// `s` as a SQL string literal.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The claim a fenced storage checks after `BEGIN`, and the lease budget it
/// checks right before `COMMIT`.
type Fence = (
    durability_ownership::OwnerRecord,
    Option<Arc<dyn durability_ownership::BudgetCheck>>,
);

/// One object's storage on PostgreSQL (see the [module docs](self)).
pub struct PostgresObjectStorage {
    shared: Arc<Shared>,
    schemas: Arc<Schemas>,
    object: String,
    own_schema: String,
    /// Whether the object's own schema is known to exist.
    own_ready: AtomicBool,
    /// This handle's transactions run one at a time (as on SQLite).
    serial: Mutex<()>,
    fence: Mutex<Option<Fence>>,
}

durability_time::debug_fields!(PostgresObjectStorage { object, own_schema });

impl PostgresObjectStorage {
    /// The object's id.
    pub fn object_id(&self) -> &str {
        &self.object
    }

    /// The quoted name of the object's own schema.
    pub fn own_schema(&self) -> &str {
        &self.own_schema
    }
}

impl Storage for PostgresObjectStorage {
    type Tx<'t> = PostgresObjectTx<'t>;

    fn transaction<R, E>(
        &self,
        f: impl FnOnce(&mut PostgresObjectTx<'_>) -> Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<StorageError>,
    {
        // The wait for this handle's transaction in progress is a
        // blocking wait too: on a tokio worker it must not keep the worker
        // (with its queued tasks) while it waits.
        blocking(|| {
            let _serial = self.serial.lock().unwrap_or_else(PoisonError::into_inner);
            let fence = self
                .fence
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            self.run(fence, f)
        })
    }

    fn schema(&self, capability: &str) -> &'static [SchemaStep] {
        self.schemas.get(capability).map_or(&[], |(steps, _)| steps)
    }

    fn apply_schema_step(
        &self,
        tx: &mut PostgresObjectTx<'_>,
        capability: &str,
        version: u32,
        direction: Direction,
    ) -> Result<(), StorageError> {
        let step = self
            .schemas
            .get(capability)
            .and_then(|(steps, sql)| {
                let i = steps.iter().position(|s| s.version == version)?;
                sql.get(i).copied()
            })
            .ok_or_else(|| {
                StorageError::new(
                    StorageErrorKind::Backend,
                    format!("no schema step {version} for {capability}"),
                )
            })?;
        match (step, direction) {
            (StepSql::Own(own), Direction::Up) => tx.batch("apply schema step", own.up),
            (StepSql::Own(own), Direction::Down) => tx.batch("revert schema step", own.down),
            (StepSql::Shared { up, down }, direction) => {
                let list = if direction == Direction::Up { up } else { down };
                for template in list {
                    tx.exec("apply schema step", template, &[])?;
                }
                Ok(())
            }
        }
    }
}
