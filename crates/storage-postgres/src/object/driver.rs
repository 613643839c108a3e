//! The one transaction driver: `BEGIN` with the object row lock and the
//! fence check (pipelined, one round trip), the closure, the lease budget
//! check, `COMMIT`. Every path that does not end cleanly takes the
//! connection out of the pool, so no half-open transaction is ever reused.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use deadpool_postgres::Object;
use durability_scheduler::{StorageError, StorageErrorKind};

use super::fence::{FenceCheck, check_fence};
use super::runtime::wait;
use super::tx::PostgresObjectTx;
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
    /// `BEGIN` and the object row lock, pipelined; returns the fence
    /// check's verdict.
    fn begin(&self, client: &Object, fence: Option<&Fence>) -> Result<(), StorageError> {
        let ms = self.shared.options.lock_timeout.as_millis().max(1);
        let begin = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL search_path TO {}; \
             SET LOCAL lock_timeout = {ms}",
            self.own_schema
        );
        let scope = fence.map(|(record, _)| record.scope().host_id());
        let (began, locked) = begin_locked(client, &self.shared.s, &self.object, &begin, scope);
        began.map_err(|e| StorageError::backend("begin transaction", e))?;
        let rows = locked.map_err(|e| lock_error("lock the object row", e))?;
        let Some(row) = rows.first() else {
            return Err(StorageError::new(
                StorageErrorKind::Backend,
                format!("object {:?} is not recorded in the deployment", self.object),
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
        self.begin(client, fence)?;
        let mut tx = PostgresObjectTx {
            client,
            s: &self.shared.s,
            object: &self.object,
            own_schema: &self.own_schema,
            failed: Cell::new(false),
            own_ready: &self.own_ready,
            own_created: Cell::new(false),
        };
        let value = f(&mut tx)?;
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

/// Runs `begin` (a `BEGIN` batch) and locks the object row, reading the
/// fence of `scope` when given (generation and holder; two `NULL`s
/// otherwise), pipelined: one round trip.
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
    let lock = async {
        match scope {
            None => {
                let st = client
                    .prepare_cached(&format!(
                        "SELECT NULL::bigint, NULL::bytea FROM {s}.durability_objects \
                         WHERE id = $1 FOR UPDATE"
                    ))
                    .await?;
                client.query(&st, &[&object]).await
            }
            // The fence is read by a statement of its own after the row
            // lock is taken (pipelined: still one round trip). Joined into
            // the locking statement, it would be read from that statement's
            // snapshot, taken before a wait for the lock: a stale holder
            // that waited while a new owner raised the fence would see the
            // old fence and commit past it.
            Some(scope) => {
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
                let (locked, fence) = futures::future::join(
                    client.query(&lock, &[&object]),
                    client.query(&read, &[&object, &scope]),
                )
                .await;
                locked?;
                fence
            }
        }
    };
    wait(futures::future::join(client.batch_execute(begin), lock))
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
