//! Moving objects between object stores: listing a class's objects by
//! name prefix, exporting one object to a portable file, importing it into
//! another store (the SQLite directory ↔ PostgreSQL).
//!
//! # Listing
//!
//! [`ObjectQuery`] names a class, a name prefix, where to continue (the
//! last name of the previous page) and a page size (1..=[`MAX_LIST_LIMIT`]);
//! [`ObjectStore::list_class`] answers in bytewise name order on both
//! stores. An object id (`<storage id>:<class>:<name>`, the scheduler's)
//! gives its name back through [`ObjectKey::from_object_id`].
//!
//! # The move is fenced
//!
//! [`export_object`] takes the object over before it reads it: it raises
//! the object's own owner fence above every generation the fence holds
//! (read without the object's write lock on PostgreSQL),
//! to a claim of its own (task [`MOVER_TASK`]) for the object's scope,
//! exactly as a new owner does. From then on every commit of the
//! previous owners is refused by the fence (on PostgreSQL a holder paused
//! inside its transaction is ended), so a write that an owner
//! acknowledged was committed before the fence rose and is in the export,
//! and no owner that held the object before the export commits to it
//! afterwards. The snapshot is read in one transaction fenced at the
//! mover's claim. What the fence cannot stop is an owner claiming the
//! scope *later* from the old deployment's lease store (its generation is
//! above the mover's): the class must be drained from the old deployment
//! (its hosts stopped or reconfigured to the new store) before the move.
//! That is the operator's step, said in the CLI docs.
//!
//! # The export file
//!
//! Text, UTF-8, one JSON document per line:
//!
//! 1. the header: `{"format":"durability-object-export","version":1,
//!    "storage":…,"class":…,"name":…,"source":…,"fenced_generation":…}`;
//! 2. one line per table: `{"table":…,"columns":[[name,type,not_null],…],
//!    "key":[…],"rows":[[value,…],…]}`, values as `null`,
//!    `{"i":"<integer>"}` (a string: JSON numbers lose 64-bit integers),
//!    `{"r":<float>}`, `{"t":"<text>"}`, `{"b":"<hex>"}`;
//! 3. the trailer: `{"sha256":"<hex>"}`, the SHA-256 of every byte
//!    before it.
//!
//! Decoding is strict: a wrong checksum, another format or version, an
//! unknown field, a malformed value or a table that fails
//! [`ObjectImage::check`] is refused ([`MoveError::CorruptFile`],
//! [`MoveError::UnsupportedVersion`]) before anything is written.

use std::collections::BTreeMap;

use durability_ownership::{
    ClassName, Generation, LifecycleId, ObjectFence as _, ObjectName, OwnerRecord, OwnerScope,
    ShardCount, StorageId, TaskId,
};
use durability_scheduler::image::{Column, ColumnType, ImageError, ObjectImage, Table, Value};
use durability_scheduler::{Storage as _, StorageError};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::{ObjectKey, ObjectStore};

/// The most objects one listing page holds.
pub const MAX_LIST_LIMIT: usize = 1000;

/// The export file's format name.
pub const FORMAT: &str = "durability-object-export";

/// The export file's version this build writes and reads.
pub const VERSION: u32 = 1;

/// The task id of the mover's claim on the object's fence.
pub const MOVER_TASK: &str = "durability-mover";

/// Why listing, exporting or importing objects failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MoveError {
    /// An argument breaks its rule (nothing was read or written).
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// The argument.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The object to export is not stored.
    #[error("object {0} is not stored")]
    NotFound(String),
    /// The object's fence could not be raised to the mover's claim (a
    /// fence of another shard count, or a claim that raced the mover);
    /// nothing was exported.
    #[error("the object's fence refused the mover: {0}")]
    Fence(String),
    /// The export file is damaged or not an export (nothing was written).
    #[error("corrupt export file: {0}")]
    CorruptFile(String),
    /// The export file has another format version (nothing was written).
    #[error("export file version {found}, this build reads version {VERSION}")]
    UnsupportedVersion {
        /// The file's version.
        found: u32,
    },
    /// The object's state cannot be carried, or the target refused it.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl MoveError {
    fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            what,
            reason: reason.into(),
        }
    }
}

durability_time::error_codes! {
    MoveError {
        Self::InvalidInput { .. } => "move_invalid_input",
        Self::NotFound(_) => "move_not_found",
        Self::Fence(_) => "move_fence",
        Self::CorruptFile(_) => "move_corrupt_file",
        Self::UnsupportedVersion { .. } => "move_unsupported_version",
        Self::Image(_) => "move_image",
        Self::Storage(_) => "move_storage",
    }
}

/// One page request of [`ObjectStore::list_class`] (validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectQuery {
    class: String,
    prefix: String,
    after: Option<String>,
    limit: usize,
}

impl ObjectQuery {
    /// At most `limit` objects of `class` whose names start with `prefix`
    /// (empty: all), after the name `after`.
    ///
    /// # Errors
    /// [`MoveError::InvalidInput`]: a class outside the class grammar, a
    /// prefix over [`crate::MAX_OBJECT_NAME_BYTES`] or holding NUL, a
    /// cursor that is not an object name, a limit outside
    /// 1..=[`MAX_LIST_LIMIT`].
    pub fn new(
        class: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Self, MoveError> {
        ClassName::new(class).map_err(|e| MoveError::invalid("class", e.to_string()))?;
        if prefix.len() > crate::MAX_OBJECT_NAME_BYTES || prefix.contains('\0') {
            return Err(MoveError::invalid(
                "prefix",
                format!("at most {} bytes without NUL", crate::MAX_OBJECT_NAME_BYTES),
            ));
        }
        if let Some(after) = after {
            crate::validate_object_name(after)
                .map_err(|e| MoveError::invalid("cursor", e.to_string()))?;
        }
        if !(1..=MAX_LIST_LIMIT).contains(&limit) {
            return Err(MoveError::invalid(
                "limit",
                format!("{limit} is not in 1..={MAX_LIST_LIMIT}"),
            ));
        }
        Ok(Self {
            class: class.to_owned(),
            prefix: prefix.to_owned(),
            after: after.map(str::to_owned),
            limit,
        })
    }

    /// The class.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The name prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The last name of the previous page.
    pub fn after(&self) -> Option<&str> {
        self.after.as_deref()
    }

    /// The page size.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether `name` belongs to the query's range (prefix and cursor).
    pub fn admits(&self, name: &str) -> bool {
        name.starts_with(&self.prefix) && self.after.as_deref().is_none_or(|a| name > a)
    }
}

/// What an export file says about its object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportHeader {
    /// Always [`FORMAT`].
    pub format: String,
    /// The file's format version.
    pub version: u32,
    /// The storage id the object was exported from.
    pub storage: String,
    /// The object's class.
    pub class: String,
    /// The object's name.
    pub name: String,
    /// The store it was exported from (`sqlite` or `postgres`).
    pub source: String,
    /// The generation of the mover's claim the source object was fenced at.
    pub fenced_generation: u64,
}

/// One object exported: its header and its image.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// What the file says about its object.
    pub header: ExportHeader,
    /// The object's state.
    pub image: ObjectImage,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableLine {
    table: String,
    columns: Vec<(String, String, bool)>,
    key: Vec<String>,
    rows: Vec<Vec<Option<FileValue>>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
enum FileValue {
    #[serde(rename = "i")]
    Integer(String),
    #[serde(rename = "r")]
    Real(f64),
    #[serde(rename = "t")]
    Text(String),
    #[serde(rename = "b")]
    Blob(String),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Trailer {
    sha256: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn to_file(v: &Value) -> Option<FileValue> {
    match v {
        Value::Null => None,
        Value::Integer(i) => Some(FileValue::Integer(i.to_string())),
        Value::Real(f) => Some(FileValue::Real(*f)),
        Value::Text(t) => Some(FileValue::Text(t.clone())),
        Value::Blob(b) => Some(FileValue::Blob(hex(b))),
    }
}

fn from_file(v: Option<FileValue>) -> Result<Value, String> {
    Ok(match v {
        None => Value::Null,
        Some(FileValue::Integer(i)) => {
            Value::Integer(i.parse().map_err(|_| format!("integer {i:?}"))?)
        }
        Some(FileValue::Real(f)) => Value::Real(f),
        Some(FileValue::Text(t)) => Value::Text(t),
        Some(FileValue::Blob(b)) => Value::Blob(unhex(&b).ok_or_else(|| format!("blob {b:?}"))?),
    })
}

impl Export {
    /// The file's bytes (see the [module docs](self)).
    ///
    /// # Errors
    /// [`MoveError::Image`] for an image that fails its check.
    pub fn encode(&self) -> Result<Vec<u8>, MoveError> {
        self.image
            .check()
            .map_err(|e| MoveError::Image(ImageError::Invalid(e)))?;
        let json = |v: &dyn erased::Json| v.line();
        let mut out = json(&self.header);
        for t in &self.image.tables {
            out.push_str(&json(&TableLine {
                table: t.name.clone(),
                columns: t
                    .columns
                    .iter()
                    .map(|c| (c.name.clone(), c.ty.as_str().to_owned(), c.not_null))
                    .collect(),
                key: t.primary_key.clone(),
                rows: t
                    .rows
                    .iter()
                    .map(|r| r.iter().map(to_file).collect())
                    .collect(),
            }));
        }
        let sum = hex(&Sha256::digest(out.as_bytes()));
        out.push_str(&json(&Trailer { sha256: sum }));
        Ok(out.into_bytes())
    }

    /// Decodes an export file strictly (see the [module docs](self)).
    ///
    /// # Errors
    /// [`MoveError::CorruptFile`] or [`MoveError::UnsupportedVersion`].
    pub fn decode(bytes: &[u8]) -> Result<Self, MoveError> {
        let corrupt = |why: String| MoveError::CorruptFile(why);
        let text = std::str::from_utf8(bytes).map_err(|_| corrupt("not UTF-8".into()))?;
        let body_end = text
            .trim_end_matches('\n')
            .rfind('\n')
            .map(|i| i + 1)
            .ok_or_else(|| corrupt("no trailer".into()))?;
        let (body, trailer) = text.split_at(body_end);
        let trailer: Trailer = serde_json::from_str(trailer.trim_end_matches('\n'))
            .map_err(|e| corrupt(format!("the trailer: {e}")))?;
        if trailer.sha256 != hex(&Sha256::digest(body.as_bytes())) {
            return Err(corrupt("the checksum does not match the contents".into()));
        }
        let mut lines = body.lines();
        let first = lines.next().ok_or_else(|| corrupt("no header".into()))?;
        let probe: serde_json::Value =
            serde_json::from_str(first).map_err(|e| corrupt(format!("the header: {e}")))?;
        if probe.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(corrupt(format!("not a {FORMAT} file")));
        }
        let found = probe.get("version").and_then(serde_json::Value::as_u64);
        if found != Some(u64::from(VERSION)) {
            let found = found.and_then(|v| u32::try_from(v).ok()).unwrap_or(0);
            return Err(MoveError::UnsupportedVersion { found });
        }
        let header: ExportHeader =
            serde_json::from_str(first).map_err(|e| corrupt(format!("the header: {e}")))?;
        let mut tables = Vec::new();
        for (i, line) in lines.enumerate() {
            let t: TableLine =
                serde_json::from_str(line).map_err(|e| corrupt(format!("table line {i}: {e}")))?;
            let columns = t
                .columns
                .into_iter()
                .map(|(name, ty, not_null)| {
                    let ty = ColumnType::parse(&ty).ok_or_else(|| format!("column type {ty:?}"))?;
                    Ok(Column { name, ty, not_null })
                })
                .collect::<Result<Vec<_>, String>>()
                .map_err(corrupt)?;
            let rows = t
                .rows
                .into_iter()
                .map(|r| r.into_iter().map(from_file).collect())
                .collect::<Result<Vec<Vec<Value>>, String>>()
                .map_err(corrupt)?;
            tables.push(Table {
                name: t.table,
                columns,
                primary_key: t.key,
                rows,
            });
        }
        let image = ObjectImage { tables };
        image.check().map_err(corrupt)?;
        let key = ObjectKey {
            class: header.class.clone(),
            name: header.name.clone(),
        };
        check_object(&header.storage, &key).map_err(|e| corrupt(e.to_string()))?;
        Ok(Self { header, image })
    }
}

/// Serialising one line of the file.
mod erased {
    pub(super) trait Json {
        fn line(&self) -> String;
    }

    impl<T: serde::Serialize> Json for T {
        fn line(&self) -> String {
            // These types always serialise (no maps with non-string keys;
            // a non-finite float, refused by the image check, is `null`).
            let mut s = serde_json::to_string(self).unwrap_or_default();
            s.push('\n');
            s
        }
    }
}

/// Checks a storage id, class and object name.
fn check_object(storage: &str, object: &ObjectKey) -> Result<StorageId, MoveError> {
    let storage =
        StorageId::new(storage).map_err(|e| MoveError::invalid("storage id", e.to_string()))?;
    ClassName::new(&object.class).map_err(|e| MoveError::invalid("class", e.to_string()))?;
    crate::validate_object_name(&object.name)
        .map_err(|e| MoveError::invalid("name", e.to_string()))?;
    Ok(storage)
}

/// The mover's claim on `object`: for the scope its fence records (or,
/// never fenced, its scope under `shards`), one generation above the
/// highest the fence holds.
fn mover_claim(
    storage: &StorageId,
    object: &ObjectKey,
    shards: ShardCount,
    fences: &[(String, u64)],
) -> Result<OwnerRecord, MoveError> {
    let fail = |e: durability_ownership::OwnershipError| MoveError::Fence(e.to_string());
    let class = ClassName::new(&object.class).map_err(fail)?;
    let name = ObjectName::new(&object.name);
    let scope = OwnerScope::for_object(storage.clone(), class, &name, shards).map_err(fail)?;
    let mut generations: BTreeMap<&str, u64> = BTreeMap::new();
    for (s, g) in fences {
        generations.insert(s.as_str(), *g);
    }
    if let Some((other, _)) = generations.iter().find(|(s, _)| **s != scope.host_id()) {
        return Err(MoveError::Fence(format!(
            "the object is fenced for scope {other}, not {} (pass the deployment's shard count)",
            scope.host_id()
        )));
    }
    let next = generations.values().max().copied().unwrap_or(0) + 1;
    let generation = Generation::new(next).map_err(fail)?;
    let lifecycle = LifecycleId::new("durability-move").map_err(fail)?;
    let task = TaskId::new(MOVER_TASK).map_err(fail)?;
    Ok(OwnerRecord::new(scope, lifecycle, task, generation))
}

/// Exports `object` of `storage` from `store`, fenced (see the [module
/// docs](self)): the object's fence is raised to the mover's claim, then
/// its state is read in one transaction fenced at that claim. `shards` is
/// the deployment's shard count (used when the object was never fenced).
///
/// # Errors
/// [`MoveError::InvalidInput`], [`MoveError::NotFound`] (nothing is
/// created), [`MoveError::Fence`], [`MoveError::Image`] (not portable), or
/// a store failure.
pub async fn export_object<O: ObjectStore>(
    store: &O,
    storage: &str,
    object: &ObjectKey,
    shards: ShardCount,
) -> Result<Export, MoveError> {
    let storage_id = check_object(storage, object)?;
    let found = store
        .find(&storage_id, object)
        .await?
        .ok_or_else(|| MoveError::NotFound(object.object_id(&storage_id)))?;
    let fences = O::fences(&found)?;
    let claim = mover_claim(&storage_id, object, shards, &fences)?;
    found
        .fence_claim(&claim, None)
        .map_err(|e| MoveError::Fence(e.to_string()))?;
    let image = found.transaction(|tx| O::export_tx(tx))?;
    Ok(Export {
        header: ExportHeader {
            format: FORMAT.to_owned(),
            version: VERSION,
            storage: storage.to_owned(),
            class: object.class.clone(),
            name: object.name.clone(),
            source: O::KIND.to_owned(),
            fenced_generation: claim.generation().get(),
        },
        image,
    })
}

/// Imports `export` into `store` as its object under `storage` (the
/// file's storage id when `None`), crash-safe: the store writes all of it
/// or nothing. An object already stored is refused unless `replace`.
///
/// # Errors
/// [`MoveError::InvalidInput`], [`MoveError::Image`]
/// ([`ImageError::TargetNotEmpty`] for an existing object), or a store
/// failure; the target is untouched on every error.
pub async fn import_object<O: ObjectStore>(
    store: &O,
    export: &Export,
    storage: Option<&str>,
    replace: bool,
) -> Result<ObjectKey, MoveError> {
    let object = ObjectKey {
        class: export.header.class.clone(),
        name: export.header.name.clone(),
    };
    let storage_id = check_object(storage.unwrap_or(&export.header.storage), &object)?;
    if store.tombstone(&storage_id).is_some() {
        return Err(MoveError::invalid(
            "storage id",
            format!("{} is deleted", storage_id.as_str()),
        ));
    }
    store
        .import(&storage_id, &object, &export.image, replace)
        .await?;
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_move_error_code_is_listed() {
        for e in [
            MoveError::invalid("limit", ""),
            MoveError::NotFound(String::new()),
            MoveError::Fence(String::new()),
            MoveError::CorruptFile(String::new()),
            MoveError::UnsupportedVersion { found: 2 },
            MoveError::Image(ImageError::Invalid(String::new())),
            MoveError::Storage(StorageError::corrupt("x")),
        ] {
            assert!(MoveError::CODES.contains(&e.code()), "{}", e.code());
        }
    }
}
