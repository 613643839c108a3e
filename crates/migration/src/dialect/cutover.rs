//! The source cutover of a move: the archive inserts and deletes under one
//! snapshot predicate, run as one atomic batch.

use super::retired::key_op;
use super::{Cutover, Dialect, Ident, Sql, names};
use crate::shard::Statement;
use crate::value::Value;

impl Dialect {
    /// The cutover's predicate: every snapshot row is still there unchanged,
    /// every table that had no row still has none, and (when the journal
    /// shares this database) the operation still names its owner.
    ///
    /// The terms nest inside the first present row's `EXISTS` rather than
    /// being `AND`ed side by side: SQLite re-prepares a statement whose
    /// `WHERE` holds two sibling `EXISTS` with non-key terms on every new
    /// binding, and the nested form means the same on every dialect.
    fn push_snapshot_predicate(&self, s: &mut Sql<'_>, c: &Cutover<'_>, absent: &[(Ident, Ident)]) {
        let mut open = 0;
        let mut first = true;
        let mut and = |s: &mut Sql<'_>| {
            if !std::mem::take(&mut first) {
                s.raw(" AND ");
            }
        };
        for t in c.tables {
            if let Some(cols) = &t.row {
                and(s);
                s.raw("EXISTS (SELECT 1 FROM ")
                    .ident(&t.table)
                    .raw(" WHERE ");
                self.push_match(s, &t.key_col, c.key, cols);
                open += 1;
            }
        }
        let empty = c
            .tables
            .iter()
            .filter(|t| t.row.is_none())
            .map(|t| (&t.table, &t.key_col))
            .chain(absent.iter().map(|(t, k)| (t, k)));
        for (table, key_col) in empty {
            and(s);
            s.raw("NOT EXISTS (SELECT 1 FROM ")
                .ident(table)
                .raw(" WHERE ")
                .key_is(key_col, c.key)
                .raw(")");
        }
        if let Some(owner) = c.journal_owner {
            and(s);
            let eqs = [("op_id", c.op_id.into()), ("owner", owner.into())];
            s.exists_open("EXISTS ", names::OPS, &eqs).raw(")");
        }
        if first {
            s.raw("1 = 1");
        }
        for _ in 0..open {
            s.raw(")");
        }
    }

    /// The source cutover: one archive insert per table under the snapshot
    /// predicate over every table, then deletes of the archived rows. Run as
    /// one atomic batch; when any row changed first, every statement writes
    /// nothing.
    pub fn cutover_batch(&self, c: &Cutover<'_>) -> Vec<Statement> {
        self.cutover_batch_guarded(c, &[])
    }

    /// [`Dialect::cutover_batch`] whose predicate also requires that the
    /// `absent` tables (table, key column) hold no row of the key: tables
    /// outside the move that must not gain a row the move would strand.
    pub fn cutover_batch_guarded(
        &self,
        c: &Cutover<'_>,
        absent: &[(Ident, Ident)],
    ) -> Vec<Statement> {
        let mut out = Vec::new();
        for t in c.tables {
            let mut s = Sql::new(self);
            s.raw("INSERT INTO ")
                .raw(names::RETIRED)
                .raw(" (op_id, tname, mkey, scope, moved_to, payload, digest, retired_ms, superseded, purged) SELECT ")
                .bind(c.op_id)
                .raw(", ")
                .bind(t.table.as_str())
                .raw(", ")
                .bind(c.key)
                .raw(", ")
                .bind(c.scope)
                .raw(", ")
                .bind(c.moved_to)
                .raw(", ")
                .bind(t.payload.clone().map_or(Value::Null, Value::Blob))
                .raw(", ")
                .bind(t.digest.as_str())
                .raw(", ")
                .bind(c.now_ms)
                .raw(", 0, 0")
                .dual()
                .raw(" WHERE ");
            self.push_snapshot_predicate(&mut s, c, absent);
            out.push(s.finish());
        }
        for t in c.tables {
            if let Some(cols) = &t.row {
                let mut s = Sql::new(self);
                s.raw("DELETE FROM ").ident(&t.table).raw(" WHERE ");
                self.push_match(&mut s, &t.key_col, c.key, cols);
                let [k, o] = key_op(c.key, c.op_id);
                let eqs = [k, o, ("tname", t.table.as_str().into())];
                s.exists_open(" AND EXISTS ", names::RETIRED, &eqs).raw(")");
                out.push(s.finish());
            }
        }
        out
    }
}
