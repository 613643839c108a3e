//! The repair: a mapping written for an unrouted key whose row was found
//! on its ledger shard.

use super::ReconcileReport;
use super::report::push_capped;
use crate::config;
use crate::error::{MigrationError, Result};
use crate::router::Core;

impl Core {
    /// Maps an unrouted key whose row was found on its ledger shard.
    pub(super) async fn repair_mapping(
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
}
