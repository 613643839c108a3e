//! The statements of a verification pass and of the purge on the data
//! shards: the repair deletes, the tombstone pages, a stale cutover's
//! restore, and the archive purge and compaction.

use super::retired::key_op;
use super::{Dialect, Ident, Sql, names};
use crate::shard::Statement;
use crate::value::Value;

impl Dialect {
    /// A repair's delete of the key's row in `table` while it still equals
    /// `cols`; with `tomb` (op id, table) only while that tombstone is live,
    /// and with `claim_scope` (the journal shares this database) only while
    /// no operation of the scope holds the key's claim.
    pub(crate) fn repair_delete(
        &self,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        cols: &[(Ident, Value)],
        tomb: Option<(&str, &str)>,
        claim_scope: Option<&str>,
    ) -> Statement {
        let mut s = Sql::new(self);
        s.raw("DELETE FROM ").ident(table).raw(" WHERE ");
        self.push_match(&mut s, key_col, key, cols);
        if let Some((op_id, table)) = tomb {
            s.exists_open(
                " AND EXISTS ",
                names::RETIRED,
                &one_tombstone(key, op_id, table),
            )
            .raw(" AND superseded = 0)");
        }
        if let Some(scope) = claim_scope {
            s.exists_open(" AND NOT EXISTS ", names::OPS, &claim(scope, key))
                .raw(")");
        }
        s.finish()
    }

    /// One keyset page of the scope's tombstones and markers after the
    /// position (`after_key`, `after_op`, `after_table`), in the table's key
    /// order (mkey, op_id, tname).
    pub(crate) fn tombstone_page(
        &self,
        scope: &str,
        after_key: &str,
        after_op: &str,
        after_table: &str,
        page: usize,
    ) -> Statement {
        let mut s = self.scoped(
            "SELECT op_id, tname, mkey, payload, digest, superseded FROM ",
            names::RETIRED,
            scope,
        );
        s.raw(" AND (mkey > ")
            .bind(after_key)
            .raw(" OR (mkey = ")
            .bind(after_key)
            .raw(" AND (op_id > ")
            .bind(after_op)
            .raw(" OR (op_id = ")
            .bind(after_op)
            .raw(" AND tname > ")
            .bind(after_table)
            .raw(&format!(")))) ORDER BY mkey, op_id, tname LIMIT {page}"));
        s.finish()
    }

    /// Lifts (supersedes) one tombstone: operation `op_id`'s of `key` in
    /// `table`.
    pub(crate) fn tombstone_lift_one(&self, key: &str, op_id: &str, table: &str) -> Statement {
        self.update(
            names::RETIRED,
            &[("superseded", 1i64.into())],
            &one_tombstone(key, op_id, table),
        )
        .finish()
    }

    /// Drops the payloads of operation `op_id`'s archive rows of `key` and
    /// marks them purged.
    pub(crate) fn archive_purge(&self, key: &str, op_id: &str) -> Statement {
        let mut s = Sql::new(self);
        s.raw("UPDATE ")
            .raw(names::RETIRED)
            .raw(" SET payload = NULL, purged = 1 WHERE ")
            .eqs(&key_op(key, op_id));
        s.finish()
    }

    /// The key's lifted fences in the scope (`op_id`, `tname`, `purged`),
    /// newest first per table.
    pub(crate) fn lifted_fences(&self, key: &str, scope: &str) -> Statement {
        let mut s = self.matching(
            "SELECT op_id, tname, purged FROM ",
            names::RETIRED,
            &[("mkey", key.into()), ("scope", scope.into())],
        );
        s.raw(" AND superseded = 1 ORDER BY tname, retired_ms DESC, op_id DESC");
        s.finish()
    }

    /// Deletes one lifted and purged fence: operation `op_id`'s of `key` in
    /// `table`.
    pub(crate) fn lifted_fence_delete(&self, key: &str, op_id: &str, table: &str) -> Statement {
        let mut s = self.matching(
            "DELETE FROM ",
            names::RETIRED,
            &one_tombstone(key, op_id, table),
        );
        s.raw(" AND superseded = 1 AND purged = 1");
        s.finish()
    }
}

/// `mkey = ? AND op_id = ? AND tname = ?`: one tombstone row (its primary
/// key).
fn one_tombstone(key: &str, op_id: &str, table: &str) -> [(&'static str, Value); 3] {
    let [k, o] = key_op(key, op_id);
    [k, o, ("tname", table.into())]
}

/// `scope = ? AND claim = ?`: the operation of the scope holding the key's
/// claim.
pub(super) fn claim(scope: &str, key: &str) -> [(&'static str, Value); 2] {
    [("scope", scope.into()), ("claim", key.into())]
}
