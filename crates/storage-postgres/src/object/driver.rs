//! The one transaction driver: `BEGIN` with the object row lock and the
//! fence read (sent at once, answered with the first statement: one round
//! trip for all of them), the closure, the begin's verdict (the fence
//! check; a refusal is the outcome whatever the closure returned), the
//! lease budget check, `COMMIT`. Every path that does not end cleanly takes the
//! connection out of the pool, so no half-open transaction is ever reused.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Waker};

use deadpool_postgres::Object;
use durability_scheduler::{StorageError, StorageErrorKind};
use tokio_postgres::Statement;

use super::fence::{FenceCheck, check_fence};
use super::runtime::wait;
use super::tx::{Begin, BeginSlot, PostgresObjectTx};
use super::{Fence, PostgresObjectStorage};

/// A pooled connection inside a transaction: dropped without
/// [`Held::release`], it is closed instead of returned (the server then
/// rolls its transaction back).
pub(super) struct Held(pub(super) Option<Object>);

impl Held {
    pub(super) fn client(&self) -> &Object {
        // Set in `Held::new`, taken only by `release`, which consumes self.
        self.0.as_ref().expect("a held connection until released")
    }

    pub(super) fn release(mut self) {
        drop(self.0.take());
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(Object::take(client));
        }
    }
}

impl PostgresObjectStorage {
    /// Sends `BEGIN`, the object row lock and the fence read (pipelined;
    /// the lock's statements are prepared once per connection) without
    /// waiting for their replies: the transaction's first statement goes
    /// right behind them and waits for all of them at once (one round
    /// trip), and [`PostgresObjectTx::begun`] waits for them before
    /// `COMMIT`. The begin's verdict (the fence check) is known before any
    /// statement's result is handed out.
    fn begin<'a>(
        &'a self,
        client: &'a Object,
        fence: Option<&'a Fence>,
    ) -> Result<Begin<'a>, StorageError> {
        let ms = self.shared.options.lock_timeout.as_millis().max(1);
        let begin = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL search_path TO {}; \
             SET LOCAL lock_timeout = {ms}",
            self.own_schema
        );
        let scope = fence.map(|(record, _)| record.scope().host_id());
        let statements = wait(lock_statements(client, &self.shared.s, scope.is_some()))
            .map_err(|e| lock_error("lock the object row", e))?;
        let object = self.object.as_str();
        let verdict = async move {
            let (began, locked) = locked(client, &begin, object, scope, &statements).await;
            began.map_err(|e| StorageError::backend("begin transaction", e))?;
            let rows = locked.map_err(|e| lock_error("lock the object row", e))?;
            let Some(row) = rows.first() else {
                return Err(StorageError::new(
                    StorageErrorKind::Backend,
                    format!("object {object:?} is not recorded in the deployment"),
                ));
            };
            if let Some((record, _)) = fence {
                let generation: Option<i64> = row
                    .try_get(0)
                    .map_err(|e| StorageError::backend("read the fence", e))?;
                let holder: Option<Vec<u8>> = row
                    .try_get(1)
                    .map_err(|e| StorageError::backend("read the fence", e))?;
                match check_fence(generation, holder.as_deref(), record)? {
                    FenceCheck::Held => {}
                    FenceCheck::Refused(e) => return Err(super::fence::fenced(e)),
                }
            }
            Ok(())
        };
        let mut in_flight: Begin<'a> = futures::future::maybe_done(Box::pin(verdict));
        // The first poll puts every request on the wire (a failed send is
        // kept as the verdict).
        let _ = Pin::new(&mut in_flight).poll(&mut Context::from_waker(Waker::noop()));
        Ok(in_flight)
    }

    /// Runs `f` in one transaction (see the module docs).
    pub(super) fn run<R, E>(
        &self,
        fence: Option<Fence>,
        f: impl FnOnce(&mut PostgresObjectTx<'_>) -> Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<StorageError>,
    {
        let held = Held(Some(self.shared.backend.client()?));
        let client = held.client();
        let (value, created) = match self.work(client, fence.as_ref(), f) {
            Ok(done) => done,
            Err(e) => {
                let rolled_back = wait(client.batch_execute("ROLLBACK")).is_ok();
                if rolled_back {
                    held.release();
                }
                return Err(e);
            }
        };
        // A failed COMMIT drops `held`: the connection is closed.
        super::commit::commit(client, self.shared.options.commit_timeout).map_err(E::from)?;
        held.release();
        if created {
            self.own_ready.store(true, Ordering::Release);
        }
        Ok(value)
    }

    /// Everything up to `COMMIT`; also says whether the transaction
    /// created the object's own schema.
    fn work<R, E>(
        &self,
        client: &Object,
        fence: Option<&Fence>,
        f: impl FnOnce(&mut PostgresObjectTx<'_>) -> Result<R, E>,
    ) -> Result<(R, bool), E>
    where
        E: From<StorageError>,
    {
        let begin = BeginSlot::new(self.begin(client, fence)?);
        let mut tx = PostgresObjectTx::new(
            client,
            &self.shared.s,
            &self.object,
            &self.own_schema,
            &self.own_ready,
            Some(&begin),
        );
        let value = f(&mut tx);
        // A begin that refused the transaction (the fence, the row lock)
        // is its outcome, whatever the closure made of it; a closure that
        // ran no statement waits for it here.
        tx.begun()?;
        let value = value?;
        if tx.failed.get() {
            return Err(E::from(StorageError::new(
                StorageErrorKind::Backend,
                "a statement failed inside the transaction: it was rolled back",
            )));
        }
        // The last step before COMMIT: a holder paused inside its
        // transaction past its lease rolls back instead of committing late.
        if let Some((record, Some(budget))) = fence
            && budget.spent()
        {
            return Err(E::from(super::fence::fenced(
                durability_ownership::OwnershipError::StaleOwner {
                    scope: record.scope().to_string(),
                },
            )));
        }
        Ok((value, tx.own_created.get()))
    }
}

/// The statements locking the object row: one that locks it and reads two
/// `NULL`s, or, `with_fence`, one that locks it and one that reads the
/// fence (prepared once per connection).
async fn lock_statements(
    client: &Object,
    s: &str,
    with_fence: bool,
) -> Result<LockStatements, tokio_postgres::Error> {
    if !with_fence {
        let st = client
            .prepare_cached(&format!(
                "SELECT NULL::bigint, NULL::bytea FROM {s}.durability_objects \
                 WHERE id = $1 FOR UPDATE"
            ))
            .await?;
        return Ok(LockStatements {
            lock: st,
            read: None,
        });
    }
    // The fence is read by a statement of its own after the row lock is
    // taken (pipelined: still one round trip). Joined into the locking
    // statement, it would be read from that statement's snapshot, taken
    // before a wait for the lock: a stale holder that waited while a new
    // owner raised the fence would see the old fence and commit past it.
    let lock = client
        .prepare_cached(&format!(
            "SELECT 1 FROM {s}.durability_objects WHERE id = $1 FOR UPDATE"
        ))
        .await?;
    let read = client
        .prepare_cached(&format!(
            "SELECT f.generation, f.holder FROM {s}.durability_objects o \
             LEFT JOIN {s}.durability_object_fences f \
               ON f.object_id = o.id AND f.scope = $2 \
             WHERE o.id = $1"
        ))
        .await?;
    Ok(LockStatements {
        lock,
        read: Some(read),
    })
}

/// What [`lock_statements`] prepared.
struct LockStatements {
    /// Locks the object row (reading two `NULL`s when there is no `read`).
    lock: Statement,
    /// Reads the fence of the scope bound as `$2`.
    read: Option<Statement>,
}

/// `begin` (a `BEGIN` batch), then the object row lock and, with `scope`,
/// the fence read (`statements` from [`lock_statements`]): the first poll
/// sends all of them, in that order; the rows are the fence's (two
/// `NULL`s without a scope).
async fn locked(
    client: &Object,
    begin: &str,
    object: &str,
    scope: Option<&str>,
    statements: &LockStatements,
) -> (
    Result<(), tokio_postgres::Error>,
    Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>,
) {
    let lock = async {
        match (&statements.read, scope) {
            (Some(read), Some(scope)) => {
                let (locked, fence) = futures::future::join(
                    client.query(&statements.lock, &[&object]),
                    client.query(read, &[&object, &scope]),
                )
                .await;
                locked?;
                fence
            }
            _ => client.query(&statements.lock, &[&object]).await,
        }
    };
    futures::future::join(client.batch_execute(begin), lock).await
}

/// Runs `begin` (a `BEGIN` batch) and locks the object row, reading the
/// fence of `scope` when given (generation and holder; two `NULL`s
/// otherwise), pipelined: one round trip (after the statements' first
/// preparation on the connection).
pub(super) fn begin_locked(
    client: &Object,
    s: &str,
    object: &str,
    begin: &str,
    scope: Option<&str>,
) -> (
    Result<(), tokio_postgres::Error>,
    Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>,
) {
    match wait(lock_statements(client, s, scope.is_some())) {
        Ok(statements) => wait(locked(client, begin, object, scope, &statements)),
        // Nothing was begun.
        Err(e) => (Ok(()), Err(e)),
    }
}

/// A failure to take the object row lock: a lock timeout is a retryable
/// backend failure (another writer holds the object).
fn lock_error(what: &str, e: tokio_postgres::Error) -> StorageError {
    let busy = e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE);
    let what = if busy {
        format!("{what}: another writer holds the object past the lock timeout")
    } else {
        what.to_owned()
    };
    StorageError::backend(what, e)
}
