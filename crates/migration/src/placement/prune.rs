//! `prune_epochs`: the census over every page of every listed table on
//! every shard, and the removal of the epochs no row depends on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::StreamExt;

use super::{Epoch, Manifest};
use crate::config::TableSpec;
use crate::error::{MigrationError, Result};
use crate::router::Core;
use crate::value::Value;

/// Default page size of the pruning census.
pub const DEFAULT_PRUNE_PAGE_SIZE: usize = 500;

/// Default number of (table, shard) census scans run at once.
pub const DEFAULT_PRUNE_CONCURRENCY: usize = 4;

/// Options of [`Router::prune_epochs`](crate::Router::prune_epochs).
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

/// What [`Router::prune_epochs`](crate::Router::prune_epochs) found and did.
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

fn epoch_number(v: Option<&Value>) -> Result<u32> {
    v.and_then(Value::as_integer)
        .and_then(|i| u32::try_from(i).ok())
        .ok_or_else(|| MigrationError::Corrupt(format!("epoch column: {v:?}")))
}

impl Core {
    /// See [`Router::prune_epochs`](crate::Router::prune_epochs).
    pub(crate) async fn prune_epochs(&self, opts: PruneOptions) -> Result<PruneReport> {
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
