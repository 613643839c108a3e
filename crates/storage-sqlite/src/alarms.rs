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
    AlarmError, AlarmIndex, AlarmRow, AlarmTx, Claim, ClaimReady, IndexCounts, JobPage,
    JobPageRequest, JobState, JobView, RetryJob, Token, validate_time,
};
use durability_scheduler::{ObjectId, SchemaStep, StorageError};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::object::{SqliteSchemaStep, SqliteTx, Synchronous, backend};

pub(crate) static STEPS: &[SchemaStep] = &[SchemaStep::new(1, "initial")];

pub(crate) static SQL_STEPS: &[SqliteSchemaStep] = &[SqliteSchemaStep {
    step: SchemaStep::new(1, "initial"),
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
        use rusqlite::types::Value;
        // Raw values, decoded here: a wrongly typed column is a corrupt row,
        // not a backend failure.
        let raw: Option<Value> = self
            .sql()
            .prepare_cached("SELECT at FROM durability_alarm WHERE id = 0")
            .and_then(|mut st| st.query_row([], |r| r.get(0)).optional())
            .map_err(|e| backend("read alarm row", e))?;
        let Some(at) = raw else {
            return Ok(None);
        };
        let Some((token, fence)) = self.alarm_row_token()? else {
            return Ok(None);
        };
        let Value::Integer(at) = at else {
            return Err(corrupt(
                "time",
                format!("not an integer: {:?}", at.data_type()),
            ));
        };
        Ok(Some(AlarmRow {
            at: validate_time(at).map_err(|e| corrupt("time", e))?,
            token,
            fence,
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

    fn alarm_row_token(&mut self) -> Result<Option<(Token, Option<Token>)>, StorageError> {
        // Only token and fence are read (as raw values, so a wrongly typed
        // time column cannot fail the read).
        let raw: Option<(rusqlite::types::Value, rusqlite::types::Value)> = self
            .sql()
            .prepare_cached("SELECT token, fence FROM durability_alarm WHERE id = 0")
            .and_then(|mut st| st.query_row([], |r| Ok((r.get(0)?, r.get(1)?))).optional())
            .map_err(|e| backend("read alarm row token", e))?;
        let Some((token, fence)) = raw else {
            return Ok(None);
        };
        let text = |what: &str, v: rusqlite::types::Value| match v {
            rusqlite::types::Value::Text(t) => Token::new(t).map_err(|e| corrupt(what, e)),
            other => Err(corrupt(what, format!("not text: {:?}", other.data_type()))),
        };
        let token = text("token", token)?;
        let fence = match fence {
            rusqlite::types::Value::Null => None,
            other => Some(text("fence", other)?),
        };
        Ok(Some((token, fence)))
    }

    fn set_alarm_fence(
        &mut self,
        token: &Token,
        fence: Option<&Token>,
    ) -> Result<bool, StorageError> {
        self.sql()
            .prepare_cached("UPDATE durability_alarm SET fence = ?2 WHERE id = 0 AND token = ?1")
            .and_then(|mut st| st.execute(params![token.as_str(), fence.map(Token::as_str)]))
            .map(|n| n > 0)
            .map_err(|e| backend("fence alarm row", e))
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
CREATE TABLE IF NOT EXISTS durability_alarm_index_quarantine (
    object PRIMARY KEY NOT NULL,
    token,
    due_at,
    state,
    run,
    tries,
    score,
    reason TEXT NOT NULL,
    quarantined_at INTEGER NOT NULL
);
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

durability_time::debug_fields!(SqliteAlarmIndex {});

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

    /// The index's database file; `None` for an in-memory index.
    pub fn path(&self) -> Option<std::path::PathBuf> {
        self.conn()
            .path()
            .filter(|p| !p.is_empty())
            .map(std::path::PathBuf::from)
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

    /// Runs `sql` (binding `?1` the object, `?2` the token) and reports
    /// whether it changed a row; `context` names a failure.
    fn on_job(
        &self,
        sql: &str,
        object: &ObjectId,
        token: &Token,
        context: &'static str,
    ) -> Result<bool, AlarmError> {
        self.conn()
            .prepare_cached(sql)
            .and_then(|mut st| st.execute([object.as_str(), token.as_str()]))
            .map(|n| n > 0)
            .map_err(|e| failed(context, e))
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

    /// Claims up to `runs.len()` ready jobs, earliest first, one run token
    /// each, in one immediate transaction. Every candidate is decoded and
    /// validated before it is claimed; one that fails (a corrupt stored
    /// object id, token, time or try count) is moved to the quarantine table
    /// with an event instead, and the next ready job is taken, so a corrupt
    /// job never blocks healthy ones.
    fn claim_sync(
        &self,
        now: i64,
        lease_ms: i64,
        runs: &[Token],
    ) -> Result<Vec<Claim>, AlarmError> {
        use rusqlite::types::Value;
        let mut claims = Vec::with_capacity(runs.len());
        if runs.is_empty() {
            return Ok(claims);
        }
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| failed("begin claim", e))?;
        let lease_until = now.saturating_add(lease_ms.max(0));
        while claims.len() < runs.len() {
            let want = i64::try_from(runs.len() - claims.len()).unwrap_or(i64::MAX);
            let next: Vec<(Value, Value, Value, Value)> = tx
                .prepare_cached(
                    "SELECT object, token, due_at, tries FROM durability_alarm_index_jobs
                     WHERE state = 1 ORDER BY due_at, object LIMIT ?1",
                )
                .and_then(|mut st| {
                    st.query_map([want], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                        .collect()
                })
                .map_err(|e| failed("read ready jobs", e))?;
            if next.is_empty() {
                break;
            }
            for (object, token, due_at, tries) in next {
                match decode_ready(&object, &token, &due_at, &tries) {
                    Ok((id, token, due_at, tries)) => {
                        let run = &runs[claims.len()];
                        let tries = tries.saturating_add(1);
                        tx.prepare_cached(
                            "UPDATE durability_alarm_index_jobs
                             SET state = 2, run = ?2, tries = ?3, score = ?4 WHERE object = ?1",
                        )
                        .and_then(|mut st| {
                            st.execute(params![id.as_str(), run.as_str(), tries, lease_until])
                        })
                        .map_err(|e| failed("claim job", e))?;
                        claims.push(Claim {
                            object: id,
                            token,
                            due_at,
                            run: run.clone(),
                            tries,
                            lease_until,
                        });
                    }
                    Err(reason) => {
                        tx.prepare_cached(
                            "INSERT OR REPLACE INTO durability_alarm_index_quarantine
                               (object, token, due_at, state, run, tries, score, reason, quarantined_at)
                             SELECT object, token, due_at, state, run, tries, score, ?2, ?3
                             FROM durability_alarm_index_jobs WHERE object = ?1",
                        )
                        .and_then(|mut st| st.execute(params![object, reason, now]))
                        .and_then(|_| {
                            tx.prepare_cached(
                                "DELETE FROM durability_alarm_index_jobs WHERE object = ?1",
                            )?
                            .execute([&object])
                        })
                        .map_err(|e| failed("quarantine job", e))?;
                        tracing::warn!(
                            event = "durability.storage_sqlite.alarm_job_quarantined",
                            object = ?object,
                            %reason,
                            "corrupt alarm job moved to quarantine instead of being claimed"
                        );
                    }
                }
            }
        }
        tx.commit().map_err(AlarmError::unknown)?;
        Ok(claims)
    }

    /// How many jobs the claim path moved to quarantine (corrupt rows kept
    /// for operators in `durability_alarm_index_quarantine`).
    ///
    /// # Errors
    /// A failed statement.
    pub fn quarantined(&self) -> Result<u64, AlarmError> {
        let n: i64 = self
            .conn()
            .query_row(
                "SELECT COUNT(*) FROM durability_alarm_index_quarantine",
                [],
                |r| r.get(0),
            )
            .map_err(|e| failed("count quarantine", e))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// Decodes one ready job strictly: object id, token, a safe-integer due time
/// and a non-negative try count; `Err` names what is corrupt.
fn decode_ready(
    object: &rusqlite::types::Value,
    token: &rusqlite::types::Value,
    due_at: &rusqlite::types::Value,
    tries: &rusqlite::types::Value,
) -> Result<(ObjectId, Token, i64, u32), String> {
    use rusqlite::types::Value;
    let Value::Text(object) = object else {
        return Err("object id is not text".to_owned());
    };
    let object = ObjectId::new(object.as_str()).map_err(|e| format!("object id: {e}"))?;
    let Value::Text(token) = token else {
        return Err("token is not text".to_owned());
    };
    let token = Token::new(token.as_str()).map_err(|e| format!("token: {e}"))?;
    let Value::Integer(due_at) = *due_at else {
        return Err("due time is not an integer".to_owned());
    };
    let due_at = validate_time(due_at).map_err(|e| format!("due time: {e}"))?;
    let Value::Integer(tries) = *tries else {
        return Err("try count is not an integer".to_owned());
    };
    let tries = u32::try_from(tries).map_err(|_| format!("try count {tries} out of range"))?;
    Ok((object, token, due_at, tries))
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
        self.on_job(
            "DELETE FROM durability_alarm_index_jobs WHERE object = ?1 AND token = ?2",
            object,
            token,
            "delete job",
        )
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
        Ok(self
            .claim_sync(now, lease_ms, std::slice::from_ref(run))?
            .pop())
    }

    async fn finish(&self, object: &ObjectId, run: &Token) -> Result<bool, AlarmError> {
        self.on_job(
            "DELETE FROM durability_alarm_index_jobs WHERE object = ?1 AND state = 2 AND run = ?2",
            object,
            run,
            "finish job",
        )
    }

    async fn retry(&self, retry: RetryJob<'_>) -> Result<bool, AlarmError> {
        let at = retry.now.saturating_add(retry.delay_ms.max(0));
        self.conn()
            .prepare_cached(
                "UPDATE durability_alarm_index_jobs SET state = 0, run = NULL, tries = ?3, score = ?4
                 WHERE object = ?1 AND state = 2 AND run = ?2",
            )
            .and_then(|mut st| st.execute(params![retry.object.as_str(), retry.run.as_str(), retry.tries, at]))
            .map(|n| n > 0)
            .map_err(|e| failed("retry job", e))
    }

    async fn claim_batch(
        &self,
        now: i64,
        lease_ms: i64,
        runs: &[Token],
    ) -> Result<Vec<Claim>, AlarmError> {
        self.claim_sync(now, lease_ms, runs)
    }

    async fn release(&self, object: &ObjectId, run: &Token, _now: i64) -> Result<bool, AlarmError> {
        self.on_job(
            "UPDATE durability_alarm_index_jobs
                 SET state = 1, run = NULL, tries = MAX(tries - 1, 0), score = due_at
                 WHERE object = ?1 AND state = 2 AND run = ?2",
            object,
            run,
            "release job",
        )
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

    async fn jobs_with_prefix(&self, page: JobPageRequest<'_>) -> Result<JobPage, AlarmError> {
        let (prefix, cursor, limit) = (page.prefix, page.cursor, page.checked_limit()?);
        // Object ids compare bytewise (BINARY): the prefix's ids form one
        // range of the primary key, from the prefix (or after the cursor,
        // the last id listed) to the prefix with its last byte raised
        // (ASCII prefixes; otherwise the substr check ends the range).
        let upper = prefix
            .as_bytes()
            .last()
            .filter(|b| **b < 0x7f)
            .map(|b| format!("{}{}", &prefix[..prefix.len() - 1], char::from(*b + 1)));
        use rusqlite::types::Value;
        let rows: Vec<(String, Value, Value, Value, Value)> = self
            .conn()
            .prepare_cached(
                "SELECT object, token, due_at, state, tries FROM durability_alarm_index_jobs
                 WHERE object >= ?1 AND (?2 IS NULL OR object > ?2)
                   AND (?3 IS NULL OR object < ?3)
                   AND substr(object, 1, length(?1)) = ?1
                 ORDER BY object LIMIT ?4",
            )
            .and_then(|mut st| {
                st.query_map(
                    params![
                        prefix,
                        cursor,
                        upper,
                        i64::try_from(limit).unwrap_or(i64::MAX)
                    ],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
                )?
                .collect()
            })
            .map_err(|e| failed("list jobs", e))?;
        let cursor = (rows.len() == limit)
            .then(|| rows.last().map(|r| r.0.clone()))
            .flatten();
        // A row that does not decode is left out (the claim path
        // quarantines it); it never hides the healthy rows of the page.
        let jobs = rows
            .into_iter()
            .filter_map(|(object, token, due_at, state, tries)| {
                let object = ObjectId::new(object).ok()?;
                let Value::Text(token) = token else {
                    return None;
                };
                let Value::Integer(due_at) = due_at else {
                    return None;
                };
                let state = match state {
                    Value::Integer(DUE) => JobState::Due,
                    Value::Integer(READY) => JobState::Ready,
                    Value::Integer(RUNNING) => JobState::Running,
                    _ => return None,
                };
                let Value::Integer(tries) = tries else {
                    return None;
                };
                Some((
                    object,
                    JobView {
                        token: Token::new(token).ok()?,
                        due_at: validate_time(due_at).ok()?,
                        state,
                        tries: tries_of(tries),
                    },
                ))
            })
            .collect();
        Ok(JobPage { jobs, cursor })
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

impl SqliteAlarmIndex {
    /// Opens an existing index database at `path` read-only, for operator
    /// reads ([`AlarmIndex::jobs_with_prefix`], [`AlarmIndex::counts`],
    /// [`AlarmIndex::next_due`], [`AlarmIndex::job`]): the file is never
    /// created or changed, and every write through this handle fails.
    ///
    /// # Errors
    /// [`AlarmError::InvalidConfig`] when no file exists at `path` or it
    /// holds no alarm index table (or is not SQLite);
    /// [`AlarmError::BackendUnavailable`] when SQLite cannot open it.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, AlarmError> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(AlarmError::InvalidConfig {
                reason: format!("{}: no such file", path.display()),
            });
        }
        let conn = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(AlarmError::unavailable)?;
        let not_index = |why: &str| AlarmError::InvalidConfig {
            reason: format!("{}: not an alarm index database ({why})", path.display()),
        };
        let found: Option<String> = conn
            .query_row(
                "SELECT name FROM sqlite_master WHERE type = 'table'
                 AND name = 'durability_alarm_index_jobs'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| match e.sqlite_error_code() {
                Some(rusqlite::ErrorCode::NotADatabase) => not_index("not a SQLite database"),
                _ => AlarmError::unavailable(e),
            })?;
        if found.is_none() {
            return Err(not_index("no table durability_alarm_index_jobs"));
        }
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(AlarmError::unavailable)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }
}
