//! The backend job index: the [`AlarmIndex`] trait and its plain data.
//!
//! One job per object (keyed by [`ObjectId`]), carrying the row token of the
//! object's alarm row. A job is in one of three states:
//!
//! - **due**: scheduled at a time (a retry is due at its backoff time);
//! - **ready**: promoted because its time came, waiting to be claimed;
//! - **running**: claimed under a run token with a lease. A running job is
//!   indexed among the due jobs at its lease expiry, so once the lease runs
//!   out [`AlarmIndex::promote`] makes it ready again (and the old run token
//!   can no longer settle it).
//!
//! Retry and discard state is the job's try count plus the settlement calls:
//! [`AlarmIndex::retry`] returns it to due, [`AlarmIndex::finish`] removes it
//! (success, discard or a gone object). Every settlement is fenced by the run
//! token; every user mutation by the row token.
//!
//! Times: operations that read "now" take it as a parameter. The SQLite and
//! in-memory indexes use it; the Redis index uses the server's `TIME` in
//! production and the caller's time only when configured to (tests driving a
//! manual clock).

use std::future::Future;

use durability_scheduler::ObjectId;

use crate::error::AlarmError;
use crate::token::Token;

/// The state of a job in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for its time.
    Due,
    /// Promoted, waiting to be claimed.
    Ready,
    /// Claimed under a run token until its lease expires.
    Running,
}

/// One job as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobView {
    /// The row token of the object's alarm row.
    pub token: Token,
    /// When the alarm is scheduled (Unix ms).
    pub due_at: i64,
    /// Its state.
    pub state: JobState,
    /// Claims made so far for this row token.
    pub tries: u32,
}

/// A job claimed for dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The object the alarm belongs to.
    pub object: ObjectId,
    /// The row token the delivery carries.
    pub token: Token,
    /// When the alarm was scheduled.
    pub due_at: i64,
    /// The run token fencing this claim's settlement.
    pub run: Token,
    /// This claim's try number (1 for the first).
    pub tries: u32,
    /// When the claim lease expires (index time).
    pub lease_until: i64,
}

/// A request to claim the earliest ready job ([`AlarmIndex::claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimReady<'a> {
    /// The index time the claim is made at (Unix ms).
    pub now: i64,
    /// How long the claim lease lasts from `now`, in milliseconds.
    pub lease_ms: i64,
    /// The run token fencing the claim's settlement.
    pub run: &'a Token,
}

/// A request to return a running job to due ([`AlarmIndex::retry`]),
/// fenced by the run token of its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryJob<'a> {
    /// The object the job belongs to.
    pub object: &'a ObjectId,
    /// The run token of the claim being settled.
    pub run: &'a Token,
    /// The index time the retry is decided at (Unix ms).
    pub now: i64,
    /// How long after `now` the job is due again, in milliseconds (negative
    /// delays count as 0).
    pub delay_ms: i64,
    /// The try count the job keeps.
    pub tries: u32,
}

/// Job counts, for tests and operators.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexCounts {
    /// Jobs due or running (running ones are indexed at their lease expiry).
    pub scheduled: u64,
    /// Jobs ready to be claimed.
    pub ready: u64,
}

/// Checks a [`AlarmIndex::jobs_with_prefix`] page limit (at least 1), for
/// backends.
///
/// # Errors
/// [`AlarmError::InvalidConfig`] for 0.
pub fn validate_page_limit(limit: usize) -> Result<(), AlarmError> {
    if limit == 0 {
        return Err(AlarmError::InvalidConfig {
            reason: "a job page limit must be at least 1".to_owned(),
        });
    }
    Ok(())
}

/// Which page of jobs [`AlarmIndex::jobs_with_prefix`] lists: named
/// fields, so the prefix and the cursor (both strings) cannot be swapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobPageRequest<'a> {
    /// The object-id prefix (`"<storage id>:"` for a storage's jobs).
    pub prefix: &'a str,
    /// `None` for the first page, then the previous page's cursor.
    pub cursor: Option<&'a str>,
    /// About how many jobs a page holds (at least 1).
    pub limit: usize,
}

impl<'a> JobPageRequest<'a> {
    /// The first page of the jobs under `prefix`, about `limit` of them.
    #[must_use]
    pub const fn first(prefix: &'a str, limit: usize) -> Self {
        Self {
            prefix,
            cursor: None,
            limit,
        }
    }

    /// This request from `cursor` (a previous page's; `None` for the first).
    #[must_use]
    pub const fn after(self, cursor: Option<&'a str>) -> Self {
        Self { cursor, ..self }
    }

    /// The page limit, checked as [`validate_page_limit`] does.
    ///
    /// # Errors
    /// [`AlarmError::InvalidConfig`] for a limit of 0.
    pub fn checked_limit(&self) -> Result<usize, AlarmError> {
        validate_page_limit(self.limit)?;
        Ok(self.limit)
    }
}

/// One page of [`AlarmIndex::jobs_with_prefix`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobPage {
    /// Jobs whose object id starts with the prefix (due, ready or running;
    /// quarantined jobs are not listed), in no promised order.
    pub jobs: Vec<(ObjectId, JobView)>,
    /// Where the next page starts, or `None` when this was the last one.
    /// Opaque: pass it back unchanged.
    pub cursor: Option<String>,
}

impl IndexCounts {
    /// Every job in the index.
    pub fn total(&self) -> u64 {
        self.scheduled + self.ready
    }
}

/// The backend job index that owns due / ready / running / retry / discard
/// state for every object's alarm.
///
/// Every method is atomic on the backend. Errors are classified as
/// [`AlarmError::BackendUnavailable`] (nothing was attempted),
/// [`AlarmError::BackendFailed`] (rejected before mutating) or
/// [`AlarmError::ResultUnknown`].
pub trait AlarmIndex: Send + Sync + 'static {
    /// Sets the object's job to `token` due at `due_at`, replacing any job of
    /// the object (whatever its state: a running claim loses its fence).
    /// Idempotent: a job already at this token and time is left as it is
    /// (state and tries included). Returns whether anything changed.
    ///
    /// # Errors
    /// A backend failure, classified as above.
    fn upsert(
        &self,
        object: &ObjectId,
        token: &Token,
        due_at: i64,
    ) -> impl Future<Output = Result<bool, AlarmError>> + Send;

    /// Removes the object's job if it carries `token`; whether it did.
    ///
    /// # Errors
    /// A backend failure.
    fn delete(
        &self,
        object: &ObjectId,
        token: &Token,
    ) -> impl Future<Output = Result<bool, AlarmError>> + Send;

    /// The object's job, if any.
    ///
    /// # Errors
    /// A backend failure.
    fn job(
        &self,
        object: &ObjectId,
    ) -> impl Future<Output = Result<Option<JobView>, AlarmError>> + Send;

    /// Moves up to `limit` jobs whose time (due time, retry time or lease
    /// expiry) is at or before `now` to ready, earliest first; how many.
    ///
    /// # Errors
    /// A backend failure.
    fn promote(
        &self,
        now: i64,
        limit: usize,
    ) -> impl Future<Output = Result<usize, AlarmError>> + Send;

    /// Claims the earliest ready job under the run token `claim.run` with a
    /// lease of `claim.lease_ms` from `claim.now`: it becomes running, its
    /// tries go up by one.
    ///
    /// # Errors
    /// A backend failure.
    fn claim(
        &self,
        claim: ClaimReady<'_>,
    ) -> impl Future<Output = Result<Option<Claim>, AlarmError>> + Send;

    /// Removes the job if it is still running under `run` (success, discard,
    /// or an object that is gone); whether it did.
    ///
    /// # Errors
    /// A backend failure.
    fn finish(
        &self,
        object: &ObjectId,
        run: &Token,
    ) -> impl Future<Output = Result<bool, AlarmError>> + Send;

    /// Returns the job to due at `retry.now + retry.delay_ms` with
    /// `retry.tries` tries, if it is still running under `retry.run`; whether
    /// it did.
    ///
    /// # Errors
    /// A backend failure.
    fn retry(&self, retry: RetryJob<'_>) -> impl Future<Output = Result<bool, AlarmError>> + Send;

    /// Claims up to `runs.len()` ready jobs, earliest first, the i-th under
    /// run token `runs[i]`, each as [`AlarmIndex::claim`] does; fewer when
    /// fewer are ready. The default loops over `claim` (one round trip per
    /// job; a failure after some claims returns those, the next call
    /// reports it); backends override it with one round trip for the batch.
    ///
    /// # Errors
    /// A backend failure before any job was claimed.
    fn claim_batch(
        &self,
        now: i64,
        lease_ms: i64,
        runs: &[Token],
    ) -> impl Future<Output = Result<Vec<Claim>, AlarmError>> + Send {
        async move {
            let mut claims = Vec::with_capacity(runs.len());
            for run in runs {
                match self.claim(ClaimReady { now, lease_ms, run }).await {
                    Ok(Some(claim)) => claims.push(claim),
                    Ok(None) => break,
                    Err(e) if claims.is_empty() => return Err(e),
                    Err(_) => break,
                }
            }
            Ok(claims)
        }
    }

    /// Gives a claim back unused: if the job is still running under `run`,
    /// it becomes ready again at once, its try count back to what it was
    /// before the claim (the delivery never started); whether it did. A
    /// dispatcher that stops releases the claims it will not deliver, so
    /// another dispatcher takes them without waiting for the lease.
    ///
    /// The default reads the job's tries and calls [`AlarmIndex::retry`]
    /// with no delay (due at `now`, so the next promotion makes it ready):
    /// sound because `retry` checks the run token, so a job claimed again in
    /// between is left alone.
    ///
    /// # Errors
    /// A backend failure.
    fn release(
        &self,
        object: &ObjectId,
        run: &Token,
        now: i64,
    ) -> impl Future<Output = Result<bool, AlarmError>> + Send {
        async move {
            let Some(job) = self.job(object).await? else {
                return Ok(false);
            };
            if job.state != JobState::Running {
                return Ok(false);
            }
            self.retry(RetryJob {
                object,
                run,
                now,
                delay_ms: 0,
                tries: job.tries.saturating_sub(1),
            })
            .await
        }
    }

    /// The earliest time some job needs attention (ready jobs count as their
    /// due time), if any.
    ///
    /// # Errors
    /// A backend failure.
    fn next_due(&self) -> impl Future<Output = Result<Option<i64>, AlarmError>> + Send;

    /// How many jobs are scheduled and ready.
    ///
    /// # Errors
    /// A backend failure.
    fn counts(&self) -> impl Future<Output = Result<IndexCounts, AlarmError>> + Send;

    /// Finds jobs by object-id prefix, a page at a time: storage cleanup
    /// lists the jobs of a deleted storage id (`"<storage id>:"`) this way
    /// and removes each with [`AlarmIndex::delete`] at its listed token.
    /// Start with `cursor: None`, then pass the previous page's cursor
    /// until it is `None`. A page holds about `limit` jobs (a backend that
    /// scans, as Redis's `SCAN` does, may return a few more, or fewer
    /// before the last page); a job present for the whole listing is
    /// listed at least once (Redis may list it twice); jobs added or
    /// removed meanwhile may or may not be.
    ///
    /// # Errors
    /// [`AlarmError::InvalidConfig`] for a `limit` of 0 or a cursor this
    /// backend did not hand out; a backend failure.
    fn jobs_with_prefix(
        &self,
        page: JobPageRequest<'_>,
    ) -> impl Future<Output = Result<JobPage, AlarmError>> + Send;
}

impl<T: AlarmIndex> AlarmIndex for std::sync::Arc<T> {
    fn jobs_with_prefix(
        &self,
        page: JobPageRequest<'_>,
    ) -> impl Future<Output = Result<JobPage, AlarmError>> + Send {
        (**self).jobs_with_prefix(page)
    }
    fn upsert(
        &self,
        object: &ObjectId,
        token: &Token,
        due_at: i64,
    ) -> impl Future<Output = Result<bool, AlarmError>> + Send {
        (**self).upsert(object, token, due_at)
    }
    fn delete(
        &self,
        object: &ObjectId,
        token: &Token,
    ) -> impl Future<Output = Result<bool, AlarmError>> + Send {
        (**self).delete(object, token)
    }
    fn job(
        &self,
        object: &ObjectId,
    ) -> impl Future<Output = Result<Option<JobView>, AlarmError>> + Send {
        (**self).job(object)
    }
    fn promote(
        &self,
        now: i64,
        limit: usize,
    ) -> impl Future<Output = Result<usize, AlarmError>> + Send {
        (**self).promote(now, limit)
    }
    fn claim(
        &self,
        claim: ClaimReady<'_>,
    ) -> impl Future<Output = Result<Option<Claim>, AlarmError>> + Send {
        (**self).claim(claim)
    }
    fn finish(
        &self,
        object: &ObjectId,
        run: &Token,
    ) -> impl Future<Output = Result<bool, AlarmError>> + Send {
        (**self).finish(object, run)
    }
    fn retry(&self, retry: RetryJob<'_>) -> impl Future<Output = Result<bool, AlarmError>> + Send {
        (**self).retry(retry)
    }
    fn claim_batch(
        &self,
        now: i64,
        lease_ms: i64,
        runs: &[Token],
    ) -> impl Future<Output = Result<Vec<Claim>, AlarmError>> + Send {
        (**self).claim_batch(now, lease_ms, runs)
    }
    fn release(
        &self,
        object: &ObjectId,
        run: &Token,
        now: i64,
    ) -> impl Future<Output = Result<bool, AlarmError>> + Send {
        (**self).release(object, run, now)
    }
    fn next_due(&self) -> impl Future<Output = Result<Option<i64>, AlarmError>> + Send {
        (**self).next_due()
    }
    fn counts(&self) -> impl Future<Output = Result<IndexCounts, AlarmError>> + Send {
        (**self).counts()
    }
}
