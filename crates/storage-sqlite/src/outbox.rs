//! The outbox store on SQLite: the `durability_outbox` table, the
//! object-wide version counter, and the quarantine of corrupt rows.
//!
//! Rows are decoded strictly: a version, attempt or time that is not an
//! integer in range, a value that is not a blob or a key that is not text
//! is a [`StoredRow::Corrupt`], never a misread value.

use durability_outbox::{CorruptEntry, OutboxTx, Reschedule, RowCells, StoredEntry, StoredRow};
use durability_scheduler::{SchemaStep, StorageError};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{OptionalExtension, Row, params};

use crate::object::{SqliteSchemaStep, SqliteTx, backend};

pub(crate) static STEPS: &[SchemaStep] = durability_outbox::SCHEMA_STEPS;

pub(crate) static SQL_STEPS: &[SqliteSchemaStep] = &[
    SqliteSchemaStep {
        step: STEPS[0],
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
    },
    SqliteSchemaStep {
        step: STEPS[1],
        // Untyped columns: a quarantined row keeps exactly what was stored.
        up: "
CREATE TABLE durability_outbox_quarantine (
    channel,
    key,
    value,
    version,
    attempt,
    due_at,
    claimed_until,
    reason TEXT NOT NULL,
    quarantined_at INTEGER NOT NULL
);
CREATE INDEX durability_outbox_quarantine_channel ON durability_outbox_quarantine (channel);
",
        down: "DROP TABLE durability_outbox_quarantine;",
    },
];

pub(crate) const COLUMNS: &str = "channel, key, value, version, attempt, due_at, claimed_until";

/// Largest stored time, version or safe integer: 2^53-1.
const MAX_SAFE: i64 = (1 << 53) - 1;

fn kind(v: ValueRef<'_>) -> &'static str {
    match v {
        ValueRef::Null => "null",
        ValueRef::Integer(_) => "an integer",
        ValueRef::Real(_) => "a real",
        ValueRef::Text(_) => "text",
        ValueRef::Blob(_) => "a blob",
    }
}

/// An integer column, or why not ([`RowCells::check`] checks its range).
fn int(r: &Row<'_>, i: usize, name: &str) -> rusqlite::Result<Result<i64, String>> {
    Ok(match r.get_ref(i)? {
        ValueRef::Integer(v) => Ok(v),
        other => Err(format!("{name} is {}, not an integer", kind(other))),
    })
}

/// The row identity handed back to `outbox_quarantine`: a type tag, then
/// the key's bytes as stored.
fn row_id(tag: u8, bytes: &[u8]) -> Vec<u8> {
    let mut id = Vec::with_capacity(bytes.len() + 1);
    id.push(tag);
    id.extend_from_slice(bytes);
    id
}

pub(crate) fn row(r: &Row<'_>) -> rusqlite::Result<StoredRow> {
    let channel: String = r.get(0)?;
    let (key, id, mut problem) = match r.get_ref(1)? {
        ValueRef::Text(b) => match std::str::from_utf8(b) {
            Ok(k) => (k.to_owned(), row_id(b't', b), None),
            Err(_) => (
                String::from_utf8_lossy(b).into_owned(),
                row_id(b't', b),
                Some("key is not UTF-8".to_owned()),
            ),
        },
        ValueRef::Blob(b) => (
            String::from_utf8_lossy(b).into_owned(),
            row_id(b'b', b),
            Some("key is a blob, not text".to_owned()),
        ),
        other => (
            String::new(),
            Vec::new(),
            Some(format!("key is {}", kind(other))),
        ),
    };
    let value = match r.get_ref(2)? {
        ValueRef::Blob(b) => Some(b.to_vec()),
        other => {
            problem.get_or_insert(format!("value is {}, not a blob", kind(other)));
            None
        }
    };
    let (version, attempt, due_at) = (
        int(r, 3, "version")?,
        int(r, 4, "attempt")?,
        int(r, 5, "due_at")?,
    );
    let claimed_until = match r.get_ref(6)? {
        ValueRef::Null => Ok(None),
        _ => int(r, 6, "claimed_until")?.map(Some),
    };
    Ok(RowCells {
        channel,
        key,
        row: id,
        value,
        problem,
        version,
        attempt,
        due_at,
        claimed_until,
    }
    .check())
}

/// Versions reserved by one counter write.
const VERSION_BLOCK: i64 = 1_000;

/// Outbox versions `next..=limit`, reserved by a committed transaction
/// that moved the stored counter to `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VersionBlock {
    next: i64,
    limit: i64,
}

/// A transaction's view of the version counter.
///
/// The stored counter is the highest version *reserved*. A transaction
/// reserves a block of [`VERSION_BLOCK`] versions with one write and later
/// transactions issue from it with only a read: each first reads the
/// counter, and uses the remembered block only while the counter still
/// equals the block's end. Any other reservation (another handle on the
/// same file) moves the counter, so the block is dropped and a new one is
/// reserved above it: every version issued is above every version issued
/// before, by anyone, and a crash only skips the unissued rest of a block.
#[derive(Debug)]
pub(crate) struct TxVersions {
    block: Option<VersionBlock>,
    checked: bool,
    issued: bool,
}

impl TxVersions {
    /// The view of a new transaction, from the last committed block.
    pub(crate) fn new(block: Option<VersionBlock>) -> Self {
        Self {
            block,
            checked: false,
            issued: false,
        }
    }

    /// The block to remember once this transaction commits, if it issued a
    /// version.
    pub(crate) fn committed(&self) -> Option<VersionBlock> {
        if self.issued { self.block } else { None }
    }
}

fn i64_of(v: u64) -> Result<i64, StorageError> {
    i64::try_from(v).map_err(|_| StorageError::corrupt(format!("version {v} out of range")))
}

impl OutboxTx for SqliteTx<'_> {
    fn outbox_next_version(&mut self) -> Result<u64, StorageError> {
        if !self.versions.checked {
            // Strictly: a negative, non-integer or missing counter issues
            // nothing (SQLite would do arithmetic on text as 0).
            let last: Option<(i64, String)> = self
                .sql()
                .prepare_cached(
                    "SELECT last, typeof(last) FROM durability_outbox_version WHERE id = 0",
                )
                .and_then(|mut st| {
                    st.query_row([], |r| {
                        Ok((r.get_ref(0)?.as_i64().unwrap_or(-1), r.get(1)?))
                    })
                    .optional()
                })
                .map_err(|e| backend("read outbox version", e))?;
            let last = match last {
                Some((last, kind)) if kind == "integer" && last >= 0 => last,
                _ => {
                    return Err(StorageError::corrupt(
                        "the outbox version counter is missing, negative or not an integer",
                    ));
                }
            };
            self.versions.checked = true;
            if self.versions.block.is_none_or(|b| b.limit != last) {
                self.versions.block = None;
            }
        }
        let block = match self.versions.block {
            Some(b) if b.next <= b.limit => b,
            _ => {
                let limit: Option<i64> = self
                    .sql()
                    .prepare_cached(&format!(
                        "UPDATE durability_outbox_version SET last = last + {VERSION_BLOCK}
                         WHERE id = 0 AND typeof(last) = 'integer'
                           AND last >= 0 AND last <= {}
                         RETURNING last",
                        i64::MAX - VERSION_BLOCK
                    ))
                    .and_then(|mut st| st.query_row([], |r| r.get(0)).optional())
                    .map_err(|e| backend("reserve outbox versions", e))?;
                let limit = limit.ok_or_else(|| {
                    StorageError::corrupt("the outbox version counter is out of range")
                })?;
                VersionBlock {
                    next: limit - VERSION_BLOCK + 1,
                    limit,
                }
            }
        };
        self.versions.block = Some(VersionBlock {
            next: block.next + 1,
            limit: block.limit,
        });
        self.versions.issued = true;
        u64::try_from(block.next).map_err(|_| StorageError::corrupt("negative outbox version"))
    }

    fn outbox_upsert(&mut self, e: &StoredEntry) -> Result<(), StorageError> {
        self.exec(
            "stage outbox entry",
            "INSERT INTO durability_outbox
               (channel, key, value, version, attempt, due_at, claimed_until)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (channel, key) DO UPDATE SET
               value = excluded.value, version = excluded.version,
               attempt = excluded.attempt, due_at = excluded.due_at,
               claimed_until = excluded.claimed_until",
            params![
                e.channel,
                e.key,
                e.value,
                i64_of(e.version).unwrap_or(i64::MAX),
                e.attempt,
                e.due_at,
                e.claimed_until
            ],
        )
        .map(|_| ())
    }

    fn outbox_stage(&mut self, e: &StoredEntry) -> Result<bool, StorageError> {
        // A new key is one insert; only a key already there pays a second
        // statement, the update (no read before either).
        let version = i64_of(e.version).unwrap_or(i64::MAX);
        let row = params![
            e.channel,
            e.key,
            e.value,
            version,
            e.attempt,
            e.due_at,
            e.claimed_until
        ];
        let inserted = self.exec(
            "stage outbox entry",
            "INSERT INTO durability_outbox
               (channel, key, value, version, attempt, due_at, claimed_until)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (channel, key) DO NOTHING",
            row,
        )?;
        if inserted > 0 {
            return Ok(true);
        }
        self.exec(
            "stage outbox entry",
            "UPDATE durability_outbox SET value = ?3, version = ?4, attempt = ?5,
               due_at = ?6, claimed_until = ?7
             WHERE channel = ?1 AND key = ?2",
            row,
        )?;
        Ok(false)
    }

    fn outbox_get(&mut self, channel: &str, key: &str) -> Result<Option<StoredRow>, StorageError> {
        self.sql()
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM durability_outbox WHERE channel = ?1 AND key = ?2"
            ))
            .and_then(|mut st| st.query_row([channel, key], row).optional())
            .map_err(|e| backend("read outbox entry", e))
    }

    fn outbox_remove(&mut self, channel: &str, key: &str) -> Result<bool, StorageError> {
        self.exec(
            "discard outbox entry",
            "DELETE FROM durability_outbox WHERE channel = ?1 AND key = ?2",
            [channel, key],
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
        let version = i64_of(version)?;
        self.exec(
            "settle outbox entry",
            "DELETE FROM durability_outbox
             WHERE channel = ?1 AND key = ?2 AND version = ?3 AND attempt = ?4",
            params![channel, key, version, attempt],
        )
        .map(|n| n > 0)
    }

    fn outbox_reschedule_if(&mut self, change: Reschedule<'_>) -> Result<bool, StorageError> {
        let version = i64_of(change.version)?;
        self.exec(
            "reschedule outbox entry",
            "UPDATE durability_outbox SET attempt = ?5, due_at = ?6, claimed_until = ?7
             WHERE channel = ?1 AND key = ?2 AND version = ?3 AND attempt = ?4",
            params![
                change.channel,
                change.key,
                version,
                change.expected_attempt,
                change.attempt,
                change.due_at,
                change.claimed_until
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
        // Rows due now, then rows whose due time is past 2^53-1 or not an
        // integer (text sorts after every number): those are corrupt and
        // come back to be quarantined instead of sitting there unseen. Two
        // index range searches; the second finds nothing on healthy data.
        self.sql()
            .prepare_cached(&format!(
                "SELECT * FROM (SELECT {COLUMNS} FROM durability_outbox
                   WHERE channel = ?1 AND due_at <= ?2
                   ORDER BY due_at, version LIMIT ?3)
                 UNION ALL
                 SELECT * FROM (SELECT {COLUMNS} FROM durability_outbox
                   WHERE channel = ?1 AND due_at > {MAX_SAFE} LIMIT ?3)"
            ))
            .and_then(|mut st| {
                st.query_map(params![channel, now, limit], row)?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| backend("read due outbox entries", e))
    }

    fn outbox_next_due(&mut self, channel: &str) -> Result<Option<i64>, StorageError> {
        // A corrupt earliest due time (negative, past 2^53-1, not an
        // integer) reads as due now: the run it triggers quarantines the
        // row, so the alarm moves on instead of staying in the past.
        self.sql()
            .prepare_cached(
                "SELECT due_at FROM durability_outbox WHERE channel = ?1
                 ORDER BY due_at LIMIT 1",
            )
            .and_then(|mut st| {
                st.query_row([channel], |r| {
                    Ok(match r.get_ref(0)? {
                        ValueRef::Integer(v) if (0..=MAX_SAFE).contains(&v) => v,
                        _ => 0,
                    })
                })
                .optional()
            })
            .map_err(|e| backend("read next outbox due", e))
    }

    fn outbox_len(&mut self, channel: &str) -> Result<u64, StorageError> {
        self.count(
            "count outbox entries",
            "SELECT COUNT(*) FROM durability_outbox WHERE channel = ?1",
            [channel],
        )
    }

    fn outbox_quarantine(&mut self, row: &CorruptEntry, at: i64) -> Result<bool, StorageError> {
        let Some((&tag, key)) = row.row.split_first() else {
            return Err(StorageError::corrupt(
                "a corrupt outbox row without a key cannot be located",
            ));
        };
        let key = ToSqlOutput::Borrowed(if tag == b'b' {
            ValueRef::Blob(key)
        } else {
            ValueRef::Text(key)
        });
        let what = "quarantine outbox row";
        self.exec(
            what,
            "INSERT INTO durability_outbox_quarantine
               (channel, key, value, version, attempt, due_at, claimed_until, reason, quarantined_at)
             SELECT channel, key, value, version, attempt, due_at, claimed_until, ?3, ?4
             FROM durability_outbox WHERE channel = ?1 AND key = ?2",
            params![row.channel, key, row.reason, at],
        )?;
        self.exec(
            what,
            "DELETE FROM durability_outbox WHERE channel = ?1 AND key = ?2",
            params![row.channel, key],
        )
        .map(|n| n > 0)
    }

    fn outbox_quarantined_len(&mut self, channel: &str) -> Result<u64, StorageError> {
        self.count(
            "count quarantined outbox rows",
            "SELECT COUNT(*) FROM durability_outbox_quarantine WHERE channel = ?1",
            [channel],
        )
    }

    fn outbox_purge_quarantined(&mut self, channel: &str) -> Result<u64, StorageError> {
        self.exec(
            "purge quarantined outbox rows",
            "DELETE FROM durability_outbox_quarantine WHERE channel = ?1",
            [channel],
        )
        .map(|n| n as u64)
    }
}
