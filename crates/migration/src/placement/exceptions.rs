//! Placement exceptions: keys that live off their computed owner, recorded
//! in the journal and as their mapping (by a read that found the key
//! through an older epoch, or by a move's publish).

use super::Manifest;
use crate::error::{MigrationError, Result};
use crate::router::Core;

impl Core {
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
            self.map_if_absent(key, shard).await?;
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
    /// exception when `target` is not the computed owner; otherwise drop
    /// the key's stale exception. Either change of the exception set bumps
    /// the manifest's exception version, so other routers drop the mapping
    /// they cached for the key. Idempotent, and safe to crash anywhere: the
    /// bump comes before the delete, so a retry that still finds the
    /// exception bumps again (harmless) and one that finds it gone had
    /// bumped already.
    pub(crate) async fn publish_placement(&self, key: &str, target: &str) -> Result<()> {
        let m = self.manifest_from_journal().await?;
        let (Some(newest), Some(owner)) = (m.newest(), m.owner(key)) else {
            return Ok(());
        };
        if owner == target {
            let (jname, js) = self.journal_shard()?;
            let d = js.dialect();
            let recorded = js
                .query(&d.exception_get(&self.scope, key))
                .await
                .map_err(|e| MigrationError::shard(jname, e))?;
            if recorded.is_empty() {
                return Ok(());
            }
            self.bump_exception_version().await?;
            js.execute(&d.exception_delete(&self.scope, key))
                .await
                .map_err(|e| MigrationError::shard(jname, e))?;
            return Ok(());
        }
        self.record_exception(key, target, newest.number).await?;
        self.bump_exception_version().await
    }

    /// Bumps the manifest's exception version (one compare-and-swap).
    async fn bump_exception_version(&self) -> Result<()> {
        self.update_manifest(|cur| {
            let mut next = cur.clone();
            next.exception_version += 1;
            Ok(Some(next))
        })
        .await?;
        Ok(())
    }
}
