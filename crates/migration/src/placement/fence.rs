//! The generation fence every data shard holds: a write routed with an
//! older manifest than the fence matches no row there.

use crate::error::{MigrationError, Result};
use crate::router::Core;

impl Core {
    /// See [`Router::fence`](crate::Router::fence).
    pub(crate) async fn fence(&self, shard: &str) -> Result<i64> {
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
    pub(super) async fn raise_fences(&self, generation: i64) -> Result<()> {
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
}
