//! An object database as a backend-neutral image
//! ([`durability_scheduler::image`]), and back.
//!
//! Export ([`SqliteTx::export_image`], inside one transaction, so it reads
//! one snapshot): the capability tables by their portable names
//! (`durability_schema` is `scheduler.schema`, `durability_outbox` is
//! `outbox.entries`, …; singleton tables lose their `id = 0` column, the
//! topology writes their row id, kept as row order), then every own
//! table (a name not starting with `durability_` or `sqlite_`) with its
//! columns' portable types from their declared types by SQLite's affinity
//! rules (`INT` → integer; `CHAR`, `CLOB`, `TEXT` → text; `BLOB` → blob;
//! `REAL`, `FLOA`, `DOUB` → real), `NOT NULL` and the primary key. Strict:
//! a column of no declared type or numeric affinity, a value of another
//! storage class than its column's type, a secondary index, view or
//! trigger on an own table, or a `durability_*` table of no portable
//! capability refuses the export ([`ImageError::NotPortable`]). The owner
//! fence is not exported ([`SqliteTx::fences`] reads it).
//!
//! Import ([`SqliteStorage::write_image`]): into an empty object database
//! only, in one transaction: each portable capability's schema steps up to
//! the image's version, then its rows, then the own tables created and
//! filled.

use std::collections::BTreeMap;

use durability_scheduler::image::{
    self, Column, ColumnType, ImageError, ObjectImage, Table, Value,
};
use durability_scheduler::{Direction, Storage, StorageError};
use rusqlite::types::ValueRef;

use crate::object::backend;
use crate::{SqliteStorage, SqliteTx};

/// Where a capability table lives in an object database: its table, and
/// the singleton key column (`id = 0`) or row id it has beside the
/// portable columns.
fn physical(name: &str) -> Option<(&'static str, Extra)> {
    Some(match name {
        "scheduler.schema" => ("durability_schema", Extra::None),
        "scheduler.due" => ("durability_scheduler_due", Extra::None),
        "scheduler.alarm" => ("durability_scheduler_alarm", Extra::Singleton),
        "outbox.entries" => ("durability_outbox", Extra::None),
        "outbox.version" => ("durability_outbox_version", Extra::Singleton),
        "outbox.quarantine" => (
            "durability_outbox_quarantine",
            Extra::RowOrder("channel, key, quarantined_at"),
        ),
        "alarms.row" => ("durability_alarm", Extra::Singleton),
        "topology.groups" => ("durability_topology_groups", Extra::None),
        "topology.states" => ("durability_topology_states", Extra::None),
        "topology.writes" => ("durability_topology_writes", Extra::RowOrder("id")),
        _ => return None,
    })
}

#[derive(Debug, Clone, Copy)]
enum Extra {
    None,
    Singleton,
    RowOrder(&'static str),
}

/// Reserved tables the image does not carry on purpose.
const NOT_CARRIED: &[&str] = &["durability_owner_fence"];

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn not_portable(what: String) -> ImageError {
    ImageError::NotPortable(what)
}

/// The portable type of a declared SQLite column type (affinity rules).
fn portable_type(declared: &str) -> Option<ColumnType> {
    let d = declared.to_ascii_uppercase();
    if d.contains("INT") {
        Some(ColumnType::Integer)
    } else if d.contains("CHAR") || d.contains("CLOB") || d.contains("TEXT") {
        Some(ColumnType::Text)
    } else if d.contains("BLOB") && !d.is_empty() {
        Some(ColumnType::Blob)
    } else if d.contains("REAL") || d.contains("FLOA") || d.contains("DOUB") {
        Some(ColumnType::Real)
    } else {
        None
    }
}

/// The SQLite declared type of a portable type.
fn declared(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Integer => "INTEGER",
        ColumnType::Real => "REAL",
        ColumnType::Text => "TEXT",
        ColumnType::Blob => "BLOB",
    }
}

fn value_of(v: ValueRef<'_>) -> Result<Value, String> {
    Ok(match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(
            String::from_utf8(t.to_vec()).map_err(|_| "text that is not UTF-8".to_owned())?,
        ),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    })
}

fn to_sql(v: &Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as V;
    match v {
        Value::Null => V::Null,
        Value::Integer(i) => V::Integer(*i),
        Value::Real(f) => V::Real(*f),
        Value::Text(s) => V::Text(s.clone()),
        Value::Blob(b) => V::Blob(b.clone()),
    }
}

impl SqliteTx<'_> {
    /// The object's stored state as an image, read in this transaction
    /// (see the [module docs](self)).
    ///
    /// # Errors
    /// [`ImageError::NotPortable`] naming what cannot be carried,
    /// [`ImageError::Storage`] with a `Corrupt` error for a stored value
    /// that does not decode (text that is not UTF-8), or a SQLite failure.
    pub fn export_image(&self) -> Result<ObjectImage, ImageError> {
        let conn = self.sql();
        let schema: Vec<(String, String, String, Option<String>)> = conn
            .prepare("SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY name")
            .and_then(|mut st| {
                st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                    .collect()
            })
            .map_err(|e| backend("read the schema", e))?;
        let reserved = |n: &str| {
            let l = n.to_ascii_lowercase();
            l.starts_with("durability_") || l.starts_with("sqlite_")
        };
        let mut own = Vec::new();
        for (kind, name, table, sql) in &schema {
            match kind.as_str() {
                "table" if !reserved(name) => {
                    own.push((name.clone(), sql.clone().unwrap_or_default()));
                }
                "table" => {
                    let known =
                        CAPS.iter().any(|t| t == name) || NOT_CARRIED.contains(&name.as_str());
                    if name.to_ascii_lowercase().starts_with("durability_") && !known {
                        return Err(not_portable(format!(
                            "the table {name} of no portable capability"
                        )));
                    }
                }
                "index" if sql.is_some() && !reserved(table) => {
                    return Err(not_portable(format!("the index {name} on {table}")));
                }
                "view" | "trigger" => {
                    return Err(not_portable(format!("the {kind} {name}")));
                }
                _ => {}
            }
        }
        let mut tables = Vec::new();
        let versions = self.stored_versions()?;
        for def in image::tables_at(&versions) {
            tables.push(self.capability_rows(def)?);
        }
        for (name, sql) in own {
            tables.push(self.own_table(&name, &sql)?);
        }
        Ok(ObjectImage { tables })
    }

    fn stored_versions(&self) -> Result<BTreeMap<String, u32>, ImageError> {
        let rows: Vec<(String, i64)> = self
            .sql()
            .prepare("SELECT capability, version FROM durability_schema")
            .and_then(|mut st| st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .map_err(|e| backend("read schema versions", e))?;
        rows.into_iter()
            .map(|(c, v)| {
                u32::try_from(v).map(|v| (c.clone(), v)).map_err(|_| {
                    StorageError::corrupt(format!("capability {c} at schema version {v}")).into()
                })
            })
            .collect()
    }

    fn read_rows(
        &self,
        sql: &str,
        table: &str,
        columns: &[Column],
    ) -> Result<Vec<Vec<Value>>, ImageError> {
        let mut st = self
            .sql()
            .prepare(sql)
            .map_err(|e| backend(&format!("read {table}"), e))?;
        let mut rows = st
            .query([])
            .map_err(|e| backend(&format!("read {table}"), e))?;
        let mut out = Vec::new();
        while let Some(row) = rows
            .next()
            .map_err(|e| backend(&format!("read {table}"), e))?
        {
            let mut values = Vec::with_capacity(columns.len());
            for (i, c) in columns.iter().enumerate() {
                let raw = row
                    .get_ref(i)
                    .map_err(|e| backend(&format!("read {table}"), e))?;
                let v = value_of(raw)
                    .map_err(|why| StorageError::corrupt(format!("{table}.{}: {why}", c.name)))?;
                // SQLite keeps an integral REAL as an integer in the file.
                let v = match (c.ty, v) {
                    (ColumnType::Real, Value::Integer(i)) => Value::Real(i as f64),
                    (_, v) => v,
                };
                if !c.ty.admits(&v) || (c.not_null && v == Value::Null) {
                    return Err(not_portable(format!(
                        "{table}.{} ({}) holds {v:?}",
                        c.name,
                        c.ty.as_str()
                    )));
                }
                values.push(v);
            }
            out.push(values);
        }
        Ok(out)
    }

    fn capability_rows(&self, def: &image::CapabilityTable) -> Result<Table, ImageError> {
        let (table, extra) =
            physical(def.name).ok_or_else(|| not_portable(format!("no table for {}", def.name)))?;
        let cols: Vec<String> = def.names().map(quote).collect();
        let order = match extra {
            Extra::None => def
                .key
                .iter()
                .map(|k| quote(k))
                .collect::<Vec<_>>()
                .join(", "),
            Extra::Singleton => "1".to_owned(),
            Extra::RowOrder(c) => c.to_owned(),
        };
        let filter = if matches!(extra, Extra::Singleton) {
            " WHERE id = 0"
        } else {
            ""
        };
        let sql = format!(
            "SELECT {} FROM {table}{filter} ORDER BY {order}",
            cols.join(", ")
        );
        let columns = def.columns();
        let rows = self.read_rows(&sql, table, &columns)?;
        Ok(Table {
            name: def.name.to_owned(),
            columns,
            primary_key: def.key.iter().map(|k| (*k).to_owned()).collect(),
            rows,
        })
    }

    /// Refuses an own table whose definition holds what the image cannot
    /// carry: a `UNIQUE` index, a foreign key, or (by the words of its
    /// `CREATE TABLE`) a `CHECK`, `COLLATE`, `REFERENCES` or generated
    /// column (a false alarm refuses, never loses).
    fn check_own_definition(&self, name: &str, sql: &str) -> Result<(), ImageError> {
        let words = sql
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map(str::to_ascii_uppercase);
        for word in words {
            if matches!(
                word.as_str(),
                "CHECK" | "COLLATE" | "REFERENCES" | "GENERATED" | "UNIQUE"
            ) {
                return Err(not_portable(format!("{name}: a {word} clause")));
            }
        }
        let counted: i64 = self
            .sql()
            .query_row(
                "SELECT (SELECT count(*) FROM pragma_index_list(?1) WHERE origin <> 'pk')
                      + (SELECT count(*) FROM pragma_foreign_key_list(?1))",
                [name],
                |r| r.get(0),
            )
            .map_err(|e| backend(&format!("read the indexes of {name}"), e))?;
        if counted > 0 {
            return Err(not_portable(format!("{name}: an index or foreign key")));
        }
        Ok(())
    }

    fn own_table(&self, name: &str, sql: &str) -> Result<Table, ImageError> {
        self.check_own_definition(name, sql)?;
        type Info = (String, String, bool, i64, Option<String>);
        let info: Vec<Info> = self
            .sql()
            .prepare(
                "SELECT name, type, \"notnull\", pk, dflt_value FROM pragma_table_info(?1) \
                 ORDER BY cid",
            )
            .and_then(|mut st| {
                st.query_map([name], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })?
                .collect()
            })
            .map_err(|e| backend(&format!("read the columns of {name}"), e))?;
        let mut columns = Vec::new();
        let mut key: Vec<(i64, String)> = Vec::new();
        for (col, ty, not_null, pk, default) in info {
            if default.is_some() {
                return Err(not_portable(format!("{name}.{col}: a default")));
            }
            let ty = portable_type(&ty)
                .ok_or_else(|| not_portable(format!("{name}.{col}: the declared type {ty:?}")))?;
            if pk > 0 {
                key.push((pk, col.clone()));
            }
            // A key column is NOT NULL in the image (as PostgreSQL makes
            // it; a NULL SQLite let into a key refuses the export).
            columns.push(Column {
                name: col,
                ty,
                not_null: not_null || pk > 0,
            });
        }
        key.sort();
        let primary_key: Vec<String> = key.into_iter().map(|(_, c)| c).collect();
        let order = if primary_key.is_empty() {
            columns.iter().map(|c| quote(&c.name)).collect::<Vec<_>>()
        } else {
            primary_key.iter().map(|c| quote(c)).collect()
        };
        let sql = format!(
            "SELECT {} FROM {} ORDER BY {}",
            columns
                .iter()
                .map(|c| quote(&c.name))
                .collect::<Vec<_>>()
                .join(", "),
            quote(name),
            order.join(", ")
        );
        let rows = self.read_rows(&sql, name, &columns)?;
        Ok(Table {
            name: name.to_owned(),
            columns,
            primary_key,
            rows,
        })
    }

    /// The owner fence's rows: each scope (its canonical host id) and the
    /// generation fenced. Empty when the object was never fenced.
    ///
    /// # Errors
    /// A SQLite failure, or a `Corrupt` error for a generation below 1.
    pub fn fences(&self) -> Result<Vec<(String, u64)>, StorageError> {
        let exists: bool = self
            .sql()
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE name = 'durability_owner_fence')",
                [],
                |r| r.get(0),
            )
            .map_err(|e| backend("read the fence", e))?;
        if !exists {
            return Ok(Vec::new());
        }
        let rows: Vec<(String, i64)> = self
            .sql()
            .prepare("SELECT scope, generation FROM durability_owner_fence ORDER BY scope")
            .and_then(|mut st| st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .map_err(|e| backend("read the fence", e))?;
        rows.into_iter()
            .map(|(s, g)| {
                u64::try_from(g)
                    .ok()
                    .filter(|g| *g > 0)
                    .map(|g| (s.clone(), g))
                    .ok_or_else(|| StorageError::corrupt(format!("fence {s} at generation {g}")))
            })
            .collect()
    }

    /// Whether the object holds any state: a capability row or an own
    /// table.
    fn holds_state(&self) -> Result<bool, ImageError> {
        let image = self.export_image();
        Ok(match image {
            Ok(image) => image
                .tables
                .iter()
                .any(|t| !t.rows.is_empty() || image::capability_table(&t.name).is_none()),
            Err(ImageError::NotPortable(_)) => true,
            Err(e) => return Err(e),
        })
    }
}

/// The physical tables of the capability tables, for the export's check
/// of unknown reserved tables.
const CAPS: &[&str] = &[
    "durability_schema",
    "durability_scheduler_due",
    "durability_scheduler_alarm",
    "durability_outbox",
    "durability_outbox_version",
    "durability_outbox_quarantine",
    "durability_alarm",
    "durability_topology_groups",
    "durability_topology_states",
    "durability_topology_writes",
];

impl SqliteStorage {
    /// Writes `image` into this object database, which must hold no state
    /// yet, in one transaction (see the [module docs](self)); unfenced
    /// storage only sees it committed or not at all.
    ///
    /// # Errors
    /// [`ImageError::Invalid`] for an image that fails its check or names
    /// a capability version this storage cannot create,
    /// [`ImageError::TargetNotEmpty`], or a SQLite failure; nothing is
    /// written.
    pub fn write_image(&self, image: &ObjectImage) -> Result<(), ImageError> {
        image.check().map_err(ImageError::Invalid)?;
        let versions = image::versions_of(image)?;
        self.transaction(|tx| {
            if tx.holds_state()? {
                return Err(ImageError::TargetNotEmpty(
                    "the object database holds state".into(),
                ));
            }
            for cap in image::PORTABLE_CAPABILITIES {
                let Some(&target) = versions.get(*cap) else {
                    continue;
                };
                let steps = self.schema(cap);
                if steps.iter().all(|s| s.version != target) {
                    return Err(ImageError::Invalid(format!(
                        "{cap} at schema version {target}, which this storage cannot create"
                    )));
                }
                for step in steps.iter().filter(|s| s.version <= target) {
                    self.apply_schema_step(tx, cap, step.version, Direction::Up)?;
                }
            }
            for table in &image.tables {
                match image::capability_table(&table.name) {
                    Some(def) => tx.write_capability(def, table)?,
                    None => tx.write_own(table)?,
                }
            }
            Ok(())
        })
    }
}

impl SqliteTx<'_> {
    /// Inserts `rows` (each after the values `pre`); `replace` only for a
    /// singleton row a schema step may have written already.
    fn insert(
        &self,
        table: &str,
        cols: &[String],
        rows: &[Vec<Value>],
        pre: &[Value],
    ) -> Result<(), ImageError> {
        let all: Vec<String> = cols.iter().map(|c| quote(c)).collect();
        let marks: Vec<String> = (1..=all.len()).map(|i| format!("?{i}")).collect();
        let sql = format!(
            "INSERT {}INTO {} ({}) VALUES ({})",
            if pre.is_empty() { "" } else { "OR REPLACE " },
            quote(table),
            all.join(", "),
            marks.join(", ")
        );
        let mut st = self
            .sql()
            .prepare(&sql)
            .map_err(|e| backend(&format!("write {table}"), e))?;
        for row in rows {
            let values: Vec<rusqlite::types::Value> = pre.iter().chain(row).map(to_sql).collect();
            st.execute(rusqlite::params_from_iter(values))
                .map_err(|e| backend(&format!("write {table}"), e))?;
        }
        Ok(())
    }

    fn write_capability(
        &self,
        def: &image::CapabilityTable,
        table: &Table,
    ) -> Result<(), ImageError> {
        let (physical, extra) = physical(def.name)
            .ok_or_else(|| ImageError::Invalid(format!("no table for {}", def.name)))?;
        let mut cols: Vec<String> = def.names().map(str::to_owned).collect();
        let mut pre = Vec::new();
        if matches!(extra, Extra::Singleton) {
            if table.rows.len() > 1 {
                return Err(ImageError::Invalid(format!(
                    "{} holds {} rows",
                    def.name,
                    table.rows.len()
                )));
            }
            cols.insert(0, "id".to_owned());
            pre.push(Value::Integer(0));
        }
        self.insert(physical, &cols, &table.rows, &pre)
    }

    fn write_own(&self, table: &Table) -> Result<(), ImageError> {
        let lower = table.name.to_ascii_lowercase();
        if lower.starts_with("durability_") || lower.starts_with("sqlite_") {
            return Err(ImageError::Invalid(format!(
                "an own table named {}",
                table.name
            )));
        }
        let defs = table.definition(declared, quote);
        self.sql()
            .execute_batch(&format!("CREATE TABLE {} ({})", quote(&table.name), defs))
            .map_err(|e| backend(&format!("create {}", table.name), e))?;
        let cols: Vec<String> = table.columns.iter().map(|c| c.name.clone()).collect();
        self.insert(&table.name, &cols, &table.rows, &[])
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use crate::SqliteOptions;

    /// An object database with a row in every capability table and an own
    /// table, written through the capabilities' own schema steps.
    pub(crate) fn filled(path: &std::path::Path) -> SqliteStorage {
        let storage = SqliteStorage::open(path, SqliteOptions::default()).unwrap();
        storage
            .transaction(|tx| {
                for (cap, top) in [("outbox", 2), ("alarms", 1), ("topology", 1)] {
                    for v in 1..=top {
                        storage.apply_schema_step(tx, cap, v, Direction::Up)?;
                    }
                    tx.sql()
                        .execute(
                            "INSERT INTO durability_schema (capability, version) VALUES (?1, ?2)",
                            rusqlite::params![cap, top],
                        )
                        .map_err(|e| backend("t", e))?;
                }
                tx.sql()
                    .execute_batch(
                        "INSERT INTO durability_scheduler_due VALUES ('outbox', 17);
                         INSERT OR REPLACE INTO durability_scheduler_alarm (id, at) VALUES (0, 17);
                         INSERT INTO durability_outbox VALUES ('c', 'k', x'0102', 3, 1, 17, NULL);
                         UPDATE durability_outbox_version SET last = 3;
                         INSERT INTO durability_outbox_quarantine VALUES ('c', 'bad', NULL, NULL, NULL, NULL, NULL, 'why', 5);
                         INSERT INTO durability_alarm VALUES (0, 40, 'tok', NULL);
                         INSERT INTO durability_topology_groups VALUES ('g', 2, '[\"a\"]', 0, 9);
                         INSERT INTO durability_topology_states VALUES ('g', 'ch', 'v');
                         INSERT INTO durability_topology_writes (group_id, land_by) VALUES ('g', 11);
                         CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL, note TEXT NOT NULL, raw BLOB);
                         INSERT INTO orders VALUES (1, 2.5, 'é', x'00ff'), (2, 3, 'b', NULL);",
                    )
                    .map_err(|e| backend("t", e))
            })
            .unwrap();
        storage
    }

    #[test]
    fn an_image_written_into_a_new_database_reads_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let source = filled(&dir.path().join("a.sqlite"));
        let image = source.transaction(|tx| tx.export_image()).unwrap();
        image.check().unwrap();
        let names: Vec<&str> = image.tables.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names.len(), 11, "{names:?}");
        let orders = image.table("orders").unwrap();
        assert_eq!(orders.primary_key, vec!["id".to_owned()]);
        assert_eq!(orders.rows[1][1], Value::Real(3.0));
        let target =
            SqliteStorage::open(dir.path().join("b.sqlite"), SqliteOptions::default()).unwrap();
        target.write_image(&image).unwrap();
        assert_eq!(target.transaction(|tx| tx.export_image()).unwrap(), image);
        // A second import finds state and writes nothing.
        let e = target.write_image(&image).unwrap_err();
        assert_eq!(e.code(), "IMAGE_TARGET_NOT_EMPTY");
        assert_eq!(target.transaction(|tx| tx.export_image()).unwrap(), image);
    }

    #[test]
    fn what_the_image_cannot_carry_refuses_the_export() {
        for (sql, what) in [
            ("CREATE INDEX orders_note ON orders (note)", "orders_note"),
            ("CREATE VIEW v AS SELECT 1", "view v"),
            ("CREATE TABLE anyt (x)", "anyt.x"),
            (
                "INSERT INTO orders VALUES (3, 1.0, 'x', 'text in a blob column')",
                "orders.raw",
            ),
            (
                "CREATE TABLE durability_semaphore_x (a INTEGER)",
                "durability_semaphore_x",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let storage = filled(&dir.path().join("a.sqlite"));
            storage
                .transaction(|tx| tx.sql().execute_batch(sql).map_err(|e| backend("t", e)))
                .unwrap();
            let e = storage.transaction(|tx| tx.export_image()).unwrap_err();
            assert_eq!(e.code(), "IMAGE_NOT_PORTABLE", "{sql}");
            assert!(e.to_string().contains(what), "{e} for {sql}");
        }
    }

    #[test]
    fn an_invalid_image_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let source = filled(&dir.path().join("a.sqlite"));
        let mut image = source.transaction(|tx| tx.export_image()).unwrap();
        // The last table's last row breaks its NOT NULL column.
        let orders = image
            .tables
            .iter_mut()
            .find(|t| t.name == "orders")
            .unwrap();
        orders.rows[0][2] = Value::Null;
        let target =
            SqliteStorage::open(dir.path().join("b.sqlite"), SqliteOptions::default()).unwrap();
        assert_eq!(
            target.write_image(&image).unwrap_err().code(),
            "IMAGE_INVALID"
        );
        // A constraint the check cannot see (a duplicate key) fails in the
        // transaction, which rolls back everything before it.
        let orders = image
            .tables
            .iter_mut()
            .find(|t| t.name == "orders")
            .unwrap();
        orders.rows[0][2] = Value::Text("x".into());
        orders.rows[1][0] = Value::Integer(1);
        assert_eq!(
            target.write_image(&image).unwrap_err().code(),
            "IMAGE_STORAGE"
        );
        let after = target.transaction(|tx| tx.export_image()).unwrap();
        assert!(after.tables.iter().all(|t| t.rows.is_empty()), "{after:?}");
    }
}

/// Installs `image` as the object database at `target`, crash-safe: the
/// image is written into a new file beside it (`<target>.import`, in one
/// transaction, then closed, which checkpoints its WAL into it, and
/// fsynced), and renamed over `target`, and the directory fsynced. A crash
/// at any point leaves `target` as it was or wholly the image (a
/// leftover `.import` file is removed by the next install). With
/// `replace`, an existing `target`'s WAL is checkpointed and truncated
/// first, so no frame of the old database outlives it; run it on an
/// object no process has open.
///
/// # Errors
/// [`ImageError::TargetNotEmpty`] when `target` exists and `replace` is
/// not set; what [`SqliteStorage::write_image`] refuses; an I/O or SQLite
/// failure. `target` is untouched on every error.
pub fn install_image(
    target: &std::path::Path,
    image: &ObjectImage,
    replace: bool,
    options: crate::SqliteOptions,
) -> Result<(), ImageError> {
    let io =
        |what: String| move |e: std::io::Error| ImageError::Storage(StorageError::backend(what, e));
    let shown = target.display().to_string();
    if target.exists() && !replace {
        return Err(ImageError::TargetNotEmpty(format!("{shown} exists")));
    }
    let mut tmp = target.as_os_str().to_owned();
    tmp.push(".import");
    let tmp = std::path::PathBuf::from(tmp);
    for companion in ["", "-wal", "-shm", "-journal"] {
        let mut path = tmp.as_os_str().to_owned();
        path.push(companion);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("remove {}", tmp.display()))(e)),
        }
    }
    // The storage is dropped (closed, its WAL checkpointed) at the end.
    let written = (|| SqliteStorage::open(&tmp, options)?.write_image(image))();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io(format!("sync {}", tmp.display())))?;
    if target.exists() {
        let conn = rusqlite::Connection::open(target).map_err(|e| backend(&shown, e))?;
        let busy: i64 = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .map_err(|e| backend(&format!("checkpoint {shown}"), e))?;
        if busy != 0 {
            return Err(ImageError::Storage(StorageError::new(
                durability_scheduler::StorageErrorKind::Backend,
                format!("{shown} is in use: its WAL cannot be checkpointed"),
            )));
        }
        drop(conn);
    }
    std::fs::rename(&tmp, target).map_err(io(format!("rename over {shown}")))?;
    if let Some(dir) = target.parent() {
        std::fs::File::open(dir)
            .and_then(|f| f.sync_all())
            .map_err(io(format!("sync {}", dir.display())))?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod install_tests {
    use super::*;
    use crate::SqliteOptions;

    #[test]
    fn an_install_refuses_an_existing_file_unless_replacing_and_a_failed_one_leaves_it() {
        let dir = tempfile::tempdir().unwrap();
        let source = tests::filled(&dir.path().join("a.sqlite"));
        let image = source.transaction(|tx| tx.export_image()).unwrap();
        let target = dir.path().join("b.sqlite");
        install_image(&target, &image, false, SqliteOptions::default()).unwrap();
        let read = |p: &std::path::Path| {
            SqliteStorage::open(p, SqliteOptions::default())
                .unwrap()
                .transaction(|tx| tx.export_image())
                .unwrap()
        };
        assert_eq!(read(&target), image);
        let e = install_image(
            &target,
            &ObjectImage::default(),
            false,
            SqliteOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.code(), "IMAGE_TARGET_NOT_EMPTY");
        // A failing replacement (a duplicate key) leaves the file whole and
        // no temporary file behind.
        let mut broken = image.clone();
        let orders = broken
            .tables
            .iter_mut()
            .find(|t| t.name == "orders")
            .unwrap();
        orders.rows[1][0] = Value::Integer(1);
        let e = install_image(&target, &broken, true, SqliteOptions::default()).unwrap_err();
        assert_eq!(e.code(), "IMAGE_STORAGE");
        assert_eq!(read(&target), image);
        assert!(!dir.path().join("b.sqlite.import").exists());
        // A replacement over a database written since holds only the image.
        let open = SqliteStorage::open(&target, SqliteOptions::default()).unwrap();
        open.transaction(|tx| {
            tx.sql()
                .execute_batch("INSERT INTO orders VALUES (9, 1.0, 'late', NULL)")
                .map_err(|e| backend("t", e))
        })
        .unwrap();
        drop(open);
        install_image(
            &target,
            &ObjectImage::default(),
            true,
            SqliteOptions::default(),
        )
        .unwrap();
        let now = read(&target);
        assert!(now.table("orders").is_none(), "{now:?}");
    }
}
