//! `reconcile_allocations`: compares the coordinator's allocation ledger
//! with routing, optionally checks that each key's row exists where routing
//! points, and — only when asked — writes a missing mapping or prunes a
//! settled ledger row.
//!
//! Routing is the record: a key routes to its mapping in the mapping store,
//! or, with no mapping, to the owner computed placement gives it
//! ([`Router::computed_owner`]). The ledger is advisory. A disagreement
//! between the two is reported and never resolved here.

use crate::config;
use crate::dialect::Ident;
use crate::error::{MigrationError, Result};
use crate::ledger::AllocationLedger;
use crate::router::Router;

/// Most entries kept in each key list of a [`ReconcileReport`] (the counts
/// stay exact).
pub const MAX_RECONCILE_KEYS: usize = 1000;
/// Default number of ledger rows read per page.
pub const DEFAULT_RECONCILE_PAGE_SIZE: usize = 500;
/// Largest accepted [`ReconcileOptions::page_size`].
pub const MAX_RECONCILE_PAGE_SIZE: usize = 10_000;

/// One table whose rows [`VerifyRecords`] probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordTable {
    /// The table name (validated with [`Ident::new`]).
    pub table: String,
    /// The table's key column. `None` uses the key column the table was
    /// configured with ([`crate::MigrationConfig::table_with_key_column`]),
    /// else `id`.
    pub key_column: Option<String>,
}

impl RecordTable {
    /// A table probed by its configured key column (else `id`).
    pub fn new(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            key_column: None,
        }
    }

    /// A table probed by an explicit key column.
    pub fn with_key_column(table: impl Into<String>, key_column: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            key_column: Some(key_column.into()),
        }
    }
}

/// Which tables to probe for each ledger key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyRecords {
    /// The tables, probed in order until one holds the key. An empty list
    /// makes every probe unable to run (every row counts as unchecked).
    pub tables: Vec<RecordTable>,
}

impl VerifyRecords {
    /// Probes the given tables, each by its configured key column (else `id`).
    pub fn tables<I, T>(tables: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        Self {
            tables: tables.into_iter().map(RecordTable::new).collect(),
        }
    }
}

/// Options of [`Router::reconcile_allocations`].
#[derive(Debug, Clone)]
pub struct ReconcileOptions {
    /// Ledger rows read per page, `1..=10_000` (default 500).
    pub page_size: usize,
    /// Most ledger rows examined; `None` walks the whole ledger. `Some(0)`
    /// is refused with `INVALID_CONFIG`.
    pub limit: Option<usize>,
    /// Start after this ledger key (exclusive): pass a previous report's
    /// [`ReconcileReport::resume_after`] to continue a limited run.
    pub after: Option<String>,
    /// Probe each key's row on the shard routing points at. Without it no
    /// shard is queried and every examined row counts as unchecked.
    pub verify_records: Option<VerifyRecords>,
    /// Write a mapping to the ledger shard for each key that has neither a
    /// mapping nor a computed owner, when the probe found its row there.
    /// Requires `verify_records` (`RECONCILE_VERIFY_REQUIRED`).
    pub repair: bool,
    /// Remove ledger rows that agree with an explicit mapping (and, with
    /// `verify_records`, whose row was verified).
    pub prune_verified: bool,
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        Self {
            page_size: DEFAULT_RECONCILE_PAGE_SIZE,
            limit: None,
            after: None,
            verify_records: None,
            repair: false,
            prune_verified: false,
        }
    }
}

/// A ledger row whose shard is not the shard routing names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Disagreement {
    /// The key.
    pub key: String,
    /// The shard the ledger records.
    pub ledger_shard: String,
    /// The shard routing names; `None` when the key has no mapping and no
    /// computed owner.
    pub routed_shard: Option<String>,
    /// Whether `routed_shard` comes from an explicit mapping (else from
    /// computed placement, or nothing).
    pub mapped: bool,
}

/// A ledger key whose row no listed table holds on the probed shard.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MissingRecord {
    /// The key.
    pub key: String,
    /// The shard probed (routing's shard, or the ledger shard of an
    /// unrouted key).
    pub shard: String,
}

/// Why a requested probe could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UncheckedReason {
    /// [`VerifyRecords::tables`] is empty.
    NoTables,
    /// The shard to probe is not configured.
    UnknownShard,
    /// A probe query failed and no other listed table held the key.
    ProbeFailed {
        /// The first table whose probe failed.
        table: String,
        /// The backend error's message.
        error: String,
    },
}

/// A ledger key whose requested probe could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UncheckedRecord {
    /// The key.
    pub key: String,
    /// The shard that was to be probed.
    pub shard: String,
    /// Why the probe could not run.
    pub reason: UncheckedReason,
}

/// What [`Router::reconcile_allocations`] found and did.
///
/// Counts are exact; each list keeps at most [`MAX_RECONCILE_KEYS`] entries,
/// in ledger key order. `routing_agreed + disagreeing_count == examined` and
/// `record_verified + record_missing_count + record_unchecked == examined`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconcileReport {
    /// Ledger rows examined.
    pub examined: u64,
    /// Rows whose ledger shard is the shard routing names.
    pub routing_agreed: u64,
    /// Rows whose ledger shard is not the shard routing names (unrouted
    /// keys included, with `routed_shard: None`).
    pub disagreeing_count: u64,
    /// The first disagreeing rows.
    pub disagreeing: Vec<Disagreement>,
    /// Rows whose key has no mapping and no computed owner (a subset of the
    /// disagreeing rows).
    pub unrouted: u64,
    /// Rows whose key a listed table holds on the probed shard.
    pub record_verified: u64,
    /// Rows whose key no listed table holds on the probed shard.
    pub record_missing_count: u64,
    /// The first missing rows.
    pub record_missing: Vec<MissingRecord>,
    /// Rows not probed: no `verify_records`, or the probe could not run.
    pub record_unchecked: u64,
    /// The first rows whose requested probe could not run (empty without
    /// `verify_records`, where nothing was requested).
    pub unchecked: Vec<UncheckedRecord>,
    /// Mappings written by `repair`.
    pub repaired_count: u64,
    /// The first keys `repair` mapped (each to its ledger shard).
    pub repaired: Vec<String>,
    /// Ledger rows removed by `prune_verified`.
    pub pruned_count: u64,
    /// The first keys whose ledger row was pruned.
    pub pruned: Vec<String>,
    /// Ledger pages read that held rows.
    pub pages: u64,
    /// The last key examined when the run stopped at `limit` with ledger
    /// rows left after it; `None` when the ledger was read to its end.
    pub resume_after: Option<String>,
}

fn push_capped<T>(v: &mut Vec<T>, x: T) {
    if v.len() < MAX_RECONCILE_KEYS {
        v.push(x);
    }
}

/// The outcome of probing one key.
enum Probe {
    NotRequested,
    Verified,
    Missing,
    Unchecked(UncheckedReason),
}

/// What every row of one run shares.
struct RowCtx<'a> {
    opts: &'a ReconcileOptions,
    tables: Option<&'a [(Ident, Ident)]>,
    computed_owner: &'a (dyn Fn(&str) -> Option<String> + Sync),
    ledger: &'a dyn AllocationLedger,
}

impl Router {
    /// Compares the coordinator's allocation ledger with routing, page by
    /// page, and reports the result. The mapping store is the record and the
    /// ledger is advisory.
    ///
    /// For each ledger row `(key, ledger_shard)`, routing is the key's
    /// mapping (read fresh from the mapping store, never from the cache) or,
    /// with none, [`Router::computed_owner`]. The row agrees when routing
    /// names the ledger shard; otherwise it is reported as disagreeing and
    /// left alone — neither the mapping nor the ledger row is changed.
    ///
    /// With [`ReconcileOptions::verify_records`], the key is probed (a
    /// `SELECT` of the key column, the key a bound parameter) in each listed
    /// table on the shard routing names, or on the ledger shard when the key
    /// is unrouted. Each row then counts as exactly one of verified (a listed
    /// table holds the key), missing (no listed table does, every probe ran)
    /// or unchecked (the shard is not configured, the table list is empty, or
    /// a probe failed and no other table held the key). A probe failure does
    /// not stop the run. A row found on a shard is not proof it is the
    /// authoritative copy: a shard holding a tombstone can keep a retained
    /// row, and for moved keys the journal is the authority.
    ///
    /// Nothing is written unless a flag asks for it:
    /// - `repair` maps (`put_if_absent`) each unrouted key to its ledger
    ///   shard, only when the probe found the row there and the key is valid
    ///   ([`crate::validate_key`]). A mapping another writer created first is
    ///   kept and the key is not counted as repaired.
    /// - `prune_verified` removes (`remove_if`, so a row re-recorded meanwhile
    ///   stays) each ledger row that agrees with an explicit mapping and,
    ///   with `verify_records`, was verified. Rows that match only computed
    ///   placement stay.
    ///
    /// The ledger is walked in key order with a cursor, so rows pruned by the
    /// run and rows recorded concurrently behind the cursor do not disturb
    /// it. `limit` stops the run early; [`ReconcileReport::resume_after`]
    /// then tells where to continue.
    ///
    /// Every option is checked before any I/O.
    ///
    /// # Errors
    /// `COORDINATOR_NOT_CONFIGURED` without a coordinator;
    /// `RECONCILE_VERIFY_REQUIRED` for `repair` without `verify_records`;
    /// `INVALID_CONFIG` for a page size outside `1..=10_000` or a zero
    /// limit; `INVALID_IDENTIFIER` for a bad table or key column name;
    /// under computed placement, the errors of [`Router::manifest`] when no
    /// manifest can be confirmed or was ever cached;
    /// `MAPPING_UNAVAILABLE` when the mapping store fails (for a repair
    /// write the outcome is unknown); `COORDINATOR_UNAVAILABLE` when the ledger fails (for a prune the
    /// outcome is unknown); `CORRUPT_RECORD` when a ledger page is not in
    /// strictly increasing key order. Rows handled before an error keep
    /// their writes.
    pub async fn reconcile_allocations(&self, opts: &ReconcileOptions) -> Result<ReconcileReport> {
        self.reconcile_with(opts, &|key: &str| self.computed_owner(key))
            .await
    }

    /// [`Router::reconcile_allocations`] with the computed owner supplied
    /// (unit tests inject computed placement through it).
    pub(crate) async fn reconcile_with(
        &self,
        opts: &ReconcileOptions,
        computed_owner: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> Result<ReconcileReport> {
        let ledger = self
            .coordinator
            .as_ref()
            .ok_or(MigrationError::CoordinatorNotConfigured)?;
        if opts.repair && opts.verify_records.is_none() {
            return Err(MigrationError::ReconcileVerifyRequired);
        }
        if !(1..=MAX_RECONCILE_PAGE_SIZE).contains(&opts.page_size) {
            return Err(MigrationError::InvalidConfig(format!(
                "reconcile page size {} is outside 1..={MAX_RECONCILE_PAGE_SIZE}",
                opts.page_size
            )));
        }
        if opts.limit == Some(0) {
            return Err(MigrationError::InvalidConfig(
                "reconcile limit must be at least 1".into(),
            ));
        }
        let tables = match &opts.verify_records {
            None => None,
            Some(v) => Some(self.record_tables(v)?),
        };

        if self.computed() {
            // Computed owners come from the router's cached manifest: confirm
            // one before the first row, so that no key looks unrouted (and
            // gets a mapping from `repair`) only because this router had not
            // loaded the manifest yet.
            self.manifest().await?;
        }
        let ctx = RowCtx {
            opts,
            tables: tables.as_deref(),
            computed_owner,
            ledger: ledger.as_ref(),
        };
        let mut report = ReconcileReport::default();
        let mut after = opts.after.clone();
        let mut remaining = opts.limit;
        loop {
            let want = remaining.map_or(opts.page_size, |r| r.min(opts.page_size));
            if want == 0 {
                // Stopped at the limit: say where to continue, if anywhere.
                let more = ledger
                    .scan(after.as_deref(), 1)
                    .await
                    .map_err(MigrationError::CoordinatorUnavailable)?;
                if !more.is_empty() {
                    report.resume_after.clone_from(&after);
                }
                break;
            }
            let rows = ledger
                .scan(after.as_deref(), want)
                .await
                .map_err(MigrationError::CoordinatorUnavailable)?;
            if rows.is_empty() {
                break;
            }
            report.pages += 1;
            for (key, ledger_shard) in rows.into_iter().take(want) {
                if after.as_deref().is_some_and(|a| key.as_str() <= a) {
                    return Err(MigrationError::Corrupt(format!(
                        "allocation ledger page is not in increasing key order at {:?}",
                        key.chars().take(80).collect::<String>()
                    )));
                }
                self.reconcile_row(&ctx, &key, &ledger_shard, &mut report)
                    .await?;
                after = Some(key);
                if let Some(r) = remaining.as_mut() {
                    *r -= 1;
                }
            }
        }
        if report.disagreeing_count > 0 || report.record_missing_count > 0 {
            tracing::warn!(
                event = "durability.migration.reconcile_mismatch",
                examined = report.examined,
                disagreeing = report.disagreeing_count,
                unrouted = report.unrouted,
                missing = report.record_missing_count,
                unchecked = report.record_unchecked,
                repaired = report.repaired_count,
                pruned = report.pruned_count,
                "reconciliation found disagreements or missing records"
            );
        } else {
            tracing::info!(
                event = "durability.migration.reconcile_clean",
                examined = report.examined,
                verified = report.record_verified,
                unchecked = report.record_unchecked,
                pruned = report.pruned_count,
                "reconciliation clean"
            );
        }
        Ok(report)
    }

    /// Validates the probed tables and resolves their key columns.
    fn record_tables(&self, v: &VerifyRecords) -> Result<Vec<(Ident, Ident)>> {
        v.tables
            .iter()
            .map(|t| {
                let spec = self.table_spec_for(&t.table, t.key_column.as_deref())?;
                Ok((spec.name, spec.key_col))
            })
            .collect()
    }

    async fn reconcile_row(
        &self,
        ctx: &RowCtx<'_>,
        key: &str,
        ledger_shard: &str,
        report: &mut ReconcileReport,
    ) -> Result<()> {
        let mapped = self.mapping_fresh(key).await?;
        let routed = match &mapped {
            Some(s) => Some(s.clone()),
            None => (ctx.computed_owner)(key),
        };
        report.examined += 1;
        if routed.as_deref() == Some(ledger_shard) {
            report.routing_agreed += 1;
        } else {
            report.disagreeing_count += 1;
            if routed.is_none() {
                report.unrouted += 1;
            }
            push_capped(
                &mut report.disagreeing,
                Disagreement {
                    key: key.to_owned(),
                    ledger_shard: ledger_shard.to_owned(),
                    routed_shard: routed.clone(),
                    mapped: mapped.is_some(),
                },
            );
        }

        let target = routed.as_deref().unwrap_or(ledger_shard);
        let probe = match ctx.tables {
            None => Probe::NotRequested,
            Some(t) => self.probe(target, key, t).await,
        };
        let verified = matches!(probe, Probe::Verified);
        match probe {
            Probe::NotRequested => report.record_unchecked += 1,
            Probe::Verified => report.record_verified += 1,
            Probe::Missing => {
                report.record_missing_count += 1;
                push_capped(
                    &mut report.record_missing,
                    MissingRecord {
                        key: key.to_owned(),
                        shard: target.to_owned(),
                    },
                );
            }
            Probe::Unchecked(reason) => {
                report.record_unchecked += 1;
                push_capped(
                    &mut report.unchecked,
                    UncheckedRecord {
                        key: key.to_owned(),
                        shard: target.to_owned(),
                        reason,
                    },
                );
            }
        }

        if ctx.opts.repair && routed.is_none() && verified {
            self.repair_mapping(key, ledger_shard, report).await?;
        }

        let prunable =
            mapped.as_deref() == Some(ledger_shard) && (ctx.tables.is_none() || verified);
        if ctx.opts.prune_verified
            && prunable
            && ctx
                .ledger
                .remove_if(key, ledger_shard)
                .await
                .map_err(MigrationError::CoordinatorUnavailable)?
        {
            report.pruned_count += 1;
            push_capped(&mut report.pruned, key.to_owned());
        }
        Ok(())
    }

    /// Maps an unrouted key whose row was found on its ledger shard.
    async fn repair_mapping(
        &self,
        key: &str,
        ledger_shard: &str,
        report: &mut ReconcileReport,
    ) -> Result<()> {
        if let Err(e) = config::validate_key(key) {
            tracing::warn!(
                event = "durability.migration.reconcile_repair_skipped",
                error = %e,
                "ledger key invalid; repair skipped"
            );
            return Ok(());
        }
        let holder = self
            .mapping
            .put_if_absent(key, ledger_shard)
            .await
            .map_err(MigrationError::MappingUnavailable)?;
        self.cache_set(key, &holder);
        if holder == ledger_shard {
            report.repaired_count += 1;
            push_capped(&mut report.repaired, key.to_owned());
            tracing::info!(
                event = "durability.migration.reconcile_repaired",
                key,
                shard = ledger_shard,
                "mapping repaired from the ledger"
            );
        } else {
            tracing::warn!(
                event = "durability.migration.reconcile_repair_lost_race",
                key,
                ledger_shard,
                mapped = %holder,
                "repair lost a race: the key is mapped elsewhere"
            );
        }
        Ok(())
    }

    /// Probes `key` in each table on `shard_name`, stopping at the first hit.
    async fn probe(&self, shard_name: &str, key: &str, tables: &[(Ident, Ident)]) -> Probe {
        if tables.is_empty() {
            return Probe::Unchecked(UncheckedReason::NoTables);
        }
        let Some(shard) = self.shards.get(shard_name) else {
            return Probe::Unchecked(UncheckedReason::UnknownShard);
        };
        let d = shard.dialect();
        let mut failure = None;
        for (table, key_col) in tables {
            match shard.query(&d.key_probe(table, key_col, key)).await {
                Ok(rows) if !rows.is_empty() => return Probe::Verified,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(
                        event = "durability.migration.reconcile_probe_failed",
                        shard = shard_name,
                        table = table.as_str(),
                        error = %e,
                        "record probe failed"
                    );
                    failure.get_or_insert(UncheckedReason::ProbeFailed {
                        table: table.as_str().to_owned(),
                        error: e.to_string(),
                    });
                }
            }
        }
        failure.map_or(Probe::Missing, Probe::Unchecked)
    }
}

#[cfg(test)]
mod tests;
