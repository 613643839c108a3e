//! Router configuration and its validation.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::dialect::Ident;
use crate::error::{MigrationError, Result};
use crate::ledger::AllocationLedger;
use crate::mapping::MappingStore;
use crate::placement::{DEFAULT_MANIFEST_REFRESH_MS, Placement};
use crate::shard::Shard;
use durability_time::{Clock, SystemClock};

/// Default mapping cache TTL (milliseconds).
pub const DEFAULT_MAPPING_CACHE_TTL_MS: u64 = 30_000;
/// Default journal scope.
pub const DEFAULT_JOURNAL_SCOPE: &str = "default";
/// Default key column of a table.
pub const DEFAULT_KEY_COLUMN: &str = "id";
/// Longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 512;
/// Longest shard name or journal scope accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Keys starting with this character are reserved for the crate's own
/// records in the mapping store (the placement manifest's copy).
pub const RESERVED_KEY_PREFIX: char = '\u{1}';
/// Longest mapping cache TTL accepted (2^31 - 1 ms).
pub const MAX_MAPPING_CACHE_TTL_MS: u64 = 2_147_483_647;
/// Default write-blocking cutover window (milliseconds): see
/// [`MigrationConfig::cutover_hold_ms`].
pub const DEFAULT_CUTOVER_HOLD_MS: u64 = 300;
/// Longest write-blocking cutover window accepted (milliseconds).
pub const MAX_CUTOVER_HOLD_MS: u64 = 5_000;
/// Default window within which a move reuses a table's validated columns
/// on a shard whose dialect keeps no schema version (milliseconds): see
/// [`MigrationConfig::schema_recheck_ms`].
pub const DEFAULT_SCHEMA_RECHECK_MS: u64 = 1_000;

/// How keys without a mapping are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// FNV-1a hash of the key over the sorted shard names.
    #[default]
    Hash,
}

/// Everything a [`crate::Router`] is built from.
#[derive(Clone)]
pub struct MigrationConfig {
    pub(crate) shards: BTreeMap<String, Arc<dyn Shard>>,
    pub(crate) mapping: Arc<dyn MappingStore>,
    pub(crate) strategy: Strategy,
    pub(crate) journal_shard: Option<String>,
    pub(crate) journal_scope: String,
    pub(crate) mapping_cache_ttl_ms: u64,
    pub(crate) tables: BTreeMap<String, String>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) coordinator: Option<Arc<dyn AllocationLedger>>,
    pub(crate) placement: Placement,
    pub(crate) manifest_refresh_ms: u64,
    pub(crate) cutover_hold_ms: u64,
    pub(crate) schema_recheck_ms: u64,
    pub(crate) clock_domain: Option<String>,
    /// A safety check this router skips (only settable with the
    /// `conformance` feature, for the model checker's proof that it would
    /// notice; `None` in every other build).
    pub(crate) disabled: Option<Check>,
}

/// A safety check of the router, by name. Every check is always on, except
/// in a router built with the `conformance` feature's
/// `MigrationConfig::without_safety_check`, which the model checker uses to
/// show that it reports a violation without the check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// A routed write that matched no row is classified (a real zero-row
    /// result, a fence of a move: write where the key went, or a live
    /// move: `MIGRATION_CUTOVER_PENDING`) instead of reported as `Ok(0)`.
    ZeroRowsClassified,
    /// A mapping that lost its publish is published again from the
    /// journal (by a write meeting the fence, a lookup of an unmapped key
    /// and a repairing verify).
    Republish,
}

impl std::fmt::Debug for MigrationConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigrationConfig")
            .field("shards", &self.shards.keys().collect::<Vec<_>>())
            .field("strategy", &self.strategy)
            .field("journal_shard", &self.journal_shard)
            .field("journal_scope", &self.journal_scope)
            .field("mapping_cache_ttl_ms", &self.mapping_cache_ttl_ms)
            .field("tables", &self.tables)
            .field("placement", &self.placement)
            .field("manifest_refresh_ms", &self.manifest_refresh_ms)
            .field("cutover_hold_ms", &self.cutover_hold_ms)
            .field("schema_recheck_ms", &self.schema_recheck_ms)
            .field("clock_domain", &self.clock_domain)
            .finish_non_exhaustive()
    }
}

impl MigrationConfig {
    /// A configuration with a mapping store and defaults: hash strategy,
    /// scope `default`, cache TTL 30,000 ms, the system clock.
    pub fn new(mapping: Arc<dyn MappingStore>) -> Self {
        Self {
            shards: BTreeMap::new(),
            mapping,
            strategy: Strategy::Hash,
            journal_shard: None,
            journal_scope: DEFAULT_JOURNAL_SCOPE.to_owned(),
            mapping_cache_ttl_ms: DEFAULT_MAPPING_CACHE_TTL_MS,
            tables: BTreeMap::new(),
            clock: Arc::new(SystemClock),
            coordinator: None,
            placement: Placement::Mapped,
            manifest_refresh_ms: DEFAULT_MANIFEST_REFRESH_MS,
            cutover_hold_ms: DEFAULT_CUTOVER_HOLD_MS,
            schema_recheck_ms: DEFAULT_SCHEMA_RECHECK_MS,
            clock_domain: None,
            disabled: None,
        }
    }
    /// Adds a named shard.
    pub fn shard(mut self, name: impl Into<String>, shard: Arc<dyn Shard>) -> Self {
        self.shards.insert(name.into(), shard);
        self
    }
    /// Names the shard that holds the journal.
    pub fn journal_shard(mut self, name: impl Into<String>) -> Self {
        self.journal_shard = Some(name.into());
        self
    }
    /// Sets the journal scope (default `default`): separate journals when
    /// several shard sets share databases. Everything a scope keeps apart:
    /// its operations, recovery lease, sightings, verification passes,
    /// placement manifest and exceptions, and its movers' write holds (a
    /// hold is per key, not per table, so it fences only routed writes of
    /// its own scope). Tombstones and in-flight markers are per table and
    /// key: two scopes that key the same table on one database share its
    /// rows, so their keys must be disjoint (a key both route is one row,
    /// and either scope's fence on it applies to both). Tests:
    /// `tests/it/migration_scopes.rs`.
    pub fn journal_scope(mut self, scope: impl Into<String>) -> Self {
        self.journal_scope = scope.into();
        self
    }
    /// Sets the mapping cache TTL; 0 reads the mapping on every call.
    pub fn mapping_cache_ttl_ms(mut self, ms: u64) -> Self {
        self.mapping_cache_ttl_ms = ms;
        self
    }
    /// Declares a keyed table whose key column is `id`.
    pub fn table(self, name: impl Into<String>) -> Self {
        self.table_with_key_column(name, DEFAULT_KEY_COLUMN)
    }
    /// Declares a keyed table with its key column.
    pub fn table_with_key_column(
        mut self,
        name: impl Into<String>,
        key_column: impl Into<String>,
    ) -> Self {
        self.tables.insert(name.into(), key_column.into());
        self
    }
    /// Sets the placement strategy.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }
    /// Sets the coordinator's allocation ledger (for
    /// [`crate::Router::reconcile_allocations`]).
    pub fn coordinator(mut self, ledger: Arc<dyn AllocationLedger>) -> Self {
        self.coordinator = Some(ledger);
        self
    }
    /// Sets the placement (default [`Placement::Mapped`]). Computed placement
    /// needs a journal shard on a proven dialect.
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }
    /// How long a router routes with its cached manifest before confirming
    /// it again from the mapping store's copy (default 5,000 ms; 0 confirms
    /// on every call). Writes stay correct with an older manifest (the
    /// shards' generation fences refuse them and they reload), but a read
    /// may miss a key placed under an epoch added within this period.
    pub fn manifest_refresh_ms(mut self, ms: u64) -> Self {
        self.manifest_refresh_ms = ms;
        self
    }
    /// The write-blocking cutover window (default 300 ms, at most
    /// [`MAX_CUTOVER_HOLD_MS`]; 0 turns it off). When a move's cutover
    /// misses because a write changed the key's row after the snapshot, the
    /// mover holds the key's writes on the source (routed writes there fail
    /// with the retryable `MIGRATION_CUTOVER_PENDING`) while it copies the
    /// final delta and cuts over. The hold ends with the cutover or the
    /// abort, and at the latest when this many milliseconds have passed on
    /// the injected clock: the mover stops trying at its deadline, and a
    /// routed write that meets an expired hold removes it. Reads are never
    /// held.
    pub fn cutover_hold_ms(mut self, ms: u64) -> Self {
        self.cutover_hold_ms = ms;
        self
    }
    /// How long a move reuses a table's columns and key-column collation
    /// validated on a PostgreSQL or MariaDB/MySQL shard (default
    /// [`DEFAULT_SCHEMA_RECHECK_MS`], at most [`MAX_MAPPING_CACHE_TTL_MS`];
    /// 0: read them afresh for every move), on the injected clock. A
    /// SQLite shard keeps a schema version that every schema change
    /// changes: a move there reads it (one cheap query) and re-validates
    /// exactly when it changed, whatever this says. Within the window a
    /// move does not see a table dropped, or a key column altered to a
    /// coarser collation, since the last validation: a missing table fails
    /// the move's statements, and on these two dialects every key match of
    /// the crate also compares the key's bytes, so such a column never
    /// makes a move (or a routed read or write) match another key's row.
    pub fn schema_recheck_ms(mut self, ms: u64) -> Self {
        self.schema_recheck_ms = ms;
        self
    }
    /// Injects the clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
    /// Names the clock this router's clock is (`[A-Za-z0-9_.-]`, at most
    /// [`MAX_NAME_BYTES`] bytes): routers that name the same domain promise
    /// to read one clock (one host's wall clock; one test's manual clock).
    ///
    /// A router compares a deadline another router wrote with its own clock
    /// only when the writer is in its domain (or is this router): a move's
    /// liveness deadline, the recovery lease's and a write hold's. A move
    /// owned elsewhere is settled only after this router saw its journal
    /// row unchanged for [`crate::MOVE_LIVENESS_MS`] of its own clock, a
    /// lease held elsewhere is taken over only after it saw the lease
    /// unchanged for [`crate::RECOVERY_LEASE_MS`] (a released one at once),
    /// and a write hold taken elsewhere is removed only after it saw the
    /// hold unchanged for its window. So a router whose clock runs ahead
    /// never takes a live row for lapsed, and one whose clock runs behind
    /// does not wait out the skew. Without a domain, a router is a domain of
    /// its own. The lease and a move's row are also watched on the journal
    /// database's own clock, through sightings persisted in the journal, so
    /// routers built fresh for every call settle them too (see
    /// [`crate::Router::recover_migrations`]).
    pub fn clock_domain(mut self, name: impl Into<String>) -> Self {
        self.clock_domain = Some(name.into());
        self
    }
}

/// A validated table: its name and key column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableSpec {
    pub(crate) name: Ident,
    pub(crate) key_col: Ident,
}

pub(crate) fn validate_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(MigrationError::InvalidConfig(format!(
            "{what} {:?} must be 1..={MAX_NAME_BYTES} bytes of [A-Za-z0-9_.-]",
            name.chars().take(80).collect::<String>()
        )))
    }
}

/// Validates a key: non-empty, at most [`MAX_KEY_BYTES`] bytes, no NUL, not
/// starting with [`RESERVED_KEY_PREFIX`].
///
/// # Errors
/// `INVALID_KEY`.
pub fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(MigrationError::InvalidKey("empty".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(MigrationError::InvalidKey(format!(
            "{} bytes, more than {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    if key.starts_with(RESERVED_KEY_PREFIX) {
        return Err(MigrationError::InvalidKey(
            "starts with the reserved \\u{1}".into(),
        ));
    }
    if key.contains('\0') {
        return Err(MigrationError::InvalidKey("contains NUL".into()));
    }
    Ok(())
}

pub(crate) struct Validated {
    pub(crate) journal: Option<String>,
    pub(crate) tables: BTreeMap<String, TableSpec>,
}

pub(crate) fn validate(c: &MigrationConfig) -> Result<Validated> {
    if c.shards.is_empty() {
        return Err(MigrationError::InvalidConfig("no shards".into()));
    }
    for name in c.shards.keys() {
        validate_name("shard name", name)?;
    }
    validate_name("journal scope", &c.journal_scope)?;
    if c.mapping_cache_ttl_ms > MAX_MAPPING_CACHE_TTL_MS {
        return Err(MigrationError::InvalidConfig(format!(
            "mapping cache TTL above {MAX_MAPPING_CACHE_TTL_MS} ms"
        )));
    }
    let journal = match &c.journal_shard {
        Some(j) if c.shards.contains_key(j) => Some(j.clone()),
        Some(j) => return Err(MigrationError::InvalidJournalShard(j.clone())),
        None if c.shards.len() == 1 => c.shards.keys().next().cloned(),
        None => None,
    };
    if c.placement == Placement::Computed {
        let j = journal
            .as_ref()
            .ok_or(MigrationError::JournalNotConfigured)?;
        let d = c.shards.get(j).map(|s| s.dialect());
        if let Some(d) = d.filter(|d| !d.is_proven()) {
            return Err(MigrationError::UnsupportedDialect {
                shard: j.clone(),
                dialect: d.name().to_owned(),
            });
        }
    }
    if c.manifest_refresh_ms > MAX_MAPPING_CACHE_TTL_MS {
        return Err(MigrationError::InvalidConfig(format!(
            "manifest refresh above {MAX_MAPPING_CACHE_TTL_MS} ms"
        )));
    }
    if c.schema_recheck_ms > MAX_MAPPING_CACHE_TTL_MS {
        return Err(MigrationError::InvalidConfig(format!(
            "schema recheck above {MAX_MAPPING_CACHE_TTL_MS} ms"
        )));
    }
    if let Some(d) = &c.clock_domain {
        validate_name("clock domain", d)?;
    }
    if c.cutover_hold_ms > MAX_CUTOVER_HOLD_MS {
        return Err(MigrationError::InvalidConfig(format!(
            "cutover hold of {} ms above {MAX_CUTOVER_HOLD_MS} ms",
            c.cutover_hold_ms
        )));
    }
    let mut tables = BTreeMap::new();
    for (t, k) in &c.tables {
        let spec = TableSpec {
            name: Ident::new(t)?,
            key_col: Ident::new(k)?,
        };
        tables.insert(t.clone(), spec);
    }
    Ok(Validated { journal, tables })
}

/// FNV-1a 64-bit hash.
pub(crate) fn fnv1a(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The shard the hash strategy places `key` on among `shards` (sorted).
pub fn hash_owner<'a>(key: &str, shards: &[&'a str]) -> Option<&'a str> {
    if shards.is_empty() {
        return None;
    }
    let mut sorted = shards.to_vec();
    sorted.sort_unstable();
    let n = u64::try_from(sorted.len()).ok()?;
    let idx = usize::try_from(fnv1a(key) % n).ok()?;
    sorted.get(idx).copied()
}
