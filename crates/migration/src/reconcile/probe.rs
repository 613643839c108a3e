//! The record probe: whether a key's row exists in any listed table on a
//! shard.

use super::UncheckedReason;
use crate::dialect::Ident;
use crate::router::Core;

/// The outcome of probing one key.
pub(super) enum Probe {
    NotRequested,
    Verified,
    Missing,
    Unchecked(UncheckedReason),
}

impl Core {
    /// Probes `key` in each table on `shard_name`, stopping at the first hit.
    pub(super) async fn probe(
        &self,
        shard_name: &str,
        key: &str,
        tables: &[(Ident, Ident)],
    ) -> Probe {
        if tables.is_empty() {
            return Probe::Unchecked(UncheckedReason::NoTables);
        }
        let Some(shard) = self.shards.get(shard_name) else {
            return Probe::Unchecked(UncheckedReason::UnknownShard);
        };
        let d = shard.dialect();
        // A move's destination copy (under its in-flight marker) is not the
        // key's row until the move publishes it; the markers exist where a
        // journal's `init` made the tables.
        let unmarked = self.journal.is_some() && d.is_proven();
        let mut failure = None;
        for (table, key_col) in tables {
            let st = if unmarked {
                d.key_probe_unmarked(table, key_col, key)
            } else {
                d.key_probe(table, key_col, key)
            };
            match shard.query(&st).await {
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
