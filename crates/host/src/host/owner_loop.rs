//! The owner loop: every renew interval one [`Host::owner_cycle`], in
//! small named steps.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use durability_alarms::AlarmIndex;
use durability_ownership::balance::{Peer, decode_presence, encode_presence};
use durability_ownership::{
    Generation, HandOff, Lease, LeaseStore, LifecycleAdmin, OwnerScope, PresenceGroup, Readoption,
    Resolution,
};
use durability_scheduler::Clock;
use durability_time::timeout_at;

use super::{CycleReport, Host, OwnerEvent, Slot, lock};
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
        self.balance(&owned, &mut report).await;
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

    /// The configured scopes by class, and whether the class is balanced
    /// (balancing on and every shard of the class configured).
    pub(super) fn target_classes(&self) -> BTreeMap<String, (bool, Vec<OwnerScope>)> {
        let inner = &self.inner;
        let mut classes: BTreeMap<String, (bool, Vec<OwnerScope>)> = BTreeMap::new();
        for scope in &inner.targets {
            classes
                .entry(scope.class().as_str().to_owned())
                .or_default()
                .1
                .push(scope.clone());
        }
        let count = inner.settings.ownership.shard_count.get() as usize;
        for (balanced, scopes) in classes.values_mut() {
            *balanced = inner.settings.balance && scopes.len() == count;
        }
        classes
    }

    /// Claims the configured scopes ([`crate::OwnPolicy`]) that are free,
    /// in one [`LeaseStore::claim_many`], in the classes that are not
    /// balanced ([`Self::balance`] claims in those).
    async fn claim_targets(&self, owned: &Owned, report: &mut CycleReport) {
        let inner = &self.inner;
        let mut free = Vec::new();
        let unbalanced = self
            .target_classes()
            .into_values()
            .filter(|(balanced, _)| !balanced)
            .flat_map(|(_, scopes)| scopes);
        for scope in unbalanced {
            if !self.running() {
                return;
            }
            if owned.contains_key(scope.host_id()) {
                continue;
            }
            // A read first: a scope another task holds live is not worth a
            // claim (a write transaction on the lease store) every cycle.
            if let Ok(snapshot) = inner
                .ownership
                .store()
                .snapshot(&scope, &inner.lifecycle)
                .await
                && snapshot
                    .owner
                    .is_some_and(|l| l.record.task() != inner.ownership.task())
            {
                continue;
            }
            free.push(scope);
        }
        self.claim(&free, report).await;
    }

    /// Claims `scopes` in one batch and notes the ones claimed.
    pub(super) async fn claim(&self, scopes: &[OwnerScope], report: &mut CycleReport) {
        if scopes.is_empty() || !self.running() {
            return;
        }
        let inner = &self.inner;
        for (scope, result) in inner.ownership.claim_many(scopes, &inner.lifecycle).await {
            match result {
                Ok(Resolution::Local(g)) => {
                    self.note_scope(&scope, g);
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

    /// Balances every balanced class: announces this host's presence (the
    /// shards it holds), reads the live hosts, and acts on
    /// [`durability_ownership::balance::Balancer`]'s decision: claims free
    /// shards up to its share, hands off its excess ([`Self::hand_off`]),
    /// and announces again when it changed. A store without presence
    /// records, or one that fails, leaves the class unbalanced for the
    /// cycle: the host then claims its free shards as without balancing.
    async fn balance(&self, owned: &Owned, report: &mut CycleReport) {
        for (class, (balanced, scopes)) in self.target_classes() {
            if !balanced || !self.running() {
                continue;
            }
            let held: Vec<u32> = scopes
                .iter()
                .filter(|s| owned.contains_key(s.host_id()))
                .map(OwnerScope::shard)
                .collect();
            let Some(peers) = self.observe(&scopes[0], &held).await else {
                let free: Vec<OwnerScope> = scopes
                    .into_iter()
                    .filter(|s| !owned.contains_key(s.host_id()))
                    .collect();
                self.claim(&free, report).await;
                continue;
            };
            let shards: Vec<u32> = scopes.iter().map(OwnerScope::shard).collect();
            let me = self.inner.ownership.task();
            let decision = lock(&self.inner.balancer).cycle(&class, me, &shards, &peers, &held);
            let pick = |list: &[u32]| -> Vec<OwnerScope> {
                scopes
                    .iter()
                    .filter(|s| list.contains(&s.shard()))
                    .cloned()
                    .collect()
            };
            let (claims, hand_offs) = (pick(&decision.claim), pick(&decision.hand_off));
            let before = (report.claimed.len(), report.handed_off.len());
            self.claim(&claims, report).await;
            for scope in &hand_offs {
                self.hand_off(scope, report).await;
            }
            if before != (report.claimed.len(), report.handed_off.len()) {
                let now: Vec<u32> = self
                    .inner
                    .ownership
                    .probe()
                    .scopes
                    .iter()
                    .filter_map(|p| scopes.iter().find(|s| s.host_id() == p.scope))
                    .map(OwnerScope::shard)
                    .collect();
                let _ = self.observe(&scopes[0], &now).await;
            }
            tracing::debug!(
                event = "durability.host.balanced",
                class = %class,
                share = decision.share,
                held = held.len(),
                live = peers.len() + 1,
                claimed = claims.len(),
                handed_off = hand_offs.len(),
                "class balanced"
            );
        }
    }

    /// Announces this host's presence in `scope`'s class with `held`, then
    /// reads the other live hosts; `None` when the store cannot.
    async fn observe(&self, scope: &OwnerScope, held: &[u32]) -> Option<Vec<Peer>> {
        let inner = &self.inner;
        let group = PresenceGroup::of(scope);
        let me = inner.ownership.task();
        let ttl = inner.settings.ownership.owner_ttl_ms;
        let store = inner.ownership.store();
        let live = match store
            .announce(&group, me, &encode_presence(held), ttl)
            .await
        {
            Ok(()) => store.live_tasks(&group).await,
            Err(e) => Err(e),
        };
        let live = match live {
            Ok(live) => live,
            Err(e) => {
                tracing::debug!(
                    event = "durability.host.presence_failed",
                    class = %scope.class().as_str(),
                    code = e.code(),
                    error = %e,
                    "presence records unavailable; claiming without balancing"
                );
                return None;
            }
        };
        let count = scope.shard_count();
        Some(
            live.into_iter()
                .filter(|e| &e.task != me)
                .map(|e| {
                    let held = decode_presence(&e.value, count)
                        .inspect_err(|error| {
                            tracing::warn!(
                                event = "durability.host.presence_invalid",
                                task = %e.task.as_str(),
                                error = %error,
                                "a live host's presence record is invalid; its shards count as unknown"
                            );
                        })
                        .ok();
                    Peer { task: e.task, held }
                })
                .collect(),
        )
    }

    /// Hands `scope` off (balancing): the ownership refuses new work on
    /// it, waits for its admitted work (at most the drain's in-flight
    /// budget, capped at one renew interval) and releases its lease; then
    /// its objects are closed and its running work's token cancelled. A
    /// scope still busy at the deadline stays (the next cycle decides
    /// again).
    async fn hand_off(&self, scope: &OwnerScope, report: &mut CycleReport) {
        let inner = &self.inner;
        let budget = inner
            .settings
            .ownership
            .drain_in_flight_timeout_ms
            .min(inner.settings.renew_interval());
        let until = inner
            .clock
            .now_ms()
            .saturating_add(i64::try_from(budget).unwrap_or(i64::MAX));
        match inner.ownership.hand_off(scope, until).await {
            HandOff::Released(generation) => {
                self.close_scope(scope).await;
                tracing::info!(
                    event = "durability.host.handed_off",
                    scope = %scope,
                    generation = generation.get(),
                    "owner scope handed off to balance its class"
                );
                let _ = inner.events.send(OwnerEvent::Released {
                    scope: scope.to_string(),
                    generation: generation.get(),
                });
                report.handed_off.push(scope.to_string());
            }
            HandOff::Busy { .. } => {}
            HandOff::NotOwned => self.drop_scope(scope, "stale_owner").await,
            HandOff::Failed(e) => self.drop_scope(scope, e.code()).await,
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
