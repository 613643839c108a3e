//! SQL dialects: identifier validation and quoting, placeholders, and the
//! generation of every statement the router issues. All of the crate's SQL
//! text is here (a unit test refuses SQL in string literals elsewhere),
//! by concern:
//!
//! - this module: [`Ident`], [`Dialect`] and its column types, the
//!   statement builder [`Sql`], the crate's table names;
//! - `data`: the user's keyed tables (schema queries, routed reads and
//!   probes, fenced writes, a move's copy);
//! - `retired`: tombstones, archives, in-flight markers and write holds on
//!   every data shard;
//! - `cutover`: a move's source cutover batch;
//! - `journal`: the journal's schema and its operation and lease rows;
//! - `placement`: the manifest, placement exceptions and generation fences;
//! - `verify`: the verification pass's and the purge's statements;
//! - `pairs`: the key → shard tables of the mapping store and the ledger.
//!
//! Values are always bound parameters; identifiers are validated
//! ([`Ident::new`]) and quoted. A new backend picks a [`Dialect`]; the crate's
//! logic never changes per dialect.

mod cutover;
mod data;
mod journal;
mod pairs;
mod placement;
mod retired;
mod sightings;
mod verify;

#[cfg(test)]
mod tests;

use std::fmt;

pub(crate) use journal::{JournalSql, TakeOver};
pub(crate) use pairs::{ALLOCATIONS, MAPPING, PairTable};
pub(crate) use retired::Hold;
pub(crate) use sightings::Watched;

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
    /// MariaDB (tested) or MySQL (the same SQL, but untested: no test
    /// runs against Oracle's MySQL server).
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
        let mut out = String::new();
        self.push_placeholder(n, &mut out);
        out
    }

    /// Appends [`Dialect::placeholder`] to `out` (no string of its own).
    fn push_placeholder(&self, n: usize, out: &mut String) {
        use std::fmt::Write as _;
        let _ = match self {
            Self::Postgres => write!(out, "${n}"),
            Self::Sqlite => write!(out, "?{n}"),
            _ => write!(out, "?"),
        };
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
        self.dialect
            .push_placeholder(self.params.len(), &mut self.text);
        self
    }
    /// Appends `col <null-safe => ?` bound to `v`. Text is compared by its
    /// bytes, never by the column's collation (SQLite `COLLATE BINARY`,
    /// MariaDB/MySQL binary casts, PostgreSQL both sides' text forms under
    /// `COLLATE "C"`), so a value that differs only in case or trailing
    /// spaces is a different value.
    pub fn col_is(&mut self, col: &Ident, v: Value) -> &mut Self {
        let text = matches!(v, Value::Text(_));
        match self.dialect {
            Dialect::Postgres if text => {
                // `COALESCE(?, col)` is the bound value (never NULL here)
                // typed as the column, so both sides go through the
                // column type's own text form (a `char(n)` drops its padding on
                // both, a `uuid` prints both canonically) and compare under the
                // byte-wise "C" collation, whatever the column's collation
                // (a nondeterministic one folds case).
                self.raw("CAST(").ident(col).raw(" AS TEXT) COLLATE \"C\"");
                self.raw(self.dialect.null_safe_eq());
                self.raw("CAST(COALESCE(")
                    .bind(v)
                    .raw(", ")
                    .ident(col)
                    .raw(") AS TEXT) COLLATE \"C\"")
            }
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
    /// A key match, `col = ?`, that uses the column's index. On PostgreSQL
    /// and MariaDB/MySQL it also requires the column's bytes to equal the
    /// key's ([`Sql::col_is`]): their routers re-validate a key column's
    /// collation only every `schema_recheck_ms`, and a key column altered
    /// to a coarser collation meanwhile must still never match another
    /// key's row. SQLite needs no second test: a move re-validates exactly
    /// when the schema cookie changed, and a column's collation cannot
    /// change without a schema change.
    pub fn key_is(&mut self, col: &Ident, key: &str) -> &mut Self {
        self.ident(col).raw(" = ").bind(key);
        match self.dialect {
            Dialect::Postgres | Dialect::MySql => {
                self.raw(" AND ");
                self.col_is(col, Value::Text(key.to_owned()))
            }
            _ => self,
        }
    }
    /// Appends each of `items` with `item`, separated by `sep`.
    pub(crate) fn join<T>(
        &mut self,
        items: impl IntoIterator<Item = T>,
        sep: &str,
        mut item: impl FnMut(&mut Self, T),
    ) -> &mut Self {
        for (i, t) in items.into_iter().enumerate() {
            if i > 0 {
                self.raw(sep);
            }
            item(self, t);
        }
        self
    }
    /// Appends `UPDATE {table} SET c1 = ?, c2 = ? ..`, each column bound
    /// to its value.
    pub(crate) fn update_set<T: Name + ?Sized, C: Name>(
        &mut self,
        table: &T,
        sets: &[(C, Value)],
    ) -> &mut Self {
        self.raw("UPDATE ");
        table.write(self);
        self.raw(" SET ").join(sets, ", ", |s, (c, v)| {
            c.write(s);
            s.raw(" = ").bind(v.clone());
        })
    }
    /// Appends `INSERT INTO {table} (c1, c2, ..) ` for the columns of
    /// `cols`.
    pub(crate) fn insert_into<T: Name + ?Sized, C: Name>(
        &mut self,
        table: &T,
        cols: &[(C, Value)],
    ) -> &mut Self {
        self.raw("INSERT INTO ");
        table.write(self);
        self.raw(" (")
            .join(cols, ", ", |s, (c, _)| c.write(s))
            .raw(") ")
    }
    /// Appends the values of `cols` as bound parameters, comma-separated.
    pub(crate) fn values<C>(&mut self, cols: &[(C, Value)]) -> &mut Self {
        self.join(cols, ", ", |s, (_, v)| {
            s.bind(v.clone());
        })
    }
    /// Appends `c1 = ? AND c2 = ? ..`, each column (one of the crate's own,
    /// never user input) bound to its value.
    pub(crate) fn eqs(&mut self, eqs: &[(&str, Value)]) -> &mut Self {
        self.join(eqs, " AND ", |s, (c, v)| {
            s.raw(c).raw(" = ").bind(v.clone());
        })
    }
    /// Appends `{head}(SELECT 1 FROM {table} WHERE c1 = ? AND ..`: an
    /// `EXISTS` test (`head` ends with `EXISTS `) whose further conditions
    /// and closing parenthesis the caller appends.
    pub(crate) fn exists_open(
        &mut self,
        head: &str,
        table: &str,
        eqs: &[(&str, Value)],
    ) -> &mut Self {
        self.raw(head)
            .raw("(SELECT 1 FROM ")
            .raw(table)
            .raw(" WHERE ")
            .eqs(eqs)
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

/// A table or column name in a statement: one of the crate's own tables
/// and columns (written as is) or a validated user identifier (quoted).
pub(crate) trait Name {
    /// Appends the name to `s`.
    fn write(&self, s: &mut Sql<'_>);
}

impl Name for str {
    fn write(&self, s: &mut Sql<'_>) {
        s.raw(self);
    }
}

impl Name for Ident {
    fn write(&self, s: &mut Sql<'_>) {
        s.ident(self);
    }
}

impl<T: Name + ?Sized> Name for &T {
    fn write(&self, s: &mut Sql<'_>) {
        (**self).write(s);
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
    /// When a router first saw a row of another clock domain as it is now,
    /// on the journal database's clock.
    pub(crate) const SIGHTINGS: &str = "durability_migration_sightings";
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
    /// `{head}{table} WHERE c1 = ? AND c2 = ? ..` bound to the values: the
    /// start of every statement on the crate's rows whose columns equal
    /// given values.
    pub(crate) fn matching(&self, head: &str, table: &str, eqs: &[(&str, Value)]) -> Sql<'_> {
        let mut s = Sql::new(self);
        s.raw(head).raw(table).raw(" WHERE ").eqs(eqs);
        s
    }

    /// `{head}{table} WHERE scope = ?` bound to `scope`: the start of every
    /// statement that reads or deletes one scope's rows.
    pub(crate) fn scoped(&self, head: &str, table: &str, scope: &str) -> Sql<'_> {
        self.matching(head, table, &[("scope", scope.into())])
    }

    /// `UPDATE {table} SET a = ?, .. WHERE c = ? AND ..`: an update of the
    /// crate's rows whose `eqs` columns equal the values (further
    /// conditions may follow).
    pub(crate) fn update(
        &self,
        table: &str,
        sets: &[(&str, Value)],
        eqs: &[(&str, Value)],
    ) -> Sql<'_> {
        let mut s = Sql::new(self);
        s.update_set(table, sets).raw(" WHERE ").eqs(eqs);
        s
    }

    /// Writes `cols` to `table` whether or not its row exists (one batch):
    /// an update of the other columns of the row whose first `keys`
    /// columns are equal, then [`Dialect::insert_absent`].
    pub(crate) fn upsert(
        &self,
        table: &str,
        cols: &[(&str, Value)],
        keys: usize,
    ) -> Vec<Statement> {
        let (key_cols, sets) = cols.split_at(keys);
        vec![
            self.update(table, sets, key_cols).finish(),
            self.insert_absent(table, cols, keys),
        ]
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
        s.insert_into(table, cols)
            .raw("SELECT ")
            .values(cols)
            .dual()
            .exists_open(" WHERE NOT EXISTS ", table, &cols[..keys])
            .raw(")");
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
