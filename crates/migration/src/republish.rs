//! The journal as the record of where a moved key lives: when the mapping
//! store lost an acknowledged publish (a Redis failover, a restore from an
//! older backup), the key's newest finished move names its shard, and the
//! router publishes it again (issue 13 item 7).
//!
//! Publishing the target of any retired move is safe even when it races a
//! newer move: every shard a key was moved away from keeps that move's
//! tombstone (purge clears payloads, never tombstones), so a mapping that
//! names an old shard only makes writes meet the fence there (refused,
//! never applied) until the next heal names the newest target again.

use crate::config::Check;
use crate::error::{MigrationError, Result};
use crate::journal::MoveState;
use crate::router::Core;

/// Where the journal says a key lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Home {
    /// The journal of this scope never finished a move of the key.
    Unknown,
    /// A move of the key is active (its owner is not settled yet).
    Pending {
        /// The active operation.
        op_id: String,
        /// Its source (where the rows are until its cutover).
        source: String,
    },
    /// The newest finished (retired) move of the key put it here; aborted
    /// moves after it left it there.
    At {
        /// That operation.
        op_id: String,
        /// Its target.
        target: String,
    },
}

impl Core {
    /// Where the journal says `key` lives: the newest operation of the key
    /// that is not aborted decides (active: pending; retired: its target).
    pub(crate) async fn journal_home(&self, key: &str) -> Result<Home> {
        for op in self.key_ops(key).await? {
            match op.state {
                MoveState::Aborted => {}
                MoveState::Retired => {
                    return Ok(Home::At {
                        op_id: op.op_id,
                        target: op.target,
                    });
                }
                _ => {
                    return Ok(Home::Pending {
                        op_id: op.op_id,
                        source: op.source,
                    });
                }
            }
        }
        Ok(Home::Unknown)
    }

    /// Publishes `target` as `key`'s mapping again (the journal's newest
    /// finished move of the key names it; the mapping said `found`).
    pub(crate) async fn republish(
        &self,
        key: &str,
        op_id: &str,
        target: &str,
        found: Option<&str>,
    ) -> Result<()> {
        self.mapping
            .put(key, target)
            .await
            .map_err(MigrationError::MappingUnavailable)?;
        self.cache_set(key, target);
        tracing::warn!(
            event = "durability.migration.mapping_republished",
            key,
            op_id,
            target,
            found = found.unwrap_or("<none>"),
            "the mapping disagreed with the key's newest finished move; its target was published again"
        );
        Ok(())
    }

    /// A key the mapping store does not know, under mapped placement with a
    /// journal: the journal's newest finished move of the key says where it
    /// lives (its mapping was lost), published again. `Pending` when a move
    /// of the key is active, `Unknown` when the journal never moved it.
    pub(crate) async fn heal_unmapped(&self, key: &str) -> Result<Home> {
        if self.computed() || !self.fence_checks || !self.checks(Check::Republish) {
            return Ok(Home::Unknown);
        }
        let home = self.journal_home(key).await?;
        if let Home::At { op_id, target } = &home {
            // Only where the mapping is still absent: a concurrent
            // allocation or publish wins, and a write meeting a fence there
            // heals again.
            let held = self.map_if_absent(key, target).await?;
            tracing::warn!(
                event = "durability.migration.mapping_republished",
                key,
                op_id = op_id.as_str(),
                target = target.as_str(),
                found = "<none>",
                "the key had no mapping but the journal moved it; its target was published again"
            );
            return Ok(Home::At {
                op_id: op_id.clone(),
                target: held,
            });
        }
        Ok(home)
    }
}
