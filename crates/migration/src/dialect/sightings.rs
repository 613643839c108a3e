//! Sightings persisted in the journal: when a router first saw a row
//! another clock domain wrote (the recovery lease, an operation) as it is
//! now, read on the journal database's own clock, so a router built fresh
//! on every call (a cron job, the one-shot CLI) can still tell that the
//! row stood still for its period without comparing two clocks.
//!
//! The journal database's clock: PostgreSQL `clock_timestamp()`, MariaDB
//! and MySQL `NOW(6)`, SQLite the clock of the machine that holds the file
//! (`julianday('now')`; every process that opens a SQLite file runs on
//! that machine, since the file cannot live on a network file system).

use super::{Dialect, JournalSql, Sql, names};
use crate::journal::Guard;
use crate::shard::Statement;
use crate::value::Value;

/// What a sighting watches.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Watched<'a> {
    /// The scope's recovery lease.
    Lease,
    /// The active operation with this id.
    Op(&'a str),
}

/// The `kind` of an operation's sightings.
const OP: &str = "op";

impl<'a> Watched<'a> {
    /// Its `(kind, id)` in the table.
    fn parts(self) -> (&'static str, &'a str) {
        match self {
            Self::Lease => ("lease", ""),
            Self::Op(id) => (OP, id),
        }
    }
}

impl Dialect {
    /// The database's own clock now, in Unix milliseconds, as an SQL
    /// expression.
    pub(crate) fn db_now_ms(&self) -> &'static str {
        match self {
            Self::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
            Self::MySql => "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000 AS SIGNED)",
            _ => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        }
    }

    /// The sightings table (part of the journal schema).
    pub(crate) fn sightings_schema(&self) -> Statement {
        Statement::new(format!(
            "CREATE TABLE IF NOT EXISTS {s} (scope {k} NOT NULL, kind {k} NOT NULL, \
             id {k} NOT NULL, token {t} NOT NULL, since_ms {i} NOT NULL, \
             PRIMARY KEY (scope, kind, id)){w}",
            s = names::SIGHTINGS,
            k = self.text_key_type(),
            t = self.text_type(),
            i = self.int_type(),
            w = self.keyed_table_suffix()
        ))
    }
}

impl JournalSql<'_> {
    fn push_watched(&self, s: &mut Sql<'_>, w: Watched<'_>) {
        s.raw(" WHERE ").eqs(&self.watched(w));
    }

    /// The row of `w`: its primary key `(scope, kind, id)`.
    fn watched(&self, w: Watched<'_>) -> [(&'static str, Value); 3] {
        let (kind, id) = w.parts();
        [
            ("scope", self.scope.into()),
            ("kind", kind.into()),
            ("id", id.into()),
        ]
    }

    /// Records that `w` is seen as `token` now: a first sight, or a row
    /// seen otherwise before, starts its period at the database's clock; a
    /// row seen so before keeps its start. One batch; with `guard` (a
    /// recovery's lease) it writes nothing once the lease is lost.
    pub(crate) fn sighting_note(
        &self,
        w: Watched<'_>,
        token: &str,
        guard: Option<&Guard>,
        now: i64,
    ) -> Vec<Statement> {
        let mut u = Sql::new(&self.d);
        u.raw("UPDATE ")
            .raw(names::SIGHTINGS)
            .raw(" SET token = ")
            .bind(token)
            .raw(", since_ms = ")
            .raw(self.d.db_now_ms());
        self.push_watched(&mut u, w);
        u.raw(" AND token <> ").bind(token);
        if let Some(g) = guard {
            self.push_lease_guard(&mut u, g, now);
        }
        let key = self.watched(w);
        let mut i = Sql::new(&self.d);
        i.raw("INSERT INTO ")
            .raw(names::SIGHTINGS)
            .raw(" (scope, kind, id, token, since_ms) SELECT ")
            .join(&key, ", ", |s, (_, v)| {
                s.bind(v.clone());
            })
            .raw(", ")
            .bind(token)
            .raw(", ")
            .raw(self.d.db_now_ms())
            .dual()
            .exists_open(" WHERE NOT EXISTS ", names::SIGHTINGS, &key)
            .raw(")");
        if let Some(g) = guard {
            self.push_lease_guard(&mut i, g, now);
        }
        vec![u.finish(), i.finish()]
    }

    /// How long (`age_ms`, on the database's clock) `w` has been seen as
    /// `token`; no row when it was last seen otherwise.
    pub(crate) fn sighting_age(&self, w: Watched<'_>, token: &str) -> Statement {
        let mut s = Sql::new(&self.d);
        s.raw("SELECT ")
            .raw(self.d.db_now_ms())
            .raw(" - since_ms AS age_ms FROM ")
            .raw(names::SIGHTINGS);
        self.push_watched(&mut s, w);
        s.raw(" AND token = ").bind(token);
        s.finish()
    }

    /// Forgets the sightings of operations that are no longer active (a
    /// recovery's last step, under its lease).
    pub(crate) fn sightings_prune(&self, guard: &Guard, now: i64) -> Statement {
        let mut s = self.scoped("DELETE FROM ", names::SIGHTINGS);
        s.raw(" AND kind = ")
            .bind(OP)
            .raw(" AND id NOT IN (SELECT op_id FROM ")
            .raw(names::OPS)
            .raw(" WHERE scope = ")
            .bind(self.scope)
            .raw(" AND claim IS NOT NULL)");
        self.push_lease_guard(&mut s, guard, now);
        s.finish()
    }
}
