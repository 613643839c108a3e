//! The coordinator's allocation ledger on PostgreSQL, for
//! `durability-migration`'s `Router::reconcile_allocations`.
//!
//! [`PostgresLedger`] keeps key → allocated shard rows in a
//! `durability_allocations` table (created when missing) in the database and
//! search path of a [`PostgresShard`]'s connections. Keys use `COLLATE "C"`,
//! so pages come back in byte order, as from the other ledgers. Every value
//! is a bound parameter.

use durability_migration::{AllocationLedger, BackendError, BoxFuture, Shard, Statement, Value};

use crate::PostgresShard;

const LEDGER_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS durability_allocations \
    (mkey TEXT COLLATE \"C\" PRIMARY KEY, shard TEXT NOT NULL)";

/// Key → allocated shard rows in a PostgreSQL table
/// (`durability_allocations`, keys in byte order).
#[derive(Clone, Debug)]
pub struct PostgresLedger {
    shard: PostgresShard,
}

impl PostgresLedger {
    /// A ledger in the database (and search path) of `shard`'s connections;
    /// creates its table when missing.
    ///
    /// # Errors
    /// The server's error.
    pub async fn new(shard: PostgresShard) -> Result<Self, BackendError> {
        shard.batch_execute(LEDGER_SCHEMA).await?;
        Ok(Self { shard })
    }
}

impl AllocationLedger for PostgresLedger {
    fn record<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let st = Statement::with_params(
                "INSERT INTO durability_allocations (mkey, shard) VALUES ($1, $2) \
                 ON CONFLICT (mkey) DO UPDATE SET shard = excluded.shard",
                vec![key.into(), shard.into()],
            );
            self.shard.execute(&st).await?;
            Ok(())
        })
    }

    fn scan<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
        Box::pin(async move {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let st = match after {
                Some(a) => Statement::with_params(
                    "SELECT mkey, shard FROM durability_allocations WHERE mkey > $1 \
                     ORDER BY mkey LIMIT $2",
                    vec![a.into(), limit.into()],
                ),
                None => Statement::with_params(
                    "SELECT mkey, shard FROM durability_allocations ORDER BY mkey LIMIT $1",
                    vec![limit.into()],
                ),
            };
            let mut out = Vec::new();
            for mut r in self.shard.query(&st).await? {
                match (r.remove("mkey"), r.remove("shard")) {
                    (Some(Value::Text(k)), Some(Value::Text(s))) => out.push((k, s)),
                    other => return Err(format!("malformed allocation row {other:?}").into()),
                }
            }
            Ok(out)
        })
    }

    fn remove_if<'a>(
        &'a self,
        key: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let st = Statement::with_params(
                "DELETE FROM durability_allocations WHERE mkey = $1 AND shard = $2",
                vec![key.into(), shard.into()],
            );
            Ok(self.shard.execute(&st).await? > 0)
        })
    }
}
