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
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::dialect::Dialect;
    use crate::error::BackendError;
    use crate::ledger::MemoryLedger;
    use crate::mapping::{MappingStore, MemoryMappingStore};
    use crate::shard::{BatchSupport, BoxFuture, Shard, Statement};
    use crate::value::{Row, Value};
    use crate::{MigrationConfig, conformance};

    /// A shard answering only probe statements, from a set of keys per
    /// table; tables in `failing` make the probe fail. Counts every call.
    #[derive(Default)]
    struct MemShard {
        rows: Mutex<BTreeMap<String, BTreeSet<String>>>,
        failing: Mutex<BTreeSet<String>>,
        queries: AtomicU64,
        writes: AtomicU64,
    }

    impl MemShard {
        fn with(rows: &[(&str, &str)]) -> Arc<Self> {
            let s = Self::default();
            for (t, k) in rows {
                s.rows
                    .lock()
                    .unwrap()
                    .entry((*t).to_owned())
                    .or_default()
                    .insert((*k).to_owned());
            }
            Arc::new(s)
        }
        fn fail(&self, table: &str) {
            self.failing.lock().unwrap().insert(table.to_owned());
        }
        fn queries(&self) -> u64 {
            self.queries.load(Ordering::SeqCst)
        }
    }

    impl Shard for MemShard {
        fn dialect(&self) -> Dialect {
            Dialect::Sqlite
        }
        fn batch_support(&self) -> BatchSupport {
            BatchSupport::Atomic
        }
        fn execute<'a>(&'a self, _: &'a Statement) -> BoxFuture<'a, Result<u64, BackendError>> {
            self.writes.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Err("memshard is read-only".into()) })
        }
        fn query<'a>(
            &'a self,
            stmt: &'a Statement,
        ) -> BoxFuture<'a, Result<Vec<Row>, BackendError>> {
            self.queries.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                // SELECT "k" FROM "t" WHERE "k" = ?1
                let table = stmt
                    .sql
                    .split(" FROM \"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .ok_or("not a probe")?
                    .to_owned();
                assert!(stmt.sql.starts_with("SELECT \""), "{}", stmt.sql);
                assert_eq!(stmt.params.len(), 1, "the key is bound");
                if self.failing.lock().unwrap().contains(&table) {
                    return Err(format!("no such table: {table}").into());
                }
                let key = stmt.params[0].as_text().ok_or("key is text")?.to_owned();
                let hit = self
                    .rows
                    .lock()
                    .unwrap()
                    .get(&table)
                    .is_some_and(|s| s.contains(&key));
                Ok(if hit {
                    vec![Row::from([("k".to_owned(), Value::Text(key))])]
                } else {
                    Vec::new()
                })
            })
        }
        fn batch<'a>(
            &'a self,
            _: &'a [Statement],
        ) -> BoxFuture<'a, Result<Vec<u64>, BackendError>> {
            self.writes.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Err("memshard is read-only".into()) })
        }
    }

    /// A ledger wrapper counting calls; `fail` makes every call fail.
    #[derive(Default)]
    struct CountingLedger {
        inner: MemoryLedger,
        scans: AtomicU64,
        removes: AtomicU64,
        fail: bool,
    }

    impl AllocationLedger for CountingLedger {
        fn record<'a>(
            &'a self,
            key: &'a str,
            shard: &'a str,
        ) -> BoxFuture<'a, Result<(), BackendError>> {
            self.inner.record(key, shard)
        }
        fn scan<'a>(
            &'a self,
            after: Option<&'a str>,
            limit: usize,
        ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
            self.scans.fetch_add(1, Ordering::SeqCst);
            if self.fail {
                return Box::pin(async { Err("ledger down".into()) });
            }
            self.inner.scan(after, limit)
        }
        fn remove_if<'a>(
            &'a self,
            key: &'a str,
            shard: &'a str,
        ) -> BoxFuture<'a, Result<bool, BackendError>> {
            self.removes.fetch_add(1, Ordering::SeqCst);
            self.inner.remove_if(key, shard)
        }
    }

    /// A ledger that returns the same page forever (out of order after
    /// the first).
    struct StuckLedger;

    impl AllocationLedger for StuckLedger {
        fn record<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
            Box::pin(async { Ok(()) })
        }
        fn scan<'a>(
            &'a self,
            _: Option<&'a str>,
            _: usize,
        ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
            Box::pin(async { Ok(vec![("a".to_owned(), "s0".to_owned())]) })
        }
        fn remove_if<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<bool, BackendError>> {
            Box::pin(async { Ok(false) })
        }
    }

    struct Env {
        s0: Arc<MemShard>,
        s1: Arc<MemShard>,
        mapping: Arc<MemoryMappingStore>,
        ledger: Arc<CountingLedger>,
        router: Router,
    }

    async fn env(s0: Arc<MemShard>, s1: Arc<MemShard>, ledger: CountingLedger) -> Env {
        let mapping = Arc::new(MemoryMappingStore::new());
        let ledger = Arc::new(ledger);
        let config = MigrationConfig::new(mapping.clone())
            .shard("s0", s0.clone())
            .shard("s1", s1.clone())
            .journal_shard("s0")
            .table("users")
            .table_with_key_column("orgs", "org_id")
            .coordinator(ledger.clone());
        let router = Router::new(config).unwrap();
        Env {
            s0,
            s1,
            mapping,
            ledger,
            router,
        }
    }

    async fn plain_env() -> Env {
        env(
            MemShard::with(&[]),
            MemShard::with(&[]),
            CountingLedger::default(),
        )
        .await
    }

    async fn ledger_rows(e: &Env) -> Vec<(String, String)> {
        e.ledger.inner.scan(None, 100_000).await.unwrap()
    }

    async fn mappings(e: &Env) -> Vec<(String, String)> {
        e.mapping.scan(None, 100_000).await.unwrap()
    }

    fn verify_users() -> Option<VerifyRecords> {
        Some(VerifyRecords::tables(["users"]))
    }

    #[tokio::test]
    async fn memory_ledger_passes_the_conformance_suite() {
        conformance::ledger_suite(&MemoryLedger::new()).await;
    }

    #[test]
    fn the_reconcile_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let router = Router::new(
            MigrationConfig::new(Arc::new(MemoryMappingStore::new()))
                .shard("s0", MemShard::with(&[])),
        )
        .unwrap();
        let opts = ReconcileOptions::default();
        let fut = router.reconcile_allocations(&opts);
        assert_send(&fut);
    }

    #[tokio::test]
    async fn refusals_come_before_any_io_and_write_nothing() {
        // No coordinator.
        let s0 = MemShard::with(&[("users", "k")]);
        let mapping = Arc::new(MemoryMappingStore::new());
        let router =
            Router::new(MigrationConfig::new(mapping.clone()).shard("s0", s0.clone())).unwrap();
        let opts = ReconcileOptions {
            repair: true,
            verify_records: verify_users(),
            ..ReconcileOptions::default()
        };
        let err = router.reconcile_allocations(&opts).await.unwrap_err();
        assert_eq!(err.code(), "COORDINATOR_NOT_CONFIGURED");
        assert!(!err.is_retryable());

        let e = plain_env().await;
        e.ledger.record("k", "s0").await.unwrap();
        e.mapping.put("m", "s1").await.unwrap();
        let cases = [
            (
                ReconcileOptions {
                    repair: true,
                    prune_verified: true,
                    ..ReconcileOptions::default()
                },
                "RECONCILE_VERIFY_REQUIRED",
            ),
            (
                ReconcileOptions {
                    page_size: 0,
                    ..ReconcileOptions::default()
                },
                "INVALID_CONFIG",
            ),
            (
                ReconcileOptions {
                    page_size: MAX_RECONCILE_PAGE_SIZE + 1,
                    ..ReconcileOptions::default()
                },
                "INVALID_CONFIG",
            ),
            (
                ReconcileOptions {
                    limit: Some(0),
                    ..ReconcileOptions::default()
                },
                "INVALID_CONFIG",
            ),
            (
                ReconcileOptions {
                    verify_records: Some(VerifyRecords::tables(["users; DROP TABLE x"])),
                    repair: true,
                    ..ReconcileOptions::default()
                },
                "INVALID_IDENTIFIER",
            ),
            (
                ReconcileOptions {
                    verify_records: Some(VerifyRecords {
                        tables: vec![RecordTable::with_key_column("users", "id\"")],
                    }),
                    ..ReconcileOptions::default()
                },
                "INVALID_IDENTIFIER",
            ),
        ];
        for (opts, code) in cases {
            let err = e.router.reconcile_allocations(&opts).await.unwrap_err();
            assert_eq!(err.code(), code, "{opts:?}");
        }
        assert_eq!(e.ledger.scans.load(Ordering::SeqCst), 0, "ledger not read");
        assert_eq!(e.ledger.removes.load(Ordering::SeqCst), 0);
        assert_eq!(e.s0.queries() + e.s1.queries(), 0, "no shard queried");
        assert_eq!(ledger_rows(&e).await, vec![("k".into(), "s0".into())]);
        assert_eq!(mappings(&e).await, vec![("m".into(), "s1".into())]);
    }

    #[tokio::test]
    async fn routing_agreement_is_counted_and_nothing_is_probed_or_written() {
        let e = plain_env().await;
        for (k, s) in [("agree", "s0"), ("differ", "s0"), ("unmapped", "s1")] {
            e.ledger.record(k, s).await.unwrap();
        }
        e.mapping.put("agree", "s0").await.unwrap();
        e.mapping.put("differ", "s1").await.unwrap();
        let r = e
            .router
            .reconcile_allocations(&ReconcileOptions::default())
            .await
            .unwrap();
        assert_eq!(r.examined, 3);
        assert_eq!(r.routing_agreed, 1);
        assert_eq!(r.disagreeing_count, 2);
        assert_eq!(r.unrouted, 1);
        assert_eq!(
            r.disagreeing,
            vec![
                Disagreement {
                    key: "differ".into(),
                    ledger_shard: "s0".into(),
                    routed_shard: Some("s1".into()),
                    mapped: true,
                },
                Disagreement {
                    key: "unmapped".into(),
                    ledger_shard: "s1".into(),
                    routed_shard: None,
                    mapped: false,
                },
            ]
        );
        assert_eq!(
            r.record_unchecked, 3,
            "without verify_records all unchecked"
        );
        assert_eq!(r.record_verified + r.record_missing_count, 0);
        assert!(r.unchecked.is_empty(), "nothing was requested");
        assert_eq!(r.pages, 1);
        assert_eq!(r.resume_after, None);
        assert_eq!(e.s0.queries() + e.s1.queries(), 0, "no shard queried");
        assert_eq!(e.ledger.removes.load(Ordering::SeqCst), 0);
        assert_eq!(ledger_rows(&e).await.len(), 3, "ledger untouched");
        assert_eq!(mappings(&e).await.len(), 2, "no mapping written");
    }

    #[tokio::test]
    async fn each_row_lands_in_exactly_one_record_count() {
        let s0 = MemShard::with(&[
            ("users", "found"),
            ("orgs", "in-orgs"),
            ("orgs", "flaky-but-found"),
        ]);
        let s1 = MemShard::with(&[("users", "mapped-away")]);
        s0.fail("broken");
        let e = env(s0, s1, CountingLedger::default()).await;
        for (k, s) in [
            ("found", "s0"),
            ("in-orgs", "s0"),
            ("flaky-but-found", "s0"),
            ("absent", "s0"),
            ("flaky", "s0"),
            ("ghost-shard", "s9"),
            ("mapped-away", "s0"),
            ("mapped-nowhere", "s0"),
        ] {
            e.ledger.record(k, s).await.unwrap();
        }
        // Routing points the probe at s1 (where the row is), not the ledger shard.
        e.mapping.put("mapped-away", "s1").await.unwrap();
        // A mapping naming an unconfigured shard.
        e.mapping.put("mapped-nowhere", "s7").await.unwrap();
        let opts = ReconcileOptions {
            verify_records: Some(VerifyRecords {
                tables: vec![
                    RecordTable::new("users"),
                    RecordTable::new("broken"),
                    RecordTable::new("orgs"),
                ],
            }),
            ..ReconcileOptions::default()
        };
        let r = e.router.reconcile_allocations(&opts).await.unwrap();
        assert_eq!(r.examined, 8);
        assert_eq!(
            r.record_verified + r.record_missing_count + r.record_unchecked,
            r.examined
        );
        // found (users), in-orgs and flaky-but-found (orgs after a failed
        // probe), mapped-away (on s1).
        assert_eq!(r.record_verified, 4);
        assert_eq!(r.record_missing_count, 0, "a failed probe is not a miss");
        assert_eq!(r.record_unchecked, 4);
        let reasons: Vec<(&str, &str, &UncheckedReason)> = r
            .unchecked
            .iter()
            .map(|u| (u.key.as_str(), u.shard.as_str(), &u.reason))
            .collect();
        let failed = UncheckedReason::ProbeFailed {
            table: "broken".into(),
            error: "no such table: broken".into(),
        };
        assert_eq!(
            reasons,
            vec![
                ("absent", "s0", &failed),
                ("flaky", "s0", &failed),
                ("ghost-shard", "s9", &UncheckedReason::UnknownShard),
                ("mapped-nowhere", "s7", &UncheckedReason::UnknownShard),
            ]
        );

        // Without the broken table, `absent` is a clean miss.
        let opts = ReconcileOptions {
            verify_records: Some(VerifyRecords {
                tables: vec![RecordTable::new("users"), RecordTable::new("orgs")],
            }),
            ..ReconcileOptions::default()
        };
        let r = e.router.reconcile_allocations(&opts).await.unwrap();
        assert_eq!(
            (
                r.record_verified,
                r.record_missing_count,
                r.record_unchecked
            ),
            (4, 2, 2)
        );
        assert_eq!(
            r.record_missing,
            vec![
                MissingRecord {
                    key: "absent".into(),
                    shard: "s0".into()
                },
                MissingRecord {
                    key: "flaky".into(),
                    shard: "s0".into()
                },
            ]
        );

        // An empty table list: every probe is unable to run.
        let opts = ReconcileOptions {
            verify_records: Some(VerifyRecords::default()),
            ..ReconcileOptions::default()
        };
        let r = e.router.reconcile_allocations(&opts).await.unwrap();
        assert_eq!(r.record_unchecked, 8);
        assert!(
            r.unchecked
                .iter()
                .all(|u| u.reason == UncheckedReason::NoTables)
        );
        assert_eq!(mappings(&e).await.len(), 2, "verification writes nothing");
        assert_eq!(ledger_rows(&e).await.len(), 8);
        assert_eq!(e.s0.writes.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn repair_maps_only_unrouted_keys_found_on_their_ledger_shard() {
        let s0 = MemShard::with(&[("users", "lost"), ("users", "mapped")]);
        let s1 = MemShard::with(&[("users", "elsewhere"), ("users", "computed")]);
        s0.fail("broken");
        let e = env(s0, s1, CountingLedger::default()).await;
        for (k, s) in [
            ("lost", "s0"),      // unrouted, row on s0: repaired
            ("gone", "s0"),      // unrouted, no row: not repaired
            ("elsewhere", "s0"), // unrouted, row only on s1: not repaired
            ("mapped", "s0"),    // mapped: never repaired
            ("computed", "s0"),  // computed owner s1: not unrouted
            ("nowhere", "s9"),   // unconfigured ledger shard: unchecked
            ("flaky", "s0"),     // probe failed: unchecked
        ] {
            e.ledger.record(k, s).await.unwrap();
        }
        e.mapping.put("mapped", "s0").await.unwrap();
        let computed = |k: &str| (k == "computed").then(|| "s1".to_owned());
        let opts = ReconcileOptions {
            verify_records: Some(VerifyRecords::tables(["users", "broken"])),
            repair: true,
            ..ReconcileOptions::default()
        };
        let r = e.router.reconcile_with(&opts, &computed).await.unwrap();
        assert_eq!(r.repaired_count, 1);
        assert_eq!(r.repaired, vec!["lost".to_owned()]);
        assert_eq!(r.unrouted, 5, "lost, gone, elsewhere, nowhere, flaky");
        assert_eq!(
            mappings(&e).await,
            vec![
                ("lost".to_owned(), "s0".to_owned()),
                ("mapped".to_owned(), "s0".to_owned())
            ]
        );
        assert_eq!(e.router.route("lost").await.unwrap().as_deref(), Some("s0"));
        assert_eq!(
            ledger_rows(&e).await.len(),
            7,
            "repair never touches the ledger"
        );
        // A second run finds the key routed and agreeing: nothing to repair.
        let r = e.router.reconcile_with(&opts, &computed).await.unwrap();
        assert_eq!(r.repaired_count, 0);
        assert_eq!(r.unrouted, 4);
    }

    #[tokio::test]
    async fn repair_keeps_a_mapping_another_writer_made_first() {
        /// A mapping store where someone else maps `race` to s1 just before
        /// our `put_if_absent`.
        struct Racy(MemoryMappingStore);
        impl MappingStore for Racy {
            fn get<'a>(
                &'a self,
                key: &'a str,
            ) -> BoxFuture<'a, Result<Option<String>, BackendError>> {
                self.0.get(key)
            }
            fn put<'a>(
                &'a self,
                key: &'a str,
                shard: &'a str,
            ) -> BoxFuture<'a, Result<(), BackendError>> {
                self.0.put(key, shard)
            }
            fn put_if_absent<'a>(
                &'a self,
                key: &'a str,
                shard: &'a str,
            ) -> BoxFuture<'a, Result<String, BackendError>> {
                Box::pin(async move {
                    self.0.put(key, "s1").await?;
                    self.0.put_if_absent(key, shard).await
                })
            }
            fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>> {
                self.0.remove(key)
            }
            fn scan<'a>(
                &'a self,
                after: Option<&'a str>,
                limit: usize,
            ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
                self.0.scan(after, limit)
            }
        }
        let ledger = Arc::new(MemoryLedger::new());
        ledger.record("race", "s0").await.unwrap();
        let mapping = Arc::new(Racy(MemoryMappingStore::new()));
        let router = Router::new(
            MigrationConfig::new(mapping.clone())
                .shard("s0", MemShard::with(&[("users", "race")]))
                .coordinator(ledger),
        )
        .unwrap();
        let opts = ReconcileOptions {
            verify_records: verify_users(),
            repair: true,
            ..ReconcileOptions::default()
        };
        let r = router.reconcile_allocations(&opts).await.unwrap();
        assert_eq!(r.repaired_count, 0, "the other writer's mapping wins");
        assert_eq!(mapping.get("race").await.unwrap().as_deref(), Some("s1"));
    }

    #[tokio::test]
    async fn prune_removes_only_agreeing_mapped_verified_rows() {
        let s0 = MemShard::with(&[
            ("users", "settled"),
            ("users", "computed"),
            ("users", "unrouted"),
        ]);
        let e = env(s0, MemShard::with(&[]), CountingLedger::default()).await;
        for (k, s) in [
            ("settled", "s0"),  // mapped s0, row on s0: pruned
            ("no-row", "s0"),   // mapped s0, no row: kept with verification
            ("differ", "s0"),   // mapped s1: kept
            ("computed", "s0"), // agrees with computed placement only: kept
            ("unrouted", "s0"), // no routing: kept
        ] {
            e.ledger.record(k, s).await.unwrap();
        }
        e.mapping.put("settled", "s0").await.unwrap();
        e.mapping.put("no-row", "s0").await.unwrap();
        e.mapping.put("differ", "s1").await.unwrap();
        let computed = |k: &str| (k == "computed").then(|| "s0".to_owned());
        let opts = ReconcileOptions {
            verify_records: verify_users(),
            prune_verified: true,
            ..ReconcileOptions::default()
        };
        let r = e.router.reconcile_with(&opts, &computed).await.unwrap();
        assert_eq!(r.routing_agreed, 3, "settled, no-row, computed");
        assert_eq!(r.pruned_count, 1);
        assert_eq!(r.pruned, vec!["settled".to_owned()]);
        let left: Vec<String> = ledger_rows(&e).await.into_iter().map(|(k, _)| k).collect();
        assert_eq!(left, vec!["computed", "differ", "no-row", "unrouted"]);
        assert_eq!(mappings(&e).await.len(), 3, "prune never touches mappings");

        // Without verification, agreement with an explicit mapping suffices.
        let opts = ReconcileOptions {
            prune_verified: true,
            ..ReconcileOptions::default()
        };
        let r = e.router.reconcile_with(&opts, &computed).await.unwrap();
        assert_eq!(r.pruned, vec!["no-row".to_owned()]);
        assert_eq!(
            (e.s0.queries(), e.s1.queries()),
            (4, 1),
            "only the first run probed, differ on s1 where routing points"
        );
        let left: Vec<String> = ledger_rows(&e).await.into_iter().map(|(k, _)| k).collect();
        assert_eq!(left, vec!["computed", "differ", "unrouted"]);
    }

    #[tokio::test]
    async fn key_lists_are_capped_and_counts_exact() {
        let e = plain_env().await;
        for i in 0..1500 {
            let k = format!("k{i:05}");
            e.ledger.record(&k, "s0").await.unwrap();
            e.mapping.put(&k, "s1").await.unwrap();
        }
        let opts = ReconcileOptions {
            verify_records: verify_users(),
            page_size: 128,
            ..ReconcileOptions::default()
        };
        let r = e.router.reconcile_allocations(&opts).await.unwrap();
        assert_eq!(r.examined, 1500);
        assert_eq!(r.disagreeing_count, 1500);
        assert_eq!(r.disagreeing.len(), MAX_RECONCILE_KEYS);
        assert_eq!(r.disagreeing[999].key, "k00999", "the first keys, in order");
        assert_eq!(r.record_missing_count, 1500);
        assert_eq!(r.record_missing.len(), MAX_RECONCILE_KEYS);
        assert_eq!(r.pages, 12, "ceil(1500 / 128)");
    }

    #[tokio::test]
    async fn pages_are_walked_to_the_end_and_limit_resumes() {
        let e = plain_env().await;
        for i in 0..25 {
            e.ledger.record(&format!("k{i:02}"), "s0").await.unwrap();
        }
        let all = ReconcileOptions {
            page_size: 4,
            ..ReconcileOptions::default()
        };
        let r = e.router.reconcile_allocations(&all).await.unwrap();
        assert_eq!((r.examined, r.pages, r.resume_after.clone()), (25, 7, None));
        assert_eq!(r.disagreeing.len(), 25);

        let mut opts = ReconcileOptions {
            page_size: 4,
            limit: Some(10),
            ..ReconcileOptions::default()
        };
        let r = e.router.reconcile_allocations(&opts).await.unwrap();
        assert_eq!(r.examined, 10);
        assert_eq!(r.pages, 3, "4 + 4 + 2");
        assert_eq!(r.resume_after.as_deref(), Some("k09"));
        assert_eq!(r.disagreeing.last().unwrap().key, "k09");

        let mut seen = r.examined;
        let mut after = r.resume_after;
        let mut runs = 1;
        while let Some(a) = after {
            runs += 1;
            assert!(runs < 10, "resuming terminates");
            opts.after = Some(a);
            let r = e.router.reconcile_allocations(&opts).await.unwrap();
            seen += r.examined;
            after = r.resume_after;
        }
        assert_eq!(runs, 3, "10 + 10 + 5");
        assert_eq!(seen, 25, "resumed runs cover every row once");

        // A limit that ends exactly at the last row leaves nothing to resume.
        let r = e
            .router
            .reconcile_allocations(&ReconcileOptions {
                limit: Some(25),
                ..ReconcileOptions::default()
            })
            .await
            .unwrap();
        assert_eq!((r.examined, r.resume_after), (25, None));
        // A limit above the ledger size reads it all.
        let r = e
            .router
            .reconcile_allocations(&ReconcileOptions {
                limit: Some(1000),
                page_size: 7,
                ..ReconcileOptions::default()
            })
            .await
            .unwrap();
        assert_eq!((r.examined, r.pages), (25, 4));
    }

    #[tokio::test]
    async fn ledger_faults_are_errors_not_silent_truncation() {
        let e = env(
            MemShard::with(&[]),
            MemShard::with(&[]),
            CountingLedger {
                fail: true,
                ..CountingLedger::default()
            },
        )
        .await;
        let err = e
            .router
            .reconcile_allocations(&ReconcileOptions::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), "COORDINATOR_UNAVAILABLE");
        assert!(err.is_retryable());

        let router = Router::new(
            MigrationConfig::new(Arc::new(MemoryMappingStore::new()))
                .shard("s0", MemShard::with(&[]))
                .coordinator(Arc::new(StuckLedger)),
        )
        .unwrap();
        let err = router
            .reconcile_allocations(&ReconcileOptions::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), "CORRUPT_RECORD", "a repeated page is refused");
    }

    #[tokio::test]
    async fn computed_placement_routes_unmapped_keys() {
        let s1 = MemShard::with(&[("users", "c-agree")]);
        let e = env(
            MemShard::with(&[("users", "c-differ")]),
            s1,
            CountingLedger::default(),
        )
        .await;
        e.ledger.record("c-agree", "s1").await.unwrap();
        e.ledger.record("c-differ", "s0").await.unwrap();
        let computed = |_: &str| Some("s1".to_owned());
        let opts = ReconcileOptions {
            verify_records: verify_users(),
            repair: true,
            prune_verified: true,
            ..ReconcileOptions::default()
        };
        let r = e.router.reconcile_with(&opts, &computed).await.unwrap();
        assert_eq!(
            (r.routing_agreed, r.disagreeing_count, r.unrouted),
            (1, 1, 0)
        );
        assert_eq!(
            r.disagreeing[0].routed_shard.as_deref(),
            Some("s1"),
            "the computed owner"
        );
        assert!(!r.disagreeing[0].mapped);
        // The probe goes to the computed owner s1, where c-differ has no row.
        assert_eq!((r.record_verified, r.record_missing_count), (1, 1));
        assert_eq!(r.repaired_count + r.pruned_count, 0);
        assert!(mappings(&e).await.is_empty());
        assert_eq!(ledger_rows(&e).await.len(), 2);
    }
}
