//! The manifest: its row on the journal shard (the authority, changed by
//! compare-and-swap on its revision), the derived copy in the mapping
//! store, the router's cached manifest, and `add_epoch`.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{Algorithm, CachedManifest, Epoch, MAX_CAS_ATTEMPTS, MAX_EPOCHS, Manifest};
use crate::error::{MigrationError, Result};
use crate::router::{Core, execute_all};

impl Core {
    /// Creates the placement tables and the first manifest (epoch 1: every
    /// configured shard) when none exists, and publishes its copy.
    pub(crate) async fn init_placement(&self) -> Result<()> {
        for (name, shard) in self.proven_shards() {
            execute_all(name, shard.as_ref(), &shard.dialect().topology_schema()).await?;
        }
        let (jname, js) = self.journal_shard()?;
        let d = js.dialect();
        execute_all(jname, js.as_ref(), &d.placement_schema()).await?;
        let first = Manifest {
            revision: 1,
            generation: 1,
            exception_version: 0,
            epochs: vec![Epoch {
                number: 1,
                shards: self.shards.keys().cloned().collect(),
                algorithm: Algorithm::Hash,
            }],
        };
        js.execute(&d.manifest_insert(&self.scope, first.revision, &first.encode()?))
            .await
            .map_err(|e| MigrationError::shard(jname, e))?;
        let m = self.manifest_from_journal().await?;
        self.publish_copy(&m).await?;
        self.cache_manifest(m);
        Ok(())
    }

    /// See [`Router::manifest_from_journal`](crate::Router::manifest_from_journal).
    pub(crate) async fn manifest_from_journal(&self) -> Result<Manifest> {
        self.require_computed()?;
        let (jname, js) = self.journal_shard()?;
        let rows = js
            .query(&js.dialect().manifest_get(&self.scope))
            .await
            .map_err(|e| MigrationError::shard(jname, e))?;
        let Some(r) = rows.first() else {
            return Err(MigrationError::InvalidConfig(
                "no placement manifest: call init() first".into(),
            ));
        };
        let rev = crate::journal::int(r, "revision")?;
        let m = Manifest::decode(&crate::journal::text(r, "body")?)?;
        if m.revision != rev {
            return Err(MigrationError::Corrupt(format!(
                "manifest revision {} under row revision {rev}",
                m.revision
            )));
        }
        Ok(m)
    }

    /// Writes the manifest's derived copy to the mapping store unless the
    /// copy there is as new.
    async fn publish_copy(&self, m: &Manifest) -> Result<()> {
        let key = self.copy_key();
        let current = self
            .mapping
            .get(&key)
            .await
            .map_err(MigrationError::MappingUnavailable)?;
        if let Some(c) = current
            && Manifest::decode(&c).is_ok_and(|c| c.revision >= m.revision)
        {
            return Ok(());
        }
        self.mapping
            .put(&key, &m.encode()?)
            .await
            .map_err(MigrationError::MappingUnavailable)
    }

    fn cache_manifest(&self, m: Manifest) -> Arc<Manifest> {
        let m = Arc::new(m);
        let now = self.clock.now_ms_u64();
        let mut drop_exceptions = false;
        if let Ok(mut g) = self.manifest.lock() {
            match g.as_mut() {
                Some(c) if c.manifest.revision > m.revision => {
                    // The cached manifest is newer than the one confirmed.
                    c.confirmed_ms = now;
                    return Arc::clone(&c.manifest);
                }
                Some(c) => {
                    drop_exceptions = c.manifest.exception_version != m.exception_version;
                }
                None => {}
            }
            *g = Some(CachedManifest {
                manifest: Arc::clone(&m),
                confirmed_ms: now,
            });
        }
        if drop_exceptions {
            self.clear_mapping_cache();
        }
        m
    }

    fn cached_manifest(&self) -> Option<CachedManifest> {
        self.manifest.lock().ok().and_then(|g| g.clone())
    }

    /// Reads the derived copy from the mapping store; a missing copy is
    /// rebuilt from the journal.
    async fn confirm_manifest(&self) -> Result<Arc<Manifest>> {
        let copy = self
            .mapping
            .get(&self.copy_key())
            .await
            .map_err(MigrationError::MappingUnavailable)?;
        match copy {
            Some(c) => Ok(self.cache_manifest(Manifest::decode(&c)?)),
            None => {
                let m = self.manifest_from_journal().await?;
                self.publish_copy(&m).await?;
                Ok(self.cache_manifest(m))
            }
        }
    }

    /// See [`Router::manifest`](crate::Router::manifest).
    pub(crate) async fn manifest(&self) -> Result<Arc<Manifest>> {
        self.require_computed()?;
        let cached = self.cached_manifest();
        if let Some(c) = &cached
            && self.clock.now_ms_u64().saturating_sub(c.confirmed_ms) < self.manifest_refresh_ms
        {
            return Ok(Arc::clone(&c.manifest));
        }
        match self.confirm_manifest().await {
            Ok(m) => Ok(m),
            Err(e) => match cached {
                Some(c) => {
                    tracing::debug!(
                        event = "durability.migration.manifest_cached_read",
                        error = %e,
                        "manifest not confirmed; reading with the cached manifest"
                    );
                    Ok(c.manifest)
                }
                None => Err(e),
            },
        }
    }

    /// The manifest a write routes with: the cached one while it is fresh,
    /// else a confirmed copy.
    ///
    /// # Errors
    /// `PLACEMENT_UNVERIFIED` when no fresh manifest can be confirmed.
    pub(crate) async fn manifest_for_write(&self) -> Result<Arc<Manifest>> {
        if let Some(c) = self.cached_manifest()
            && self.clock.now_ms_u64().saturating_sub(c.confirmed_ms) < self.manifest_refresh_ms
        {
            return Ok(c.manifest);
        }
        self.confirm_manifest()
            .await
            .map_err(|e| MigrationError::PlacementUnverified(Box::new(e)))
    }

    /// Reloads the manifest from the journal (after a raised fence).
    pub(crate) async fn reload_manifest(&self) -> Result<Arc<Manifest>> {
        let m = self
            .manifest_from_journal()
            .await
            .map_err(|e| MigrationError::PlacementUnverified(Box::new(e)))?;
        if let Err(e) = self.publish_copy(&m).await {
            tracing::warn!(
                event = "durability.migration.manifest_copy_failed",
                error = %e,
                "publishing the manifest copy failed"
            );
        }
        Ok(self.cache_manifest(m))
    }

    /// Applies `f` to the journal's manifest by compare-and-swap on its
    /// revision, retrying lost swaps; `f` returning `None` changes nothing.
    /// Publishes the copy and caches the result.
    pub(super) async fn update_manifest(
        &self,
        f: impl Fn(&Manifest) -> Result<Option<Manifest>>,
    ) -> Result<Arc<Manifest>> {
        let (jname, js) = self.journal_shard()?;
        let d = js.dialect();
        for _ in 0..MAX_CAS_ATTEMPTS {
            let cur = self.manifest_from_journal().await?;
            let Some(mut next) = f(&cur)? else {
                self.publish_copy(&cur).await?;
                return Ok(self.cache_manifest(cur));
            };
            next.revision = cur.revision + 1;
            let n = js
                .execute(&d.manifest_cas(&self.scope, cur.revision, next.revision, &next.encode()?))
                .await
                .map_err(|e| MigrationError::shard(jname, e))?;
            if n == 1 {
                tracing::info!(
                    event = "durability.migration.manifest_updated",
                    revision = next.revision,
                    generation = next.generation,
                    epochs = next.epochs.len(),
                    "manifest updated"
                );
                self.publish_copy(&next).await?;
                return Ok(self.cache_manifest(next));
            }
            tracing::debug!(
                event = "durability.migration.manifest_cas_lost",
                revision = cur.revision,
                "manifest compare-and-swap lost; retrying"
            );
        }
        Err(MigrationError::PlacementConflict(MAX_CAS_ATTEMPTS))
    }

    /// See [`Router::add_epoch`](crate::Router::add_epoch).
    pub(crate) async fn add_epoch(&self, shards: &[&str]) -> Result<Arc<Manifest>> {
        self.require_computed()?;
        if shards.is_empty() {
            return Err(MigrationError::InvalidConfig(
                "an epoch needs shards".into(),
            ));
        }
        let mut set = BTreeSet::new();
        for s in shards {
            let (name, _) = self.proven_shard(s)?;
            set.insert(name.to_owned());
        }
        let set: Vec<String> = set.into_iter().collect();
        self.journal_shard()?;
        let m = self
            .update_manifest(|cur| {
                if cur.newest().is_some_and(|e| e.shards == set) {
                    return Ok(None);
                }
                if cur.epochs.len() >= MAX_EPOCHS {
                    return Err(MigrationError::TooManyEpochs(cur.epochs.len()));
                }
                let number = cur.epochs.iter().map(|e| e.number).max().unwrap_or(0) + 1;
                let mut next = cur.clone();
                next.generation += 1;
                next.epochs.insert(
                    0,
                    Epoch {
                        number,
                        shards: set.clone(),
                        algorithm: Algorithm::Hash,
                    },
                );
                Ok(Some(next))
            })
            .await?;
        self.raise_fences(m.generation).await?;
        Ok(m)
    }
}
