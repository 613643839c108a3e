//! The object side: `set_alarm` / `get_alarm` / `delete_alarm` on the
//! object's own alarm row, flushed to the [`AlarmIndex`] in API order, and
//! the delivery entry point that runs the object's [`AlarmHandler`].

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::ThreadId;

use durability_scheduler::{
    Clock, ObjectId, Scheduler, SchemaTarget, Storage, StorageError, StorageErrorKind, migrate,
};
use durability_time::timeout_at;
use tokio::sync::Notify;

use crate::SCHEMA;
use crate::dispatcher::{Delivery, DispatchOutcome};
use crate::error::{AlarmError, BoxError};
use crate::index::AlarmIndex;
use crate::policy::MUTATION_DEADLINE_MS;
use crate::store::{AlarmRow, AlarmTx};
use crate::token::{Token, validate_time};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The per-object mutation tail: tickets are taken in commit order and
/// backend effects run strictly in ticket order.
#[derive(Debug, Default)]
struct Tail {
    state: Mutex<TailState>,
    notify: Notify,
}

#[derive(Debug, Default)]
struct TailState {
    next: u64,
    serving: u64,
    done: BTreeSet<u64>,
}

/// A reserved place on the tail; dropping it gives the place up.
#[derive(Debug)]
struct Ticket {
    tail: Arc<Tail>,
    n: u64,
}

impl Tail {
    fn reserve(self: &Arc<Self>) -> Ticket {
        let mut s = lock(&self.state);
        let n = s.next;
        s.next += 1;
        Ticket {
            tail: Arc::clone(self),
            n,
        }
    }
}

impl Ticket {
    async fn turn(&self) {
        loop {
            let mut notified = pin!(self.tail.notify.notified());
            notified.as_mut().enable();
            if lock(&self.tail.state).serving == self.n {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = lock(&self.tail.state);
        s.done.insert(self.n);
        loop {
            let serving = s.serving;
            if !s.done.remove(&serving) {
                break;
            }
            s.serving += 1;
        }
        drop(s);
        self.tail.notify.notify_waiters();
    }
}

/// What the handler is told about the alarm it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired {
    /// When the alarm was scheduled.
    pub scheduled_at: i64,
    /// The try number (1 for the first).
    pub attempt: u32,
    /// Whether a failure discards the alarm.
    pub final_attempt: bool,
}

/// The object's alarm handler (a Durable Object's `alarm()`).
pub trait AlarmHandler: Send + Sync + 'static {
    /// Runs the alarm; an `Err` is a definite failure (retried with backoff).
    fn alarm(&self, fired: Fired) -> impl Future<Output = Result<(), BoxError>> + Send;
}

enum Last {
    Set(AlarmRow),
    Delete { token: Token, fence: Token },
    LocalDelete,
}

#[derive(Default)]
struct TxnState {
    /// The row the transaction started with, read at its first alarm call.
    baseline: Option<Option<AlarmRow>>,
    last: Option<Last>,
    ticket: Option<Ticket>,
    rolled_back: bool,
}

enum Effect {
    Set {
        row: AlarmRow,
        baseline: Option<AlarmRow>,
    },
    Delete {
        token: Token,
        fence: Token,
    },
}

/// Alarm calls inside one [`Alarms::transaction`].
///
/// Local writes happen in the transaction; the backend effect is flushed
/// once, after commit, as the coalesced final effect against the row the
/// transaction started with.
pub struct AlarmTxn<'a, 't, S: Storage> {
    tx: &'a mut S::Tx<'t>,
    tail: &'a Arc<Tail>,
    state: TxnState,
}

impl<S: Storage> std::fmt::Debug for AlarmTxn<'_, '_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlarmTxn").finish_non_exhaustive()
    }
}

impl<'t, S> AlarmTxn<'_, 't, S>
where
    S: Storage,
    for<'x> S::Tx<'x>: AlarmTx,
{
    /// The storage transaction, for the application's own rows (they commit
    /// or roll back with the alarm row).
    pub fn tx(&mut self) -> &mut S::Tx<'t> {
        self.tx
    }

    fn open(&self) -> Result<(), AlarmError> {
        if self.state.rolled_back {
            return Err(AlarmError::TransactionClosed);
        }
        Ok(())
    }

    fn baseline(&mut self) -> Result<Option<AlarmRow>, AlarmError> {
        if let Some(b) = &self.state.baseline {
            return Ok(b.clone());
        }
        let row = self.tx.alarm_row()?;
        self.state.baseline = Some(row.clone());
        Ok(row)
    }

    /// The alarm time in this transaction's view (local state only: no
    /// backend repair inside a transaction).
    ///
    /// # Errors
    /// [`AlarmError::TransactionClosed`] after a rollback; a storage failure.
    pub fn get_alarm(&mut self) -> Result<Option<i64>, AlarmError> {
        self.open()?;
        Ok(self
            .tx
            .alarm_row()?
            .filter(AlarmRow::is_pending)
            .map(|r| r.at))
    }

    /// Sets the alarm to `at` (Unix ms) in this transaction.
    ///
    /// # Errors
    /// [`AlarmError::InvalidTime`] (nothing written),
    /// [`AlarmError::TransactionClosed`] after a rollback, a storage failure.
    pub fn set_alarm(&mut self, at: i64) -> Result<(), AlarmError> {
        validate_time(at)?;
        self.open()?;
        self.baseline()?;
        let row = AlarmRow {
            at,
            token: Token::random(),
            fence: None,
        };
        self.tx.put_alarm_row(&row)?;
        self.state.last = Some(Last::Set(row));
        self.reserve();
        Ok(())
    }

    /// Deletes the alarm in this transaction. With a baseline row, the row
    /// is fenced (a pending delete) and the backend delete is sent after
    /// commit; without one, the delete stays local.
    ///
    /// # Errors
    /// [`AlarmError::TransactionClosed`] after a rollback, a storage failure.
    pub fn delete_alarm(&mut self) -> Result<(), AlarmError> {
        self.open()?;
        let keys = match self.baseline() {
            Ok(Some(b)) => {
                // A decoded baseline: put it back fenced (a set earlier in
                // this transaction replaced the row's token).
                let fence = b.fence.clone().unwrap_or_else(Token::random);
                self.tx.put_alarm_row(&AlarmRow {
                    at: b.at,
                    token: b.token.clone(),
                    fence: Some(fence.clone()),
                })?;
                self.state.last = Some(Last::Delete {
                    token: b.token,
                    fence,
                });
                self.reserve();
                return Ok(());
            }
            Ok(None) => None,
            // A corrupt or legacy row stays deletable: the fence touches only
            // the token and fence, so only those need to decode.
            Err(AlarmError::Storage(e)) if e.kind() == StorageErrorKind::Corrupt => {
                match self.tx.alarm_row_token() {
                    Ok(keys) => keys,
                    Err(e) if e.kind() == StorageErrorKind::Corrupt => {
                        // Not even the token decodes: no backend job can carry
                        // it, so the delete is local (a stray job's delivery
                        // finds no row and is ignored).
                        tracing::warn!(
                            event = "durability.alarms.corrupt_row_deleted",
                            %e,
                            "deleting a corrupt alarm row locally"
                        );
                        self.tx.delete_alarm_row()?;
                        self.state.last = Some(Last::LocalDelete);
                        self.reserve();
                        return Ok(());
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e),
        };
        match keys {
            Some((token, fence)) => {
                let fence = fence.unwrap_or_else(Token::random);
                self.tx.set_alarm_fence(&token, Some(&fence))?;
                self.state.last = Some(Last::Delete { token, fence });
            }
            None => {
                self.tx.delete_alarm_row()?;
                self.state.last = Some(Last::LocalDelete);
            }
        }
        self.reserve();
        Ok(())
    }

    /// Rolls the transaction back: every write of the callback is dropped,
    /// queued alarm effects too, and later alarm calls on it fail. The
    /// callback's `Ok` value is still returned.
    pub fn rollback(&mut self) {
        self.state.rolled_back = true;
        self.state.last = None;
        self.state.ticket = None;
    }

    fn reserve(&mut self) {
        if self.state.ticket.is_none() {
            self.state.ticket = Some(self.tail.reserve());
        }
    }
}

enum TxFail<R, E> {
    User(E),
    RolledBack(R),
}

impl<R, E: From<StorageError>> From<StorageError> for TxFail<R, E> {
    fn from(e: StorageError) -> Self {
        Self::User(E::from(e))
    }
}

struct Inner<S, I> {
    sched: Scheduler<S>,
    index: Arc<I>,
    tail: Arc<Tail>,
    active: Mutex<Option<ThreadId>>,
}

/// Clears the active-transaction marker when the callback ends.
struct ActiveGuard<'a>(&'a Mutex<Option<ThreadId>>);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        *lock(self.0) = None;
    }
}

/// One object's alarm: rows in the object's storage, jobs in the index.
///
/// Cloning shares the same object (and its mutation tail).
///
/// # Example
///
/// Alarm calls inside [`Alarms::transaction`] commit with the transaction's
/// other writes and reach the index once, after the commit: the last call
/// wins, and a transaction that fails changes neither the row nor the job.
///
/// ```
/// # use std::sync::Arc;
/// # use durability_alarms::conformance::memory_storage;
/// # use durability_alarms::{AlarmError, AlarmIndex, Alarms, MemoryAlarmIndex};
/// # use durability_scheduler::{ObjectContext, ObjectId, Scheduler};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let id = ObjectId::new("shop-1")?;
/// # let scheduler = Scheduler::new(ObjectContext::new(id.clone(), Arc::new(memory_storage())))?;
/// let index = Arc::new(MemoryAlarmIndex::new());
/// let alarms = Alarms::new(&scheduler, index.clone())?;
///
/// alarms
///     .transaction(|txn| -> Result<(), AlarmError> {
///         txn.set_alarm(1_800_000_000_000)?;
///         txn.set_alarm(1_700_000_000_000)?; // the last call wins
///         Ok(())
///     })
///     .await?;
/// assert_eq!(alarms.get_alarm().await?, Some(1_700_000_000_000));
/// assert_eq!(index.job(&id).await?.map(|j| j.due_at), Some(1_700_000_000_000));
///
/// let failed = alarms
///     .transaction(|txn| -> Result<(), AlarmError> {
///         txn.delete_alarm()?;
///         Err(AlarmError::NestedTransaction) // any error rolls back
///     })
///     .await;
/// assert!(failed.is_err());
/// assert_eq!(alarms.get_alarm().await?, Some(1_700_000_000_000));
/// assert!(index.job(&id).await?.is_some());
/// # Ok(())
/// # }
/// ```
pub struct Alarms<S, I> {
    inner: Arc<Inner<S, I>>,
}

impl<S, I> std::fmt::Debug for Alarms<S, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alarms")
            .field("scheduler", &self.inner.sched)
            .finish_non_exhaustive()
    }
}

impl<S, I> Clone for Alarms<S, I> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S, I> Alarms<S, I>
where
    S: Storage,
    for<'t> S::Tx<'t>: AlarmTx,
    I: AlarmIndex,
{
    /// The object's alarm on `sched`'s storage, with jobs in `index`;
    /// applies the alarm schema.
    ///
    /// # Errors
    /// A storage failure applying the schema; [`AlarmError::Schema`] when
    /// the stored alarm schema is newer than this code (nothing changed).
    pub fn new(sched: &Scheduler<S>, index: Arc<I>) -> Result<Self, AlarmError> {
        let storage = sched.context().storage();
        migrate(storage.as_ref(), SCHEMA, &SchemaTarget::Latest).map_err(|e| match e {
            durability_scheduler::SchedulerError::Storage(s) => AlarmError::Storage(s),
            other => AlarmError::Schema(other),
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                sched: sched.clone(),
                index,
                tail: Arc::default(),
                active: Mutex::new(None),
            }),
        })
    }

    /// The object's ID.
    pub fn object(&self) -> &ObjectId {
        self.inner.sched.context().id()
    }

    /// The object's storage.
    pub fn storage(&self) -> &Arc<S> {
        self.inner.sched.context().storage()
    }

    fn clock(&self) -> &Arc<dyn Clock> {
        self.inner.sched.context().clock()
    }

    /// Runs `f` in one storage transaction with alarm calls; after commit,
    /// flushes the coalesced alarm effect to the backend (in API order with
    /// every other alarm mutation of the object) and returns.
    ///
    /// If the flush fails, the transaction's other writes stay committed and
    /// the alarm row is compensated as for [`Alarms::set_alarm`] /
    /// [`Alarms::delete_alarm`]; do not blindly rerun the whole callback.
    ///
    /// # Errors
    /// [`AlarmError::NestedTransaction`] when called inside another
    /// transaction of this object (nothing runs); `f`'s error (rolled back);
    /// a storage failure; a flush failure.
    pub async fn transaction<R, E>(
        &self,
        f: impl FnOnce(&mut AlarmTxn<'_, '_, S>) -> Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<AlarmError> + From<StorageError>,
    {
        let me = std::thread::current().id();
        if *lock(&self.inner.active) == Some(me) {
            return Err(AlarmError::NestedTransaction.into());
        }
        let result = self.inner.sched.transaction(|tx| {
            *lock(&self.inner.active) = Some(me);
            let _active = ActiveGuard(&self.inner.active);
            let mut txn = AlarmTxn::<S> {
                tx,
                tail: &self.inner.tail,
                state: TxnState::default(),
            };
            let value = f(&mut txn).map_err(TxFail::User)?;
            let state = std::mem::take(&mut txn.state);
            if state.rolled_back {
                return Err(TxFail::RolledBack(value));
            }
            let baseline = state.baseline.flatten();
            let effect = match state.last {
                Some(Last::Set(row)) => Some(Effect::Set { row, baseline }),
                Some(Last::Delete { token, fence }) => Some(Effect::Delete { token, fence }),
                Some(Last::LocalDelete) | None => None,
            };
            Ok((value, effect, state.ticket))
        });
        let (value, effect, ticket) = match result {
            Ok(t) => t,
            Err(TxFail::User(e)) => return Err(e),
            Err(TxFail::RolledBack(v)) => return Ok(v),
        };
        if let Some(ticket) = ticket {
            ticket.turn().await;
            if let Some(effect) = effect {
                self.flush(effect).await.map_err(E::from)?;
            }
        }
        Ok(value)
    }

    /// Sets the alarm to `at` (Unix ms). On success the alarm is in the
    /// at-least-once delivery contract.
    ///
    /// # Errors
    /// - [`AlarmError::InvalidTime`]: nothing changed in either store.
    /// - [`AlarmError::BackendUnavailable`] / [`AlarmError::BackendFailed`]:
    ///   the backend did not change; the local row is restored to the
    ///   previous alarm (token-fenced: only if no later call replaced it).
    /// - [`AlarmError::ResultUnknown`]: the backend may hold the new or the
    ///   previous job; the new local row is kept (so `get_alarm` repair can
    ///   re-send it) and the previous alarm may no longer fire. Call
    ///   `set_alarm` again if the alarm is required.
    /// - A storage failure: nothing was sent.
    pub async fn set_alarm(&self, at: i64) -> Result<(), AlarmError> {
        validate_time(at)?;
        self.transaction(|t| t.set_alarm(at)).await
    }

    /// Deletes the alarm. After it returns `Ok`, the deleted occurrence never
    /// runs (a delivery already in flight may finish, and cannot resurrect
    /// it).
    ///
    /// # Errors
    /// A backend failure: the pending-delete fence is lifted again (token-
    /// fenced compensation), so the local row is back. With
    /// [`AlarmError::ResultUnknown`] the backend job may already be gone
    /// although the row is back: call `delete_alarm` again if deletion is
    /// required, or `set_alarm` if the alarm must stay. A storage failure:
    /// nothing was sent.
    pub async fn delete_alarm(&self) -> Result<(), AlarmError> {
        self.transaction(|t| t.delete_alarm()).await
    }

    /// The alarm time stored locally (`None` with no alarm or a pending
    /// delete). Outside a transaction, a pending row whose backend job is
    /// missing (or carries another token) is rewritten to the backend,
    /// idempotently and in API order ([`Alarms::repair`]); a repair failure
    /// is logged, never returned. Neither the time nor `None` confirms
    /// backend state.
    ///
    /// # Errors
    /// A storage failure reading the row.
    pub async fn get_alarm(&self) -> Result<Option<i64>, AlarmError> {
        let tail = &self.inner.tail;
        let (row, ticket) = self.inner.sched.transaction(|tx| {
            let row = tx.alarm_row()?;
            let ticket = row
                .as_ref()
                .filter(|r| r.is_pending())
                .map(|_| tail.reserve());
            Ok::<_, AlarmError>((row, ticket))
        })?;
        if let Some(ticket) = ticket {
            ticket.turn().await;
            if let Err(error) = self.repair_in_turn().await {
                self.repair_failed(&error);
            }
        }
        Ok(row.filter(AlarmRow::is_pending).map(|r| r.at))
    }

    /// Re-asserts the pending alarm row's job to the index (the seed's
    /// `getAlarm()` repair, as a call of its own): with no pending row it
    /// does nothing; otherwise, in API order with every other alarm
    /// mutation of this object, it re-reads the row and, when the index
    /// holds no job for it or a job of another token, upserts the row's
    /// token and time. Token-fenced: it only ever writes the token the
    /// live row carries at its turn, so it cannot resurrect a deleted or
    /// replaced alarm (a later delete's or set's flush comes after it). A
    /// repair racing a delivery's completion may leave a stray job, which
    /// its delivery ignores (no row carries its token). Call it when an
    /// owner opens the object ([`crate::SchedulerAlarm::sync_and_repair`]
    /// does): a row whose flush failed on an earlier owner, and whose
    /// compensation that owner could no longer write, is then scheduled
    /// again.
    ///
    /// Returns the pending row found at its turn (`None`: nothing to
    /// repair).
    ///
    /// # Errors
    /// A storage failure reading the row; a backend failure reading or
    /// writing the job (the row is left as it is).
    pub async fn repair(&self) -> Result<Option<AlarmRow>, AlarmError> {
        let tail = &self.inner.tail;
        let ticket = self.inner.sched.transaction(|tx| {
            Ok::<_, AlarmError>(
                tx.alarm_row()?
                    .filter(AlarmRow::is_pending)
                    .map(|_| tail.reserve()),
            )
        })?;
        let Some(ticket) = ticket else {
            return Ok(None);
        };
        ticket.turn().await;
        self.repair_in_turn().await
    }

    /// The repair itself, run while holding the object's turn on the tail.
    async fn repair_in_turn(&self) -> Result<Option<AlarmRow>, AlarmError> {
        let object = self.object();
        let row = self.inner.sched.transaction(|tx| tx.alarm_row())?;
        let Some(row) = row.filter(AlarmRow::is_pending) else {
            return Ok(None);
        };
        let job = self.backend(self.inner.index.job(object)).await?;
        if job.is_some_and(|j| j.token == row.token) {
            return Ok(Some(row));
        }
        if self
            .backend(self.inner.index.upsert(object, &row.token, row.at))
            .await?
        {
            tracing::warn!(
                event = "durability.alarms.repaired",
                object = %object,
                at = row.at,
                "the index held no job for the pending alarm row: repaired"
            );
        }
        Ok(Some(row))
    }

    fn repair_failed(&self, error: &AlarmError) {
        tracing::warn!(
            event = "durability.alarms.repair_failed",
            object = %self.object(),
            code = error.code(),
            %error,
            "repairing the alarm job failed"
        );
    }

    /// Runs a backend call under the mutation deadline.
    async fn backend<T>(
        &self,
        fut: impl Future<Output = Result<T, AlarmError>>,
    ) -> Result<T, AlarmError> {
        let deadline = self.clock().now_ms().saturating_add(MUTATION_DEADLINE_MS);
        timeout_at(&**self.clock(), deadline, fut)
            .await
            .unwrap_or_else(|_| Err(AlarmError::unknown("alarm mutation deadline (5 s) passed")))
    }

    async fn flush(&self, effect: Effect) -> Result<(), AlarmError> {
        let object = self.object().clone();
        match effect {
            Effect::Set { row, baseline } => {
                let result = self
                    .backend(self.inner.index.upsert(&object, &row.token, row.at))
                    .await;
                if let Err(error) = &result {
                    tracing::warn!(
                        event = "durability.alarms.set_failed",
                        object = %object,
                        code = error.code(),
                        %error,
                        "flushing an alarm set to the index failed"
                    );
                    if !error.is_result_unknown() {
                        self.compensate(|tx| {
                            if tx.alarm_row()?.is_some_and(|r| r.token == row.token) {
                                match &baseline {
                                    Some(b) => tx.put_alarm_row(b)?,
                                    None => {
                                        tx.delete_alarm_row()?;
                                    }
                                }
                            }
                            Ok(())
                        });
                    }
                }
                result.map(|_| ())
            }
            Effect::Delete { token, fence } => {
                let result = self.backend(self.inner.index.delete(&object, &token)).await;
                match &result {
                    Ok(_) => self.compensate(|tx| {
                        if tx
                            .alarm_row_token()?
                            .is_some_and(|(_, f)| f.as_ref() == Some(&fence))
                        {
                            tx.delete_alarm_row()?;
                        }
                        Ok(())
                    }),
                    Err(error) => {
                        tracing::warn!(
                            event = "durability.alarms.delete_failed",
                            object = %object,
                            code = error.code(),
                            %error,
                            "flushing an alarm delete to the index failed"
                        );
                        self.compensate(|tx| {
                            if let Some((token, f)) = tx.alarm_row_token()?
                                && f.as_ref() == Some(&fence)
                            {
                                tx.set_alarm_fence(&token, None)?;
                            }
                            Ok(())
                        });
                    }
                }
                result.map(|_| ())
            }
        }
    }

    /// A local follow-up write after a flush; failures are logged (the row
    /// stays as it is, which every reader handles).
    fn compensate(&self, f: impl FnOnce(&mut S::Tx<'_>) -> Result<(), StorageError>) {
        if let Err(error) = self.inner.sched.transaction(|tx| f(tx.storage_tx())) {
            tracing::warn!(
                event = "durability.alarms.compensation_failed",
                object = %self.object(),
                %error,
                "local follow-up write after a flush failed"
            );
        }
    }

    /// Refuses an alarm write from a synchronous transaction (one that
    /// cannot await the backend flush), after validating the input.
    ///
    /// # Errors
    /// Always: [`AlarmError::InvalidTime`] or [`AlarmError::SyncTransaction`].
    pub fn set_alarm_sync(&self, _tx: &mut S::Tx<'_>, at: i64) -> Result<(), AlarmError> {
        validate_time(at)?;
        Err(AlarmError::SyncTransaction)
    }

    /// Refuses an alarm delete from a synchronous transaction.
    ///
    /// # Errors
    /// Always: [`AlarmError::SyncTransaction`].
    pub fn delete_alarm_sync(&self, _tx: &mut S::Tx<'_>) -> Result<(), AlarmError> {
        Err(AlarmError::SyncTransaction)
    }

    /// Reads the alarm time inside a synchronous transaction (local state).
    ///
    /// # Errors
    /// A storage failure.
    pub fn get_alarm_sync(&self, tx: &mut S::Tx<'_>) -> Result<Option<i64>, AlarmError> {
        Ok(tx.alarm_row()?.filter(AlarmRow::is_pending).map(|r| r.at))
    }

    /// A delivery whose token the live row no longer carries. The row's own
    /// job is re-asserted ([`Alarms::repair`]) before this job is settled:
    /// the dispatcher then removes the delivered job, which would otherwise
    /// leave a row whose flush failed (say, the handler's next alarm) with
    /// no job at all. A row put back to this delivery's token meanwhile (a
    /// failed set compensated) makes it a never-started delivery, retried
    /// at once; a failed repair is a definite failure (backoff), so the job
    /// stays for another try.
    async fn superseded(&self, delivery: &Delivery) -> DispatchOutcome {
        match self.repair().await {
            Ok(Some(row)) if row.token == delivery.token => DispatchOutcome::NeverStarted {
                reason: "the alarm row carries this delivery's token again".to_owned(),
            },
            Ok(_) => DispatchOutcome::Ignored,
            Err(error) => {
                self.repair_failed(&error);
                DispatchOutcome::Failed {
                    reason: format!("re-asserting the alarm row's job failed: {error}"),
                }
            }
        }
    }

    /// Delivers one alarm to this object: runs `handler` if the object's
    /// live row still carries the delivery's token and is due.
    ///
    /// A pending delete or no row is ignored; a stale token is ignored once
    /// the live row's own job is re-asserted; a row not yet due is
    /// kept and reported [`DispatchOutcome::NotDue`]. On success the row is
    /// removed unless a newer alarm replaced it meanwhile; on the final
    /// failed try it is removed the same way (the alarm is discarded).
    pub async fn deliver<H: AlarmHandler>(
        &self,
        delivery: &Delivery,
        handler: &H,
    ) -> DispatchOutcome {
        let row = match self.inner.sched.transaction(|tx| tx.alarm_row()) {
            Ok(row) => row,
            // A corrupt row is a definite failure (backoff, then discard),
            // not "never started": retrying at once would spin on it.
            Err(error) if error.kind() == StorageErrorKind::Corrupt => {
                tracing::warn!(
                    event = "durability.alarms.corrupt_row",
                    object = %self.object(),
                    %error,
                    "the alarm row is corrupt; the delivery fails"
                );
                return DispatchOutcome::Failed {
                    reason: format!("corrupt alarm row: {error}"),
                };
            }
            Err(error) => {
                return DispatchOutcome::NeverStarted {
                    reason: format!("object storage failed: {error}"),
                };
            }
        };
        let row = match row {
            Some(r) if r.is_pending() && r.token == delivery.token => r,
            Some(r) if r.is_pending() => return self.superseded(delivery).await,
            _ => return DispatchOutcome::Ignored,
        };
        if row.at > self.clock().now_ms() {
            return DispatchOutcome::NotDue { at: row.at };
        }
        let fired = Fired {
            scheduled_at: row.at,
            attempt: delivery.attempt,
            final_attempt: delivery.final_attempt,
        };
        let result = handler.alarm(fired).await;
        let clear = result.is_ok() || delivery.final_attempt;
        if clear {
            self.compensate(|tx| {
                if tx
                    .alarm_row()?
                    .is_some_and(|r| r.is_pending() && r.token == delivery.token)
                {
                    tx.delete_alarm_row()?;
                }
                Ok(())
            });
        }
        match result {
            Ok(()) => DispatchOutcome::Delivered,
            Err(e) => DispatchOutcome::Failed {
                reason: e.to_string(),
            },
        }
    }
}
