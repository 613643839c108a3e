//! MariaDB/MySQL shards and mapping store for `durability-migration`.
//!
//! [`MysqlShard`] is one MariaDB (or MySQL) database holding keyed tables:
//! it speaks [`Dialect::MySql`], declares an atomic batch (one InnoDB
//! transaction that rolls the whole group back when one statement fails) and
//! uses a `mysql_async` connection pool, so it is not a single-connection
//! adapter. [`MysqlMappingStore`] keeps key → shard mappings in a
//! `durability_mapping` table.
//!
//! Sessions: every connection runs at `SERIALIZABLE` and with
//! `CLIENT_FOUND_ROWS`, so an `UPDATE` reports the rows it matched (what the
//! router counts), not only the rows whose values changed. A deadlock or a
//! lock wait timeout (server errors 1213, 1205) rolled the statement's
//! transaction back, so the shard retries the statement or the whole batch,
//! up to [`MAX_ATTEMPTS`] times.
//!
//! Values are always bound parameters (the binary protocol). Reads map
//! integer columns to [`Value::Integer`], `FLOAT`/`DOUBLE` to
//! [`Value::Real`], character columns to [`Value::Text`] and binary-charset
//! columns (`BLOB`, `VARBINARY`) to [`Value::Blob`]; any other value (dates,
//! decimals) is an error, never a silent conversion.
//!
//! Features: `testkit` adds `testkit::TestDatabase`, a throwaway database
//! on a real server for tests.
//!
//! # Example
//!
//! A router with one MariaDB shard (compiled, not run: it needs a server;
//! production keeps its mappings in a persistent mapping store):
//!
//! ```no_run
//! use std::sync::Arc;
//! use durability_migration::{MemoryMappingStore, MigrationConfig, Router, row};
//! use durability_storage_mysql::MysqlShard;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let east = MysqlShard::connect("mysql://root@127.0.0.1:3306/test").await?;
//! east.query_drop("CREATE TABLE IF NOT EXISTS users (id VARCHAR(255) PRIMARY KEY, name LONGTEXT)").await?;
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

use durability_migration::{
    BackendError, BatchSupport, BoxFuture, Dialect, Row, Shard, ShardMappingStore, Statement,
    UniqueViolation, Value,
};
use durability_time::{Backoff, Jitter, Random, SystemClock};
use mysql_async::consts::ColumnType;
use mysql_async::prelude::Queryable;
use mysql_async::{Opts, OptsBuilder, Params, Pool, TxOpts};

/// How many times a statement or batch that failed with a deadlock or a lock
/// wait timeout is tried in all.
pub const MAX_ATTEMPTS: usize = 32;

/// The pause between two attempts after a deadlock or lock-wait timeout:
/// 1 ms doubling to 50 ms, fully jittered (a factor drawn from `[0, 1)`), so
/// contending transactions spread out instead of colliding again in
/// lockstep.
pub const RETRY_BACKOFF: Backoff = Backoff::new(1, 50).jitter(Jitter::Under(1.0));

/// The binary character set: a column holding bytes, not text.
const BINARY_CHARSET: u16 = 63;

fn params(st: &Statement) -> Params {
    if st.params.is_empty() {
        return Params::Empty;
    }
    Params::Positional(
        st.params
            .iter()
            .map(|v| match v {
                Value::Null => mysql_async::Value::NULL,
                Value::Integer(i) => mysql_async::Value::Int(*i),
                Value::Real(f) => mysql_async::Value::Double(*f),
                Value::Text(s) => mysql_async::Value::Bytes(s.as_bytes().to_vec()),
                Value::Blob(b) => mysql_async::Value::Bytes(b.clone()),
            })
            .collect(),
    )
}

fn decode(col: &mysql_async::Column, v: mysql_async::Value) -> Result<Value, BackendError> {
    Ok(match v {
        mysql_async::Value::NULL => Value::Null,
        mysql_async::Value::Int(i) => Value::Integer(i),
        mysql_async::Value::UInt(u) => Value::Integer(i64::try_from(u)?),
        mysql_async::Value::Float(f) => Value::Real(f.into()),
        mysql_async::Value::Double(f) => Value::Real(f),
        mysql_async::Value::Bytes(b) => match col.column_type() {
            ColumnType::MYSQL_TYPE_VARCHAR
            | ColumnType::MYSQL_TYPE_VAR_STRING
            | ColumnType::MYSQL_TYPE_STRING
            | ColumnType::MYSQL_TYPE_TINY_BLOB
            | ColumnType::MYSQL_TYPE_MEDIUM_BLOB
            | ColumnType::MYSQL_TYPE_LONG_BLOB
            | ColumnType::MYSQL_TYPE_BLOB => {
                if col.character_set() == BINARY_CHARSET {
                    Value::Blob(b)
                } else {
                    Value::Text(String::from_utf8(b)?)
                }
            }
            t => {
                return Err(
                    format!("unsupported column type {t:?} of column {}", col.name_str()).into(),
                );
            }
        },
        other => {
            return Err(format!("unsupported value {other:?} of column {}", col.name_str()).into());
        }
    })
}

fn to_row(r: mysql_async::Row) -> Result<Row, BackendError> {
    let cols = r.columns();
    let values = r.unwrap();
    let mut row = Row::new();
    for (c, v) in cols.iter().zip(values) {
        row.insert(c.name_str().into_owned(), decode(c, v)?);
    }
    Ok(row)
}

fn is_retryable(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if s.code == 1213 || s.code == 1205)
}

/// The outcome of one try: a retryable failure, or a final result.
enum Attempt<T> {
    Retry(mysql_async::Error),
    Done(Result<T, BackendError>),
}

/// A driver error as a backend error: a duplicate entry (server error
/// 1062) is wrapped in [`UniqueViolation`] (a definite rejection).
fn backend(e: mysql_async::Error) -> BackendError {
    if matches!(&e, mysql_async::Error::Server(s) if s.code == 1062) {
        Box::new(UniqueViolation(Box::new(e)))
    } else {
        Box::new(e)
    }
}

fn classify<T>(r: Result<T, mysql_async::Error>) -> Attempt<T> {
    match r {
        Err(e) if is_retryable(&e) => Attempt::Retry(e),
        Err(e) => Attempt::Done(Err(backend(e))),
        Ok(v) => Attempt::Done(Ok(v)),
    }
}

async fn exec_on<Q: Queryable>(q: &mut Q, st: &Statement) -> Result<u64, mysql_async::Error> {
    let result = q.exec_iter(st.sql.as_str(), params(st)).await?;
    let n = result.affected_rows();
    result.drop_result().await?;
    Ok(n)
}

/// One MariaDB/MySQL database as a migration shard.
#[derive(Clone, Debug)]
pub struct MysqlShard {
    pool: Pool,
}

impl MysqlShard {
    /// A shard over a pool built from `opts`; sessions are set to
    /// `SERIALIZABLE` with `CLIENT_FOUND_ROWS` and `STRICT_ALL_TABLES`.
    /// Connections open lazily.
    pub fn new(opts: Opts) -> Self {
        let mut setup = opts.setup().to_vec();
        setup.push("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE".to_owned());
        // Strict mode: a value that does not fit its column is an error,
        // never a silent truncation (whatever the server's default).
        setup.push(
            "SET SESSION sql_mode = TRIM(BOTH ',' FROM CONCAT(@@SESSION.sql_mode, ',STRICT_ALL_TABLES'))"
                .to_owned(),
        );
        // No `COM_RESET_CONNECTION` when a connection returns to the pool:
        // it would drop the prepared-statement cache and re-run the setup
        // queries (three round trips per checkout). The shard leaves no
        // session state behind: every batch commits or rolls back, and a
        // connection that failed mid-way is discarded by the pool.
        let pool_opts = opts.pool_opts().clone().with_reset_connection(false);
        let opts = OptsBuilder::from_opts(opts)
            .client_found_rows(true)
            .pool_opts(pool_opts)
            .setup(setup);
        Self {
            pool: Pool::new(opts),
        }
    }

    /// A shard at `url` (`mysql://user@host:port/database`), checked by one
    /// round trip.
    ///
    /// # Errors
    /// A malformed URL or a server that cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, BackendError> {
        let shard = Self::new(Opts::from_url(url)?);
        shard.pool.get_conn().await?.query_drop("SELECT 1").await?;
        Ok(shard)
    }

    /// Runs statements without parameters through the text protocol (setup,
    /// tests).
    ///
    /// # Errors
    /// The server's error.
    pub async fn query_drop(&self, sql: &str) -> Result<(), BackendError> {
        self.pool.get_conn().await?.query_drop(sql).await?;
        Ok(())
    }

    /// Closes the pool's connections.
    ///
    /// # Errors
    /// The driver's error.
    pub async fn disconnect(self) -> Result<(), BackendError> {
        self.pool.disconnect().await?;
        Ok(())
    }

    async fn execute_once(&self, st: &Statement) -> Result<Attempt<u64>, BackendError> {
        let mut conn = self.pool.get_conn().await?;
        Ok(classify(exec_on(&mut conn, st).await))
    }

    async fn query_once(&self, st: &Statement) -> Result<Attempt<Vec<Row>>, BackendError> {
        let mut conn = self.pool.get_conn().await?;
        Ok(
            match classify(
                conn.exec::<mysql_async::Row, _, _>(st.sql.as_str(), params(st))
                    .await,
            ) {
                Attempt::Done(Ok(rows)) => {
                    Attempt::Done(rows.into_iter().map(to_row).collect::<Result<_, _>>())
                }
                Attempt::Done(Err(e)) => Attempt::Done(Err(e)),
                Attempt::Retry(e) => Attempt::Retry(e),
            },
        )
    }

    async fn batch_once(&self, stmts: &[Statement]) -> Result<Attempt<Vec<u64>>, BackendError> {
        let mut conn = self.pool.get_conn().await?;
        // The session is `SERIALIZABLE` (setup), so the transaction needs no
        // `SET TRANSACTION` round trip of its own.
        let mut tx = match conn.start_transaction(TxOpts::default()).await {
            Ok(tx) => tx,
            Err(e) => return Ok(classify(Err(e))),
        };
        let mut counts = Vec::with_capacity(stmts.len());
        for st in stmts {
            match exec_on(&mut tx, st).await {
                Ok(n) => counts.push(n),
                Err(e) => {
                    if let Err(rb) = tx.rollback().await {
                        tracing::warn!(
                            event = "durability.storage_mysql.rollback_failed",
                            error = %rb,
                            "rolling back a failed batch failed"
                        );
                    }
                    return Ok(classify(Err(e)));
                }
            }
        }
        Ok(classify(tx.commit().await.map(|()| counts)))
    }

    async fn retrying<T, F, Fut>(&self, mut once: F) -> Result<T, BackendError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Attempt<T>, BackendError>>,
    {
        let mut last = None;
        for attempt in 1..=MAX_ATTEMPTS {
            match once().await? {
                Attempt::Done(r) => return r,
                Attempt::Retry(e) => {
                    tracing::debug!(
                        event = "durability.storage_mysql.retry",
                        error = %e,
                        "retrying a deadlocked or timed-out batch"
                    );
                    last = Some(e);
                }
            }
            if attempt < MAX_ATTEMPTS {
                let tries = u32::try_from(attempt).unwrap_or(u32::MAX);
                RETRY_BACKOFF.wait(&SystemClock, tries, &Random::os()).await;
            }
        }
        Err(match last {
            Some(e) => e.into(),
            None => "no attempt made".into(),
        })
    }
}

impl Shard for MysqlShard {
    fn dialect(&self) -> Dialect {
        Dialect::MySql
    }
    fn batch_support(&self) -> BatchSupport {
        BatchSupport::Atomic
    }
    fn execute<'a>(&'a self, stmt: &'a Statement) -> BoxFuture<'a, Result<u64, BackendError>> {
        Box::pin(self.retrying(move || self.execute_once(stmt)))
    }
    fn query<'a>(&'a self, stmt: &'a Statement) -> BoxFuture<'a, Result<Vec<Row>, BackendError>> {
        Box::pin(self.retrying(move || self.query_once(stmt)))
    }
    fn batch<'a>(
        &'a self,
        stmts: &'a [Statement],
    ) -> BoxFuture<'a, Result<Vec<u64>, BackendError>> {
        Box::pin(async move {
            match stmts {
                // One statement is atomic on its own (autocommit): no
                // START TRANSACTION and COMMIT round trips.
                [one] => Ok(vec![self.retrying(move || self.execute_once(one)).await?]),
                _ => self.retrying(move || self.batch_once(stmts)).await,
            }
        })
    }
}

/// Key → shard mappings in a MariaDB/MySQL table (`durability_mapping`):
/// the migration crate's [`ShardMappingStore`] on a [`MysqlShard`]. Keys are
/// `VARBINARY(512)`: compared and ordered byte-wise, with no collation
/// folding case or ignoring trailing spaces.
/// `MysqlMappingStore::new(shard).await` creates the table when missing.
pub type MysqlMappingStore = ShardMappingStore<MysqlShard>;

#[cfg(feature = "testkit")]
pub mod testkit;
