//! PostgreSQL alarm job index (feature `alarms`).
//!
//! [`PostgresAlarmIndex`] implements [`AlarmIndex`] with one table in a
//! schema the caller chooses ([`SchemaName`]): `durability_alarm_jobs`, one
//! row per object (row token, due time, state due / ready / running, run
//! token, tries, and a score: the due or retry time, or the claim lease's
//! end while running), plus `durability_alarm_quarantine` for jobs whose
//! stored fields failed validation when claimed. Create them once with
//! [`PostgresAlarmIndex::setup`] (the SQL is
//! [`PostgresAlarmIndex::setup_sql`]).
//!
//! Every operation is one statement (one round trip). Claims take the
//! earliest ready jobs with `FOR UPDATE SKIP LOCKED`, so any number of
//! dispatchers on any number of hosts claim each job once, without
//! waiting on each other's locks; every settlement is fenced by the run
//! token of its claim, every user mutation by the row token. Leases and
//! retry times run on the database server's clock (`clock_timestamp()`,
//! [`IndexTime::Server`], the default); tests driving a manual clock select
//! [`IndexTime::Caller`]. Retry backoff and the discard after the last try
//! are the dispatcher's (`durability_alarms::Dispatcher`): the index keeps
//! the try count and the time the job is due again.
//!
//! Corrupt rows: a claimed job is decoded strictly (object id, row token,
//! due time, try count); one that fails is moved to the quarantine table
//! under its run token, with an event, and never blocks the healthy jobs of
//! the batch. `job` reports a corrupt row as `do_alarm_corrupt`; listing
//! leaves it out.
//!
//! Outcomes: no connection is `do_alarm_backend_unavailable`; a statement
//! the server refused (rolled back) is `do_alarm_backend_failed`; a write
//! whose connection was lost, or whose call deadline
//! ([`DEFAULT_CALL_TIMEOUT`](crate::DEFAULT_CALL_TIMEOUT)) passed, after it
//! was sent is `do_alarm_result_unknown`.

mod sql;

use std::time::Duration;

use durability_alarms::{
    AlarmError, AlarmIndex, Claim, ClaimReady, IndexCounts, JobPage, JobPageRequest, JobState,
    JobView, ObjectId, RetryJob, Token, validate_time,
};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Config, Row};

use crate::store_client::{
    Access, DEFAULT_STORE_POOL_SIZE, Failure, SchemaName, StoreClient, target,
};

/// Which clock the index's lease and retry times run on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IndexTime {
    /// The database server's `clock_timestamp()` (production).
    #[default]
    Server,
    /// The `now` the caller passes (tests with an injected clock).
    Caller,
}

fn failure(f: Failure) -> AlarmError {
    match f {
        Failure::NotApplied(e) => AlarmError::unavailable(e),
        Failure::Rejected(e) => AlarmError::failed(e),
        Failure::Unknown(e) => AlarmError::unknown(e),
    }
}

fn bad(reason: impl std::fmt::Display) -> AlarmError {
    AlarmError::Corrupt {
        reason: format!("alarm index row: {reason}"),
    }
}

const DUE: i16 = 0;
const READY: i16 = 1;
const RUNNING: i16 = 2;

/// The alarm job index on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PostgresAlarmIndex {
    client: StoreClient,
    schema: SchemaName,
    time: IndexTime,
    sql: std::sync::Arc<sql::Statements>,
}

impl PostgresAlarmIndex {
    /// An index on a pool of at most `pool_size` connections made from
    /// `config`, with its tables in `schema`. Connects lazily; call
    /// [`PostgresAlarmIndex::setup`] once per schema.
    ///
    /// # Errors
    /// [`AlarmError::BackendUnavailable`] for a pool that cannot be built.
    pub fn new(
        config: Config,
        pool_size: usize,
        schema: SchemaName,
        time: IndexTime,
    ) -> Result<Self, AlarmError> {
        let client =
            StoreClient::new(config, pool_size, "alarm index").map_err(AlarmError::unavailable)?;
        Ok(Self {
            client,
            sql: std::sync::Arc::new(sql::Statements::new(&schema)),
            schema,
            time,
        })
    }

    /// An index at `url` (a `postgres://` URL) with its tables in `schema`
    /// (validated: see [`SchemaName`]) and
    /// [`DEFAULT_STORE_POOL_SIZE`] connections. Nothing is sent until the first call.
    ///
    /// # Errors
    /// [`AlarmError::InvalidConfig`] for a schema name outside the grammar
    /// or a malformed URL.
    pub fn connect(url: &str, schema: &str, time: IndexTime) -> Result<Self, AlarmError> {
        let (config, schema) =
            target(url, schema).map_err(|reason| AlarmError::InvalidConfig { reason })?;
        Self::new(config, DEFAULT_STORE_POOL_SIZE, schema, time)
    }

    /// This index with a deadline of `timeout` per call (default
    /// [`DEFAULT_CALL_TIMEOUT`](crate::DEFAULT_CALL_TIMEOUT)): a write
    /// without a reply by then is `do_alarm_result_unknown` and its
    /// connection is closed.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.client.set_timeout(timeout);
        self
    }

    /// The call deadline.
    pub fn timeout(&self) -> Duration {
        self.client.timeout()
    }

    /// The schema holding this index's tables.
    pub fn schema(&self) -> &SchemaName {
        &self.schema
    }

    /// The SQL [`PostgresAlarmIndex::setup`] runs for `schema`: one
    /// transaction creating the schema, the job and quarantine tables and
    /// the job indexes, if missing.
    pub fn setup_sql(schema: &SchemaName) -> String {
        sql::setup(schema)
    }

    /// Creates this index's schema and tables (idempotent; concurrent
    /// setups of one schema wait for each other).
    ///
    /// # Errors
    /// A backend failure, classified as the index's calls are.
    pub async fn setup(&self) -> Result<(), AlarmError> {
        self.client
            .batch(&Self::setup_sql(&self.schema))
            .await
            .map_err(failure)
    }

    /// How many jobs the claim path moved to quarantine.
    ///
    /// # Errors
    /// A backend failure.
    pub async fn quarantined(&self) -> Result<u64, AlarmError> {
        let rows = self.read(&self.sql.quarantined, &[]).await?;
        let n: i64 = rows
            .first()
            .and_then(|r| r.try_get(0).ok())
            .ok_or_else(|| bad("quarantine count"))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// `now` as the statements take it: `NULL` (the server's clock) or the caller's.
    fn now(&self, now: i64) -> Option<i64> {
        match self.time {
            IndexTime::Server => None,
            IndexTime::Caller => Some(now.max(0)),
        }
    }

    async fn read(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, AlarmError> {
        self.client
            .query(Access::Read, sql, params)
            .await
            .map_err(failure)
    }

    /// Runs a write and reports whether it changed a row.
    async fn write(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<bool, AlarmError> {
        let rows = self
            .client
            .query(Access::Write, sql, params)
            .await
            .map_err(failure)?;
        Ok(!rows.is_empty())
    }

    /// Claims up to `runs.len()` ready jobs, earliest first, in one
    /// statement per round. Claimed jobs that fail strict decoding are
    /// quarantined (fenced by their run tokens) and another round claims
    /// with the tokens no healthy claim took, so a corrupt job never takes
    /// a healthy job's place. A failure after some claims returns those
    /// (the next call reports it).
    async fn claim_many(
        &self,
        now: i64,
        lease_ms: i64,
        runs: &[Token],
    ) -> Result<Vec<Claim>, AlarmError> {
        let mut claims: Vec<Claim> = Vec::with_capacity(runs.len());
        let mut left: Vec<Token> = runs.to_vec();
        while !left.is_empty() {
            let (rows, mut got) = match self.claim_round(now, lease_ms, &left).await {
                Ok(round) => round,
                Err(e) if claims.is_empty() => return Err(e),
                Err(_) => break,
            };
            // Every row decoded, or none was ready: nothing more to take.
            let done = got.len() == rows;
            left.retain(|t| !got.iter().any(|c| &c.run == t));
            claims.append(&mut got);
            if done {
                break;
            }
        }
        Ok(claims)
    }

    /// One claim statement over `runs`: how many tokens it used, and the
    /// claims that decoded (earliest first).
    async fn claim_round(
        &self,
        now: i64,
        lease_ms: i64,
        runs: &[Token],
    ) -> Result<(usize, Vec<Claim>), AlarmError> {
        let run_names: Vec<&str> = runs.iter().map(Token::as_str).collect();
        let lease = lease_ms.clamp(0, durability_alarms::MAX_DELAY_MS);
        let params: [&(dyn ToSql + Sync); 3] = [&self.now(now), &lease, &run_names];
        let rows = self
            .client
            .query(Access::Write, &self.sql.claim, &params)
            .await
            .map_err(failure)?;
        let mut claims = Vec::with_capacity(rows.len());
        let mut corrupt: Vec<(String, String, String)> = Vec::new();
        for row in &rows {
            match decode_claim(row, runs) {
                Ok((i, claim)) => claims.push((i, claim)),
                Err((object, run, reason)) => corrupt.push((object, run, reason)),
            }
        }
        if !corrupt.is_empty() {
            self.quarantine(&corrupt).await;
        }
        claims.sort_by_key(|(i, _)| *i);
        Ok((rows.len(), claims.into_iter().map(|(_, c)| c).collect()))
    }

    /// Moves claimed jobs that failed decoding to the quarantine table
    /// (fenced by their run tokens). A failure here leaves them running:
    /// their lease runs out and the next claim quarantines them.
    async fn quarantine(&self, corrupt: &[(String, String, String)]) {
        let objects: Vec<&str> = corrupt.iter().map(|c| c.0.as_str()).collect();
        let runs: Vec<&str> = corrupt.iter().map(|c| c.1.as_str()).collect();
        let reasons: Vec<&str> = corrupt.iter().map(|c| c.2.as_str()).collect();
        let params: [&(dyn ToSql + Sync); 3] = [&objects, &runs, &reasons];
        let moved = self
            .client
            .query(Access::Write, &self.sql.quarantine, &params)
            .await;
        for (object, _, reason) in corrupt {
            tracing::warn!(
                event = "durability.storage_postgres.alarm_job_quarantined",
                object = %object.escape_debug(),
                %reason,
                moved = moved.is_ok(),
                "corrupt alarm job moved to quarantine instead of being claimed"
            );
        }
    }
}

/// A claimed row as a [`Claim`] and the position of its run token, or what
/// is corrupt about it (object, run token, reason).
fn decode_claim(row: &Row, runs: &[Token]) -> Result<(usize, Claim), (String, String, String)> {
    let object: String = row.try_get(1).unwrap_or_default();
    let i = row
        .try_get::<_, i64>(0)
        .ok()
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| i.checked_sub(1))
        .filter(|i| *i < runs.len());
    let Some(i) = i else {
        return Err((
            object,
            String::new(),
            "claim reply without its run".to_owned(),
        ));
    };
    let run = runs[i].clone();
    let fail = |reason: String| (object.clone(), run.as_str().to_owned(), reason);
    let id = ObjectId::new(object.clone()).map_err(|e| fail(format!("object id: {e}")))?;
    let token: String = row.try_get(2).map_err(|e| fail(e.to_string()))?;
    let token = Token::new(token).map_err(|e| fail(format!("token: {e}")))?;
    let due_at: i64 = row.try_get(3).map_err(|e| fail(e.to_string()))?;
    let due_at = validate_time(due_at).map_err(|e| fail(format!("due time: {e}")))?;
    let tries: i64 = row.try_get(4).map_err(|e| fail(e.to_string()))?;
    let tries = u32::try_from(tries)
        .ok()
        .filter(|t| *t >= 1)
        .ok_or_else(|| fail(format!("try count {tries} out of range")))?;
    let lease_until: i64 = row.try_get(5).map_err(|e| fail(e.to_string()))?;
    Ok((
        i,
        Claim {
            object: id,
            token,
            due_at,
            run,
            tries,
            lease_until,
        },
    ))
}

/// One stored job, decoded strictly.
fn decode_job(token: String, due_at: i64, state: i16, tries: i64) -> Result<JobView, AlarmError> {
    let state = match state {
        DUE => JobState::Due,
        READY => JobState::Ready,
        RUNNING => JobState::Running,
        other => return Err(bad(format!("unknown state {other}"))),
    };
    Ok(JobView {
        token: Token::new(token).map_err(|e| bad(format!("token: {e}")))?,
        due_at: validate_time(due_at).map_err(|e| bad(format!("due time: {e}")))?,
        state,
        tries: u32::try_from(tries).map_err(|_| bad(format!("try count {tries} out of range")))?,
    })
}

fn job_of(row: &Row, at: usize) -> Result<JobView, AlarmError> {
    let cell = |e: tokio_postgres::Error| bad(e);
    decode_job(
        row.try_get(at).map_err(cell)?,
        row.try_get(at + 1).map_err(cell)?,
        row.try_get(at + 2).map_err(cell)?,
        row.try_get(at + 3).map_err(cell)?,
    )
}

impl AlarmIndex for PostgresAlarmIndex {
    async fn upsert(
        &self,
        object: &ObjectId,
        token: &Token,
        due_at: i64,
    ) -> Result<bool, AlarmError> {
        validate_time(due_at)?;
        self.write(
            &self.sql.upsert,
            &[&object.as_str(), &token.as_str(), &due_at],
        )
        .await
    }

    async fn delete(&self, object: &ObjectId, token: &Token) -> Result<bool, AlarmError> {
        self.write(&self.sql.delete, &[&object.as_str(), &token.as_str()])
            .await
    }

    async fn job(&self, object: &ObjectId) -> Result<Option<JobView>, AlarmError> {
        let rows = self.read(&self.sql.job, &[&object.as_str()]).await?;
        rows.first().map(|r| job_of(r, 0)).transpose()
    }

    async fn promote(&self, now: i64, limit: usize) -> Result<usize, AlarmError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let n = self
            .client
            .query(Access::Write, &self.sql.promote, &[&self.now(now), &limit])
            .await
            .map_err(failure)?
            .len();
        Ok(n)
    }

    async fn claim(&self, claim: ClaimReady<'_>) -> Result<Option<Claim>, AlarmError> {
        let ClaimReady { now, lease_ms, run } = claim;
        Ok(self
            .claim_many(now, lease_ms, std::slice::from_ref(run))
            .await?
            .pop())
    }

    async fn finish(&self, object: &ObjectId, run: &Token) -> Result<bool, AlarmError> {
        self.write(&self.sql.finish, &[&object.as_str(), &run.as_str()])
            .await
    }

    async fn retry(&self, retry: RetryJob<'_>) -> Result<bool, AlarmError> {
        let tries = i64::from(retry.tries);
        let delay = retry.delay_ms.clamp(0, durability_alarms::MAX_DELAY_MS);
        self.write(
            &self.sql.retry,
            &[
                &retry.object.as_str(),
                &retry.run.as_str(),
                &tries,
                &self.now(retry.now),
                &delay,
            ],
        )
        .await
    }

    async fn claim_batch(
        &self,
        now: i64,
        lease_ms: i64,
        runs: &[Token],
    ) -> Result<Vec<Claim>, AlarmError> {
        self.claim_many(now, lease_ms, runs).await
    }

    async fn release(&self, object: &ObjectId, run: &Token, _now: i64) -> Result<bool, AlarmError> {
        self.write(&self.sql.release, &[&object.as_str(), &run.as_str()])
            .await
    }

    async fn next_due(&self) -> Result<Option<i64>, AlarmError> {
        let rows = self.read(&self.sql.next_due, &[]).await?;
        let row = rows.first().ok_or_else(|| bad("next due without a row"))?;
        row.try_get(0).map_err(bad)
    }

    async fn counts(&self) -> Result<IndexCounts, AlarmError> {
        let rows = self.read(&self.sql.counts, &[]).await?;
        let row = rows.first().ok_or_else(|| bad("counts without a row"))?;
        let scheduled: i64 = row.try_get(0).map_err(bad)?;
        let ready: i64 = row.try_get(1).map_err(bad)?;
        Ok(IndexCounts {
            scheduled: u64::try_from(scheduled).unwrap_or(0),
            ready: u64::try_from(ready).unwrap_or(0),
        })
    }

    /// A range of the primary key (object ids in byte order), from the
    /// prefix or after the cursor (the last id listed); a row that does not
    /// decode is left out, never hiding the healthy rows of its page.
    async fn jobs_with_prefix(&self, page: JobPageRequest<'_>) -> Result<JobPage, AlarmError> {
        let (prefix, cursor, limit) = (page.prefix, page.cursor, page.checked_limit()?);
        if let Some(c) = cursor
            && !c.starts_with(prefix)
        {
            return Err(AlarmError::InvalidConfig {
                reason: format!("{c:?} is not a job page cursor of prefix {prefix:?}"),
            });
        }
        let upper = prefix
            .as_bytes()
            .last()
            .filter(|b| **b < 0x7f)
            .map(|b| format!("{}{}", &prefix[..prefix.len() - 1], char::from(*b + 1)));
        let limit_value = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .read(&self.sql.list, &[&prefix, &cursor, &upper, &limit_value])
            .await?;
        let cursor = (rows.len() == limit)
            .then(|| rows.last().and_then(|r| r.try_get::<_, String>(0).ok()))
            .flatten();
        let jobs = rows
            .iter()
            .filter_map(|r| {
                let object = ObjectId::new(r.try_get::<_, String>(0).ok()?).ok()?;
                Some((object, job_of(r, 1).ok()?))
            })
            .collect();
        Ok(JobPage { jobs, cursor })
    }
}
