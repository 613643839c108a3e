//! SQL dialects: identifier validation and quoting, placeholders, and the
//! generation of every statement the router issues.
//!
//! Values are always bound parameters; identifiers are validated
//! ([`Ident::new`]) and quoted. A new backend picks a [`Dialect`]; the crate's
//! logic never changes per dialect.

use std::fmt;

use crate::error::{MigrationError, Result};
use crate::shard::Statement;
use crate::value::{Row, Value};

/// Longest identifier accepted (PostgreSQL's limit is 63 bytes).
pub const MAX_IDENT_BYTES: usize = 63;

/// A validated SQL identifier: `[A-Za-z_][A-Za-z0-9_]*`, at most
/// [`MAX_IDENT_BYTES`] bytes, not starting with the reserved `durability_`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ident(String);

impl Ident {
    /// Validates a user identifier.
    ///
    /// # Errors
    /// `INVALID_IDENTIFIER` when the grammar, the length or the reserved
    /// prefix rule is broken.
    pub fn new(s: &str) -> Result<Self> {
        let mut chars = s.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !first_ok
            || !rest_ok
            || s.len() > MAX_IDENT_BYTES
            || s.to_ascii_lowercase().starts_with("durability_")
        {
            return Err(MigrationError::InvalidIdentifier(
                s.chars().take(80).collect(),
            ));
        }
        Ok(Self(s.to_owned()))
    }

    /// One of the crate's own table names (`names`), which the reserved
    /// prefix keeps apart from user identifiers.
    pub(crate) fn internal(name: &'static str) -> Self {
        Self(name.to_owned())
    }

    /// The identifier text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The SQL dialect a shard speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dialect {
    /// SQLite (also D1-like bindings).
    Sqlite,
    /// PostgreSQL.
    Postgres,
    /// MySQL or MariaDB.
    MySql,
    /// Any other dialect: routed reads and raw statements work, moves refuse.
    Other(String),
}

impl Dialect {
    /// Whether moves may run on this dialect.
    pub fn is_proven(&self) -> bool {
        matches!(self, Self::Sqlite | Self::Postgres | Self::MySql)
    }

    /// Why a value can never be stored in a column of this dialect, if it
    /// cannot (a definite refusal known before any write): PostgreSQL text
    /// holds no NUL character (U+0000).
    pub fn unstorable(&self, v: &Value) -> Option<&'static str> {
        match (self, v) {
            (Self::Postgres, Value::Text(t)) if t.contains('\0') => {
                Some("PostgreSQL text cannot hold a NUL character (U+0000)")
            }
            _ => None,
        }
    }

    /// The dialect's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
            Self::Other(n) => n,
        }
    }

    /// Quotes a validated identifier.
    pub fn quote(&self, ident: &Ident) -> String {
        match self {
            Self::MySql => format!("`{}`", ident.0),
            _ => format!("\"{}\"", ident.0),
        }
    }

    /// The placeholder of the `n`th (1-based) parameter.
    pub fn placeholder(&self, n: usize) -> String {
        match self {
            Self::Postgres => format!("${n}"),
            Self::Sqlite => format!("?{n}"),
            _ => "?".to_owned(),
        }
    }

    /// The null-safe equality operator.
    fn null_safe_eq(&self) -> &'static str {
        match self {
            Self::Postgres => " IS NOT DISTINCT FROM ",
            Self::MySql => " <=> ",
            _ => " IS ",
        }
    }

    /// `FROM DUAL` where a `SELECT ... WHERE` without a table needs it.
    fn dual(&self) -> &'static str {
        match self {
            Self::MySql => " FROM DUAL",
            _ => "",
        }
    }

    /// The type of the crate's text key columns. MySQL/MariaDB compare with
    /// the server's default collation, usually case-insensitive
    /// (`utf8mb4_general_ci`, where `"K"` equals `"k"`): keys are compared
    /// byte-wise, as on the other dialects.
    pub(crate) fn text_key_type(&self) -> &'static str {
        match self {
            Self::MySql => "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            _ => "TEXT",
        }
    }
    /// The type of the crate's key (`mkey`) columns. On MySQL/MariaDB keys
    /// are `VARBINARY(512)` ([`crate::MAX_KEY_BYTES`]): compared byte-wise
    /// with no pad, so `"k"` and `"k "` stay two keys (`utf8mb4_bin` is a
    /// PAD SPACE collation on MariaDB, where they are equal).
    pub(crate) fn mkey_type(&self) -> &'static str {
        match self {
            Self::MySql => "VARBINARY(512)",
            _ => "TEXT",
        }
    }
    pub(crate) fn text_type(&self) -> &'static str {
        match self {
            Self::MySql => "LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            _ => "TEXT",
        }
    }
    pub(crate) fn int_type(&self) -> &'static str {
        match self {
            Self::Sqlite => "INTEGER",
            _ => "BIGINT",
        }
    }
    /// Table options of the crate's tables keyed by text (`WITHOUT ROWID`
    /// on SQLite: one b-tree per table instead of a table and a key index).
    pub(crate) fn keyed_table_suffix(&self) -> &'static str {
        match self {
            Self::Sqlite => " WITHOUT ROWID",
            _ => "",
        }
    }
    pub(crate) fn blob_type(&self) -> &'static str {
        match self {
            Self::Postgres => "BYTEA",
            Self::MySql => "LONGBLOB",
            _ => "BLOB",
        }
    }
}

/// Builds one statement, numbering placeholders as values are bound.
#[derive(Debug)]
pub struct Sql<'d> {
    dialect: &'d Dialect,
    text: String,
    params: Vec<Value>,
}

impl<'d> Sql<'d> {
    /// Starts an empty statement.
    pub fn new(dialect: &'d Dialect) -> Self {
        Self {
            dialect,
            text: String::new(),
            params: Vec::new(),
        }
    }
    /// Appends SQL text (never user input).
    pub fn raw(&mut self, s: &str) -> &mut Self {
        self.text.push_str(s);
        self
    }
    /// Appends a quoted identifier.
    pub fn ident(&mut self, i: &Ident) -> &mut Self {
        let q = self.dialect.quote(i);
        self.text.push_str(&q);
        self
    }
    /// Appends a placeholder bound to `v`.
    pub fn bind(&mut self, v: impl Into<Value>) -> &mut Self {
        self.params.push(v.into());
        let p = self.dialect.placeholder(self.params.len());
        self.text.push_str(&p);
        self
    }
    /// Appends `col <null-safe => ?` bound to `v`. Text is compared by its
    /// bytes, never by the column's collation (SQLite `COLLATE BINARY`,
    /// MariaDB/MySQL binary casts), so a value that differs only in case or
    /// trailing spaces is a different value.
    pub fn col_is(&mut self, col: &Ident, v: Value) -> &mut Self {
        let text = matches!(v, Value::Text(_));
        match self.dialect {
            Dialect::MySql if text => {
                self.raw("CAST(").ident(col).raw(" AS BINARY)");
                self.raw(self.dialect.null_safe_eq());
                self.raw("CAST(").bind(v).raw(" AS BINARY)")
            }
            Dialect::Sqlite if text => {
                self.ident(col);
                self.raw(self.dialect.null_safe_eq());
                self.bind(v).raw(" COLLATE BINARY")
            }
            _ => {
                self.ident(col);
                self.raw(self.dialect.null_safe_eq());
                self.bind(v)
            }
        }
    }
    /// Appends `FROM DUAL` where the dialect needs it.
    pub fn dual(&mut self) -> &mut Self {
        self.raw(self.dialect.dual())
    }
    /// Finishes the statement.
    pub fn finish(self) -> Statement {
        Statement {
            sql: self.text,
            params: self.params,
        }
    }
}

/// Names of the crate's tables.
pub(crate) mod names {
    pub(crate) const RETIRED: &str = "durability_retired";
    pub(crate) const OPS: &str = "durability_migration_ops";
    pub(crate) const LEASE: &str = "durability_migration_lease";
    pub(crate) const META: &str = "durability_migration_meta";
    /// The start time of the last finished verification pass, clean or not.
    pub(crate) const PASS: &str = "durability_migration_pass";
    /// The keys the last finished verification pass found something on.
    pub(crate) const UNCLEAN: &str = "durability_migration_unclean";
    pub(crate) const MANIFEST: &str = "durability_manifest";
    pub(crate) const EXCEPTIONS: &str = "durability_placement_exceptions";
    pub(crate) const TOPOLOGY: &str = "durability_topology";
    /// The `digest` of an in-flight marker in `durability_retired` (a real
    /// tombstone's digest is a SHA-256 hex string or `-`).
    pub(crate) const IN_FLIGHT: &str = "in-flight";
    /// A move's write hold on its source: routed writes of the key there
    /// match no row while a row of the key exists.
    pub(crate) const HOLD: &str = "durability_write_hold";
}

/// Validated columns of a row, in canonical order.
pub(crate) fn row_idents(row: &Row) -> Result<Vec<(Ident, Value)>> {
    row.iter()
        .map(|(k, v)| Ok((Ident::new(k)?, v.clone())))
        .collect()
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
                 scope {k} NOT NULL, until_ms {i} NOT NULL, PRIMARY KEY (mkey, op_id)){w}",
                h = names::HOLD,
                w = self.keyed_table_suffix()
            )),
        ]
    }

    /// A move's write hold of `key` on its source until `until_ms` (on the
    /// mover's clock): replaces an earlier hold of the same operation.
    pub(crate) fn hold_take(
        &self,
        op_id: &str,
        scope: &str,
        key: &str,
        until_ms: i64,
    ) -> Vec<Statement> {
        vec![
            self.hold_release(op_id, key),
            self.insert_absent(
                names::HOLD,
                &[
                    ("mkey", key.into()),
                    ("op_id", op_id.into()),
                    ("scope", scope.into()),
                    ("until_ms", until_ms.into()),
                ],
                2,
            ),
        ]
    }

    /// Deletes the operation's write hold of `key`.
    pub(crate) fn hold_release(&self, op_id: &str, key: &str) -> Statement {
        let mut s = Sql::new(self);
        s.raw("DELETE FROM ")
            .raw(names::HOLD)
            .raw(" WHERE mkey = ")
            .bind(key)
            .raw(" AND op_id = ")
            .bind(op_id);
        s.finish()
    }

    /// Deletes the operation's write hold of `key` when the operation's
    /// archive row exists (the cutover batch archived the key).
    pub(crate) fn hold_release_archived(&self, op_id: &str, key: &str) -> Statement {
        let mut s = Sql::new(self);
        s.raw("DELETE FROM ")
            .raw(names::HOLD)
            .raw(" WHERE mkey = ")
            .bind(key)
            .raw(" AND op_id = ")
            .bind(op_id)
            .raw(" AND EXISTS (SELECT 1 FROM ")
            .raw(names::RETIRED)
            .raw(" WHERE mkey = ")
            .bind(key)
            .raw(" AND op_id = ")
            .bind(op_id)
            .raw(" AND digest <> ")
            .bind(names::IN_FLIGHT)
            .raw(")");
        s.finish()
    }

    /// The key's write holds (operation and deadline).
    pub(crate) fn hold_query(&self, key: &str) -> Statement {
        let mut s = Sql::new(self);
        s.raw("SELECT op_id, until_ms FROM ")
            .raw(names::HOLD)
            .raw(" WHERE mkey = ")
            .bind(key);
        s.finish()
    }

    /// Deletes an expired hold: the operation's hold of `key` whose deadline
    /// is still `until_ms`.
    pub(crate) fn hold_expire(&self, op_id: &str, key: &str, until_ms: i64) -> Statement {
        let mut s = Sql::new(self);
        s.raw("DELETE FROM ")
            .raw(names::HOLD)
            .raw(" WHERE mkey = ")
            .bind(key)
            .raw(" AND op_id = ")
            .bind(op_id)
            .raw(" AND until_ms = ")
            .bind(until_ms);
        s.finish()
    }

    /// The column a journal written before verification marks lacks, and
    /// the statement adding it (run when the column query misses it).
    pub(crate) fn journal_upgrade(&self) -> (&'static str, Statement) {
        (
            "verified",
            Statement::new(format!(
                "ALTER TABLE {o} ADD COLUMN verified {i} NOT NULL DEFAULT 0",
                o = names::OPS,
                i = self.int_type()
            )),
        )
    }

    /// The indexes that find the finished operations no pass examined yet
    /// and the retired ones not purged yet, so a pass and a purge read what
    /// is new, not the history (created after [`Self::journal_upgrade`]).
    pub(crate) fn journal_history_indexes(&self) -> Vec<Statement> {
        vec![
            Statement::new(format!(
                "CREATE INDEX IF NOT EXISTS durability_migration_ops_unverified ON {o} (scope, verified, op_id)",
                o = names::OPS
            )),
            Statement::new(format!(
                "CREATE INDEX IF NOT EXISTS durability_migration_ops_unpurged ON {o} (scope, purged, op_id)",
                o = names::OPS
            )),
        ]
    }

    /// `CREATE TABLE IF NOT EXISTS` statements of the journal tables.
    pub fn journal_schema(&self) -> Vec<Statement> {
        let (k, t, i) = (self.text_key_type(), self.text_type(), self.int_type());
        let mk = self.mkey_type();
        vec![
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {o} (op_id {k} PRIMARY KEY, scope {k} NOT NULL, \
                 mkey {mk} NOT NULL, tables {t} NOT NULL, source {t} NOT NULL, target {t} NOT NULL, \
                 state {t} NOT NULL, attempts {i} NOT NULL, digests {t} NOT NULL, owner {t} NOT NULL, \
                 live_until_ms {i} NOT NULL, retain_ms {i} NOT NULL, retire_at_ms {i}, \
                 created_ms {i} NOT NULL, updated_ms {i} NOT NULL, finished_ms {i}, \
                 purged {i} NOT NULL DEFAULT 0, error {t}, claim {mk}, \
                 verified {i} NOT NULL DEFAULT 0){w}",
                o = names::OPS,
                w = self.keyed_table_suffix()
            )),
            Statement::new(format!(
                "CREATE INDEX IF NOT EXISTS durability_migration_ops_key ON {o} (scope, mkey)",
                o = names::OPS
            )),
            // The claim: an active operation holds its key in `claim`; the
            // terminal state's write sets it to NULL. Unique per scope, so a
            // key has at most one active operation. Partial where the
            // dialect has partial indexes (only active operations are
            // indexed); MySQL/MariaDB keep NULLs, which never collide.
            Statement::new(format!(
                "CREATE UNIQUE INDEX IF NOT EXISTS durability_migration_ops_claim ON {o} (scope, claim){p}",
                o = names::OPS,
                p = match self {
                    Self::MySql => "",
                    _ => " WHERE claim IS NOT NULL",
                }
            )),
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {l} (scope {k} PRIMARY KEY, holder {t} NOT NULL, \
                 generation {i} NOT NULL, expires_ms {i} NOT NULL)",
                l = names::LEASE
            )),
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {m} (scope {k} PRIMARY KEY, last_clean_verify_ms {i} NOT NULL)",
                m = names::META
            )),
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {p} (scope {k} PRIMARY KEY, started_ms {i} NOT NULL)",
                p = names::PASS
            )),
            Statement::new(format!(
                "CREATE TABLE IF NOT EXISTS {u} (scope {k} NOT NULL, mkey {mk} NOT NULL, \
                 PRIMARY KEY (scope, mkey)){w}",
                u = names::UNCLEAN,
                w = self.keyed_table_suffix()
            )),
        ]
    }

    /// The tombstones and in-flight markers of operation `op_id` on key
    /// `key` (a primary-key prefix lookup), by table.
    pub(crate) fn op_tombstones(&self, key: &str, op_id: &str) -> Statement {
        let mut s = Sql::new(self);
        s.raw("SELECT op_id, tname, mkey, payload, digest, superseded FROM ")
            .raw(names::RETIRED)
            .raw(" WHERE mkey = ")
            .bind(key)
            .raw(" AND op_id = ")
            .bind(op_id)
            .raw(" ORDER BY tname");
        s.finish()
    }

    /// The query listing a table's columns (one `name` column per row).
    pub fn columns_query(&self, table: &Ident) -> Statement {
        let mut s = Sql::new(self);
        match self {
            Self::Postgres => s.raw(
                "SELECT column_name AS name FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = ",
            ),
            Self::MySql => s.raw(
                "SELECT column_name AS name FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = ",
            ),
            _ => s.raw("SELECT name FROM pragma_table_info("),
        };
        s.bind(table.as_str());
        if matches!(self, Self::Postgres | Self::MySql) {
            s.finish()
        } else {
            s.raw(")");
            s.finish()
        }
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
        let mut s = Sql::new(self);
        s.raw("SELECT * FROM ")
            .ident(table)
            .raw(" WHERE ")
            .ident(key_col)
            .raw(" = ")
            .bind(key);
        s.finish()
    }

    /// ` AND NOT EXISTS (<an in-flight marker of the key in the table>)`,
    /// ignoring the marker of operation `via`.
    fn push_unmarked(s: &mut Sql<'_>, table: &Ident, key: &str, via: Option<&str>) {
        s.raw(" AND NOT EXISTS (SELECT 1 FROM ")
            .raw(names::RETIRED)
            .raw(" WHERE tname = ")
            .bind(table.as_str())
            .raw(" AND mkey = ")
            .bind(key)
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
        let mut s = Sql::new(self);
        s.raw("SELECT * FROM ")
            .ident(table)
            .raw(" WHERE ")
            .ident(key_col)
            .raw(" = ")
            .bind(key);
        Self::push_unmarked(&mut s, table, key, via);
        s.finish()
    }

    /// [`Dialect::key_probe`] of a placement probe: a row under an
    /// in-flight marker (a move's destination copy) is not found.
    pub fn key_probe_unmarked(&self, table: &Ident, key_col: &Ident, key: &str) -> Statement {
        let mut s = Sql::new(self);
        s.raw("SELECT ")
            .ident(key_col)
            .raw(" FROM ")
            .ident(table)
            .raw(" WHERE ")
            .ident(key_col)
            .raw(" = ")
            .bind(key);
        Self::push_unmarked(&mut s, table, key, None);
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
        let mut s = Sql::new(self);
        s.raw("DELETE FROM ")
            .raw(names::RETIRED)
            .raw(" WHERE mkey = ")
            .bind(key)
            .raw(" AND op_id = ")
            .bind(op_id)
            .raw(" AND digest = ")
            .bind(names::IN_FLIGHT);
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
        let mut s = Sql::new(self);
        s.raw("DELETE FROM ")
            .ident(table)
            .raw(" WHERE ")
            .ident(key_col)
            .raw(" = ")
            .bind(key)
            .raw(" AND EXISTS (SELECT 1 FROM ")
            .raw(names::RETIRED)
            .raw(" WHERE tname = ")
            .bind(table.as_str())
            .raw(" AND mkey = ")
            .bind(key)
            .raw(" AND op_id = ")
            .bind(op_id)
            .raw(" AND superseded = 0 AND digest = ")
            .bind(names::IN_FLIGHT)
            .raw(")");
        s.finish()
    }

    /// `SELECT k FROM t WHERE k = ?`: whether the key has a row. Selects the
    /// key column only, so a table with column types the backend cannot
    /// decode still probes.
    pub fn key_probe(&self, table: &Ident, key_col: &Ident, key: &str) -> Statement {
        let mut s = Sql::new(self);
        s.raw("SELECT ")
            .ident(key_col)
            .raw(" FROM ")
            .ident(table)
            .raw(" WHERE ")
            .ident(key_col)
            .raw(" = ")
            .bind(key);
        s.finish()
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

    /// `INSERT INTO t (c1, c2, ..) ` for a row's columns.
    fn push_insert_into(s: &mut Sql<'_>, table: &Ident, cols: &[(Ident, Value)]) {
        s.raw("INSERT INTO ").ident(table).raw(" (");
        for (i, (c, _)) in cols.iter().enumerate() {
            if i > 0 {
                s.raw(", ");
            }
            s.ident(c);
        }
        s.raw(") ");
    }

    /// The row's values as bound parameters, comma-separated.
    fn push_values(s: &mut Sql<'_>, cols: &[(Ident, Value)]) {
        for (i, (_, v)) in cols.iter().enumerate() {
            if i > 0 {
                s.raw(", ");
            }
            s.bind(v.clone());
        }
    }

    /// `INSERT INTO t (cols) VALUES (?..)`.
    pub fn insert_row(&self, table: &Ident, cols: &[(Ident, Value)]) -> Statement {
        let mut s = Sql::new(self);
        Self::push_insert_into(&mut s, table, cols);
        s.raw("VALUES (");
        Self::push_values(&mut s, cols);
        s.raw(")");
        s.finish()
    }

    /// `INSERT INTO t (cols) SELECT ?.. WHERE NOT EXISTS (a row of the
    /// key)`: inserts the row unless the table holds one for the key (then
    /// it changes nothing and reports no row).
    pub fn insert_row_absent(
        &self,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        cols: &[(Ident, Value)],
    ) -> Statement {
        let mut s = Sql::new(self);
        Self::push_insert_absent(&mut s, table, key_col, key, cols);
        s.finish()
    }

    /// `INSERT INTO t (cols) SELECT ?.. WHERE NOT EXISTS (a row of the key)`,
    /// the shared start of [`Dialect::insert_row_absent`] and
    /// [`Dialect::restore_copy`].
    fn push_insert_absent(
        s: &mut Sql<'_>,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        cols: &[(Ident, Value)],
    ) {
        Self::push_insert_into(s, table, cols);
        s.raw("SELECT ");
        Self::push_values(s, cols);
        s.dual()
            .raw(" WHERE NOT EXISTS (SELECT 1 FROM ")
            .ident(table)
            .raw(" WHERE ")
            .ident(key_col)
            .raw(" = ")
            .bind(key)
            .raw(")");
    }

    /// Re-inserts a move's copy that went missing from its destination before
    /// publish: inserts the row only while the table has no row of the key
    /// and the destination still holds a live tombstone of the key in the
    /// table (so nothing routed could have written or deleted the key there
    /// yet). Once the tombstone is lifted it changes nothing.
    pub fn restore_copy(
        &self,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        cols: &[(Ident, Value)],
    ) -> Statement {
        let mut s = Sql::new(self);
        Self::push_insert_absent(&mut s, table, key_col, key, cols);
        s.raw(" AND EXISTS (SELECT 1 FROM ")
            .raw(names::RETIRED)
            .raw(" WHERE tname = ")
            .bind(table.as_str())
            .raw(" AND mkey = ")
            .bind(key)
            .raw(" AND superseded = 0)");
        s.finish()
    }

    /// `DELETE FROM t WHERE k = ?`.
    pub fn delete_key(&self, table: &Ident, key_col: &Ident, key: &str) -> Statement {
        let mut s = Sql::new(self);
        s.raw("DELETE FROM ")
            .ident(table)
            .raw(" WHERE ")
            .ident(key_col)
            .raw(" = ")
            .bind(key);
        s.finish()
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
        s.ident(key_col).raw(" = ").bind(key);
        for (c, v) in cols {
            s.raw(" AND ").col_is(c, v.clone());
        }
    }

    fn push_fence(
        &self,
        s: &mut Sql<'_>,
        table: &Ident,
        key: &str,
        generation: Option<Generation<'_>>,
    ) {
        s.raw("NOT EXISTS (SELECT 1 FROM ")
            .raw(names::RETIRED)
            .raw(" WHERE tname = ")
            .bind(table.as_str())
            .raw(" AND mkey = ")
            .bind(key)
            .raw(" AND superseded = 0) AND NOT EXISTS (SELECT 1 FROM ")
            .raw(names::HOLD)
            .raw(" WHERE mkey = ")
            .bind(key)
            .raw(")");
        if let Some(g) = generation {
            s.raw(" AND NOT EXISTS (SELECT 1 FROM ")
                .raw(names::TOPOLOGY)
                .raw(" WHERE scope = ")
                .bind(g.scope)
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
        self.guarded_insert(table, key, cols, upsert_key, None)
    }

    /// [`Dialect::fenced_insert`] that also matches no row while the shard's
    /// generation fence is above `generation`.
    pub fn guarded_insert(
        &self,
        table: &Ident,
        key: &str,
        cols: &[(Ident, Value)],
        upsert_key: Option<&Ident>,
        generation: Option<Generation<'_>>,
    ) -> Statement {
        let mut s = Sql::new(self);
        Self::push_insert_into(&mut s, table, cols);
        s.raw("SELECT ");
        Self::push_values(&mut s, cols);
        s.dual().raw(" WHERE ");
        self.push_fence(&mut s, table, key, generation);
        if let Some(k) = upsert_key {
            let others: Vec<&Ident> = cols.iter().map(|(c, _)| c).filter(|c| *c != k).collect();
            match self {
                Self::MySql => {
                    s.raw(" ON DUPLICATE KEY UPDATE ");
                    if others.is_empty() {
                        s.ident(k).raw(" = ").ident(k);
                    }
                    for (i, c) in others.iter().enumerate() {
                        if i > 0 {
                            s.raw(", ");
                        }
                        s.ident(c).raw(" = VALUES(").ident(c).raw(")");
                    }
                }
                _ => {
                    s.raw(" ON CONFLICT (").ident(k).raw(") DO ");
                    if others.is_empty() {
                        s.raw("NOTHING");
                    } else {
                        s.raw("UPDATE SET ");
                        for (i, c) in others.iter().enumerate() {
                            if i > 0 {
                                s.raw(", ");
                            }
                            s.ident(c).raw(" = excluded.").ident(c);
                        }
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
        self.guarded_update(table, key_col, key, cols, None)
    }

    /// [`Dialect::fenced_update`] with an optional generation fence.
    pub fn guarded_update(
        &self,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        cols: &[(Ident, Value)],
        generation: Option<Generation<'_>>,
    ) -> Statement {
        let mut s = Sql::new(self);
        s.raw("UPDATE ").ident(table).raw(" SET ");
        for (i, (c, v)) in cols.iter().enumerate() {
            if i > 0 {
                s.raw(", ");
            }
            s.ident(c).raw(" = ").bind(v.clone());
        }
        s.raw(" WHERE ")
            .ident(key_col)
            .raw(" = ")
            .bind(key)
            .raw(" AND ");
        self.push_fence(&mut s, table, key, generation);
        s.finish()
    }

    /// A fenced delete of the key's row.
    pub fn fenced_delete(&self, table: &Ident, key_col: &Ident, key: &str) -> Statement {
        self.guarded_delete(table, key_col, key, None)
    }

    /// [`Dialect::fenced_delete`] with an optional generation fence.
    pub fn guarded_delete(
        &self,
        table: &Ident,
        key_col: &Ident,
        key: &str,
        generation: Option<Generation<'_>>,
    ) -> Statement {
        let mut s = Sql::new(self);
        s.raw("DELETE FROM ")
            .ident(table)
            .raw(" WHERE ")
            .ident(key_col)
            .raw(" = ")
            .bind(key)
            .raw(" AND ");
        self.push_fence(&mut s, table, key, generation);
        s.finish()
    }

    /// `mkey = ? AND superseded = 0 AND tname IN (?..)`: the key's live
    /// tombstones in any of `tables`.
    fn push_live_tombstones(s: &mut Sql<'_>, tables: &[&Ident], key: &str) {
        s.raw("mkey = ")
            .bind(key)
            .raw(" AND superseded = 0 AND tname IN (");
        for (i, t) in tables.iter().enumerate() {
            if i > 0 {
                s.raw(", ");
            }
            s.bind(t.as_str());
        }
        s.raw(")");
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

    /// `INSERT INTO t (cols) SELECT ?.. WHERE NOT EXISTS (...)`: inserts the
    /// row unless `table` holds one whose first `keys` columns are equal.
    pub(crate) fn insert_absent(
        &self,
        table: &str,
        cols: &[(&str, Value)],
        keys: usize,
    ) -> Statement {
        let mut s = Sql::new(self);
        s.raw("INSERT INTO ").raw(table).raw(" (");
        for (i, (c, _)) in cols.iter().enumerate() {
            if i > 0 {
                s.raw(", ");
            }
            s.raw(c);
        }
        s.raw(") SELECT ");
        for (i, (_, v)) in cols.iter().enumerate() {
            if i > 0 {
                s.raw(", ");
            }
            s.bind(v.clone());
        }
        s.dual()
            .raw(" WHERE NOT EXISTS (SELECT 1 FROM ")
            .raw(table)
            .raw(" WHERE ");
        for (i, (c, v)) in cols.iter().take(keys).enumerate() {
            if i > 0 {
                s.raw(" AND ");
            }
            s.raw(c).raw(" = ").bind(v.clone());
        }
        s.raw(")");
        s.finish()
    }

    /// The newest live tombstone of a key in a table (an in-flight marker
    /// included: its `digest` is the in-flight sentinel).
    pub fn tombstone_query(&self, table: &Ident, key: &str) -> Statement {
        let mut s = Sql::new(self);
        s.raw("SELECT op_id, moved_to, digest FROM ")
            .raw(names::RETIRED)
            .raw(" WHERE tname = ")
            .bind(table.as_str())
            .raw(" AND mkey = ")
            .bind(key)
            .raw(" AND superseded = 0 ORDER BY retired_ms DESC, op_id DESC LIMIT 1");
        s.finish()
    }
}

/// The generation a routed write binds under computed placement: the write
/// matches no row while the shard's fence (`min_generation` of the scope in
/// `durability_topology`) is above it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation<'a> {
    /// The journal scope whose fence applies.
    pub scope: &'a str,
    /// The manifest generation the write routed with.
    pub generation: i64,
}

/// One table of a cutover: its snapshot row (or none).
#[derive(Debug, Clone)]
pub struct CutoverTable {
    /// The table.
    pub table: Ident,
    /// Its key column.
    pub key_col: Ident,
    /// The snapshot (validated columns), `None` when the key had no row.
    pub row: Option<Vec<(Ident, Value)>>,
    /// The snapshot's encoded payload (for the archive).
    pub payload: Option<Vec<u8>>,
    /// The snapshot's digest.
    pub digest: String,
}

/// Everything a cutover batch needs.
#[derive(Debug, Clone)]
pub struct Cutover<'a> {
    /// The operation.
    pub op_id: &'a str,
    /// The journal scope.
    pub scope: &'a str,
    /// The key.
    pub key: &'a str,
    /// The destination shard.
    pub moved_to: &'a str,
    /// Now, in Unix ms.
    pub now_ms: i64,
    /// The tables.
    pub tables: &'a [CutoverTable],
    /// When the journal shares the source's database: the owner the
    /// operation's journal row must still name, so a mover that lost the
    /// operation to recovery archives nothing.
    pub journal_owner: Option<&'a str>,
}

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
                .ident(key_col)
                .raw(" = ")
                .bind(c.key)
                .raw(")");
        }
        if let Some(owner) = c.journal_owner {
            and(s);
            s.raw("EXISTS (SELECT 1 FROM ")
                .raw(names::OPS)
                .raw(" WHERE op_id = ")
                .bind(c.op_id)
                .raw(" AND owner = ")
                .bind(owner)
                .raw(")");
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
                s.raw(" AND EXISTS (SELECT 1 FROM ")
                    .raw(names::RETIRED)
                    .raw(" WHERE mkey = ")
                    .bind(c.key)
                    .raw(" AND op_id = ")
                    .bind(c.op_id)
                    .raw(" AND tname = ")
                    .bind(t.table.as_str())
                    .raw(")");
                out.push(s.finish());
            }
        }
        out
    }
}
