//! The statements of the crate's rows on every data shard: the tombstone
//! table (`durability_retired`: cutover tombstones, archives and the
//! in-flight markers of a move's copy) and the write holds.

use super::{Dialect, Ident, Sql, names};
use crate::shard::Statement;
use crate::value::Value;

/// A write hold as its mover takes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hold<'a> {
    /// The deadline, on the mover's clock.
    pub(crate) until_ms: i64,
    /// The mover (the operation's owner), whose clock `until_ms` reads.
    pub(crate) owner: &'a str,
    /// The window the hold lasts.
    pub(crate) hold_ms: i64,
}

impl Dialect {
    /// `CREATE TABLE IF NOT EXISTS` statements of the tombstone table every
    /// data shard holds. It is keyed by (key, operation, table): every
    /// lookup names the key, so no secondary index is written by a cutover.
    pub fn retired_schema(&self) -> Vec<Statement> {
        let mk = self.mkey_type();
        let (k, t, i, b) = (
            self.text_key_type(),
            self.text_type(),
            self.int_type(),
            self.blob_type(),
        );
        vec![
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {r} (op_id {k} NOT NULL, tname {k} NOT NULL, \
                 mkey {mk} NOT NULL, scope {k} NOT NULL, moved_to {t} NOT NULL, payload {b}, \
                 digest {t} NOT NULL, retired_ms {i} NOT NULL, superseded {i} NOT NULL DEFAULT 0, \
                 purged {i} NOT NULL DEFAULT 0, PRIMARY KEY (mkey, op_id, tname)){w}",
                r = names::RETIRED,
                w = self.keyed_table_suffix()
            )),
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {h} (mkey {mk} NOT NULL, op_id {k} NOT NULL, \
                 scope {k} NOT NULL, until_ms {i} NOT NULL, owner {t}, hold_ms {i}, \
                 PRIMARY KEY (mkey, op_id)){w}",
                h = names::HOLD,
                w = self.keyed_table_suffix()
            )),
        ]
    }

    /// The columns a write-hold table created before holds named their
    /// mover lacks, with the statements adding them (run when the column
    /// query misses one; its rows then have neither, which reads as a mover
    /// on another clock holding for [`crate::MAX_CUTOVER_HOLD_MS`]).
    pub(crate) fn hold_upgrade(&self) -> [(&'static str, Statement); 2] {
        let add = |col: &str, ty: &str| {
            Statement::new(format!(
                "ALTER TABLE {h} ADD COLUMN {col} {ty}",
                h = names::HOLD
            ))
        };
        [
            ("owner", add("owner", self.text_type())),
            ("hold_ms", add("hold_ms", self.int_type())),
        ]
    }

    /// A move's write hold of `key` on its source for `hold_ms`, until
    /// `until_ms` on the clock of `owner` (the operation's mover): replaces
    /// an earlier hold of the same operation.
    pub(crate) fn hold_take(
        &self,
        op_id: &str,
        scope: &str,
        key: &str,
        hold: Hold<'_>,
    ) -> Vec<Statement> {
        vec![
            self.hold_release(op_id, key),
            self.insert_absent(
                names::HOLD,
                &[
                    ("mkey", key.into()),
                    ("op_id", op_id.into()),
                    ("scope", scope.into()),
                    ("until_ms", hold.until_ms.into()),
                    ("owner", hold.owner.into()),
                    ("hold_ms", hold.hold_ms.into()),
                ],
                2,
            ),
        ]
    }

    /// Deletes the operation's write hold of `key`.
    pub(crate) fn hold_release(&self, op_id: &str, key: &str) -> Statement {
        self.matching("DELETE FROM ", names::HOLD, &key_op(key, op_id))
            .finish()
    }

    /// Deletes the operation's write hold of `key` when the operation's
    /// archive row exists (the cutover batch archived the key).
    pub(crate) fn hold_release_archived(&self, op_id: &str, key: &str) -> Statement {
        let eqs = key_op(key, op_id);
        let mut s = self.matching("DELETE FROM ", names::HOLD, &eqs);
        s.exists_open(" AND EXISTS ", names::RETIRED, &eqs)
            .raw(" AND digest <> ")
            .bind(names::IN_FLIGHT)
            .raw(")");
        s.finish()
    }

    /// The key's write holds by movers of journal scope `scope`
    /// (operation, deadline, mover and window).
    pub(crate) fn hold_query(&self, key: &str, scope: &str) -> Statement {
        self.matching(
            "SELECT op_id, until_ms, owner, hold_ms FROM ",
            names::HOLD,
            &[("mkey", key.into()), ("scope", scope.into())],
        )
        .finish()
    }

    /// Deletes an expired hold: the operation's hold of `key` whose deadline
    /// is still `until_ms`.
    pub(crate) fn hold_expire(&self, op_id: &str, key: &str, until_ms: i64) -> Statement {
        let [k, o] = key_op(key, op_id);
        self.matching(
            "DELETE FROM ",
            names::HOLD,
            &[k, o, ("until_ms", until_ms.into())],
        )
        .finish()
    }

    /// The tombstones and in-flight markers of operation `op_id` on key
    /// `key` (a primary-key prefix lookup), by table.
    pub(crate) fn op_tombstones(&self, key: &str, op_id: &str) -> Statement {
        let mut s = self.matching(
            "SELECT op_id, tname, mkey, payload, digest, superseded FROM ",
            names::RETIRED,
            &key_op(key, op_id),
        );
        s.raw(" ORDER BY tname");
        s.finish()
    }

    /// The in-flight marker of a move's copy of `key` in `table` on its
    /// destination: a live `durability_retired` row of the operation whose
    /// `moved_to` names the source (where the key lives until the publish)
    /// and whose digest is the in-flight sentinel. Routed writes match no
    /// row while it exists (the tombstone fence), routed reads and probes
    /// skip the row under it. Written in the copy's batch; inserts nothing
    /// when the operation's marker exists.
    pub(crate) fn in_flight_mark(
        &self,
        op_id: &str,
        scope: &str,
        table: &Ident,
        key: &str,
        source: &str,
        now_ms: i64,
    ) -> Statement {
        self.insert_absent(
            names::RETIRED,
            &[
                ("mkey", key.into()),
                ("op_id", op_id.into()),
                ("tname", table.as_str().into()),
                ("scope", scope.into()),
                ("moved_to", source.into()),
                ("digest", names::IN_FLIGHT.into()),
                ("retired_ms", now_ms.into()),
            ],
            3,
        )
    }

    /// Deletes the operation's in-flight markers of `key` (at publish, in
    /// the destination's publish batch, and at abort, with the copies).
    pub(crate) fn in_flight_clear(&self, op_id: &str, key: &str) -> Statement {
        let [k, o] = key_op(key, op_id);
        self.matching(
            "DELETE FROM ",
            names::RETIRED,
            &[k, o, ("digest", names::IN_FLIGHT.into())],
        )
        .finish()
    }

    /// `mkey = ? AND superseded = 0 AND tname IN (?..)`: the key's live
    /// tombstones in any of `tables`.
    fn push_live_tombstones(s: &mut Sql<'_>, tables: &[&Ident], key: &str) {
        s.raw("mkey = ")
            .bind(key)
            .raw(" AND superseded = 0 AND tname IN (")
            .join(tables, ", ", |s, t| {
                s.bind(t.as_str());
            })
            .raw(")");
    }

    /// Lifts (supersedes) the key's live tombstones in any of `tables`.
    pub fn tombstone_lift(&self, tables: &[&Ident], key: &str) -> Statement {
        let mut s = Sql::new(self);
        s.raw("UPDATE ")
            .raw(names::RETIRED)
            .raw(" SET superseded = 1 WHERE ");
        Self::push_live_tombstones(&mut s, tables, key);
        s.finish()
    }

    /// The newest live tombstone of a key in a table (an in-flight marker
    /// included: its `digest` is the in-flight sentinel).
    pub fn tombstone_query(&self, table: &Ident, key: &str) -> Statement {
        let mut s = self.matching(
            "SELECT op_id, moved_to, digest FROM ",
            names::RETIRED,
            &table_key(table, key),
        );
        s.raw(" AND superseded = 0 ORDER BY retired_ms DESC, op_id DESC LIMIT 1");
        s.finish()
    }

    /// One live tombstone (or in-flight marker) of `key` in any of
    /// `tables` written by an operation other than `op_id`, if any: one
    /// primary-key range read, no sort.
    pub(crate) fn foreign_tombstone_query(
        &self,
        tables: &[&Ident],
        key: &str,
        op_id: &str,
    ) -> Statement {
        let mut s = Sql::new(self);
        s.raw("SELECT op_id FROM ")
            .raw(names::RETIRED)
            .raw(" WHERE ");
        Self::push_foreign_tombstones(&mut s, tables, key, op_id);
        s.raw(" LIMIT 1");
        s.finish()
    }

    /// `<live tombstones of key in tables> AND op_id <> ?`: another
    /// operation's (see [`Dialect::foreign_tombstone_query`]).
    pub(super) fn push_foreign_tombstones(
        s: &mut Sql<'_>,
        tables: &[&Ident],
        key: &str,
        op_id: &str,
    ) {
        Self::push_live_tombstones(s, tables, key);
        s.raw(" AND op_id <> ").bind(op_id);
    }

    /// Operation `op_id`'s archive rows of `key` (`tname`, and `payload`
    /// when `payloads`).
    pub(crate) fn op_archive(&self, key: &str, op_id: &str, payloads: bool) -> Statement {
        let head = if payloads {
            "SELECT tname, payload FROM "
        } else {
            "SELECT tname FROM "
        };
        self.matching(head, names::RETIRED, &key_op(key, op_id))
            .finish()
    }

    /// A lifted (superseded) fence of `key` in `table`, if any (`op_id`).
    pub(crate) fn lifted_fence_query(&self, table: &Ident, key: &str) -> Statement {
        let mut s = self.matching("SELECT op_id FROM ", names::RETIRED, &table_key(table, key));
        s.raw(" AND superseded = 1 LIMIT 1");
        s.finish()
    }
}

/// `mkey = ? AND op_id = ?`: an operation's rows of a key (a primary-key
/// prefix of the tombstone and hold tables).
pub(super) fn key_op(key: &str, op_id: &str) -> [(&'static str, Value); 2] {
    [("mkey", key.into()), ("op_id", op_id.into())]
}

/// `tname = ? AND mkey = ?`: a key's rows in one table.
pub(super) fn table_key(table: &Ident, key: &str) -> [(&'static str, Value); 2] {
    [("tname", table.as_str().into()), ("mkey", key.into())]
}
