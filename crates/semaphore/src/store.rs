//! What the semaphore keeps in the holder object's storage: the
//! [`SemaphoreTx`] trait a backend implements on its transaction type, the
//! pool row and the request row.

use durability_scheduler::{SchedulerTx, StorageError};

/// One pool as stored: its settings and its exact accounting.
///
/// The counters only ever increase (they are totals since the pool was
/// created), except `held` and `queued`, which are what is live now. The
/// accounting identity `granted == released + expired + held` holds after
/// every committed transaction (the conformance suite and the model test
/// check it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRow {
    /// The pool's name.
    pub name: String,
    /// How many permits may be held at once by new grants. A shrink never
    /// revokes a live grant: `held` may exceed it until enough return.
    pub capacity: u64,
    /// How many requests may wait in the queue.
    pub max_queue: u64,
    /// How long a finished request's key is remembered (ms), so a retry
    /// of it never grants again.
    pub key_retention_ms: i64,
    /// Permits in live grants now (the sum of their counts).
    pub held: u64,
    /// Requests waiting in the queue now.
    pub queued: u64,
    /// Permits ever granted (counted when a grant is made).
    pub granted: u64,
    /// Permits ever reported used by their holders ([`crate::Semaphore::used`]);
    /// a used permit is still held until its grant is released or expires.
    pub used: u64,
    /// Permits ever returned by [`crate::Semaphore::release`].
    pub released: u64,
    /// Permits ever returned because their grant's lease passed.
    pub expired: u64,
    /// Requests ever removed from the queue at their deadline, ungranted.
    pub timed_out: u64,
    /// Requests ever removed from the queue ungranted by their holder
    /// (a release of a queued request) or because the capacity shrank
    /// below their count.
    pub cancelled: u64,
}

impl PoolRow {
    /// A new, empty pool.
    pub fn new(name: &str, capacity: u64, max_queue: u64, key_retention_ms: i64) -> Self {
        Self {
            name: name.to_owned(),
            capacity,
            max_queue,
            key_retention_ms,
            held: 0,
            queued: 0,
            granted: 0,
            used: 0,
            released: 0,
            expired: 0,
            timed_out: 0,
            cancelled: 0,
        }
    }

    /// Permits a new grant may take now: capacity minus what is held
    /// (zero while a shrink left more held than the capacity).
    pub fn free(&self) -> u64 {
        self.capacity.saturating_sub(self.held)
    }
}

/// How a request left the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Its grant was released by its holder.
    Released,
    /// Its grant's lease passed without a renewal: the permits returned.
    Expired,
    /// It waited in the queue until its deadline, ungranted.
    TimedOut,
    /// It left the queue ungranted: withdrawn by its holder, or its count
    /// exceeded a shrunk capacity.
    Cancelled,
}

impl Outcome {
    /// The stored code of the outcome.
    pub fn code(self) -> i64 {
        match self {
            Self::Released => 0,
            Self::Expired => 1,
            Self::TimedOut => 2,
            Self::Cancelled => 3,
        }
    }

    /// The outcome of a stored code, if it is one.
    pub fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            0 => Self::Released,
            1 => Self::Expired,
            2 => Self::TimedOut,
            3 => Self::Cancelled,
            _ => return None,
        })
    }
}

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestState {
    /// Waiting in the pool's FIFO queue until `deadline` (Unix ms).
    Queued {
        /// When it leaves the queue ungranted.
        deadline: i64,
    },
    /// Holding its permits until `lease_until` (Unix ms, the holder's clock).
    Granted {
        /// When the permits return unless renewed.
        lease_until: i64,
        /// Permits of this grant reported used (at most its count).
        used: u64,
    },
    /// Finished; the key is remembered until `forget_at`.
    Finished {
        /// How it left the pool.
        outcome: Outcome,
        /// When the key is forgotten (a retry after it is a new request).
        forget_at: i64,
        /// Whether it was ever granted.
        was_granted: bool,
    },
}

/// One request as stored, keyed by pool and idempotency key. Its `id` is
/// object-wide, assigned on arrival in increasing order: the queue's FIFO
/// order and, once granted, the grant's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRow {
    /// The pool.
    pub pool: String,
    /// The idempotency key.
    pub key: String,
    /// The request's (and its grant's) id.
    pub id: u64,
    /// The shard that asked, as named in its request.
    pub holder: String,
    /// Permits asked for.
    pub count: u64,
    /// The lease a grant gets, and each renewal extends it by (ms).
    pub lease_ms: i64,
    /// Where it stands.
    pub state: RequestState,
}

impl RequestRow {
    /// When the semaphore must next look at this row: the lease deadline
    /// of a grant, the queue deadline of a waiter, the time a finished
    /// key is forgotten.
    pub fn due_at(&self) -> i64 {
        match self.state {
            RequestState::Queued { deadline } => deadline,
            RequestState::Granted { lease_until, .. } => lease_until,
            RequestState::Finished { forget_at, .. } => forget_at,
        }
    }
}

/// A stored request row that failed strict decoding, moved out of its pool
/// into the quarantine ([`SemaphoreTx::semaphore_quarantine`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptRequest {
    /// The pool it was in.
    pub pool: String,
    /// Its key as read (lossily, for a key that is not UTF-8 text).
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The semaphore's rows in the holder object's storage.
///
/// Every method runs inside the caller's transaction. A stored row that
/// fails strict decoding is a
/// [`StorageErrorKind::Corrupt`](durability_scheduler::StorageErrorKind::Corrupt)
/// error, never a misread number.
pub trait SemaphoreTx: SchedulerTx {
    /// Returns the next object-wide request id (at least 1) and advances
    /// the counter; ids only ever increase.
    ///
    /// # Errors
    /// A backend failure, or a corrupt counter.
    fn semaphore_next_id(&mut self) -> Result<u64, StorageError>;

    /// The pool's row, if the pool exists.
    ///
    /// # Errors
    /// A backend failure, or a corrupt row.
    fn semaphore_pool(&mut self, pool: &str) -> Result<Option<PoolRow>, StorageError>;

    /// Inserts or replaces the pool's row.
    ///
    /// # Errors
    /// A backend failure.
    fn semaphore_put_pool(&mut self, row: &PoolRow) -> Result<(), StorageError>;

    /// The request of `key` in `pool`, in any state.
    ///
    /// # Errors
    /// A backend failure, or a corrupt row.
    fn semaphore_request(
        &mut self,
        pool: &str,
        key: &str,
    ) -> Result<Option<RequestRow>, StorageError>;

    /// The request with this id, in any state.
    ///
    /// # Errors
    /// A backend failure, or a corrupt row.
    fn semaphore_request_by_id(&mut self, id: u64) -> Result<Option<RequestRow>, StorageError>;

    /// Inserts or replaces the request of `row.pool` and `row.key`.
    ///
    /// # Errors
    /// A backend failure.
    fn semaphore_put_request(&mut self, row: &RequestRow) -> Result<(), StorageError>;

    /// Deletes the request of `key` in `pool`; whether it was there.
    ///
    /// # Errors
    /// A backend failure.
    fn semaphore_delete_request(&mut self, pool: &str, key: &str) -> Result<bool, StorageError>;

    /// Up to `limit` requests of `pool` (any state) due at or before
    /// `now`, earliest due first, then lowest id.
    ///
    /// # Errors
    /// A backend failure, or a corrupt row.
    fn semaphore_due(
        &mut self,
        pool: &str,
        now: i64,
        limit: usize,
    ) -> Result<Vec<RequestRow>, StorageError>;

    /// Up to `limit` queued requests of `pool` with an id above `after`,
    /// lowest id (the queue's head) first.
    ///
    /// # Errors
    /// A backend failure, or a corrupt row.
    fn semaphore_queue(
        &mut self,
        pool: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RequestRow>, StorageError>;

    /// How many queued requests of `pool` have an id below `id`.
    ///
    /// # Errors
    /// A backend failure.
    fn semaphore_queued_before(&mut self, pool: &str, id: u64) -> Result<u64, StorageError>;

    /// Up to `limit` distinct pools with a request due at or before `now`,
    /// by name.
    ///
    /// # Errors
    /// A backend failure.
    fn semaphore_due_pools(&mut self, now: i64, limit: usize) -> Result<Vec<String>, StorageError>;

    /// Moves every request row of `pool` that fails strict decoding into
    /// the quarantine, as stored, with the time `at`; returns them. The
    /// pool's row is not touched: the permits of a quarantined grant stay
    /// counted as held.
    ///
    /// # Errors
    /// A backend failure.
    fn semaphore_quarantine(
        &mut self,
        pool: &str,
        at: i64,
    ) -> Result<Vec<CorruptRequest>, StorageError>;

    /// Deletes the pool's row and every request row of the pool, without
    /// decoding them (a corrupt row is deleted too); whether the pool row
    /// was there.
    ///
    /// # Errors
    /// A backend failure.
    fn semaphore_delete_pool(&mut self, pool: &str) -> Result<bool, StorageError>;

    /// The earliest due time over every request of every pool.
    ///
    /// # Errors
    /// A backend failure.
    fn semaphore_next_due(&mut self) -> Result<Option<i64>, StorageError>;
}
