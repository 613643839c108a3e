//! The ledger walk: each ledger row compared with routing, then probed,
//! repaired and pruned as the options ask.

use super::probe::Probe;
use super::report::push_capped;
use super::{
    Disagreement, MAX_RECONCILE_PAGE_SIZE, MissingRecord, ReconcileOptions, ReconcileReport,
    UncheckedRecord, VerifyRecords,
};
use crate::dialect::Ident;
use crate::error::{MigrationError, Result};
use crate::ledger::AllocationLedger;
use crate::router::Core;

/// What every row of one run shares.
struct RowCtx<'a> {
    opts: &'a ReconcileOptions,
    tables: Option<&'a [(Ident, Ident)]>,
    computed_owner: &'a (dyn Fn(&str) -> Option<String> + Sync),
    ledger: &'a dyn AllocationLedger,
}

impl Core {
    /// See [`Router::reconcile_allocations`](crate::Router::reconcile_allocations).
    pub(crate) async fn reconcile_allocations(
        &self,
        opts: &ReconcileOptions,
    ) -> Result<ReconcileReport> {
        self.reconcile_with(opts, &|key: &str| self.computed_owner(key))
            .await
    }

    /// [`Router::reconcile_allocations`](crate::Router::reconcile_allocations) with the computed owner supplied
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
}
