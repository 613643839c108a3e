//! The semaphore's decisions, as plain functions over what a transaction
//! read: validation, admission of a request, settling a due row, admitting
//! the queue's head, renewal, use and release. They read no storage and no
//! clock, so every backend (the in-object stores here, a PostgreSQL driver
//! later) reuses them unchanged.

use durability_time::MAX_SAFE_INTEGER;

use crate::error::SemaphoreError;
use crate::store::{Outcome, PoolRow, RequestRow, RequestState};

/// Longest pool name, idempotency key or holder name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Largest pool capacity (permits).
pub const MAX_CAPACITY: u64 = 1_000_000_000;
/// Largest queue bound of a pool (waiting requests).
pub const MAX_QUEUE: u64 = 100_000;
/// A pool's queue bound unless configured.
pub const DEFAULT_MAX_QUEUE: u64 = 1_000;
/// Longest lease and longest queue wait, in ms (2^31-1, as every timeout).
pub const MAX_LEASE_MS: i64 = (1 << 31) - 1;
/// Longest queue wait of a request, in ms.
pub const MAX_WAIT_MS: i64 = MAX_LEASE_MS;
/// A request's lease unless set: 30 s.
pub const DEFAULT_LEASE_MS: i64 = 30_000;
/// A request's queue wait unless set: 30 s.
pub const DEFAULT_WAIT_MS: i64 = 30_000;
/// How long a finished request's key is remembered unless configured: 24 h.
pub const DEFAULT_KEY_RETENTION_MS: i64 = 86_400_000;
/// Longest key retention, in ms.
pub const MAX_KEY_RETENTION_MS: i64 = MAX_LEASE_MS;

/// A request for permits from one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquire {
    /// The pool to take permits from.
    pub pool: String,
    /// The idempotency key: a retry with the same key returns what the
    /// first request got, and never grants twice.
    pub key: String,
    /// The shard asking (the holder learns about shards only from this).
    pub holder: String,
    /// Permits asked for: 1 ..= the pool's capacity.
    pub count: u64,
    /// The lease of the grant, and of each renewal (ms): 1 ..= 2^31-1.
    pub lease_ms: i64,
    /// How long the request may wait in the queue (ms): 0 ..= 2^31-1;
    /// 0 asks for permits now or not at all.
    pub wait_ms: i64,
}

impl Acquire {
    /// A request for `count` permits of `pool` under `key`, by `holder`,
    /// with the default lease and wait.
    pub fn new(
        pool: impl Into<String>,
        key: impl Into<String>,
        holder: impl Into<String>,
        count: u64,
    ) -> Self {
        Self {
            pool: pool.into(),
            key: key.into(),
            holder: holder.into(),
            count,
            lease_ms: DEFAULT_LEASE_MS,
            wait_ms: DEFAULT_WAIT_MS,
        }
    }

    /// Sets the lease (ms).
    #[must_use]
    pub fn lease_ms(mut self, ms: i64) -> Self {
        self.lease_ms = ms;
        self
    }

    /// Sets the queue wait (ms); 0: now or not at all.
    #[must_use]
    pub fn wait_ms(mut self, ms: i64) -> Self {
        self.wait_ms = ms;
        self
    }
}

/// A pool's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Permits that may be held at once: 1 ..= [`MAX_CAPACITY`].
    pub capacity: u64,
    /// Requests that may wait: 0 ..= [`MAX_QUEUE`] (default
    /// [`DEFAULT_MAX_QUEUE`]).
    pub max_queue: u64,
    /// How long a finished key is remembered (ms): 1 ..= 2^31-1 (default
    /// [`DEFAULT_KEY_RETENTION_MS`]).
    pub key_retention_ms: i64,
}

impl PoolConfig {
    /// A pool of `capacity` permits with the default queue bound and key
    /// retention.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            max_queue: DEFAULT_MAX_QUEUE,
            key_retention_ms: DEFAULT_KEY_RETENTION_MS,
        }
    }

    /// Sets the queue bound.
    #[must_use]
    pub fn max_queue(mut self, n: u64) -> Self {
        self.max_queue = n;
        self
    }

    /// Sets the key retention (ms).
    #[must_use]
    pub fn key_retention_ms(mut self, ms: i64) -> Self {
        self.key_retention_ms = ms;
        self
    }
}

/// Checks a pool name, key or holder name.
///
/// # Errors
/// [`SemaphoreError::InvalidName`].
pub fn check_name(field: &'static str, value: &str) -> Result<(), SemaphoreError> {
    let too_long = "must be at most 256 bytes";
    durability_time::check_name(value, MAX_NAME_BYTES, too_long).map_err(|reason| {
        SemaphoreError::InvalidName {
            field,
            value: value.chars().take(MAX_NAME_BYTES).collect(),
            reason,
        }
    })
}

fn check_range(
    field: &'static str,
    value: i128,
    min: i128,
    max: i128,
) -> Result<(), SemaphoreError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    Err(SemaphoreError::InvalidNumber {
        field,
        value,
        reason: format!("must be in {min}..={max}"),
    })
}

/// Checks the holder's clock reading: a safe, non-negative integer.
///
/// # Errors
/// [`SemaphoreError::InvalidNumber`].
pub fn check_now(now: i64) -> Result<(), SemaphoreError> {
    check_range("now", now.into(), 0, MAX_SAFE_INTEGER.into())
}

/// Checks a pool's settings.
///
/// # Errors
/// [`SemaphoreError::InvalidName`] or [`SemaphoreError::InvalidNumber`].
pub fn check_pool(name: &str, config: &PoolConfig) -> Result<(), SemaphoreError> {
    check_name("pool", name)?;
    check_range("capacity", config.capacity.into(), 1, MAX_CAPACITY.into())?;
    check_range("max_queue", config.max_queue.into(), 0, MAX_QUEUE.into())?;
    check_range(
        "key_retention_ms",
        config.key_retention_ms.into(),
        1,
        MAX_KEY_RETENTION_MS.into(),
    )
}

/// Checks a request's fields (the count against the pool comes later).
///
/// # Errors
/// [`SemaphoreError::InvalidName`] or [`SemaphoreError::InvalidNumber`].
pub fn check_acquire(req: &Acquire) -> Result<(), SemaphoreError> {
    check_name("pool", &req.pool)?;
    check_name("key", &req.key)?;
    check_name("holder", &req.holder)?;
    check_range("count", req.count.into(), 1, MAX_CAPACITY.into())?;
    check_range("lease_ms", req.lease_ms.into(), 1, MAX_LEASE_MS.into())?;
    check_range("wait_ms", req.wait_ms.into(), 0, MAX_WAIT_MS.into())
}

/// `now + ms`, kept a safe integer.
fn after(now: i64, ms: i64) -> i64 {
    now.saturating_add(ms).min(MAX_SAFE_INTEGER)
}

/// What an acquire does, decided from the pool and the key's stored request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireDecision {
    /// The key was seen before: answer with its stored request, write nothing.
    Existing(RequestRow),
    /// Grant now.
    Grant,
    /// Wait in the queue until the deadline.
    Queue {
        /// When it leaves the queue ungranted.
        deadline: i64,
    },
}

/// Decides an acquire after the pool was settled at `now`: a retried key
/// gets its stored request (the same parameters, or a conflict); a new one
/// is granted when nothing waits ahead of it and enough permits are free
/// (no barging past the queue's head), queued when it may wait and the
/// queue has room, refused otherwise.
///
/// # Errors
/// [`SemaphoreError::KeyConflict`], [`SemaphoreError::CountExceedsCapacity`],
/// [`SemaphoreError::NoPermits`], [`SemaphoreError::QueueFull`].
pub fn decide_acquire(
    pool: &PoolRow,
    existing: Option<&RequestRow>,
    req: &Acquire,
    now: i64,
) -> Result<AcquireDecision, SemaphoreError> {
    if let Some(row) = existing {
        if row.holder != req.holder || row.count != req.count || row.lease_ms != req.lease_ms {
            return Err(SemaphoreError::KeyConflict {
                pool: req.pool.clone(),
                key: req.key.clone(),
            });
        }
        return Ok(AcquireDecision::Existing(row.clone()));
    }
    if req.count > pool.capacity {
        return Err(SemaphoreError::CountExceedsCapacity {
            pool: pool.name.clone(),
            count: req.count,
            capacity: pool.capacity,
        });
    }
    if pool.queued == 0 && req.count <= pool.free() {
        return Ok(AcquireDecision::Grant);
    }
    if req.wait_ms == 0 {
        return Err(SemaphoreError::NoPermits {
            pool: pool.name.clone(),
            count: req.count,
        });
    }
    if pool.queued >= pool.max_queue {
        return Err(SemaphoreError::QueueFull {
            pool: pool.name.clone(),
            max_queue: pool.max_queue,
        });
    }
    Ok(AcquireDecision::Queue {
        deadline: after(now, req.wait_ms),
    })
}

/// The new request row of an acquire that was not seen before, with the
/// pool's accounting: granted now, or queued until `queue_until`.
pub fn admit(
    pool: &mut PoolRow,
    req: &Acquire,
    id: u64,
    queue_until: Option<i64>,
    now: i64,
) -> RequestRow {
    let state = match queue_until {
        None => {
            pool.held += req.count;
            pool.granted = pool.granted.saturating_add(req.count);
            RequestState::Granted {
                lease_until: after(now, req.lease_ms),
                used: 0,
            }
        }
        Some(deadline) => {
            pool.queued += 1;
            RequestState::Queued { deadline }
        }
    };
    RequestRow {
        pool: req.pool.clone(),
        key: req.key.clone(),
        id,
        holder: req.holder.clone(),
        count: req.count,
        lease_ms: req.lease_ms,
        state,
    }
}

/// A request finished at `now` with `outcome`, remembered for the pool's
/// key retention.
fn finish(pool: &PoolRow, row: &RequestRow, outcome: Outcome, now: i64) -> RequestRow {
    RequestRow {
        state: RequestState::Finished {
            outcome,
            forget_at: after(now, pool.key_retention_ms),
            was_granted: matches!(row.state, RequestState::Granted { .. }),
        },
        ..row.clone()
    }
}

/// Ends a live request in the pool's accounting, the one place requests
/// leave: a grant returns its permits (`held` down, the `granted_as`
/// total up by its count), a waiter leaves the queue (`queued` down, the
/// `waiting_as` total up by one). `None` for a finished request.
fn end(
    pool: &mut PoolRow,
    row: &RequestRow,
    granted_as: Outcome,
    waiting_as: Outcome,
) -> Option<Outcome> {
    let (outcome, n) = match row.state {
        RequestState::Granted { .. } => {
            pool.held = pool.held.saturating_sub(row.count);
            (granted_as, row.count)
        }
        RequestState::Queued { .. } => {
            pool.queued = pool.queued.saturating_sub(1);
            (waiting_as, 1)
        }
        RequestState::Finished { .. } => return None,
    };
    let total = match outcome {
        Outcome::Released => &mut pool.released,
        Outcome::Expired => &mut pool.expired,
        Outcome::TimedOut => &mut pool.timed_out,
        Outcome::Cancelled => &mut pool.cancelled,
    };
    *total = total.saturating_add(n);
    Some(outcome)
}

/// What settling one row due at `now` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DueChange {
    /// Store the row as changed; it finished with this outcome.
    Finish(RequestRow, Outcome),
    /// Forget the finished row: its key is free again.
    Forget,
    /// Nothing is due on it yet.
    Keep,
}

/// Settles one row that may be due: a grant whose lease passed returns
/// its permits (`expired`), a waiter whose deadline passed leaves the
/// queue (`timed_out`), a finished row past its retention is forgotten.
pub fn settle_due_row(pool: &mut PoolRow, row: &RequestRow, now: i64) -> DueChange {
    if row.due_at() > now {
        return DueChange::Keep;
    }
    let Some(outcome) = end(pool, row, Outcome::Expired, Outcome::TimedOut) else {
        return DueChange::Forget;
    };
    let finished = finish(pool, row, outcome, now);
    if finished.due_at() <= now {
        // Retention already over (a clock at the end of the safe range).
        return DueChange::Forget;
    }
    DueChange::Finish(finished, outcome)
}

/// What the queue's head does when the pool is settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueStep {
    /// It is granted now (the row as granted).
    Grant(RequestRow),
    /// It leaves the queue: its count exceeds the (shrunk) capacity.
    Cancel(RequestRow),
    /// It waits; so does everyone behind it (no barging).
    Blocked,
}

/// Admits the queue's head at `now` if enough permits are free.
pub fn admit_head(pool: &mut PoolRow, waiter: &RequestRow, now: i64) -> QueueStep {
    if waiter.count > pool.capacity {
        end(pool, waiter, Outcome::Released, Outcome::Cancelled);
        return QueueStep::Cancel(finish(pool, waiter, Outcome::Cancelled, now));
    }
    if waiter.count > pool.free() {
        return QueueStep::Blocked;
    }
    pool.queued = pool.queued.saturating_sub(1);
    pool.held += waiter.count;
    pool.granted = pool.granted.saturating_add(waiter.count);
    QueueStep::Grant(RequestRow {
        state: RequestState::Granted {
            lease_until: after(now, waiter.lease_ms),
            used: 0,
        },
        ..waiter.clone()
    })
}

fn check_holder(row: &RequestRow, holder: &str) -> Result<(), SemaphoreError> {
    if row.holder == holder {
        return Ok(());
    }
    Err(SemaphoreError::NotHolder {
        id: row.id,
        holder: row.holder.clone(),
    })
}

/// A live grant of `holder` (its lease deadline and used count), or why not.
fn live_grant(row: &RequestRow, holder: &str) -> Result<(i64, u64), SemaphoreError> {
    check_holder(row, holder)?;
    match row.state {
        RequestState::Granted { lease_until, used } => Ok((lease_until, used)),
        RequestState::Queued { .. } => Err(SemaphoreError::NotGranted { id: row.id }),
        RequestState::Finished { outcome, .. } => Err(SemaphoreError::Finished {
            id: row.id,
            outcome,
        }),
    }
}

/// Renews a live grant of `holder` at `now`: its lease runs its
/// `lease_ms` from now.
///
/// # Errors
/// [`SemaphoreError::NotHolder`], [`SemaphoreError::NotGranted`],
/// [`SemaphoreError::Finished`].
pub fn decide_renew(
    row: &RequestRow,
    holder: &str,
    now: i64,
) -> Result<RequestRow, SemaphoreError> {
    let (_, used) = live_grant(row, holder)?;
    Ok(RequestRow {
        state: RequestState::Granted {
            lease_until: after(now, row.lease_ms),
            used,
        },
        ..row.clone()
    })
}

/// Records that `total` permits of a live grant have been used so far
/// (they stay held until release or expiry). Reports are totals, not
/// increments, so a retried report counts once: a total at or below what
/// is recorded changes nothing (`None`), a higher one adds the difference
/// to the pool's `used`.
///
/// # Errors
/// [`SemaphoreError::InvalidNumber`] for a `total` of 0 or above the
/// capacity limit, [`SemaphoreError::UsedExceedsCount`] above the grant's
/// count, and the errors of [`decide_renew`].
pub fn decide_used(
    pool: &mut PoolRow,
    row: &RequestRow,
    holder: &str,
    total: u64,
) -> Result<Option<RequestRow>, SemaphoreError> {
    check_range("used", total.into(), 1, MAX_CAPACITY.into())?;
    let (lease_until, used) = live_grant(row, holder)?;
    if total > row.count {
        return Err(SemaphoreError::UsedExceedsCount {
            id: row.id,
            used: total,
            count: row.count,
        });
    }
    if total <= used {
        return Ok(None);
    }
    pool.used = pool.used.saturating_add(total - used);
    Ok(Some(RequestRow {
        state: RequestState::Granted {
            lease_until,
            used: total,
        },
        ..row.clone()
    }))
}

/// Releases a request of `holder` at `now`: a grant returns its permits
/// (`released`), a queued request is withdrawn (`cancelled`). `None` when
/// it finished already (a retried release): nothing changes.
///
/// # Errors
/// [`SemaphoreError::NotHolder`].
pub fn decide_release(
    pool: &mut PoolRow,
    row: &RequestRow,
    holder: &str,
    now: i64,
) -> Result<Option<(RequestRow, Outcome)>, SemaphoreError> {
    check_holder(row, holder)?;
    let Some(outcome) = end(pool, row, Outcome::Released, Outcome::Cancelled) else {
        return Ok(None);
    };
    Ok(Some((finish(pool, row, outcome, now), outcome)))
}
