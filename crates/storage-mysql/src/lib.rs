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
//! up to [`MAX_ATTEMPTS`] times. Refusals are definite and typed: a
//! duplicate entry (1062) is a `UniqueViolation`, a refusal of the data
//! (NOT NULL, out of range, too long, invalid characters, foreign key,
//! CHECK) a `DataRejected` naming the column the server's message names.
//!
//! Values are bound parameters (the binary protocol), except in a batch of
//! several statements: it is one multi-statement text query, `START
//! TRANSACTION; …; COMMIT` (one round trip), each value written as a literal
//! that means what the bound parameter means (text `_utf8mb4 X'…'`, bytes
//! `X'…'`, integers in decimal, floats in exponent form), and a statement
//! that cannot be written so sends the batch prepared, statement by
//! statement. A failed batch's connection is rolled back or closed before it
//! returns to the pool. Reads map
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
    BackendError, BackendFuture, BatchSupport, DataRejected, Dialect, Row, Shard,
    ShardMappingStore, Statement, UniqueViolation, Value,
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

/// Server errors that refuse a statement for the data it carries (the
/// server applied nothing of it): a NULL in a NOT NULL column (1048), a
/// column left out that has no default (1364), a value out of range (1264,
/// 1690), truncated or not valid for its type (1265, 1292, 1366, 1411),
/// invalid characters (1300), too long (1406), a foreign key (1216, 1217,
/// 1451, 1452) or a CHECK constraint (MariaDB 4025, MySQL 3819).
const DATA_REFUSALS: [u16; 16] = [
    1048, 1216, 1217, 1264, 1265, 1292, 1300, 1364, 1366, 1406, 1411, 1451, 1452, 1690, 3819, 4025,
];

/// A driver error as a backend error: a duplicate entry (server error
/// 1062) is wrapped in [`UniqueViolation`], a data refusal
/// ([`DATA_REFUSALS`]) in [`DataRejected`], naming the table and column
/// when the server's message does. Both are definite rejections (a batch's
/// transaction is rolled back or its connection closed).
fn backend(e: mysql_async::Error) -> BackendError {
    let mysql_async::Error::Server(s) = &e else {
        return Box::new(e);
    };
    if s.code == 1062 {
        return Box::new(UniqueViolation(Box::new(e)));
    }
    if DATA_REFUSALS.contains(&s.code) {
        let (table, column) = named_column(&s.message);
        return DataRejected::boxed(table, column, e);
    }
    Box::new(e)
}

/// The table and column a server message names: ``for column `db`.`t`.`c` ``
/// (table and column), `column 'c'`, `Column 'c'` or `Field 'c'` (column
/// only).
fn named_column(msg: &str) -> (Option<String>, Option<String>) {
    if let Some((_, rest)) = msg.split_once("column `") {
        let quoted = rest.split(' ').next().unwrap_or_default();
        let parts: Vec<&str> = quoted
            .split('.')
            .map(|p| p.trim_matches('`'))
            .filter(|p| !p.is_empty())
            .collect();
        return match parts.as_slice() {
            [.., t, c] => (Some((*t).to_owned()), Some((*c).to_owned())),
            [c] => (None, Some((*c).to_owned())),
            [] => (None, None),
        };
    }
    let rest = msg
        .split_once("column '")
        .or_else(|| msg.split_once("Column '"))
        .or_else(|| msg.split_once("Field '"))
        .map(|(_, r)| r);
    let column = rest
        .and_then(|r| r.split_once('\''))
        .map(|(c, _)| c.to_owned());
    (None, column)
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

/// The most text one multi-statement batch sends (half the server's default
/// `max_allowed_packet` of 16 MiB); a larger batch runs statement by
/// statement.
const MAX_MULTI_BYTES: usize = 8 << 20;

/// A batch as one multi-statement text query, `START TRANSACTION; s1; …;
/// sn; COMMIT` (one round trip instead of `n + 2`), or `None` when a
/// statement cannot be inlined safely (see [`inline`]) or the text would be
/// too long: the batch then runs statement by statement, prepared.
fn multi_text(stmts: &[Statement]) -> Option<String> {
    let mut out = String::from("START TRANSACTION");
    for st in stmts {
        out.push_str(";\n");
        inline(st, &mut out)?;
        if out.len() > MAX_MULTI_BYTES {
            return None;
        }
    }
    out.push_str(";\nCOMMIT");
    Some(out)
}

/// Appends `st` to `out` with every `?` placeholder replaced by its value
/// as a literal (see [`literal`]). `None` (and `out` is to be discarded)
/// when the text holds anything this scanner does not fully understand:
/// a backslash inside a quoted string, a `;`, a comment, an unterminated
/// quote, or placeholders that do not match the parameters one to one.
/// Quoted strings and identifiers are copied unchanged (a `?` inside them
/// is not a placeholder).
fn inline(st: &Statement, out: &mut String) -> Option<()> {
    let mut params = st.params.iter();
    let mut quote: Option<char> = None;
    let mut prev = ' ';
    for c in st.sql.chars() {
        match quote {
            Some(_) if c == '\\' => return None,
            Some(q) => {
                if c == q {
                    quote = None;
                }
                out.push(c);
            }
            None => match c {
                '\'' | '"' | '`' => {
                    quote = Some(c);
                    out.push(c);
                }
                '?' => literal(params.next()?, out)?,
                ';' | '#' => return None,
                '-' if prev == '-' => return None,
                '*' if prev == '/' => return None,
                _ => out.push(c),
            },
        }
        prev = c;
    }
    (quote.is_none() && params.next().is_none()).then_some(())
}

/// A value as a SQL literal that means what the bound parameter means:
/// text as `_utf8mb4 X'…'` (its UTF-8 bytes in hex: no escaping, whatever
/// `NO_BACKSLASH_ESCAPES` says, and compared under the column's collation
/// like a bound string), bytes as `X'…'`, integers in decimal, floats in
/// exponent form (a `DOUBLE`, never a `DECIMAL` literal). `None` for a
/// float with no literal (NaN, infinity): the batch is then sent prepared.
fn literal(v: &Value, out: &mut String) -> Option<()> {
    use std::fmt::Write as _;
    match v {
        Value::Null => out.push_str("NULL"),
        // `9223372036854775808` does not fit a BIGINT literal.
        Value::Integer(i64::MIN) => out.push_str("(-9223372036854775807 - 1)"),
        Value::Integer(i) => write!(out, "{i}").ok()?,
        Value::Real(f) if f.is_finite() => write!(out, "{f:e}").ok()?,
        Value::Real(_) => return None,
        Value::Text(t) => {
            out.push_str("_utf8mb4 X'");
            hex(t.as_bytes(), out);
            out.push('\'');
        }
        Value::Blob(b) => {
            out.push_str("X'");
            hex(b, out);
            out.push('\'');
        }
    }
    Some(())
}

fn hex(bytes: &[u8], out: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    out.reserve(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xF)]));
    }
}

/// Runs a [`multi_text`] batch of `n` statements on a connection of `pool`.
/// The server runs the statements in order and stops at the first error,
/// leaving the transaction open: the connection then rolls it back (or is
/// closed, which rolls it back too) before it returns to the pool, so no
/// later statement on it runs inside a failed batch's transaction. This
/// runs in a task of its own so that it always gets that far.
async fn batch_multi(
    pool: Pool,
    text: String,
    n: usize,
) -> Result<Attempt<Vec<u64>>, BackendError> {
    let mut conn = pool.get_conn().await?;
    let ran = run_multi(&mut conn, text, n).await;
    if let Err(e) = &ran {
        let closed =
            matches!(e, mysql_async::Error::Server(_)) && conn.query_drop("ROLLBACK").await.is_ok();
        if !closed && let Err(d) = conn.disconnect().await {
            tracing::warn!(
                event = "durability.storage_mysql.discard_failed",
                error = %d,
                "closing the connection of a failed batch failed"
            );
        }
    }
    Ok(classify(ran))
}

/// Sends the batch and reads one result per statement of it: the counts of
/// the `n` statements between `START TRANSACTION` and `COMMIT` (0 for a
/// statement that returned rows).
async fn run_multi(
    conn: &mut mysql_async::Conn,
    text: String,
    n: usize,
) -> Result<Vec<u64>, mysql_async::Error> {
    let mut r = conn.query_iter(text).await?;
    let mut counts = Vec::with_capacity(n);
    for i in 0..n + 2 {
        if (1..=n).contains(&i) {
            counts.push(if r.columns_ref().is_empty() {
                r.affected_rows()
            } else {
                0
            });
        }
        // Reads the rest of this result and the head of the next one (an
        // error of a later statement surfaces here).
        r.collect::<mysql_async::Row>().await?;
    }
    Ok(counts)
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
        if let Some(text) = multi_text(stmts) {
            // Its own task: a caller that stops waiting cannot drop the
            // connection half-way through the batch (see `batch_multi`).
            return tokio::spawn(batch_multi(self.pool.clone(), text, stmts.len()))
                .await
                .map_err(|e| -> BackendError { Box::new(e) })?;
        }
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
    fn execute<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, u64> {
        Box::pin(self.retrying(move || self.execute_once(stmt)))
    }
    fn query<'a>(&'a self, stmt: &'a Statement) -> BackendFuture<'a, Vec<Row>> {
        Box::pin(self.retrying(move || self.query_once(stmt)))
    }
    fn batch<'a>(&'a self, stmts: &'a [Statement]) -> BackendFuture<'a, Vec<u64>> {
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

#[cfg(test)]
mod tests {
    use super::{inline, multi_text, named_column};
    use durability_migration::{Statement, Value};

    fn inlined(sql: &str, params: Vec<Value>) -> Option<String> {
        let mut out = String::new();
        inline(&Statement::with_params(sql, params), &mut out).map(|()| out)
    }

    #[test]
    fn placeholders_become_hex_literals_and_quoted_text_is_kept() {
        assert_eq!(
            inlined(
                "SELECT `a?` FROM t WHERE x = ? AND y = '?' AND z IN (?, ?, ?, ?)",
                vec![
                    "k'0".into(),
                    Value::Blob(vec![0, 0xff]),
                    Value::Integer(i64::MIN),
                    Value::Real(1.5),
                    Value::Null,
                ],
            )
            .as_deref(),
            Some(
                "SELECT `a?` FROM t WHERE x = _utf8mb4 X'6B2730' AND y = '?' AND z IN \
                 (X'00FF', (-9223372036854775807 - 1), 1.5e0, NULL)"
            )
        );
        assert_eq!(
            inlined("SELECT 'it''s', ?", vec![String::new().into()]).as_deref(),
            Some("SELECT 'it''s', _utf8mb4 X''")
        );
    }

    #[test]
    fn anything_not_understood_is_left_to_the_prepared_path() {
        let one = || vec![Value::Integer(1)];
        for sql in [
            "SELECT ?; DROP TABLE t",
            "SELECT ? -- comment",
            "SELECT ? # comment",
            "SELECT ? /* comment */",
            "SELECT '\\'', ?",
            "SELECT 'open, ?",
            "SELECT ?, ?",
            "SELECT 1",
        ] {
            assert_eq!(inlined(sql, one()), None, "{sql}");
        }
        assert_eq!(inlined("SELECT ?", vec![Value::Real(f64::NAN)]), None);
        assert_eq!(inlined("SELECT ?", vec![Value::Real(f64::INFINITY)]), None);
        // One statement that cannot be inlined sends the whole batch prepared.
        let ok = Statement::with_params("SELECT ?", one());
        let bad = Statement::with_params("SELECT ?; SELECT 1", one());
        assert!(multi_text(&[ok.clone(), ok.clone()]).is_some());
        assert_eq!(multi_text(&[ok, bad]), None);
    }

    #[test]
    fn a_batch_too_long_for_one_packet_is_sent_prepared() {
        let big = Statement::with_params("SELECT ?", vec![Value::Blob(vec![7; 3 << 20])]);
        assert!(multi_text(std::slice::from_ref(&big)).is_some());
        assert_eq!(multi_text(&[big.clone(), big]), None);
    }

    #[test]
    fn a_refusal_names_the_column_its_message_names() {
        let named = |m: &str| named_column(m);
        let owned = |t: Option<&str>, c: Option<&str>| (t.map(str::to_owned), c.map(str::to_owned));
        assert_eq!(
            named("Column 'name' cannot be null"),
            owned(None, Some("name"))
        );
        assert_eq!(
            named("Data too long for column 'name' at row 1"),
            owned(None, Some("name"))
        );
        assert_eq!(
            named("Incorrect integer value: 'x' for column `db`.`users`.`n` at row 1"),
            owned(Some("users"), Some("n"))
        );
        assert_eq!(
            named("Field 'name' doesn't have a default value"),
            owned(None, Some("name"))
        );
        assert_eq!(
            named("CONSTRAINT `users.n` failed for `db`.`users`"),
            owned(None, None)
        );
    }
}

pub mod docs;
