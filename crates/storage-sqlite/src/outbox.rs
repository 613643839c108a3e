//! The outbox store on SQLite: the `durability_outbox` table and the
//! object-wide version counter.

use durability_outbox::{OutboxTx, Reschedule, StoredEntry};
use durability_scheduler::{SchemaStep, StorageError};
use rusqlite::{OptionalExtension, Row, params};

use crate::object::{SqliteSchemaStep, SqliteTx, backend};

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
CREATE TABLE durability_outbox (
    channel TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    version INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    due_at INTEGER NOT NULL,
    claimed_until INTEGER,
    PRIMARY KEY (channel, key)
) WITHOUT ROWID;
CREATE INDEX durability_outbox_due ON durability_outbox (channel, due_at, version);
CREATE TABLE durability_outbox_version (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    last INTEGER NOT NULL
);
INSERT INTO durability_outbox_version (id, last) VALUES (0, 0);
",
    down: "
DROP TABLE durability_outbox;
DROP TABLE durability_outbox_version;
",
}];

const COLUMNS: &str = "channel, key, value, version, attempt, due_at, claimed_until";

fn row(r: &Row<'_>) -> rusqlite::Result<StoredEntry> {
    let version: i64 = r.get(3)?;
    let attempt: i64 = r.get(4)?;
    Ok(StoredEntry {
        channel: r.get(0)?,
        key: r.get(1)?,
        value: r.get(2)?,
        version: u64::try_from(version).unwrap_or(0),
        attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
        due_at: r.get(5)?,
        claimed_until: r.get(6)?,
    })
}

fn i64_of(v: u64) -> Result<i64, StorageError> {
    i64::try_from(v).map_err(|_| StorageError::corrupt(format!("version {v} out of range")))
}

impl OutboxTx for SqliteTx<'_> {
    fn outbox_next_version(&mut self) -> Result<u64, StorageError> {
        let last: i64 = self
            .sql()
            .prepare_cached(
                "UPDATE durability_outbox_version SET last = last + 1 WHERE id = 0 RETURNING last",
            )
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .map_err(|e| backend("advance outbox version", e))?;
        u64::try_from(last).map_err(|_| StorageError::corrupt("negative outbox version"))
    }

    fn outbox_upsert(&mut self, e: &StoredEntry) -> Result<(), StorageError> {
        self.sql()
            .prepare_cached(
                "INSERT INTO durability_outbox
                   (channel, key, value, version, attempt, due_at, claimed_until)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (channel, key) DO UPDATE SET
                   value = excluded.value, version = excluded.version,
                   attempt = excluded.attempt, due_at = excluded.due_at,
                   claimed_until = excluded.claimed_until",
            )
            .and_then(|mut st| {
                st.execute(params![
                    e.channel,
                    e.key,
                    e.value,
                    i64_of(e.version).unwrap_or(i64::MAX),
                    e.attempt,
                    e.due_at,
                    e.claimed_until
                ])
            })
            .map(|_| ())
            .map_err(|err| backend("stage outbox entry", err))
    }

    fn outbox_get(
        &mut self,
        channel: &str,
        key: &str,
    ) -> Result<Option<StoredEntry>, StorageError> {
        self.sql()
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM durability_outbox WHERE channel = ?1 AND key = ?2"
            ))
            .and_then(|mut st| st.query_row([channel, key], row).optional())
            .map_err(|e| backend("read outbox entry", e))
    }

    fn outbox_remove(&mut self, channel: &str, key: &str) -> Result<bool, StorageError> {
        self.sql()
            .prepare_cached("DELETE FROM durability_outbox WHERE channel = ?1 AND key = ?2")
            .and_then(|mut st| st.execute([channel, key]))
            .map(|n| n > 0)
            .map_err(|e| backend("discard outbox entry", e))
    }

    fn outbox_remove_if(
        &mut self,
        channel: &str,
        key: &str,
        version: u64,
        attempt: u32,
    ) -> Result<bool, StorageError> {
        let version = i64_of(version)?;
        self.sql()
            .prepare_cached(
                "DELETE FROM durability_outbox
                 WHERE channel = ?1 AND key = ?2 AND version = ?3 AND attempt = ?4",
            )
            .and_then(|mut st| st.execute(params![channel, key, version, attempt]))
            .map(|n| n > 0)
            .map_err(|e| backend("settle outbox entry", e))
    }

    fn outbox_reschedule_if(&mut self, change: Reschedule<'_>) -> Result<bool, StorageError> {
        let Reschedule {
            channel,
            key,
            version,
            expected_attempt,
            attempt,
            due_at,
            claimed_until,
        } = change;
        let version = i64_of(version)?;
        self.sql()
            .prepare_cached(
                "UPDATE durability_outbox SET attempt = ?5, due_at = ?6, claimed_until = ?7
                 WHERE channel = ?1 AND key = ?2 AND version = ?3 AND attempt = ?4",
            )
            .and_then(|mut st| {
                st.execute(params![
                    channel,
                    key,
                    version,
                    expected_attempt,
                    attempt,
                    due_at,
                    claimed_until
                ])
            })
            .map(|n| n > 0)
            .map_err(|e| backend("reschedule outbox entry", e))
    }

    fn outbox_due(
        &mut self,
        channel: &str,
        now: i64,
        limit: usize,
    ) -> Result<Vec<StoredEntry>, StorageError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.sql()
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM durability_outbox
                 WHERE channel = ?1 AND due_at <= ?2
                 ORDER BY due_at, version LIMIT ?3"
            ))
            .and_then(|mut st| {
                st.query_map(params![channel, now, limit], row)?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| backend("read due outbox entries", e))
    }

    fn outbox_next_due(&mut self, channel: &str) -> Result<Option<i64>, StorageError> {
        self.sql()
            .prepare_cached("SELECT MIN(due_at) FROM durability_outbox WHERE channel = ?1")
            .and_then(|mut st| st.query_row([channel], |r| r.get(0)))
            .map_err(|e| backend("read next outbox due", e))
    }

    fn outbox_len(&mut self, channel: &str) -> Result<u64, StorageError> {
        let n: i64 = self
            .sql()
            .prepare_cached("SELECT COUNT(*) FROM durability_outbox WHERE channel = ?1")
            .and_then(|mut st| st.query_row([channel], |r| r.get(0)))
            .map_err(|e| backend("count outbox entries", e))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}
