//! The SQLite side of [`crate::idempotency`]: the recorded keys of one
//! object in its own `idempotency_keys` table, read and written in the
//! caller's transaction (see that module for the contract; the
//! at-most-once logic is there).

use durability_scheduler::{StorageError, Transaction};
use durability_storage_sqlite::SqliteStorage;
use durability_storage_sqlite::rusqlite::{self, OptionalExtension as _, params};
use serde_json::Value;

/// The table of recorded keys in each object's storage.
pub(crate) const TABLE: &str = "idempotency_keys";

fn sql(e: rusqlite::Error) -> StorageError {
    StorageError::backend("idempotency keys", e)
}

/// The result recorded for (`method`, `key`) in the caller's transaction
/// `tx`, if there is one (the table is created when absent).
///
/// # Errors
/// A storage failure; a recorded result that is not JSON (a corrupt row)
/// as a storage error naming the key.
pub(crate) fn recorded(
    tx: &mut Transaction<'_, '_, SqliteStorage>,
    method: &str,
    key: &str,
) -> Result<Option<Value>, StorageError> {
    tx.sql()
        .execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (
                method TEXT NOT NULL,
                key TEXT NOT NULL,
                result TEXT NOT NULL,
                PRIMARY KEY (method, key)
            )"
        ))
        .map_err(sql)?;
    let recorded: Option<String> = tx
        .sql()
        .query_row(
            &format!("SELECT result FROM {TABLE} WHERE method = ?1 AND key = ?2"),
            params![method, key],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql)?;
    recorded
        .map(|recorded| {
            serde_json::from_str(&recorded).map_err(|e| {
                StorageError::backend(
                    "idempotency keys",
                    format!("the recorded result of key {} is not JSON: {e}", key),
                )
            })
        })
        .transpose()
}

/// Records `result` for (`method`, `key`) in the caller's transaction
/// `tx` (after [`recorded`] found none).
///
/// # Errors
/// A storage failure.
pub(crate) fn record(
    tx: &mut Transaction<'_, '_, SqliteStorage>,
    method: &str,
    key: &str,
    result: &Value,
) -> Result<(), StorageError> {
    tx.sql()
        .execute(
            &format!("INSERT INTO {TABLE} (method, key, result) VALUES (?1, ?2, ?3)"),
            params![method, key, result.to_string()],
        )
        .map_err(sql)?;
    Ok(())
}

/// Removes up to `limit` recorded keys of this object (oldest rows
/// first), in the caller's transaction; returns how many. Call it when the
/// callers' retry horizon has passed.
///
/// # Errors
/// A storage failure.
pub(crate) fn prune(
    tx: &mut Transaction<'_, '_, SqliteStorage>,
    limit: u32,
) -> Result<usize, StorageError> {
    let exists: bool = tx
        .sql()
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
            [TABLE],
            |r| r.get(0),
        )
        .map_err(sql)?;
    if !exists {
        return Ok(0);
    }
    tx.sql()
        .execute(
            &format!(
                "DELETE FROM {TABLE} WHERE rowid IN (SELECT rowid FROM {TABLE} ORDER BY rowid LIMIT ?1)"
            ),
            [limit],
        )
        .map_err(sql)
}
