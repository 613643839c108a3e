//! The router: routed reads and writes by key, with the mapping cache and
//! the write fence that refuses writes to a key that moved away.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use crate::clocks::Sightings;
use crate::config::{self, Check, MigrationConfig, Strategy, TableSpec};
use crate::dialect::{Dialect, Generation, Ident, JournalSql, names, row_idents};
use crate::error::{BackendError, DataRejected, MigrationError, Result, UniqueViolation};
use crate::journal::{MoveState, OpFilter, OpRecord};
use crate::mapping::MappingStore;
use crate::placement::{CachedManifest, Manifest, Placement};
use crate::republish::Home;
use crate::shard::{BatchSupport, Shard, Statement};
use crate::value::{Row, Value};
use durability_time::Clock;

/// Longest `moved_to` chain a read follows.
pub const MAX_CHAIN_HOPS: usize = 4;
const CACHE_CAPACITY: usize = 100_000;

type ColumnSet = Arc<BTreeSet<String>>;

/// A table's validated columns on a shard.
struct CachedColumns {
    cols: ColumnSet,
    /// The shard's schema version they were read at, when its dialect
    /// keeps one (SQLite) and a move read it.
    version: Option<i64>,
    /// When their read started, on the injected clock.
    read_ms: i64,
}

/// A live row of `durability_retired` for a key in a table on a shard: the
/// cutover tombstone of a move away from the shard (`moved_to`: where the
/// key went), or the in-flight marker of a move's copy on its destination
/// (`moved_to`: the move's source, where the key lives until the publish).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tombstone {
    pub(crate) op_id: String,
    pub(crate) moved_to: String,
    pub(crate) in_flight: bool,
}

/// Options of a routed read.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Return "not found" instead of `MIGRATION_LOOKUP_UNAVAILABLE` or
    /// `MIGRATION_CHAIN_EXCEEDED` when the tombstone chain cannot be followed.
    pub best_effort: bool,
}

#[derive(Debug, Clone)]
enum WriteKind {
    Insert(Row),
    Upsert(Row),
    Update(Row),
    Delete,
}

/// A client over a mapping store and named shards.
///
/// The process that moves a key routes it to its new shard at once (it
/// replaces its own cache entry). Other routers keep their cached entry for
/// up to the mapping cache TTL; their writes to the old shard are refused by
/// the tombstone fence there and re-routed, and their reads follow the
/// tombstone's `moved_to`.
///
/// # Example
///
/// Two routers (two processes, say) over the same shards and mapping
/// store. One moves a key; the other, with the old shard still cached,
/// writes to it and is re-routed, so the write lands on the new shard. A
/// verification pass then finds nothing left over, and the moved-away
/// copy is kept until its retention has passed.
///
/// ```
/// use std::sync::Arc;
/// use durability_migration::{MigrationConfig, Router, VerifyOptions, row};
/// use durability_storage_sqlite::migration::{SqliteMappingStore, SqliteShard};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let shard = || -> Result<Arc<SqliteShard>, Box<dyn std::error::Error + Send + Sync>> {
///     let s = SqliteShard::open_in_memory()?;
///     s.execute_sync("CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT)")?;
///     Ok(Arc::new(s))
/// };
/// let (east, west) = (shard()?, shard()?);
/// let mapping = Arc::new(SqliteMappingStore::open_in_memory()?);
/// let router = || {
///     Router::new(
///         MigrationConfig::new(mapping.clone())
///             .shard("east", east.clone())
///             .shard("west", west.clone())
///             .journal_shard("east")
///             .table("users"),
///     )
/// };
/// let (mover, other) = (router()?, router()?);
/// mover.init().await?;
/// mover.insert("user-1", "users", row([("name", "Ann")])).await?;
/// let from = other.route("user-1").await?.expect("mapped"); // now cached
/// let to = if from == "east" { "west" } else { "east" };
///
/// mover.reassign_shard("user-1", to, "users").await?;
/// // `other` still routes to `from`: the tombstone there re-routes it.
/// other.update("user-1", "users", row([("name", "Ann B.")])).await?;
/// let read = mover.get("user-1", "users").await?.expect("one live row");
/// assert_eq!(read.get("name").and_then(|v| v.as_text()), Some("Ann B."));
///
/// let report = mover.verify_migrations(VerifyOptions::default()).await?;
/// assert_eq!(report.ghost_count + report.dangling_count, 0);
/// let purge = mover.purge_retired().await?;
/// assert_eq!(purge.refused[0].error.code(), "RETENTION_NOT_ELAPSED");
/// # Ok(())
/// # }
/// ```
pub struct Router {
    pub(crate) core: Core,
}

/// The router's private core: its shards, mapping store, clock and caches,
/// with the configuration they run under. The modules (routing here,
/// `moves`, `recovery`, `verify`, `placement`, `reconcile`, `rebalance`,
/// ...) are functions over it; [`Router`]'s public methods (`api`)
/// delegate to them.
pub(crate) struct Core {
    pub(crate) shards: BTreeMap<String, Arc<dyn Shard>>,
    pub(crate) mapping: Arc<dyn MappingStore>,
    pub(crate) strategy: Strategy,
    pub(crate) journal: Option<String>,
    /// Reads follow tombstones and writes check fences only when a journal
    /// shard is set explicitly.
    pub(crate) fence_checks: bool,
    pub(crate) scope: String,
    pub(crate) ttl_ms: u64,
    pub(crate) tables: BTreeMap<String, TableSpec>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) coordinator: Option<Arc<dyn crate::ledger::AllocationLedger>>,
    pub(crate) placement: Placement,
    pub(crate) manifest_refresh_ms: u64,
    pub(crate) cutover_hold_ms: u64,
    schema_recheck_ms: u64,
    pub(crate) manifest: Mutex<Option<CachedManifest>>,
    pub(crate) instance: String,
    /// The configured clock domain (see [`MigrationConfig::clock_domain`]).
    pub(crate) clock_domain: Option<String>,
    /// Active operations owned outside this router's clock domain, as this
    /// router last saw their journal rows (by op id).
    pub(crate) liveness_seen: Sightings,
    /// The recovery lease of the scope, when held outside this router's
    /// clock domain, as this router last saw it.
    pub(crate) lease_seen: Sightings,
    /// Write holds of movers outside this router's clock domain, as this
    /// router last saw them (by key and op id).
    pub(crate) hold_seen: Sightings,
    /// Operations a task of this router is driving right now.
    pub(crate) running: Mutex<std::collections::HashSet<String>>,
    cache: Mutex<HashMap<String, (String, u64)>>,
    /// Validated columns per (shard, table).
    columns: Mutex<HashMap<(String, String), CachedColumns>>,
    disabled: Option<Check>,
}

/// What a routed write's zero-row result means (see `Router::zero_rows`).
#[derive(Debug, PartialEq, Eq)]
enum ZeroRows {
    /// No row matched: the result stands.
    Real,
    /// Write again on the same shard (`lifted`: a fence was lifted
    /// meanwhile, which is retried once).
    WriteAgain { lifted: bool },
    /// The key's move finished: write on this shard.
    MovedTo(String),
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.core.fmt(f)
    }
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("shards", &self.shards.keys().collect::<Vec<_>>())
            .field("journal", &self.journal)
            .field("scope", &self.scope)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// A walk over the journal's operations that a filter selects, one page
/// at a time in id order ([`Core::next_ops`]).
pub(crate) struct OpPages {
    filter: OpFilter,
    page: usize,
    after: String,
}

impl OpPages {
    /// From the first operation, `page` rows a page.
    pub(crate) fn new(filter: OpFilter, page: usize) -> Self {
        Self {
            filter,
            page,
            after: String::new(),
        }
    }
}

impl Core {
    /// See [`Router::new`].
    pub(crate) fn new(config: MigrationConfig) -> Result<Self> {
        let v = config::validate(&config)?;
        Ok(Self {
            shards: config.shards,
            mapping: config.mapping,
            strategy: config.strategy,
            journal: v.journal,
            fence_checks: config.journal_shard.is_some(),
            scope: config.journal_scope,
            ttl_ms: config.mapping_cache_ttl_ms,
            tables: v.tables,
            clock: config.clock,
            coordinator: config.coordinator,
            placement: config.placement,
            manifest_refresh_ms: config.manifest_refresh_ms,
            cutover_hold_ms: config.cutover_hold_ms,
            schema_recheck_ms: config.schema_recheck_ms,
            manifest: Mutex::new(None),
            instance: match &config.clock_domain {
                Some(d) => format!("{d}/{}", uuid::Uuid::now_v7()),
                None => uuid::Uuid::now_v7().to_string(),
            },
            clock_domain: config.clock_domain.clone(),
            liveness_seen: Sightings::default(),
            lease_seen: Sightings::default(),
            hold_seen: Sightings::default(),
            running: Mutex::new(std::collections::HashSet::new()),
            cache: Mutex::new(HashMap::new()),
            columns: Mutex::new(HashMap::new()),
            disabled: config.disabled,
        })
    }

    /// Whether safety check `c` runs (always, outside the model checker's
    /// proof that it would notice its absence).
    pub(crate) fn checks(&self, c: Check) -> bool {
        self.disabled != Some(c)
    }

    /// The configured shards on a proven dialect, by name.
    pub(crate) fn proven_shards(&self) -> impl Iterator<Item = (&String, &Arc<dyn Shard>)> {
        self.shards.iter().filter(|(_, s)| s.dialect().is_proven())
    }

    /// See [`Router::init`].
    pub(crate) async fn init(&self) -> Result<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        for (name, shard) in self.proven_shards() {
            let d = shard.dialect();
            execute_all(name, shard.as_ref(), &d.retired_schema()).await?;
            // A hold table created before holds named their mover gains
            // the columns.
            for (column, add) in d.hold_upgrade() {
                add_column(name, shard.as_ref(), names::HOLD, column, &add).await?;
            }
        }
        let (name, shard) = self.shard_named(j)?;
        let d = shard.dialect();
        execute_all(name, shard.as_ref(), &d.journal_schema()).await?;
        // A journal created before verification marks gains the column
        // (every finished operation then counts as unexamined).
        let (column, add) = d.journal_upgrade();
        add_column(name, shard.as_ref(), names::OPS, column, &add).await?;
        execute_all(name, shard.as_ref(), &d.journal_history_indexes()).await?;
        if self.computed() {
            self.init_placement().await?;
        }
        Ok(())
    }

    /// See [`Router::placement_mode`].
    pub(crate) fn placement_mode(&self) -> Placement {
        self.placement
    }

    /// See [`Router::journal_scope`].
    pub(crate) fn journal_scope(&self) -> &str {
        &self.scope
    }

    /// See [`Router::instance_id`].
    pub(crate) fn instance_id(&self) -> &str {
        &self.instance
    }

    /// See [`Router::shard_names`].
    pub(crate) fn shard_names(&self) -> Vec<&str> {
        self.shards.keys().map(String::as_str).collect()
    }

    pub(crate) fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    pub(crate) fn shard_named<'a>(
        &'a self,
        name: &'a str,
    ) -> Result<(&'a str, &'a Arc<dyn Shard>)> {
        self.shards
            .get_key_value(name)
            .map(|(k, v)| (k.as_str(), v))
            .ok_or_else(|| MigrationError::UnknownShard(name.to_owned()))
    }

    pub(crate) fn journal_shard(&self) -> Result<(&str, &Arc<dyn Shard>)> {
        let j = self
            .journal
            .as_deref()
            .ok_or(MigrationError::JournalNotConfigured)?;
        self.shard_named(j)
    }

    /// The journal shard (its name and itself) and the statements of this
    /// router's scope in its dialect.
    pub(crate) fn journal(&self) -> Result<(&str, &Arc<dyn Shard>, JournalSql<'_>)> {
        let (name, shard) = self.journal_shard()?;
        let q = JournalSql {
            d: shard.dialect(),
            scope: &self.scope,
        };
        Ok((name, shard, q))
    }

    /// Runs the query `stmt` builds on the journal shard.
    pub(crate) async fn journal_query(
        &self,
        stmt: impl FnOnce(&JournalSql<'_>) -> Statement,
    ) -> Result<Vec<Row>> {
        let (name, shard, q) = self.journal()?;
        shard
            .query(&stmt(&q))
            .await
            .map_err(|e| MigrationError::shard(name, e))
    }

    /// Executes the statement `stmt` builds on the journal shard (the rows
    /// it changed).
    pub(crate) async fn journal_execute(
        &self,
        stmt: impl FnOnce(&JournalSql<'_>) -> Statement,
    ) -> Result<u64> {
        let (name, shard, q) = self.journal()?;
        shard
            .execute(&stmt(&q))
            .await
            .map_err(|e| MigrationError::shard(name, e))
    }

    /// The next page of the journal's operations that `pages` walks, `None`
    /// after the last.
    pub(crate) async fn next_ops(&self, pages: &mut OpPages) -> Result<Option<Vec<Row>>> {
        let rows = self
            .journal_query(|q| q.ops_page(&pages.after, pages.page, pages.filter))
            .await?;
        let Some(last) = rows.last() else {
            return Ok(None);
        };
        pages.after = crate::journal::text(last, "op_id")?;
        Ok(Some(rows))
    }

    /// The journal's operations of `key`, newest first.
    pub(crate) async fn key_ops(&self, key: &str) -> Result<Vec<OpRecord>> {
        self.journal_query(|q| q.ops_for_key(key))
            .await?
            .iter()
            .map(OpRecord::from_row)
            .collect()
    }

    pub(crate) fn table(&self, table: &str) -> Result<&TableSpec> {
        self.tables
            .get(table)
            .ok_or_else(|| MigrationError::UnknownTable(table.chars().take(80).collect()))
    }

    /// A table named by a caller, configured or not: its key column is
    /// `key_column`, else the configured one, else `id`; both validated.
    pub(crate) fn table_spec_for(
        &self,
        table: &str,
        key_column: Option<&str>,
    ) -> Result<TableSpec> {
        let key_col = match key_column {
            Some(c) => Ident::new(c)?,
            None => match self.tables.get(table) {
                Some(spec) => spec.key_col.clone(),
                None => Ident::new(config::DEFAULT_KEY_COLUMN)?,
            },
        };
        Ok(TableSpec {
            name: Ident::new(table)?,
            key_col,
        })
    }

    /// The configured shard `name`, refused unless its dialect is proven.
    pub(crate) fn proven_shard<'a>(
        &'a self,
        name: &'a str,
    ) -> Result<(&'a str, &'a Arc<dyn Shard>)> {
        let (name, shard) = self.shard_named(name)?;
        let d = shard.dialect();
        if !d.is_proven() {
            return Err(MigrationError::UnsupportedDialect {
                shard: name.to_owned(),
                dialect: d.name().to_owned(),
            });
        }
        Ok((name, shard))
    }

    /// Refuses a shard that cannot take part in a move.
    pub(crate) fn check_movable<'a>(&'a self, name: &'a str) -> Result<&'a Arc<dyn Shard>> {
        let (_, shard) = self.proven_shard(name)?;
        match shard.batch_support() {
            BatchSupport::None => Err(MigrationError::NoBatch(name.to_owned())),
            BatchSupport::NonAtomic => Err(MigrationError::NoAtomicBatch(name.to_owned())),
            BatchSupport::Atomic => Ok(shard),
        }
    }

    /// The columns of a table on a shard, validated once (the key column
    /// exists and compares bytes) and then cached until
    /// [`forget_columns`](Self::forget_columns): a row check that misses
    /// re-reads them, and a move re-validates them (see
    /// [`columns_fresh`](Self::columns_fresh)).
    pub(crate) async fn columns(
        &self,
        shard_name: &str,
        spec: &TableSpec,
    ) -> Result<Arc<BTreeSet<String>>> {
        let cache_key = (shard_name.to_owned(), spec.name.as_str().to_owned());
        if let Some(c) = self
            .columns
            .lock()
            .ok()
            .and_then(|m| m.get(&cache_key).map(|c| Arc::clone(&c.cols)))
        {
            return Ok(c);
        }
        let read_ms = self.now();
        let (name, shard) = self.shard_named(shard_name)?;
        let rows = shard
            .query(&shard.dialect().columns_query(&spec.name))
            .await
            .map_err(|e| MigrationError::shard(name, e))?;
        let cols: BTreeSet<String> = rows
            .iter()
            .filter_map(|r| r.get("name").and_then(Value::as_text).map(str::to_owned))
            .collect();
        if cols.is_empty() {
            return Err(MigrationError::UnknownTable(spec.name.as_str().to_owned()));
        }
        if !cols.contains(spec.key_col.as_str()) {
            return Err(MigrationError::UnknownKeyColumn {
                table: spec.name.as_str().to_owned(),
                column: spec.key_col.as_str().to_owned(),
            });
        }
        self.check_key_bytewise(name, shard.as_ref(), spec, &rows)
            .await?;
        let cols = Arc::new(cols);
        if let Ok(mut m) = self.columns.lock() {
            m.insert(
                cache_key,
                CachedColumns {
                    cols: Arc::clone(&cols),
                    version: None,
                    read_ms,
                },
            );
        }
        Ok(cols)
    }

    /// Refuses a key column whose equality is coarser than bytes on its
    /// shard (`KEY_COLUMN_NOT_BYTEWISE`, naming the column and the fix).
    /// `columns`: the rows of the table's columns query.
    async fn check_key_bytewise(
        &self,
        name: &str,
        shard: &dyn Shard,
        spec: &TableSpec,
        columns: &[Row],
    ) -> Result<()> {
        let d = shard.dialect();
        if !d.is_proven() {
            return Ok(());
        }
        let rows = if d.columns_describe_collation() {
            // The key column's row of the columns query describes it.
            columns
                .iter()
                .filter(|r| r.get("name").and_then(Value::as_text) == Some(spec.key_col.as_str()))
                .cloned()
                .collect()
        } else {
            shard
                .query(&d.key_collation_query(&spec.name, &spec.key_col))
                .await
                .map_err(|e| MigrationError::shard(name, e))?
        };
        let refuse = |collation: String, fix: &str| MigrationError::KeyColumnNotBytewise {
            table: spec.name.as_str().to_owned(),
            column: spec.key_col.as_str().to_owned(),
            collation,
            fix: fix.to_owned(),
        };
        let text = |r: &Row, c: &str| match r.get(c) {
            Some(Value::Text(t)) => Some(t.clone()),
            Some(Value::Blob(b)) => String::from_utf8(b.clone()).ok(),
            _ => None,
        };
        const SQLITE_FIX: &str = "declare the key column COLLATE BINARY (the default)";
        for r in &rows {
            match d {
                Dialect::Sqlite => {
                    if let Some(c) = text(r, "coll").filter(|c| !c.eq_ignore_ascii_case("BINARY")) {
                        return Err(refuse(c, SQLITE_FIX));
                    }
                    if let Some(c) = text(r, "sql")
                        .and_then(|sql| sqlite_declared_collation(&sql, spec.key_col.as_str()))
                        .filter(|c| !c.eq_ignore_ascii_case("BINARY"))
                    {
                        return Err(refuse(c, SQLITE_FIX));
                    }
                }
                Dialect::Postgres => {
                    let ty = text(r, "ty").unwrap_or_default();
                    if ty == "citext" {
                        return Err(refuse(
                            ty,
                            "use text (or varchar) with a deterministic collation such as \"C\"",
                        ));
                    }
                    if r.get("det") == Some(&Value::Integer(0)) {
                        return Err(refuse(
                            format!("a nondeterministic collation ({ty})"),
                            "declare the key column COLLATE \"C\" (or another deterministic collation)",
                        ));
                    }
                }
                Dialect::MySql => {
                    if let Some(c) = text(r, "collation") {
                        let lc = c.to_ascii_lowercase();
                        if !(lc == "binary"
                            || lc.ends_with("_nopad_bin")
                            || lc.ends_with("_0900_bin"))
                        {
                            return Err(refuse(
                                c,
                                "declare the key column VARBINARY, or with a NO PAD binary collation \
                                 such as utf8mb4_nopad_bin (utf8mb4_bin and the _ci collations ignore \
                                 trailing spaces or case)",
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Drops the cached columns of `spec` on `shard_name`: the next use
    /// reads and validates them again.
    pub(crate) fn forget_columns(&self, shard_name: &str, spec: &TableSpec) {
        if let Ok(mut m) = self.columns.lock() {
            m.remove(&(shard_name.to_owned(), spec.name.as_str().to_owned()));
        }
    }

    /// The columns of `spec` on `shard_name` as a move sees them: validated
    /// again when the shard's schema version changed since (SQLite), or
    /// when their validation is older than `schema_recheck_ms` (dialects
    /// with no schema version), so a column or collation changed since
    /// first use is seen.
    pub(crate) async fn columns_fresh(
        &self,
        shard_name: &str,
        spec: &TableSpec,
    ) -> Result<Arc<BTreeSet<String>>> {
        let version = self.schema_version(shard_name).await?;
        let now = self.now();
        let window = i64::try_from(self.schema_recheck_ms).unwrap_or(i64::MAX);
        let cache_key = (shard_name.to_owned(), spec.name.as_str().to_owned());
        if let Some(c) = self.columns.lock().ok().and_then(|m| {
            m.get(&cache_key)
                .filter(|c| match version {
                    // The shard's schema is unchanged since they were validated.
                    Some(v) => c.version == Some(v),
                    None => now.saturating_sub(c.read_ms) < window,
                })
                .map(|c| Arc::clone(&c.cols))
        }) {
            return Ok(c);
        }
        self.forget_columns(shard_name, spec);
        let cols = self.columns(shard_name, spec).await?;
        if let (Some(v), Ok(mut m)) = (version, self.columns.lock())
            && let Some(entry) = m.get_mut(&cache_key)
        {
            // Read before the columns: a schema change in between makes
            // the next fresh read see another version and read again.
            entry.version = Some(v);
        }
        Ok(cols)
    }

    /// The shard's schema version when its dialect keeps one that changes
    /// with every schema change (SQLite's schema cookie), else `None`.
    async fn schema_version(&self, shard_name: &str) -> Result<Option<i64>> {
        let (name, shard) = self.shard_named(shard_name)?;
        let Some(q) = shard.dialect().schema_version_query() else {
            return Ok(None);
        };
        let rows = shard
            .query(&q)
            .await
            .map_err(|e| MigrationError::shard(name, e))?;
        match rows.first().and_then(|r| r.get("schema_version")) {
            Some(Value::Integer(v)) => Ok(Some(*v)),
            other => Err(MigrationError::shard(
                name,
                format!("unexpected schema version {other:?}").into(),
            )),
        }
    }

    /// Refuses a row naming a column `spec`'s table on `shard_name` does
    /// not have (`UNKNOWN_COLUMN`). A column missing from the cached set is
    /// looked up once more on the shard before the refusal: a column added
    /// since this router first used the table is written, not refused.
    async fn check_row(&self, shard_name: &str, spec: &TableSpec, row: &Row) -> Result<()> {
        for c in row.keys() {
            Ident::new(c)?;
        }
        let mut cols = self.columns(shard_name, spec).await?;
        if row.keys().any(|c| !cols.contains(c)) {
            self.forget_columns(shard_name, spec);
            cols = self.columns(shard_name, spec).await?;
        }
        match row.keys().find(|c| !cols.contains(*c)) {
            Some(c) => Err(MigrationError::UnknownColumn {
                table: spec.name.as_str().to_owned(),
                column: c.clone(),
            }),
            None => Ok(()),
        }
    }

    // ---- mapping and cache ----

    fn cache_get(&self, key: &str) -> Option<String> {
        if self.ttl_ms == 0 {
            return None;
        }
        let now = self.clock.now_ms_u64();
        let m = self.cache.lock().ok()?;
        m.get(key)
            .filter(|(_, exp)| *exp > now)
            .map(|(s, _)| s.clone())
    }

    /// Maps `key` to `shard` in the mapping store unless it is mapped
    /// already, and caches and returns the shard that holds it (`shard`, or
    /// the one a concurrent writer put first).
    pub(crate) async fn map_if_absent(&self, key: &str, shard: &str) -> Result<String> {
        let holder = self
            .mapping
            .put_if_absent(key, shard)
            .await
            .map_err(MigrationError::MappingUnavailable)?;
        self.cache_set(key, &holder);
        Ok(holder)
    }

    pub(crate) fn cache_set(&self, key: &str, shard: &str) {
        if self.ttl_ms == 0 {
            return;
        }
        let exp = self.clock.now_ms_u64().saturating_add(self.ttl_ms);
        if let Ok(mut m) = self.cache.lock() {
            if m.len() >= CACHE_CAPACITY {
                m.clear();
            }
            m.insert(key.to_owned(), (shard.to_owned(), exp));
        }
    }

    pub(crate) fn clear_mapping_cache(&self) {
        if let Ok(mut m) = self.cache.lock() {
            m.clear();
        }
    }

    /// See [`Router::invalidate`].
    pub(crate) fn invalidate(&self, key: &str) {
        if let Ok(mut m) = self.cache.lock() {
            m.remove(key);
        }
    }

    pub(crate) async fn mapping_fresh(&self, key: &str) -> Result<Option<String>> {
        let m = self
            .mapping
            .get(key)
            .await
            .map_err(MigrationError::MappingUnavailable)?;
        match &m {
            Some(s) => self.cache_set(key, s),
            None => self.invalidate(key),
        }
        Ok(m)
    }

    /// See [`Router::route`].
    pub(crate) async fn route(&self, key: &str) -> Result<Option<String>> {
        config::validate_key(key)?;
        if let Some(s) = self.cache_get(key) {
            return Ok(Some(s));
        }
        self.mapping_fresh(key).await
    }

    /// See [`Router::placement`].
    pub(crate) fn placement(&self, key: &str) -> Option<String> {
        match self.strategy {
            Strategy::Hash => config::hash_owner(key, &self.shard_names()).map(str::to_owned),
        }
    }

    /// See [`Router::computed_owner`].
    pub(crate) fn computed_owner(&self, key: &str) -> Option<String> {
        if !self.computed() {
            return None;
        }
        let g = self.manifest.lock().ok()?;
        g.as_ref()?.manifest.owner(key).map(str::to_owned)
    }

    /// The key's shard: its mapping, else (mapped placement with a
    /// journal) the target of the journal's newest finished move of the key,
    /// published again (its mapping was lost), else nothing.
    ///
    /// # Errors
    /// `MIGRATION_CUTOVER_PENDING` when the key has no mapping and a move of
    /// it is active; `MIGRATION_LOOKUP_UNAVAILABLE` when the journal cannot
    /// be read; `MAPPING_UNAVAILABLE`.
    async fn route_healed(&self, key: &str) -> Result<Option<String>> {
        if let Some(s) = self.route(key).await? {
            return Ok(Some(s));
        }
        match self.heal_unmapped_or_lookup(key).await? {
            Home::At { target, .. } => Ok(Some(target)),
            Home::Pending { .. } => Err(MigrationError::CutoverPending {
                key: key.to_owned(),
            }),
            Home::Unknown => Ok(None),
        }
    }

    async fn heal_unmapped_or_lookup(&self, key: &str) -> Result<Home> {
        match self.heal_unmapped(key).await {
            Err(e @ MigrationError::MappingUnavailable(_)) => Err(e),
            Err(e) => Err(MigrationError::LookupUnavailable {
                key: key.to_owned(),
                reason: format!("the journal could not be read for a key with no mapping: {e}"),
            }),
            ok => ok,
        }
    }

    async fn route_or_allocate(&self, key: &str) -> Result<String> {
        if let Some(s) = self.route_healed(key).await? {
            return Ok(s);
        }
        let placed = self
            .placement(key)
            .ok_or_else(|| MigrationError::InvalidConfig("no shards".into()))?;
        self.map_if_absent(key, &placed).await
    }

    // ---- reads ----

    /// See [`Router::get`].
    pub(crate) async fn get(&self, key: &str, table: &str) -> Result<Option<Row>> {
        self.get_with(key, table, ReadOptions::default()).await
    }

    /// See [`Router::get_with`].
    pub(crate) async fn get_with(
        &self,
        key: &str,
        table: &str,
        opts: ReadOptions,
    ) -> Result<Option<Row>> {
        config::validate_key(key)?;
        let spec = self.table(table)?.clone();
        let routed = match self.route(key).await {
            // Computed placement reads on when the mapping store fails: a
            // moved key's computed owner holds a tombstone naming its shard,
            // and a key placed under an older epoch is found by its owner.
            Err(e @ MigrationError::MappingUnavailable(_)) if self.computed() => {
                tracing::debug!(
                    event = "durability.migration.read_without_mapping",
                    error = %e,
                    key,
                    "mapping store unavailable; reading by computed placement"
                );
                None
            }
            r => r?,
        };
        if let Some(start) = routed {
            return self.read_chain(key, &spec, start, opts).await;
        }
        if !self.computed() {
            // A key with no mapping that the journal moved lost its
            // mapping: read where the journal says it lives (an active
            // move's source, whose tombstone leads on after its cutover).
            let start = match self.heal_unmapped_or_lookup(key).await {
                Ok(Home::At { target, .. }) => target,
                Ok(Home::Pending { source, .. }) => source,
                Ok(Home::Unknown) => return Ok(None),
                Err(e @ MigrationError::LookupUnavailable { .. }) if opts.best_effort => {
                    tracing::debug!(
                        event = "durability.migration.read_best_effort",
                        code = e.code(),
                        key,
                        "journal unreadable for an unmapped key; best-effort read returns nothing"
                    );
                    return Ok(None);
                }
                Err(e) => return Err(e),
            };
            return self.read_chain(key, &spec, start, opts).await;
        }
        // Computed placement: the newest owner, then older epochs' owners,
        // one query each; a hit through an older epoch is recorded as a
        // placement exception.
        let m = self.manifest().await?;
        for (i, (epoch, start)) in m.candidates(key).into_iter().enumerate() {
            if let Some(r) = self.read_chain(key, &spec, start.clone(), opts).await? {
                if i > 0 {
                    self.note_found(&m, key, &start, epoch).await;
                }
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    /// Reads the key's row on `shard_name`, following tombstones.
    ///
    /// A row under an in-flight marker (a move's destination copy before
    /// its publish) is skipped and the marker's `moved_to` (the move's
    /// source) followed, unless the read arrived by following the cutover
    /// tombstone of the marker's own operation: then the source was cut
    /// over and the copy is the key's row.
    async fn read_chain(
        &self,
        key: &str,
        spec: &TableSpec,
        mut shard_name: String,
        opts: ReadOptions,
    ) -> Result<Option<Row>> {
        // (shard, the operation whose tombstone led there).
        let mut visited: BTreeSet<(String, Option<String>)> = BTreeSet::new();
        let mut via: Option<String> = None;
        loop {
            visited.insert((shard_name.clone(), via.clone()));
            let (name, shard) = self.shard_named(&shard_name)?;
            let d = shard.dialect();
            let rows = if d.is_proven() {
                // Validates the table on first use (cached): a key column
                // compared more coarsely than bytes is refused.
                self.columns(name, spec).await?;
                let st = d.select_row_routed(&spec.name, &spec.key_col, key, via.as_deref());
                match shard.query(&st).await {
                    Ok(rows) => rows,
                    Err(e) => {
                        // The table reads but the marker lookup failed: whether
                        // a row there is the key's cannot be told.
                        let plain = d.select_row(&spec.name, &spec.key_col, key);
                        if shard.query(&plain).await.is_err() {
                            return Err(MigrationError::shard(name, e));
                        }
                        let e = MigrationError::LookupUnavailable {
                            key: key.to_owned(),
                            reason: format!("in-flight marker lookup failed: {e}"),
                        };
                        if opts.best_effort {
                            tracing::debug!(
                                event = "durability.migration.read_best_effort",
                                code = e.code(),
                                key,
                                "marker lookup failed; best-effort read returns nothing"
                            );
                            return Ok(None);
                        }
                        return Err(e);
                    }
                }
            } else {
                shard
                    .query(&d.select_row(&spec.name, &spec.key_col, key))
                    .await
                    .map_err(|e| MigrationError::shard(name, e))?
            };
            if let Some(r) = rows.into_iter().next() {
                return Ok(Some(r));
            }
            if !self.fence_checks || !d.is_proven() {
                return Ok(None);
            }
            let next = match self.tombstone(&shard_name, &spec.name, key).await {
                Ok(None) => return Ok(None),
                Ok(Some(t)) => {
                    // A cutover tombstone leads to its operation's copy; an
                    // in-flight marker leads back to the move's source.
                    let next_via = (!t.in_flight).then(|| t.op_id.clone());
                    if !self.shards.contains_key(&t.moved_to) {
                        Err(MigrationError::LookupUnavailable {
                            key: key.to_owned(),
                            reason: format!("tombstone names unconfigured shard {:?}", t.moved_to),
                        })
                    } else if visited.contains(&(t.moved_to.clone(), next_via.clone()))
                        || visited.len() > MAX_CHAIN_HOPS
                    {
                        Err(MigrationError::ChainExceeded {
                            key: key.to_owned(),
                        })
                    } else {
                        Ok((t.moved_to, next_via))
                    }
                }
                Err(e) => Err(MigrationError::LookupUnavailable {
                    key: key.to_owned(),
                    reason: e.to_string(),
                }),
            };
            match next {
                Ok((n, v)) => {
                    shard_name = n;
                    via = v;
                }
                Err(e) if opts.best_effort => {
                    tracing::debug!(
                        event = "durability.migration.read_best_effort",
                        code = e.code(),
                        key,
                        "tombstone chain unreadable; best-effort read returns nothing"
                    );
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The newest live tombstone of the key in the table on a shard (or
    /// the in-flight marker of a move's copy there).
    pub(crate) async fn tombstone(
        &self,
        shard_name: &str,
        table: &Ident,
        key: &str,
    ) -> Result<Option<Tombstone>> {
        let rows = self
            .shard_query(shard_name, |d| d.tombstone_query(table, key))
            .await?;
        match rows.first() {
            None => Ok(None),
            Some(r) => Ok(Some(Tombstone {
                op_id: crate::journal::text(r, "op_id")?,
                moved_to: crate::journal::text(r, "moved_to")?,
                in_flight: crate::journal::text(r, "digest")? == names::IN_FLIGHT,
            })),
        }
    }

    /// The key's row in `spec`'s table on `shard_name` (a plain read: no
    /// fence or marker is consulted).
    pub(crate) async fn read_row(
        &self,
        (shard_name, spec): (&str, &TableSpec),
        key: &str,
    ) -> Result<Option<Row>> {
        let row = |d: &Dialect| d.select_row(&spec.name, &spec.key_col, key);
        Ok(self.shard_query(shard_name, row).await?.into_iter().next())
    }

    /// Runs the query `stmt` builds in the dialect of the shard named
    /// `shard_name`.
    pub(crate) async fn shard_query(
        &self,
        shard_name: &str,
        stmt: impl FnOnce(&Dialect) -> Statement,
    ) -> Result<Vec<Row>> {
        let (name, shard) = self.shard_named(shard_name)?;
        shard
            .query(&stmt(&shard.dialect()))
            .await
            .map_err(|e| MigrationError::shard(name, e))
    }

    /// Whether the shard holds a lifted (superseded) fence of the key.
    async fn lifted_fence(&self, shard_name: &str, table: &Ident, key: &str) -> Result<bool> {
        let rows = self
            .shard_query(shard_name, |d| d.lifted_fence_query(table, key))
            .await?;
        Ok(!rows.is_empty())
    }

    pub(crate) async fn load_op(&self, op_id: &str) -> Result<Option<OpRecord>> {
        let rows = self.journal_query(|q| q.load_op(op_id)).await?;
        rows.first().map(OpRecord::from_row).transpose()
    }

    // ---- writes ----

    /// See [`Router::insert`].
    pub(crate) async fn insert(&self, key: &str, table: &str, row: Row) -> Result<u64> {
        self.write(key, table, WriteKind::Insert(row)).await
    }

    /// See [`Router::upsert`].
    pub(crate) async fn upsert(&self, key: &str, table: &str, row: Row) -> Result<u64> {
        self.write(key, table, WriteKind::Upsert(row)).await
    }

    /// See [`Router::update`].
    pub(crate) async fn update(&self, key: &str, table: &str, changes: Row) -> Result<u64> {
        self.write(key, table, WriteKind::Update(changes)).await
    }

    /// See [`Router::delete`].
    pub(crate) async fn delete(&self, key: &str, table: &str) -> Result<u64> {
        self.write(key, table, WriteKind::Delete).await
    }

    /// Where a routed write goes under mapped placement: its mapping, or for
    /// an insert or upsert a new allocation (after validating the row
    /// against the shard it would land on). `None`: an update or delete of a
    /// key with no mapping (nothing to change, nothing allocated).
    async fn mapped_write_shard(
        &self,
        key: &str,
        spec: &TableSpec,
        kind: &WriteKind,
    ) -> Result<Option<String>> {
        let spec = spec.clone();
        Ok(Some(match kind {
            WriteKind::Insert(r) | WriteKind::Upsert(r) => {
                // Validate against the shard the key would land on before
                // allocating anything.
                let candidate = match self.route_healed(key).await? {
                    Some(s) => s,
                    None => self
                        .placement(key)
                        .ok_or_else(|| MigrationError::InvalidConfig("no shards".into()))?,
                };
                self.check_row(&candidate, &spec, r).await?;
                self.route_or_allocate(key).await?
            }
            WriteKind::Update(r) => match self.route_healed(key).await? {
                Some(s) => {
                    self.check_row(&s, &spec, r).await?;
                    s
                }
                None => {
                    for c in r.keys() {
                        Ident::new(c)?;
                    }
                    return Ok(None);
                }
            },
            WriteKind::Delete => match self.route_healed(key).await? {
                Some(s) => s,
                None => return Ok(None),
            },
        }))
    }

    async fn write(&self, key: &str, table: &str, kind: WriteKind) -> Result<u64> {
        config::validate_key(key)?;
        let spec = self.table(table)?.clone();
        let kind = match kind {
            WriteKind::Insert(mut r) => {
                r.insert(
                    spec.key_col.as_str().to_owned(),
                    Value::Text(key.to_owned()),
                );
                WriteKind::Insert(r)
            }
            WriteKind::Upsert(mut r) => {
                r.insert(
                    spec.key_col.as_str().to_owned(),
                    Value::Text(key.to_owned()),
                );
                WriteKind::Upsert(r)
            }
            WriteKind::Update(r) => {
                if r.is_empty() || r.contains_key(spec.key_col.as_str()) {
                    return Err(MigrationError::UnknownColumn {
                        table: table.to_owned(),
                        column: spec.key_col.as_str().to_owned(),
                    });
                }
                WriteKind::Update(r)
            }
            WriteKind::Delete => WriteKind::Delete,
        };
        let mut manifest: Option<Arc<Manifest>> = None;
        let mut shard_name = if self.computed() {
            // Computed placement: a fresh manifest, then the mapping, the
            // shard that holds the row, or the newest owner. Nothing is
            // allocated.
            let m = self.manifest_for_write().await?;
            let s = self.locate_for_write(&m, key, &spec).await?;
            manifest = Some(m);
            s
        } else {
            match self.mapped_write_shard(key, &spec, &kind).await? {
                Some(s) => s,
                None => return Ok(0),
            }
        };
        let mut retried = false;
        let mut reloaded = false;
        for _ in 0..=MAX_CHAIN_HOPS {
            match &kind {
                WriteKind::Insert(r) | WriteKind::Upsert(r) | WriteKind::Update(r) => {
                    self.check_row(&shard_name, &spec, r).await?;
                }
                WriteKind::Delete => {
                    self.columns(&shard_name, &spec).await?;
                }
            }
            let (name, shard) = self.shard_named(&shard_name)?;
            let d = shard.dialect();
            let generation = manifest.as_ref().map(|m| m.generation);
            let g = generation.map(|generation| Generation {
                scope: &self.scope,
                generation,
            });
            let st = match &kind {
                WriteKind::Insert(r) | WriteKind::Upsert(r) => {
                    let up = matches!(kind, WriteKind::Upsert(_)).then_some(&spec.key_col);
                    d.guarded_insert(&spec.name, key, &row_idents(r)?, up, g, Some(&self.scope))
                }
                WriteKind::Update(r) => d.guarded_update(
                    &spec.name,
                    &spec.key_col,
                    key,
                    &row_idents(r)?,
                    g,
                    Some(&self.scope),
                ),
                WriteKind::Delete => {
                    d.guarded_delete(&spec.name, &spec.key_col, key, g, Some(&self.scope))
                }
            };
            let n = shard
                .execute(&st)
                .await
                .map_err(|e| refused_write(name, key, spec.name.as_str(), e))?;
            if n == 0
                && let Some(generation) = generation
                && d.is_proven()
            {
                // A raised fence: the manifest is stale. Reload it once.
                let fence = self.fence(&shard_name).await?;
                if fence > generation {
                    if reloaded {
                        return Err(MigrationError::StaleTopology {
                            shard: shard_name,
                            fence,
                            generation,
                        });
                    }
                    reloaded = true;
                    tracing::debug!(
                        event = "durability.migration.fence_reload",
                        key,
                        fence,
                        generation,
                        "generation fence raised; reloading the manifest"
                    );
                    let m = self.reload_manifest().await?;
                    shard_name = self.locate_for_write(&m, key, &spec).await?;
                    manifest = Some(m);
                    continue;
                }
            }
            if n > 0
                || !d.is_proven()
                || self.journal.is_none()
                || !self.checks(Check::ZeroRowsClassified)
            {
                return Ok(n);
            }
            match self.zero_rows(&shard_name, &spec, key, retried).await? {
                ZeroRows::Real => return Ok(0),
                ZeroRows::WriteAgain { lifted } => retried |= lifted,
                ZeroRows::MovedTo(s) => shard_name = s,
            }
        }
        Err(MigrationError::CutoverPending {
            key: key.to_owned(),
        })
    }

    /// What a routed write's zero-row result on `shard_name` means (the
    /// write ran under the fences of a proven dialect with a journal):
    /// a real zero-row result, a write to try again (a dead mover's expired
    /// hold was removed, or a fence was lifted between the write and the
    /// lookup, which is retried once: `retried`), or the shard the key
    /// moved to (its move finished; a lost mapping publish is republished
    /// from the journal). A live fence, hold or unfinished move, or a
    /// lookup that fails, is `MIGRATION_CUTOVER_PENDING` (nothing was
    /// written).
    async fn zero_rows(
        &self,
        shard_name: &str,
        spec: &TableSpec,
        key: &str,
        retried: bool,
    ) -> Result<ZeroRows> {
        let pending = || MigrationError::CutoverPending {
            key: key.to_owned(),
        };
        if self.held(shard_name, key).await? {
            return Ok(ZeroRows::WriteAgain { lifted: false });
        }
        if !self.fence_checks {
            // No explicit journal shard: no re-routing through the journal,
            // but a write the fence refused (a live tombstone or in-flight
            // marker here) is never reported as a real zero-row result.
            return match self.tombstone(shard_name, &spec.name, key).await {
                Ok(None) => Ok(ZeroRows::Real),
                _ => Err(pending()),
            };
        }
        let tomb = match self.tombstone(shard_name, &spec.name, key).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(
                    event = "durability.migration.fence_lookup_failed",
                    error = %e,
                    key,
                    "tombstone lookup after a zero-row write failed"
                );
                return Err(pending());
            }
        };
        let Some(Tombstone { op_id, .. }) = tomb else {
            // A fence lifted between the write and the lookup (the key
            // moved back here meanwhile) looks like a real zero-row result:
            // retry once when the shard holds a lifted fence.
            if !retried && self.lifted_fence(shard_name, &spec.name, key).await? {
                return Ok(ZeroRows::WriteAgain { lifted: true });
            }
            return Ok(ZeroRows::Real);
        };
        let op = match self.load_op(&op_id).await {
            Ok(op) => op,
            Err(e) => {
                tracing::warn!(
                    event = "durability.migration.journal_lookup_failed",
                    error = %e,
                    key,
                    "journal lookup for a tombstone's operation failed"
                );
                return Err(pending());
            }
        };
        if !matches!(
            op.map(|o| o.state),
            Some(MoveState::Published | MoveState::Retired)
        ) {
            return Err(pending());
        }
        match self.mapping_fresh(key).await? {
            Some(s) if s != shard_name => Ok(ZeroRows::MovedTo(s)),
            found => {
                // The mapping names the fenced shard (or nothing): its
                // publish was lost. The journal's newest finished move of
                // the key names where the key lives; publish it again.
                match self.journal_home(key).await {
                    Ok(Home::At { op_id, target })
                        if target != shard_name && self.checks(Check::Republish) =>
                    {
                        self.republish(key, &op_id, &target, found.as_deref())
                            .await?;
                        Ok(ZeroRows::MovedTo(target))
                    }
                    _ => Err(pending()),
                }
            }
        }
    }

    /// After a zero-row write on `shard_name`: whether the key had an
    /// expired write hold there, which this call removed (`true`: write
    /// again). A live hold, or a hold lookup that fails, is
    /// `MIGRATION_CUTOVER_PENDING` (retryable: nothing was written).
    async fn held(&self, shard_name: &str, key: &str) -> Result<bool> {
        let pending = || MigrationError::CutoverPending {
            key: key.to_owned(),
        };
        let (name, shard) = self.shard_named(shard_name)?;
        let d = shard.dialect();
        let rows = match shard.query(&d.hold_query(key, &self.scope)).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(
                    event = "durability.migration.hold_lookup_failed",
                    error = %e,
                    key,
                    shard = name,
                    "write hold lookup after a zero-row write failed"
                );
                return Err(pending());
            }
        };
        if rows.is_empty() {
            return Ok(false);
        }
        for r in &rows {
            let op_id = crate::journal::text(r, "op_id")?;
            let until = crate::journal::int(r, "until_ms")?;
            // The deadline is compared only on the mover's clock; a hold of
            // a mover on another clock (or one written before holds named
            // their mover) is over once this router saw it unchanged for
            // its window.
            let owner = crate::journal::opt_text(r, "owner")?.unwrap_or_default();
            let window = match crate::journal::opt_int(r, "hold_ms")? {
                Some(ms) => u64::try_from(ms).unwrap_or(0),
                None => config::MAX_CUTOVER_HOLD_MS,
            };
            let id = format!("{key}\u{0}{op_id}");
            if !self.lapsed(
                &self.hold_seen,
                (&owner, until),
                (&id, &until.to_string()),
                window,
            ) {
                return Err(pending());
            }
            self.hold_seen.forget(&id);
            tracing::info!(
                event = "durability.migration.hold_expired",
                op_id = %op_id,
                key,
                shard = name,
                "removing an expired write hold"
            );
            shard
                .execute(&d.hold_expire(&op_id, key, until))
                .await
                .map_err(|_| pending())?;
        }
        Ok(true)
    }

    // ---- raw ----

    /// See [`Router::raw_execute`].
    pub(crate) async fn raw_execute(&self, shard: &str, stmt: &Statement) -> Result<u64> {
        let (name, s) = self.shard_named(shard)?;
        s.execute(stmt)
            .await
            .map_err(|e| MigrationError::shard(name, e))
    }

    /// See [`Router::raw_query`].
    pub(crate) async fn raw_query(&self, shard: &str, stmt: &Statement) -> Result<Vec<Row>> {
        let (name, s) = self.shard_named(shard)?;
        s.query(stmt)
            .await
            .map_err(|e| MigrationError::shard(name, e))
    }
}

/// The collation a SQLite `CREATE TABLE` text declares on column `col`
/// (`COLLATE name` in the column's definition), if any.
fn sqlite_declared_collation(sql: &str, col: &str) -> Option<String> {
    let open = sql.find('(')?;
    let body = &sql[open + 1..];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in body.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => {
                parts.push(&body[start..i]);
                break;
            }
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    for p in parts {
        let t = p.trim();
        let Some(first) = t.split_whitespace().next() else {
            continue;
        };
        let name = first.trim_matches(|c| matches!(c, '"' | '`' | '[' | ']'));
        if !name.eq_ignore_ascii_case(col) {
            continue;
        }
        let up = t.to_ascii_uppercase();
        let i = up.find("COLLATE")?;
        let rest = up[i + "COLLATE".len()..].trim_start();
        let c: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        return (!c.is_empty()).then_some(c);
    }
    None
}

/// Runs `statements` on the shard `name` in order, up to the first failure.
pub(crate) async fn execute_all(
    name: &str,
    shard: &dyn Shard,
    statements: &[Statement],
) -> Result<()> {
    for st in statements {
        shard
            .execute(st)
            .await
            .map_err(|e| MigrationError::shard(name, e))?;
    }
    Ok(())
}

/// Adds `column` to the crate's table `table` on `shard` with `add`, unless
/// the column query finds it there. Another router's init may add it first:
/// then the `ALTER` fails and the column is there.
async fn add_column(
    name: &str,
    shard: &dyn Shard,
    table: &'static str,
    column: &str,
    add: &Statement,
) -> Result<()> {
    let d = shard.dialect();
    let has_column = async || -> Result<bool> {
        let cols = shard
            .query(&d.columns_query(&Ident::internal(table)))
            .await
            .map_err(|e| MigrationError::shard(name, e))?;
        Ok(cols
            .iter()
            .any(|r| r.get("name").and_then(Value::as_text) == Some(column)))
    };
    if !has_column().await?
        && let Err(e) = shard.execute(add).await
        && !has_column().await?
    {
        return Err(MigrationError::shard(name, e));
    }
    Ok(())
}

/// A routed write's failure: a unique violation is `DUPLICATE_KEY`, a data
/// refusal `ROW_REJECTED` (both definite: nothing was written), anything
/// else `SHARD_UNAVAILABLE` (outcome unknown).
pub(crate) fn refused_write(
    shard: &str,
    key: &str,
    table: &str,
    e: BackendError,
) -> MigrationError {
    if UniqueViolation::is(e.as_ref()) {
        return MigrationError::DuplicateKey {
            key: key.to_owned(),
            table: table.to_owned(),
        };
    }
    match DataRejected::find(e.as_ref()) {
        Some(r) => MigrationError::RowRejected {
            key: key.to_owned(),
            shard: shard.to_owned(),
            table: table.to_owned(),
            column: r.column.clone(),
            reason: crate::error::chain(r.source.as_ref()),
        },
        None => MigrationError::shard(shard, e),
    }
}
