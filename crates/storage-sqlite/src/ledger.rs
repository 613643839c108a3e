//! The coordinator's allocation ledger on SQLite, for
//! `durability-migration`'s `Router::reconcile_allocations`.
//!
//! [`SqliteLedger`] keeps key → allocated shard rows in a
//! `durability_allocations` table (created when missing). Keys compare
//! byte-wise (SQLite's default `BINARY` collation), so pages come back in the
//! same order as from the other ledgers. Every value is a bound parameter.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use durability_migration::{AllocationLedger, BackendError, BoxFuture};
use rusqlite::{Connection, params};

const LEDGER_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS durability_allocations \
    (mkey TEXT PRIMARY KEY, shard TEXT NOT NULL) WITHOUT ROWID";

/// Key → allocated shard rows in a SQLite table (`durability_allocations`).
#[derive(Debug)]
pub struct SqliteLedger {
    conn: Mutex<Connection>,
}

impl SqliteLedger {
    /// Opens (or creates) a ledger file in WAL mode with
    /// `synchronous=NORMAL`, and creates its table when missing.
    ///
    /// # Errors
    /// The SQLite error when the file cannot be opened or configured.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, rusqlite::Error> {
        let conn = crate::migration::open_conn(path.as_ref())?;
        conn.execute_batch(LEDGER_SCHEMA)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    /// An in-memory ledger.
    ///
    /// # Errors
    /// The SQLite error.
    pub fn open_in_memory() -> Result<Self, rusqlite::Error> {
        let conn = Connection::open_in_memory()?;
        conn.execute_batch(LEDGER_SCHEMA)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Connection>, BackendError> {
        self.conn
            .lock()
            .map_err(|_| "sqlite ledger mutex poisoned".into())
    }
}

fn pairs(
    st: &mut rusqlite::CachedStatement<'_>,
    params: impl rusqlite::Params,
) -> Result<Vec<(String, String)>, BackendError> {
    let rows = st.query_map(params, |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

impl AllocationLedger for SqliteLedger {
    fn record<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let g = self.lock()?;
            g.prepare_cached(
                "INSERT INTO durability_allocations (mkey, shard) VALUES (?1, ?2) \
                 ON CONFLICT (mkey) DO UPDATE SET shard = excluded.shard",
            )?
            .execute(params![key, shard])?;
            Ok(())
        })
    }

    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
        Box::pin(async move {
            let g = self.lock()?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            match after {
                Some(a) => pairs(
                    &mut g.prepare_cached(
                        "SELECT mkey, shard FROM durability_allocations WHERE mkey > ?1 \
                         ORDER BY mkey LIMIT ?2",
                    )?,
                    params![a, limit],
                ),
                None => pairs(
                    &mut g.prepare_cached(
                        "SELECT mkey, shard FROM durability_allocations ORDER BY mkey LIMIT ?1",
                    )?,
                    params![limit],
                ),
            }
        })
    }

    fn remove_if<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let g = self.lock()?;
            let n = g
                .prepare_cached(
                    "DELETE FROM durability_allocations WHERE mkey = ?1 AND shard = ?2",
                )?
                .execute(params![key, shard])?;
            Ok(n > 0)
        })
    }
}
