//! [`MemoryAlarmIndex`]: the in-memory [`AlarmIndex`], the model the
//! conformance suite checks the real backends against.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};

use durability_scheduler::ObjectId;

use crate::error::AlarmError;
use crate::index::{
    AlarmIndex, Claim, ClaimReady, IndexCounts, JobPage, JobPageRequest, JobState, JobView,
    RetryJob,
};
use crate::token::{Token, safe_add};

#[derive(Debug, Clone)]
struct Job {
    token: Token,
    due_at: i64,
    state: JobState,
    run: Option<Token>,
    tries: u32,
    /// Due time, retry time or lease expiry while due or running.
    score: i64,
}

#[derive(Debug, Default)]
struct State {
    jobs: BTreeMap<ObjectId, Job>,
    scheduled: BTreeSet<(i64, ObjectId)>,
    ready: BTreeSet<(i64, ObjectId)>,
}

impl State {
    /// Whether `object`'s job is running under the claim `run`.
    fn runs_under(&self, object: &ObjectId, run: &Token) -> bool {
        self.jobs
            .get(object)
            .is_some_and(|j| j.state == JobState::Running && j.run.as_ref() == Some(run))
    }

    fn unindex(&mut self, object: &ObjectId) -> Option<Job> {
        let job = self.jobs.remove(object)?;
        self.scheduled.remove(&(job.score, object.clone()));
        self.ready.remove(&(job.due_at, object.clone()));
        Some(job)
    }

    fn insert(&mut self, object: ObjectId, job: Job) {
        match job.state {
            JobState::Ready => self.ready.insert((job.due_at, object.clone())),
            JobState::Due | JobState::Running => self.scheduled.insert((job.score, object.clone())),
        };
        self.jobs.insert(object, job);
    }
}

/// An in-memory alarm index (one process; nothing survives a restart).
#[derive(Debug, Default)]
pub struct MemoryAlarmIndex {
    state: Mutex<State>,
}

impl MemoryAlarmIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl AlarmIndex for MemoryAlarmIndex {
    async fn jobs_with_prefix(&self, page: JobPageRequest<'_>) -> Result<JobPage, AlarmError> {
        let (prefix, cursor, limit) = (page.prefix, page.cursor, page.checked_limit()?);
        let s = self.lock();
        // The cursor is the last object id listed; the ids are ordered, so
        // the next page starts after it (a model: a scan is fine here).
        let jobs: Vec<(ObjectId, JobView)> = s
            .jobs
            .iter()
            .filter(|(o, _)| o.as_str().starts_with(prefix))
            .filter(|(o, _)| cursor.is_none_or(|c| o.as_str() > c))
            .take(limit)
            .map(|(object, job)| {
                (
                    object.clone(),
                    JobView {
                        token: job.token.clone(),
                        due_at: job.due_at,
                        state: job.state,
                        tries: job.tries,
                    },
                )
            })
            .collect();
        let cursor = if jobs.len() == limit {
            jobs.last().map(|(o, _)| o.as_str().to_owned())
        } else {
            None
        };
        Ok(JobPage { jobs, cursor })
    }

    async fn upsert(
        &self,
        object: &ObjectId,
        token: &Token,
        due_at: i64,
    ) -> Result<bool, AlarmError> {
        let mut s = self.lock();
        if s.jobs
            .get(object)
            .is_some_and(|j| &j.token == token && j.due_at == due_at)
        {
            return Ok(false);
        }
        s.unindex(object);
        s.insert(
            object.clone(),
            Job {
                token: token.clone(),
                due_at,
                state: JobState::Due,
                run: None,
                tries: 0,
                score: due_at,
            },
        );
        Ok(true)
    }

    async fn delete(&self, object: &ObjectId, token: &Token) -> Result<bool, AlarmError> {
        let mut s = self.lock();
        if s.jobs.get(object).is_some_and(|j| &j.token == token) {
            s.unindex(object);
            return Ok(true);
        }
        Ok(false)
    }

    async fn job(&self, object: &ObjectId) -> Result<Option<JobView>, AlarmError> {
        Ok(self.lock().jobs.get(object).map(|j| JobView {
            token: j.token.clone(),
            due_at: j.due_at,
            state: j.state,
            tries: j.tries,
        }))
    }

    async fn promote(&self, now: i64, limit: usize) -> Result<usize, AlarmError> {
        let mut s = self.lock();
        let due: Vec<(i64, ObjectId)> = s
            .scheduled
            .iter()
            .take_while(|(score, _)| *score <= now)
            .take(limit)
            .cloned()
            .collect();
        for (_, object) in &due {
            if let Some(mut job) = s.unindex(object) {
                job.state = JobState::Ready;
                job.run = None;
                s.insert(object.clone(), job);
            }
        }
        Ok(due.len())
    }

    async fn claim(&self, claim: ClaimReady<'_>) -> Result<Option<Claim>, AlarmError> {
        let ClaimReady { now, lease_ms, run } = claim;
        let mut s = self.lock();
        let Some((_, object)) = s.ready.iter().next().cloned() else {
            return Ok(None);
        };
        let Some(mut job) = s.unindex(&object) else {
            return Ok(None);
        };
        job.state = JobState::Running;
        job.run = Some(run.clone());
        job.tries = job.tries.saturating_add(1);
        job.score = safe_add(now, lease_ms);
        let claim = Claim {
            object: object.clone(),
            token: job.token.clone(),
            due_at: job.due_at,
            run: run.clone(),
            tries: job.tries,
            lease_until: job.score,
        };
        s.insert(object, job);
        Ok(Some(claim))
    }

    async fn finish(&self, object: &ObjectId, run: &Token) -> Result<bool, AlarmError> {
        let mut s = self.lock();
        if s.runs_under(object, run) {
            s.unindex(object);
            return Ok(true);
        }
        Ok(false)
    }

    async fn retry(&self, retry: RetryJob<'_>) -> Result<bool, AlarmError> {
        let mut s = self.lock();
        if !s.runs_under(retry.object, retry.run) {
            return Ok(false);
        }
        if let Some(mut job) = s.unindex(retry.object) {
            job.state = JobState::Due;
            job.run = None;
            job.tries = retry.tries;
            job.score = safe_add(retry.now, retry.delay_ms.max(0));
            s.insert(retry.object.clone(), job);
        }
        Ok(true)
    }

    async fn release(&self, object: &ObjectId, run: &Token, _now: i64) -> Result<bool, AlarmError> {
        let mut s = self.lock();
        if !s.runs_under(object, run) {
            return Ok(false);
        }
        if let Some(mut job) = s.unindex(object) {
            job.state = JobState::Ready;
            job.run = None;
            job.tries = job.tries.saturating_sub(1);
            job.score = job.due_at;
            s.insert(object.clone(), job);
        }
        Ok(true)
    }

    async fn next_due(&self) -> Result<Option<i64>, AlarmError> {
        let s = self.lock();
        let a = s.scheduled.iter().next().map(|(t, _)| *t);
        let b = s.ready.iter().next().map(|(t, _)| *t);
        Ok(match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    async fn counts(&self) -> Result<IndexCounts, AlarmError> {
        let s = self.lock();
        Ok(IndexCounts {
            scheduled: s.scheduled.len() as u64,
            ready: s.ready.len() as u64,
        })
    }
}

#[cfg(any(test, feature = "conformance"))]
mod object_rows {
    use durability_scheduler::StorageError;
    use durability_scheduler::testkit::MemoryTx;

    use crate::store::{AlarmRow, AlarmTx};

    #[derive(Debug, Clone, Default)]
    struct MemAlarmRow(Option<AlarmRow>);

    impl AlarmTx for MemoryTx<'_> {
        fn alarm_row(&mut self) -> Result<Option<AlarmRow>, StorageError> {
            Ok(self.ext::<MemAlarmRow>().0.clone())
        }

        fn put_alarm_row(&mut self, row: &AlarmRow) -> Result<(), StorageError> {
            self.ext::<MemAlarmRow>().0 = Some(row.clone());
            Ok(())
        }

        fn delete_alarm_row(&mut self) -> Result<bool, StorageError> {
            Ok(self.ext::<MemAlarmRow>().0.take().is_some())
        }
    }
}
