//! This process's run of its task id: the owner records it wrote, and the
//! detection of another live process with the same task id.
//!
//! A record of this task id that this process did not write belongs to
//! another run of the task id: a crashed predecessor (its lease never moves
//! again and ends on the store's clock; the scope is then claimed at a new
//! generation) or a live duplicate (it renews, so the lease end it shows
//! moves forward between two observations, or it claims a new generation).
//! Such a record is never adopted or released here; a duplicate is
//! reported as [`OwnershipError::DuplicateTaskId`] from then on.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::Ownership;
use crate::error::OwnershipError;
use crate::record::OwnerRecord;
use crate::scope::{LifecycleId, OwnerScope, TaskId};
use crate::store::LeaseStore;
use durability_time::Clock;

/// Two lease ends this close (in milliseconds, on the store's clock) are
/// one: a store reads its clock and the lease left in one step, but Redis
/// reads `TIME` and a script's key time apart by a fraction of a
/// millisecond. A renewal moves the end by its whole interval.
const SAME_LEASE_END_MS: u64 = 10;

/// What this run knows about its task id's records.
#[derive(Debug, Default)]
pub(super) struct Incarnation {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The last record this run wrote per scope.
    written: HashMap<OwnerScope, OwnerRecord>,
    /// Records of this task id another run wrote, with the lease end seen
    /// on the store's clock.
    seen: HashMap<OwnerScope, (OwnerRecord, u64)>,
    /// The scope where another live run was seen: every later resolution fails.
    duplicate: Option<String>,
}

impl Incarnation {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes a record this run wrote.
    pub(super) fn wrote(&self, record: &OwnerRecord) {
        let mut st = self.lock();
        st.seen.remove(record.scope());
        st.written.insert(record.scope().clone(), record.clone());
    }

    /// Whether this run wrote `record`.
    pub(super) fn is_ours(&self, record: &OwnerRecord) -> bool {
        self.lock().written.get(record.scope()) == Some(record)
    }

    /// Forgets what was seen of `scope` (a claim whose outcome is unknown
    /// may have written a record this run does not know as its own).
    pub(super) fn unsure(&self, scope: &OwnerScope) {
        self.lock().seen.remove(scope);
    }

    /// The refusal every resolution answers once a duplicate was seen.
    pub(super) fn duplicate(&self, task: &TaskId) -> Option<OwnershipError> {
        self.lock()
            .duplicate
            .as_ref()
            .map(|scope| OwnershipError::DuplicateTaskId {
                task_id: task.as_str().to_owned(),
                scope: scope.clone(),
            })
    }

    /// Notes another run's `record` with its lease ending at `lease_end_ms`
    /// on the store's clock, and answers the refusal for this resolution:
    /// [`OwnershipError::DuplicateTaskId`] when that run is alive (its lease
    /// moved forward, or it claimed a newer generation, since the last
    /// observation), else [`OwnershipError::OwnerRace`] (wait for its lease
    /// to end).
    fn observe(&self, task: &TaskId, record: &OwnerRecord, lease_end_ms: u64) -> OwnershipError {
        let scope = record.scope();
        let mut st = self.lock();
        let alive = match st.seen.get(scope) {
            Some((seen, end)) if seen == record => {
                lease_end_ms > end.saturating_add(SAME_LEASE_END_MS)
            }
            Some((seen, _)) => record.generation() > seen.generation(),
            None => false,
        };
        if alive {
            st.duplicate = Some(scope.to_string());
            return OwnershipError::DuplicateTaskId {
                task_id: task.as_str().to_owned(),
                scope: scope.to_string(),
            };
        }
        st.seen
            .insert(scope.clone(), (record.clone(), lease_end_ms));
        OwnershipError::OwnerRace {
            scope: scope.to_string(),
        }
    }
}

impl<S: LeaseStore, C: Clock> Ownership<S, C> {
    /// The duplicate task id refusal, once another live process with this
    /// task id was seen (it renewed or claimed a record of this task id
    /// that this process did not write). The host stops on it: two
    /// processes with one task id cannot share ownership safely.
    pub fn duplicate_task(&self) -> Option<OwnershipError> {
        self.inner.incarnation.duplicate(&self.inner.task)
    }

    /// Notes a record this process wrote outside [`Ownership::resolve`]
    /// (the floor procedure's claim), so resolution adopts it.
    pub(crate) fn wrote(&self, record: &OwnerRecord) {
        self.inner.incarnation.wrote(record);
    }

    /// A live record of this task id that this process did not write holds
    /// `scope`: read its lease end on the store's clock and compare it with
    /// the last observation. Returns the refusal of this resolution.
    pub(super) async fn held_by_another_run(
        &self,
        scope: &OwnerScope,
        lifecycle: &LifecycleId,
    ) -> OwnershipError {
        self.forget(scope);
        let snapshot = match self.inner.store.snapshot(scope, lifecycle).await {
            Ok(s) => s,
            Err(e) => return e,
        };
        match snapshot.owner {
            Some(lease)
                if lease.record.task() == &self.inner.task
                    && !self.inner.incarnation.is_ours(&lease.record) =>
            {
                let end = snapshot.store_now_ms.saturating_add(lease.remaining_ms);
                let e = self
                    .inner
                    .incarnation
                    .observe(&self.inner.task, &lease.record, end);
                if matches!(e, OwnershipError::DuplicateTaskId { .. }) {
                    tracing::error!(
                        event = "durability.ownership.duplicate_task_id",
                        scope = %scope,
                        task = self.inner.task.as_str(),
                        generation = lease.record.generation().get(),
                        "another live process runs with this task id"
                    );
                } else {
                    tracing::info!(
                        event = "durability.ownership.held_by_another_run",
                        scope = %scope,
                        generation = lease.record.generation().get(),
                        lease_remaining_ms = lease.remaining_ms,
                        "a record of this task id that this process did not write holds the scope; waiting for its lease to end"
                    );
                }
                e
            }
            // The record changed meanwhile: the next resolution decides.
            _ => OwnershipError::OwnerRace {
                scope: scope.to_string(),
            },
        }
    }
}
