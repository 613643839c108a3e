//! The SQLite side of [`crate::idempotency`]: the recorded keys of one
//! object in its own `idempotency_keys` table, read and written in the
//! caller's transaction (see that module for the contract).

use durability_scheduler::{StorageError, Transaction};
use durability_storage_sqlite::SqliteStorage;
use durability_storage_sqlite::rusqlite::{self, OptionalExtension as _, params};
use serde_json::Value;

/// The table of recorded keys in each object's storage.
pub(crate) const TABLE: &str = "idempotency_keys";

fn sql(e: rusqlite::Error) -> StorageError {
    StorageError::backend("idempotency keys", e)
}

/// Runs `body` at most once for (`method`, `key`) on this object, in the
/// caller's transaction `tx` (module docs): the recorded result if the key
/// is already there, else the body's result, recorded with the key.
///
/// # Errors
/// The body's error (nothing recorded); a storage failure; a recorded
/// result that is not JSON (a corrupt row) as a storage error naming the
/// key.
pub(crate) fn once<F>(
    tx: &mut Transaction<'_, '_, SqliteStorage>,
    method: &str,
    key: &str,
    body: F,
) -> Result<Value, StorageError>
where
    F: FnOnce(&mut Transaction<'_, '_, SqliteStorage>) -> Result<Value, StorageError>,
{
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
    if let Some(recorded) = recorded {
        return serde_json::from_str(&recorded).map_err(|e| {
            StorageError::backend(
                "idempotency keys",
                format!("the recorded result of key {} is not JSON: {e}", key),
            )
        });
    }
    let result = body(tx)?;
    tx.sql()
        .execute(
            &format!("INSERT INTO {TABLE} (method, key, result) VALUES (?1, ?2, ?3)"),
            params![method, key, result.to_string()],
        )
        .map_err(sql)?;
    Ok(result)
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
