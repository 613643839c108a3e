//! What a runtime needs besides transactions: listing a deployment's
//! objects by id prefix, deleting one object (its rows in every shared
//! table and its own schema), a storage id's tombstone, and, inside a
//! transaction, the capabilities with a due time and one page of the
//! object's own tables dropped.

use std::collections::BTreeSet;

use durability_scheduler::{StorageError, StorageErrorKind};

use super::PostgresObjects;
use super::driver::Held;
use super::runtime::{blocking, wait};
use super::tx::PostgresObjectTx;

/// A storage id's tombstone, as [`PostgresObjects::tombstone`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTombstone {
    /// The lifecycle the storage id belonged to.
    pub lifecycle: String,
    /// `deleting` or `deleted`.
    pub state: String,
}

/// The longest id prefix [`PostgresObjects::list_objects`] takes.
const MAX_PREFIX_BYTES: usize = 1024;

fn bad_input(what: String) -> StorageError {
    StorageError::new(StorageErrorKind::Backend, what)
}

impl PostgresObjects {
    /// At most `limit` recorded object ids that start with `prefix`, after
    /// `after` (exclusive), in byte order, and whether more may follow.
    ///
    /// # Errors
    /// A prefix over 1024 bytes (nothing is read), or a backend failure.
    pub fn list_objects(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<String>, bool), StorageError> {
        if prefix.len() > MAX_PREFIX_BYTES {
            return Err(bad_input(format!(
                "an object id prefix of {} bytes (at most {MAX_PREFIX_BYTES})",
                prefix.len()
            )));
        }
        let s = &self.shared.s;
        let fetch = i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1;
        let after = after.unwrap_or("");
        let rows = blocking(|| {
            let client = self.shared.backend.client()?;
            wait(client.query(
                &format!(
                    "SELECT id FROM {s}.durability_objects
                     WHERE left(id, length($1)) = $1 AND id > $2
                     ORDER BY id LIMIT $3"
                ),
                &[&prefix, &after, &fetch],
            ))
            .map_err(|e| StorageError::backend("list objects", e))
        })?;
        let mut ids = rows
            .iter()
            .map(|r| r.try_get::<_, String>(0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StorageError::backend("read an object id", e))?;
        let more = ids.len() > limit;
        ids.truncate(limit);
        Ok((ids, more))
    }

    /// Deletes one object: its rows in every shared table of the
    /// deployment keyed by object id (fences included), its own schema
    /// with everything in it, and its record, in one transaction that
    /// first takes the object row lock (waiting at most the
    /// `lock_timeout` for a writer of the object). `false` when the
    /// object was not recorded. A storage opened on it before fails every
    /// later transaction (the object is no longer recorded) until it is
    /// opened again, which records it anew, empty.
    ///
    /// # Errors
    /// A backend failure (nothing is deleted), or `Unknown` when the
    /// commit's outcome is unknown (run it again).
    pub fn delete_object(&self, object_id: &str) -> Result<bool, StorageError> {
        blocking(|| {
            let held = Held(Some(self.shared.backend.client()?));
            let client = held.client();
            // On an error `held` is dropped: the connection closes and the
            // server rolls the transaction back.
            let found = self.delete_in(client, object_id)?;
            super::commit::commit(client, self.shared.options.commit_timeout)?;
            held.release();
            Ok(found)
        })
    }

    /// Everything of [`Self::delete_object`] before `COMMIT`.
    fn delete_in(
        &self,
        client: &deadpool_postgres::Object,
        object_id: &str,
    ) -> Result<bool, StorageError> {
        let ms = self.shared.options.lock_timeout.as_millis().max(1);
        let fail = |what: &'static str| move |e| StorageError::backend(what, e);
        wait(client.batch_execute(&format!("BEGIN; SET LOCAL lock_timeout = {ms}")))
            .map_err(fail("begin the deletion"))?;
        self.delete_locked(client, object_id)
    }

    /// Inside the caller's transaction: takes the object row lock and
    /// deletes the object (its shared rows, its own schema, its record);
    /// `false` when it was not recorded.
    pub(super) fn delete_locked(
        &self,
        client: &deadpool_postgres::Object,
        object_id: &str,
    ) -> Result<bool, StorageError> {
        let s = &self.shared.s;
        let fail = |what: &'static str| move |e| StorageError::backend(what, e);
        let row = wait(client.query_opt(
            &format!("SELECT seq FROM {s}.durability_objects WHERE id = $1 FOR UPDATE"),
            &[&object_id],
        ))
        .map_err(fail("lock the object row"))?;
        let Some(row) = row else {
            return Ok(false);
        };
        let seq: i64 = row.try_get(0).map_err(fail("read the object number"))?;
        for table in self.object_tables(client)? {
            wait(client.execute(
                &format!(
                    "DELETE FROM {s}.{} WHERE object_id = $1",
                    super::schema::quote(&table)
                ),
                &[&object_id],
            ))
            .map_err(fail("delete the object's rows"))?;
        }
        let own = self.shared.deployment.object_schema(seq);
        wait(client.batch_execute(&format!("DROP SCHEMA IF EXISTS {own} CASCADE")))
            .map_err(fail("drop the object's schema"))?;
        wait(client.execute(
            &format!("DELETE FROM {s}.durability_objects WHERE id = $1"),
            &[&object_id],
        ))
        .map_err(fail("delete the object record"))?;
        Ok(true)
    }

    /// The deployment's shared tables keyed by object id: every
    /// `durability_object_*` table of the deployment schema with an
    /// `object_id` column (so a table a later version adds is covered
    /// without a list to keep; a lease store or alarm index sharing the
    /// schema has other names and is never touched).
    fn object_tables(
        &self,
        client: &deadpool_postgres::Object,
    ) -> Result<Vec<String>, StorageError> {
        let rows = wait(client.query(
            "SELECT DISTINCT table_name::text FROM information_schema.columns
             WHERE table_schema = $1 AND column_name = 'object_id'
               AND left(table_name::text, 18) = 'durability_object_'",
            &[&self.shared.deployment.name()],
        ))
        .map_err(|e| StorageError::backend("list the shared tables", e))?;
        rows.iter()
            .map(|r| r.try_get::<_, String>(0))
            .collect::<Result<BTreeSet<_>, _>>()
            .map(|t| t.into_iter().collect())
            .map_err(|e| StorageError::backend("list the shared tables", e))
    }

    /// The tombstone of `storage_id`, when one was written.
    ///
    /// # Errors
    /// A backend failure.
    pub fn tombstone(&self, storage_id: &str) -> Result<Option<PgTombstone>, StorageError> {
        let s = &self.shared.s;
        let row = blocking(|| {
            let client = self.shared.backend.client()?;
            wait(client.query_opt(
                &format!(
                    "SELECT lifecycle, state FROM {s}.durability_tombstones WHERE storage_id = $1"
                ),
                &[&storage_id],
            ))
            .map_err(|e| StorageError::backend("read the tombstone", e))
        })?;
        row.map(|r| {
            Ok(PgTombstone {
                lifecycle: r.try_get(0)?,
                state: r.try_get(1)?,
            })
        })
        .transpose()
        .map_err(|e: tokio_postgres::Error| StorageError::backend("read the tombstone", e))
    }

    /// Writes (or overwrites) the tombstone of `storage_id`: committed
    /// (durable as PostgreSQL makes a commit) when this returns.
    ///
    /// # Errors
    /// A `state` other than `deleting` or `deleted` (nothing is written),
    /// a backend failure, or `Unknown` when the commit's outcome is
    /// unknown.
    pub fn write_tombstone(
        &self,
        storage_id: &str,
        lifecycle: &str,
        state: &str,
    ) -> Result<(), StorageError> {
        if !matches!(state, "deleting" | "deleted") {
            return Err(bad_input(format!(
                "a tombstone state {state:?} (deleting or deleted)"
            )));
        }
        let s = &self.shared.s;
        let fail = |what: &'static str| move |e| StorageError::backend(what, e);
        blocking(|| {
            // Under the storage id's tombstone lock, exclusive: a first
            // object record (shared) commits before it or sees the
            // tombstone (`PostgresObjects::open_unless_tombstoned`). On an
            // error `held` is dropped: the connection closes and the server
            // rolls the transaction back.
            let held = Held(Some(self.shared.backend.client()?));
            let client = held.client();
            wait(client.batch_execute("BEGIN")).map_err(fail("begin the tombstone"))?;
            wait(client.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                &[&super::tombstone_lock_key(storage_id)],
            ))
            .map_err(fail("take the tombstone lock"))?;
            wait(client.execute(
                &format!(
                    "INSERT INTO {s}.durability_tombstones (storage_id, lifecycle, state)
                     VALUES ($1, $2, $3)
                     ON CONFLICT (storage_id) DO UPDATE
                       SET lifecycle = EXCLUDED.lifecycle, state = EXCLUDED.state,
                           written_at = now()"
                ),
                &[&storage_id, &lifecycle, &state],
            ))
            .map_err(fail("write the tombstone"))?;
            super::commit::commit(client, self.shared.options.commit_timeout)?;
            held.release();
            Ok::<_, StorageError>(())
        })?;
        Ok(())
    }
}

impl PostgresObjectTx<'_> {
    /// The capabilities with a stored due time, by name.
    ///
    /// # Errors
    /// A backend failure (the transaction is aborted).
    pub fn due_capabilities(&self) -> Result<Vec<String>, StorageError> {
        self.rows(
            "list capability due times",
            "SELECT capability FROM {s}.durability_object_due WHERE object_id = $1 \
             ORDER BY capability",
            &[],
        )?
        .iter()
        .map(|r| r.try_get::<_, String>(0))
        .collect::<Result<_, _>>()
        .map_err(|e| StorageError::backend("read a capability name", e))
    }

    /// Drops at most `limit` of the object's own relations (tables,
    /// views, materialized views, foreign tables and sequences no table
    /// owns; `CASCADE`, so indexes, triggers and dependent views go with
    /// their table), views first: the names dropped and whether more may
    /// be left. The capabilities' rows live in the shared tables and are
    /// never touched. Functions and types the object created in its schema
    /// stay.
    ///
    /// # Errors
    /// A backend failure (the transaction is aborted).
    pub fn drop_own_schema_objects(
        &self,
        limit: usize,
    ) -> Result<(Vec<String>, bool), StorageError> {
        let schema = unquote(self.own_schema);
        let fetch = i64::try_from(limit).unwrap_or(i64::MAX);
        let listed = self.wait(
            "list the object's relations",
            self.client.query(
                "SELECT c.relname::text, c.relkind::text FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
               AND NOT (c.relkind = 'S' AND EXISTS (
                   SELECT 1 FROM pg_depend d
                   WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                     AND d.deptype IN ('a', 'i')))
             ORDER BY CASE c.relkind WHEN 'v' THEN 0 WHEN 'm' THEN 1 ELSE 2 END, c.relname
             LIMIT $2",
                &[&schema, &fetch],
            ),
        )?;
        let more = listed.len() >= limit;
        let mut dropped = Vec::with_capacity(listed.len());
        for row in listed {
            let name: String = row
                .try_get(0)
                .map_err(|e| self.fail("read a relation name", e))?;
            let kind: String = row
                .try_get(1)
                .map_err(|e| self.fail("read a relation kind", e))?;
            let kind = match kind.as_str() {
                "v" => "VIEW",
                "m" => "MATERIALIZED VIEW",
                "f" => "FOREIGN TABLE",
                "S" => "SEQUENCE",
                _ => "TABLE",
            };
            let sql = format!(
                "DROP {kind} IF EXISTS {}.{} CASCADE",
                self.own_schema,
                super::schema::quote(&name)
            );
            self.wait("drop an own relation", self.client.batch_execute(&sql))?;
            dropped.push(name);
        }
        Ok((dropped, more))
    }
}

/// A quoted schema name of this crate's making (no inner quotes) without
/// its quotes.
pub(super) fn unquote(quoted: &str) -> String {
    quoted.trim_matches('"').replace("\"\"", "\"")
}

#[cfg(test)]
mod tests {
    use super::unquote;

    #[test]
    fn unquote_reverses_quote() {
        for name in ["d_o1", "x\"y"] {
            assert_eq!(unquote(&super::super::schema::quote(name)), name);
        }
    }
}
