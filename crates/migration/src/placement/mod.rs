//! Computed placement: the manifest of epochs on the journal shard (updated
//! by compare-and-swap on its revision, with a derived copy in the mapping
//! store), the generation fence every data shard holds, placement
//! exceptions, write probes and epoch pruning.
//!
//! Invariants:
//! - the manifest holds 1..=[`MAX_EPOCHS`] epochs, newest first; an epoch is
//!   removed only by [`Router::prune_epochs`](crate::Router::prune_epochs) after a census over every page
//!   of every listed table found no row depending on it;
//! - every manifest change is one compare-and-swap on the journal row's
//!   revision; the copy in the mapping store is derived from it and is never
//!   newer;
//! - a topology change raises the fence of every shard to the new
//!   generation after publishing it, so a write routed with an older manifest
//!   matches no row there, reloads once and otherwise fails with
//!   `STALE_TOPOLOGY`;
//! - a key's row lives on its mapped shard, or else on the owner of some
//!   epoch; a write finds it by probing the owners newest first and writes
//!   where it is, or on the newest owner when no shard holds it;
//! - a move's destination copy is not the key's row until the move
//!   publishes it: from the copy to the publish it sits under the move's
//!   in-flight marker, which probes skip (so a copy on the key's newest
//!   owner is not found before the source that still holds the row), and
//!   a write routed onto it matches no row (`MIGRATION_CUTOVER_PENDING`).

//!
//! By concern: `manifest` (the journal row, its copy, the cache,
//! `add_epoch`), `fence` (the generation fences), `exceptions` (placement
//! exceptions), `probe` (where a write goes), `prune` (`prune_epochs` and
//! its census).

mod exceptions;
mod fence;
mod manifest;
mod probe;
mod prune;

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config;
use crate::error::{MigrationError, Result};
use crate::router::Core;

pub use prune::{DEFAULT_PRUNE_CONCURRENCY, DEFAULT_PRUNE_PAGE_SIZE, PruneOptions, PruneReport};

/// Most epochs a manifest holds, the current one included.
pub const MAX_EPOCHS: usize = 8;
/// Lost compare-and-swaps in a row before `PLACEMENT_CONFLICT`.
pub const MAX_CAS_ATTEMPTS: u32 = 5;
/// Default period after which a router re-confirms its cached manifest.
pub const DEFAULT_MANIFEST_REFRESH_MS: u64 = 5_000;
/// Prefix of the mapping-store key that holds the manifest's derived copy
/// (keys starting with `\u{1}` are reserved; see [`crate::validate_key`]).
pub const MANIFEST_COPY_PREFIX: &str = "\u{1}durability.manifest/";

/// How keys are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Placement {
    /// A key's shard is its mapping, allocated by the hash strategy on the
    /// key's first write.
    #[default]
    Mapped,
    /// A key's shard is computed from a manifest of epochs; the mapping store
    /// holds only placement exceptions (moved keys) and the manifest's copy.
    Computed,
}

/// How an epoch computes a key's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Algorithm {
    /// FNV-1a hash of the key over the sorted shard names
    /// ([`crate::hash_owner`]).
    Hash,
}

/// One epoch: a shard set and the algorithm that computes an owner from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Epoch {
    /// The epoch number (increasing; never reused).
    pub number: u32,
    /// The shard set, sorted.
    pub shards: Vec<String>,
    /// The owner algorithm.
    pub algorithm: Algorithm,
}

impl Epoch {
    /// The shard this epoch places `key` on (the shard set is sorted, so
    /// this is [`crate::hash_owner`] without sorting on every call).
    pub fn owner(&self, key: &str) -> Option<&str> {
        match self.algorithm {
            Algorithm::Hash => {
                let n = u64::try_from(self.shards.len()).ok().filter(|n| *n > 0)?;
                let idx = usize::try_from(config::fnv1a(key) % n).ok()?;
                self.shards.get(idx).map(String::as_str)
            }
        }
    }
}

/// The placement manifest: epochs newest first, with the revision every
/// update swaps on, the generation writes bind, and the exception version
/// moves bump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Compare-and-swap revision (one per update).
    pub revision: i64,
    /// The generation writes bind; fences are raised to it.
    pub generation: i64,
    /// Bumped when a move records a placement exception.
    pub exception_version: i64,
    /// The epochs, newest first.
    pub epochs: Vec<Epoch>,
}

impl Manifest {
    /// The newest epoch.
    pub fn newest(&self) -> Option<&Epoch> {
        self.epochs.first()
    }

    /// The owner the newest epoch computes for `key`.
    pub fn owner(&self, key: &str) -> Option<&str> {
        self.newest().and_then(|e| e.owner(key))
    }

    /// Distinct owners of `key`, newest epoch first, with the newest epoch
    /// that computes each.
    pub fn candidates(&self, key: &str) -> Vec<(u32, String)> {
        let mut out: Vec<(u32, String)> = Vec::new();
        for e in &self.epochs {
            if let Some(o) = e.owner(key)
                && !out.iter().any(|(_, s)| s == o)
            {
                out.push((e.number, o.to_owned()));
            }
        }
        out
    }

    /// Every shard some epoch names.
    pub fn all_shards(&self) -> BTreeSet<String> {
        self.epochs
            .iter()
            .flat_map(|e| e.shards.iter().cloned())
            .collect()
    }

    fn encode(&self) -> Result<String> {
        serde_json::to_string(self).map_err(|e| MigrationError::Corrupt(e.to_string()))
    }

    fn decode(s: &str) -> Result<Self> {
        let m: Self = serde_json::from_str(s)
            .map_err(|e| MigrationError::Corrupt(format!("manifest: {e}")))?;
        if m.epochs.is_empty() || m.epochs.len() > MAX_EPOCHS {
            return Err(MigrationError::Corrupt(format!(
                "manifest holds {} epochs",
                m.epochs.len()
            )));
        }
        if let Some(e) = m
            .epochs
            .iter()
            .find(|e| e.shards.is_empty() || !e.shards.windows(2).all(|w| w[0] < w[1]))
        {
            return Err(MigrationError::Corrupt(format!(
                "epoch {} has no shards or an unsorted shard set",
                e.number
            )));
        }
        Ok(m)
    }
}

/// The cached manifest and when it was last confirmed.
#[derive(Debug, Clone)]
pub(crate) struct CachedManifest {
    pub(crate) manifest: Arc<Manifest>,
    pub(crate) confirmed_ms: u64,
}

impl Core {
    pub(crate) fn computed(&self) -> bool {
        self.placement == Placement::Computed
    }

    fn require_computed(&self) -> Result<()> {
        if self.computed() {
            Ok(())
        } else {
            Err(MigrationError::InvalidConfig(
                "the operation needs computed placement".into(),
            ))
        }
    }

    fn copy_key(&self) -> String {
        format!("{MANIFEST_COPY_PREFIX}{}", self.scope)
    }
}
