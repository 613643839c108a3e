//! The staging statement run in a `tokio_postgres::Transaction`, and with
//! the feature `sqlx` in a `sqlx::Transaction<'_, Postgres>`: the same one
//! statement and parameters; what is staged is decided once, by the outbox
//! crate's rules.

use tokio_postgres::types::Type;

use super::error::PgOutboxError;

/// One staging statement's parameters: distinct keys, their encoded
/// values, and the attempt, due time and claim every staged row starts
/// with.
#[derive(Debug)]
pub struct Staging<'a> {
    pub(crate) channel: &'a str,
    pub(crate) keys: &'a [&'a str],
    pub(crate) values: &'a [Vec<u8>],
    pub(crate) attempt: i32,
    pub(crate) due_at: i64,
    pub(crate) claimed_until: Option<i64>,
    pub(crate) notify: &'a str,
}

/// A transaction of the caller's that [`PgOutbox::stage`](super::PgOutbox::stage)
/// and [`PgOutbox::stage_batch`](super::PgOutbox::stage_batch) stage in:
/// a `&tokio_postgres::Transaction<'_>`, or with the feature `sqlx` a
/// `&mut sqlx::Transaction<'_, Postgres>`. The same statement and
/// parameters either way. Sealed: implemented for those two only.
pub trait PgTransaction: sealed::Upsert {}

impl PgTransaction for &tokio_postgres::Transaction<'_> {}

#[cfg(feature = "sqlx")]
impl PgTransaction for &mut sqlx::Transaction<'_, sqlx::Postgres> {}

pub(crate) mod sealed {
    use super::{PgOutboxError, Staging};

    /// Runs the staging statement in a transaction.
    pub trait Upsert {
        /// Runs the staging statement: `one` for a single entry, else
        /// `many`; the rows `(key, version)` it returned.
        fn upsert(
            self,
            sql: (&str, &str),
            s: &Staging<'_>,
        ) -> impl Future<Output = Result<Vec<(String, i64)>, PgOutboxError>> + Send;
    }
}

/// One typed parameter of the staging statement.
type Param<'a> = (&'a (dyn tokio_postgres::types::ToSql + Sync), Type);

impl sealed::Upsert for &tokio_postgres::Transaction<'_> {
    async fn upsert(
        self,
        (one, many): (&str, &str),
        s: &Staging<'_>,
    ) -> Result<Vec<(String, i64)>, PgOutboxError> {
        // Typed parameters: one round trip, no separate prepare. The two
        // statements differ only in the keys and values (one, or arrays).
        let (sql, keys, values): (_, Param<'_>, Param<'_>) = match (s.keys, s.values) {
            ([key], [value]) => (one, (key, Type::TEXT), (value, Type::BYTEA)),
            _ => (
                many,
                (&s.keys, Type::TEXT_ARRAY),
                (&s.values, Type::BYTEA_ARRAY),
            ),
        };
        let rows = self
            .query_typed(
                sql,
                &[
                    (&s.channel, Type::TEXT),
                    keys,
                    values,
                    (&s.attempt, Type::INT4),
                    (&s.due_at, Type::INT8),
                    (&s.claimed_until, Type::INT8),
                    (&s.notify, Type::TEXT),
                ],
            )
            .await
            .map_err(PgOutboxError::statement)?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(PgOutboxError::statement)
    }
}

/// The same in a sqlx transaction (a runtime query).
#[cfg(feature = "sqlx")]
impl sealed::Upsert for &mut sqlx::Transaction<'_, sqlx::Postgres> {
    async fn upsert(
        self,
        (one, many): (&str, &str),
        s: &Staging<'_>,
    ) -> Result<Vec<(String, i64)>, PgOutboxError> {
        use sqlx::Row as _;
        let query = match (s.keys, s.values) {
            ([key], [value]) => sqlx::query(sqlx::AssertSqlSafe(one.to_owned()))
                .bind(s.channel)
                .bind(*key)
                .bind(value),
            _ => sqlx::query(sqlx::AssertSqlSafe(many.to_owned()))
                .bind(s.channel)
                .bind(s.keys)
                .bind(s.values),
        };
        let rows = query
            .bind(s.attempt)
            .bind(s.due_at)
            .bind(s.claimed_until)
            .bind(s.notify)
            .fetch_all(&mut **self)
            .await
            .map_err(PgOutboxError::sqlx)?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(PgOutboxError::sqlx)
    }
}

/// Entries to stage on one channel, checked and encoded before anything
/// is sent: the given keys in order, and the distinct ones with the last
/// value given for each (only the newest value of a key is pending).
#[derive(Debug)]
pub(crate) struct Batch<'a> {
    channel: &'a str,
    given: Vec<&'a str>,
    keys: Vec<&'a str>,
    values: Vec<Vec<u8>>,
}

impl<'a> Batch<'a> {
    pub(crate) fn encode<T: 'static, V: std::borrow::Borrow<T>>(
        codec: &dyn durability_outbox::Codec<T>,
        channel: &'a str,
        entries: &'a [(&'a str, V)],
    ) -> Result<Self, PgOutboxError> {
        use durability_outbox::rules;
        rules::check_channel(channel)?;
        let mut at = std::collections::HashMap::with_capacity(entries.len());
        let mut batch = Self {
            channel,
            given: Vec::with_capacity(entries.len()),
            keys: Vec::with_capacity(entries.len()),
            values: Vec::with_capacity(entries.len()),
        };
        for (key, value) in entries {
            rules::check_key(key)?;
            let bytes = rules::encode(codec, value.borrow())?;
            batch.given.push(*key);
            match at.get(key) {
                Some(&i) => batch.values[i] = bytes,
                None => {
                    at.insert(*key, batch.keys.len());
                    batch.keys.push(*key);
                    batch.values.push(bytes);
                }
            }
        }
        Ok(batch)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The statement's parameters for rows staged at `now` ([`rules::staged`](durability_outbox::rules::staged)).
    pub(crate) fn staging(&'a self, now: i64, notify: &'a str) -> Staging<'a> {
        let row = durability_outbox::rules::staged(self.channel, "", Vec::new(), 0, now);
        Staging {
            channel: self.channel,
            keys: &self.keys,
            values: &self.values,
            attempt: i32::try_from(row.attempt).unwrap_or(i32::MAX),
            due_at: row.due_at,
            claimed_until: row.claimed_until,
            notify,
        }
    }

    /// The version of each given entry's key, from the statement's rows.
    pub(crate) fn versions(&self, rows: Vec<(String, i64)>) -> Result<Vec<u64>, PgOutboxError> {
        let mut versions = std::collections::HashMap::with_capacity(rows.len());
        for (key, version) in rows {
            let version = u64::try_from(version).map_err(|_| {
                PgOutboxError::Corrupt(format!("the sequence issued version {version}"))
            })?;
            versions.insert(key, durability_outbox::rules::version_issued(version)?);
        }
        self.given
            .iter()
            .map(|key| {
                versions.get(*key).copied().ok_or_else(|| {
                    PgOutboxError::Corrupt(format!("no version returned for key {key:?}"))
                })
            })
            .collect()
    }
}
