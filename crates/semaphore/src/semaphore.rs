//! The semaphore attached to the holder object: pools, requests, the alarm.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use durability_scheduler::{Capability, Scheduler, Storage, Transaction};
use futures::future::BoxFuture;

use crate::decide::{
    self, Acquire, AcquireDecision, DueChange, PoolConfig, QueueStep, check_acquire, check_name,
    check_now, check_pool,
};
use crate::error::SemaphoreError;
use crate::event::{EventHook, EventKind, SemaphoreEvent, emit};
use crate::store::{CorruptRequest, Outcome, PoolRow, RequestRow, RequestState, SemaphoreTx};

/// The schema (and capability) name the semaphore registers.
pub const SCHEMA: &str = "semaphore";
/// The semaphore's schema history, registered under [`SCHEMA`] by every
/// backend: pools, requests and ids (1), the quarantine (2).
pub const SCHEMA_STEPS: &[durability_scheduler::SchemaStep] = &[
    durability_scheduler::SchemaStep::new(1, "initial"),
    durability_scheduler::SchemaStep::new(2, "quarantine"),
];

/// Rows read per page while settling a pool or running the alarm.
const PAGE: usize = 64;

/// Permits held by one shard: what [`Semaphore::acquire`] grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The grant's id (the request's id): renew, use and release by it.
    pub id: u64,
    /// The pool.
    pub pool: String,
    /// The idempotency key of the request.
    pub key: String,
    /// The holder.
    pub holder: String,
    /// Permits held.
    pub count: u64,
    /// Permits reported used so far.
    pub used: u64,
    /// When the permits return to the pool unless renewed (Unix ms, the
    /// holder object's clock).
    pub lease_until: i64,
}

/// What a request got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// Permits were granted (now, or earlier for a retried key).
    Granted(Grant),
    /// The request waits in the queue.
    Queued {
        /// The request's id.
        id: u64,
        /// Its place in the queue: 1 is the head.
        position: u64,
        /// When it leaves the queue ungranted.
        deadline: i64,
    },
    /// The key's request already finished (a retry after release, expiry,
    /// time-out or cancellation): nothing is granted again.
    Finished {
        /// The request's id.
        id: u64,
        /// How it finished.
        outcome: Outcome,
    },
}

/// What [`Semaphore::release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// This call finished the request: a grant returned its permits
    /// ([`Outcome::Released`]) or a queued request left the queue
    /// ([`Outcome::Cancelled`]).
    Now(Outcome),
    /// It had finished before (a retried release): nothing changed.
    Already(Outcome),
}

/// The semaphore's settings.
#[derive(Clone, Default)]
pub struct SemaphoreConfig {
    on_event: Option<EventHook>,
}

impl fmt::Debug for SemaphoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphoreConfig")
            .field("on_event", &self.on_event.is_some())
            .finish()
    }
}

impl SemaphoreConfig {
    /// Reports every committed event to `hook` (a host wakes waiting
    /// shards on [`EventKind::Granted`]).
    #[must_use]
    pub fn on_event(mut self, hook: impl Fn(&SemaphoreEvent) + Send + Sync + 'static) -> Self {
        self.on_event = Some(Arc::new(hook));
        self
    }
}

struct Inner<S: Storage> {
    scheduler: Scheduler<S>,
    on_event: Option<EventHook>,
    /// Whether this semaphore is the one attached (a refused attach must
    /// not detach the one that is, when dropped).
    attached: AtomicBool,
}

impl<S: Storage> Drop for Inner<S> {
    fn drop(&mut self) {
        if self.attached.load(Ordering::SeqCst) {
            self.scheduler.detach(SCHEMA);
        }
    }
}

/// The semaphore of one holder object: every pool of the object, one
/// capability on its scheduler. Cloning shares it.
pub struct Semaphore<S: Storage> {
    inner: Arc<Inner<S>>,
}

impl<S: Storage> Clone for Semaphore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: Storage> fmt::Debug for Semaphore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore").finish_non_exhaustive()
    }
}

/// The scheduler holds the semaphore weakly, so dropping every handle frees it.
struct Attachment<S: Storage>(Weak<Inner<S>>);

impl<S> Capability for Attachment<S>
where
    S: Storage,
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    fn run(&self, _now_ms: i64) -> BoxFuture<'_, ()> {
        if let Some(inner) = self.0.upgrade() {
            let semaphore = Semaphore { inner };
            if let Err(e) = semaphore.run_due() {
                tracing::warn!(
                    event = "durability.semaphore.run_failed",
                    code = e.code(),
                    error = %e,
                    "settling due grants and waiters failed; the alarm stays due"
                );
            }
        }
        Box::pin(async {})
    }
}

/// What one operation changed, reported after its commit.
#[derive(Default)]
struct Changes(Vec<SemaphoreEvent>);

impl Changes {
    fn push(&mut self, row: &RequestRow, kind: EventKind) {
        self.0.push(SemaphoreEvent {
            pool: row.pool.clone(),
            key: row.key.clone(),
            holder: row.holder.clone(),
            id: row.id,
            count: row.count,
            kind,
        });
    }
}

/// The grant a granted row holds. Only called on rows the decisions just
/// made or kept grants of; any other row would read as used 0 with its
/// due time as the lease.
fn grant(row: &RequestRow) -> Grant {
    let (lease_until, used) = match row.state {
        RequestState::Granted { lease_until, used } => (lease_until, used),
        _ => (row.due_at(), 0),
    };
    Grant {
        id: row.id,
        pool: row.pool.clone(),
        key: row.key.clone(),
        holder: row.holder.clone(),
        count: row.count,
        used,
        lease_until,
    }
}

impl<S> Semaphore<S>
where
    S: Storage,
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    /// Attaches the object's semaphore to its scheduler (capability and
    /// schema `semaphore`) and applies the schema.
    ///
    /// # Errors
    /// A scheduler error: a semaphore is attached already, or the schema
    /// cannot be applied; nothing is attached then.
    pub fn attach(
        scheduler: &Scheduler<S>,
        config: SemaphoreConfig,
    ) -> Result<Self, SemaphoreError> {
        let inner = Arc::new(Inner {
            scheduler: scheduler.clone(),
            on_event: config.on_event,
            attached: AtomicBool::new(false),
        });
        let attachment: Arc<dyn Capability> = Arc::new(Attachment(Arc::downgrade(&inner)));
        scheduler.attach(SCHEMA, Some(SCHEMA), attachment)?;
        inner.attached.store(true, Ordering::SeqCst);
        Ok(Self { inner })
    }

    /// The scheduler the semaphore is attached to.
    pub fn scheduler(&self) -> &Scheduler<S> {
        &self.inner.scheduler
    }

    fn now(&self) -> Result<i64, SemaphoreError> {
        let now = self.inner.scheduler.now_ms();
        check_now(now)?;
        Ok(now)
    }

    /// Reports `changes` once `tx` commits, and moves the alarm to the
    /// earliest due row in `tx`.
    fn finish_tx(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        changes: Changes,
    ) -> Result<(), SemaphoreError> {
        let due = tx.semaphore_next_due()?;
        tx.set_due(SCHEMA, due)?;
        if !changes.0.is_empty() {
            let hook = self.inner.on_event.clone();
            tx.after_commit(move || {
                for e in &changes.0 {
                    emit(hook.as_ref(), e);
                }
            });
        }
        Ok(())
    }

    /// Creates the pool `name` or changes its settings, in `tx`.
    ///
    /// A capacity change never revokes a live grant: after a shrink below
    /// what is held, new grants wait until enough permits return, and a
    /// queued request asking for more than the new capacity leaves the
    /// queue ([`Outcome::Cancelled`]) when it reaches the head. After a growth the queue's head is
    /// granted at once, in FIFO order.
    ///
    /// # Errors
    /// [`SemaphoreError::InvalidName`] or [`SemaphoreError::InvalidNumber`]
    /// before anything is written; a storage error (roll back).
    pub fn configure(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        name: &str,
        config: PoolConfig,
    ) -> Result<PoolRow, SemaphoreError> {
        check_pool(name, &config)?;
        let now = self.now()?;
        let before = tx.semaphore_pool(name)?;
        let mut pool = before.clone().unwrap_or_else(|| {
            PoolRow::new(
                name,
                config.capacity,
                config.max_queue,
                config.key_retention_ms,
            )
        });
        pool.capacity = config.capacity;
        pool.max_queue = config.max_queue;
        pool.key_retention_ms = config.key_retention_ms;
        let mut changes = Changes::default();
        settle(tx, &mut pool, now, &mut changes)?;
        if before.as_ref() != Some(&pool) {
            tx.semaphore_put_pool(&pool)?;
        }
        changes.0.push(SemaphoreEvent {
            pool: name.to_owned(),
            key: String::new(),
            holder: String::new(),
            id: 0,
            count: config.capacity,
            kind: EventKind::Configured {
                from: before.map(|p| p.capacity),
            },
        });
        self.finish_tx(tx, changes)?;
        Ok(pool)
    }

    /// The pool's row (settings and accounting), settled at now in `tx`.
    ///
    /// # Errors
    /// [`SemaphoreError::UnknownPool`]; a storage error.
    pub fn pool(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        name: &str,
    ) -> Result<PoolRow, SemaphoreError> {
        check_name("pool", name)?;
        let now = self.now()?;
        let mut changes = Changes::default();
        let pool = settled_pool(tx, name, now, &mut changes)?;
        self.finish_tx(tx, changes)?;
        Ok(pool)
    }

    /// Deletes the pool `name` and every request of it, in `tx`, without
    /// reading them: the operator's repair of a pool whose row is corrupt
    /// (every call of the pool fails with `SEMAPHORE_CORRUPT` until then;
    /// the other pools are not affected). Its live grants are forgotten:
    /// their holders' renewals and releases get
    /// [`SemaphoreError::UnknownGrant`]; configure the pool again to use
    /// it. Returns whether the pool row was there.
    ///
    /// # Errors
    /// [`SemaphoreError::InvalidName`]; a storage error.
    pub fn delete_pool(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        name: &str,
    ) -> Result<bool, SemaphoreError> {
        check_name("pool", name)?;
        let existed = tx.semaphore_delete_pool(name)?;
        let pool = name.to_owned();
        tx.after_commit(move || crate::event::pool_deleted(&pool, existed));
        self.finish_tx(tx, Changes::default())?;
        Ok(existed)
    }

    /// Asks for permits, in `tx`: grants them when nothing waits ahead and
    /// enough are free, queues the request otherwise (FIFO, until its
    /// `wait_ms` passes). A retry with the same key returns the same grant,
    /// the queued position, or how the request finished: it never grants
    /// twice.
    ///
    /// # Errors
    /// Refusals before anything is written: [`SemaphoreError::InvalidName`],
    /// [`SemaphoreError::InvalidNumber`], [`SemaphoreError::UnknownPool`],
    /// [`SemaphoreError::CountExceedsCapacity`], [`SemaphoreError::KeyConflict`],
    /// [`SemaphoreError::NoPermits`] and [`SemaphoreError::QueueFull`] (both
    /// retryable); a storage error (roll back).
    pub fn acquire(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        req: &Acquire,
    ) -> Result<Acquired, SemaphoreError> {
        check_acquire(req)?;
        let now = self.now()?;
        let mut changes = Changes::default();
        let mut pool = settled_pool(tx, &req.pool, now, &mut changes)?;
        let existing = tx.semaphore_request(&req.pool, &req.key)?;
        let decision = decide::decide_acquire(&pool, existing.as_ref(), req, now)?;
        let mut insert = |queue_until| -> Result<RequestRow, SemaphoreError> {
            let id = tx.semaphore_next_id()?;
            let row = decide::admit(&mut pool, req, id, queue_until, now);
            tx.semaphore_put_request(&row)?;
            tx.semaphore_put_pool(&pool)?;
            changes.push(&row, event_of(&row));
            Ok(row)
        };
        let row = match decision {
            AcquireDecision::Existing(row) => row,
            AcquireDecision::Grant => insert(None)?,
            AcquireDecision::Queue { deadline } => insert(Some(deadline))?,
        };
        let acquired = match row.state {
            RequestState::Granted { .. } => Acquired::Granted(grant(&row)),
            RequestState::Queued { deadline } => Acquired::Queued {
                id: row.id,
                position: tx.semaphore_queued_before(&row.pool, row.id)? + 1,
                deadline,
            },
            RequestState::Finished { outcome, .. } => Acquired::Finished {
                id: row.id,
                outcome,
            },
        };
        self.finish_tx(tx, changes)?;
        Ok(acquired)
    }

    /// Reads the request `id` of `holder` with its pool, settled at now.
    fn request_of(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        holder: &str,
        id: u64,
        changes: &mut Changes,
    ) -> Result<(i64, PoolRow, RequestRow), SemaphoreError> {
        check_name("holder", holder)?;
        let now = self.now()?;
        let Some(row) = tx.semaphore_request_by_id(id)? else {
            return Err(SemaphoreError::UnknownGrant { id });
        };
        let pool = settled_pool(tx, &row.pool, now, changes)?;
        // Settling may have finished or forgotten it.
        let row = tx
            .semaphore_request(&row.pool, &row.key)?
            .filter(|r| r.id == id)
            .ok_or(SemaphoreError::UnknownGrant { id })?;
        Ok((now, pool, row))
    }

    /// Renews the grant `id` of `holder`, in `tx`: its lease runs its
    /// `lease_ms` from now. A grant whose lease passed is over, even if
    /// the alarm has not run yet.
    ///
    /// # Errors
    /// [`SemaphoreError::UnknownGrant`], [`SemaphoreError::NotHolder`],
    /// [`SemaphoreError::NotGranted`], [`SemaphoreError::Finished`] before
    /// anything is written; a storage error.
    pub fn renew(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        holder: &str,
        id: u64,
    ) -> Result<Grant, SemaphoreError> {
        let mut changes = Changes::default();
        let (now, _, row) = self.request_of(tx, holder, id, &mut changes)?;
        let renewed = decide::decide_renew(&row, holder, now)?;
        tx.semaphore_put_request(&renewed)?;
        let grant = grant(&renewed);
        changes.push(
            &renewed,
            EventKind::Renewed {
                lease_until: grant.lease_until,
            },
        );
        self.finish_tx(tx, changes)?;
        Ok(grant)
    }

    /// Reports that `total` permits of the grant `id` have been used so
    /// far, in `tx`. Used permits stay held (they count against the
    /// capacity) until the grant is released or expires; the pool's `used`
    /// total counts them. Reports are totals, so a retry counts once: a
    /// total at or below the recorded one changes nothing.
    ///
    /// # Errors
    /// As [`Semaphore::renew`], and [`SemaphoreError::UsedExceedsCount`] or
    /// [`SemaphoreError::InvalidNumber`]; nothing is written then.
    pub fn used(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        holder: &str,
        id: u64,
        total: u64,
    ) -> Result<Grant, SemaphoreError> {
        let mut changes = Changes::default();
        let (_, mut pool, row) = self.request_of(tx, holder, id, &mut changes)?;
        let before = grant(&row).used;
        let row = match decide::decide_used(&mut pool, &row, holder, total)? {
            Some(updated) => {
                tx.semaphore_put_request(&updated)?;
                tx.semaphore_put_pool(&pool)?;
                let n = total - before;
                changes.push(&updated, EventKind::Used { n });
                updated
            }
            None => row,
        };
        self.finish_tx(tx, changes)?;
        Ok(grant(&row))
    }

    /// Releases the request `id` of `holder`, in `tx`: a grant returns its
    /// permits and the queue's head is granted in FIFO order; a queued
    /// request leaves the queue. A retried release changes nothing.
    ///
    /// # Errors
    /// [`SemaphoreError::UnknownGrant`] (never existed, or forgotten after
    /// the key retention), [`SemaphoreError::NotHolder`]; a storage error.
    pub fn release(
        &self,
        tx: &mut Transaction<'_, '_, S>,
        holder: &str,
        id: u64,
    ) -> Result<Released, SemaphoreError> {
        let mut changes = Changes::default();
        let (now, mut pool, row) = self.request_of(tx, holder, id, &mut changes)?;
        let Some((finished, outcome)) = decide::decide_release(&mut pool, &row, holder, now)?
        else {
            let RequestState::Finished { outcome, .. } = row.state else {
                return Err(SemaphoreError::UnknownGrant { id });
            };
            self.finish_tx(tx, changes)?;
            return Ok(Released::Already(outcome));
        };
        tx.semaphore_put_request(&finished)?;
        changes.push(&finished, EventKind::Finished { outcome });
        admit_queue(tx, &mut pool, now, &mut changes)?;
        tx.semaphore_put_pool(&pool)?;
        self.finish_tx(tx, changes)?;
        Ok(Released::Now(outcome))
    }

    /// Settles every pool with a row due now, each in a transaction of its
    /// own: expired grants return their permits, waiters past their
    /// deadline leave the queue, the queue's head is granted, forgotten
    /// keys are deleted. A pool that fails on a corrupt request row has
    /// the row quarantined ([`Semaphore::quarantine`]) and is settled
    /// again, so it never blocks the others. The alarm calls it; returns
    /// how many pools were settled.
    ///
    /// # Errors
    /// The first failure of a pool that could not be settled (the others
    /// were); the alarm stays due and is retried.
    pub fn run_due(&self) -> Result<usize, SemaphoreError> {
        let now = self.now()?;
        let pools = self
            .inner
            .scheduler
            .transaction(|tx| tx.semaphore_due_pools(now, usize::MAX))?;
        let mut first_error = None;
        for name in &pools {
            let result = match self.settle_alone(name, now) {
                Err(e) if e.code() == "SEMAPHORE_CORRUPT" => self
                    .quarantine(name)
                    .and_then(|_| self.settle_alone(name, now)),
                other => other,
            };
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(pools.len()), Err)
    }

    /// Settles one pool at `now` in a transaction of its own.
    fn settle_alone(&self, name: &str, now: i64) -> Result<(), SemaphoreError> {
        self.inner.scheduler.transaction(|tx| {
            let mut changes = Changes::default();
            settled_pool(tx, name, now, &mut changes)?;
            self.finish_tx(tx, changes)
        })
    }

    /// Moves every request row of the pool `name` that fails strict
    /// decoding into the quarantine, in a transaction of its own, and
    /// reports each (`durability.semaphore.quarantined`). The permits of a
    /// quarantined grant stay counted as held. The alarm calls it when a
    /// pool fails on a corrupt row; operators may call it too.
    ///
    /// # Errors
    /// A storage failure; nothing is moved then.
    pub fn quarantine(&self, name: &str) -> Result<Vec<CorruptRequest>, SemaphoreError> {
        check_name("pool", name)?;
        let now = self.now()?;
        self.inner.scheduler.transaction(|tx| {
            let moved = tx.semaphore_quarantine(name, now)?;
            let reported = moved.clone();
            tx.after_commit(move || reported.iter().for_each(crate::event::quarantined));
            self.finish_tx(tx, Changes::default())?;
            Ok(moved)
        })
    }
}

fn event_of(row: &RequestRow) -> EventKind {
    match row.state {
        RequestState::Granted { lease_until, .. } => EventKind::Granted { lease_until },
        RequestState::Queued { deadline } => EventKind::Queued { deadline },
        RequestState::Finished { outcome, .. } => EventKind::Finished { outcome },
    }
}

/// Reads the pool and settles it at `now`, writing what changed.
fn settled_pool<S>(
    tx: &mut Transaction<'_, '_, S>,
    name: &str,
    now: i64,
    changes: &mut Changes,
) -> Result<PoolRow, SemaphoreError>
where
    S: Storage,
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    let Some(before) = tx.semaphore_pool(name)? else {
        return Err(SemaphoreError::UnknownPool {
            pool: name.to_owned(),
        });
    };
    let mut pool = before.clone();
    settle(tx, &mut pool, now, changes)?;
    if pool != before {
        tx.semaphore_put_pool(&pool)?;
    }
    Ok(pool)
}

/// Settles `pool` at `now`: rows due (expired grants, timed-out waiters,
/// forgotten keys), then the queue's head. The caller stores the pool row.
fn settle<S>(
    tx: &mut Transaction<'_, '_, S>,
    pool: &mut PoolRow,
    now: i64,
    changes: &mut Changes,
) -> Result<(), SemaphoreError>
where
    S: Storage,
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    loop {
        let due = tx.semaphore_due(&pool.name, now, PAGE)?;
        for row in &due {
            match decide::settle_due_row(pool, row, now) {
                DueChange::Finish(finished, outcome) => {
                    tx.semaphore_put_request(&finished)?;
                    changes.push(&finished, EventKind::Finished { outcome });
                }
                DueChange::Forget => {
                    tx.semaphore_delete_request(&row.pool, &row.key)?;
                }
                DueChange::Keep => {}
            }
        }
        if due.len() < PAGE {
            break;
        }
    }
    admit_queue(tx, pool, now, changes)
}

/// Grants the queue's head while enough permits are free, in FIFO order.
fn admit_queue<S>(
    tx: &mut Transaction<'_, '_, S>,
    pool: &mut PoolRow,
    now: i64,
    changes: &mut Changes,
) -> Result<(), SemaphoreError>
where
    S: Storage,
    for<'t> S::Tx<'t>: SemaphoreTx,
{
    let mut after = 0;
    while pool.queued > 0 {
        let page = tx.semaphore_queue(&pool.name, after, PAGE)?;
        for waiter in &page {
            after = waiter.id;
            let (row, kind) = match decide::admit_head(pool, waiter, now) {
                QueueStep::Grant(row) => {
                    let kind = event_of(&row);
                    (row, kind)
                }
                QueueStep::Cancel(row) => (
                    row,
                    EventKind::Finished {
                        outcome: Outcome::Cancelled,
                    },
                ),
                QueueStep::Blocked => return Ok(()),
            };
            tx.semaphore_put_request(&row)?;
            changes.push(&row, kind);
        }
        if page.len() < PAGE {
            break;
        }
    }
    Ok(())
}
