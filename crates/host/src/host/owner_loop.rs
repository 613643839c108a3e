//! The owner loop: every renew interval one [`Host::owner_cycle`], in
//! small named steps.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use durability_alarms::AlarmIndex;
use durability_ownership::{
    Generation, Lease, LeaseStore, LifecycleAdmin, OwnerScope, Readoption, Resolution,
};
use durability_scheduler::Clock;
use durability_time::timeout_at;

use super::{CycleReport, Host, Slot, lock};
use crate::settings::Residency;
use crate::store::ObjectStore;

/// The scopes this host's ownership holds now, by host id, with their
/// local lease budgets.
type Owned = HashMap<String, u64>;

impl<S, I, O: ObjectStore> Host<S, I, O>
where
    S: LeaseStore + LifecycleAdmin,
    I: AlarmIndex,
{
    /// Runs [`Self::owner_cycle`] every renew interval until the host stops.
    pub(super) async fn owner_loop(&self) {
        let interval = i64::try_from(self.inner.settings.renew_interval()).unwrap_or(i64::MAX);
        loop {
            let next = self.inner.clock.now_ms().saturating_add(interval);
            self.owner_cycle().await;
            if timeout_at(&self.inner.clock, next, self.inner.stop.cancelled())
                .await
                .is_ok()
            {
                return;
            }
        }
    }

    /// One cycle of the owner loop (it runs every renew interval on the
    /// host's clock; tests call it directly): renews every owned scope in
    /// one batched `renew_all`, drops the scopes whose renew failed
    /// (closing their objects), re-adopts or drops the scopes the
    /// ownership forgot, moves the open objects' lease budgets, claims the
    /// configured scopes that are free, and in the evictable mode closes
    /// idle objects. Does nothing once draining.
    pub async fn owner_cycle(&self) -> CycleReport {
        let mut report = CycleReport::default();
        if !self.running() || self.stop_on_duplicate_task() {
            return report;
        }
        self.renew(&mut report).await;
        self.readopt_forgotten(&mut report).await;
        tracing::debug!(
            event = "durability.host.renew",
            renewed = report.renewed,
            lost = report.lost.len(),
            "owner leases renewed"
        );
        let owned: Owned = self
            .inner
            .ownership
            .probe()
            .scopes
            .into_iter()
            .map(|s| (s.scope, s.lease_remaining_ms))
            .collect();
        let slots = self.inner.registry.slots();
        self.move_budgets(&slots, &owned).await;
        self.claim_targets(&owned, &mut report).await;
        if self.inner.settings.residency == Residency::Evictable {
            self.evict_idle(&slots, &mut report).await;
        } else {
            self.evict_beyond_bound(&slots, &mut report).await;
        }
        drop(slots);
        self.prune_slots();
        report
    }

    /// Whether another live process runs under this host's task id
    /// ([`durability_ownership::Ownership::duplicate_task`]): then the host
    /// claims and renews nothing more, reports it once and fires
    /// [`Host::failed`]'s signal so [`Host::run_until_signal`] drains.
    fn stop_on_duplicate_task(&self) -> bool {
        let Some(error) = self.inner.ownership.duplicate_task() else {
            return false;
        };
        if !self.inner.fatal.is_cancelled() {
            tracing::error!(
                event = "durability.host.duplicate_task",
                error = %error,
                "another live process runs under this task id; this host stops"
            );
            self.inner.fatal.cancel();
        }
        true
    }

    /// Renews every owned scope in one batch; a scope whose renew proved
    /// it lost is dropped. A busy or unreachable store proves nothing: the
    /// scope's objects stay open, and the re-adoption step takes the
    /// store's word.
    async fn renew(&self, report: &mut CycleReport) {
        for (scope, result) in &self.inner.ownership.renew_all().await {
            match result {
                Ok(_) => report.renewed += 1,
                Err(e) if e.proves_nothing() => {}
                Err(e) => {
                    self.drop_scope(scope, e.code()).await;
                    report.lost.push(scope.to_string());
                }
            }
        }
    }

    /// Scopes the ownership forgot meanwhile (an admission or the watchdog
    /// found them moved, or a renew met a busy store) are re-adopted when
    /// the store still shows this task's claim, else dropped
    /// ([`durability_ownership::Ownership::readopt`]).
    async fn readopt_forgotten(&self, report: &mut CycleReport) {
        let inner = &self.inner;
        let known: Vec<(OwnerScope, Generation)> = lock(&inner.scopes)
            .iter()
            .map(|(s, e)| (s.clone(), e.generation))
            .collect();
        let held: std::collections::HashSet<String> = inner
            .ownership
            .probe()
            .scopes
            .into_iter()
            .map(|s| s.scope)
            .collect();
        for (scope, generation) in known {
            if held.contains(scope.host_id()) {
                continue;
            }
            match inner
                .ownership
                .readopt(&scope, &inner.lifecycle, generation)
                .await
            {
                Readoption::Readopted => tracing::debug!(
                    event = "durability.host.readopted",
                    scope = %scope,
                    generation = generation.get(),
                    "owner scope re-adopted after a transient renew failure"
                ),
                Readoption::Lost => {
                    self.drop_scope(&scope, "stale_owner").await;
                    report.lost.push(scope.to_string());
                }
                Readoption::Undecided => {}
            }
        }
    }

    /// The open objects' commit budgets follow the renewed leases.
    async fn move_budgets(&self, slots: &[Slot<I, O::Storage>], owned: &Owned) {
        let asked_at = self.inner.clock.now_ms();
        for slot in slots {
            let open = slot.lock().await.clone();
            if let Some(open) = open
                && let Some(remaining) = owned.get(open.address.scope.host_id())
            {
                open.budget.renewed(
                    asked_at,
                    &Lease {
                        record: open.record.clone(),
                        remaining_ms: *remaining,
                    },
                );
            }
        }
    }

    /// Claims the configured scopes ([`crate::OwnPolicy`]) that are free.
    async fn claim_targets(&self, owned: &Owned, report: &mut CycleReport) {
        let inner = &self.inner;
        for scope in &inner.targets {
            if !self.running() {
                break;
            }
            if owned.contains_key(scope.host_id()) {
                continue;
            }
            // A read first: a scope another task holds live is not worth a
            // claim (a write transaction on the lease store) every cycle.
            if let Ok(snapshot) = inner
                .ownership
                .store()
                .snapshot(scope, &inner.lifecycle)
                .await
                && snapshot
                    .owner
                    .is_some_and(|l| l.record.task() != inner.ownership.task())
            {
                continue;
            }
            match inner.ownership.resolve(scope, &inner.lifecycle).await {
                Ok(Resolution::Local(g)) => {
                    self.note_scope(scope, g);
                    report.claimed.push(scope.to_string());
                }
                Ok(Resolution::Remote { .. }) => {}
                Err(e) => tracing::debug!(
                    event = "durability.host.claim_failed",
                    scope = %scope,
                    code = e.code(),
                    "claiming a configured scope failed"
                ),
            }
        }
    }

    /// Closes the objects idle for `DO_EVICTION_IDLE_MS` with nothing in
    /// flight (the evictable mode).
    async fn evict_idle(&self, slots: &[Slot<I, O::Storage>], report: &mut CycleReport) {
        let now = self.inner.clock.now_ms();
        let idle = i64::try_from(self.inner.settings.eviction_idle_ms).unwrap_or(i64::MAX);
        for slot in slots {
            self.evict_if(slot, report, |last_used| {
                now.saturating_sub(last_used) >= idle
            })
            .await;
        }
    }

    /// The resident mode's bound: beyond `max_resident_objects` open
    /// objects, closes the least recently used ones with nothing in flight.
    async fn evict_beyond_bound(&self, slots: &[Slot<I, O::Storage>], report: &mut CycleReport) {
        let bound = self.inner.settings.max_resident_objects;
        let mut open = Vec::new();
        for slot in slots {
            if let Some(o) = slot.lock().await.as_ref() {
                open.push((o.last_used.load(Ordering::SeqCst), slot));
            }
        }
        let Some(excess) = open.len().checked_sub(bound).filter(|n| *n > 0) else {
            return;
        };
        open.sort_by_key(|(last_used, _)| *last_used);
        for (seen, slot) in open.into_iter().take(excess) {
            // Closed only if it was not used since it was ranked.
            self.evict_if(slot, report, |last_used| last_used == seen)
                .await;
        }
    }

    /// Closes the object in `slot` when it has nothing in flight and
    /// `stale(last_used)` holds.
    async fn evict_if(
        &self,
        slot: &Slot<I, O::Storage>,
        report: &mut CycleReport,
        stale: impl Fn(i64) -> bool,
    ) {
        let mut guard = slot.lock().await;
        let evict = guard.as_ref().is_some_and(|o| {
            o.in_flight.load(Ordering::SeqCst) == 0 && stale(o.last_used.load(Ordering::SeqCst))
        });
        if evict && let Some(o) = guard.take() {
            o.close();
            report.evicted += 1;
            self.inner.counters.evicted.bump();
            tracing::debug!(
                event = "durability.host.evicted",
                object = %o.address.id,
                "idle object closed"
            );
        }
    }
}
