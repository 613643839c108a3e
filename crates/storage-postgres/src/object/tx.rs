//! The transaction type, its SQL handle, and the one transaction driver:
//! `BEGIN`, the object row lock with the fence check, the closure, the
//! lease budget check, `COMMIT`.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};

use deadpool_postgres::Object;
use durability_scheduler::{StorageError, StorageErrorKind};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::runtime::wait;

/// How many of the application's prepared statements a connection keeps
/// before it forgets them all (they are keyed by object and SQL text).
const OWN_STATEMENTS_PER_CONNECTION: usize = 512;

/// One transaction on an object's storage. [`PostgresObjectTx::sql`] gives
/// the application the same transaction for its own tables; the
/// capabilities' rows are written through the traits this type implements
/// (`SchedulerTx`, `OutboxTx`, `AlarmTx`, `TopologyTx`).
pub struct PostgresObjectTx<'t> {
    pub(crate) client: &'t Object,
    /// The quoted deployment schema.
    pub(crate) s: &'t str,
    /// The object id (bound as `$1` in every shared-table statement).
    pub(crate) object: &'t str,
    /// The quoted schema of the object's own tables (also the key prefix
    /// of its cached statements).
    pub(crate) own_schema: &'t str,
    /// Set by any statement that failed: PostgreSQL then aborted the
    /// transaction, so it must not be reported as committed.
    pub(crate) failed: Cell<bool>,
    /// Whether the object's own schema is known to exist (committed).
    pub(crate) own_ready: &'t AtomicBool,
    /// Set when this transaction created the object's own schema.
    pub(crate) own_created: Cell<bool>,
    /// The `BEGIN`, the object row lock and the fence read, sent but not
    /// yet answered: the first statement waits for them with its own reply.
    pub(crate) begin: Option<&'t (dyn InFlight + 't)>,
    /// Why the begin refused the transaction (the fence, the row lock):
    /// the transaction's outcome whatever the closure returns.
    pub(crate) refused: RefCell<Option<StorageError>>,
}

/// A transaction's begin: its requests are on the wire once it was polled
/// the first time.
pub(crate) type Begin<'t> =
    futures::future::MaybeDone<Pin<Box<dyn Future<Output = Result<(), StorageError>> + Send + 't>>>;

/// A transaction's begin in flight, shared by its statements (a trait
/// object, so the transaction type stays covariant in its lifetime).
pub(crate) trait InFlight: Sync {
    /// Polls the begin; ready at once after its verdict was taken.
    fn poll_begin(&self, cx: &mut Context<'_>) -> Poll<()>;
    /// The begin's verdict, once it finished; `None` before, and after
    /// it was taken.
    fn verdict(&self) -> Option<Result<(), StorageError>>;
    /// Whether the verdict was taken.
    fn settled(&self) -> bool;
}

/// The one [`InFlight`]: a begin, until its verdict is taken.
pub(crate) struct BeginSlot<'t>(Mutex<Option<Begin<'t>>>);

impl<'t> BeginSlot<'t> {
    pub(crate) fn new(begin: Begin<'t>) -> Self {
        Self(Mutex::new(Some(begin)))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Begin<'t>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl InFlight for BeginSlot<'_> {
    fn poll_begin(&self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut *self.slot() {
            Some(begin) => Pin::new(begin).poll(cx),
            None => Poll::Ready(()),
        }
    }

    fn verdict(&self) -> Option<Result<(), StorageError>> {
        let mut slot = self.slot();
        let verdict = Pin::new(slot.as_mut()?).take_output()?;
        *slot = None;
        Some(verdict)
    }

    fn settled(&self) -> bool {
        self.slot().is_none()
    }
}

impl std::fmt::Debug for PostgresObjectTx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresObjectTx")
            .field("object", &self.object)
            .finish_non_exhaustive()
    }
}

/// A synchronous SQL handle on the object's own tables, inside the
/// transaction it came from. Tables are named without a schema: the
/// `search_path` is the object's own schema. Parameters are bound
/// (`$1`, `$2`, …, typed by [`ToSql`]); rows are [`tokio_postgres::Row`]s
/// (`row.try_get::<_, i64>(0)`).
///
/// A failed statement aborts the whole transaction (PostgreSQL's rule):
/// return its error from the closure; if the closure returns `Ok` anyway,
/// the transaction is still rolled back and reported as failed.
#[derive(Clone, Copy)]
pub struct Sql<'a> {
    tx: &'a PostgresObjectTx<'a>,
}

impl std::fmt::Debug for Sql<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sql").finish_non_exhaustive()
    }
}

fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.code()
        .map_or_else(String::new, |c| format!(" (SQLSTATE {})", c.code()))
}

impl<'t> PostgresObjectTx<'t> {
    /// The SQL handle for the application's own tables, in this transaction:
    /// everything written through it commits or rolls back with the
    /// capabilities' rows.
    pub fn sql(&self) -> Sql<'_> {
        Sql { tx: self }
    }

    /// The object id this transaction works on.
    pub fn object_id(&self) -> &str {
        self.object
    }

    /// A transaction on `client` whose begin, `begin`, is in flight (none:
    /// begun already).
    pub(crate) fn new(
        client: &'t Object,
        s: &'t str,
        object: &'t str,
        own_schema: &'t str,
        own_ready: &'t AtomicBool,
        begin: Option<&'t (dyn InFlight + 't)>,
    ) -> Self {
        Self {
            client,
            s,
            object,
            own_schema,
            failed: Cell::new(false),
            own_ready,
            own_created: Cell::new(false),
            begin,
            refused: RefCell::new(None),
        }
    }

    /// Waits for `statement`'s reply: the one way a statement of this
    /// transaction is waited for. The first one also waits for the begin
    /// sent ahead of it (pipelined: one round trip for both), whose verdict
    /// comes first: a refused begin fails the statement, whatever it did
    /// (the transaction is then rolled back).
    ///
    /// # Errors
    /// The begin's refusal, else the statement's failure (`what`).
    pub(crate) fn wait<T>(
        &self,
        what: &str,
        statement: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, StorageError> {
        let done = match self.begin {
            Some(begin) if !begin.settled() => {
                let (_, done) = wait(futures::future::join(
                    std::future::poll_fn(|cx| begin.poll_begin(cx)),
                    statement,
                ));
                self.settle(begin);
                done
            }
            _ => wait(statement),
        };
        if let Some(refused) = &*self.refused.borrow() {
            self.failed.set(true);
            return Err(StorageError::new(refused.kind(), refused.to_string()));
        }
        done.map_err(|e| self.fail(what, e))
    }

    /// Waits for the begin if it is still in flight; the refusal if it
    /// refused the transaction (now or at an earlier statement).
    pub(crate) fn begun(&self) -> Result<(), StorageError> {
        if let Some(begin) = self.begin
            && !begin.settled()
        {
            wait(std::future::poll_fn(|cx| begin.poll_begin(cx)));
            self.settle(begin);
        }
        match self.refused.borrow_mut().take() {
            Some(refused) => Err(refused),
            None => Ok(()),
        }
    }

    /// Records a finished begin's verdict (a refusal in `refused`).
    fn settle(&self, begin: &dyn InFlight) {
        let verdict = begin.verdict().unwrap_or_else(|| {
            Err(StorageError::new(
                StorageErrorKind::Backend,
                "the transaction's begin had no verdict",
            ))
        });
        if let Err(refused) = verdict {
            self.failed.set(true);
            *self.refused.borrow_mut() = Some(refused);
        }
    }

    pub(crate) fn fail(&self, what: &str, e: tokio_postgres::Error) -> StorageError {
        self.failed.set(true);
        // A statement whose plan no longer fits (its table changed) would
        // fail the same way on every later use.
        if e.code() == Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED) {
            self.client.statement_cache.clear();
        }
        StorageError::backend(format!("{what}{}", sqlstate(&e)), e)
    }

    /// A shared-table statement: `{s}` in `template` is the deployment
    /// schema; `$1` is always the object id, `params` follow from `$2`.
    pub(crate) fn rows(
        &self,
        what: &str,
        template: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StorageError> {
        let sql = template.replace("{s}", self.s);
        let mut all: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(params.len() + 1);
        all.push(&self.object);
        all.extend_from_slice(params);
        let c = self.client;
        self.wait(what, async {
            let st = c.prepare_cached(&sql).await?;
            c.query(&st, &all).await
        })
    }

    /// As [`Self::rows`], for at most one row.
    pub(crate) fn row(
        &self,
        what: &str,
        template: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, StorageError> {
        let mut rows = self.rows(what, template, params)?;
        if rows.len() > 1 {
            return Err(StorageError::corrupt(format!(
                "{what}: {} rows where one was expected",
                rows.len()
            )));
        }
        Ok(rows.pop())
    }

    /// As [`Self::rows`], returning the number of rows changed.
    pub(crate) fn exec(
        &self,
        what: &str,
        template: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StorageError> {
        let sql = template.replace("{s}", self.s);
        let mut all: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(params.len() + 1);
        all.push(&self.object);
        all.extend_from_slice(params);
        let c = self.client;
        self.wait(what, async {
            let st = c.prepare_cached(&sql).await?;
            c.execute(&st, &all).await
        })
    }

    /// Creates the object's own schema, in this transaction, the first
    /// time the object's own tables are used: an object that never has
    /// tables of its own costs no catalog entry.
    pub(crate) fn ensure_own_schema(&self) -> Result<(), StorageError> {
        if self.own_ready.load(Ordering::Acquire) || self.own_created.get() {
            return Ok(());
        }
        self.wait(
            "create the object's schema",
            self.client
                .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {}", self.own_schema)),
        )?;
        self.own_created.set(true);
        Ok(())
    }

    /// Several statements without parameters, in the object's schema.
    pub(crate) fn batch(&self, what: &str, sql: &str) -> Result<(), StorageError> {
        self.ensure_own_schema()?;
        self.wait(what, self.client.batch_execute(sql))
    }
}

impl Sql<'_> {
    /// The application's statement, prepared once per connection and
    /// object (the key carries the object's schema: the same text can
    /// name differently shaped tables in two objects).
    async fn prepare(&self, sql: &str) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
        let c = self.tx.client;
        if c.statement_cache.size() >= OWN_STATEMENTS_PER_CONNECTION {
            c.statement_cache.clear();
        }
        c.prepare_cached(&format!("/* {} */ {sql}", self.tx.own_schema))
            .await
    }

    /// Prepares `sql` (see [`Sql::prepare`]) and runs it with `run`, in
    /// the object's schema: the one way the methods below reach the
    /// server.
    fn run<T, Fut>(
        &self,
        what: &str,
        sql: &str,
        run: impl FnOnce(tokio_postgres::Statement) -> Fut,
    ) -> Result<T, StorageError>
    where
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        self.tx.ensure_own_schema()?;
        self.tx
            .wait(what, async { run(self.prepare(sql).await?).await })
    }

    /// Runs one statement and returns how many rows it changed.
    ///
    /// # Errors
    /// The server's refusal or a lost connection, as a `Backend` storage
    /// error (the transaction is then aborted).
    pub fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, StorageError> {
        let c = self.tx.client;
        self.run("statement", sql, |st| async move {
            c.execute(&st, params).await
        })
    }

    /// Runs one query and returns its rows.
    ///
    /// # Errors
    /// As [`Sql::execute`].
    pub fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StorageError> {
        let c = self.tx.client;
        self.run("query", sql, |st| async move { c.query(&st, params).await })
    }

    /// Runs one query that returns at most one row.
    ///
    /// # Errors
    /// As [`Sql::execute`], or more than one row.
    pub fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, StorageError> {
        let c = self.tx.client;
        self.run(
            "query",
            sql,
            |st| async move { c.query_opt(&st, params).await },
        )
    }

    /// Runs one query that returns exactly one row.
    ///
    /// # Errors
    /// As [`Sql::execute`], or not exactly one row.
    pub fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, StorageError> {
        let c = self.tx.client;
        self.run(
            "query",
            sql,
            |st| async move { c.query_one(&st, params).await },
        )
    }

    /// Runs several statements without parameters (DDL, for instance).
    ///
    /// # Errors
    /// As [`Sql::execute`].
    pub fn batch_execute(&self, sql: &str) -> Result<(), StorageError> {
        self.tx.batch("statements", sql)
    }
}

/// How a `COMMIT` that returned an error ended: an `ERROR` the live
/// session sent (a deferred constraint, a serialization failure) rolled
/// back; anything else may or may not have committed: the connection lost,
/// the reply unreadable, or a `FATAL`/`PANIC` (a session told to terminate
/// while it commits still sends `FATAL` after its commit record).
pub(crate) fn commit_error(e: tokio_postgres::Error) -> StorageError {
    let refused = e
        .as_db_error()
        .is_some_and(|db| db.parsed_severity() == Some(tokio_postgres::error::Severity::Error));
    if refused {
        StorageError::backend(format!("commit refused{}", sqlstate(&e)), e)
    } else {
        StorageError::new(
            StorageErrorKind::Unknown,
            format!("the commit's outcome is unknown: {e}"),
        )
    }
}
