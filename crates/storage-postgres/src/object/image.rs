//! One object as a backend-neutral image
//! ([`durability_scheduler::image`]), and back.
//!
//! Export ([`PostgresObjectTx::export_image`], inside one transaction: one
//! snapshot): the object's rows of the shared `durability_object_*`
//! tables by their portable names (without the `object_id` column; the
//! topology groups' `deleted` flag as 0 or 1; the topology writes in the
//! order of their ids), then every table of the object's own schema with
//! its columns' portable types (`bigint`, `integer`, `smallint` →
//! integer; `double precision`, `real` → real; `text`, `character
//! varying`, `character` → text; `bytea` → blob), `NOT NULL` and the
//! primary key. Strict: any other type, a column with a default, identity
//! or generation expression, an index other than the primary key's, a
//! constraint other than the primary key (`CHECK`, `UNIQUE`, foreign
//! keys), a trigger, a view, a sequence or any other relation refuses the
//! export ([`ImageError::NotPortable`]). The owner fence is not exported
//! ([`PostgresObjectTx::fences`] reads it).
//!
//! Import ([`PostgresObjects::import_image`]): one transaction, under the
//! storage id's tombstone lock (shared, as a first record): the object
//! is recorded, its own tables created and filled, its shared rows
//! inserted. An object already recorded is refused unless `replace`, which
//! deletes it first in the same transaction; any failure rolls all of it
//! back.

use durability_scheduler::StorageError;
use durability_scheduler::image::{
    self, CapabilityTable, Column, ColumnType, ImageError, ObjectImage, Table, Value,
};
use tokio_postgres::types::ToSql;

use super::PostgresObjects;
use super::admin::unquote;
use super::driver::Held;
use super::runtime::{blocking, wait};
use super::schema::{BUILTINS, quote};
use super::tx::PostgresObjectTx;

/// The shared table of a capability table, and whether it is ordered by
/// its key or by other columns.
/// The owner fence's rows of the object `$1`, by scope.
const READ_FENCES: &str = "SELECT scope, generation FROM {s}.durability_object_fences WHERE object_id = $1 ORDER BY scope";

/// Each fence row's scope and generation; a generation below 1 is `Corrupt`.
fn fence_rows(
    rows: &[tokio_postgres::Row],
    fail: impl Fn(tokio_postgres::Error) -> StorageError,
) -> Result<Vec<(String, u64)>, StorageError> {
    rows.iter()
        .map(|r| {
            let scope: String = r.try_get(0).map_err(&fail)?;
            let g: i64 = r.try_get(1).map_err(&fail)?;
            u64::try_from(g)
                .ok()
                .filter(|g| *g > 0)
                .map(|g| (scope.clone(), g))
                .ok_or_else(|| StorageError::corrupt(format!("fence {scope} at generation {g}")))
        })
        .collect()
}

impl super::PostgresObjectStorage {
    /// The owner fence's rows, as [`PostgresObjectTx::fences`], read outside
    /// any object transaction: no row lock is taken, so a holder paused inside
    /// a transaction on the object does not block the read. A mover reads the
    /// fence so, then raises it with a fence round, which ends such a holder.
    ///
    /// # Errors
    /// A backend failure, or a `Corrupt` error for a generation below 1.
    pub fn fences_unlocked(&self) -> Result<Vec<(String, u64)>, StorageError> {
        let sql = READ_FENCES.replace("{s}", &self.shared.s);
        let fail = |e| StorageError::backend("read the fence", e);
        blocking(|| {
            let held = Held(Some(self.shared.backend.client()?));
            let rows = wait(held.client().query(&sql, &[&self.object])).map_err(fail)?;
            held.release();
            fence_rows(&rows, fail)
        })
    }
}

fn physical(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
        "scheduler.schema" => ("durability_object_schema", "capability"),
        "scheduler.due" => ("durability_object_due", "capability"),
        "scheduler.alarm" => ("durability_object_alarm", "object_id"),
        "outbox.entries" => ("durability_object_outbox", "channel, key"),
        "outbox.version" => ("durability_object_outbox_version", "object_id"),
        "outbox.quarantine" => (
            "durability_object_outbox_quarantine",
            "channel, key, quarantined_at",
        ),
        "alarms.row" => ("durability_object_alarm_row", "object_id"),
        "topology.groups" => ("durability_object_topology_groups", "group_id"),
        "topology.states" => ("durability_object_topology_states", "group_id, channel"),
        "topology.writes" => ("durability_object_topology_writes", "id"),
        _ => return None,
    })
}

/// How a portable column is read from (and written to) a shared table.
fn read_expr(table: &str, column: &str) -> String {
    match (table, column) {
        ("topology.groups", "deleted") => "(CASE WHEN deleted THEN 1 ELSE 0 END)::int8".to_owned(),
        _ => quote(column),
    }
}

fn write_expr(table: &str, column: &str, n: usize) -> String {
    match (table, column) {
        ("topology.groups", "deleted") => format!("(${n}::int8 <> 0)"),
        _ => format!("${n}"),
    }
}

fn not_portable(what: String) -> ImageError {
    ImageError::NotPortable(what)
}

fn sql_type(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Integer => "BIGINT",
        ColumnType::Real => "DOUBLE PRECISION",
        ColumnType::Text => "TEXT",
        ColumnType::Blob => "BYTEA",
    }
}

/// The portable type of a column's `format_type`.
fn portable_type(formatted: &str) -> Option<ColumnType> {
    Some(match formatted {
        "bigint" | "integer" | "smallint" => ColumnType::Integer,
        "double precision" | "real" => ColumnType::Real,
        "text" => ColumnType::Text,
        t if t.starts_with("character varying") || t.starts_with("character(") => ColumnType::Text,
        "bytea" => ColumnType::Blob,
        _ => return None,
    })
}

/// A column read as its portable type (the cast makes every integer a
/// `bigint`, every text `text`).
fn select_expr(column: &Column) -> String {
    let cast = match column.ty {
        ColumnType::Integer => "int8",
        ColumnType::Real => "float8",
        ColumnType::Text => "text",
        ColumnType::Blob => "bytea",
    };
    format!("{}::{cast}", quote(&column.name))
}

/// Sorts as SQLite does: text bytewise, `NULL` first.
fn order_expr(column: &Column) -> String {
    match column.ty {
        ColumnType::Text => format!("{}::text COLLATE \"C\" NULLS FIRST", quote(&column.name)),
        _ => format!("{} NULLS FIRST", quote(&column.name)),
    }
}

fn decode(row: &tokio_postgres::Row, i: usize, c: &Column) -> Result<Value, tokio_postgres::Error> {
    Ok(match c.ty {
        ColumnType::Integer => row.try_get::<_, Option<i64>>(i)?.map(Value::Integer),
        ColumnType::Real => row.try_get::<_, Option<f64>>(i)?.map(Value::Real),
        ColumnType::Text => row.try_get::<_, Option<String>>(i)?.map(Value::Text),
        ColumnType::Blob => row.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Blob),
    }
    .unwrap_or(Value::Null))
}

/// A value as a parameter of its column's type (a `NULL` typed too).
fn param(c: &Column, v: &Value) -> Box<dyn ToSql + Sync + Send> {
    match (c.ty, v) {
        (_, Value::Integer(i)) => Box::new(Some(*i)),
        (_, Value::Real(f)) => Box::new(Some(*f)),
        (_, Value::Text(s)) => Box::new(Some(s.clone())),
        (_, Value::Blob(b)) => Box::new(Some(b.clone())),
        (ColumnType::Integer, Value::Null) => Box::new(None::<i64>),
        (ColumnType::Real, Value::Null) => Box::new(None::<f64>),
        (ColumnType::Text, Value::Null) => Box::new(None::<String>),
        (ColumnType::Blob, Value::Null) => Box::new(None::<Vec<u8>>),
    }
}

impl PostgresObjectTx<'_> {
    /// The rows of `sql` (`$1` the object id when `bind_object`).
    fn rows_of(
        &self,
        what: &str,
        sql: &str,
        columns: &[Column],
        bind_object: bool,
    ) -> Result<Vec<Vec<Value>>, ImageError> {
        let object: [&(dyn ToSql + Sync); 1] = [&self.object];
        let params: &[&(dyn ToSql + Sync)] = if bind_object { &object } else { &[] };
        let rows = self.wait(what, self.client.query(sql, params))?;
        rows.iter()
            .map(|row| {
                columns
                    .iter()
                    .enumerate()
                    .map(|(i, c)| decode(row, i, c).map_err(|e| self.fail(what, e).into()))
                    .collect()
            })
            .collect()
    }

    fn versions(&self) -> Result<std::collections::BTreeMap<String, u32>, ImageError> {
        let def = image::capability_table("scheduler.schema")
            .ok_or_else(|| ImageError::Invalid("no scheduler.schema".into()))?;
        let table = self.capability_rows(def)?;
        image::versions_of(&ObjectImage {
            tables: vec![table],
        })
        .map_err(|e| StorageError::corrupt(e.to_string()).into())
    }

    fn capability_rows(&self, def: &CapabilityTable) -> Result<Table, ImageError> {
        let (table, order) =
            physical(def.name).ok_or_else(|| not_portable(format!("no table for {}", def.name)))?;
        let cols: Vec<String> = def.names().map(|c| read_expr(def.name, c)).collect();
        let sql = format!(
            "SELECT {} FROM {}.{table} WHERE object_id = $1 ORDER BY {order}",
            cols.join(", "),
            self.s
        );
        let columns = def.columns();
        let rows = self.rows_of(&format!("read {table}"), &sql, &columns, true)?;
        Ok(Table {
            name: def.name.to_owned(),
            columns,
            primary_key: def.key.iter().map(|k| (*k).to_owned()).collect(),
            rows,
        })
    }

    /// The object's stored state as an image, read in this transaction
    /// (see the [module docs](self)).
    ///
    /// # Errors
    /// [`ImageError::NotPortable`] naming what cannot be carried, or a
    /// backend failure (the transaction is aborted).
    pub fn export_image(&self) -> Result<ObjectImage, ImageError> {
        let mut tables = Vec::new();
        let versions = self.versions()?;
        for def in image::tables_at(&versions) {
            tables.push(self.capability_rows(def)?);
        }
        for name in self.own_table_names()? {
            tables.push(self.own_table(&name)?);
        }
        Ok(ObjectImage { tables })
    }

    /// The own schema's tables, after refusing every relation, constraint
    /// and trigger the image cannot carry.
    fn own_table_names(&self) -> Result<Vec<String>, ImageError> {
        let schema = unquote(self.own_schema);
        let what = "list the object's relations";
        let rels = self.wait(
            what,
            self.client.query(
                "SELECT c.relname::text, c.relkind::text, COALESCE(i.indisprimary, false)
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             LEFT JOIN pg_index i ON i.indexrelid = c.oid
             WHERE n.nspname = $1 ORDER BY c.relname",
                &[&schema],
            ),
        )?;
        let mut tables = Vec::new();
        for r in rels {
            let (name, kind, primary): (String, String, bool) = (
                r.try_get(0).map_err(|e| self.fail(what, e))?,
                r.try_get(1).map_err(|e| self.fail(what, e))?,
                r.try_get(2).map_err(|e| self.fail(what, e))?,
            );
            match kind.as_str() {
                "r" => tables.push(name),
                "i" if primary => {}
                _ => return Err(not_portable(format!("the relation {name} (kind {kind})"))),
            }
        }
        let extra = self.wait(
            what,
            self.client.query(
                "SELECT con.conname::text FROM pg_constraint con
             JOIN pg_namespace n ON n.oid = con.connamespace
             WHERE n.nspname = $1 AND con.contype <> 'p'
             UNION ALL
             SELECT t.tgname::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND NOT t.tgisinternal",
                &[&schema],
            ),
        )?;
        if let Some(r) = extra.first() {
            let name: String = r.try_get(0).map_err(|e| self.fail(what, e))?;
            return Err(not_portable(format!("the constraint or trigger {name}")));
        }
        Ok(tables)
    }

    fn own_table(&self, name: &str) -> Result<Table, ImageError> {
        let schema = unquote(self.own_schema);
        let what = format!("read the columns of {name}");
        let cols = self.wait(
            &what,
            self.client.query(
                "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                    a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '',
                    COALESCE((SELECT k.n FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(att, n)
                              WHERE k.att = a.attnum), 0)::int8
             FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
             WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped
             ORDER BY a.attnum",
                &[&schema, &name],
            ),
        )?;
        let mut columns = Vec::new();
        let mut key: Vec<(i64, String)> = Vec::new();
        for r in cols {
            let get = |e| self.fail(&what, e);
            let col: String = r.try_get(0).map_err(get)?;
            let ty: String = r.try_get(1).map_err(get)?;
            let not_null: bool = r.try_get(2).map_err(get)?;
            let default: bool = r.try_get(3).map_err(get)?;
            let pk: i64 = r.try_get(4).map_err(get)?;
            let portable = portable_type(&ty)
                .ok_or_else(|| not_portable(format!("{name}.{col}: the type {ty}")))?;
            if default {
                return Err(not_portable(format!("{name}.{col}: a default or identity")));
            }
            if pk > 0 {
                key.push((pk, col.clone()));
            }
            columns.push(Column {
                name: col,
                ty: portable,
                not_null,
            });
        }
        key.sort();
        let primary_key: Vec<String> = key.into_iter().map(|(_, c)| c).collect();
        let order: Vec<String> = if primary_key.is_empty() {
            columns.iter().map(order_expr).collect()
        } else {
            primary_key
                .iter()
                .filter_map(|k| columns.iter().find(|c| &c.name == k))
                .map(order_expr)
                .collect()
        };
        let sql = format!(
            "SELECT {} FROM {}.{} ORDER BY {}",
            columns
                .iter()
                .map(select_expr)
                .collect::<Vec<_>>()
                .join(", "),
            self.own_schema,
            quote(name),
            order.join(", ")
        );
        let rows = self.rows_of(&what, &sql, &columns, false)?;
        Ok(Table {
            name: name.to_owned(),
            columns,
            primary_key,
            rows,
        })
    }

    /// The owner fence's rows of this object: each scope and the
    /// generation fenced. Empty when the object was never fenced.
    ///
    /// # Errors
    /// A backend failure, or a `Corrupt` error for a generation below 1.
    pub fn fences(&self) -> Result<Vec<(String, u64)>, StorageError> {
        let rows = self.rows("read the fence", READ_FENCES, &[])?;
        fence_rows(&rows, |e| self.fail("read the fence", e))
    }

    /// Inserts `rows` into `target` (`<table> (<columns>)`) as `exprs`;
    /// `$1` is the object id when `with_object`, the row's values follow.
    fn insert(
        &self,
        target: &str,
        exprs: &[String],
        table: &Table,
        with_object: bool,
    ) -> Result<(), ImageError> {
        let sql = format!("INSERT INTO {target} VALUES ({})", exprs.join(", "));
        let what = format!("write {}", table.name);
        let st = self.wait(&what, self.client.prepare(&sql))?;
        let columns = &table.columns;
        for row in &table.rows {
            let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
            if with_object {
                params.push(Box::new(self.object.to_owned()));
            }
            params.extend(columns.iter().zip(row).map(|(c, v)| param(c, v)));
            let refs: Vec<&(dyn ToSql + Sync)> = params
                .iter()
                .map(|p| p.as_ref() as &(dyn ToSql + Sync))
                .collect();
            self.wait(&what, self.client.execute(&st, &refs))?;
        }
        Ok(())
    }

    fn write_capability(&self, def: &CapabilityTable, table: &Table) -> Result<(), ImageError> {
        let (physical, _) = physical(def.name)
            .ok_or_else(|| ImageError::Invalid(format!("no table for {}", def.name)))?;
        let names: Vec<String> = def.names().map(quote).collect();
        let exprs: Vec<String> = std::iter::once("$1".to_owned())
            .chain(
                def.names()
                    .enumerate()
                    .map(|(i, c)| write_expr(def.name, c, i + 2)),
            )
            .collect();
        let target = format!("{}.{physical} (object_id, {})", self.s, names.join(", "));
        self.insert(&target, &exprs, table, true)
    }

    fn write_own(&self, table: &Table) -> Result<(), ImageError> {
        self.ensure_own_schema()?;
        let defs = table.definition(sql_type, quote);
        let t = format!("{}.{}", self.own_schema, quote(&table.name));
        self.wait(
            &format!("create {}", table.name),
            self.client
                .batch_execute(&format!("CREATE TABLE {t} ({})", defs)),
        )?;
        let names: Vec<String> = table.columns.iter().map(|c| quote(&c.name)).collect();
        let exprs: Vec<String> = (1..=table.columns.len()).map(|n| format!("${n}")).collect();
        self.insert(&format!("{t} ({})", names.join(", ")), &exprs, table, false)
    }
}

impl PostgresObjects {
    /// Whether `object_id` is recorded.
    ///
    /// # Errors
    /// A backend failure.
    pub fn is_recorded(&self, object_id: &str) -> Result<bool, StorageError> {
        let (ids, _) = self.list_objects(object_id, None, 1)?;
        Ok(ids.first().is_some_and(|id| id == object_id))
    }

    /// Records `object_id` of storage id `storage_id` holding `image`, in
    /// one transaction (see the [module docs](self)).
    ///
    /// # Errors
    /// [`ImageError::Invalid`] for an image that fails its check, names a
    /// capability version this deployment cannot hold, or a storage id
    /// that is tombstoned; [`ImageError::TargetNotEmpty`] when the object
    /// is recorded and `replace` is not set; a backend failure, or
    /// `Unknown` when the commit's outcome is unknown. Nothing is written
    /// on any error but `Unknown`.
    pub fn import_image(
        &self,
        object_id: &str,
        storage_id: &str,
        image: &ObjectImage,
        replace: bool,
    ) -> Result<(), ImageError> {
        durability_scheduler::ObjectId::new(object_id)
            .map_err(|e| ImageError::Invalid(e.to_string()))?;
        image.check().map_err(ImageError::Invalid)?;
        let versions = image::versions_of(image)?;
        for cap in image::PORTABLE_CAPABILITIES {
            let known = BUILTINS
                .iter()
                .find(|(n, _, _)| n == cap)
                .is_some_and(|(_, steps, _)| {
                    versions
                        .get(*cap)
                        .is_none_or(|v| steps.iter().any(|s| s.version == *v))
                });
            if !known {
                return Err(ImageError::Invalid(format!(
                    "{cap} at a schema version this deployment cannot hold"
                )));
            }
        }
        blocking(|| {
            let held = Held(Some(self.shared.backend.client()?));
            // On an error `held` is dropped: the connection closes and the
            // server rolls the transaction back.
            let seq = self.import_in(held.client(), object_id, storage_id, replace)?;
            let own = self.shared.deployment.object_schema(seq);
            let ready = std::sync::atomic::AtomicBool::new(false);
            let tx =
                PostgresObjectTx::new(held.client(), &self.shared.s, object_id, &own, &ready, None);
            for table in &image.tables {
                match image::capability_table(&table.name) {
                    Some(def) => tx.write_capability(def, table)?,
                    None => tx.write_own(table)?,
                }
            }
            drop(tx);
            super::commit::commit(held.client(), self.shared.options.commit_timeout)?;
            held.release();
            Ok(())
        })
    }

    /// `BEGIN`, the tombstone lock and check, the existing record deleted
    /// (with `replace`) or refused, the new record: its number.
    fn import_in(
        &self,
        client: &deadpool_postgres::Object,
        object_id: &str,
        storage_id: &str,
        replace: bool,
    ) -> Result<i64, ImageError> {
        let s = &self.shared.s;
        let ms = self.shared.options.lock_timeout.as_millis().max(1);
        let fail = |what: &'static str| move |e| StorageError::backend(what, e);
        wait(client.batch_execute(&format!("BEGIN; SET LOCAL lock_timeout = {ms}")))
            .map_err(fail("begin the import"))?;
        wait(client.execute(
            "SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))",
            &[&super::tombstone_lock_key(storage_id)],
        ))
        .map_err(fail("take the tombstone lock"))?;
        let tombstoned = wait(client.query_opt(
            &format!("SELECT 1 FROM {s}.durability_tombstones WHERE storage_id = $1"),
            &[&storage_id],
        ))
        .map_err(fail("read the tombstone"))?;
        if tombstoned.is_some() {
            return Err(ImageError::Invalid(format!(
                "storage id {storage_id:?} is deleted"
            )));
        }
        let recorded = wait(client.query_opt(
            &format!("SELECT 1 FROM {s}.durability_objects WHERE id = $1 FOR UPDATE"),
            &[&object_id],
        ))
        .map_err(fail("lock the object row"))?;
        if recorded.is_some() {
            if !replace {
                return Err(ImageError::TargetNotEmpty(format!(
                    "object {object_id} is recorded"
                )));
            }
            self.delete_locked(client, object_id)?;
        }
        let row = wait(client.query_one(
            &format!("INSERT INTO {s}.durability_objects (id) VALUES ($1) RETURNING seq"),
            &[&object_id],
        ))
        .map_err(fail("record the object"))?;
        Ok(row.try_get(0).map_err(fail("read the object number"))?)
    }
}
