//! Dispatch through the owner router and fence (feature `ownership`).
//!
//! An alarm is delivered through the normal owner router and fence path:
//! resolve who owns the object's scope; if another task does, forward the
//! delivery there; if this task does, pass dispatch admission (task,
//! generation, lease budget, lifecycle) and deliver locally while the
//! admission permit counts the work as in flight, so a drain waits for it.
//! An admission or resolution failure is reported with the ownership
//! crate's classification: one that proves the alarm never started is
//! retried at once without using a try; one whose outcome is unknown keeps
//! the claim until its lease expires. Inactive storage (the storage pointer
//! gone or moved) and a whole-delete lock are reported as
//! [`DispatchOutcome::Gone`]: the job discards itself, like any
//! residual job of a deleted object.

use std::future::Future;
use std::sync::Arc;

use durability_ownership::{
    Clock, Generation, LeaseStore, LifecycleId, OwnerEndpoint, OwnerScope, Ownership,
    OwnershipError, Resolution, TaskId,
};
use durability_scheduler::ObjectId;

use crate::dispatcher::{Delivery, Dispatch, DispatchOutcome};

/// Maps an object to its owner scope and lifecycle; `Err` names why it has
/// none (reported as a definite failure).
pub type ScopeOf =
    Arc<dyn Fn(&ObjectId) -> Result<(OwnerScope, LifecycleId), String> + Send + Sync>;

/// The owner another task resolved for a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteOwner {
    /// The owning task.
    pub task: TaskId,
    /// Its generation (the owner admits the delivery only there).
    pub generation: Generation,
    /// The endpoint its owner record advertises, if any (grammar-checked
    /// only).
    pub endpoint: Option<OwnerEndpoint>,
}

/// Sends a delivery to the task that owns the object (the transport is the
/// host's: an RPC, an internal HTTP call …).
pub trait Forward: Send + Sync + 'static {
    /// Delivers on `owner`, fenced at the generation this task resolved it
    /// at, and reports the outcome there. An outcome that proves the owner
    /// did not start the alarm (it could not be reached, or refused before
    /// running anything) is [`DispatchOutcome::NeverStarted`].
    fn forward(
        &self,
        owner: &RemoteOwner,
        delivery: Delivery,
    ) -> impl Future<Output = DispatchOutcome> + Send;
}

/// A [`Dispatch`] that routes each delivery to the owning task and admits
/// local deliveries through [`Ownership::admit`]. A refused resolution or
/// admission is reported as never started whatever the ownership error (the
/// handler was not called), except inactive storage and a whole-delete lock,
/// which discard the job as gone.
pub struct OwnerRouted<L, F, S, C> {
    local: L,
    forward: F,
    ownership: Ownership<S, C>,
    scope_of: ScopeOf,
}

impl<L, F, S, C> std::fmt::Debug for OwnerRouted<L, F, S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerRouted").finish_non_exhaustive()
    }
}

impl<L, F, S, C> OwnerRouted<L, F, S, C> {
    /// Routes with `ownership`: deliveries this task owns go to `local`,
    /// others to `forward`.
    pub fn new(local: L, forward: F, ownership: Ownership<S, C>, scope_of: ScopeOf) -> Self {
        Self {
            local,
            forward,
            ownership,
            scope_of,
        }
    }
}

fn refused(object: &ObjectId, e: &OwnershipError) -> DispatchOutcome {
    let reason = format!("{}: {e}", e.code());
    if matches!(
        e,
        OwnershipError::StorageInactive { .. } | OwnershipError::DeleteLocked { .. }
    ) {
        // The seed: a residual job "self-discards because the storage pointer
        // is gone". Inactive storage (pointer gone or moved) and a whole-delete
        // lock are lifecycle facts, not a transient refusal: retrying at once
        // would spin forever, so the job is discarded as gone.
        tracing::info!(
            event = "durability.alarms.storage_inactive_discarded",
            object = %object,
            code = e.code(),
            "the object's storage is inactive; its alarm job discards itself"
        );
        return DispatchOutcome::Gone;
    }
    // Every refusal here comes from owner resolution or admission, both
    // before the handler is called, so the alarm provably did not run: even
    // an ownership error whose store step has an unknown outcome (a lost
    // reply to the admission snapshot or a claim) leaves the handler never
    // started. Holding the claim for its whole lease would only delay it.
    DispatchOutcome::NeverStarted { reason }
}

/// The wait used when the owner snapshot cannot be read.
const SNAPSHOT_FAILED_WAIT_MS: i64 = 1_000;

impl<L, F, S: LeaseStore, C: Clock> OwnerRouted<L, F, S, C> {
    /// How long to wait before retrying a delivery that `forwarded_to` at
    /// `generation` (resolved as the owner) did not start: that lease's
    /// time left (from one store snapshot) plus 1 ms, so the retry finds it
    /// expired; 0 when the scope's live lease is no longer that one (it
    /// moved, was claimed again, or nobody holds it), so the retry resolves
    /// the new owner at once.
    async fn owner_lease_left(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
        forwarded_to: &TaskId,
        generation: Generation,
    ) -> i64 {
        match self.ownership.store().snapshot(scope, lifecycle).await {
            Ok(snapshot) => snapshot
                .owner
                .filter(|lease| {
                    lease.record.task() == forwarded_to && lease.record.generation() == generation
                })
                .map_or(0, |lease| {
                    i64::try_from(lease.remaining_ms)
                        .unwrap_or(i64::MAX)
                        .saturating_add(1)
                }),
            Err(error) => {
                tracing::debug!(
                    event = "durability.alarms.owner_snapshot_failed",
                    code = error.code(),
                    %error,
                    "reading the owner snapshot failed; waiting briefly"
                );
                SNAPSHOT_FAILED_WAIT_MS
            }
        }
    }
}

impl<L, F, S, C> OwnerRouted<L, F, S, C>
where
    L: Dispatch,
    S: LeaseStore,
    C: Clock,
{
    /// Delivers here at `generation`: passes dispatch admission (this
    /// task's exact owner record at that generation, lease budget,
    /// lifecycle) and runs the local dispatch while the permit counts it in
    /// flight. What the local branch of [`Dispatch::dispatch`] does after
    /// resolving this task as the owner, and what a host runs for a
    /// delivery another task forwarded to it with that generation as its
    /// fence.
    pub async fn dispatch_at(&self, delivery: Delivery, generation: Generation) -> DispatchOutcome {
        let scope = match (self.scope_of)(&delivery.object) {
            Ok((scope, _)) => scope,
            Err(reason) => return DispatchOutcome::Failed { reason },
        };
        match self.ownership.admit(&scope, generation).await {
            Ok(permit) => {
                let outcome = self.local.dispatch(delivery).await;
                drop(permit);
                outcome
            }
            Err(e) => refused(&delivery.object, &e),
        }
    }
}

impl<L, F, S, C> Dispatch for OwnerRouted<L, F, S, C>
where
    L: Dispatch,
    F: Forward,
    S: LeaseStore,
    C: Clock,
{
    async fn dispatch(&self, delivery: Delivery) -> DispatchOutcome {
        let (scope, lifecycle) = match (self.scope_of)(&delivery.object) {
            Ok(found) => found,
            Err(reason) => return DispatchOutcome::Failed { reason },
        };
        let delivery_object = delivery.object.clone();
        match self.ownership.resolve(&scope, &lifecycle).await {
            Ok(Resolution::Remote {
                task,
                generation,
                endpoint,
            }) => {
                let owner = RemoteOwner {
                    task,
                    generation,
                    endpoint,
                };
                let (task, generation) = (&owner.task, owner.generation);
                match self.forward.forward(&owner, delivery).await {
                    // The owner elsewhere could not take it (a dead owner
                    // during failover): wait for its lease, not a hot loop;
                    // at once when the lease has moved on from it.
                    DispatchOutcome::NeverStarted { reason } => DispatchOutcome::OwnerElsewhere {
                        retry_in_ms: self
                            .owner_lease_left(&scope, &lifecycle, task, generation)
                            .await,
                        reason: format!("owner {}: {reason}", task.as_str()),
                    },
                    other => other,
                }
            }
            Ok(Resolution::Local(generation)) => self.dispatch_at(delivery, generation).await,
            Err(e) => refused(&delivery_object, &e),
        }
    }
}
