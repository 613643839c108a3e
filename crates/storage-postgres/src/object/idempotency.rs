//! The recorded results of idempotency keys (the host's
//! `durability_host::idempotency`, which holds the at-most-once logic and
//! the contract): the object's own `idempotency_keys` table, in its own
//! schema, read and written in the caller's transaction (the object row
//! lock the transaction holds serializes them).

use durability_scheduler::StorageError;

use super::PostgresObjectTx;

/// The table of recorded keys in each object's own schema.
pub const IDEMPOTENCY_TABLE: &str = "idempotency_keys";

fn read(e: tokio_postgres::Error) -> StorageError {
    StorageError::backend("read a recorded idempotency key", e)
}

impl PostgresObjectTx<'_> {
    /// The result recorded for (`method`, `key`), as it was stored (the
    /// table is created when absent).
    ///
    /// # Errors
    /// A backend failure (the transaction is then aborted).
    pub fn idempotency_result(
        &self,
        method: &str,
        key: &str,
    ) -> Result<Option<String>, StorageError> {
        let sql = self.sql();
        sql.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {IDEMPOTENCY_TABLE} (
                method text NOT NULL,
                key text NOT NULL,
                result text NOT NULL,
                PRIMARY KEY (method, key)
            )"
        ))?;
        sql.query_opt(
            &format!("SELECT result FROM {IDEMPOTENCY_TABLE} WHERE method = $1 AND key = $2"),
            &[&method, &key],
        )?
        .map(|row| row.try_get(0).map_err(read))
        .transpose()
    }

    /// Records `result` for (`method`, `key`) (after
    /// [`PostgresObjectTx::idempotency_result`] found none).
    ///
    /// # Errors
    /// A backend failure (a key recorded already is a constraint failure).
    pub fn record_idempotency_result(
        &self,
        method: &str,
        key: &str,
        result: &str,
    ) -> Result<(), StorageError> {
        self.sql().execute(
            &format!("INSERT INTO {IDEMPOTENCY_TABLE} (method, key, result) VALUES ($1, $2, $3)"),
            &[&method, &key, &result],
        )?;
        Ok(())
    }

    /// Removes up to `limit` recorded keys, oldest first: by the age of
    /// the transaction that wrote each row (rows are only ever inserted;
    /// the rows an import wrote count as written by the import).
    ///
    /// # Errors
    /// A backend failure.
    pub fn prune_idempotency_results(&self, limit: u32) -> Result<usize, StorageError> {
        let sql = self.sql();
        let exists = sql
            .query_one(
                &format!("SELECT to_regclass('{IDEMPOTENCY_TABLE}') IS NOT NULL"),
                &[],
            )?
            .try_get::<_, bool>(0)
            .map_err(read)?;
        if !exists {
            return Ok(0);
        }
        let removed = sql.execute(
            &format!(
                "DELETE FROM {IDEMPOTENCY_TABLE} WHERE ctid IN \
                 (SELECT ctid FROM {IDEMPOTENCY_TABLE} ORDER BY age(xmin) DESC LIMIT $1)"
            ),
            &[&i64::from(limit)],
        )?;
        Ok(usize::try_from(removed).unwrap_or(usize::MAX))
    }
}
