//! A bounded LRU of owner hints for callers, keyed by storage id, class and shard.

use std::num::NonZeroUsize;
use std::sync::{Mutex, MutexGuard, PoisonError};

use lru::LruCache;

use crate::error::OwnershipError;
use crate::record::{Generation, OwnerEndpoint, OwnerRecord};
use crate::scope::{OwnerScope, TaskId};

/// Default capacity of an [`OwnerHintCache`].
pub const DEFAULT_HINT_CAPACITY: usize = 10_000;

/// Where a scope was last seen owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerHint {
    /// The owning task.
    pub task: TaskId,
    /// Its generation.
    pub generation: Generation,
    /// The endpoint its owner record advertised, if any (grammar-checked
    /// only).
    pub endpoint: Option<OwnerEndpoint>,
}

/// An advisory, bounded routing cache. Eviction only costs a rediscovery;
/// the owner's admission stays authoritative.
#[derive(Debug)]
pub struct OwnerHintCache {
    inner: Mutex<LruCache<OwnerScope, OwnerHint>>,
}

impl Default for OwnerHintCache {
    fn default() -> Self {
        Self::with_capacity(NonZeroUsize::new(DEFAULT_HINT_CAPACITY).unwrap_or(NonZeroUsize::MIN))
    }
}

impl OwnerHintCache {
    /// A cache holding at most `capacity` scopes.
    pub fn with_capacity(capacity: NonZeroUsize) -> Self {
        Self {
            inner: Mutex::new(LruCache::new(capacity)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LruCache<OwnerScope, OwnerHint>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached hint of `scope`.
    pub fn get(&self, scope: &OwnerScope) -> Option<OwnerHint> {
        self.lock().get(scope).cloned()
    }

    /// Caches an owner record returned for `scope`; a record naming another
    /// scope (for example a different shard) is rejected and not cached.
    ///
    /// # Errors
    /// [`OwnershipError::InvalidOwnerRecord`] when the record's scope differs.
    pub fn learn(&self, scope: &OwnerScope, record: &OwnerRecord) -> Result<(), OwnershipError> {
        if record.scope() != scope {
            return Err(OwnershipError::InvalidOwnerRecord {
                scope: scope.to_string(),
                reason: "hint names a different scope".to_owned(),
            });
        }
        self.insert(
            scope,
            OwnerHint {
                task: record.task().clone(),
                generation: record.generation(),
                endpoint: record.endpoint().cloned(),
            },
        );
        Ok(())
    }

    /// Caches a hint, unless a newer generation is already cached for the
    /// scope. An equal generation replaces the cached hint whatever its task
    /// (hints are advisory: the owner's admission stays authoritative, and a
    /// wrong hint costs one rediscovery).
    pub fn insert(&self, scope: &OwnerScope, hint: OwnerHint) {
        let mut c = self.lock();
        if let Some(old) = c.peek(scope)
            && old.generation > hint.generation
        {
            return;
        }
        c.put(scope.clone(), hint);
    }

    /// Removes the hint of `scope`.
    pub fn remove(&self, scope: &OwnerScope) {
        self.lock().pop(scope);
    }

    /// Applies an error answered for `scope`: a stale-owner, owner-race or
    /// unavailable-owner answer clears its hint. Returns whether it cleared.
    pub fn observe_error(&self, scope: &OwnerScope, error: &OwnershipError) -> bool {
        let clear = matches!(
            error,
            OwnershipError::StaleOwner { .. }
                | OwnershipError::OwnerRace { .. }
                | OwnershipError::OwnerUnavailable { .. }
                | OwnershipError::StaleGeneration { .. }
        );
        if clear {
            self.remove(scope);
        }
        clear
    }

    /// Cached scopes.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
