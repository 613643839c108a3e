//! Re-adopting a scope this task owned but its ownership forgot (an
//! admission or the watchdog found it moved, or a renew met a busy or
//! unreachable store): [`Ownership::readopt`] takes the store's word. Only
//! a claim the store still shows as this task's, at the same generation,
//! is adopted again; it is never claimed anew.

use durability_time::Clock;

use crate::error::OwnershipError;
use crate::manager::{Ownership, Resolution};
use crate::record::Generation;
use crate::scope::{LifecycleId, OwnerScope};
use crate::store::LeaseStore;

#[cfg(test)]
mod tests;

/// What [`Ownership::readopt`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readoption {
    /// The store still shows this task's claim at the generation: the
    /// scope is owned again, at that generation.
    Readopted,
    /// The claim moved or is gone: the scope is lost.
    Lost,
    /// The store could not answer (busy or unreachable): decide later.
    /// Nothing is admitted meanwhile (the local lease is gone).
    Undecided,
}

impl OwnershipError {
    /// Whether the error proves nothing about the lease: the store was
    /// busy (`owner_race`) or could not be reached. A lease is kept until
    /// its deadline after such an answer.
    pub fn proves_nothing(&self) -> bool {
        matches!(
            self,
            Self::OwnerRace { .. } | Self::StoreUnavailable { .. } | Self::OwnerUnavailable { .. }
        )
    }
}

impl<S: LeaseStore, C: Clock> Ownership<S, C> {
    /// Re-adopts `scope`, owned by this task at `generation` until its
    /// ownership forgot it, when the store still shows exactly that claim
    /// (see the module docs).
    pub async fn readopt(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
        generation: Generation,
    ) -> Readoption {
        let still_ours = match self.store().snapshot(scope, lifecycle).await {
            Ok(snapshot) => snapshot.owner.is_some_and(|l| {
                l.record.task() == self.task() && l.record.generation() == generation
            }),
            Err(_) => return Readoption::Undecided,
        };
        if !still_ours {
            return Readoption::Lost;
        }
        match self.resolve(scope, lifecycle).await {
            Ok(Resolution::Local(g)) if g == generation => Readoption::Readopted,
            Err(e) if e.proves_nothing() => Readoption::Undecided,
            _ => Readoption::Lost,
        }
    }
}
