//! Computed placement: the manifest of epochs on the journal shard (updated
//! by compare-and-swap on its revision, with a derived copy in the mapping
//! store), the generation fence every data shard holds, placement
//! exceptions, write probes and epoch pruning.
//!
//! Invariants:
//! - the manifest holds 1..=[`MAX_EPOCHS`] epochs, newest first; an epoch is
//!   removed only by [`Router::prune_epochs`] after a census over every page
//!   of every listed table found no row depending on it;
//! - every manifest change is one compare-and-swap on the journal row's
//!   revision; the copy in the mapping store is derived from it and is never
//!   newer;
//! - a topology change raises the fence of every shard to the new
//!   generation after publishing it, so a write routed with an older manifest
//!   matches no row there, reloads once and otherwise fails with
//!   `STALE_TOPOLOGY`;
//! - a key's row lives on its mapped shard, or else on the owner of some
//!   epoch; a write finds it by probing the owners newest first and writes
//!   where it is, or on the newest owner when no shard holds it;
//! - a move's destination copy is not the key's row until the move
//!   publishes it: from the copy to the publish it sits under the move's
//!   in-flight marker, which probes skip (so a copy on the key's newest
//!   owner is not found before the source that still holds the row), and
//!   a write routed onto it matches no row (`MIGRATION_CUTOVER_PENDING`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::config::{self, TableSpec};
use crate::error::{MigrationError, Result};
use crate::router::Router;
use crate::value::Value;

/// Most epochs a manifest holds, the current one included.
pub const MAX_EPOCHS: usize = 8;
/// Lost compare-and-swaps in a row before `PLACEMENT_CONFLICT`.
pub const MAX_CAS_ATTEMPTS: u32 = 5;
/// Default period after which a router re-confirms its cached manifest.
pub const DEFAULT_MANIFEST_REFRESH_MS: u64 = 5_000;
/// Default page size of the pruning census.
pub const DEFAULT_PRUNE_PAGE_SIZE: usize = 500;
/// Default number of (table, shard) census scans run at once.
pub const DEFAULT_PRUNE_CONCURRENCY: usize = 4;
/// Prefix of the mapping-store key that holds the manifest's derived copy
/// (keys starting with `\u{1}` are reserved; see [`crate::validate_key`]).
pub const MANIFEST_COPY_PREFIX: &str = "\u{1}durability.manifest/";

/// How keys are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Placement {
    /// A key's shard is its mapping, allocated by the hash strategy on the
    /// key's first write.
    #[default]
    Mapped,
    /// A key's shard is computed from a manifest of epochs; the mapping store
    /// holds only placement exceptions (moved keys) and the manifest's copy.
    Computed,
}

/// How an epoch computes a key's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Algorithm {
    /// FNV-1a hash of the key over the sorted shard names
    /// ([`crate::hash_owner`]).
    Hash,
}

/// One epoch: a shard set and the algorithm that computes an owner from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Epoch {
    /// The epoch number (increasing; never reused).
    pub number: u32,
    /// The shard set, sorted.
    pub shards: Vec<String>,
    /// The owner algorithm.
    pub algorithm: Algorithm,
}

impl Epoch {
    /// The shard this epoch places `key` on (the shard set is sorted, so
    /// this is [`crate::hash_owner`] without sorting on every call).
    pub fn owner(&self, key: &str) -> Option<&str> {
        match self.algorithm {
            Algorithm::Hash => {
                let n = u64::try_from(self.shards.len()).ok().filter(|n| *n > 0)?;
                let idx = usize::try_from(config::fnv1a(key) % n).ok()?;
                self.shards.get(idx).map(String::as_str)
            }
        }
    }
}

/// The placement manifest: epochs newest first, with the revision every
/// update swaps on, the generation writes bind, and the exception version
/// moves bump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Compare-and-swap revision (one per update).
    pub revision: i64,
    /// The generation writes bind; fences are raised to it.
    pub generation: i64,
    /// Bumped when a move records a placement exception.
    pub exception_version: i64,
    /// The epochs, newest first.
    pub epochs: Vec<Epoch>,
}

impl Manifest {
    /// The newest epoch.
    pub fn newest(&self) -> Option<&Epoch> {
        self.epochs.first()
    }

    /// The owner the newest epoch computes for `key`.
    pub fn owner(&self, key: &str) -> Option<&str> {
        self.newest().and_then(|e| e.owner(key))
    }

    /// Distinct owners of `key`, newest epoch first, with the newest epoch
    /// that computes each.
    pub fn candidates(&self, key: &str) -> Vec<(u32, String)> {
        let mut out: Vec<(u32, String)> = Vec::new();
        for e in &self.epochs {
            if let Some(o) = e.owner(key)
                && !out.iter().any(|(_, s)| s == o)
            {
                out.push((e.number, o.to_owned()));
            }
        }
        out
    }

    /// Every shard some epoch names.
    pub fn all_shards(&self) -> BTreeSet<String> {
        self.epochs
            .iter()
            .flat_map(|e| e.shards.iter().cloned())
            .collect()
    }

    fn encode(&self) -> Result<String> {
        serde_json::to_string(self).map_err(|e| MigrationError::Corrupt(e.to_string()))
    }

    fn decode(s: &str) -> Result<Self> {
        let m: Self = serde_json::from_str(s)
            .map_err(|e| MigrationError::Corrupt(format!("manifest: {e}")))?;
        if m.epochs.is_empty() || m.epochs.len() > MAX_EPOCHS {
            return Err(MigrationError::Corrupt(format!(
                "manifest holds {} epochs",
                m.epochs.len()
            )));
        }
        if let Some(e) = m
            .epochs
            .iter()
            .find(|e| e.shards.is_empty() || !e.shards.windows(2).all(|w| w[0] < w[1]))
        {
            return Err(MigrationError::Corrupt(format!(
                "epoch {} has no shards or an unsorted shard set",
                e.number
            )));
        }
        Ok(m)
    }
}

/// Options of [`Router::prune_epochs`].
#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Every table that holds keyed rows. A census over fewer tables cannot
    /// show that no row depends on an epoch.
    pub tables: Vec<String>,
    /// Key column per table; a table not listed uses its configured key
    /// column, else `id`.
    pub key_columns: BTreeMap<String, String>,
    /// Report the dependents and change nothing (not even the fences).
    pub dry_run: bool,
    /// Keys per census page (1..=10,000; default 500).
    pub page_size: usize,
    /// (table, shard) scans run at once (1..=64; default 4).
    pub concurrency: usize,
}

impl Default for PruneOptions {
    fn default() -> Self {
        Self {
            tables: Vec::new(),
            key_columns: BTreeMap::new(),
            dry_run: false,
            page_size: DEFAULT_PRUNE_PAGE_SIZE,
            concurrency: DEFAULT_PRUNE_CONCURRENCY,
        }
    }
}

/// What [`Router::prune_epochs`] found and did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PruneReport {
    /// Epochs removed (empty on a dry run).
    pub removed: Vec<u32>,
    /// Epochs kept (on a dry run: the epochs a real run would keep).
    pub retained: Vec<u32>,
    /// Rows depending on each epoch.
    pub dependents: BTreeMap<u32, u64>,
    /// Rows the census read.
    pub scanned: u64,
    /// Rows on a shard that no epoch computes for their key and no
    /// exception explains, and rows of a binary key column whose bytes are
    /// not UTF-8 (no key a router can name): reported; they keep no epoch.
    pub unplaced: u64,
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// The manifest revision after the run.
    pub revision: i64,
}

/// A placement exception: a key that lives off its computed owner.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Exception {
    shard: String,
    epoch: u32,
}

/// One census result: rows depending on each epoch, rows scanned, rows
/// unplaced.
type Census = (BTreeMap<u32, u64>, u64, u64);

/// The cached manifest and when it was last confirmed.
#[derive(Debug, Clone)]
pub(crate) struct CachedManifest {
    pub(crate) manifest: Arc<Manifest>,
    pub(crate) confirmed_ms: u64,
}

fn epoch_number(v: Option<&Value>) -> Result<u32> {
    v.and_then(Value::as_integer)
        .and_then(|i| u32::try_from(i).ok())
        .ok_or_else(|| MigrationError::Corrupt(format!("epoch column: {v:?}")))
}

impl Router {
    pub(crate) fn computed(&self) -> bool {
        self.placement == Placement::Computed
    }

    fn require_computed(&self) -> Result<()> {
        if self.computed() {
            Ok(())
        } else {
            Err(MigrationError::InvalidConfig(
                "the operation needs computed placement".into(),
            ))
        }
    }

    fn copy_key(&self) -> String {
        format!("{MANIFEST_COPY_PREFIX}{}", self.scope)
    }

    /// Creates the placement tables and the first manifest (epoch 1: every
    /// configured shard) when none exists, and publishes its copy.
    pub(crate) async fn init_placement(&self) -> Result<()> {
        for (name, shard) in &self.shards {
            let d = shard.dialect();
            if !d.is_proven() {
                continue;
            }
            for st in d.topology_schema() {
                shard
                    .execute(&st)
                    .await
                    .map_err(|e| MigrationError::shard(name, e))?;
            }
        }
        let (jname, js) = self.journal_shard()?;
        let d = js.dialect();
        for st in d.placement_schema() {
            js.execute(&st)
                .await
                .map_err(|e| MigrationError::shard(jname, e))?;
        }
        let first = Manifest {
            revision: 1,
            generation: 1,
            exception_version: 0,
            epochs: vec![Epoch {
                number: 1,
                shards: self.shards.keys().cloned().collect(),
                algorithm: Algorithm::Hash,
            }],
        };
        js.execute(&d.manifest_insert(&self.scope, first.revision, &first.encode()?))
            .await
            .map_err(|e| MigrationError::shard(jname, e))?;
        let m = self.manifest_from_journal().await?;
        self.publish_copy(&m).await?;
        self.cache_manifest(m);
        Ok(())
    }

    /// The manifest as the journal shard holds it (the authority).
    ///
    /// # Errors
    /// `JOURNAL_NOT_CONFIGURED`, `SHARD_UNAVAILABLE`, `CORRUPT_RECORD`,
    /// `INVALID_CONFIG` (placement is not computed, or `init` never ran).
    pub async fn manifest_from_journal(&self) -> Result<Manifest> {
        self.require_computed()?;
        let (jname, js) = self.journal_shard()?;
        let rows = js
            .query(&js.dialect().manifest_get(&self.scope))
            .await
            .map_err(|e| MigrationError::shard(jname, e))?;
        let Some(r) = rows.first() else {
            return Err(MigrationError::InvalidConfig(
                "no placement manifest: call init() first".into(),
            ));
        };
        let rev = crate::journal::int(r, "revision")?;
        let m = Manifest::decode(&crate::journal::text(r, "body")?)?;
        if m.revision != rev {
            return Err(MigrationError::Corrupt(format!(
                "manifest revision {} under row revision {rev}",
                m.revision
            )));
        }
        Ok(m)
    }

    /// Writes the manifest's derived copy to the mapping store unless the
    /// copy there is as new.
    async fn publish_copy(&self, m: &Manifest) -> Result<()> {
        let key = self.copy_key();
        let current = self
            .mapping
            .get(&key)
            .await
            .map_err(MigrationError::MappingUnavailable)?;
        if let Some(c) = current
            && Manifest::decode(&c).is_ok_and(|c| c.revision >= m.revision)
        {
            return Ok(());
        }
        self.mapping
            .put(&key, &m.encode()?)
            .await
            .map_err(MigrationError::MappingUnavailable)
    }

    fn cache_manifest(&self, m: Manifest) -> Arc<Manifest> {
        let m = Arc::new(m);
        let now = self.clock.now_ms_u64();
        let mut drop_exceptions = false;
        if let Ok(mut g) = self.manifest.lock() {
            match g.as_mut() {
                Some(c) if c.manifest.revision > m.revision => {
                    // The cached manifest is newer than the one confirmed.
                    c.confirmed_ms = now;
                    return Arc::clone(&c.manifest);
                }
                Some(c) => {
                    drop_exceptions = c.manifest.exception_version != m.exception_version;
                }
                None => {}
            }
            *g = Some(CachedManifest {
                manifest: Arc::clone(&m),
                confirmed_ms: now,
            });
        }
        if drop_exceptions {
            self.clear_mapping_cache();
        }
        m
    }

    fn cached_manifest(&self) -> Option<CachedManifest> {
        self.manifest.lock().ok().and_then(|g| g.clone())
    }

    /// Reads the derived copy from the mapping store; a missing copy is
    /// rebuilt from the journal.
    async fn confirm_manifest(&self) -> Result<Arc<Manifest>> {
        let copy = self
            .mapping
            .get(&self.copy_key())
            .await
            .map_err(MigrationError::MappingUnavailable)?;
        match copy {
            Some(c) => Ok(self.cache_manifest(Manifest::decode(&c)?)),
            None => {
                let m = self.manifest_from_journal().await?;
                self.publish_copy(&m).await?;
                Ok(self.cache_manifest(m))
            }
        }
    }

    /// The manifest a read routes with: the cached one while it is fresh,
    /// else the mapping store's copy; when that cannot be read, a cached
    /// manifest of any age.
    ///
    /// # Errors
    /// `INVALID_CONFIG` (not computed), `MAPPING_UNAVAILABLE` or
    /// `SHARD_UNAVAILABLE` when no manifest was ever cached.
    pub async fn manifest(&self) -> Result<Arc<Manifest>> {
        self.require_computed()?;
        let cached = self.cached_manifest();
        if let Some(c) = &cached
            && self.clock.now_ms_u64().saturating_sub(c.confirmed_ms) < self.manifest_refresh_ms
        {
            return Ok(Arc::clone(&c.manifest));
        }
        match self.confirm_manifest().await {
            Ok(m) => Ok(m),
            Err(e) => match cached {
                Some(c) => {
                    tracing::debug!(
                        event = "durability.migration.manifest_cached_read",
                        error = %e,
                        "manifest not confirmed; reading with the cached manifest"
                    );
                    Ok(c.manifest)
                }
                None => Err(e),
            },
        }
    }

    /// The manifest a write routes with: the cached one while it is fresh,
    /// else a confirmed copy.
    ///
    /// # Errors
    /// `PLACEMENT_UNVERIFIED` when no fresh manifest can be confirmed.
    pub(crate) async fn manifest_for_write(&self) -> Result<Arc<Manifest>> {
        if let Some(c) = self.cached_manifest()
            && self.clock.now_ms_u64().saturating_sub(c.confirmed_ms) < self.manifest_refresh_ms
        {
            return Ok(c.manifest);
        }
        self.confirm_manifest()
            .await
            .map_err(|e| MigrationError::PlacementUnverified(Box::new(e)))
    }

    /// Reloads the manifest from the journal (after a raised fence).
    pub(crate) async fn reload_manifest(&self) -> Result<Arc<Manifest>> {
        let m = self
            .manifest_from_journal()
            .await
            .map_err(|e| MigrationError::PlacementUnverified(Box::new(e)))?;
        if let Err(e) = self.publish_copy(&m).await {
            tracing::warn!(
                event = "durability.migration.manifest_copy_failed",
                error = %e,
                "publishing the manifest copy failed"
            );
        }
        Ok(self.cache_manifest(m))
    }

    /// Applies `f` to the journal's manifest by compare-and-swap on its
    /// revision, retrying lost swaps; `f` returning `None` changes nothing.
    /// Publishes the copy and caches the result.
    async fn update_manifest(
        &self,
        f: impl Fn(&Manifest) -> Result<Option<Manifest>>,
    ) -> Result<Arc<Manifest>> {
        let (jname, js) = self.journal_shard()?;
        let d = js.dialect();
        for _ in 0..MAX_CAS_ATTEMPTS {
            let cur = self.manifest_from_journal().await?;
            let Some(mut next) = f(&cur)? else {
                self.publish_copy(&cur).await?;
                return Ok(self.cache_manifest(cur));
            };
            next.revision = cur.revision + 1;
            let n = js
                .execute(&d.manifest_cas(&self.scope, cur.revision, next.revision, &next.encode()?))
                .await
                .map_err(|e| MigrationError::shard(jname, e))?;
            if n == 1 {
                tracing::info!(
                    event = "durability.migration.manifest_updated",
                    revision = next.revision,
                    generation = next.generation,
                    epochs = next.epochs.len(),
                    "manifest updated"
                );
                self.publish_copy(&next).await?;
                return Ok(self.cache_manifest(next));
            }
            tracing::debug!(
                event = "durability.migration.manifest_cas_lost",
                revision = cur.revision,
                "manifest compare-and-swap lost; retrying"
            );
        }
        Err(MigrationError::PlacementConflict(MAX_CAS_ATTEMPTS))
    }

    /// The generation fence of a shard (0 when none was raised).
    ///
    /// # Errors
    /// `UNKNOWN_SHARD`, `SHARD_UNAVAILABLE`, `CORRUPT_RECORD`.
    pub async fn fence(&self, shard: &str) -> Result<i64> {
        let (name, s) = self.shard_named(shard)?;
        let rows = s
            .query(&s.dialect().fence_get(&self.scope))
            .await
            .map_err(|e| MigrationError::shard(name, e))?;
        match rows.first() {
            Some(r) => crate::journal::int(r, "min_generation"),
            None => Ok(0),
        }
    }

    /// Raises the fence of every shard on a proven dialect to `generation`.
    async fn raise_fences(&self, generation: i64) -> Result<()> {
        for (name, shard) in &self.shards {
            let d = shard.dialect();
            if !d.is_proven() {
                continue;
            }
            shard
                .batch(&d.fence_raise(&self.scope, generation))
                .await
                .map_err(|e| MigrationError::shard(name, e))?;
        }
        tracing::info!(
            event = "durability.migration.fences_raised",
            generation,
            "generation fences raised"
        );
        Ok(())
    }

    /// Adds an epoch over `shards` as the newest, bumps the generation and
    /// raises every shard's fence to it. Adding the shard set the newest
    /// epoch already has changes nothing but re-raises the fences, so a
    /// call interrupted by a crash is finished by calling it again.
    ///
    /// # Errors
    /// `INVALID_CONFIG` (not computed, empty set), `UNKNOWN_SHARD`,
    /// `MIGRATION_UNSUPPORTED_DIALECT`, `JOURNAL_NOT_CONFIGURED`,
    /// `TOO_MANY_EPOCHS`, `PLACEMENT_CONFLICT`, `SHARD_UNAVAILABLE`,
    /// `MAPPING_UNAVAILABLE`.
    pub async fn add_epoch(&self, shards: &[&str]) -> Result<Arc<Manifest>> {
        self.require_computed()?;
        if shards.is_empty() {
            return Err(MigrationError::InvalidConfig(
                "an epoch needs shards".into(),
            ));
        }
        let mut set = BTreeSet::new();
        for s in shards {
            let (name, shard) = self.shard_named(s)?;
            let d = shard.dialect();
            if !d.is_proven() {
                return Err(MigrationError::UnsupportedDialect {
                    shard: name.to_owned(),
                    dialect: d.name().to_owned(),
                });
            }
            set.insert(name.to_owned());
        }
        let set: Vec<String> = set.into_iter().collect();
        self.journal_shard()?;
        let m = self
            .update_manifest(|cur| {
                if cur.newest().is_some_and(|e| e.shards == set) {
                    return Ok(None);
                }
                if cur.epochs.len() >= MAX_EPOCHS {
                    return Err(MigrationError::TooManyEpochs(cur.epochs.len()));
                }
                let number = cur.epochs.iter().map(|e| e.number).max().unwrap_or(0) + 1;
                let mut next = cur.clone();
                next.generation += 1;
                next.epochs.insert(
                    0,
                    Epoch {
                        number,
                        shards: set.clone(),
                        algorithm: Algorithm::Hash,
                    },
                );
                Ok(Some(next))
            })
            .await?;
        self.raise_fences(m.generation).await?;
        Ok(m)
    }

    /// Records `key` as living on `shard` off its computed owner (epoch
    /// `epoch`), in the journal and as its mapping.
    async fn record_exception(&self, key: &str, shard: &str, epoch: u32) -> Result<()> {
        let (jname, js) = self.journal_shard()?;
        js.batch(&js.dialect().exception_put(&self.scope, key, shard, epoch))
            .await
            .map_err(|e| MigrationError::shard(jname, e))?;
        Ok(())
    }

    /// A read found `key` through an older epoch: remember where it is,
    /// unless another shard holds a row of the key in some configured table
    /// (a mapping would hide that row from every other table's reads and
    /// writes).
    pub(crate) async fn note_found(&self, m: &Manifest, key: &str, shard: &str, epoch: u32) {
        match self.held_elsewhere(m, key, shard).await {
            Ok(false) => {}
            Ok(true) => {
                tracing::warn!(
                    event = "durability.migration.key_split",
                    key,
                    shard,
                    "the key has rows on several shards; no placement exception recorded"
                );
                return;
            }
            Err(e) => {
                tracing::warn!(
                    event = "durability.migration.exception_not_recorded",
                    error = %e,
                    key,
                    "placement exception not recorded: the key's other tables could not be probed"
                );
                return;
            }
        }
        let r = async {
            self.record_exception(key, shard, epoch).await?;
            let held = self
                .mapping
                .put_if_absent(key, shard)
                .await
                .map_err(MigrationError::MappingUnavailable)?;
            self.cache_set(key, &held);
            Ok::<(), MigrationError>(())
        };
        if let Err(e) = r.await {
            tracing::warn!(
                event = "durability.migration.exception_not_recorded",
                error = %e,
                key,
                "placement exception not recorded"
            );
        } else {
            tracing::debug!(
                event = "durability.migration.exception_recorded",
                key,
                shard,
                epoch,
                "placement exception recorded"
            );
        }
    }

    /// After a move published `key` on `target`: record a placement
    /// exception (and bump the exception version) when `target` is not the
    /// computed owner; otherwise drop a stale exception. Idempotent.
    pub(crate) async fn publish_placement(&self, key: &str, target: &str) -> Result<()> {
        let m = self.manifest_from_journal().await?;
        let (Some(newest), Some(owner)) = (m.newest(), m.owner(key)) else {
            return Ok(());
        };
        if owner == target {
            let (jname, js) = self.journal_shard()?;
            js.execute(&js.dialect().exception_delete(&self.scope, key))
                .await
                .map_err(|e| MigrationError::shard(jname, e))?;
            return Ok(());
        }
        self.record_exception(key, target, newest.number).await?;
        self.update_manifest(|cur| {
            let mut next = cur.clone();
            next.exception_version += 1;
            Ok(Some(next))
        })
        .await?;
        Ok(())
    }

    /// Finds the shard that holds any row of `key` (in `spec` first, then in
    /// every other configured table) among the owners of every epoch, newest
    /// first (`None`: no shard holds one). A key's rows live together, so a
    /// write of one table goes where the key's other rows are.
    ///
    /// # Errors
    /// `WRITE_UNRESOLVED` when a probe cannot run.
    pub(crate) async fn probe_key(
        &self,
        m: &Manifest,
        key: &str,
        spec: &TableSpec,
    ) -> Result<Option<String>> {
        let others: Vec<TableSpec> = self
            .tables
            .values()
            .filter(|t| *t != spec)
            .cloned()
            .collect();
        for (_, shard_name) in m.candidates(key) {
            // The written table's probe must run (a shard without the table
            // cannot be told apart from one that fails); the key's other
            // tables hold no row on a shard that does not have them.
            if self
                .holds_row(&shard_name, key, std::slice::from_ref(spec), false)
                .await?
                || self.holds_row(&shard_name, key, &others, true).await?
            {
                return Ok(Some(shard_name));
            }
        }
        Ok(None)
    }

    /// Whether `shard_name` holds a row of `key` in any of `specs` (with
    /// `skip_missing`, a table the shard does not have holds none).
    ///
    /// # Errors
    /// `WRITE_UNRESOLVED` when a probe cannot run.
    async fn holds_row(
        &self,
        shard_name: &str,
        key: &str,
        specs: &[TableSpec],
        skip_missing: bool,
    ) -> Result<bool> {
        let unresolved = |e: MigrationError| MigrationError::WriteUnresolved {
            key: key.to_owned(),
            shard: shard_name.to_owned(),
            source: Box::new(e),
        };
        let (_, shard) = self.shard_named(shard_name)?;
        let d = shard.dialect();
        for spec in specs {
            if skip_missing && d.is_proven() {
                match self.columns(shard_name, spec).await {
                    Ok(_) => {}
                    Err(
                        MigrationError::UnknownTable(_) | MigrationError::UnknownKeyColumn { .. },
                    ) => {
                        continue;
                    }
                    Err(e) => return Err(unresolved(e)),
                }
            }
            // A move's destination copy (under its in-flight marker) is not
            // the key's row until the move publishes it.
            let probe = if d.is_proven() {
                d.key_probe_unmarked(&spec.name, &spec.key_col, key)
            } else {
                d.key_probe(&spec.name, &spec.key_col, key)
            };
            let rows = shard
                .query(&probe)
                .await
                .map_err(|e| unresolved(MigrationError::shard(shard_name, e)))?;
            if !rows.is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether a shard other than `shard` among `key`'s candidates holds a
    /// row of the key in any configured table (its rows are split: no one
    /// shard may be recorded as the key's).
    async fn held_elsewhere(&self, m: &Manifest, key: &str, shard: &str) -> Result<bool> {
        let specs: Vec<TableSpec> = self.tables.values().cloned().collect();
        for (_, other) in m.candidates(key) {
            if other != shard && self.holds_row(&other, key, &specs, true).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Where a routed write of `key` goes under computed placement: its
    /// mapping, else the shard holding its row, else the newest owner.
    pub(crate) async fn locate_for_write(
        &self,
        m: &Manifest,
        key: &str,
        spec: &TableSpec,
    ) -> Result<String> {
        if let Some(s) = self.route(key).await? {
            return Ok(s);
        }
        let newest = m
            .owner(key)
            .ok_or_else(|| MigrationError::InvalidConfig("empty manifest".into()))?
            .to_owned();
        if m.epochs.len() == 1 {
            return Ok(newest);
        }
        Ok(self.probe_key(m, key, spec).await?.unwrap_or(newest))
    }

    /// Drops every epoch no row depends on.
    ///
    /// A run reads the exception set, bumps the manifest generation and
    /// raises every shard's fence to it (so writers holding an older
    /// manifest cannot place a row under an epoch being counted), counts the
    /// rows depending on each epoch over every page of every listed table on
    /// every shard, and publishes the manifest without the epochs nothing
    /// depends on, by the same compare-and-swap. The newest epoch always
    /// stays. A row depends on the newest epoch whose owner is the shard the
    /// row sits on; a key with a placement exception whose mapping points at
    /// that shard depends on the exception's epoch instead. A mapping alone
    /// keeps no epoch.
    ///
    /// With `dry_run` it reports the dependents and changes nothing.
    ///
    /// # Errors
    /// `JOURNAL_NOT_CONFIGURED`, `INVALID_CONFIG` (not computed, no tables,
    /// bad page size or concurrency), `INVALID_IDENTIFIER`, `PRUNE_REFUSED`
    /// (the exception set cannot be read), `PLACEMENT_CONFLICT`,
    /// `SHARD_UNAVAILABLE`, `MAPPING_UNAVAILABLE`.
    pub async fn prune_epochs(&self, opts: PruneOptions) -> Result<PruneReport> {
        let Some(_) = self.journal.as_ref().filter(|_| self.fence_checks) else {
            return Err(MigrationError::JournalNotConfigured);
        };
        self.require_computed()?;
        if opts.tables.is_empty() {
            return Err(MigrationError::InvalidConfig(
                "prune_epochs needs every table that holds keyed rows".into(),
            ));
        }
        if !(1..=10_000).contains(&opts.page_size) || !(1..=64).contains(&opts.concurrency) {
            return Err(MigrationError::InvalidConfig(
                "page size must be 1..=10000 and concurrency 1..=64".into(),
            ));
        }
        let specs = opts
            .tables
            .iter()
            .map(|t| self.table_spec_for(t, opts.key_columns.get(t).map(String::as_str)))
            .collect::<Result<Vec<_>>>()?;
        let exceptions = self
            .exception_set()
            .await
            .map_err(|e| MigrationError::PruneRefused(e.to_string()))?;
        let m = if opts.dry_run {
            Arc::new(self.manifest_from_journal().await?)
        } else {
            let m = self
                .update_manifest(|cur| {
                    let mut next = cur.clone();
                    next.generation += 1;
                    Ok(Some(next))
                })
                .await?;
            self.raise_fences(m.generation).await?;
            m
        };
        let (dependents, scanned, unplaced) = self
            .census(&m, &specs, &exceptions, opts.page_size, opts.concurrency)
            .await?;
        let newest = m.newest().map(|e| e.number);
        let keep: BTreeSet<u32> = m
            .epochs
            .iter()
            .map(|e| e.number)
            .filter(|n| Some(*n) == newest || dependents.get(n).copied().unwrap_or(0) > 0)
            .collect();
        let mut report = PruneReport {
            dependents: m
                .epochs
                .iter()
                .map(|e| (e.number, dependents.get(&e.number).copied().unwrap_or(0)))
                .collect(),
            scanned,
            unplaced,
            dry_run: opts.dry_run,
            revision: m.revision,
            ..PruneReport::default()
        };
        if opts.dry_run {
            report.retained = keep.into_iter().collect();
            return Ok(report);
        }
        let removable: BTreeSet<u32> = m
            .epochs
            .iter()
            .map(|e| e.number)
            .filter(|n| !keep.contains(n))
            .collect();
        let after = self
            .update_manifest(|cur| {
                let newest = cur.newest().map(|e| e.number);
                let kept: Vec<Epoch> = cur
                    .epochs
                    .iter()
                    .filter(|e| Some(e.number) == newest || !removable.contains(&e.number))
                    .cloned()
                    .collect();
                if kept.len() == cur.epochs.len() {
                    return Ok(None);
                }
                let mut next = cur.clone();
                next.epochs = kept;
                Ok(Some(next))
            })
            .await?;
        let remaining: BTreeSet<u32> = after.epochs.iter().map(|e| e.number).collect();
        report.removed = m
            .epochs
            .iter()
            .map(|e| e.number)
            .filter(|n| !remaining.contains(n))
            .collect();
        report.retained = remaining.into_iter().collect();
        report.revision = after.revision;
        tracing::info!(
            event = "durability.migration.epochs_pruned",
            removed = ?report.removed,
            retained = ?report.retained,
            scanned,
            "epochs pruned"
        );
        Ok(report)
    }

    /// Every placement exception whose key's mapping still names its shard.
    async fn exception_set(&self) -> Result<HashMap<String, Exception>> {
        let (jname, js) = self.journal_shard()?;
        let d = js.dialect();
        let mut out = HashMap::new();
        let mut after = String::new();
        loop {
            let rows = js
                .query(&d.exception_page(&self.scope, &after, 500))
                .await
                .map_err(|e| MigrationError::shard(jname, e))?;
            let n = rows.len();
            for r in &rows {
                let key = crate::journal::text(r, "mkey")?;
                let shard = crate::journal::text(r, "shard")?;
                let epoch = epoch_number(r.get("epoch"))?;
                let mapped = self
                    .mapping
                    .get(&key)
                    .await
                    .map_err(MigrationError::MappingUnavailable)?;
                if mapped.as_deref() == Some(shard.as_str()) {
                    out.insert(key.clone(), Exception { shard, epoch });
                }
                after = key;
            }
            if n < 500 {
                return Ok(out);
            }
        }
    }

    /// Counts the rows depending on each epoch: (dependents, scanned, unplaced).
    async fn census(
        &self,
        m: &Manifest,
        specs: &[TableSpec],
        exceptions: &HashMap<String, Exception>,
        page: usize,
        concurrency: usize,
    ) -> Result<Census> {
        // Owned jobs: a closure over borrowed (table, shard) pairs would make
        // the future not `Send` for every lifetime (a higher-ranked bound the
        // compiler cannot prove), so `prune_epochs` could not be spawned.
        let mut jobs: Vec<(TableSpec, String)> = Vec::new();
        for spec in specs {
            for name in self.shards.keys() {
                jobs.push((spec.clone(), name.clone()));
            }
        }
        let results: Vec<Result<Census>> =
            futures::stream::iter(jobs)
                .map(|(spec, name)| async move {
                    self.census_one(m, &spec, &name, exceptions, page).await
                })
                .buffer_unordered(concurrency)
                .collect()
                .await;
        let mut dependents = BTreeMap::new();
        let (mut scanned, mut unplaced) = (0, 0);
        for r in results {
            let (d, s, u) = r?;
            for (k, v) in d {
                *dependents.entry(k).or_insert(0) += v;
            }
            scanned += s;
            unplaced += u;
        }
        Ok((dependents, scanned, unplaced))
    }

    async fn census_one(
        &self,
        m: &Manifest,
        spec: &TableSpec,
        shard_name: &str,
        exceptions: &HashMap<String, Exception>,
        page: usize,
    ) -> Result<Census> {
        let (name, shard) = self.shard_named(shard_name)?;
        let d = shard.dialect();
        let known: BTreeSet<u32> = m.epochs.iter().map(|e| e.number).collect();
        let mut dependents = BTreeMap::new();
        let (mut scanned, mut unplaced) = (0u64, 0u64);
        let mut after: Option<Value> = None;
        loop {
            let rows = shard
                .query(&d.key_page(&spec.name, &spec.key_col, after.as_ref(), page))
                .await
                .map_err(|e| MigrationError::shard(name, e))?;
            let n = rows.len();
            for r in rows {
                let raw = r.get("k").cloned().unwrap_or(Value::Null);
                scanned += 1;
                let key = match &raw {
                    Value::Text(k) => Some(k.clone()),
                    Value::Integer(i) => Some(i.to_string()),
                    // A binary key holds the key's UTF-8 bytes; other bytes
                    // are no key a router can name, so no epoch places them.
                    Value::Blob(b) => String::from_utf8(b.clone()).ok(),
                    other => return Err(MigrationError::Corrupt(format!("key column: {other:?}"))),
                };
                let epoch = key.and_then(|key| match exceptions.get(&key) {
                    Some(x) if x.shard == shard_name && known.contains(&x.epoch) => Some(x.epoch),
                    _ => m
                        .epochs
                        .iter()
                        .find(|e| e.owner(&key) == Some(shard_name))
                        .map(|e| e.number),
                });
                match epoch {
                    Some(e) => *dependents.entry(e).or_insert(0) += 1,
                    None => unplaced += 1,
                }
                after = Some(raw);
            }
            if n < page {
                return Ok((dependents, scanned, unplaced));
            }
        }
    }
}
