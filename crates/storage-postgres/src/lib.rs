//! PostgreSQL shards, mapping store and allocation ledger for `durability-migration`.
//!
//! [`PostgresShard`] is one PostgreSQL database (or schema) holding keyed
//! tables: it speaks [`Dialect::Postgres`], declares an atomic batch (one
//! transaction that rolls the whole group back when one statement fails) and
//! uses a connection pool (`deadpool-postgres`), so it is not a
//! single-connection adapter. [`PostgresMappingStore`] keeps key → shard
//! mappings in a `durability_mapping` table, and [`PostgresLedger`] is the
//! coordinator's allocation ledger (`durability_allocations`).
//!
//! Isolation: every connection of a shard runs at `SERIALIZABLE`
//! (`default_transaction_isolation`), single statements and batches alike.
//! Under `READ COMMITTED` a cutover batch and a concurrent routed insert can
//! both pass their `NOT EXISTS` predicates (each misses the other's
//! uncommitted row), leaving a live row behind a tombstone; serializable
//! snapshot isolation refuses one of them. A serialization failure or
//! deadlock (SQLSTATE `40001`, `40P01`) applied nothing, so the shard retries
//! the statement or the whole batch, up to [`MAX_ATTEMPTS`] times, pausing
//! [`RETRY_BACKOFF`] between attempts (immediate retries of one hot row can
//! keep losing to the same writers). Refusals are definite and typed: a
//! unique violation (`23505`) is a `UniqueViolation`; any other integrity
//! violation (class `23`), a data exception (class `22`) or a value its
//! parameter's type cannot hold (refused before anything is sent) a
//! `DataRejected`, naming the table and column the server's error names.
//!
//! Values are always bound parameters. A value is encoded for the type the
//! server inferred for its placeholder: integers bind to `BIGINT`,
//! `INTEGER`, `SMALLINT`, floating point and `BOOLEAN` (0/1) parameters,
//! floats to floating point, text to text-like types, bytes to `BYTEA`, and
//! `NULL` to anything. Reads map integer and boolean columns to
//! [`Value::Integer`], floating point to [`Value::Real`], text-like columns
//! (and domains over them) to [`Value::Text`] and `BYTEA` to [`Value::Blob`];
//! any other column type is an error, never a silent conversion.
//!
//! Beyond migration, the crate holds the stores a cluster of hosts shares
//! on PostgreSQL alone, each in a schema the caller chooses
//! ([`SchemaName`]: validated, always quoted) and created by one documented
//! call whose SQL is printable:
//!
//! - `ownership::PostgresLeaseStore` (feature `ownership`): owner leases with
//!   monotonic generations, the storage pointer and delete lock, renew by
//!   compare-and-swap on the exact owner record, the generation floor, lease
//!   time from the server's `clock_timestamp()`; a whole class claimed
//!   (`claim_many`) or renewed (`renew_many`) in one round trip.
//! - `alarms::PostgresAlarmIndex` (feature `alarms`): the alarm job index,
//!   claims with `FOR UPDATE SKIP LOCKED` so many hosts' dispatchers never
//!   deliver a job twice, leases on server time, corrupt jobs quarantined.
//! - [`object`] (feature `object`): object storage on PostgreSQL (the
//!   scheduler's `Storage` and every object-level capability's transaction
//!   trait, fenced inside the commit).
//! - [`outbox`] (feature `outbox`): the outbox in your own PostgreSQL
//!   transaction (`PgOutbox`, `PgDeliverer`); feature `sqlx` lets it stage
//!   in a sqlx transaction too.
//!
//! Features: `default` = `ownership` + `alarms` + `object` + `outbox`;
//! `testkit` adds `testkit::TestSchema`, a throwaway schema on a real server
//! for tests.
//!
//! # Example: leases and alarm jobs on PostgreSQL
//!
//! (Compiled, not run: it needs a server.)
//!
//! ```no_run
//! # #[cfg(all(feature = "ownership", feature = "alarms"))]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use durability_ownership::{Claimant, ClassName, LifecycleAdmin, LifecycleId, OwnerScope, ShardCount, StorageId, TaskId};
//! use durability_storage_postgres::alarms::{IndexTime, PostgresAlarmIndex};
//! use durability_storage_postgres::ownership::PostgresLeaseStore;
//!
//! let url = "postgres://postgres@127.0.0.1:5432/app";
//! let leases = PostgresLeaseStore::connect(url, "durability", ShardCount::default())?;
//! leases.setup().await?; // once per schema; PostgresLeaseStore::setup_sql prints it
//! let index = PostgresAlarmIndex::connect(url, "durability", IndexTime::Server)?;
//! index.setup().await?;
//!
//! let lifecycle = LifecycleId::new("ns:shop")?;
//! let storage = StorageId::new("st1")?;
//! leases.set_active_storage(&lifecycle, Some(&storage)).await?;
//! // After a failover: claim every shard of a class in one round trip.
//! let class: Vec<OwnerScope> = (0..16)
//!     .map(|n| OwnerScope::new(storage.clone(), ClassName::new("Cart")?, n, ShardCount::default()))
//!     .collect::<Result<_, _>>()?;
//! let claims = leases
//!     .claim_many(&class, Claimant::new(&lifecycle, &TaskId::new("host-a")?, 120_000))
//!     .await;
//! # let _ = claims;
//! # Ok(())
//! # }
//! ```
//!
//! # Example
//!
//! A router with one PostgreSQL shard (compiled, not run: it needs a server;
//! production keeps its mappings in a persistent mapping store):
//!
//! ```no_run
//! use std::sync::Arc;
//! use durability_migration::{MemoryMappingStore, MigrationConfig, Router, row};
//! use durability_storage_postgres::PostgresShard;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let east = PostgresShard::connect("postgres://postgres@127.0.0.1/test", Some("east")).await?;
//! east.batch_execute("CREATE TABLE IF NOT EXISTS users (id TEXT PRIMARY KEY, name TEXT)").await?;
//! let router = Router::new(
//!     MigrationConfig::new(Arc::new(MemoryMappingStore::new()))
//!         .shard("east", Arc::new(east))
//!         .journal_shard("east")
//!         .table("users"),
//! )?;
//! router.init().await?;
//! router.insert("user-1", "users", row([("name", "Ann")])).await?;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

use std::error::Error as StdError;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use durability_migration::{
    BackendError, BatchSupport, BoxFuture, DataRejected, Dialect, Row, Shard, ShardMappingStore,
    Statement, UniqueViolation, Value,
};
use durability_time::{Backoff, Jitter, Random, SystemClock};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{FromSql, Kind, ToSql, Type};
use tokio_postgres::{Config, NoTls};

/// How many times a statement or batch that failed with a serialization
/// failure or a deadlock is tried in all.
pub const MAX_ATTEMPTS: usize = 32;

/// The pause between two attempts after a serialization failure or
/// deadlock: 1 ms doubling to 50 ms, fully jittered (a factor drawn from
/// `[0, 1)`), so contending transactions spread out instead of colliding
/// again in lockstep.
pub const RETRY_BACKOFF: Backoff = Backoff::new(1, 50).jitter(Jitter::Under(1.0));

/// Waits before attempt `attempt + 1` (the first retry waits after attempt 1).
async fn pause(attempt: usize) {
    let tries = u32::try_from(attempt).unwrap_or(u32::MAX);
    RETRY_BACKOFF.wait(&SystemClock, tries, &Random::os()).await;
}

/// Default pool size of [`PostgresShard::connect`].
pub const DEFAULT_POOL_SIZE: usize = 8;

/// A PostgreSQL connection pool whose connections run at `SERIALIZABLE`.
fn pool(config: Config, size: usize) -> Result<Pool, BackendError> {
    Ok(pool_with(
        config,
        &["default_transaction_isolation=serializable"],
        size,
    )?)
}

/// A pool of at most `size` connections from `config`, each with the
/// server settings `settings` (`name=value` each) added to its options.
fn pool_with(
    mut config: Config,
    settings: &[&str],
    size: usize,
) -> Result<Pool, deadpool_postgres::BuildError> {
    let mut opts = config.get_options().unwrap_or_default().to_owned();
    for setting in settings {
        if !opts.is_empty() {
            opts.push(' ');
        }
        opts.push_str("-c ");
        opts.push_str(setting);
    }
    config.options(opts);
    let mgr = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(mgr).max_size(size.max(1)).build()
}

/// Parses a `postgres://` URL and sets the schema search path, when given.
///
/// # Errors
/// The parse error of a malformed URL.
pub fn config_for(url: &str, schema: Option<&str>) -> Result<Config, BackendError> {
    let mut config: Config = url.parse()?;
    if let Some(s) = schema {
        let path = format!("-c search_path={s}");
        let opts = match config.get_options() {
            Some(o) if !o.is_empty() => format!("{o} {path}"),
            _ => path,
        };
        config.options(opts);
    }
    Ok(config)
}

fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    )
}

fn text_like(ty: &Type) -> bool {
    matches!(
        *ty,
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN
    ) || ty.name() == "citext"
}

type Param = Box<dyn ToSql + Sync + Send>;

fn mismatch(v: &Value, ty: &Type) -> BackendError {
    let kind = match v {
        Value::Null => "null",
        Value::Integer(_) => "an integer",
        Value::Real(_) => "a real",
        Value::Text(_) => "text",
        Value::Blob(_) => "a blob",
    };
    format!("cannot bind {kind} to a parameter of type {ty}").into()
}

/// The Rust value to bind `v` as, for a parameter of type `ty`.
fn param(v: &Value, ty: &Type) -> Result<Param, BackendError> {
    if let Kind::Domain(inner) = ty.kind() {
        return param(v, inner);
    }
    Ok(match (v, ty) {
        (Value::Null, &Type::INT8) => Box::new(None::<i64>),
        (Value::Null, &Type::INT4) => Box::new(None::<i32>),
        (Value::Null, &Type::INT2) => Box::new(None::<i16>),
        (Value::Null, &Type::FLOAT8) => Box::new(None::<f64>),
        (Value::Null, &Type::FLOAT4) => Box::new(None::<f32>),
        (Value::Null, &Type::BOOL) => Box::new(None::<bool>),
        (Value::Null, &Type::BYTEA) => Box::new(None::<Vec<u8>>),
        (Value::Null, t) if text_like(t) => Box::new(None::<String>),
        (Value::Integer(i), &Type::INT8) => Box::new(*i),
        (Value::Integer(i), &Type::INT4) => Box::new(i32::try_from(*i)?),
        (Value::Integer(i), &Type::INT2) => Box::new(i16::try_from(*i)?),
        #[allow(clippy::cast_precision_loss)]
        (Value::Integer(i), &Type::FLOAT8) => Box::new(*i as f64),
        (Value::Integer(i), &Type::BOOL) if *i == 0 || *i == 1 => Box::new(*i == 1),
        (Value::Real(f), &Type::FLOAT8) => Box::new(*f),
        #[allow(clippy::cast_possible_truncation)]
        (Value::Real(f), &Type::FLOAT4) => Box::new(*f as f32),
        (Value::Text(s), t) if text_like(t) => Box::new(s.clone()),
        (Value::Blob(b), &Type::BYTEA) => Box::new(b.clone()),
        _ => return Err(mismatch(v, ty)),
    })
}

/// A column value read from a row.
struct PgValue(Value);

impl PgValue {
    fn decode(ty: &Type, raw: &[u8]) -> Result<Value, Box<dyn StdError + Sync + Send>> {
        if let Kind::Domain(inner) = ty.kind() {
            return Self::decode(inner, raw);
        }
        Ok(match *ty {
            Type::INT8 => Value::Integer(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Integer(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => Value::Integer(i16::from_sql(ty, raw)?.into()),
            Type::BOOL => Value::Integer(bool::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Real(f32::from_sql(ty, raw)?.into()),
            Type::BYTEA => Value::Blob(<Vec<u8>>::from_sql(ty, raw)?),
            ref t if text_like(t) => Value::Text(String::from_sql(&Type::TEXT, raw)?),
            ref t => return Err(format!("unsupported column type {t}").into()),
        })
    }
}

impl<'a> FromSql<'a> for PgValue {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn StdError + Sync + Send>> {
        Ok(Self(Self::decode(ty, raw)?))
    }
    fn from_sql_null(_: &Type) -> Result<Self, Box<dyn StdError + Sync + Send>> {
        Ok(Self(Value::Null))
    }
    fn accepts(_: &Type) -> bool {
        true
    }
}

/// Prepares `st` and binds its values for the inferred parameter types.
async fn prepare<C: GenericClient>(
    c: &C,
    st: &Statement,
) -> Result<(tokio_postgres::Statement, Vec<Param>), BackendError> {
    let prepared = c.prepare_cached(&st.sql).await?;
    if prepared.params().len() != st.params.len() {
        return Err(format!(
            "statement has {} placeholders but {} values",
            prepared.params().len(),
            st.params.len()
        )
        .into());
    }
    // A value the parameter's type cannot hold is refused before anything
    // is sent: a definite rejection.
    let params = st
        .params
        .iter()
        .zip(prepared.params())
        .map(|(v, ty)| param(v, ty).map_err(|source| DataRejected::boxed(None, None, source)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((prepared, params))
}

fn refs(params: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

/// The outcome of one try: a retryable failure, or a final result.
enum Attempt<T> {
    Retry(tokio_postgres::Error),
    Done(Result<T, BackendError>),
}

/// A driver error as a backend error: a unique violation (SQLSTATE
/// `23505`) is wrapped in [`UniqueViolation`], any other integrity
/// constraint violation (class `23`: NOT NULL, CHECK, foreign key,
/// exclusion) and any data exception (class `22`: a value too long for its
/// column, out of range, not valid for its type) in [`DataRejected`],
/// naming the table and column when the server's error does. All of them
/// are definite rejections: the server refused the statement, and a batch's
/// transaction rolls back.
fn backend(e: tokio_postgres::Error) -> BackendError {
    if e.code() == Some(&SqlState::UNIQUE_VIOLATION) {
        return Box::new(UniqueViolation(Box::new(e)));
    }
    let Some(db) = e.as_db_error() else {
        return Box::new(e);
    };
    let class = db.code().code().get(..2);
    if matches!(class, Some("22" | "23")) {
        let (table, column) = (
            db.table().map(str::to_owned),
            db.column().map(str::to_owned),
        );
        return DataRejected::boxed(table, column, e);
    }
    Box::new(e)
}

fn classify<T>(r: Result<T, tokio_postgres::Error>) -> Attempt<T> {
    match r {
        Err(e) if is_retryable(&e) => Attempt::Retry(e),
        Err(e) => Attempt::Done(Err(backend(e))),
        Ok(v) => Attempt::Done(Ok(v)),
    }
}

async fn exec_once<C: GenericClient>(c: &C, st: &Statement) -> Attempt<u64> {
    let (prepared, params) = match prepare(c, st).await {
        Ok(p) => p,
        Err(e) => return Attempt::Done(Err(e)),
    };
    classify(c.execute(&prepared, &refs(&params)).await)
}

async fn query_once<C: GenericClient>(c: &C, st: &Statement) -> Attempt<Vec<Row>> {
    let (prepared, params) = match prepare(c, st).await {
        Ok(p) => p,
        Err(e) => return Attempt::Done(Err(e)),
    };
    let rows = match c.query(&prepared, &refs(&params)).await {
        Ok(r) => r,
        Err(e) if is_retryable(&e) => return Attempt::Retry(e),
        Err(e) => return Attempt::Done(Err(backend(e))),
    };
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let mut row = Row::new();
        for (i, col) in r.columns().iter().enumerate() {
            match r.try_get::<_, PgValue>(i) {
                Ok(v) => {
                    row.insert(col.name().to_owned(), v.0);
                }
                Err(e) => return Attempt::Done(Err(e.into())),
            }
        }
        out.push(row);
    }
    Attempt::Done(Ok(out))
}

/// One try of an atomic batch: once the statements are prepared (cached
/// per connection), `BEGIN`, every statement and `COMMIT` pipelined, sent
/// without waiting for each other's replies (one round trip). The server
/// runs them in order; when a statement fails, the transaction is aborted,
/// every later statement fails, and the pipelined `COMMIT` rolls back. The
/// first failure in order is the batch's error. `BEGIN` cannot fail on its
/// own on a live connection (it fails only in an aborted transaction, where
/// every later statement fails too, and a dead connection fails them all);
/// should it fail while a statement succeeded, the batch's error says that
/// its outcome is unknown.
async fn batch_once(client: &mut Object, stmts: &[Statement]) -> Attempt<Vec<u64>> {
    let c: &Object = client;
    let mut prepared = Vec::with_capacity(stmts.len());
    for st in stmts {
        match prepare(c, st).await {
            Ok(p) => prepared.push(p),
            Err(e) => return Attempt::Done(Err(e)),
        }
    }
    let bound: Vec<Vec<&(dyn ToSql + Sync)>> =
        prepared.iter().map(|(_, params)| refs(params)).collect();
    // `join!` polls in order, so the requests go out in this order.
    let (begin, results, commit) = futures::join!(
        c.batch_execute("BEGIN"),
        futures::future::join_all(
            prepared
                .iter()
                .zip(&bound)
                .map(|((st, _), params)| c.execute(st, params))
        ),
        c.batch_execute("COMMIT"),
    );
    if let Err(e) = begin {
        if results.iter().any(Result::is_ok) {
            return Attempt::Done(Err(format!(
                "BEGIN failed ({e}) but a statement of the batch ran: outcome unknown"
            )
            .into()));
        }
        return classify(Err(e));
    }
    let mut counts = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Ok(n) => counts.push(n),
            // The pipelined COMMIT rolled the aborted transaction back.
            Err(e) => return classify(Err(e)),
        }
    }
    classify(commit.map(|()| counts))
}

/// One PostgreSQL database (the schema of its connections' search path) as
/// a migration shard.
#[derive(Clone)]
pub struct PostgresShard {
    pool: Pool,
}

durability_time::debug_fields!(PostgresShard {});

impl PostgresShard {
    /// A shard over a pool of at most `pool_size` connections made from
    /// `config` (see [`config_for`] for a URL and a schema). Connections are
    /// opened lazily, on first use.
    ///
    /// # Errors
    /// A pool configuration error.
    pub fn new(config: Config, pool_size: usize) -> Result<Self, BackendError> {
        Ok(Self {
            pool: pool(config, pool_size)?,
        })
    }

    /// A shard at `url` whose statements run in `schema` (the default search
    /// path when `None`), with [`DEFAULT_POOL_SIZE`] connections, checked by
    /// one round trip.
    ///
    /// # Errors
    /// A malformed URL or a server that cannot be reached.
    pub async fn connect(url: &str, schema: Option<&str>) -> Result<Self, BackendError> {
        let shard = Self::new(config_for(url, schema)?, DEFAULT_POOL_SIZE)?;
        shard.pool.get().await?.simple_query("SELECT 1").await?;
        Ok(shard)
    }

    /// Runs semicolon-separated statements without parameters (setup, tests).
    ///
    /// # Errors
    /// The server's error.
    pub async fn batch_execute(&self, sql: &str) -> Result<(), BackendError> {
        self.pool.get().await?.batch_execute(sql).await?;
        Ok(())
    }

    /// Runs `once` on a pooled connection (a fresh one per attempt, given
    /// back before the pause) until it is done: a serialization failure or
    /// deadlock is retried up to `MAX_ATTEMPTS` times with backoff.
    async fn retrying<T, F, Fut>(&self, mut once: F) -> Result<T, BackendError>
    where
        F: FnMut(Object) -> Fut,
        Fut: Future<Output = Attempt<T>>,
    {
        let mut last = None;
        for attempt in 1..=MAX_ATTEMPTS {
            match once(self.pool.get().await?).await {
                Attempt::Done(r) => return r,
                Attempt::Retry(e) => last = Some(retried(e)),
            }
            if attempt < MAX_ATTEMPTS {
                pause(attempt).await;
            }
        }
        Err(match last {
            Some(e) => e.into(),
            None => "no attempt made".into(),
        })
    }

    async fn execute_retrying(&self, stmt: &Statement) -> Result<u64, BackendError> {
        self.retrying(|c| async move { exec_once(&c, stmt).await })
            .await
    }

    async fn query_retrying(&self, stmt: &Statement) -> Result<Vec<Row>, BackendError> {
        self.retrying(|c| async move { query_once(&c, stmt).await })
            .await
    }

    async fn batch_retrying(&self, stmts: &[Statement]) -> Result<Vec<u64>, BackendError> {
        self.retrying(|mut c| async move { batch_once(&mut c, stmts).await })
            .await
    }
}

fn retried(e: tokio_postgres::Error) -> tokio_postgres::Error {
    tracing::debug!(
        event = "durability.storage_postgres.retry",
        error = %e,
        "retrying after a serialization failure or deadlock"
    );
    e
}

impl Shard for PostgresShard {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
    fn batch_support(&self) -> BatchSupport {
        BatchSupport::Atomic
    }
    fn execute<'a>(&'a self, stmt: &'a Statement) -> BoxFuture<'a, Result<u64, BackendError>> {
        Box::pin(self.execute_retrying(stmt))
    }
    fn query<'a>(&'a self, stmt: &'a Statement) -> BoxFuture<'a, Result<Vec<Row>, BackendError>> {
        Box::pin(self.query_retrying(stmt))
    }
    fn batch<'a>(
        &'a self,
        stmts: &'a [Statement],
    ) -> BoxFuture<'a, Result<Vec<u64>, BackendError>> {
        Box::pin(async move {
            match stmts {
                // One statement is atomic on its own: no BEGIN round trip.
                [one] => Ok(vec![self.execute_retrying(one).await?]),
                _ => self.batch_retrying(stmts).await,
            }
        })
    }
}

/// Key → shard mappings in a PostgreSQL table (`durability_mapping`, keys in
/// byte order: `COLLATE "C"`): the migration crate's [`ShardMappingStore`]
/// on a [`PostgresShard`]. `PostgresMappingStore::new(shard).await` creates
/// the table when missing.
pub type PostgresMappingStore = ShardMappingStore<PostgresShard>;

mod ledger;

#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub mod outbox;
pub use ledger::PostgresLedger;

#[cfg(any(feature = "ownership", feature = "alarms"))]
mod store_client;
#[cfg(any(feature = "ownership", feature = "alarms"))]
pub use store_client::{
    DEFAULT_CALL_TIMEOUT, DEFAULT_STORE_POOL_SIZE, InvalidSchemaName, MAX_SCHEMA_NAME_BYTES,
    SchemaName,
};

#[cfg(feature = "ownership")]
pub mod ownership;

#[cfg(feature = "alarms")]
pub mod alarms;

#[cfg(feature = "testkit")]
pub mod testkit;

#[cfg(feature = "object")]
pub mod object;

#[cfg(test)]
mod tests;

pub mod docs;
