//! The outbox store (`OutboxTx`) in the deployment's shared tables:
//! `durability_object_outbox`, the per-object version counter, and the
//! quarantine of corrupt rows.
//!
//! Columns are typed, so a stored row can only be corrupt by range: a
//! version outside `1..=2^53-1`, an attempt outside `0..=u32::MAX`, or a
//! time outside `0..=2^53-1` is a [`StoredRow::Corrupt`], never a misread
//! value. Such rows still come back from `outbox_due` (so they are
//! quarantined instead of sitting there unseen) and stay deletable.

use durability_outbox::{CorruptEntry, OutboxTx, Reschedule, RowCells, StoredEntry, StoredRow};
use durability_scheduler::StorageError;
use tokio_postgres::Row;

use super::rows::get;
use super::tx::PostgresObjectTx;

const COLUMNS: &str = "channel, key, value, version, attempt, due_at, claimed_until";

/// Largest stored time or version: 2^53-1.
const MAX_SAFE: i64 = (1 << 53) - 1;

/// The row identity handed back to `outbox_quarantine`: `t`, then the
/// key's bytes (as on SQLite, where `b` marks a blob key).
fn row_id(key: &str) -> Vec<u8> {
    let mut id = Vec::with_capacity(key.len() + 1);
    id.push(b't');
    id.extend_from_slice(key.as_bytes());
    id
}

fn decode(r: &Row) -> Result<StoredRow, StorageError> {
    let channel: String = get(r, 0, "outbox channel")?;
    let key: String = get(r, 1, "outbox key")?;
    let value: Vec<u8> = get(r, 2, "outbox value")?;
    Ok(RowCells {
        channel,
        row: row_id(&key),
        key,
        value: Some(value),
        problem: None,
        version: Ok(get(r, 3, "outbox version")?),
        attempt: Ok(get(r, 4, "outbox attempt")?),
        due_at: Ok(get(r, 5, "outbox due time")?),
        claimed_until: Ok(get(r, 6, "outbox claim")?),
    }
    .check())
}

fn i64_of(v: u64) -> Result<i64, StorageError> {
    i64::try_from(v).map_err(|_| StorageError::corrupt(format!("version {v} out of range")))
}

fn count(n: i64) -> u64 {
    n.unsigned_abs()
}

impl OutboxTx for PostgresObjectTx<'_> {
    fn outbox_next_version(&mut self) -> Result<u64, StorageError> {
        let row = self.row(
            "issue outbox version",
            &format!(
                "UPDATE {{s}}.durability_object_outbox_version SET last = last + 1
                 WHERE object_id = $1 AND last >= 0 AND last < {MAX_SAFE} RETURNING last"
            ),
            &[],
        )?;
        let Some(row) = row else {
            return Err(StorageError::corrupt(
                "the outbox version counter is missing, negative or out of range",
            ));
        };
        let last: i64 = get(&row, 0, "outbox version")?;
        Ok(last.unsigned_abs())
    }

    fn outbox_upsert(&mut self, e: &StoredEntry) -> Result<(), StorageError> {
        let version = i64_of(e.version)?;
        self.exec(
            "stage outbox entry",
            "INSERT INTO {s}.durability_object_outbox
               (object_id, channel, key, value, version, attempt, due_at, claimed_until)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (object_id, channel, key) DO UPDATE SET
               value = EXCLUDED.value, version = EXCLUDED.version,
               attempt = EXCLUDED.attempt, due_at = EXCLUDED.due_at,
               claimed_until = EXCLUDED.claimed_until",
            &[
                &e.channel,
                &e.key,
                &e.value,
                &version,
                &i64::from(e.attempt),
                &e.due_at,
                &e.claimed_until,
            ],
        )
        .map(|_| ())
    }

    fn outbox_get(&mut self, channel: &str, key: &str) -> Result<Option<StoredRow>, StorageError> {
        self.row(
            "read outbox entry",
            &format!(
                "SELECT {COLUMNS} FROM {{s}}.durability_object_outbox
                 WHERE object_id = $1 AND channel = $2 AND key = $3"
            ),
            &[&channel, &key],
        )?
        .map(|r| decode(&r))
        .transpose()
    }

    fn outbox_remove(&mut self, channel: &str, key: &str) -> Result<bool, StorageError> {
        self.exec(
            "discard outbox entry",
            "DELETE FROM {s}.durability_object_outbox
             WHERE object_id = $1 AND channel = $2 AND key = $3",
            &[&channel, &key],
        )
        .map(|n| n > 0)
    }

    fn outbox_remove_if(
        &mut self,
        channel: &str,
        key: &str,
        version: u64,
        attempt: u32,
    ) -> Result<bool, StorageError> {
        self.exec(
            "settle outbox entry",
            "DELETE FROM {s}.durability_object_outbox
             WHERE object_id = $1 AND channel = $2 AND key = $3 AND version = $4 AND attempt = $5",
            &[&channel, &key, &i64_of(version)?, &i64::from(attempt)],
        )
        .map(|n| n > 0)
    }

    fn outbox_reschedule_if(&mut self, change: Reschedule<'_>) -> Result<bool, StorageError> {
        self.exec(
            "reschedule outbox entry",
            "UPDATE {s}.durability_object_outbox SET attempt = $6, due_at = $7, claimed_until = $8
             WHERE object_id = $1 AND channel = $2 AND key = $3 AND version = $4 AND attempt = $5",
            &[
                &change.channel,
                &change.key,
                &i64_of(change.version)?,
                &i64::from(change.expected_attempt),
                &i64::from(change.attempt),
                &change.due_at,
                &change.claimed_until,
            ],
        )
        .map(|n| n > 0)
    }

    fn outbox_due(
        &mut self,
        channel: &str,
        now: i64,
        limit: usize,
    ) -> Result<Vec<StoredRow>, StorageError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // Rows due now, then rows whose due time is past 2^53-1: those are
        // corrupt and come back to be quarantined. Two index range scans;
        // the second finds nothing on healthy data.
        self.rows(
            "read due outbox entries",
            &format!(
                "(SELECT {COLUMNS} FROM {{s}}.durability_object_outbox
                   WHERE object_id = $1 AND channel = $2 AND due_at <= $3
                   ORDER BY due_at, version LIMIT $4)
                 UNION ALL
                 (SELECT {COLUMNS} FROM {{s}}.durability_object_outbox
                   WHERE object_id = $1 AND channel = $2 AND due_at > {MAX_SAFE} LIMIT $4)"
            ),
            &[&channel, &now, &limit],
        )?
        .iter()
        .map(decode)
        .collect()
    }

    fn outbox_next_due(&mut self, channel: &str) -> Result<Option<i64>, StorageError> {
        // A corrupt earliest due time reads as due now: the run it
        // triggers quarantines the row.
        self.row(
            "read next outbox due",
            "SELECT due_at FROM {s}.durability_object_outbox
             WHERE object_id = $1 AND channel = $2 ORDER BY due_at LIMIT 1",
            &[&channel],
        )?
        .map(|r| {
            let due: i64 = get(&r, 0, "outbox due time")?;
            Ok(if (0..=MAX_SAFE).contains(&due) {
                due
            } else {
                0
            })
        })
        .transpose()
    }

    fn outbox_len(&mut self, channel: &str) -> Result<u64, StorageError> {
        let row = self.row(
            "count outbox entries",
            "SELECT count(*) FROM {s}.durability_object_outbox WHERE object_id = $1 AND channel = $2",
            &[&channel],
        )?;
        row.map_or(Ok(0), |r| get(&r, 0, "outbox count").map(count))
    }

    fn outbox_quarantine(&mut self, row: &CorruptEntry, at: i64) -> Result<bool, StorageError> {
        let key = match row.row.split_first() {
            Some((b't', key)) => std::str::from_utf8(key).ok(),
            _ => None,
        };
        let Some(key) = key else {
            return Err(StorageError::corrupt(
                "a corrupt outbox row without a text key cannot be located",
            ));
        };
        self.exec(
            "quarantine outbox row",
            "WITH moved AS (
               DELETE FROM {s}.durability_object_outbox
               WHERE object_id = $1 AND channel = $2 AND key = $3
               RETURNING object_id, channel, key, value, version, attempt, due_at, claimed_until)
             INSERT INTO {s}.durability_object_outbox_quarantine
               (object_id, channel, key, value, version, attempt, due_at, claimed_until,
                reason, quarantined_at)
             SELECT object_id, channel, key, value, version, attempt, due_at, claimed_until, $4, $5
             FROM moved",
            &[&row.channel, &key, &row.reason, &at],
        )
        .map(|n| n > 0)
    }

    fn outbox_quarantined_len(&mut self, channel: &str) -> Result<u64, StorageError> {
        let row = self.row(
            "count quarantined outbox rows",
            "SELECT count(*) FROM {s}.durability_object_outbox_quarantine
             WHERE object_id = $1 AND channel = $2",
            &[&channel],
        )?;
        row.map_or(Ok(0), |r| get(&r, 0, "quarantine count").map(count))
    }

    fn outbox_purge_quarantined(&mut self, channel: &str) -> Result<u64, StorageError> {
        self.exec(
            "purge quarantined outbox rows",
            "DELETE FROM {s}.durability_object_outbox_quarantine
             WHERE object_id = $1 AND channel = $2",
            &[&channel],
        )
    }
}
