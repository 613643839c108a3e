//! The recorded results of idempotency keys (the host's
//! `durability_host::idempotency`, which holds the at-most-once logic and
//! the contract): one object's `idempotency_keys` table, read and written
//! in the caller's transaction.

use durability_scheduler::StorageError;
use rusqlite::OptionalExtension as _;

use crate::object::{SqliteTx, backend};

/// The table of recorded keys in each object's storage.
pub const IDEMPOTENCY_TABLE: &str = "idempotency_keys";

impl SqliteTx<'_> {
    /// The result recorded for (`method`, `key`), as it was stored (the
    /// table is created when absent).
    ///
    /// # Errors
    /// A SQLite failure.
    pub fn idempotency_result(
        &self,
        method: &str,
        key: &str,
    ) -> Result<Option<String>, StorageError> {
        let sql = self.sql();
        sql.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {IDEMPOTENCY_TABLE} (
                method TEXT NOT NULL,
                key TEXT NOT NULL,
                result TEXT NOT NULL,
                PRIMARY KEY (method, key)
            )"
        ))
        .map_err(|e| backend("idempotency keys", e))?;
        sql.prepare_cached(&format!(
            "SELECT result FROM {IDEMPOTENCY_TABLE} WHERE method = ?1 AND key = ?2"
        ))
        .and_then(|mut st| st.query_row([method, key], |r| r.get(0)).optional())
        .map_err(|e| backend("idempotency keys", e))
    }

    /// Records `result` for (`method`, `key`) (after
    /// [`SqliteTx::idempotency_result`] found none).
    ///
    /// # Errors
    /// A SQLite failure (a key recorded already is a constraint failure).
    pub fn record_idempotency_result(
        &self,
        method: &str,
        key: &str,
        result: &str,
    ) -> Result<(), StorageError> {
        self.sql()
            .prepare_cached(&format!(
                "INSERT INTO {IDEMPOTENCY_TABLE} (method, key, result) VALUES (?1, ?2, ?3)"
            ))
            .and_then(|mut st| st.execute([method, key, result]))
            .map_err(|e| backend("idempotency keys", e))?;
        Ok(())
    }

    /// Removes up to `limit` recorded keys, oldest rows first; returns how
    /// many.
    ///
    /// # Errors
    /// A SQLite failure.
    pub fn prune_idempotency_results(&self, limit: u32) -> Result<usize, StorageError> {
        let sql = self.sql();
        let exists: bool = sql
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
                [IDEMPOTENCY_TABLE],
                |r| r.get(0),
            )
            .map_err(|e| backend("idempotency keys", e))?;
        if !exists {
            return Ok(0);
        }
        sql.execute(
            &format!(
                "DELETE FROM {IDEMPOTENCY_TABLE} WHERE rowid IN \
                 (SELECT rowid FROM {IDEMPOTENCY_TABLE} ORDER BY rowid LIMIT ?1)"
            ),
            [limit],
        )
        .map_err(|e| backend("idempotency keys", e))
    }
}
