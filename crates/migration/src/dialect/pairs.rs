//! The SQL of the crate's key → shard pair tables, per [`Dialect`]: the
//! mapping store's `durability_mapping` and the allocation ledger's
//! `durability_allocations` (see `crate::pairs` for their key order on each
//! dialect). The statements are exactly those the hand-written stores
//! issued before they were written once over [`crate::Shard`], so existing
//! tables keep working unchanged.

use super::Dialect;
use crate::error::BackendError;
use crate::shard::Statement;
use crate::value::Value;

/// One key → shard table on one dialect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PairTable<'d> {
    dialect: &'d Dialect,
    table: &'static str,
}

/// The mapping store's table.
pub(crate) const MAPPING: &str = "durability_mapping";
/// The allocation ledger's table.
pub(crate) const ALLOCATIONS: &str = "durability_allocations";

impl<'d> PairTable<'d> {
    /// The pair table `table` on `dialect`.
    pub(crate) fn new(dialect: &'d Dialect, table: &'static str) -> Self {
        Self { dialect, table }
    }

    /// Refuses a dialect whose pair-table SQL is not written here.
    pub(crate) fn check(dialect: &Dialect) -> Result<(), BackendError> {
        if dialect.is_proven() {
            Ok(())
        } else {
            Err(format!("no key → shard table for the {} dialect", dialect.name()).into())
        }
    }

    /// A key or shard name as bound: bytes on MariaDB/MySQL, text elsewhere.
    fn bind(&self, s: &str) -> Value {
        match self.dialect {
            Dialect::MySql => Value::Blob(s.as_bytes().to_vec()),
            _ => Value::Text(s.to_owned()),
        }
    }

    fn p(&self, n: usize) -> String {
        self.dialect.placeholder(n)
    }

    /// `CREATE TABLE IF NOT EXISTS` of the table.
    pub(crate) fn schema(&self) -> Statement {
        let t = self.table;
        Statement::new(match self.dialect {
            Dialect::Postgres => format!(
                "CREATE TABLE IF NOT EXISTS {t} (mkey TEXT COLLATE \"C\" PRIMARY KEY, shard TEXT NOT NULL)"
            ),
            Dialect::MySql => format!(
                "CREATE TABLE IF NOT EXISTS {t} (mkey VARBINARY(512) PRIMARY KEY, shard VARBINARY(255) NOT NULL)"
            ),
            _ => format!(
                "CREATE TABLE IF NOT EXISTS {t} (mkey TEXT PRIMARY KEY, shard TEXT NOT NULL) WITHOUT ROWID"
            ),
        })
    }

    /// The shard of `key` (column `shard`).
    pub(crate) fn get(&self, key: &str) -> Statement {
        Statement::with_params(
            format!(
                "SELECT shard FROM {} WHERE mkey = {}",
                self.table,
                self.p(1)
            ),
            vec![self.bind(key)],
        )
    }

    /// Inserts or replaces the row of `key`.
    pub(crate) fn upsert(&self, key: &str, shard: &str) -> Statement {
        let (t, p1, p2) = (self.table, self.p(1), self.p(2));
        let sql = match self.dialect {
            Dialect::MySql => format!(
                "INSERT INTO {t} (mkey, shard) VALUES ({p1}, {p2}) \
                 ON DUPLICATE KEY UPDATE shard = VALUES(shard)"
            ),
            _ => format!(
                "INSERT INTO {t} (mkey, shard) VALUES ({p1}, {p2}) \
                 ON CONFLICT (mkey) DO UPDATE SET shard = excluded.shard"
            ),
        };
        Statement::with_params(sql, vec![self.bind(key), self.bind(shard)])
    }

    /// Inserts the row of `key` unless one exists (an existing row wins).
    pub(crate) fn insert_absent(&self, key: &str, shard: &str) -> Statement {
        let (t, p1, p2) = (self.table, self.p(1), self.p(2));
        let sql = match self.dialect {
            Dialect::Postgres => format!(
                "INSERT INTO {t} (mkey, shard) VALUES ({p1}, {p2}) ON CONFLICT (mkey) DO NOTHING"
            ),
            Dialect::MySql => format!("INSERT IGNORE INTO {t} (mkey, shard) VALUES ({p1}, {p2})"),
            _ => format!("INSERT OR IGNORE INTO {t} (mkey, shard) VALUES ({p1}, {p2})"),
        };
        Statement::with_params(sql, vec![self.bind(key), self.bind(shard)])
    }

    /// Deletes the row of `key`.
    pub(crate) fn delete(&self, key: &str) -> Statement {
        Statement::with_params(
            format!("DELETE FROM {} WHERE mkey = {}", self.table, self.p(1)),
            vec![self.bind(key)],
        )
    }

    /// Deletes the row of `key` only while it names `shard`.
    pub(crate) fn delete_if(&self, key: &str, shard: &str) -> Statement {
        Statement::with_params(
            format!(
                "DELETE FROM {} WHERE mkey = {} AND shard = {}",
                self.table,
                self.p(1),
                self.p(2)
            ),
            vec![self.bind(key), self.bind(shard)],
        )
    }

    /// Up to `limit` rows with keys strictly after `after`, in key order.
    pub(crate) fn page_after(&self, after: &str, limit: usize) -> Statement {
        Statement::with_params(
            format!(
                "SELECT mkey, shard FROM {} WHERE mkey > {} ORDER BY mkey LIMIT {}",
                self.table,
                self.p(1),
                self.p(2)
            ),
            vec![self.bind(after), Value::Integer(limit_of(limit))],
        )
    }

    /// The first `limit` rows, in key order.
    pub(crate) fn page_first(&self, limit: usize) -> Statement {
        Statement::with_params(
            format!(
                "SELECT mkey, shard FROM {} ORDER BY mkey LIMIT {}",
                self.table,
                self.p(1)
            ),
            vec![Value::Integer(limit_of(limit))],
        )
    }
}

fn limit_of(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
