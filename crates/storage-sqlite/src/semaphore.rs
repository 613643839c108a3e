//! The semaphore store on SQLite: the `durability_semaphore_*` tables of
//! `durability-semaphore`'s holder object (pools, requests, the id
//! counter), on [`SqliteTx`].
//!
//! Rows are decoded strictly: a count, time or state that is not an
//! integer in range, or a name that is not text, is a
//! [`StorageErrorKind::Corrupt`](durability_scheduler::StorageErrorKind::Corrupt)
//! error naming the row and column, never a misread value.

use durability_scheduler::{SchemaStep, StorageError};
use durability_semaphore::{
    CorruptRequest, Outcome, PoolRow, RequestRow, RequestState, SemaphoreTx,
};
use rusqlite::types::{Value, ValueRef};
use rusqlite::{OptionalExtension, Row, params};

use crate::object::{SqliteSchemaStep, SqliteTx, backend};

pub(crate) static STEPS: &[SchemaStep] = durability_semaphore::SCHEMA_STEPS;

pub(crate) static SQL_STEPS: &[SqliteSchemaStep] = &[
    SqliteSchemaStep {
        step: STEPS[0],
        up: "
CREATE TABLE durability_semaphore_pool (
    name TEXT PRIMARY KEY NOT NULL,
    capacity INTEGER NOT NULL,
    max_queue INTEGER NOT NULL,
    key_retention_ms INTEGER NOT NULL,
    held INTEGER NOT NULL,
    queued INTEGER NOT NULL,
    granted INTEGER NOT NULL,
    used INTEGER NOT NULL,
    released INTEGER NOT NULL,
    expired INTEGER NOT NULL,
    timed_out INTEGER NOT NULL,
    cancelled INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE durability_semaphore_request (
    pool TEXT NOT NULL,
    key TEXT NOT NULL,
    id INTEGER NOT NULL UNIQUE,
    holder TEXT NOT NULL,
    count INTEGER NOT NULL,
    lease_ms INTEGER NOT NULL,
    state INTEGER NOT NULL,
    due_at INTEGER NOT NULL,
    used INTEGER NOT NULL,
    outcome INTEGER,
    PRIMARY KEY (pool, key)
) WITHOUT ROWID;
CREATE INDEX durability_semaphore_request_due ON durability_semaphore_request (pool, due_at, id);
CREATE INDEX durability_semaphore_request_next ON durability_semaphore_request (due_at);
CREATE INDEX durability_semaphore_request_queue ON durability_semaphore_request (pool, state, id);
CREATE TABLE durability_semaphore_id (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    last INTEGER NOT NULL
);
INSERT INTO durability_semaphore_id (id, last) VALUES (0, 0);
",
        down: "
DROP TABLE durability_semaphore_pool;
DROP TABLE durability_semaphore_request;
DROP TABLE durability_semaphore_id;
",
    },
    SqliteSchemaStep {
        step: STEPS[1],
        // Untyped columns: a quarantined row keeps exactly what was stored.
        up: "
CREATE TABLE durability_semaphore_quarantine (
    pool,
    key,
    id,
    holder,
    count,
    lease_ms,
    state,
    due_at,
    used,
    outcome,
    reason TEXT NOT NULL,
    quarantined_at INTEGER NOT NULL
);
",
        down: "DROP TABLE durability_semaphore_quarantine;",
    },
];

const POOL_COLUMNS: &str = "name, capacity, max_queue, key_retention_ms, held, queued, granted, \
     used, released, expired, timed_out, cancelled";
const REQUEST_COLUMNS: &str =
    "pool, key, id, holder, count, lease_ms, state, due_at, used, outcome";

/// Largest stored count, time or id: 2^53-1.
const MAX_SAFE: i64 = durability_scheduler::MAX_SAFE_INTEGER;

/// Stored request states.
const QUEUED: i64 = 0;
const GRANTED: i64 = 1;
const FINISHED: i64 = 2;
const FINISHED_GRANTED: i64 = 3;

/// Reads one row strictly: every failure is a message naming the column.
struct Strict<'r, 's> {
    row: &'r Row<'s>,
}

impl Strict<'_, '_> {
    fn int(&self, i: usize, name: &str, min: i64, max: i64) -> Result<i64, String> {
        match self.row.get_ref(i).map_err(|e| e.to_string())? {
            ValueRef::Integer(v) if (min..=max).contains(&v) => Ok(v),
            ValueRef::Integer(v) => Err(format!("{name} {v} is outside {min}..={max}")),
            _ => Err(format!("{name} is not an integer")),
        }
    }

    fn count(&self, i: usize, name: &str) -> Result<u64, String> {
        self.int(i, name, 0, MAX_SAFE).map(i64::unsigned_abs)
    }

    fn text(&self, i: usize, name: &str) -> Result<String, String> {
        match self.row.get_ref(i).map_err(|e| e.to_string())? {
            ValueRef::Text(b) => std::str::from_utf8(b)
                .map(str::to_owned)
                .map_err(|_| format!("{name} is not UTF-8")),
            _ => Err(format!("{name} is not text")),
        }
    }
}

fn pool_row(r: &Row<'_>) -> rusqlite::Result<Result<PoolRow, String>> {
    let s = Strict { row: r };
    let decode = || -> Result<PoolRow, String> {
        Ok(PoolRow {
            name: s.text(0, "name")?,
            capacity: s.count(1, "capacity")?,
            max_queue: s.count(2, "max_queue")?,
            key_retention_ms: s.int(3, "key_retention_ms", 1, MAX_SAFE)?,
            held: s.count(4, "held")?,
            queued: s.count(5, "queued")?,
            granted: s.count(6, "granted")?,
            used: s.count(7, "used")?,
            released: s.count(8, "released")?,
            expired: s.count(9, "expired")?,
            timed_out: s.count(10, "timed_out")?,
            cancelled: s.count(11, "cancelled")?,
        })
    };
    Ok(decode())
}

fn request_row(r: &Row<'_>) -> rusqlite::Result<Result<RequestRow, String>> {
    let s = Strict { row: r };
    let decode = || -> Result<RequestRow, String> {
        let due_at = s.int(7, "due_at", 0, MAX_SAFE)?;
        let state = match s.int(6, "state", QUEUED, FINISHED_GRANTED)? {
            QUEUED => RequestState::Queued { deadline: due_at },
            GRANTED => RequestState::Granted {
                lease_until: due_at,
                used: s.count(8, "used")?,
            },
            finished => RequestState::Finished {
                outcome: Outcome::from_code(s.int(9, "outcome", 0, 3)?)
                    .ok_or_else(|| "outcome is unknown".to_owned())?,
                forget_at: due_at,
                was_granted: finished == FINISHED_GRANTED,
            },
        };
        Ok(RequestRow {
            pool: s.text(0, "pool")?,
            key: s.text(1, "key")?,
            id: s.int(2, "id", 1, MAX_SAFE)?.unsigned_abs(),
            holder: s.text(3, "holder")?,
            count: s.int(4, "count", 1, MAX_SAFE)?.unsigned_abs(),
            lease_ms: s.int(5, "lease_ms", 1, MAX_SAFE)?,
            state,
        })
    };
    Ok(decode())
}

/// A strictly decoded value, or the corrupt-row error naming `what`.
fn strict<T>(what: &str, decoded: Result<T, String>) -> Result<T, StorageError> {
    decoded.map_err(|reason| StorageError::corrupt(format!("semaphore {what}: {reason}")))
}

fn strict_all<T>(what: &str, rows: Vec<Result<T, String>>) -> Result<Vec<T>, StorageError> {
    rows.into_iter().map(|r| strict(what, r)).collect()
}

fn i64_of(v: u64) -> i64 {
    // Every count and id the semaphore stores is at most 2^53-1.
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn limit_of(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

impl SqliteTx<'_> {
    fn requests(
        &self,
        sql: &str,
        args: impl rusqlite::Params,
        what: &str,
    ) -> Result<Vec<RequestRow>, StorageError> {
        let rows = self
            .sql()
            .prepare_cached(sql)
            .and_then(|mut st| {
                st.query_map(args, request_row)?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| backend(what, e))?;
        strict_all("request", rows)
    }
}

impl SemaphoreTx for SqliteTx<'_> {
    fn semaphore_next_id(&mut self) -> Result<u64, StorageError> {
        let next: Option<i64> = self
            .sql()
            .prepare_cached(&format!(
                "UPDATE durability_semaphore_id SET last = last + 1
                 WHERE id = 0 AND typeof(last) = 'integer' AND last >= 0 AND last < {MAX_SAFE}
                 RETURNING last"
            ))
            .and_then(|mut st| st.query_row([], |r| r.get(0)).optional())
            .map_err(|e| backend("issue semaphore id", e))?;
        next.map(i64::unsigned_abs).ok_or_else(|| {
            StorageError::corrupt(
                "the semaphore id counter is missing, not an integer or exhausted",
            )
        })
    }

    fn semaphore_pool(&mut self, pool: &str) -> Result<Option<PoolRow>, StorageError> {
        let row = self
            .sql()
            .prepare_cached(&format!(
                "SELECT {POOL_COLUMNS} FROM durability_semaphore_pool WHERE name = ?1"
            ))
            .and_then(|mut st| st.query_row([pool], pool_row).optional())
            .map_err(|e| backend("read semaphore pool", e))?;
        row.map(|r| strict("pool", r)).transpose()
    }

    fn semaphore_put_pool(&mut self, p: &PoolRow) -> Result<(), StorageError> {
        self.sql()
            .prepare_cached(&format!(
                "INSERT OR REPLACE INTO durability_semaphore_pool ({POOL_COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
            ))
            .and_then(|mut st| {
                st.execute(params![
                    p.name,
                    i64_of(p.capacity),
                    i64_of(p.max_queue),
                    p.key_retention_ms,
                    i64_of(p.held),
                    i64_of(p.queued),
                    i64_of(p.granted),
                    i64_of(p.used),
                    i64_of(p.released),
                    i64_of(p.expired),
                    i64_of(p.timed_out),
                    i64_of(p.cancelled),
                ])
            })
            .map(drop)
            .map_err(|e| backend("write semaphore pool", e))
    }

    fn semaphore_request(
        &mut self,
        pool: &str,
        key: &str,
    ) -> Result<Option<RequestRow>, StorageError> {
        let sql = format!(
            "SELECT {REQUEST_COLUMNS} FROM durability_semaphore_request WHERE pool = ?1 AND key = ?2"
        );
        Ok(self
            .requests(&sql, [pool, key], "read semaphore request")?
            .pop())
    }

    fn semaphore_request_by_id(&mut self, id: u64) -> Result<Option<RequestRow>, StorageError> {
        let sql =
            format!("SELECT {REQUEST_COLUMNS} FROM durability_semaphore_request WHERE id = ?1");
        Ok(self
            .requests(&sql, [i64_of(id)], "read semaphore request")?
            .pop())
    }

    fn semaphore_put_request(&mut self, r: &RequestRow) -> Result<(), StorageError> {
        let (state, used, outcome) = match r.state {
            RequestState::Queued { .. } => (QUEUED, 0, None),
            RequestState::Granted { used, .. } => (GRANTED, used, None),
            RequestState::Finished {
                outcome,
                was_granted,
                ..
            } => (
                if was_granted {
                    FINISHED_GRANTED
                } else {
                    FINISHED
                },
                0,
                Some(outcome.code()),
            ),
        };
        self.sql()
            .prepare_cached(&format!(
                "INSERT OR REPLACE INTO durability_semaphore_request ({REQUEST_COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
            ))
            .and_then(|mut st| {
                st.execute(params![
                    r.pool,
                    r.key,
                    i64_of(r.id),
                    r.holder,
                    i64_of(r.count),
                    r.lease_ms,
                    state,
                    r.due_at(),
                    i64_of(used),
                    outcome,
                ])
            })
            .map(drop)
            .map_err(|e| backend("write semaphore request", e))
    }

    fn semaphore_delete_request(&mut self, pool: &str, key: &str) -> Result<bool, StorageError> {
        self.exec(
            "delete semaphore request",
            "DELETE FROM durability_semaphore_request WHERE pool = ?1 AND key = ?2",
            [pool, key],
        )
        .map(|n| n > 0)
    }

    fn semaphore_due(
        &mut self,
        pool: &str,
        now: i64,
        limit: usize,
    ) -> Result<Vec<RequestRow>, StorageError> {
        let sql = format!(
            "SELECT {REQUEST_COLUMNS} FROM durability_semaphore_request
             WHERE pool = ?1 AND due_at <= ?2 ORDER BY due_at, id LIMIT ?3"
        );
        self.requests(
            &sql,
            params![pool, now, limit_of(limit)],
            "read due semaphore requests",
        )
    }

    fn semaphore_queue(
        &mut self,
        pool: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RequestRow>, StorageError> {
        let sql = format!(
            "SELECT {REQUEST_COLUMNS} FROM durability_semaphore_request
             WHERE pool = ?1 AND state = {QUEUED} AND id > ?2 ORDER BY id LIMIT ?3"
        );
        self.requests(
            &sql,
            params![pool, i64_of(after), limit_of(limit)],
            "read semaphore queue",
        )
    }

    fn semaphore_queued_before(&mut self, pool: &str, id: u64) -> Result<u64, StorageError> {
        self.count(
            "count semaphore queue",
            &format!(
                "SELECT COUNT(*) FROM durability_semaphore_request
                 WHERE pool = ?1 AND state = {QUEUED} AND id < ?2"
            ),
            params![pool, i64_of(id)],
        )
    }

    fn semaphore_due_pools(&mut self, now: i64, limit: usize) -> Result<Vec<String>, StorageError> {
        self.sql()
            .prepare_cached(
                "SELECT DISTINCT pool FROM durability_semaphore_request
                 WHERE due_at <= ?1 ORDER BY pool LIMIT ?2",
            )
            .and_then(|mut st| {
                st.query_map(params![now, limit_of(limit)], |r| r.get(0))?
                    .collect()
            })
            .map_err(|e| backend("read due semaphore pools", e))
    }

    fn semaphore_quarantine(
        &mut self,
        pool: &str,
        at: i64,
    ) -> Result<Vec<CorruptRequest>, StorageError> {
        // Every row of the pool, decoded one by one; the key as stored
        // (whatever its type) locates a corrupt one.
        let rows: Vec<(Value, Result<RequestRow, String>)> = self
            .sql()
            .prepare_cached(&format!(
                "SELECT {REQUEST_COLUMNS}, key FROM durability_semaphore_request WHERE pool = ?1"
            ))
            .and_then(|mut st| {
                st.query_map([pool], |r| Ok((r.get::<_, Value>(10)?, request_row(r)?)))?
                    .collect()
            })
            .map_err(|e| backend("read semaphore requests", e))?;
        let mut moved = Vec::new();
        for (key, decoded) in rows {
            let Err(reason) = decoded else { continue };
            let what = "quarantine semaphore request";
            self.exec(
                what,
                &format!(
                    "INSERT INTO durability_semaphore_quarantine ({REQUEST_COLUMNS}, reason, quarantined_at)
                     SELECT {REQUEST_COLUMNS}, ?3, ?4 FROM durability_semaphore_request
                     WHERE pool = ?1 AND key = ?2"
                ),
                params![pool, key, reason, at],
            )?;
            self.exec(
                what,
                "DELETE FROM durability_semaphore_request WHERE pool = ?1 AND key = ?2",
                params![pool, key],
            )?;
            let key = match key {
                Value::Text(t) => t,
                Value::Blob(b) => String::from_utf8_lossy(&b).into_owned(),
                other => format!("{other:?}"),
            };
            moved.push(CorruptRequest {
                pool: pool.to_owned(),
                key,
                reason,
            });
        }
        Ok(moved)
    }

    fn semaphore_delete_pool(&mut self, pool: &str) -> Result<bool, StorageError> {
        let what = "delete semaphore pool";
        self.exec(
            what,
            "DELETE FROM durability_semaphore_request WHERE pool = ?1",
            [pool],
        )?;
        self.exec(
            what,
            "DELETE FROM durability_semaphore_pool WHERE name = ?1",
            [pool],
        )
        .map(|n| n > 0)
    }

    fn semaphore_next_due(&mut self) -> Result<Option<i64>, StorageError> {
        self.sql()
            .prepare_cached("SELECT MIN(due_at) FROM durability_semaphore_request")
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .map_err(|e| backend("read next semaphore due", e))
    }
}
