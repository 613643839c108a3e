//! The statements on the user's keyed tables: schema queries, routed reads
//! and probes, fenced writes, and the row statements of a move's copy.

use super::retired::table_key;
use super::{Dialect, Generation, Ident, Sql, names};
use crate::shard::Statement;
use crate::value::Value;

impl Dialect {
    /// The query listing a table's columns, one row per column with its
    /// `name`. On PostgreSQL and MariaDB/MySQL each row also says how the
    /// column compares, as [`Dialect::key_collation_query`] does for the
    /// key column (`ty` and `det`; `collation`), so one query reads a
    /// table's columns and its key column's collation
    /// ([`Dialect::columns_describe_collation`]). PostgreSQL reads the
    /// catalog (`pg_attribute`, the table as the search path resolves it),
    /// not the much slower `information_schema`.
    pub fn columns_query(&self, table: &Ident) -> Statement {
        let mut s = Sql::new(self);
        match self {
            Self::Postgres => {
                s.raw(
                    "SELECT a.attname::text AS name, format_type(a.atttypid, a.atttypmod) AS ty, \
                     co.collisdeterministic AS det \
                     FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation \
                     WHERE a.attrelid = to_regclass(",
                )
                .bind(self.quote(table))
                .raw(") AND a.attnum > 0 AND NOT a.attisdropped");
            }
            Self::MySql => {
                s.raw(
                    "SELECT column_name AS name, collation_name AS collation \
                     FROM information_schema.columns \
                     WHERE table_schema = DATABASE() AND table_name = ",
                )
                .bind(table.as_str());
            }
            _ => {
                s.raw("SELECT name FROM pragma_table_info(")
                    .bind(table.as_str())
                    .raw(")");
            }
        }
        s.finish()
    }

    /// Whether [`Dialect::columns_query`]'s rows carry the collation
    /// columns of [`Dialect::key_collation_query`] (PostgreSQL,
    /// MariaDB/MySQL), so the key column's row is its collation row.
    pub fn columns_describe_collation(&self) -> bool {
        matches!(self, Self::Postgres | Self::MySql)
    }

    /// The query reading the database's schema version, a number every
    /// schema change (`CREATE`, `ALTER`, `DROP`) changes, as
    /// `schema_version`: SQLite's schema cookie. `None` for dialects with no
    /// such number (a move then reads the columns every time).
    pub(crate) fn schema_version_query(&self) -> Option<Statement> {
        matches!(self, Self::Sqlite)
            .then(|| Statement::new("SELECT schema_version FROM pragma_schema_version()"))
    }

    /// The query describing how a table's key column compares: one row per
    /// collation that applies to it (SQLite: `coll` of every index on the
    /// column plus the table's `CREATE` text in `sql`; PostgreSQL: its type
    /// `ty` and whether its collation is deterministic `det`; MariaDB/MySQL:
    /// its `collation`, NULL for binary and non-text types).
    pub fn key_collation_query(&self, table: &Ident, key_col: &Ident) -> Statement {
        let mut s = Sql::new(self);
        match self {
            Self::Postgres => {
                s.raw(
                    "SELECT format_type(a.atttypid, a.atttypmod) AS ty, co.collisdeterministic AS det \
                     FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation \
                     WHERE a.attrelid = to_regclass(",
                )
                .bind(self.quote(table))
                .raw(") AND a.attname = ")
                .bind(key_col.as_str());
            }
            Self::MySql => {
                s.raw(
                    "SELECT collation_name AS collation FROM information_schema.columns \
                     WHERE table_schema = DATABASE() AND table_name = ",
                )
                .bind(table.as_str())
                .raw(" AND column_name = ")
                .bind(key_col.as_str());
            }
            _ => {
                s.raw("SELECT x.coll AS coll, NULL AS sql FROM pragma_index_list(")
                    .bind(table.as_str())
                    .raw(") AS l, pragma_index_xinfo(l.name) AS x WHERE x.name = ")
                    .bind(key_col.as_str())
                    .raw(" AND x.key = 1 UNION ALL SELECT NULL AS coll, sql FROM sqlite_schema WHERE type = 'table' AND name = ")
                    .bind(table.as_str());
            }
        }
        s.finish()
    }

    /// `SELECT * FROM t WHERE k = ?`.
    pub fn select_row(&self, table: &Ident, key_col: &Ident, key: &str) -> Statement {
        self.keyed("SELECT * FROM ", table, key_col, key).finish()
    }

    /// ` AND NOT EXISTS (<an in-flight marker of the key in the table>)`,
    /// ignoring the marker of operation `via`.
    fn push_unmarked(s: &mut Sql<'_>, table: &Ident, key: &str, via: Option<&str>) {
        s.exists_open(" AND NOT EXISTS ", names::RETIRED, &table_key(table, key))
            .raw(" AND superseded = 0 AND digest = ")
            .bind(names::IN_FLIGHT);
        if let Some(op) = via {
            s.raw(" AND op_id <> ").bind(op);
        }
        s.raw(")");
    }

    /// [`Dialect::select_row`] of a routed read: a row under an in-flight
    /// marker (a move's destination copy before its publish) is not the
    /// key's row, unless the read reached this shard by following the
    /// cutover tombstone of the marker's own operation `via` (the source
    /// was cut over, so the copy is the key's row until the publish).
    pub fn select_row_routed(
        &self,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        via: Option<&str>,
    ) -> Statement {
        let mut s = self.keyed("SELECT * FROM ", table, key_col, key);
        Self::push_unmarked(&mut s, table, key, via);
        s.finish()
    }

    /// [`Dialect::key_probe`] of a placement probe: a row under an
    /// in-flight marker (a move's destination copy) is not found.
    pub fn key_probe_unmarked(&self, table: &Ident, key_col: &Ident, key: &str) -> Statement {
        let mut s = self.probe(table, key_col, key);
        Self::push_unmarked(&mut s, table, key, None);
        s.finish()
    }

    /// Deletes the key's row in `table` while the operation's in-flight
    /// marker covers it (nothing routed can have written it since the copy).
    pub(crate) fn delete_marked(
        &self,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        op_id: &str,
    ) -> Statement {
        let [t, k] = table_key(table, key);
        let mut s = self.keyed("DELETE FROM ", table, key_col, key);
        s.exists_open(
            " AND EXISTS ",
            names::RETIRED,
            &[t, k, ("op_id", op_id.into())],
        )
        .raw(" AND superseded = 0 AND digest = ")
        .bind(names::IN_FLIGHT)
        .raw(")");
        s.finish()
    }

    /// `SELECT k FROM t WHERE k = ?`: whether the key has a row. Selects the
    /// key column only, so a table with column types the backend cannot
    /// decode still probes.
    pub fn key_probe(&self, table: &Ident, key_col: &Ident, key: &str) -> Statement {
        self.probe(table, key_col, key).finish()
    }

    /// `SELECT k FROM t WHERE k = ?`, open for further conditions.
    fn probe(&self, table: &Ident, key_col: &Ident, key: &str) -> Sql<'_> {
        let mut s = Sql::new(self);
        s.raw("SELECT ")
            .ident(key_col)
            .raw(" FROM ")
            .ident(table)
            .raw(" WHERE ")
            .key_is(key_col, key);
        s
    }

    /// `{head}t WHERE k = ?` ([`Sql::key_is`]): the start of every
    /// statement on the key's row of a user table.
    fn keyed(&self, head: &str, table: &Ident, key_col: &Ident, key: &str) -> Sql<'_> {
        let mut s = Sql::new(self);
        s.raw(head).ident(table).raw(" WHERE ").key_is(key_col, key);
        s
    }

    /// `SELECT k FROM t [WHERE k > ?] ORDER BY k LIMIT n`: one page of keys.
    ///
    /// The cursor is the last key value of the previous page, bound with the
    /// type it was read with (an integer for an integer column, bytes for a
    /// binary one); the first page (`after: None`) has no lower bound. A text
    /// cursor such as `''` would skip rows: SQLite orders every integer
    /// before any text, MariaDB compares `''` as `0`, PostgreSQL refuses to
    /// bind text to an integer.
    pub fn key_page(
        &self,
        table: &Ident,
        key_col: &Ident,
        after: Option<&Value>,
        limit: usize,
    ) -> Statement {
        let mut s = Sql::new(self);
        s.raw("SELECT ")
            .ident(key_col)
            .raw(" AS k FROM ")
            .ident(table);
        if let Some(after) = after {
            s.raw(" WHERE ")
                .ident(key_col)
                .raw(" > ")
                .bind(after.clone());
        }
        s.raw(" ORDER BY ")
            .ident(key_col)
            .raw(&format!(" LIMIT {limit}"));
        s.finish()
    }

    /// `INSERT INTO t (cols) VALUES (?..)`.
    pub fn insert_row(&self, table: &Ident, cols: &[(Ident, Value)]) -> Statement {
        let mut s = Sql::new(self);
        s.insert_into(table, cols);
        s.raw("VALUES (");
        s.values(cols);
        s.raw(")");
        s.finish()
    }

    /// `INSERT INTO t (cols) SELECT ?.. WHERE NOT EXISTS (a row of the
    /// key)`: inserts the row unless the table holds one for the key (then
    /// it changes nothing and reports no row).
    ///
    /// With `restore`, the re-insert of a move's copy that went missing
    /// from its destination before publish: it also inserts only while the
    /// destination still holds a live tombstone of the key in the table
    /// (so nothing routed could have written or deleted the key there
    /// yet); once the tombstone is lifted it changes nothing.
    pub fn insert_row_absent(
        &self,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        (cols, restore): (&[(Ident, Value)], bool),
    ) -> Statement {
        let mut s = Sql::new(self);
        s.insert_into(table, cols);
        s.raw("SELECT ");
        s.values(cols);
        s.dual()
            .raw(" WHERE NOT EXISTS (SELECT 1 FROM ")
            .ident(table)
            .raw(" WHERE ")
            .key_is(key_col, key)
            .raw(")");
        if restore {
            s.exists_open(" AND EXISTS ", names::RETIRED, &table_key(table, key))
                .raw(" AND superseded = 0)");
        }
        s.finish()
    }

    /// `DELETE FROM t WHERE k = ?`.
    pub fn delete_key(&self, table: &Ident, key_col: &Ident, key: &str) -> Statement {
        self.keyed("DELETE FROM ", table, key_col, key).finish()
    }

    /// `DELETE FROM t WHERE k = ? AND <every column equals the row>`.
    pub fn delete_matching(
        &self,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        cols: &[(Ident, Value)],
    ) -> Statement {
        let mut s = Sql::new(self);
        s.raw("DELETE FROM ").ident(table).raw(" WHERE ");
        self.push_match(&mut s, key_col, key, cols);
        s.finish()
    }

    pub(crate) fn push_match(
        &self,
        s: &mut Sql<'_>,
        key_col: &Ident,
        key: &str,
        cols: &[(Ident, Value)],
    ) {
        s.key_is(key_col, key);
        for (c, v) in cols {
            s.raw(" AND ").col_is(c, v.clone());
        }
    }

    /// The fence of a routed write: no live tombstone or marker of the key
    /// in the table (a table belongs to one journal scope per database,
    /// which `Router::init` enforces), no write hold of the key by a mover
    /// of `scope` (`None`: of any scope; holds are per key, not per table,
    /// so another scope's hold must not fence this one's writes), and,
    /// with `generation`, no generation fence above it.
    fn push_fence(
        &self,
        s: &mut Sql<'_>,
        table: &Ident,
        key: &str,
        (generation, scope): (Option<Generation<'_>>, Option<&str>),
    ) {
        s.exists_open("NOT EXISTS ", names::RETIRED, &table_key(table, key))
            .raw(" AND superseded = 0)")
            .exists_open(" AND NOT EXISTS ", names::HOLD, &[("mkey", key.into())]);
        if let Some(scope) = scope {
            s.raw(" AND scope = ").bind(scope);
        }
        s.raw(")");
        if let Some(g) = generation {
            s.exists_open(
                " AND NOT EXISTS ",
                names::TOPOLOGY,
                &[("scope", g.scope.into())],
            )
            .raw(" AND min_generation > ")
            .bind(g.generation)
            .raw(")");
        }
    }

    /// A fenced insert: inserts only while no live tombstone for the key exists.
    pub fn fenced_insert(
        &self,
        table: &Ident,
        key: &str,
        cols: &[(Ident, Value)],
        upsert_key: Option<&Ident>,
    ) -> Statement {
        self.guarded_insert(table, key, cols, upsert_key, None, None)
    }

    /// [`Dialect::fenced_insert`] that also matches no row while the shard's
    /// generation fence is above `generation`. `scope`: the writing
    /// router's journal scope, whose write holds alone fence it (`None`:
    /// every scope's, as the `fenced_*` statements).
    pub fn guarded_insert(
        &self,
        table: &Ident,
        key: &str,
        cols: &[(Ident, Value)],
        upsert_key: Option<&Ident>,
        generation: Option<Generation<'_>>,
        scope: Option<&str>,
    ) -> Statement {
        let mut s = Sql::new(self);
        s.insert_into(table, cols);
        s.raw("SELECT ");
        s.values(cols);
        s.dual().raw(" WHERE ");
        self.push_fence(&mut s, table, key, (generation, scope));
        if let Some(k) = upsert_key {
            let others: Vec<&Ident> = cols.iter().map(|(c, _)| c).filter(|c| *c != k).collect();
            match self {
                Self::MySql => {
                    s.raw(" ON DUPLICATE KEY UPDATE ");
                    if others.is_empty() {
                        s.ident(k).raw(" = ").ident(k);
                    }
                    s.join(&others, ", ", |s, c| {
                        s.ident(c).raw(" = VALUES(").ident(c).raw(")");
                    });
                }
                _ => {
                    s.raw(" ON CONFLICT (").ident(k).raw(") DO ");
                    if others.is_empty() {
                        s.raw("NOTHING");
                    } else {
                        s.raw("UPDATE SET ").join(&others, ", ", |s, c| {
                            s.ident(c).raw(" = excluded.").ident(c);
                        });
                    }
                }
            }
        }
        s.finish()
    }

    /// A fenced update of the key's row.
    pub fn fenced_update(
        &self,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        cols: &[(Ident, Value)],
    ) -> Statement {
        self.guarded_update(table, key_col, key, cols, None, None)
    }

    /// [`Dialect::fenced_update`] with an optional generation fence and
    /// the writing router's journal scope (see [`Dialect::guarded_insert`]).
    pub fn guarded_update(
        &self,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        cols: &[(Ident, Value)],
        generation: Option<Generation<'_>>,
        scope: Option<&str>,
    ) -> Statement {
        let mut s = Sql::new(self);
        s.update_set(table, cols)
            .raw(" WHERE ")
            .key_is(key_col, key)
            .raw(" AND ");
        self.push_fence(&mut s, table, key, (generation, scope));
        s.finish()
    }

    /// A fenced delete of the key's row.
    pub fn fenced_delete(&self, table: &Ident, key_col: &Ident, key: &str) -> Statement {
        self.guarded_delete(table, key_col, key, None, None)
    }

    /// [`Dialect::fenced_delete`] with an optional generation fence and
    /// the writing router's journal scope (see [`Dialect::guarded_insert`]).
    pub fn guarded_delete(
        &self,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        generation: Option<Generation<'_>>,
        scope: Option<&str>,
    ) -> Statement {
        let mut s = self.keyed("DELETE FROM ", table, key_col, key);
        s.raw(" AND ");
        self.push_fence(&mut s, table, key, (generation, scope));
        s.finish()
    }
}
