//! Operator views of an [`AlarmIndex`]: one page of jobs and the counts, as
//! `Serialize` reports.

use serde::Serialize;

use crate::ObjectId;
use crate::error::AlarmError;
use crate::index::{AlarmIndex, IndexCounts, JobPageRequest, JobState, JobView};

/// One job of the index, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobReport {
    /// The object the job belongs to.
    pub object: String,
    /// The row token of the object's alarm row.
    pub token: String,
    /// When the alarm is scheduled (Unix ms).
    pub due_at: i64,
    /// `due`, `ready` or `running`.
    pub state: &'static str,
    /// Claims made so far for this row token.
    pub tries: u32,
}

impl JobReport {
    /// Describes one listed job.
    pub fn new(object: &ObjectId, job: &JobView) -> Self {
        Self {
            object: object.as_str().to_owned(),
            token: job.token.as_str().to_owned(),
            due_at: job.due_at,
            state: match job.state {
                JobState::Due => "due",
                JobState::Ready => "ready",
                JobState::Running => "running",
            },
            tries: job.tries,
        }
    }
}

/// One page of jobs whose object id starts with a prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobListing {
    /// The object-id prefix listed.
    pub prefix: String,
    /// The jobs of this page, by object id.
    pub jobs: Vec<JobReport>,
    /// Pass this back to list the next page; `None` after the last one.
    pub cursor: Option<String>,
}

/// The index's job counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CountsReport {
    /// Jobs due or running.
    pub scheduled: u64,
    /// Jobs ready to be claimed.
    pub ready: u64,
    /// Both.
    pub total: u64,
}

impl From<IndexCounts> for CountsReport {
    fn from(c: IndexCounts) -> Self {
        Self {
            scheduled: c.scheduled,
            ready: c.ready,
            total: c.total(),
        }
    }
}

/// Lists one page of the jobs whose object id starts with `prefix`
/// ([`AlarmIndex::jobs_with_prefix`]), sorted by object id within the page.
///
/// # Errors
/// The index's errors: [`AlarmError::InvalidConfig`] for a `limit` of 0 or a
/// cursor the backend did not hand out; a backend failure.
pub async fn list_jobs<I: AlarmIndex>(
    index: &I,
    prefix: &str,
    cursor: Option<&str>,
    limit: usize,
) -> Result<JobListing, AlarmError> {
    let page = index
        .jobs_with_prefix(JobPageRequest::first(prefix, limit).after(cursor))
        .await?;
    let mut jobs: Vec<JobReport> = page
        .jobs
        .iter()
        .map(|(object, job)| JobReport::new(object, job))
        .collect();
    jobs.sort_by(|a, b| a.object.cmp(&b.object));
    Ok(JobListing {
        prefix: prefix.to_owned(),
        jobs,
        cursor: page.cursor,
    })
}

/// The index's counts ([`AlarmIndex::counts`]).
///
/// # Errors
/// A backend failure.
pub async fn counts<I: AlarmIndex>(index: &I) -> Result<CountsReport, AlarmError> {
    Ok(index.counts().await?.into())
}

#[cfg(test)]
mod tests;
