//! The object's alarm row (`AlarmTx` on [`SkeletonTx`]) and the backend job
//! index ([`SkeletonAlarmIndex`]: `AlarmIndex`).

use durability_alarms::{
    AlarmError, AlarmIndex, AlarmRow, AlarmTx, Claim, ClaimReady, IndexCounts, JobPage,
    JobPageRequest, JobView, ObjectId, RetryJob, Token,
};
use durability_scheduler::StorageError;

use crate::object::unsupported;
use crate::{SkeletonTx, Unsupported};

impl AlarmTx for SkeletonTx {
    fn alarm_row(&mut self) -> Result<Option<AlarmRow>, StorageError> {
        // The object's alarm row; a stored row failing validation is `StorageErrorKind::Corrupt`.
        Err(unsupported("alarm_row"))
    }

    fn put_alarm_row(&mut self, _row: &AlarmRow) -> Result<(), StorageError> {
        // Write the alarm row (time, token, fence), replacing any.
        Err(unsupported("put_alarm_row"))
    }

    fn delete_alarm_row(&mut self) -> Result<bool, StorageError> {
        // Delete the alarm row; whether there was one.
        Err(unsupported("delete_alarm_row"))
    }
}

/// The backend job index (stub).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct SkeletonAlarmIndex {}

impl SkeletonAlarmIndex {
    /// The stub index. A real backend connects here.
    pub fn new() -> Self {
        Self {}
    }
}

/// The stub alarm error: nothing was attempted.
fn unavailable(operation: &'static str) -> AlarmError {
    AlarmError::unavailable(Unsupported::new(operation))
}

impl AlarmIndex for SkeletonAlarmIndex {
    async fn upsert(
        &self,
        _object: &ObjectId,
        _token: &Token,
        _due_at: i64,
    ) -> Result<bool, AlarmError> {
        // Atomically replace the object's job (any state) unless already at this token and time; whether it changed.
        Err(unavailable("upsert"))
    }

    async fn delete(&self, _object: &ObjectId, _token: &Token) -> Result<bool, AlarmError> {
        // Remove the job only if it carries `token`; whether it did.
        Err(unavailable("delete"))
    }

    async fn job(&self, _object: &ObjectId) -> Result<Option<JobView>, AlarmError> {
        // The object's job: token, due time, state and tries.
        Err(unavailable("job"))
    }

    async fn promote(&self, _now: i64, _limit: usize) -> Result<usize, AlarmError> {
        // Make up to `limit` jobs whose time is at or before `now` ready, earliest first; how many.
        Err(unavailable("promote"))
    }

    async fn claim(&self, _claim: ClaimReady<'_>) -> Result<Option<Claim>, AlarmError> {
        // Atomically take the earliest ready job: running under the run token, lease from now, tries + 1.
        Err(unavailable("claim"))
    }

    async fn finish(&self, _object: &ObjectId, _run: &Token) -> Result<bool, AlarmError> {
        // Remove the job only while it is running under `run`; whether it did.
        Err(unavailable("finish"))
    }

    async fn retry(&self, _retry: RetryJob<'_>) -> Result<bool, AlarmError> {
        // Only while running under the run token: due again at now + delay with the given tries; whether it did.
        Err(unavailable("retry"))
    }

    async fn next_due(&self) -> Result<Option<i64>, AlarmError> {
        // The earliest time any job needs attention (ready jobs count at their due time).
        Err(unavailable("next_due"))
    }

    async fn counts(&self) -> Result<IndexCounts, AlarmError> {
        // How many jobs are scheduled (due or running) and ready.
        Err(unavailable("counts"))
    }

    async fn jobs_with_prefix(&self, _page: JobPageRequest<'_>) -> Result<JobPage, AlarmError> {
        // One page of the jobs whose object id starts with `prefix`, from
        // the opaque `cursor`; the next page's cursor, `None` at the end.
        Err(unavailable("jobs_with_prefix"))
    }
}
