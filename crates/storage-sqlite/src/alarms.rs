//! SQLite alarm storage: the object-side alarm row ([`AlarmTx`] on
//! [`SqliteTx`], table `durability_alarm`) and [`SqliteAlarmIndex`], the
//! embedded alarm job index in its own database file (tables prefixed
//! `durability_alarm_index`).
//!
//! The embedded index runs every operation as one SQLite statement or one
//! immediate transaction on a mutex-guarded connection, so any number of
//! dispatchers in one process (or processes sharing the file, through
//! SQLite's locking) claim each job exactly once. It uses the caller's
//! `now` (the dispatcher's clock): it is the host's own clock.

use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use durability_alarms::{
    AlarmError, AlarmIndex, AlarmRow, AlarmTx, Claim, ClaimReady, IndexCounts, JobState, JobView,
    RetryJob, Token, validate_time,
};
use durability_scheduler::{ObjectId, SchemaStep, StorageError};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::object::{SqliteSchemaStep, SqliteTx, Synchronous, backend};

pub(crate) static STEPS: &[SchemaStep] = &[SchemaStep {
    version: 1,
    name: "initial",
}];

pub(crate) static SQL_STEPS: &[SqliteSchemaStep] = &[SqliteSchemaStep {
    step: SchemaStep {
        version: 1,
        name: "initial",
    },
    up: "
CREATE TABLE durability_alarm (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    at INTEGER NOT NULL,
    token TEXT NOT NULL,
    fence TEXT
);
",
    down: "DROP TABLE durability_alarm;",
}];

fn corrupt(what: &str, e: impl std::fmt::Display) -> StorageError {
    StorageError::corrupt(format!("alarm row {what}: {e}"))
}

impl AlarmTx for SqliteTx<'_> {
    fn alarm_row(&mut self) -> Result<Option<AlarmRow>, StorageError> {
        let raw: Option<(i64, String, Option<String>)> = self
            .sql()
            .prepare_cached("SELECT at, token, fence FROM durability_alarm WHERE id = 0")
            .and_then(|mut st| {
                st.query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()
            })
            .map_err(|e| backend("read alarm row", e))?;
        let Some((at, token, fence)) = raw else {
            return Ok(None);
        };
        Ok(Some(AlarmRow {
            at: validate_time(at).map_err(|e| corrupt("time", e))?,
            token: Token::new(token).map_err(|e| corrupt("token", e))?,
            fence: fence
                .map(Token::new)
                .transpose()
                .map_err(|e| corrupt("fence", e))?,
        }))
    }

    fn put_alarm_row(&mut self, row: &AlarmRow) -> Result<(), StorageError> {
        self.sql()
            .prepare_cached(
                "INSERT INTO durability_alarm (id, at, token, fence) VALUES (0, ?1, ?2, ?3)
                 ON CONFLICT (id) DO UPDATE SET
                   at = excluded.at, token = excluded.token, fence = excluded.fence",
            )
            .and_then(|mut st| {
                st.execute(params![
                    row.at,
                    row.token.as_str(),
                    row.fence.as_ref().map(Token::as_str)
                ])
            })
            .map(|_| ())
            .map_err(|e| backend("write alarm row", e))
    }

    fn delete_alarm_row(&mut self) -> Result<bool, StorageError> {
        self.sql()
            .prepare_cached("DELETE FROM durability_alarm WHERE id = 0")
            .and_then(|mut st| st.execute([]))
            .map(|n| n > 0)
            .map_err(|e| backend("delete alarm row", e))
    }
}

const INDEX_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS durability_alarm_index_jobs (
    object TEXT PRIMARY KEY NOT NULL,
    token TEXT NOT NULL,
    due_at INTEGER NOT NULL,
    state INTEGER NOT NULL,
    run TEXT,
    tries INTEGER NOT NULL,
    score INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS durability_alarm_index_scheduled
    ON durability_alarm_index_jobs (score) WHERE state <> 1;
CREATE INDEX IF NOT EXISTS durability_alarm_index_ready
    ON durability_alarm_index_jobs (due_at, object) WHERE state = 1;
";

const DUE: i64 = 0;
const READY: i64 = 1;
const RUNNING: i64 = 2;

/// A failed statement rolled back: the index did not change.
fn failed(context: &'static str, e: rusqlite::Error) -> AlarmError {
    tracing::warn!(
        event = "durability.storage_sqlite.alarm_index_failed",
        context,
        error = %e,
        "alarm index statement failed; rolled back"
    );
    AlarmError::failed(e)
}

fn bad(reason: impl std::fmt::Display) -> AlarmError {
    AlarmError::Corrupt {
        reason: format!("alarm index row: {reason}"),
    }
}

fn tries_of(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// The embedded alarm job index: one SQLite database (WAL) of its own.
pub struct SqliteAlarmIndex {
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for SqliteAlarmIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteAlarmIndex").finish_non_exhaustive()
    }
}

impl SqliteAlarmIndex {
    /// Opens (or creates) the index database at `path` in WAL mode.
    ///
    /// # Errors
    /// [`AlarmError::BackendUnavailable`] when the file cannot be opened or
    /// the tables created.
    pub fn open(path: impl AsRef<Path>, synchronous: Synchronous) -> Result<Self, AlarmError> {
        let conn = Connection::open(path).map_err(AlarmError::unavailable)?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(AlarmError::unavailable)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(AlarmError::unavailable(format!(
                "index database refused WAL mode (got {mode})"
            )));
        }
        let sync = match synchronous {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
            Synchronous::Off => "OFF",
        };
        conn.pragma_update(None, "synchronous", sync)
            .map_err(AlarmError::unavailable)?;
        Self::init(conn)
    }

    /// An in-memory index: for logic tests only.
    ///
    /// # Errors
    /// [`AlarmError::BackendUnavailable`] when the tables cannot be created.
    pub fn open_in_memory() -> Result<Self, AlarmError> {
        Self::init(Connection::open_in_memory().map_err(AlarmError::unavailable)?)
    }

    fn init(conn: Connection) -> Result<Self, AlarmError> {
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(AlarmError::unavailable)?;
        conn.execute_batch(INDEX_SCHEMA)
            .map_err(AlarmError::unavailable)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn upsert_sync(
        &self,
        object: &ObjectId,
        token: &Token,
        due_at: i64,
    ) -> Result<bool, AlarmError> {
        validate_time(due_at)?;
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| failed("begin upsert", e))?;
        let cur: Option<(String, i64)> = tx
            .prepare_cached(
                "SELECT token, due_at FROM durability_alarm_index_jobs WHERE object = ?1",
            )
            .and_then(|mut st| {
                st.query_row([object.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(|e| failed("read job", e))?;
        if cur.is_some_and(|(t, d)| t == token.as_str() && d == due_at) {
            return Ok(false);
        }
        tx.prepare_cached(
            "INSERT INTO durability_alarm_index_jobs (object, token, due_at, state, run, tries, score)
             VALUES (?1, ?2, ?3, 0, NULL, 0, ?3)
             ON CONFLICT (object) DO UPDATE SET token = excluded.token, due_at = excluded.due_at,
               state = 0, run = NULL, tries = 0, score = excluded.score",
        )
        .and_then(|mut st| st.execute(params![object.as_str(), token.as_str(), due_at]))
        .map_err(|e| failed("write job", e))?;
        tx.commit().map_err(AlarmError::unknown)?;
        Ok(true)
    }

    fn claim_sync(
        &self,
        now: i64,
        lease_ms: i64,
        run: &Token,
    ) -> Result<Option<Claim>, AlarmError> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| failed("begin claim", e))?;
        let next: Option<(String, String, i64, i64)> = tx
            .prepare_cached(
                "SELECT object, token, due_at, tries FROM durability_alarm_index_jobs
                 WHERE state = 1 ORDER BY due_at, object LIMIT 1",
            )
            .and_then(|mut st| {
                st.query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .optional()
            })
            .map_err(|e| failed("read ready job", e))?;
        let Some((object, token, due_at, tries)) = next else {
            return Ok(None);
        };
        let tries = tries_of(tries).saturating_add(1);
        let lease_until = now.saturating_add(lease_ms.max(0));
        tx.prepare_cached(
            "UPDATE durability_alarm_index_jobs SET state = 2, run = ?2, tries = ?3, score = ?4
             WHERE object = ?1",
        )
        .and_then(|mut st| st.execute(params![object, run.as_str(), tries, lease_until]))
        .map_err(|e| failed("claim job", e))?;
        tx.commit().map_err(AlarmError::unknown)?;
        Ok(Some(Claim {
            object: ObjectId::new(object).map_err(bad)?,
            token: Token::new(token).map_err(bad)?,
            due_at,
            run: run.clone(),
            tries,
            lease_until,
        }))
    }
}

impl AlarmIndex for SqliteAlarmIndex {
    async fn upsert(
        &self,
        object: &ObjectId,
        token: &Token,
        due_at: i64,
    ) -> Result<bool, AlarmError> {
        self.upsert_sync(object, token, due_at)
    }

    async fn delete(&self, object: &ObjectId, token: &Token) -> Result<bool, AlarmError> {
        self.conn()
            .prepare_cached(
                "DELETE FROM durability_alarm_index_jobs WHERE object = ?1 AND token = ?2",
            )
            .and_then(|mut st| st.execute([object.as_str(), token.as_str()]))
            .map(|n| n > 0)
            .map_err(|e| failed("delete job", e))
    }

    async fn job(&self, object: &ObjectId) -> Result<Option<JobView>, AlarmError> {
        let raw: Option<(String, i64, i64, i64)> = self
            .conn()
            .prepare_cached(
                "SELECT token, due_at, state, tries FROM durability_alarm_index_jobs WHERE object = ?1",
            )
            .and_then(|mut st| {
                st.query_row([object.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .optional()
            })
            .map_err(|e| failed("read job", e))?;
        let Some((token, due_at, state, tries)) = raw else {
            return Ok(None);
        };
        let state = match state {
            DUE => JobState::Due,
            READY => JobState::Ready,
            RUNNING => JobState::Running,
            other => return Err(bad(format!("unknown state {other}"))),
        };
        Ok(Some(JobView {
            token: Token::new(token).map_err(bad)?,
            due_at,
            state,
            tries: tries_of(tries),
        }))
    }

    async fn promote(&self, now: i64, limit: usize) -> Result<usize, AlarmError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.conn()
            .prepare_cached(
                "UPDATE durability_alarm_index_jobs SET state = 1, run = NULL
                 WHERE object IN (SELECT object FROM durability_alarm_index_jobs
                                  WHERE state <> 1 AND score <= ?1 ORDER BY score LIMIT ?2)",
            )
            .and_then(|mut st| st.execute(params![now, limit]))
            .map_err(|e| failed("promote jobs", e))
    }

    async fn claim(&self, claim: ClaimReady<'_>) -> Result<Option<Claim>, AlarmError> {
        let ClaimReady { now, lease_ms, run } = claim;
        self.claim_sync(now, lease_ms, run)
    }

    async fn finish(&self, object: &ObjectId, run: &Token) -> Result<bool, AlarmError> {
        self.conn()
            .prepare_cached(
                "DELETE FROM durability_alarm_index_jobs WHERE object = ?1 AND state = 2 AND run = ?2",
            )
            .and_then(|mut st| st.execute([object.as_str(), run.as_str()]))
            .map(|n| n > 0)
            .map_err(|e| failed("finish job", e))
    }

    async fn retry(&self, retry: RetryJob<'_>) -> Result<bool, AlarmError> {
        let RetryJob {
            object,
            run,
            now,
            delay_ms,
            tries,
        } = retry;
        let at = now.saturating_add(delay_ms.max(0));
        self.conn()
            .prepare_cached(
                "UPDATE durability_alarm_index_jobs SET state = 0, run = NULL, tries = ?3, score = ?4
                 WHERE object = ?1 AND state = 2 AND run = ?2",
            )
            .and_then(|mut st| st.execute(params![object.as_str(), run.as_str(), tries, at]))
            .map(|n| n > 0)
            .map_err(|e| failed("retry job", e))
    }

    async fn next_due(&self) -> Result<Option<i64>, AlarmError> {
        self.conn()
            .prepare_cached(
                "SELECT MIN(m) FROM (
                   SELECT MIN(score) AS m FROM durability_alarm_index_jobs WHERE state <> 1
                   UNION ALL
                   SELECT MIN(due_at) AS m FROM durability_alarm_index_jobs WHERE state = 1)",
            )
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .map_err(|e| failed("read next due", e))
    }

    async fn counts(&self) -> Result<IndexCounts, AlarmError> {
        let (scheduled, ready): (i64, i64) = self
            .conn()
            .prepare_cached(
                "SELECT COALESCE(SUM(state <> 1), 0), COALESCE(SUM(state = 1), 0)
                 FROM durability_alarm_index_jobs",
            )
            .and_then(|mut st| st.query_row([], |r| Ok((r.get(0)?, r.get(1)?))))
            .map_err(|e| failed("count jobs", e))?;
        Ok(IndexCounts {
            scheduled: u64::try_from(scheduled).unwrap_or(0),
            ready: u64::try_from(ready).unwrap_or(0),
        })
    }
}
