//! SQLite topology tables and key-value publication store.
//!
//! - [`TopologyTx`] on [`SqliteTx`]: the coordinator's tables
//!   `durability_topology_groups`, `durability_topology_states` and
//!   `durability_topology_writes`, registered under
//!   `durability_topology::SCHEMA`.
//! - [`SqlitePublication`]: the embedded publication store, a key-value
//!   table `durability_topology_published` in its own database file, so the
//!   coordinator writes and readers on the same machine read it. It
//!   implements `Publisher` and `ReadStore`. [`SqlitePublication::open`] is
//!   a plain key-value store (last write wins, the landing-window
//!   bound applies); [`SqlitePublication::open_versioned`] keeps only the
//!   highest version per group and coordinator.
//!
//! Statements run synchronously on the calling task while holding the
//! connection's mutex; SQLite statements on a local file are short.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use durability_scheduler::{SchemaStep, StorageError};
use durability_topology::{
    BoxError, EncodedSnapshot, GroupRow, PublishError, Publisher, Snapshot, SnapshotDeletion,
    TopologyTx,
};
use durability_topology_client::ReadStore;
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, params};

use crate::object::{SqliteSchemaStep, SqliteTx, backend};

pub(crate) static STEPS: &[SchemaStep] = &[SchemaStep::new(1, "initial")];

pub(crate) static SQL_STEPS: &[SqliteSchemaStep] = &[SqliteSchemaStep {
    step: SchemaStep::new(1, "initial"),
    up: "
CREATE TABLE durability_topology_groups (
    group_id TEXT PRIMARY KEY NOT NULL,
    version INTEGER NOT NULL,
    members TEXT NOT NULL,
    deleted INTEGER NOT NULL CHECK (deleted IN (0, 1)),
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE durability_topology_states (
    group_id TEXT NOT NULL,
    channel TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (group_id, channel)
) WITHOUT ROWID;
CREATE TABLE durability_topology_writes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    group_id TEXT NOT NULL,
    land_by INTEGER NOT NULL
);
CREATE INDEX durability_topology_writes_by_group
    ON durability_topology_writes (group_id, land_by);
",
    down: "
DROP TABLE durability_topology_groups;
DROP TABLE durability_topology_states;
DROP TABLE durability_topology_writes;
",
}];

fn u64_of(v: i64, what: &str) -> Result<u64, StorageError> {
    u64::try_from(v).map_err(|_| StorageError::corrupt(format!("negative {what}")))
}

fn i64_of(v: u64) -> Result<i64, StorageError> {
    i64::try_from(v).map_err(|_| StorageError::corrupt(format!("version {v} out of range")))
}

impl TopologyTx for SqliteTx<'_> {
    fn topology_group(&mut self, group: &str) -> Result<Option<GroupRow>, StorageError> {
        // Read as raw values and decode strictly: a text-valued or negative
        // version, a non-text member list or a `deleted` other than 0 / 1 is
        // a corrupt row (never a retryable backend failure, never coerced).
        let row: Option<(Value, Value, Value)> = self
            .sql()
            .prepare_cached(
                "SELECT version, members, deleted FROM durability_topology_groups
                 WHERE group_id = ?1",
            )
            .and_then(|mut st| {
                st.query_row([group], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()
            })
            .map_err(|e| backend("read topology group", e))?;
        let Some((version, members, deleted)) = row else {
            return Ok(None);
        };
        let bad = |what: &str| StorageError::corrupt(format!("topology group {group:?}: {what}"));
        let version = match version {
            Value::Integer(v) if v >= 1 => u64_of(v, "group version")?,
            other => return Err(bad(&format!("version {other:?} is not a positive integer"))),
        };
        let Value::Text(members) = members else {
            return Err(bad("members are not text"));
        };
        let deleted = match deleted {
            Value::Integer(0) => false,
            Value::Integer(1) => true,
            other => return Err(bad(&format!("deleted {other:?} is not 0 or 1"))),
        };
        Ok(Some(GroupRow {
            version,
            members,
            deleted,
        }))
    }

    fn topology_put_group(
        &mut self,
        group: &str,
        row: &GroupRow,
        updated_at: i64,
    ) -> Result<(), StorageError> {
        let version = i64_of(row.version)?;
        self.sql()
            .prepare_cached(
                "INSERT INTO durability_topology_groups
                   (group_id, version, members, deleted, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (group_id) DO UPDATE SET
                   version = excluded.version, members = excluded.members,
                   deleted = excluded.deleted, updated_at = excluded.updated_at",
            )
            .and_then(|mut st| {
                st.execute(params![
                    group,
                    version,
                    row.members,
                    i64::from(row.deleted),
                    updated_at
                ])
            })
            .map(|_| ())
            .map_err(|e| backend("write topology group", e))
    }

    fn topology_states(&mut self, group: &str) -> Result<Vec<(String, String)>, StorageError> {
        self.sql()
            .prepare_cached(
                "SELECT channel, value FROM durability_topology_states
                 WHERE group_id = ?1 ORDER BY channel",
            )
            .and_then(|mut st| {
                st.query_map([group], |r| {
                    Ok((r.get::<_, Value>(0)?, r.get::<_, Value>(1)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| backend("read topology states", e))?
            .into_iter()
            .map(|row| match row {
                (Value::Text(channel), Value::Text(value)) => Ok((channel, value)),
                other => Err(StorageError::corrupt(format!(
                    "topology state of group {group:?}: {other:?} is not (text, text)"
                ))),
            })
            .collect()
    }

    fn topology_put_state(
        &mut self,
        group: &str,
        channel: &str,
        value: &str,
    ) -> Result<(), StorageError> {
        self.sql()
            .prepare_cached(
                "INSERT INTO durability_topology_states (group_id, channel, value)
                 VALUES (?1, ?2, ?3)
                 ON CONFLICT (group_id, channel) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut st| st.execute([group, channel, value]))
            .map(|_| ())
            .map_err(|e| backend("write topology state", e))
    }

    fn topology_delete_states(&mut self, group: &str) -> Result<(), StorageError> {
        self.sql()
            .prepare_cached("DELETE FROM durability_topology_states WHERE group_id = ?1")
            .and_then(|mut st| st.execute([group]))
            .map(|_| ())
            .map_err(|e| backend("delete topology states", e))
    }

    fn topology_record_write(&mut self, group: &str, land_by: i64) -> Result<u64, StorageError> {
        let id: i64 = self
            .sql()
            .prepare_cached(
                "INSERT INTO durability_topology_writes (group_id, land_by) VALUES (?1, ?2)
                 RETURNING id",
            )
            .and_then(|mut st| st.query_row(params![group, land_by], |r| r.get(0)))
            .map_err(|e| backend("record topology write", e))?;
        u64_of(id, "write id")
    }

    fn topology_forget_write(&mut self, id: u64) -> Result<(), StorageError> {
        let id = i64_of(id)?;
        self.sql()
            .prepare_cached("DELETE FROM durability_topology_writes WHERE id = ?1")
            .and_then(|mut st| st.execute([id]))
            .map(|_| ())
            .map_err(|e| backend("forget topology write", e))
    }

    fn topology_outstanding_until(
        &mut self,
        group: &str,
        now: i64,
    ) -> Result<Option<i64>, StorageError> {
        self.sql()
            .prepare_cached(
                "DELETE FROM durability_topology_writes WHERE group_id = ?1 AND land_by <= ?2",
            )
            .and_then(|mut st| st.execute(params![group, now]))
            .map_err(|e| backend("drop expired topology writes", e))?;
        self.sql()
            .prepare_cached(
                "SELECT MAX(land_by) FROM durability_topology_writes WHERE group_id = ?1",
            )
            .and_then(|mut st| st.query_row([group], |r| r.get(0)))
            .map_err(|e| backend("read outstanding topology writes", e))
    }
}

const PUBLISHED_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS durability_topology_published (
    group_id TEXT PRIMARY KEY NOT NULL,
    coordinator TEXT NOT NULL,
    version INTEGER NOT NULL,
    encoded BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS durability_topology_published_versions (
    group_id TEXT NOT NULL,
    coordinator TEXT NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (group_id, coordinator)
) WITHOUT ROWID;
";

/// The embedded publication store: one SQLite file the coordinator writes
/// and readers on the same machine read (each opens its own connection).
pub struct SqlitePublication {
    conn: Mutex<Connection>,
    versioned: bool,
}

durability_time::debug_fields!(SqlitePublication { versioned });

impl SqlitePublication {
    /// Opens (or creates) the store at `path` as a plain key-value store:
    /// last write wins.
    ///
    /// # Errors
    /// A SQLite failure opening the file or creating the table.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StorageError> {
        Self::init(path.as_ref(), false)
    }

    /// Opens the store keeping only the highest version per group and
    /// coordinator: a late older write never overwrites a newer snapshot.
    ///
    /// # Errors
    /// A SQLite failure opening the file or creating the table.
    pub fn open_versioned(path: impl AsRef<Path>) -> Result<Self, StorageError> {
        Self::init(path.as_ref(), true)
    }

    fn init(path: &Path, versioned: bool) -> Result<Self, StorageError> {
        let conn = Connection::open(path).map_err(|e| backend("open publication store", e))?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(|e| backend("set busy timeout", e))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| backend("enable WAL", e))?;
        conn.execute_batch(PUBLISHED_SCHEMA)
            .map_err(|e| backend("create publication table", e))?;
        Ok(Self {
            conn: Mutex::new(conn),
            versioned,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// In versioned mode, admits `version` if it is newer than any seen for
    /// the group and coordinator, and records it.
    fn admit(
        tx: &rusqlite::Transaction<'_>,
        group: &str,
        coordinator: &str,
        version: i64,
    ) -> rusqlite::Result<bool> {
        let n = tx.execute(
            "INSERT INTO durability_topology_published_versions (group_id, coordinator, version)
             VALUES (?1, ?2, ?3)
             ON CONFLICT (group_id, coordinator) DO UPDATE SET version = excluded.version
             WHERE excluded.version > durability_topology_published_versions.version",
            params![group, coordinator, version],
        )?;
        Ok(n > 0)
    }

    fn write_sync(&self, snapshot: &Snapshot, encoded: &EncodedSnapshot) -> Result<(), BoxError> {
        let version = i64_of(snapshot.version)?;
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        if !self.versioned || Self::admit(&tx, &snapshot.group, &snapshot.coordinator, version)? {
            tx.execute(
                "INSERT INTO durability_topology_published (group_id, coordinator, version, encoded)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (group_id) DO UPDATE SET coordinator = excluded.coordinator,
                   version = excluded.version, encoded = excluded.encoded",
                params![
                    snapshot.group,
                    snapshot.coordinator,
                    version,
                    encoded.as_bytes()
                ],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    fn delete_sync(&self, group: &str, version: u64, coordinator: &str) -> Result<(), BoxError> {
        let version = i64_of(version)?;
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        if !self.versioned || Self::admit(&tx, group, coordinator, version)? {
            tx.execute(
                "DELETE FROM durability_topology_published WHERE group_id = ?1",
                [group],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    fn read_sync(&self, group: &str) -> Result<Option<Vec<u8>>, BoxError> {
        Ok(self
            .lock()
            .prepare_cached(
                "SELECT encoded FROM durability_topology_published WHERE group_id = ?1",
            )?
            .query_row([group], |r| r.get(0))
            .optional()?)
    }
}

/// Every failure is a rejection: the write runs in one local SQLite
/// transaction, which rolled back, so it can never land later.
impl Publisher for SqlitePublication {
    async fn write(
        &self,
        snapshot: &Snapshot,
        encoded: &EncodedSnapshot,
    ) -> Result<(), PublishError> {
        self.write_sync(snapshot, encoded)
            .map_err(PublishError::rejected)
    }

    async fn delete(&self, deletion: SnapshotDeletion<'_>) -> Result<(), PublishError> {
        self.delete_sync(deletion.group, deletion.version, deletion.coordinator)
            .map_err(PublishError::rejected)
    }
}

impl ReadStore for SqlitePublication {
    async fn read(&self, group: &str) -> Result<Option<Vec<u8>>, BoxError> {
        self.read_sync(group)
    }
}
