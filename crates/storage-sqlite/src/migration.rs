//! SQLite shards and mapping store for `durability-migration`.
//!
//! [`SqliteShard`] is one SQLite database holding keyed tables: it speaks
//! [`Dialect::Sqlite`], declares an atomic batch (one transaction) and holds
//! one connection, so every statement waits while a batch is open (the
//! single-connection rule). [`SqliteMappingStore`] keeps key → shard
//! mappings in a `durability_mapping` table: it is the migration crate's
//! [`ShardMappingStore`] on a shard of its own.
//!
//! Statements run synchronously on the calling task while holding the
//! connection's mutex; SQLite statements on a local file are short.
//!
//! A [`Router`](durability_migration::Router) over two SQLite shards: a key
//! is written to one, moved to the other through the journal, and read back
//! where it now lives.
//!
//! ```
//! use std::sync::Arc;
//! use durability_migration::{MigrationConfig, Router, row};
//! use durability_storage_sqlite::migration::{SqliteMappingStore, SqliteShard};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let shard = || -> Result<Arc<SqliteShard>, Box<dyn std::error::Error + Send + Sync>> {
//!     let s = SqliteShard::open_in_memory()?;
//!     s.execute_sync("CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT)")?;
//!     Ok(Arc::new(s))
//! };
//! let router = Router::new(
//!     MigrationConfig::new(Arc::new(SqliteMappingStore::open_in_memory()?))
//!         .shard("east", shard()?)
//!         .shard("west", shard()?)
//!         .journal_shard("east")
//!         .table("users"),
//! )?;
//! router.init().await?;
//! router.insert("user-1", "users", row([("name", "Ann")])).await?;
//! let first = router.route("user-1").await?.expect("mapped on first write");
//! let other = if first == "east" { "west" } else { "east" };
//! router.reassign_shard("user-1", other, "users").await?;
//! assert_eq!(router.route("user-1").await?.as_deref(), Some(other));
//! let ann = router.get("user-1", "users").await?.expect("moved, not lost");
//! assert_eq!(ann.get("name").and_then(|v| v.as_text()), Some("Ann"));
//! # Ok(())
//! # }
//! ```

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use durability_migration::{
    BackendError, BatchSupport, BoxFuture, DataRejected, Dialect, MappingStore, PairKind, Row,
    Shard, ShardMappingStore, ShardPairs, Statement, UniqueViolation, Value,
};
use rusqlite::ToSql;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, params_from_iter};

/// Prepared statements kept per connection: a move uses a few dozen
/// distinct statements, more than rusqlite's default of 16.
const STATEMENT_CACHE: usize = 256;

/// A file connection in WAL mode with `synchronous=NORMAL`, a busy timeout
/// and a statement cache sized for a move (shards, stores, ledgers).
pub(crate) fn open_conn(path: &Path) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// Binds a [`Value`] by reference (no copy of text or blob bytes).
struct Bind<'a>(&'a Value);

impl ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self.0 {
            Value::Null => ValueRef::Null,
            Value::Integer(i) => ValueRef::Integer(*i),
            Value::Real(f) => ValueRef::Real(*f),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

fn from_sql(v: ValueRef<'_>) -> Result<Value, BackendError> {
    Ok(match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(std::str::from_utf8(t)?.to_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    })
}

/// A driver error as a backend error: a primary key or unique constraint
/// violation is wrapped in [`UniqueViolation`], any other constraint
/// (NOT NULL, CHECK, foreign key, a trigger's `RAISE`), a datatype mismatch
/// (a `STRICT` table) or a value too big in [`DataRejected`], naming the
/// table and column when SQLite's message does: all definite rejections.
fn backend(e: rusqlite::Error) -> BackendError {
    let rusqlite::Error::SqliteFailure(f, msg) = &e else {
        return Box::new(e);
    };
    if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
        || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
    {
        return Box::new(UniqueViolation(Box::new(e)));
    }
    if matches!(
        f.code,
        rusqlite::ErrorCode::ConstraintViolation
            | rusqlite::ErrorCode::TypeMismatch
            | rusqlite::ErrorCode::TooBig
    ) {
        let (table, column) = msg.as_deref().map_or((None, None), named_column);
        return DataRejected::boxed(table, column, e);
    }
    Box::new(e)
}

/// The `table.column` SQLite's message ends with ("NOT NULL constraint
/// failed: users.name", "cannot store TEXT value in INTEGER column t.n").
fn named_column(msg: &str) -> (Option<String>, Option<String>) {
    let last = msg.rsplit([' ', ':']).next().unwrap_or_default();
    let ident = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    match last.split_once('.') {
        Some((t, c)) if ident(t) && ident(c) => (Some(t.to_owned()), Some(c.to_owned())),
        _ => (None, None),
    }
}

fn exec(conn: &Connection, st: &Statement) -> Result<u64, BackendError> {
    let mut stmt = conn.prepare_cached(&st.sql)?;
    let n = stmt
        .execute(params_from_iter(st.params.iter().map(Bind)))
        .map_err(backend)?;
    Ok(u64::try_from(n)?)
}

fn query(conn: &Connection, st: &Statement) -> Result<Vec<Row>, BackendError> {
    let mut stmt = conn.prepare_cached(&st.sql)?;
    let names: Vec<String> = stmt.column_names().map(str::to_owned).collect();
    let mut rows = stmt.query(params_from_iter(st.params.iter().map(Bind)))?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let mut row = Row::new();
        for (i, n) in names.iter().enumerate() {
            row.insert(n.clone(), from_sql(r.get_ref(i)?)?);
        }
        out.push(row);
    }
    Ok(out)
}

/// One SQLite database as a migration shard.
#[derive(Debug)]
pub struct SqliteShard {
    conn: Mutex<Connection>,
}

impl SqliteShard {
    /// Opens (or creates) a shard file in WAL mode with `synchronous=NORMAL`.
    ///
    /// # Errors
    /// The SQLite error when the file cannot be opened or configured.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, rusqlite::Error> {
        Ok(Self {
            conn: Mutex::new(open_conn(path.as_ref())?),
        })
    }

    /// An in-memory shard (for logic tests).
    ///
    /// # Errors
    /// The SQLite error when the database cannot be opened.
    pub fn open_in_memory() -> Result<Self, rusqlite::Error> {
        let conn = Connection::open_in_memory()?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    /// A shard over `conn` once `schema` (the `CREATE TABLE IF NOT EXISTS`
    /// of a mapping store or a ledger) has run on it.
    pub(crate) fn with_schema(conn: Connection, schema: &str) -> Result<Self, rusqlite::Error> {
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        conn.execute_batch(schema)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Connection>, BackendError> {
        self.conn
            .lock()
            .map_err(|_| "sqlite shard mutex poisoned".into())
    }

    /// Runs statements synchronously (setup, tests); see [`Shard::execute`].
    ///
    /// # Errors
    /// The SQLite error.
    pub fn execute_sync(&self, sql: &str) -> Result<(), BackendError> {
        self.lock()?.execute_batch(sql)?;
        Ok(())
    }
}

impl Shard for SqliteShard {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }
    fn batch_support(&self) -> BatchSupport {
        BatchSupport::Atomic
    }
    fn execute<'a>(&'a self, stmt: &'a Statement) -> BoxFuture<'a, Result<u64, BackendError>> {
        Box::pin(async move { exec(&*self.lock()?, stmt) })
    }
    fn query<'a>(&'a self, stmt: &'a Statement) -> BoxFuture<'a, Result<Vec<Row>, BackendError>> {
        Box::pin(async move { query(&*self.lock()?, stmt) })
    }
    fn batch<'a>(
        &'a self,
        stmts: &'a [Statement],
    ) -> BoxFuture<'a, Result<Vec<u64>, BackendError>> {
        Box::pin(async move {
            let g = self.lock()?;
            if let [one] = stmts {
                // One statement is atomic on its own (autocommit).
                return Ok(vec![exec(&g, one)?]);
            }
            // BEGIN and COMMIT as cached statements: parsed once per
            // connection, not once per batch.
            g.prepare_cached("BEGIN")?.execute([])?;
            let run = || -> Result<Vec<u64>, BackendError> {
                let mut counts = Vec::with_capacity(stmts.len());
                for st in stmts {
                    counts.push(exec(&g, st)?);
                }
                g.prepare_cached("COMMIT")?.execute([])?;
                Ok(counts)
            };
            let out = run();
            if out.is_err()
                && !g.is_autocommit()
                && let Err(e) = g.execute_batch("ROLLBACK")
            {
                tracing::warn!(
                    event = "durability.storage_sqlite.rollback_failed",
                    error = %e,
                    "rolling back a failed shard batch failed"
                );
            }
            out
        })
    }
}

/// Key → shard mappings in a SQLite table (`durability_mapping`): the
/// migration crate's [`ShardMappingStore`] on a [`SqliteShard`] of its own.
#[derive(Debug)]
pub struct SqliteMappingStore(ShardMappingStore<SqliteShard>);

impl SqliteMappingStore {
    /// Opens (or creates) a mapping store file.
    ///
    /// # Errors
    /// The SQLite error.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, rusqlite::Error> {
        open_pairs(Some(path.as_ref())).map(Self)
    }

    /// An in-memory mapping store.
    ///
    /// # Errors
    /// The SQLite error.
    pub fn open_in_memory() -> Result<Self, rusqlite::Error> {
        open_pairs(None).map(Self)
    }
}

/// A key → shard table of kind `K` (the mapping or the ledger) on a SQLite
/// shard of its own: the file at `path` ([`open_conn`]), or an in-memory
/// database for `None`, with the table created when missing (its schema as
/// the migration crate writes it for SQLite).
pub(crate) fn open_pairs<K: PairKind>(
    path: Option<&Path>,
) -> Result<ShardPairs<SqliteShard, K>, rusqlite::Error> {
    let conn = match path {
        Some(path) => open_conn(path)?,
        None => Connection::open_in_memory()?,
    };
    let schema = ShardPairs::<SqliteShard, K>::schema_sql(&Dialect::Sqlite);
    Ok(ShardPairs::with_table(SqliteShard::with_schema(
        conn, &schema,
    )?))
}

impl MappingStore for SqliteMappingStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<String>, BackendError>> {
        self.0.get(key)
    }
    fn put<'a>(&'a self, key: &'a str, shard: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        self.0.put(key, shard)
    }
    fn put_if_absent<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<String, BackendError>> {
        self.0.put_if_absent(key, shard)
    }
    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.0.remove(key)
    }
    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
        self.0.scan(after, limit)
    }
}
