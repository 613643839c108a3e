//! A backend-neutral image of one object's stored state: what an export
//! reads from one object store and an import writes into another (a SQLite
//! file or PostgreSQL rows).
//!
//! An [`ObjectImage`] is a list of [`Table`]s. The built-in capabilities'
//! rows are tables of fixed, portable shape ([`CAPABILITY_TABLES`]: the
//! scheduler's schema versions, due times and alarm, the outbox entries,
//! version counter and quarantine, the alarm row, the topology groups,
//! states and pending writes), named the same on every backend; each
//! storage backend maps them to its own physical tables. The object's own
//! tables (the application's, and an application capability's) follow as
//! they are, with portable column types ([`ColumnType`]: integer, real,
//! text, blob), `NOT NULL`, and the primary key.
//!
//! What an image does not hold: the owner fence (a fence belongs to the
//! lease store of the deployment that wrote it; the importing deployment's
//! first owner fences the object at its own claim), and anything the
//! portable shape cannot say (secondary indexes, views, triggers, other
//! column types): a backend refuses to export an object holding one, never
//! drops it silently.

use crate::StorageError;

/// Why an image could not be read from, or written to, an object's
/// storage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The object holds something the portable shape cannot carry (a
    /// secondary index, a view, a trigger, a column type, an unknown
    /// capability table): nothing was exported.
    #[error("the object is not portable: {0}")]
    NotPortable(String),
    /// The image is not well formed (see [`ObjectImage::check`]), or names
    /// a capability version the target cannot create: nothing was written.
    #[error("invalid object image: {0}")]
    Invalid(String),
    /// The target object already holds state: nothing was written.
    #[error("the target object is not empty: {0}")]
    TargetNotEmpty(String),
    /// The storage failed (the transaction rolled back).
    #[error(transparent)]
    Storage(#[from] StorageError),
}

durability_time::error_codes! {
    ImageError {
        Self::NotPortable(_) => "IMAGE_NOT_PORTABLE",
        Self::Invalid(_) => "IMAGE_INVALID",
        Self::TargetNotEmpty(_) => "IMAGE_TARGET_NOT_EMPTY",
        Self::Storage(_) => "IMAGE_STORAGE",
    }
}

/// A column's portable type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ColumnType {
    /// A 64-bit signed integer.
    Integer,
    /// A 64-bit float.
    Real,
    /// UTF-8 text (without NUL, which PostgreSQL text cannot hold).
    Text,
    /// Bytes.
    Blob,
}

impl ColumnType {
    /// The type's name in the portable format.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Integer => "integer",
            Self::Real => "real",
            Self::Text => "text",
            Self::Blob => "blob",
        }
    }

    /// Parses [`ColumnType::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "integer" => Self::Integer,
            "real" => Self::Real,
            "text" => Self::Text,
            "blob" => Self::Blob,
            _ => return None,
        })
    }

    /// Whether `value` is of this type (`Null` is checked by the column).
    pub fn admits(self, value: &Value) -> bool {
        matches!(
            (self, value),
            (_, Value::Null)
                | (Self::Integer, Value::Integer(_))
                | (Self::Real, Value::Real(_))
                | (Self::Text, Value::Text(_))
                | (Self::Blob, Value::Blob(_))
        )
    }
}

/// One stored value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// An integer.
    Integer(i64),
    /// A float (finite: the portable format holds no NaN or infinity).
    Real(f64),
    /// Text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
}

/// One column of a [`Table`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// The column's name.
    pub name: String,
    /// Its portable type.
    pub ty: ColumnType,
    /// Whether it refuses `NULL`.
    pub not_null: bool,
}

/// One table of an [`ObjectImage`]: its shape and every row.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// The table's name: a capability table's portable name (see
    /// [`CAPABILITY_TABLES`]) or the object's own table's name.
    pub name: String,
    /// The columns, in order.
    pub columns: Vec<Column>,
    /// The primary key's columns, in key order (empty: none).
    pub primary_key: Vec<String>,
    /// Every row, each value in column order.
    pub rows: Vec<Vec<Value>>,
}

impl Table {
    /// Checks the table's shape and every row against it: at least one
    /// column, distinct column names, key columns that exist and are `NOT NULL`, rows of the
    /// column count whose values fit their columns.
    ///
    /// # Errors
    /// What is wrong, naming the table (and the row).
    pub fn check(&self) -> Result<(), String> {
        let t = &self.name;
        if t.is_empty() || t.contains('\0') {
            return Err(format!("table {t:?}: an empty name or a NUL in it"));
        }
        if self.columns.is_empty() {
            return Err(format!("table {t}: no columns"));
        }
        let mut names = std::collections::BTreeSet::new();
        for c in &self.columns {
            if c.name.is_empty() || c.name.contains('\0') || !names.insert(c.name.as_str()) {
                return Err(format!(
                    "table {t}: column {:?} empty, NUL or twice",
                    c.name
                ));
            }
        }
        for k in &self.primary_key {
            if !self.columns.iter().any(|c| &c.name == k && c.not_null) {
                return Err(format!(
                    "table {t}: key column {k} is not a NOT NULL column"
                ));
            }
        }
        for (i, row) in self.rows.iter().enumerate() {
            if row.len() != self.columns.len() {
                return Err(format!("table {t} row {i}: {} values", row.len()));
            }
            for (c, v) in self.columns.iter().zip(row) {
                let null_ok = !c.not_null || *v != Value::Null;
                let finite = !matches!(v, Value::Real(f) if !f.is_finite());
                let text_ok = !matches!(v, Value::Text(s) if s.contains('\0'));
                if !c.ty.admits(v) || !null_ok || !finite || !text_ok {
                    return Err(format!(
                        "table {t} row {i}: column {} ({}) cannot hold {v:?}",
                        c.name,
                        c.ty.as_str()
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Table {
    /// The body of the table's `CREATE TABLE` on a backend: each column
    /// (`<name> <type>[ NOT NULL]`, names through `quote`, types through
    /// `type_name`), then `PRIMARY KEY (…)` when it has a key; the SQL of
    /// both SQLite and PostgreSQL.
    pub fn definition(
        &self,
        type_name: impl Fn(ColumnType) -> &'static str,
        quote: impl Fn(&str) -> String,
    ) -> String {
        let mut defs: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                let nn = if c.not_null { " NOT NULL" } else { "" };
                format!("{} {}{nn}", quote(&c.name), type_name(c.ty))
            })
            .collect();
        if !self.primary_key.is_empty() {
            let key: Vec<String> = self.primary_key.iter().map(|k| quote(k)).collect();
            defs.push(format!("PRIMARY KEY ({})", key.join(", ")));
        }
        defs.join(", ")
    }
}

/// One object's stored state (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ObjectImage {
    /// The capability tables that hold rows, then the object's own tables,
    /// each once.
    pub tables: Vec<Table>,
}

impl ObjectImage {
    /// The table named `name`, when the image holds it.
    pub fn table(&self, name: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// The object's own tables (every table that is not a capability
    /// table).
    pub fn own_tables(&self) -> impl Iterator<Item = &Table> {
        self.tables
            .iter()
            .filter(|t| capability_table(&t.name).is_none())
    }

    /// Checks every table ([`Table::check`]), that no table comes twice,
    /// and that each capability table has exactly its fixed shape.
    ///
    /// # Errors
    /// What is wrong.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for table in &self.tables {
            if !seen.insert(table.name.as_str()) {
                return Err(format!("table {} twice", table.name));
            }
            table.check()?;
            if let Some(def) = capability_table(&table.name)
                && (def.columns() != table.columns || def.key.iter().ne(table.primary_key.iter()))
            {
                return Err(format!(
                    "capability table {} does not have its fixed shape",
                    table.name
                ));
            }
        }
        Ok(())
    }
}

/// A capability table's fixed, portable shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapabilityTable {
    /// The portable name (`<capability>.<table>`).
    pub name: &'static str,
    /// The capability whose schema creates it (`scheduler`: always there).
    pub capability: &'static str,
    /// The schema version of the capability that creates it.
    pub since: u32,
    /// The columns: name, type, `NOT NULL`.
    pub cols: &'static [(&'static str, ColumnType, bool)],
    /// The primary key (empty: rows are kept in their stored order).
    pub key: &'static [&'static str],
}

impl CapabilityTable {
    /// The columns as [`Column`]s.
    pub fn columns(&self) -> Vec<Column> {
        self.cols
            .iter()
            .map(|(name, ty, not_null)| Column {
                name: (*name).to_owned(),
                ty: *ty,
                not_null: *not_null,
            })
            .collect()
    }

    /// The column names, in order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> {
        self.cols.iter().map(|(n, _, _)| *n)
    }
}

use ColumnType::{Blob, Integer, Text};

/// Every capability table an image may hold, in image order. A table
/// without a key (`scheduler.alarm`, `outbox.version`, `alarms.row`: at
/// most one row; `outbox.quarantine`, `topology.writes`: rows in stored
/// order) is written back in the order listed.
pub const CAPABILITY_TABLES: &[CapabilityTable] = &[
    CapabilityTable {
        name: "scheduler.schema",
        capability: "scheduler",
        since: 0,
        cols: &[("capability", Text, true), ("version", Integer, true)],
        key: &["capability"],
    },
    CapabilityTable {
        name: "scheduler.due",
        capability: "scheduler",
        since: 0,
        cols: &[("capability", Text, true), ("due", Integer, true)],
        key: &["capability"],
    },
    CapabilityTable {
        name: "scheduler.alarm",
        capability: "scheduler",
        since: 0,
        cols: &[("at", Integer, false)],
        key: &[],
    },
    CapabilityTable {
        name: "outbox.entries",
        capability: "outbox",
        since: 1,
        cols: &[
            ("channel", Text, true),
            ("key", Text, true),
            ("value", Blob, true),
            ("version", Integer, true),
            ("attempt", Integer, true),
            ("due_at", Integer, true),
            ("claimed_until", Integer, false),
        ],
        key: &["channel", "key"],
    },
    CapabilityTable {
        name: "outbox.version",
        capability: "outbox",
        since: 1,
        cols: &[("last", Integer, true)],
        key: &[],
    },
    CapabilityTable {
        name: "outbox.quarantine",
        capability: "outbox",
        since: 2,
        cols: &[
            ("channel", Text, true),
            ("key", Text, true),
            ("value", Blob, false),
            ("version", Integer, false),
            ("attempt", Integer, false),
            ("due_at", Integer, false),
            ("claimed_until", Integer, false),
            ("reason", Text, true),
            ("quarantined_at", Integer, true),
        ],
        key: &[],
    },
    CapabilityTable {
        name: "alarms.row",
        capability: "alarms",
        since: 1,
        cols: &[
            ("at", Integer, true),
            ("token", Text, true),
            ("fence", Text, false),
        ],
        key: &[],
    },
    CapabilityTable {
        name: "topology.groups",
        capability: "topology",
        since: 1,
        cols: &[
            ("group_id", Text, true),
            ("version", Integer, true),
            ("members", Text, true),
            ("deleted", Integer, true),
            ("updated_at", Integer, true),
        ],
        key: &["group_id"],
    },
    CapabilityTable {
        name: "topology.states",
        capability: "topology",
        since: 1,
        cols: &[
            ("group_id", Text, true),
            ("channel", Text, true),
            ("value", Text, true),
        ],
        key: &["group_id", "channel"],
    },
    CapabilityTable {
        name: "topology.writes",
        capability: "topology",
        since: 1,
        cols: &[("group_id", Text, true), ("land_by", Integer, true)],
        key: &[],
    },
];

/// The capability table named `name`.
pub fn capability_table(name: &str) -> Option<&'static CapabilityTable> {
    CAPABILITY_TABLES.iter().find(|t| t.name == name)
}

/// The capability tables an object at `versions` (capability name to its
/// stored schema version) holds, in image order: the scheduler's, and
/// each table whose capability's version reached the table's.
pub fn tables_at(
    versions: &std::collections::BTreeMap<String, u32>,
) -> impl Iterator<Item = &'static CapabilityTable> {
    CAPABILITY_TABLES.iter().filter(move |t| {
        t.capability == "scheduler" || versions.get(t.capability).is_some_and(|v| *v >= t.since)
    })
}

/// The capabilities' schema versions an image records (its
/// `scheduler.schema` rows).
///
/// # Errors
/// [`ImageError::Invalid`] for a row that is not a capability and a
/// version in `0..=u32::MAX`.
pub fn versions_of(
    image: &ObjectImage,
) -> Result<std::collections::BTreeMap<String, u32>, ImageError> {
    let Some(table) = image.table("scheduler.schema") else {
        return Ok(Default::default());
    };
    table
        .rows
        .iter()
        .map(|row| match row.as_slice() {
            [Value::Text(c), Value::Integer(v)] => u32::try_from(*v)
                .map(|v| (c.clone(), v))
                .map_err(|_| ImageError::Invalid(format!("capability {c} at version {v}"))),
            _ => Err(ImageError::Invalid(format!("a schema row {row:?}"))),
        })
        .collect()
}

/// The capabilities whose tables an image can carry (besides the
/// scheduler's own, which every object has).
pub const PORTABLE_CAPABILITIES: &[&str] = &["outbox", "alarms", "topology"];

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn table(rows: Vec<Vec<Value>>) -> Table {
        Table {
            name: "t".to_owned(),
            columns: vec![
                Column {
                    name: "id".to_owned(),
                    ty: Integer,
                    not_null: true,
                },
                Column {
                    name: "s".to_owned(),
                    ty: Text,
                    not_null: false,
                },
            ],
            primary_key: vec!["id".to_owned()],
            rows,
        }
    }

    #[test]
    fn every_image_error_code_is_listed() {
        for e in [
            ImageError::NotPortable(String::new()),
            ImageError::Invalid(String::new()),
            ImageError::TargetNotEmpty(String::new()),
            ImageError::Storage(StorageError::corrupt("x")),
        ] {
            assert!(ImageError::CODES.contains(&e.code()));
        }
    }

    #[test]
    fn a_table_refuses_rows_that_do_not_fit_its_columns() {
        let ok = table(vec![vec![Value::Integer(1), Value::Null]]);
        assert_eq!(ok.check(), Ok(()));
        for bad in [
            vec![Value::Null, Value::Null],
            vec![Value::Text("1".into()), Value::Null],
            vec![Value::Integer(1), Value::Text("a\0b".into())],
            vec![Value::Integer(1)],
        ] {
            assert!(table(vec![bad.clone()]).check().is_err(), "{bad:?}");
        }
        let mut nan = table(vec![]);
        nan.columns[1].ty = ColumnType::Real;
        nan.rows = vec![vec![Value::Integer(1), Value::Real(f64::NAN)]];
        assert!(nan.check().is_err());
        let mut key = table(vec![]);
        key.primary_key = vec!["nope".to_owned()];
        assert!(key.check().is_err());
    }

    #[test]
    fn a_capability_table_must_have_its_fixed_shape() {
        let def = capability_table("outbox.version").unwrap();
        let mut t = Table {
            name: def.name.to_owned(),
            columns: def.columns(),
            primary_key: vec![],
            rows: vec![vec![Value::Integer(3)]],
        };
        let image = ObjectImage {
            tables: vec![t.clone()],
        };
        assert_eq!(image.check(), Ok(()));
        assert_eq!(image.own_tables().count(), 0);
        t.columns[0].not_null = false;
        assert!(ObjectImage { tables: vec![t] }.check().is_err());
        let twice = ObjectImage {
            tables: vec![table(vec![]), table(vec![])],
        };
        assert!(twice.check().is_err());
    }
}
