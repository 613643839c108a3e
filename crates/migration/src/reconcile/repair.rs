//! The repair: a mapping written for an unrouted key whose row was found
//! on its ledger shard.

use super::ReconcileReport;
use super::report::push_capped;
use crate::config;
use crate::error::Result;
use crate::republish::Home;
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
        // For a key the journal moved, the journal is the record: a key
        // being moved, or moved elsewhere, is not mapped from the ledger (a
        // row found on the ledger shard may be left behind a tombstone).
        if self.journal.is_some() {
            let skip = match self.journal_home(key).await? {
                Home::Unknown => None,
                Home::At { target, .. } if target == ledger_shard => None,
                Home::At { target, .. } => Some(format!("the journal moved it to {target}")),
                Home::Pending { op_id, .. } => Some(format!("operation {op_id} is moving it")),
            };
            if let Some(why) = skip {
                tracing::warn!(
                    event = "durability.migration.reconcile_repair_skipped",
                    key,
                    ledger_shard,
                    why,
                    "repair skipped: the journal decides where the key lives"
                );
                return Ok(());
            }
        }
        let holder = self.map_if_absent(key, ledger_shard).await?;
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
